/* grammar_worst: the worst per-token cost a grammar at dray's default limits
 * (docs/server.md, "Hostile grammars") can cause over a real vocabulary. Each
 * grammar below sits at a limit; for each, a sequence of steps does what the
 * scheduler does per token (step_begin, the whole mask, accept the first
 * allowed token, step_end), and the slowest step is reported, with whether the
 * step budget ended the sequence. Core-level like grammar_mask.c.
 * Usage: grammar_worst [MODEL.gguf] (default: .models/gemma-3-270m-q4_k_m.gguf) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dray/gguf.h"
#include "grammar.h"
#include "tokenizer.h"

#define STEPS 16

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A growing text buffer that gives up (NULL) when out of memory. */
struct text {
    char *s;
    size_t n, cap;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (k >= 0 && t->s && t->n + (size_t)k < t->cap) {
            t->n += (size_t)k;
            return;
        }
        size_t cap = (t->cap + (size_t)k + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s)
            exit(1);
        t->s = s;
        t->cap = cap;
    }
}

/* levels rules of 1024 alternatives, each the next rule then one letter: one
 * transition builds 1024^levels stacks (up to the stack budget). */
static char *tower(int levels)
{
    struct text t = {0};
    add(&t, "root ::= \"q\" body\nbody ::= r0 body | r0\n");
    for (int l = 0; l < levels; l++) {
        add(&t, "r%d ::= ", l);
        for (int i = 0; i < 1024; i++) {
            if (l + 1 < levels)
                add(&t, "%sr%d \"%c\"", i ? " | " : "", l + 1, 'a' + i % 26);
            else
                add(&t, "%s\"%c%c\"", i ? " | " : "", 'a' + i % 26, 'a' + i / 26 % 26);
        }
        add(&t, "\n");
    }
    return t.s;
}

/* 1024 nested groups around a choice of letters, repeated. */
static char *deep(void)
{
    struct text t = {0};
    add(&t, "root ::= ");
    for (int i = 0; i < 1023; i++)
        add(&t, "( ");
    add(&t, "[a-z] | \" \"");
    for (int i = 0; i < 1023; i++)
        add(&t, ")");
    add(&t, " root | \"\"\n");
    return t.s;
}

/* 21 rules of 1000 alternatives, each a character then the next rule: about
 * 63,000 elements, every alternative alive at once. */
static char *wide(void)
{
    struct text t = {0};
    add(&t, "root ::= \"q\" body\nbody ::= w0 body | w0\n");
    for (int r = 0; r < 21; r++) {
        add(&t, "w%d ::= ", r);
        for (int i = 0; i < 1000; i++)
            add(&t, "%s\"%c\" w%d", i ? " | " : "", 'a' + i % 26, r + 1);
        add(&t, "\n");
    }
    add(&t, "w21 ::= [a-z]\n");
    return t.s;
}

/* The slowest of STEPS steps, in ms; *ended: the step budget ended it. */
static double worst_step(const struct dray_grammar *g, const struct dray_grammar_vocab *v,
                         uint32_t *mask, int *steps, const char **ended)
{
    struct dray_grammar_matcher *m = NULL;
    double worst = 0;
    *ended = NULL;
    *steps = 0;
    double t0 = now_s();
    if (dray_grammar_matcher_new(g, &m)) {
        *ended = "the start state is over the budget";
        return (now_s() - t0) * 1e3;
    }
    uint32_t n = dray_grammar_vocab_size(v);
    for (int s = 0; s < STEPS; s++, (*steps)++) {
        t0 = now_s();
        dray_grammar_step_begin(m);
        long a = dray_grammar_allowed(m, v, mask);
        int32_t id = -1;
        for (uint32_t i = 0; a > 0 && i < n && id < 0; i++)
            if (mask[i / 32] >> (i % 32) & 1)
                id = (int32_t)i;
        int rc = id >= 0 ? dray_grammar_accept_token(m, v, id) : -1;
        dray_grammar_step_end(m);
        double ms = (now_s() - t0) * 1e3;
        worst = ms > worst ? ms : worst;
        if (a < 0 || rc) {
            *ended = dray_grammar_matcher_error(m) ? dray_grammar_matcher_error(m) : "no token";
            break;
        }
    }
    dray_grammar_matcher_free(m);
    return worst;
}

static struct dray_grammar_vocab *vocab_of(const struct dray_tokenizer *t)
{
    uint32_t n = dray_tokenizer_n_vocab(t);
    char **pieces = calloc(n, sizeof(*pieces));
    uint32_t *lens = calloc(n, sizeof(*lens));
    struct dray_grammar_vocab *v = NULL;
    char err[256];
    for (uint32_t id = 0; pieces && lens && id < n; id++) {
        lens[id] = (uint32_t)dray_tokenizer_token_bytes(t, (int32_t)id, NULL, 0);
        if (!(pieces[id] = malloc(lens[id] + 1)))
            break;
        dray_tokenizer_token_bytes(t, (int32_t)id, pieces[id], lens[id]);
    }
    int32_t eog[3];
    size_t n_eog = dray_tokenizer_eog_ids(t, eog);
    if (pieces && lens &&
        dray_grammar_vocab_new(n, (const char *const *)pieces, lens, eog, n_eog, &v, err, sizeof(err)))
        fprintf(stderr, "grammar_worst: %s\n", err);
    for (uint32_t id = 0; pieces && id < n; id++)
        free(pieces[id]);
    free(pieces);
    free(lens);
    return v;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : ".models/gemma-3-270m-q4_k_m.gguf";
    char err[512];
    struct dray_gguf *gg = NULL;
    struct dray_tokenizer *t = NULL;
    if (dray_gguf_open(path, &gg, err, sizeof(err)) || dray_tokenizer_load(gg, &t, err, sizeof(err))) {
        fprintf(stderr, "grammar_worst: %s: %s\n", path, err);
        return 1;
    }
    dray_gguf_close(gg);
    struct dray_grammar_vocab *v = vocab_of(t);
    uint32_t *mask = v ? calloc((dray_grammar_vocab_size(v) + 31) / 32, 4) : NULL;
    if (!mask)
        return 1;
    struct {
        const char *name;
        char *text;
    } cases[] = {
        {"1024 alternatives, 2 levels (1M stacks a transition)", tower(2)},
        {"1024 alternatives, 3 levels (over the stack budget)", tower(3)},
        {"1024 nested groups", deep()},
        {"21 rules of 1000 alternatives in a row (63k elements)", wide()},
    };
    printf("%s: %u tokens; defaults: step budget %u ms\n", path, dray_grammar_vocab_size(v), 200u);
    printf("  %-58s %8s %6s  %s\n", "grammar", "worst ms", "steps", "ended by");
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct dray_grammar *g = NULL;
        if (dray_grammar_parse(cases[k].text, strlen(cases[k].text), &g, err, sizeof(err))) {
            printf("  %-58s refused: %s\n", cases[k].name, err);
        } else {
            int steps;
            const char *ended;
            double ms = worst_step(g, v, mask, &steps, &ended);
            printf("  %-58s %8.1f %6d  %s\n", cases[k].name, ms, steps, ended ? ended : "-");
        }
        dray_grammar_free(g);
        free(cases[k].text);
    }
    free(mask);
    dray_grammar_vocab_free(v);
    dray_tokenizer_free(t);
    return 0;
}
