#include "request.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "a string", "an array", ... for "expected X, got Y" messages */
static const char *kind_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a JSON value";
}

/* A field the client set; an absent key and an explicit null both mean "not given". */
static json_t *field(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_number(json_t *root, const char *key, double lo, double hi, float *out,
                      struct dray_srv_error *e)
{
    json_t *v = field(root, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return dray_srv_bad(e, key, "'%s' must be a number, got %s", key, kind_of(v));
    double d = json_number_value(v);
    if (d < lo || d > hi)
        return dray_srv_bad(e, key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    *out = (float)d;
    return 0;
}

/* *given tells whether the key was there (out untouched otherwise). */
static int get_int(json_t *root, const char *key, long long lo, long long hi, bool *given,
                   long long *out, struct dray_srv_error *e)
{
    json_t *v = field(root, key);
    *given = v != NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return dray_srv_bad(e, key, "'%s' must be an integer, got %s", key, kind_of(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return dray_srv_bad(e, key, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(json_t *obj, const char *key, const char *param, bool *out,
                    struct dray_srv_error *e)
{
    json_t *v = field(obj, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return dray_srv_bad(e, param, "'%s' must be true or false, got %s", param, kind_of(v));
    *out = json_is_true(v);
    return 0;
}

static int get_string(json_t *obj, const char *key, const char **out, struct dray_srv_error *e)
{
    json_t *v = field(obj, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return dray_srv_bad(e, key, "'%s' must be a string, got %s", key, kind_of(v));
    *out = json_string_value(v);
    return 0;
}

/* ------------------------------------------------------------ messages */

/* Content given as an array of parts: only {"type":"text","text":...} parts are
 * understood; their texts are joined with newlines into *out (malloc'd). */
static int join_text_parts(json_t *parts, size_t mi, char **out, struct dray_srv_error *e)
{
    char param[96];
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(parts, i, part) {
        snprintf(param, sizeof(param), "messages[%zu].content[%zu]", mi, i);
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text"))
            return dray_srv_bad(e, param, "%s: only parts of the form {\"type\": \"text\", \"text\": "
                                "\"...\"} are supported", param);
        if (!json_is_string(text))
            return dray_srv_bad(e, param, "%s.text must be a string, got %s", param,
                                text ? kind_of(text) : "nothing");
        total += json_string_length(text) + 1;
    }
    char *s = malloc(total), *p = s;
    if (!s)
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_array_foreach(parts, i, part) {
        json_t *text = json_object_get(part, "text");
        if (i)
            *p++ = '\n';
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    *p = '\0';
    *out = s;
    return 0;
}

static int parse_message(struct dray_srv_request *req, json_t *m, size_t i, struct dray_srv_error *e)
{
    char param[96];
    snprintf(param, sizeof(param), "messages[%zu]", i);
    if (!json_is_object(m))
        return dray_srv_bad(e, param, "%s must be an object with 'role' and 'content', got %s",
                            param, kind_of(m));
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    snprintf(param, sizeof(param), "messages[%zu].role", i);
    if (!json_is_string(role))
        return dray_srv_bad(e, param, "%s must be a string, got %s", param,
                            role ? kind_of(role) : "nothing");
    const char *r = json_string_value(role);
    /* "developer" is OpenAI's newer name for the system role */
    if (!strcmp(r, "developer"))
        r = "system";
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
        return dray_srv_bad(e, param, "%s must be \"system\", \"user\", \"assistant\" or "
                            "\"developer\", got \"%.40s\"", param, r);
    req->msgs[i].role = r;
    snprintf(param, sizeof(param), "messages[%zu].content", i);
    if (json_is_string(content)) {
        req->msgs[i].content = json_string_value(content);
        return 0;
    }
    if (json_is_array(content)) {
        if (join_text_parts(content, i, &req->joined[i], e))
            return -1;
        req->msgs[i].content = req->joined[i];
        return 0;
    }
    return dray_srv_bad(e, param, "%s must be a string or an array of text parts, got %s", param,
                        content ? kind_of(content) : "nothing");
}

static int parse_messages(struct dray_srv_request *req, const struct dray_config *cfg,
                          struct dray_srv_error *e)
{
    json_t *msgs = json_object_get(req->root, "messages");
    if (!msgs)
        return dray_srv_bad(e, "messages", "'messages' is required: an array of {\"role\", \"content\"}");
    if (!json_is_array(msgs))
        return dray_srv_bad(e, "messages", "'messages' must be an array, got %s", kind_of(msgs));
    size_t n = json_array_size(msgs);
    if (n == 0)
        return dray_srv_bad(e, "messages", "'messages' is empty: give at least one message");
    if (n > cfg->max_messages)
        return dray_srv_bad(e, "messages", "%zu messages is more than this server accepts (%u, "
                            "config key max_messages)", n, cfg->max_messages);
    req->msgs = calloc(n, sizeof(*req->msgs));
    req->joined = calloc(n, sizeof(*req->joined));
    if (!req->msgs || !req->joined)
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    req->n_msgs = n;
    for (size_t i = 0; i < n; i++)
        if (parse_message(req, json_array_get(msgs, i), i, e))
            return -1;
    return 0;
}

static int parse_prompt(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *p = json_object_get(req->root, "prompt");
    /* clients that batch send a list; dray answers one prompt per request */
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (!p)
        return dray_srv_bad(e, "prompt", "'prompt' is required: a string");
    if (!json_is_string(p))
        return dray_srv_bad(e, "prompt", "'prompt' must be a string (or a list of one string), got %s",
                            json_is_array(p) ? "an array of something else" : kind_of(p));
    req->prompt = json_string_value(p);
    return 0;
}

/* ------------------------------------------------------------ generation */

static int parse_stop(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *v = field(req->root, "stop");
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
                            kind_of(v));
    if (json_array_size(v) > DRAY_SRV_MAX_STOP)
        return dray_srv_bad(e, "stop", "'stop' has %zu strings; at most %d are allowed",
                            json_array_size(v), DRAY_SRV_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        snprintf(param, sizeof(param), "stop[%zu]", i);
        if (!json_is_string(s) || !json_string_length(s))
            return dray_srv_bad(e, param, "%s must be a non-empty string, got %s", param,
                                json_is_string(s) ? "an empty string" : kind_of(s));
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
    if (get_int(req->root, "max_tokens", 1, cap, &has_mt, &mt, e) ||
        get_int(req->root, "max_completion_tokens", 1, cap, &has_mct, &mct, e))
        return -1;
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

static int parse_sampling(struct dray_srv_request *req, const struct dray_config *cfg,
                          struct dray_srv_error *e)
{
    struct dray_gen_params *g = &req->gen;
    long long top_k = 0, seed = 0;
    bool has_top_k, has_seed;
    dray_gen_params_from_config(cfg, g);
    g->stop = req->stop;
    g->n_stop = 0;
    if (get_number(req->root, "temperature", 0, 2, &g->temperature, e) ||
        get_number(req->root, "top_p", 0, 1, &g->top_p, e) ||
        get_number(req->root, "min_p", 0, 1, &g->min_p, e) ||
        get_int(req->root, "top_k", -1, 1 << 20, &has_top_k, &top_k, e) ||
        get_int(req->root, "seed", LLONG_MIN, LLONG_MAX, &has_seed, &seed, e))
        return -1;
    if (has_top_k)
        g->top_k = top_k < 0 ? 0 : (uint32_t)top_k; /* -1 is the usual spelling of "off" */
    /* dray reads seed 0 as "from the clock"; a client that says 0 wants a fixed
     * seed, so 0 is mapped to another fixed value */
    if (has_seed)
        g->seed = seed ? (uint64_t)seed : 0x9e3779b97f4a7c15ull;
    return parse_max_tokens(req, cfg, e) || parse_stop(req, e);
}

/* Fields dray cannot honour are refused rather than silently ignored. */
static int refuse_unsupported(json_t *root, struct dray_srv_error *e)
{
    json_t *v;
    if ((v = field(root, "n")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return dray_srv_bad(e, "n", "'n' must be 1: dray returns one choice per request");
    if ((v = field(root, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return dray_srv_bad(e, "best_of", "'best_of' must be 1: dray returns one choice per request");
    if ((v = field(root, "logprobs")) && !json_is_boolean(v) && !json_is_integer(v))
        return dray_srv_bad(e, "logprobs", "'logprobs' must be false or an integer, got %s", kind_of(v));
    if (v && (json_is_true(v) || (json_is_integer(v) && json_integer_value(v) > 0)))
        return dray_srv_bad(e, "logprobs", "'logprobs' is not supported by this server");
    if ((v = field(root, "echo")) && !json_is_false(v))
        return dray_srv_bad(e, "echo", "'echo' is not supported by this server");
    if ((v = field(root, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
        return dray_srv_bad(e, "tools", "'tools' (function calling) is not supported by this server");
    return 0;
}

static int parse_stream(struct dray_srv_request *req, struct dray_srv_error *e)
{
    if (get_bool(req->root, "stream", "stream", &req->stream, e))
        return -1;
    json_t *so = field(req->root, "stream_options");
    if (!so)
        return 0;
    if (!json_is_object(so))
        return dray_srv_bad(e, "stream_options", "'stream_options' must be an object, got %s",
                            kind_of(so));
    return get_bool(so, "include_usage", "stream_options.include_usage", &req->include_usage, e);
}

static int parse_body(struct dray_srv_request *req, const char *body, size_t len,
                      struct dray_srv_error *e)
{
    json_error_t jerr;
    req->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!req->root)
        return dray_srv_bad(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                            jerr.line, jerr.column);
    if (!json_is_object(req->root))
        return dray_srv_bad(e, NULL, "the body must be a JSON object, got %s", kind_of(req->root));
    return 0;
}

int dray_srv_request_parse(enum dray_srv_kind kind, const char *body, size_t len,
                           const struct dray_config *cfg, struct dray_srv_request *req,
                           struct dray_srv_error *e)
{
    *req = (struct dray_srv_request){.kind = kind};
    int rc = parse_body(req, body, len, e);
    if (!rc)
        rc = kind == DRAY_SRV_CHAT ? parse_messages(req, cfg, e) : parse_prompt(req, e);
    if (!rc)
        rc = get_string(req->root, "model", &req->model, e) ||
             get_string(req->root, "user", &req->user, e) ||
             get_string(req->root, "cache_salt", &req->cache_salt, e) || parse_sampling(req, cfg, e) ||
             parse_stream(req, e) || refuse_unsupported(req->root, e);
    if (rc) {
        dray_srv_request_free(req);
        return -1;
    }
    return 0;
}

void dray_srv_request_free(struct dray_srv_request *req)
{
    for (size_t i = 0; req->joined && i < req->n_msgs; i++)
        free(req->joined[i]);
    free(req->joined);
    free(req->msgs);
    json_decref(req->root);
    *req = (struct dray_srv_request){.kind = req->kind};
}
