/* A generation's grammar in the decode loop. See constraint.h. */
#include "constraint.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "error.h"
#include "grammar.h"
#include "sampler.h"
#include "tokenizer.h"

struct dray_constraint {
    struct dray_grammar *g;
    struct dray_grammar_matcher *m;
    const struct dray_grammar_vocab *v;
    uint32_t *allow;  /* the last mask: (n_vocab + 31) / 32 words */
    int32_t *best;    /* [BEST_MAX] the sampler's best candidates */
    uint64_t full;    /* draws that needed the whole mask */
};

/* The most candidates tested one by one before the whole mask is cheaper. */
#define BEST_MAX 512

static pthread_mutex_t vocab_mu = PTHREAD_MUTEX_INITIALIZER;

/* Every token's bytes as the detokenizer emits them; control tokens have none. */
static struct dray_grammar_vocab *build_vocab(const struct dray_tokenizer *t)
{
    uint32_t n = dray_tokenizer_n_vocab(t);
    const char **pieces = calloc(n, sizeof(*pieces));
    uint32_t *lens = calloc(n, sizeof(*lens));
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += dray_tokenizer_token_bytes(t, (int32_t)i, NULL, 0);
    char *bytes = malloc(total + 1), *p = bytes;
    struct dray_grammar_vocab *v = NULL;
    if (pieces && lens && bytes) {
        for (uint32_t i = 0; i < n; i++) {
            lens[i] = (uint32_t)dray_tokenizer_token_bytes(t, (int32_t)i, p, total + 1 - (size_t)(p - bytes));
            pieces[i] = p;
            p += lens[i];
        }
        int32_t eog[3];
        size_t n_eog = dray_tokenizer_eog_ids(t, eog);
        char err[256];
        if (dray_grammar_vocab_new(n, pieces, lens, eog, n_eog, &v, err, sizeof(err)))
            v = NULL;
    }
    free(pieces);
    free(lens);
    free(bytes);
    return v;
}

const struct dray_grammar_vocab *dray_engine_grammar_vocab(struct dray_engine *e)
{
    pthread_mutex_lock(&vocab_mu);
    if (!e->gvocab)
        e->gvocab = build_vocab(e->tok);
    pthread_mutex_unlock(&vocab_mu);
    return e->gvocab;
}

void dray_engine_grammar_vocab_free(struct dray_engine *e)
{
    dray_grammar_vocab_free(e->gvocab);
    e->gvocab = NULL;
}

int dray_constraint_new(struct dray_engine *e, const struct dray_gen_params *g,
                        struct dray_constraint **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!g->grammar)
        return 0;
    struct dray_constraint *c = calloc(1, sizeof(*c));
    if (!c)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for the grammar");
    char why[400];
    int rc = dray_grammar_parse_limited(g->grammar, strlen(g->grammar), &g->grammar_limits, &c->g,
                                        why, sizeof(why));
    if (rc) {
        dray_constraint_free(c);
        return dray_fail(err, errlen, rc, "%s", why); /* it says "grammar: " itself */
    }
    c->v = dray_engine_grammar_vocab(e);
    c->allow = malloc((e->info.n_vocab + 31) / 32 * sizeof(*c->allow));
    c->best = malloc(BEST_MAX * sizeof(*c->best));
    rc = !c->v || !c->allow || !c->best ? DRAY_ENOMEM : dray_grammar_matcher_new(c->g, &c->m);
    if (rc == DRAY_ERANGE) {
        dray_constraint_free(c);
        return dray_fail(err, errlen, DRAY_EINVAL, "grammar: its start state alone is over the "
                         "step budget (config keys grammar_step_stacks, grammar_step_ms)");
    }
    if (rc) {
        dray_constraint_free(c);
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for the grammar");
    }
    *out = c;
    return 0;
}

void dray_constraint_free(struct dray_constraint *c)
{
    if (!c)
        return;
    dray_grammar_matcher_free(c->m);
    dray_grammar_free(c->g);
    free(c->allow);
    free(c->best);
    free(c);
}

const uint32_t *dray_constraint_mask(struct dray_constraint *c, long *n, int *rc)
{
    *n = dray_grammar_allowed(c->m, c->v, c->allow);
    *rc = *n < 0 ? (int)*n : 0;
    return *n < 0 ? NULL : c->allow;
}

bool dray_constraint_allowed(const struct dray_constraint *c, int32_t id)
{
    return id >= 0 && (uint32_t)id < dray_grammar_vocab_size(c->v) &&
           (c->allow[id / 32] >> (id % 32) & 1);
}

int dray_constraint_accept(struct dray_constraint *c, int32_t id)
{
    int rc = dray_grammar_accept_token(c->m, c->v, id);
    dray_grammar_step_end(c->m);
    return rc;
}

const char *dray_constraint_error(const struct dray_constraint *c)
{
    return dray_grammar_matcher_error(c->m);
}

void dray_constraint_watch(struct dray_constraint *c, const atomic_bool *stop)
{
    dray_grammar_matcher_watch(c->m, stop);
}

bool dray_constraint_must_end(const struct dray_constraint *c)
{
    return dray_grammar_must_end(c->m);
}

bool dray_constraint_can_end(const struct dray_constraint *c)
{
    return dray_grammar_can_end(c->m);
}

/* Draw under the whole mask. */
static int32_t draw_masked(struct dray_constraint *c, struct dray_sampler *smp, const float *logits,
                           uint32_t n_vocab, const int32_t *hist, size_t n_hist, bool *dead)
{
    long n;
    int rc;
    c->full++;
    if (!dray_constraint_mask(c, &n, &rc))
        return rc;
    if (n == 0) {
        *dead = true;
        return 0;
    }
    int32_t id = dray_sampler_sample_allowed(smp, logits, n_vocab, hist, n_hist, c->allow);
    if (id >= 0 && !dray_constraint_allowed(c, id))
        *dead = true; /* every allowed id is banned (logit_bias, ignore_eos, min_tokens) */
    return id;
}

/* The k best allowed among the sampler's best, best first, into c->best; how
 * many, or 0 when the best BEST_MAX hold fewer than k allowed and more ids were
 * finite (only the whole mask can tell then). */
static uint32_t best_allowed(struct dray_constraint *c, struct dray_sampler *smp, const float *logits,
                             uint32_t n_vocab, const int32_t *hist, size_t n_hist, uint32_t k)
{
    uint32_t m = k * 4 < 64 ? 64 : k * 4;
    m = m > BEST_MAX ? BEST_MAX : m;
    long n = dray_sampler_best(smp, logits, n_vocab, hist, n_hist, c->best, m);
    uint32_t found = 0;
    for (long i = 0; i < n && found < k && !dray_grammar_matcher_error(c->m); i++)
        if (!dray_grammar_peek_token(c->m, c->v, c->best[i]))
            c->best[found++] = c->best[i];
    return found == k || (found > 0 && n < (long)m) ? found : 0;
}

static int32_t sample(struct dray_constraint *c, struct dray_sampler *smp, const float *logits,
                      uint32_t n_vocab, const int32_t *hist, size_t n_hist, bool whole, bool *dead)
{
    uint32_t k;
    enum dray_sampler_shape shape = whole ? DRAY_SAMPLER_WHOLE : dray_sampler_shape(smp, &k);
    if (shape == DRAY_SAMPLER_PLAIN) { /* keep a free draw the grammar allows: exact */
        int32_t id = dray_sampler_sample(smp, logits, n_vocab, hist, n_hist);
        if (id < 0 || dray_grammar_peek_token(c->m, c->v, id) == 0)
            return id;
    } else if (shape == DRAY_SAMPLER_TOP_K && k <= BEST_MAX) {
        uint32_t n = best_allowed(c, smp, logits, n_vocab, hist, n_hist, k);
        if (n)
            return dray_sampler_draw_among(smp, c->best, n);
    }
    return draw_masked(c, smp, logits, n_vocab, hist, n_hist, dead);
}

int32_t dray_constraint_sample(struct dray_constraint *c, struct dray_sampler *smp, const float *logits,
                               uint32_t n_vocab, const int32_t *hist, size_t n_hist, bool whole,
                               bool *dead)
{
    *dead = false;
    dray_grammar_step_begin(c->m); /* one budget for the tests, the mask and the accept */
    int32_t id = sample(c, smp, logits, n_vocab, hist, n_hist, whole, dead);
    /* a failed matcher answered DRAY_ERANGE or DRAY_ECANCELED to the first call
     * that saw it, and to each later one: the peek of the draw tells which */
    if (dray_grammar_matcher_error(c->m))
        return dray_grammar_peek_bytes(c->m, "", 0);
    return id;
}

uint64_t dray_constraint_full_masks(const struct dray_constraint *c)
{
    return c->full;
}
