#include "request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fields.h"
#include "json_grammar.h"
#include "jfield.h"
#include "logprobs.h"
#include "sampling.h"
#include "tools.h"

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
                                text ? dray_srv_kind_of(text) : "nothing");
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

/* The keys a message may have, by role; null values count as absent. */
static int check_message_keys(json_t *m, const char *role, size_t i, struct dray_srv_error *e)
{
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) {
        bool ok = !strcmp(key, "role") || !strcmp(key, "content") || !strcmp(key, "name") ||
                  json_is_null(v) || (!strcmp(role, "assistant") && !strcmp(key, "tool_calls")) ||
                  (!strcmp(role, "tool") && !strcmp(key, "tool_call_id"));
        if (!ok) {
            char param[96];
            snprintf(param, sizeof(param), "messages[%zu].%.60s", i, key);
            return dray_srv_bad(e, param, "Unrecognized request argument supplied: %s", param);
        }
    }
    return 0;
}

/* An assistant message's tool_calls: an array, kept for tools.c to render. */
static int parse_tool_calls(struct dray_srv_request *req, json_t *m, size_t i, struct dray_srv_error *e)
{
    json_t *calls = dray_srv_field(m, "tool_calls");
    if (!calls)
        return 0;
    char param[96];
    snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
    if (!json_is_array(calls))
        return dray_srv_bad(e, param, "%s must be an array, got %s", param, dray_srv_kind_of(calls));
    if (!req->msg_calls && !(req->msg_calls = calloc(req->n_msgs, sizeof(*req->msg_calls))))
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    req->msg_calls[i] = json_array_size(calls) ? calls : NULL;
    return 0;
}

static int parse_message(struct dray_srv_request *req, json_t *m, size_t i, struct dray_srv_error *e)
{
    char param[96];
    snprintf(param, sizeof(param), "messages[%zu]", i);
    if (!json_is_object(m))
        return dray_srv_bad(e, param, "%s must be an object with 'role' and 'content', got %s",
                            param, dray_srv_kind_of(m));
    json_t *role = json_object_get(m, "role"), *content = dray_srv_field(m, "content");
    snprintf(param, sizeof(param), "messages[%zu].role", i);
    if (!json_is_string(role))
        return dray_srv_bad(e, param, "%s must be a string, got %s", param,
                            role ? dray_srv_kind_of(role) : "nothing");
    const char *r = json_string_value(role);
    /* "developer" is OpenAI's newer name for the system role */
    if (!strcmp(r, "developer"))
        r = "system";
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
        return dray_srv_bad(e, param, "%s must be \"system\", \"user\", \"assistant\", \"tool\" "
                            "or \"developer\", got \"%.40s\"", param, r);
    req->msgs[i].role = r;
    if (check_message_keys(m, r, i, e) || parse_tool_calls(req, m, i, e))
        return -1;
    snprintf(param, sizeof(param), "messages[%zu].content", i);
    if (!content && req->msg_calls && req->msg_calls[i])
        return 0; /* an assistant turn of tool calls only */
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
                        content ? dray_srv_kind_of(content) : "nothing");
}

static int parse_messages(struct dray_srv_request *req, const struct dray_config *cfg,
                          struct dray_srv_error *e)
{
    json_t *msgs = json_object_get(req->root, "messages");
    if (!msgs)
        return dray_srv_bad(e, "messages", "'messages' is required: an array of {\"role\", \"content\"}");
    if (!json_is_array(msgs))
        return dray_srv_bad(e, "messages", "'messages' must be an array, got %s", dray_srv_kind_of(msgs));
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
    req->n_msgs = req->n_joined = n;
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
    /* text completions also take token ids (lm-evaluation-harness sends them) */
    int ids = req->kind == DRAY_SRV_COMPLETION ? dray_srv_parse_prompt_ids(req, p, e) : 0;
    if (ids)
        return ids < 0 ? -1 : 0;
    if (!json_is_string(p))
        return dray_srv_bad(e, "prompt", "'prompt' must be a string (or a list of one string, or "
                            "of token ids on /v1/completions), got %s",
                            json_is_array(p) ? "an array of something else" : dray_srv_kind_of(p));
    req->prompt = json_string_value(p);
    return 0;
}

/* ------------------------------------------------------------ generation */

/* Whether the grammar req->grammar is one dray can follow under the request's
 * limits; else a 400 naming field, the grammar's field or the one it was
 * compiled from (tools, response_format), with the parser's reason once. */
static int check_grammar(struct dray_srv_request *req, const char *field, struct dray_srv_error *e)
{
    char why[400];
    const char *g = req->grammar;
    if (!dray_grammar_check_limits(g, strlen(g), &req->gen.grammar_limits, why, sizeof(why)))
        return 0;
    const char *what = !strncmp(why, "grammar: ", 9) ? why + 9 : why;
    if (!strcmp(field, "grammar"))
        return dray_srv_bad(e, field, "'grammar' is not a GBNF grammar dray can follow: %s", what);
    return dray_srv_bad(e, field, "the grammar '%s' compiles to is not one dray can follow: %s",
                        field, what);
}

/* What the reply must follow: response_format (json_grammar.h), tools (tools.h)
 * or a GBNF 'grammar' of the client's own (llama-server's field); one of them. */
static int parse_structured(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *rf = dray_srv_field(req->root, "response_format"), *gr = dray_srv_field(req->root, "grammar");
    char *g = NULL;
    if (dray_srv_parse_tools(req, e))
        return -1;
    if (req->grammar && check_grammar(req, "tools", e))
        return -1;
    if (rf && dray_srv_response_format_grammar(rf, &g, e))
        return -1;
    if (g && req->grammar) {
        free(g);
        return dray_srv_bad(e, "response_format", "'response_format' %s with 'tools' that may be "
                            "called: ask for one or the other (or 'tool_choice': \"none\")",
                            json_string_value(json_object_get(rf, "type")));
    }
    if (g) {
        req->grammar = g;
        if (check_grammar(req, "response_format", e))
            return -1;
    }
    if (gr && !json_is_string(gr))
        return dray_srv_bad(e, "grammar", "'grammar' must be a string of GBNF, got %s", dray_srv_kind_of(gr));
    if (gr && req->grammar)
        return dray_srv_bad(e, "grammar", "'grammar' with %s: ask for one", rf ? "'response_format'" : "'tools'");
    if (gr && !(req->grammar = strdup(json_string_value(gr))))
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (gr && check_grammar(req, "grammar", e))
        return -1;
    req->gen.grammar = req->grammar;
    return req->kind == DRAY_SRV_CHAT ? dray_srv_render_tools(req, e) : 0;
}

/* n choices of one prompt; best_of (text, legacy) may only repeat n: choosing
 * the best of more than are returned needs a score dray does not define. */
static int parse_n(struct dray_srv_request *req, struct dray_srv_error *e)
{
    long long n = 1, best = 0;
    bool has_n, has_best;
    if (dray_srv_get_int(req->root, "n", 1, DRAY_SRV_MAX_N, &has_n, &n, e) ||
        dray_srv_get_int(req->root, "best_of", 1, DRAY_SRV_MAX_N, &has_best, &best, e))
        return -1;
    if (has_best && best != n)
        return dray_srv_bad(e, "best_of", "'best_of' must equal 'n' (%lld): dray returns every "
                            "choice it generates", n);
    req->n = (uint32_t)n;
    return 0;
}

static int parse_stream(struct dray_srv_request *req, struct dray_srv_error *e)
{
    if (dray_srv_get_bool(req->root, "stream", "stream", &req->stream, e))
        return -1;
    json_t *so = dray_srv_field(req->root, "stream_options"), *v;
    const char *key;
    if (!so)
        return 0;
    if (!json_is_object(so))
        return dray_srv_bad(e, "stream_options", "'stream_options' must be an object, got %s",
                            dray_srv_kind_of(so));
    bool asks = false; /* a member that is not null: nulls count as absent */
    json_object_foreach(so, key, v) {
        char param[96];
        snprintf(param, sizeof(param), "stream_options.%.60s", key);
        if (!json_is_null(v) && strcmp(key, "include_usage"))
            return dray_srv_bad(e, param, "Unrecognized request argument supplied: %s", param);
        asks = asks || !json_is_null(v);
    }
    if (dray_srv_get_bool(so, "include_usage", "stream_options.include_usage", &req->include_usage, e))
        return -1;
    if (asks && !req->stream) /* as OpenAI answers */
        return dray_srv_bad(e, "stream_options", "The 'stream_options' parameter is only allowed when "
                            "'stream' is enabled.");
    return 0;
}

static int parse_generation(struct dray_srv_request *req, const struct dray_config *cfg,
                            struct dray_srv_error *e)
{
    int rc = req->kind == DRAY_SRV_CHAT ? parse_messages(req, cfg, e) : parse_prompt(req, e);
    return rc || dray_srv_get_string(req->root, "user", &req->user, e) ||
           dray_srv_get_string(req->root, "cache_salt", &req->cache_salt, e) ||
           dray_srv_parse_sampling(req, cfg, e) || dray_srv_parse_logprobs(req, e) ||
           parse_n(req, e) || parse_stream(req, e) || parse_structured(req, e);
}

/* ------------------------------------------------------------ tokenize */

/* vLLM's /tokenize: a prompt (add_special_tokens, default true) or messages
 * rendered with the chat template (add_generation_prompt, default true). */
static int parse_tokenize(struct dray_srv_request *req, const struct dray_config *cfg,
                          struct dray_srv_error *e)
{
    bool has_msgs = dray_srv_field(req->root, "messages"), has_prompt = dray_srv_field(req->root, "prompt");
    req->add_special_tokens = req->add_generation_prompt = true;
    if (has_msgs && has_prompt)
        return dray_srv_bad(e, "messages", "give 'prompt' or 'messages', not both");
    if (!has_msgs && !has_prompt)
        return dray_srv_bad(e, "prompt", "'prompt' (a string) or 'messages' is required");
    if (has_prompt) {
        if (dray_srv_field(req->root, "add_generation_prompt"))
            return dray_srv_bad(e, "add_generation_prompt", "'add_generation_prompt' applies to "
                                "'messages', not to 'prompt'");
        return parse_prompt(req, e) ||
               dray_srv_get_bool(req->root, "add_special_tokens", "add_special_tokens",
                                 &req->add_special_tokens, e);
    }
    bool special = false;
    if (parse_messages(req, cfg, e) ||
        dray_srv_get_bool(req->root, "add_generation_prompt", "add_generation_prompt",
                          &req->add_generation_prompt, e) ||
        dray_srv_get_bool(req->root, "add_special_tokens", "add_special_tokens", &special, e))
        return -1;
    if (special)
        return dray_srv_bad(e, "add_special_tokens", "'add_special_tokens' must be false with "
                            "'messages': the chat template places the special tokens");
    return dray_srv_render_tools(req, e); /* tool messages and calls, as a chat renders them */
}

/* vLLM's /detokenize: {"tokens": [id, ...]}; the ids are checked against the
 * vocabulary once the model is known. */
static int parse_detokenize(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(req->root, "tokens"), *id;
    size_t i;
    if (!v)
        return dray_srv_bad(e, "tokens", "'tokens' is required: an array of token ids");
    if (!json_is_array(v))
        return dray_srv_bad(e, "tokens", "'tokens' must be an array of token ids, got %s",
                            dray_srv_kind_of(v));
    req->n_tokens = json_array_size(v);
    if (!(req->tokens = calloc(req->n_tokens ? req->n_tokens : 1, sizeof(*req->tokens))))
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_array_foreach(v, i, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX)
            return dray_srv_bad(e, "tokens", "tokens[%zu] must be a token id (an integer >= 0), got %s",
                                i, json_is_integer(id) ? "one out of range" : dray_srv_kind_of(id));
        req->tokens[i] = (int32_t)json_integer_value(id);
    }
    return 0;
}

/* ------------------------------------------------------------ the body */

/* The key whose value holds the number that ends at pos (a plain value or an
 * element of an array of numbers): "" when there is none to name. */
static void key_before(const char *body, size_t pos, char *key, size_t n)
{
    key[0] = 0;
    size_t i = pos;
    while (i > 0 && strchr("0123456789+-.eE, \t\r\n[", body[i - 1]))
        i--;
    if (i == 0 || body[i - 1] != ':')
        return;
    for (i--; i > 0 && strchr(" \t\r\n", body[i - 1]); i--)
        ;
    if (i == 0 || body[i - 1] != '"')
        return;
    size_t end = --i;
    while (i > 0 && body[i - 1] != '"' && body[i - 1] != '\\')
        i--;
    if (i == 0 || body[i - 1] != '"' || end - i >= n)
        return;
    memcpy(key, body + i, end - i);
    key[end - i] = 0;
}

static int parse_body(struct dray_srv_request *req, const char *body, size_t len,
                      struct dray_srv_error *e)
{
    json_error_t jerr;
    req->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!req->root && strstr(jerr.text, "too big") && jerr.position > 0 && (size_t)jerr.position <= len) {
        /* valid JSON, but an integer past int64: name the field it is in */
        char key[64];
        key_before(body, (size_t)jerr.position, key, sizeof(key));
        return dray_srv_bad(e, key[0] ? key : NULL, "%s%s%san integer past what 64 bits hold (line %d, "
                            "column %d)", key[0] ? "'" : "", key, key[0] ? "' holds " : "the body holds ",
                            jerr.line, jerr.column);
    }
    if (!req->root)
        return dray_srv_bad(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                            jerr.line, jerr.column);
    if (!json_is_object(req->root))
        return dray_srv_bad(e, NULL, "the body must be a JSON object, got %s", dray_srv_kind_of(req->root));
    return 0;
}

int dray_srv_request_parse(enum dray_srv_kind kind, const char *body, size_t len,
                           const struct dray_config *cfg, struct dray_srv_request *req,
                           struct dray_srv_error *e)
{
    *req = (struct dray_srv_request){.kind = kind};
    int rc = parse_body(req, body, len, e) || dray_srv_check_fields(kind, req->root, e) ||
             dray_srv_get_string(req->root, "model", &req->model, e);
    if (!rc)
        rc = kind == DRAY_SRV_TOKENIZE ? parse_tokenize(req, cfg, e)
             : kind == DRAY_SRV_DETOKENIZE ? parse_detokenize(req, e)
                                           : parse_generation(req, cfg, e);
    if (rc) {
        dray_srv_request_free(req);
        return -1;
    }
    return 0;
}

int dray_srv_request_check_vocab(const struct dray_srv_request *req, uint32_t n_vocab,
                                 struct dray_srv_error *e)
{
    const struct dray_gen_params *g = &req->gen;
    for (uint32_t i = 0; i < g->n_logit_bias; i++)
        if ((uint32_t)g->logit_bias[i].id >= n_vocab)
            return dray_srv_bad(e, "logit_bias", "'logit_bias' names token %d; the model's "
                                "vocabulary is 0..%u", g->logit_bias[i].id, n_vocab - 1);
    for (uint32_t i = 0; i < g->n_stop_ids; i++)
        if ((uint32_t)g->stop_ids[i] >= n_vocab)
            return dray_srv_bad(e, "stop_token_ids", "stop_token_ids[%u] is %d; the model's "
                                "vocabulary is 0..%u", i, g->stop_ids[i], n_vocab - 1);
    for (size_t i = 0; i < req->n_prompt_ids; i++)
        if ((uint32_t)req->prompt_ids[i] >= n_vocab)
            return dray_srv_bad(e, "prompt", "prompt[%zu] is token %d; the model's vocabulary is "
                                "0..%u", i, req->prompt_ids[i], n_vocab - 1);
    for (size_t i = 0; i < req->n_tokens; i++)
        if ((uint32_t)req->tokens[i] >= n_vocab)
            return dray_srv_bad(e, "tokens", "tokens[%zu] is %d; the model's vocabulary is 0..%u", i,
                                req->tokens[i], n_vocab - 1);
    return 0;
}

void dray_srv_request_free(struct dray_srv_request *req)
{
    for (size_t i = 0; req->joined && i < req->n_joined; i++)
        free(req->joined[i]);
    free(req->joined);
    for (size_t i = 0; i < req->n_owned; i++)
        free(req->owned[i]);
    free(req->owned);
    free(req->msg_calls);
    free(req->grammar);
    free(req->msgs);
    free(req->bias);
    free(req->stop_ids);
    free(req->tokens);
    free(req->prompt_ids);
    json_decref(req->root);
    *req = (struct dray_srv_request){.kind = req->kind};
}
