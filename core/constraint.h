/* core/constraint.h — what a generation's grammar (dray_gen_params.grammar)
 * asks of the decode loop, in one place for dray_session_generate and the
 * scheduler: before each sample the mask of the tokens the grammar allows,
 * after it the advance, and whether the output must end there. The vocabulary
 * the masks walk is built once per engine, on the first constrained request. */
#ifndef DRAY_CORE_CONSTRAINT_H
#define DRAY_CORE_CONSTRAINT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"

struct dray_constraint;

/* A constraint for g on engine e, or *out = NULL when g has no grammar.
 * DRAY_EINVAL naming the line and column of a grammar that does not compile. */
int dray_constraint_new(struct dray_engine *e, const struct dray_gen_params *g,
                        struct dray_constraint **out, char *err, size_t errlen);
void dray_constraint_free(struct dray_constraint *c);

/* The next token drawn from smp's distribution restricted to what the grammar
 * allows, exactly as if every other id had -inf: the sampler's few best
 * candidates are tested one by one when its distribution depends only on them
 * (greedy, top_k), a free draw is kept when allowed (temperature alone), and the
 * whole mask is computed only when that cannot settle it, or when whole (the
 * caller needs the constrained row for logprobs: dray_sampler_row). The matcher
 * does not move (dray_constraint_accept does). *dead: nothing allowed can be
 * drawn (the returned id means nothing). A negative DRAY_E* on failure:
 * DRAY_ERANGE when the grammar's step went over its budget (dray_constraint_error
 * says which); the step ends with dray_constraint_accept. */
struct dray_sampler;
int32_t dray_constraint_sample(struct dray_constraint *c, struct dray_sampler *smp, const float *logits,
                               uint32_t n_vocab, const int32_t *hist, size_t n_hist, bool whole,
                               bool *dead);
/* Draws of c that needed the whole mask (for tests and benchmarks). */
uint64_t dray_constraint_full_masks(const struct dray_constraint *c);

/* The allowed-token bitset for the next sample (dray_sampler_sample_allowed), or
 * NULL with a negative DRAY_E* in *rc (out of memory). *n gets how many are
 * allowed: 0 means the output cannot go on. */
const uint32_t *dray_constraint_mask(struct dray_constraint *c, long *n, int *rc);
/* Whether id was allowed by the last mask. */
bool dray_constraint_allowed(const struct dray_constraint *c, int32_t id);
/* Advance over the sampled id (which the mask allowed); ends the step. */
int dray_constraint_accept(struct dray_constraint *c, int32_t id);
/* NULL, or why c failed: one line naming the step budget it went over. */
const char *dray_constraint_error(const struct dray_constraint *c);
/* Let *stop (the request's cancel flag) end a grammar step from inside its
 * loops: dray_constraint_sample then returns DRAY_ECANCELED. */
void dray_constraint_watch(struct dray_constraint *c, const atomic_bool *stop);
/* The output so far is complete and nothing can follow: end it now. */
bool dray_constraint_must_end(const struct dray_constraint *c);
/* The output so far is a complete sentence of the grammar. */
bool dray_constraint_can_end(const struct dray_constraint *c);

/* The grammar vocabulary of e, built on first use (thread-safe); NULL when out
 * of memory. */
const struct dray_grammar_vocab *dray_engine_grammar_vocab(struct dray_engine *e);
void dray_engine_grammar_vocab_free(struct dray_engine *e);

#endif
