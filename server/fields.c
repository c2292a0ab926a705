/* The table of request fields by endpoint. See fields.h. */
#include "fields.h"

#include <stdbool.h>
#include <string.h>

#include "request.h"

#define CHAT (1u << DRAY_SRV_CHAT)
#define TEXT (1u << DRAY_SRV_COMPLETION)
#define TOK (1u << DRAY_SRV_TOKENIZE)
#define DETOK (1u << DRAY_SRV_DETOKENIZE)
#define GEN (CHAT | TEXT)

#define LEGACY_FUNCTIONS "OpenAI's deprecated functions API is not served: use 'tools' and 'tool_choice'"

static const struct field {
    const char *name;
    unsigned in;         /* the endpoints that take it */
    const char *refused; /* NULL: read and honoured; else why any value is refused */
} fields[] = {
    /* what is asked */
    {"model", GEN | TOK | DETOK, NULL},
    {"messages", CHAT | TOK, NULL},
    {"prompt", TEXT | TOK, NULL},
    {"tokens", DETOK, NULL},
    {"add_special_tokens", TOK, NULL},
    {"add_generation_prompt", TOK, NULL},
    {"stream", GEN, NULL},
    {"stream_options", GEN, NULL},
    {"user", GEN, NULL},
    {"cache_salt", GEN, NULL},
    /* length and sampling (sampling.c) */
    {"max_tokens", GEN, NULL},
    {"max_completion_tokens", GEN, NULL},
    {"temperature", GEN, NULL},
    {"top_p", GEN, NULL},
    {"top_k", GEN, NULL},
    {"min_p", GEN, NULL},
    {"seed", GEN, NULL},
    {"stop", GEN, NULL},
    {"frequency_penalty", GEN, NULL},
    {"presence_penalty", GEN, NULL},
    {"repetition_penalty", GEN, NULL},
    {"logit_bias", GEN, NULL},
    {"stop_token_ids", GEN, NULL},
    {"ignore_eos", GEN, NULL},
    {"min_tokens", GEN, NULL},
    /* choices, logprobs, structured output and tools (request.c, logprobs.c, tools.c) */
    {"n", GEN, NULL},
    {"best_of", TEXT, NULL},
    {"logprobs", GEN, NULL},
    {"top_logprobs", CHAT, NULL},
    {"echo", TEXT, NULL},
    {"tools", CHAT, NULL},
    {"tool_choice", CHAT, NULL},
    {"response_format", GEN, NULL},
    {"parallel_tool_calls", CHAT, NULL},
    {"grammar", GEN, NULL},
    /* known, never honoured */
    {"functions", CHAT, LEGACY_FUNCTIONS},
    {"function_call", CHAT, LEGACY_FUNCTIONS},
    {"prediction", CHAT, "predicted outputs ('prediction') are not supported by this server"},
    {"audio", CHAT, "audio output is not supported by this server"},
    {"suffix", TEXT, "insertion before a 'suffix' is not supported by this server"},
};
#define N_FIELDS (sizeof(fields) / sizeof(fields[0]))

const char *dray_srv_kind_endpoint(int kind)
{
    switch (kind) {
    case DRAY_SRV_CHAT: return "POST /v1/chat/completions";
    case DRAY_SRV_COMPLETION: return "POST /v1/completions";
    case DRAY_SRV_TOKENIZE: return "POST /tokenize";
    case DRAY_SRV_DETOKENIZE: return "POST /detokenize";
    }
    return "?";
}

static const struct field *find(const char *name)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!strcmp(fields[i].name, name))
            return &fields[i];
    return NULL;
}

/* The first endpoint other than kind's that takes f, for a hint; -1 if none. */
static int taken_by(const struct field *f, int kind)
{
    for (int k = DRAY_SRV_CHAT; k <= DRAY_SRV_DETOKENIZE; k++)
        if (k != kind && (f->in & (1u << k)))
            return k;
    return -1;
}

int dray_srv_check_fields(int kind, json_t *body, struct dray_srv_error *e)
{
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v) {
        if (json_is_null(v))
            continue;
        const struct field *f = find(key);
        if (f && (f->in & (1u << kind)) && !f->refused)
            continue;
        if (f && (f->in & (1u << kind)))
            return dray_srv_bad(e, key, "'%s' is refused: %s", key, f->refused);
        int other = f ? taken_by(f, kind) : -1;
        if (other >= 0)
            return dray_srv_bad(e, key, "Unrecognized request argument supplied: %.80s (%s takes it, "
                                "%s does not)", key, dray_srv_kind_endpoint(other),
                                dray_srv_kind_endpoint(kind));
        return dray_srv_bad(e, key, "Unrecognized request argument supplied: %.80s", key);
    }
    return 0;
}
