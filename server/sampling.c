#include "sampling.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "jfield.h"

static int parse_stop(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(req->root, "stop");
    char param[32];
    if (!v)
        return 0;
    if (json_is_string(v)) {
        if (!json_string_length(v))
            return dray_srv_bad(e, "stop", "'stop' is an empty string");
        req->stop[req->gen.n_stop++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v))
        return dray_srv_bad(e, "stop", "'stop' must be a string or an array of strings, got %s",
                            dray_srv_kind_of(v));
    if (json_array_size(v) > DRAY_SRV_MAX_STOP)
        return dray_srv_bad(e, "stop", "'stop' has %zu strings; at most %d are allowed",
                            json_array_size(v), DRAY_SRV_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        snprintf(param, sizeof(param), "stop[%zu]", i);
        if (!json_is_string(s) || !json_string_length(s))
            return dray_srv_bad(e, param, "%s must be a non-empty string, got %s", param,
                                json_is_string(s) ? "an empty string" : dray_srv_kind_of(s));
        req->stop[req->gen.n_stop++] = json_string_value(s);
    }
    return 0;
}

static int parse_max_tokens(struct dray_srv_request *req, const struct dray_config *cfg,
                            struct dray_srv_error *e)
{
    long long mt = 0, mct = 0;
    bool has_mt, has_mct;
    long long cap = cfg->max_completion_tokens;
    /* 0 is read here and refused without echo (logprobs.c): the prompt alone */
    if (dray_srv_get_int(req->root, "max_tokens", 0, cap, &has_mt, &mt, e) ||
        dray_srv_get_int(req->root, "max_completion_tokens", 0, cap, &has_mct, &mct, e))
        return -1;
    if (has_mct ? mct == 0 : has_mt && mt == 0)
        req->zero_tokens = has_mct ? "max_completion_tokens" : "max_tokens";
    /* max_completion_tokens is OpenAI's newer name; it wins when both are given */
    if (has_mct)
        req->gen.max_tokens = (uint32_t)mct;
    else if (has_mt)
        req->gen.max_tokens = (uint32_t)mt;
    else
        req->gen.max_tokens = cfg->max_tokens < cfg->max_completion_tokens ? cfg->max_tokens
                                                                           : cfg->max_completion_tokens;
    return 0;
}

/* OpenAI's penalties (-2..2) and vLLM's repetition_penalty (CTRL's, (0, 2]). */
static int parse_penalties(struct dray_srv_request *req, struct dray_srv_error *e)
{
    struct dray_gen_params *g = &req->gen;
    float rp = g->repeat_penalty;
    if (dray_srv_get_number(req->root, "frequency_penalty", -2, 2, &g->frequency_penalty, e) ||
        dray_srv_get_number(req->root, "presence_penalty", -2, 2, &g->presence_penalty, e) ||
        dray_srv_get_number(req->root, "repetition_penalty", 0, 2, &rp, e))
        return -1;
    if (!(rp > 0))
        return dray_srv_bad(e, "repetition_penalty", "'repetition_penalty' must be greater than 0 "
                            "(1 = off), got 0");
    g->repeat_penalty = rp;
    return 0;
}

/* {"<token id>": bias in -100..100, ...}; the ids are checked against the
 * vocabulary once the model is known (dray_srv_request_check_vocab). */
static int parse_logit_bias(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(req->root, "logit_bias");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return dray_srv_bad(e, "logit_bias", "'logit_bias' must be an object mapping token ids "
                            "(as strings) to biases, got %s", dray_srv_kind_of(v));
    size_t n = json_object_size(v);
    if (n > DRAY_SRV_MAX_LOGIT_BIAS)
        return dray_srv_bad(e, "logit_bias", "'logit_bias' has %zu entries; at most %d are allowed",
                            n, DRAY_SRV_MAX_LOGIT_BIAS);
    if (!n)
        return 0;
    if (!(req->bias = calloc(n, sizeof(*req->bias))))
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b) {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!isdigit((unsigned char)key[0]) || *end || errno || id > INT32_MAX)
            return dray_srv_bad(e, "logit_bias", "'logit_bias' keys must be token ids (decimal "
                                "integers >= 0), got \"%.40s\"", key);
        if (!json_is_number(b) || json_number_value(b) < -100 || json_number_value(b) > 100)
            return dray_srv_bad(e, "logit_bias", "'logit_bias' of token %ld must be a number between "
                                "-100 and 100, got %s", id,
                                json_is_number(b) ? "a number out of range" : dray_srv_kind_of(b));
        req->bias[req->gen.n_logit_bias++] = (struct dray_logit_bias){(int32_t)id,
                                                                       (float)json_number_value(b)};
    }
    req->gen.logit_bias = req->bias;
    return 0;
}

/* vLLM's: [id, ...], each ending the generation when sampled */
static int parse_stop_ids(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(req->root, "stop_token_ids");
    if (!v)
        return 0;
    if (!json_is_array(v))
        return dray_srv_bad(e, "stop_token_ids", "'stop_token_ids' must be an array of token ids, "
                            "got %s", dray_srv_kind_of(v));
    size_t n = json_array_size(v), i;
    if (n > DRAY_SRV_MAX_STOP_IDS)
        return dray_srv_bad(e, "stop_token_ids", "'stop_token_ids' has %zu ids; at most %d are "
                            "allowed", n, DRAY_SRV_MAX_STOP_IDS);
    if (!n)
        return 0;
    if (!(req->stop_ids = calloc(n, sizeof(*req->stop_ids))))
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *id;
    json_array_foreach(v, i, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX)
            return dray_srv_bad(e, "stop_token_ids", "stop_token_ids[%zu] must be a token id (an "
                                "integer >= 0), got %s", i,
                                json_is_integer(id) ? "one out of range" : dray_srv_kind_of(id));
        req->stop_ids[i] = (int32_t)json_integer_value(id);
    }
    req->gen.stop_ids = req->stop_ids;
    req->gen.n_stop_ids = (uint32_t)n;
    return 0;
}

/* vLLM's ignore_eos and min_tokens (at most max_tokens). */
static int parse_eos(struct dray_srv_request *req, const struct dray_config *cfg,
                     struct dray_srv_error *e)
{
    long long mt = 0;
    bool has;
    if (dray_srv_get_bool(req->root, "ignore_eos", "ignore_eos", &req->gen.ignore_eos, e) ||
        dray_srv_get_int(req->root, "min_tokens", 0, cfg->max_completion_tokens, &has, &mt, e))
        return -1;
    if (has && mt > req->gen.max_tokens)
        return dray_srv_bad(e, "min_tokens", "'min_tokens' (%lld) is more than max_tokens (%u)", mt,
                            req->gen.max_tokens);
    req->gen.min_tokens = (uint32_t)mt;
    return 0;
}

int dray_srv_parse_sampling(struct dray_srv_request *req, const struct dray_config *cfg,
                            struct dray_srv_error *e)
{
    struct dray_gen_params *g = &req->gen;
    long long top_k = 0, seed = 0;
    bool has_top_k, has_seed;
    dray_gen_params_from_config(cfg, g);
    g->stop = req->stop;
    g->n_stop = 0;
    if (dray_srv_get_number(req->root, "temperature", 0, 2, &g->temperature, e) ||
        dray_srv_get_number(req->root, "top_p", 0, 1, &g->top_p, e) ||
        dray_srv_get_number(req->root, "min_p", 0, 1, &g->min_p, e) ||
        dray_srv_get_int(req->root, "top_k", -1, 1 << 20, &has_top_k, &top_k, e) ||
        dray_srv_get_int(req->root, "seed", LLONG_MIN, LLONG_MAX, &has_seed, &seed, e))
        return -1;
    if (has_top_k)
        g->top_k = top_k < 0 ? 0 : (uint32_t)top_k; /* -1 is the usual spelling of "off" */
    /* dray reads seed 0 as "from the clock"; a client that says 0 wants a fixed
     * seed, so 0 is mapped to another fixed value */
    if (has_seed)
        g->seed = seed ? (uint64_t)seed : 0x9e3779b97f4a7c15ull;
    return parse_max_tokens(req, cfg, e) || parse_stop(req, e) || parse_penalties(req, e) ||
           parse_logit_bias(req, e) || parse_stop_ids(req, e) || parse_eos(req, cfg, e);
}
