/* Log-probabilities of tokens (OpenAI's logprobs, top_logprobs and echo's
 * prompt scores): a log-softmax of one row of logits, in double, and the most
 * likely tokens of it. The scheduler calls it with the row the sampler saw
 * (after penalties and logit_bias, before temperature: vLLM's default) for a
 * generated token, and with the raw row for a prompt token. */
#ifndef DRAY_CORE_LOGPROBS_H
#define DRAY_CORE_LOGPROBS_H

#include <stdint.h>

#include "dray/dray.h"

/* Fill out with token id's log-probability under row[0..n) and its n_top (at
 * most DRAY_MAX_TOP_LOGPROBS) most likely tokens, ties to the lower id. NaN
 * logits count as -inf; a -inf log-probability stays -inf (the caller prints
 * what JSON can hold). */
void dray_logprobs_of(const float *row, uint32_t n, int32_t id, uint32_t n_top,
                      struct dray_token_logprob *out);

#endif
