/* server/request.h — an OpenAI request body (chat or text completion), parsed
 * with jansson and checked field by field. Every refusal names the field
 * ("messages[1].content", "stop[2]") and what was expected. */
#ifndef DRAY_SERVER_REQUEST_H
#define DRAY_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "apierr.h"
#include "dray/dray.h"

enum dray_srv_kind {
    DRAY_SRV_CHAT,       /* POST /v1/chat/completions: messages */
    DRAY_SRV_COMPLETION, /* POST /v1/completions: prompt */
};

#define DRAY_SRV_MAX_STOP 16 /* stop strings per request (OpenAI allows 4) */

struct dray_srv_request {
    enum dray_srv_kind kind;
    json_t *root;                  /* the parsed body; owns the strings below */
    struct dray_chat_message *msgs; /* chat: n_msgs of them */
    char **joined;                 /* chat: [n_msgs] content joined from text parts, or NULL */
    size_t n_msgs;
    const char *prompt;            /* completion */
    const char *model;             /* NULL = not given (the served model) */
    const char *user;              /* NULL = not given; accepted, not used */
    const char *cache_salt;        /* NULL = shared prefix cache; else this tenant's own
                                    * (vLLM's field: other tenants cannot hit its prefixes) */
    struct dray_gen_params gen;    /* config defaults, overridden by the request */
    const char *stop[DRAY_SRV_MAX_STOP]; /* gen.stop points here */
    bool stream;
    bool include_usage;            /* stream_options.include_usage */
};

/* Parse body (len bytes, need not be NUL-terminated) as a request of the given
 * kind. Sampling defaults come from cfg; max_tokens above
 * cfg->max_completion_tokens and more than cfg->max_messages messages are
 * refused. Returns 0, or -1 with e filled (status 400); on failure req holds
 * nothing to free. */
int dray_srv_request_parse(enum dray_srv_kind kind, const char *body, size_t len,
                           const struct dray_config *cfg, struct dray_srv_request *req,
                           struct dray_srv_error *e);
void dray_srv_request_free(struct dray_srv_request *req);

#endif
