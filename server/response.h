/* server/response.h — OpenAI response bodies: a whole completion, the chunks of
 * a stream (server-sent events, each "data: {json}\n\n", ending "data: [DONE]"),
 * and the bodies of /tokenize and /detokenize. All JSON is printed by jansson. */
#ifndef DRAY_SERVER_RESPONSE_H
#define DRAY_SERVER_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "apierr.h"
#include "buf.h"
#include "request.h"

/* What every body of one request repeats. */
struct dray_srv_ident {
    enum dray_srv_kind kind;
    char id[48];       /* "chatcmpl-..." or "cmpl-..." */
    int64_t created;   /* Unix seconds */
    const char *model; /* the served model's id */
};

struct dray_srv_usage {
    uint32_t prompt, completion, cached; /* tokens; cached = prompt tokens not recomputed */
};

/* One choice of a body or of a stream's chunk. */
struct dray_srv_choice {
    uint32_t index;            /* among the request's n */
    bool role;                 /* chat chunk: the delta names the assistant role */
    const char *text;          /* content (need not be NUL-terminated); NULL = none: a
                                * delta without content, or a message's null content */
    size_t len;
    const char *finish_reason; /* NULL until the choice's last chunk */
    json_t *logprobs;          /* taken; NULL = null */
    json_t *tool_calls;        /* chat, taken: message.tool_calls or delta.tool_calls; NULL = none */
};

/* A non-streamed body of n choices (each one's json taken). Returns malloc'd
 * JSON, or NULL (out of memory, or text that is not UTF-8). */
char *dray_srv_choices_json(const struct dray_srv_ident *id, struct dray_srv_choice *c, size_t n,
                            const struct dray_srv_usage *u);
/* One SSE chunk of one choice (its json taken). */
int dray_srv_sse_choice(struct dray_srv_buf *out, const struct dray_srv_ident *id,
                        struct dray_srv_choice *c, bool with_usage_null);

/* A non-streamed completion of one choice with text. Returns malloc'd JSON, or
 * NULL (out of memory, or text that is not UTF-8). */
char *dray_srv_completion_json(const struct dray_srv_ident *id, const char *text, size_t len,
                               const char *finish_reason, const struct dray_srv_usage *u);

/* The same with the choice's "logprobs" (taken; NULL = null): logprobs_json.h. */
char *dray_srv_completion_json_lp(const struct dray_srv_ident *id, const char *text, size_t len,
                                  const char *finish_reason, const struct dray_srv_usage *u,
                                  json_t *logprobs);

/* Append one SSE event to out. A chat stream starts with a chunk that carries
 * only the assistant role (role = true). text/len is new text (may be empty);
 * finish_reason is NULL until the last content chunk. with_usage_null adds
 * "usage": null, as OpenAI does on every chunk when include_usage was asked. */
int dray_srv_sse_chunk(struct dray_srv_buf *out, const struct dray_srv_ident *id, bool role,
                       const char *text, size_t len, const char *finish_reason,
                       bool with_usage_null);
int dray_srv_sse_chunk_lp(struct dray_srv_buf *out, const struct dray_srv_ident *id, bool role,
                          const char *text, size_t len, const char *finish_reason,
                          bool with_usage_null, json_t *logprobs);
/* The extra last chunk of include_usage: no choices, the usage totals. */
int dray_srv_sse_usage(struct dray_srv_buf *out, const struct dray_srv_ident *id,
                       const struct dray_srv_usage *u);
/* An error in the middle of a stream: "data: {"error": ...}". */
int dray_srv_sse_error(struct dray_srv_buf *out, const struct dray_srv_error *e);
int dray_srv_sse_done(struct dray_srv_buf *out); /* "data: [DONE]\n\n" */

/* POST /tokenize (vLLM's): {"tokens": [...], "count": n, "max_model_len": m}. */
char *dray_srv_tokens_json(const int32_t *ids, size_t n, uint32_t max_model_len);
/* POST /detokenize (vLLM's): {"prompt": text}; NULL when out of memory or not UTF-8. */
char *dray_srv_detokenized_json(const char *text, size_t len);

#endif
