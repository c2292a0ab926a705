/* server/policy.h — who may ask and how much: the API key check and the size
 * limits a request must fit before it reaches the scheduler. */
#ifndef DRAY_SERVER_POLICY_H
#define DRAY_SERVER_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apierr.h"
#include "dray/dray.h"

/* authorization: the Authorization header (NULL when absent). With an empty
 * api_key every request passes. The key is compared in time that depends only
 * on the key's length, never on how much of it a guess got right. 401 otherwise. */
int dray_srv_check_auth(const char *authorization, const char *api_key, struct dray_srv_error *e);
/* A body of `bytes` (the Content-Length, or what has arrived so far) against
 * max_body: 413 when larger. */
int dray_srv_check_body(uint64_t bytes, uint64_t max_body, struct dray_srv_error *e);
/* A rendered prompt of n tokens: at most max_prompt_tokens (0 = no own limit) and
 * shorter than the context, leaving room for one token of reply. 400
 * context_length_exceeded naming param ("messages" or "prompt"). */
int dray_srv_check_prompt(size_t n, uint32_t max_prompt_tokens, uint32_t context, const char *param,
                          struct dray_srv_error *e);

#endif
