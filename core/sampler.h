/*
 * Sampler: turns one row of logits into a token id. (Stop strings: stop.h.)
 *
 * Filter order (the usual one):
 *   1. repetition penalty (CTRL, Keskar et al. 2019): every distinct id among the
 *      last repeat_last_n history tokens has its logit divided by repeat_penalty
 *      when positive, multiplied when negative;
 *   2. frequency and presence penalties (OpenAI's): an id generated c times (in the
 *      history after the first n_prompt tokens) loses c * frequency_penalty +
 *      (c > 0) * presence_penalty;
 *   3. logit bias: added to its id's logit (-inf bans the id); then the hold ids
 *      are set to -inf while fewer than min_tokens tokens were generated; then
 *      the ids a grammar does not allow (dray_sampler_sample_allowed);
 *   4. temperature 0: exact argmax (lowest id on ties), nothing else applies;
 *   5. top-k: keep the k largest logits (ties: lower id first);
 *   6. softmax of logit / temperature over what is left;
 *   7. top-p: keep the smallest prefix of the sorted candidates whose mass >= top_p;
 *   8. min-p: keep candidates with p >= min_p * p_max;
 *   9. draw from the survivors, renormalized.
 * Steps 1-3 are the host's, whatever device computed the logits.
 * Cost for n_vocab = 262144: one copy of the row, no full sort. top-k uses a
 * size-k heap; top-p/min-p without top-k only sort the tokens above a logit
 * threshold that provably contains the answer (see sampler.c).
 */
#ifndef DRAY_CORE_SAMPLER_H
#define DRAY_CORE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"

struct dray_sampler_params {
    float temperature;      /* 0 = greedy; >= 0 */
    uint32_t top_k;         /* 0 = off */
    float top_p;            /* 1 = off; in (0, 1] */
    float min_p;            /* 0 = off; in [0, 1] */
    float repeat_penalty;   /* 1 = off; > 0 */
    uint32_t repeat_last_n; /* history tokens the penalty looks at; 0 = all given */
    uint64_t seed;          /* 0 = from the clock */
    float frequency_penalty; /* 0 = off; finite */
    float presence_penalty;  /* 0 = off; finite */
    size_t n_prompt;        /* the first n_prompt history tokens are the prompt: the two
                             * penalties above and min_tokens count only those after */
    const struct dray_logit_bias *bias; /* n_bias of them (copied); finite or -inf */
    size_t n_bias;
    const int32_t *hold;    /* ids not sampled before min_tokens were generated (copied) */
    size_t n_hold;
    uint32_t min_tokens;
};

struct dray_sampler;

/* DRAY_EINVAL with a reason for out-of-range parameters. */
int dray_sampler_create(const struct dray_sampler_params *p, struct dray_sampler **out, char *err,
                        size_t errlen);
void dray_sampler_free(struct dray_sampler *s);
/* Restart the random stream (seed 0 = from the clock). */
void dray_sampler_reseed(struct dray_sampler *s, uint64_t seed);
/* The next token id, or a negative DRAY_E* (n_vocab 0: EINVAL; scratch: ENOMEM).
 * history (the prompt, then what was generated) may be NULL when n_history is 0;
 * ids outside [0, n_vocab), in it or in bias and hold, are ignored. */
int32_t dray_sampler_sample(struct dray_sampler *s, const float *logits, uint32_t n_vocab,
                            const int32_t *history, size_t n_history);

/* The same under a constraint: allow is a bitset of (n_vocab + 31) / 32 words
 * (bit i of allow[i / 32]: id i may be drawn; core/text/grammar.h), applied after
 * step 3. When nothing allowed has a finite logit the result is the lowest id,
 * which the caller checks against the mask. */
int32_t dray_sampler_sample_allowed(struct dray_sampler *s, const float *logits, uint32_t n_vocab,
                                    const int32_t *history, size_t n_history, const uint32_t *allow);

/* What a draw depends on, for a constraint that wants to test few tokens:
 * TOP_K: only the *k best ids (greedy: k = 1; top_k: k, top_p and min_p then
 * apply among them); PLAIN: temperature alone, so a draw from the whole row
 * kept only when allowed, else redrawn under the mask, is exact; WHOLE: top_p
 * or min_p over the whole row, which needs every id's mask. */
enum dray_sampler_shape { DRAY_SAMPLER_TOP_K, DRAY_SAMPLER_PLAIN, DRAY_SAMPLER_WHOLE };
enum dray_sampler_shape dray_sampler_shape(const struct dray_sampler *s, uint32_t *k);

/* The m best ids after steps 1-3 (penalties, logit_bias, holds), best first
 * (ties: lower id), those at -inf left out, into ids; returns how many, or a
 * negative DRAY_E*. */
long dray_sampler_best(struct dray_sampler *s, const float *logits, uint32_t n_vocab,
                       const int32_t *history, size_t n_history, int32_t *ids, uint32_t m);

/* Steps 4-9 over ids[0..n) alone, best first as dray_sampler_best gave them (n
 * at most its m, and at most top_k): the draw dray_sampler_sample_allowed would
 * make were these the only ids allowed, without a second pass over the row. */
int32_t dray_sampler_draw_among(struct dray_sampler *s, const int32_t *ids, uint32_t n);

/* The row the last dray_sampler_sample drew from: its logits after steps 1-3
 * (penalties, logit_bias, min_tokens' holds), before temperature; n_vocab of
 * them, valid until the next call. What logprobs are computed from. */
const float *dray_sampler_row(const struct dray_sampler *s);

/* The random stream itself, exposed for tests: uniform double in [0, 1). */
double dray_sampler_uniform(struct dray_sampler *s);

/* The largest of x[0..n), NaN ignored (-inf if none): sixteen running maxima,
 * which vectorize, rather than one chain of dependent compares. */
float dray_max_f32(const float *x, uint32_t n);

#endif
