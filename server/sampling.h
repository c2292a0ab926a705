/* server/sampling.h — the length and sampling fields of a generation request
 * (OpenAI's, and vLLM's min_p, top_k, repetition_penalty, stop_token_ids,
 * ignore_eos, min_tokens) read into req->gen over the config's defaults. */
#ifndef DRAY_SERVER_SAMPLING_H
#define DRAY_SERVER_SAMPLING_H

#include "apierr.h"
#include "request.h"

/* req->root is the parsed body. Returns 0, or -1 with e filled (400). What it
 * allocates (req->bias, req->stop_ids) dray_srv_request_free frees. */
int dray_srv_parse_sampling(struct dray_srv_request *req, const struct dray_config *cfg,
                            struct dray_srv_error *e);

#endif
