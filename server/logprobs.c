/* The logprobs fields and token-id prompts. See logprobs.h. */
#include "logprobs.h"

#include <stdint.h>
#include <stdlib.h>

#include "jfield.h"

/* chat: logprobs is a boolean; top_logprobs asks for alternatives, with it only */
static int parse_chat(struct dray_srv_request *req, struct dray_srv_error *e)
{
    long long top = 0;
    bool has_top;
    if (dray_srv_get_bool(req->root, "logprobs", "logprobs", &req->logprobs, e) ||
        dray_srv_get_int(req->root, "top_logprobs", 0, DRAY_MAX_TOP_LOGPROBS, &has_top, &top, e))
        return -1;
    if (has_top && !req->logprobs) /* as OpenAI answers */
        return dray_srv_bad(e, "top_logprobs", "'top_logprobs' is only allowed when 'logprobs' is "
                            "true");
    req->top_logprobs = (uint32_t)top;
    return 0;
}

/* text: logprobs is the number of alternatives (false: none asked) */
static int parse_text(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(req->root, "logprobs");
    if (v && !json_is_false(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > DRAY_SRV_MAX_TEXT_LOGPROBS)
            return dray_srv_bad(e, "logprobs", "'logprobs' must be an integer between 0 and %d "
                                "(the most alternatives per token /v1/completions gives, as "
                                "OpenAI's legacy API), got %s", DRAY_SRV_MAX_TEXT_LOGPROBS,
                                json_is_integer(v) ? "one out of range" : dray_srv_kind_of(v));
        req->logprobs = true;
        req->top_logprobs = (uint32_t)json_integer_value(v);
    }
    return dray_srv_get_bool(req->root, "echo", "echo", &req->echo, e);
}

int dray_srv_parse_logprobs(struct dray_srv_request *req, struct dray_srv_error *e)
{
    if ((req->kind == DRAY_SRV_CHAT ? parse_chat(req, e) : parse_text(req, e)))
        return -1;
    if (req->zero_tokens && !req->echo)
        return dray_srv_bad(e, req->zero_tokens, "'%s' must be at least 1 (0, the prompt alone, "
                            "is allowed with 'echo': true on /v1/completions)", req->zero_tokens);
    return 0;
}

int dray_srv_parse_prompt_ids(struct dray_srv_request *req, json_t *p, struct dray_srv_error *e)
{
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_array(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* a batch of one */
    if (!json_is_array(p) || !json_is_integer(json_array_get(p, 0)))
        return 0;
    size_t n = json_array_size(p), i;
    json_t *id;
    if (!(req->prompt_ids = malloc(n * sizeof(*req->prompt_ids))))
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_array_foreach(p, i, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX)
            return dray_srv_bad(e, "prompt", "prompt[%zu] must be a token id (an integer >= 0), "
                                "got %s", i, json_is_integer(id) ? "one out of range"
                                                                 : dray_srv_kind_of(id));
        req->prompt_ids[i] = (int32_t)json_integer_value(id);
    }
    req->n_prompt_ids = n;
    return 1;
}
