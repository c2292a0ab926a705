/* server/logprobs_json.h — log-probabilities in OpenAI's two JSON shapes:
 *   chat:  {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
 *          "logprob", "bytes"}...]}...]}
 *   text:  {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token:
 *          logprob}...], "text_offset": [...]}; the dicts hold the top N and the
 *          chosen token (as vLLM's).
 * An entry whose logprob is NaN has none (echo's first prompt token): null in
 * the text shape. -inf (a banned token) is printed as -9999.0, OpenAI's stand-in.
 * A token's text is its bytes made valid UTF-8 (U+FFFD for a partial character);
 * "bytes" has the raw ones. */
#ifndef DRAY_SERVER_LOGPROBS_JSON_H
#define DRAY_SERVER_LOGPROBS_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "dray/dray.h"

/* The bytes of token id (dray_engine_token_bytes' contract). */
typedef size_t (*dray_srv_piece_fn)(const void *user, int32_t id, char *out, size_t cap);

/* NULL when out of memory. */
json_t *dray_srv_chat_logprobs_json(const struct dray_token_logprob *lp, size_t n,
                                    dray_srv_piece_fn piece, const void *user);
/* text_offset starts at offset (characters of the text before the first token)
 * and adds each token's characters; *end gets where it ends (may be NULL). */
json_t *dray_srv_text_logprobs_json(const struct dray_token_logprob *lp, size_t n, size_t offset,
                                    size_t *end, dray_srv_piece_fn piece, const void *user);

#endif
