/* server/request.h — a request body (an OpenAI chat or text completion, or
 * vLLM's /tokenize and /detokenize), parsed with jansson and checked field by
 * field: first against the table of fields each endpoint accepts (fields.h),
 * then each value. Every refusal names the field ("messages[1].content",
 * "stop[2]") and what was expected. */
#ifndef DRAY_SERVER_REQUEST_H
#define DRAY_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "apierr.h"
#include "dray/dray.h"

enum dray_srv_kind {
    DRAY_SRV_CHAT,       /* POST /v1/chat/completions: messages */
    DRAY_SRV_COMPLETION, /* POST /v1/completions: prompt */
    DRAY_SRV_TOKENIZE,   /* POST /tokenize: prompt or messages */
    DRAY_SRV_DETOKENIZE, /* POST /detokenize: tokens */
};

#define DRAY_SRV_MAX_STOP 16          /* stop strings per request (OpenAI allows 4) */
#define DRAY_SRV_MAX_STOP_IDS 64      /* stop_token_ids per request */
#define DRAY_SRV_MAX_LOGIT_BIAS 1024  /* logit_bias entries per request */
#define DRAY_SRV_MAX_N 16             /* choices per request ('n') */

struct dray_srv_request {
    enum dray_srv_kind kind;
    json_t *root;                  /* the parsed body; owns the strings below */
    struct dray_chat_message *msgs; /* chat: n_msgs of them */
    char **joined;                 /* chat: [n_joined] content joined from text parts, or NULL */
    size_t n_msgs, n_joined;
    json_t **msg_calls;            /* chat: [n_msgs] each assistant message's tool_calls, or NULL */
    char **owned;                  /* [n_owned] contents tools.c rendered (malloc'd) */
    size_t n_owned;
    const char *prompt;            /* completion; tokenize (NULL when it has messages) */
    const char *model;             /* NULL = not given (the served model) */
    const char *user;              /* NULL = not given; accepted, not used */
    const char *cache_salt;        /* NULL = shared prefix cache; else this tenant's own
                                    * (vLLM's field: other tenants cannot hit its prefixes) */
    struct dray_gen_params gen;    /* config defaults, overridden by the request */
    const char *stop[DRAY_SRV_MAX_STOP]; /* gen.stop points here */
    struct dray_logit_bias *bias;  /* gen.logit_bias points here (malloc'd) */
    int32_t *stop_ids;             /* gen.stop_ids points here (malloc'd) */
    uint32_t n;                    /* choices of the prompt (1..DRAY_SRV_MAX_N) */
    /* structured output and tools (json_grammar.h, tools.h) */
    char *grammar;                 /* GBNF the reply follows (malloc'd; gen.grammar points
                                    * here), from response_format, grammar or tools; else NULL */
    json_t *tools;                 /* the tools array (of root), NULL when none */
    int tool_choice;               /* enum dray_srv_tool_choice */
    const char *tool_named;        /* tool_choice names this function */
    bool parallel_tool_calls;      /* several calls in one reply (default true) */
    bool stream;
    bool include_usage;            /* stream_options.include_usage */
    /* logprobs (logprobs.c) */
    bool logprobs;                 /* chat: logprobs true; text: logprobs given (0..5) */
    uint32_t top_logprobs;         /* chat: top_logprobs; text: the logprobs number */
    bool echo;                     /* text: the prompt comes back before the completion */
    const char *zero_tokens;       /* the field that asked for 0 tokens ("max_tokens"), or
                                    * NULL: 0 is allowed with echo only (gen.max_tokens is
                                    * then 0: the prompt alone, dray_request_params.prompt_only) */
    int32_t *prompt_ids;           /* text: a prompt given as token ids [n_prompt_ids] (malloc'd),
                                    * else NULL */
    size_t n_prompt_ids;
    /* tokenize */
    bool add_special_tokens;       /* a prompt: BOS as the model's metadata says (default true) */
    bool add_generation_prompt;    /* messages: the assistant turn's header (default true) */
    /* detokenize */
    int32_t *tokens;               /* [n_tokens] (malloc'd) */
    size_t n_tokens;
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
/* The token ids a parsed request names (logit_bias, stop_token_ids, tokens)
 * against the model's vocabulary: 400 naming the field. */
int dray_srv_request_check_vocab(const struct dray_srv_request *req, uint32_t n_vocab,
                                 struct dray_srv_error *e);

#endif
