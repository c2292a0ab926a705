/* core/gen_sampler.h — what a generation's dray_gen_params ask of the sampler
 * and of the decode loop, in one place for dray_session_generate and the
 * scheduler: the sampler with ignore_eos as a ban on the end-of-generation ids
 * and min_tokens holding those and the stop ids back; the check of the ids a
 * caller names; whether a sampled id is one of the stop ids. */
#ifndef DRAY_CORE_GEN_SAMPLER_H
#define DRAY_CORE_GEN_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"
#include "sampler.h"
#include "tokenizer.h"

/* logit_bias and stop_ids name ids in [0, n_vocab): DRAY_EINVAL naming the first
 * that does not. */
int dray_gen_check_ids(const struct dray_gen_params *g, uint32_t n_vocab, char *err, size_t errlen);

/* The sampler of g; n_prompt: the history tokens before the first generated one
 * (what the frequency/presence penalties and min_tokens do not count). */
int dray_gen_sampler(const struct dray_gen_params *g, const struct dray_tokenizer *tok,
                     size_t n_prompt, struct dray_sampler **out, char *err, size_t errlen);

/* id is among ids[0..n). */
bool dray_gen_is_stop_id(const int32_t *ids, size_t n, int32_t id);

#endif
