/* server/logprobs.h — the fields that ask for log-probabilities, in OpenAI's
 * two dialects, and a text completion's prompt given as token ids.
 *   chat:  logprobs (true/false), top_logprobs 0..20 (only with logprobs: true);
 *   text:  logprobs N (0..5, the legacy API's limit), echo (true/false); 0
 *          max_tokens only with echo (the prompt alone, scored).
 * The numbers come from the logits the sampler sees, after penalties and
 * logit_bias, before temperature (docs/server.md). */
#ifndef DRAY_SERVER_LOGPROBS_H
#define DRAY_SERVER_LOGPROBS_H

#include <jansson.h>

#include "apierr.h"
#include "request.h"

#define DRAY_SRV_MAX_TEXT_LOGPROBS 5 /* /v1/completions' logprobs, as OpenAI's legacy API */

/* Read logprobs, top_logprobs and echo into req (after the sampling fields:
 * it checks req->zero_tokens). 0, or -1 with e filled (400). */
int dray_srv_parse_logprobs(struct dray_srv_request *req, struct dray_srv_error *e);
/* A text prompt given as a list of token ids (or a list of one such list, as
 * batching clients send): p is the value of "prompt". 1 when it is one (then
 * req->prompt_ids holds them), 0 when it is not, -1 with e filled when it is
 * one that is refused (empty, not ids). */
int dray_srv_parse_prompt_ids(struct dray_srv_request *req, json_t *p, struct dray_srv_error *e);

#endif
