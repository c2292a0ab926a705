/* The grammar's limits and the matcher's step budget: how many stacks one
 * transition may build and how long one token's decision may take. Checked
 * inside the matcher's loops (closure, advance, the mask walk), so a grammar
 * whose ambiguity grows with every character ends its sequence with
 * DRAY_ERANGE within one step instead of pinning the thread that runs it. */
#include <stdio.h>
#include <time.h>

#include "error.h"
#include "grammar_internal.h"

#define CLOCK_EVERY 64 /* budget checks between two reads of the clock */

void dray_gram_limits_resolve(const struct dray_grammar_limits *lim,
                              struct dray_grammar_limits *out)
{
    static const struct dray_grammar_limits none;
    const struct dray_grammar_limits *l = lim ? lim : &none;
    bool lower = l->max_elements && l->max_elements < GRAM_MAX_ELEMENTS;
    out->max_elements = lower ? l->max_elements : GRAM_MAX_ELEMENTS;
    out->max_alternatives = l->max_alternatives ? l->max_alternatives : GRAM_DEF_ALTERNATIVES;
    out->max_depth = l->max_depth ? l->max_depth : GRAM_DEF_DEPTH;
    out->step_stacks = l->step_stacks ? l->step_stacks : GRAM_DEF_STEP_STACKS;
    out->step_ms = l->step_ms ? l->step_ms : GRAM_DEF_STEP_MS;
    out->cache = l->cache ? l->cache : GRAM_DEF_CACHE;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void dray_grammar_step_begin(struct dray_grammar_matcher *m)
{
    m->deadline = now_ns() + (uint64_t)m->g->lim.step_ms * 1000000u;
    m->clock_in = CLOCK_EVERY;
    m->step_open = true;
}

void dray_grammar_step_end(struct dray_grammar_matcher *m)
{
    m->step_open = false;
}

const char *dray_grammar_matcher_error(const struct dray_grammar_matcher *m)
{
    return m->failed ? m->why : NULL;
}

int dray_gram_enter(struct dray_grammar_matcher *m)
{
    return m->failed;
}

/* Fail the matcher for good with why. */
static int fail(struct dray_grammar_matcher *m, const char *why)
{
    snprintf(m->why, sizeof(m->why), "grammar: %s; the grammar is too ambiguous to follow", why);
    m->failed = DRAY_ERANGE;
    return DRAY_ERANGE;
}

void dray_grammar_matcher_watch(struct dray_grammar_matcher *m, const atomic_bool *stop)
{
    m->stop = stop;
}

int dray_gram_budget(struct dray_grammar_matcher *m, size_t words)
{
    char why[120];
    if (m->failed)
        return m->failed;
    if (words > m->g->lim.step_stacks) {
        snprintf(why, sizeof(why), "one transition built over %u parse-stack entries (config key "
                 "grammar_step_stacks)", m->g->lim.step_stacks);
        return fail(m, why);
    }
    if (m->clock_in > 1) {
        m->clock_in--;
        return 0;
    }
    m->clock_in = CLOCK_EVERY;
    if (m->stop && atomic_load_explicit(m->stop, memory_order_relaxed)) {
        snprintf(m->why, sizeof(m->why), "grammar: cancelled inside a step");
        return m->failed = DRAY_ECANCELED;
    }
    if (!m->step_open || now_ns() <= m->deadline)
        return 0;
    snprintf(why, sizeof(why), "one step took over %u ms (config key grammar_step_ms)",
             m->g->lim.step_ms);
    return fail(m, why);
}
