#include "response.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dray/dray.h"

static json_t *usage_json(const struct dray_srv_usage *u)
{
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt,
                     "completion_tokens", (json_int_t)u->completion, "total_tokens",
                     (json_int_t)u->prompt + u->completion, "prompt_tokens_details",
                     "cached_tokens", (json_int_t)u->cached);
}

/* The fields every body starts with: id, object, created, model. */
static json_t *envelope(const struct dray_srv_ident *id, bool chunk)
{
    const char *object = id->kind == DRAY_SRV_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                   : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", id->id, "object", object, "created",
                     (json_int_t)id->created, "model", id->model);
}

/* One choice: chat carries its text in "message" (whole) or "delta" (stream),
 * a text completion in "text". Takes c's json. */
static json_t *choice_json(enum dray_srv_kind kind, bool chunk, struct dray_srv_choice *c)
{
    json_t *content = c->text ? json_stringn(c->text, c->len) : NULL;
    json_t *lp = c->logprobs ? c->logprobs : json_null(), *calls = c->tool_calls;
    c->logprobs = c->tool_calls = NULL;
    if (c->text && !content) { /* not UTF-8 */
        json_decref(lp);
        json_decref(calls);
        return NULL;
    }
    /* json_pack takes lp's reference, failing or not */
    json_t *j = json_pack("{s:I, s:o, s:o}", "index", (json_int_t)c->index, "logprobs", lp,
                          "finish_reason", c->finish_reason ? json_string(c->finish_reason)
                                                            : json_null());
    if (!j) {
        json_decref(content);
        json_decref(calls);
        return NULL;
    }
    if (kind == DRAY_SRV_COMPLETION) {
        json_decref(calls);
        if (json_object_set_new(j, "text", content ? content : json_string(""))) {
            json_decref(j);
            return NULL;
        }
        return j;
    }
    json_t *msg = json_object();
    /* a whole message always has "content": null when it has none (a tool call) */
    if (!content && !chunk)
        content = json_null();
    if (!msg || (c->role && json_object_set_new(msg, "role", json_string("assistant"))) ||
        (content && json_object_set_new(msg, "content", content)) ||
        (calls && json_object_set_new(msg, "tool_calls", calls)) ||
        json_object_set_new(j, chunk ? "delta" : "message", msg)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

char *dray_srv_choices_json(const struct dray_srv_ident *id, struct dray_srv_choice *c, size_t n,
                            const struct dray_srv_usage *u)
{
    json_t *root = envelope(id, false), *choices = json_array();
    char *out = NULL;
    bool ok = root && choices;
    for (size_t i = 0; i < n; i++) {
        c[i].role = true;
        json_t *j = choice_json(id->kind, false, &c[i]);
        ok = ok && j && !json_array_append_new(choices, j);
        if (!ok)
            json_decref(j);
    }
    if (ok && !json_object_set_new(root, "choices", choices) &&
        !json_object_set_new(root, "usage", usage_json(u)))
        out = json_dumps(root, JSON_COMPACT);
    else if (!ok)
        json_decref(choices);
    json_decref(root);
    return out;
}

char *dray_srv_completion_json(const struct dray_srv_ident *id, const char *text, size_t len,
                               const char *finish_reason, const struct dray_srv_usage *u)
{
    return dray_srv_completion_json_lp(id, text, len, finish_reason, u, NULL);
}

char *dray_srv_completion_json_lp(const struct dray_srv_ident *id, const char *text, size_t len,
                                  const char *finish_reason, const struct dray_srv_usage *u,
                                  json_t *logprobs)
{
    struct dray_srv_choice c = {.text = text, .len = len, .finish_reason = finish_reason,
                                .logprobs = logprobs};
    return dray_srv_choices_json(id, &c, 1, u);
}

/* "data: <compact json>\n\n"; takes the reference to root. */
static int sse_event(struct dray_srv_buf *out, json_t *root)
{
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text)
        return DRAY_ENOMEM;
    int rc = dray_srv_buf_printf(out, "data: %s\n\n", text);
    free(text);
    return rc;
}

int dray_srv_sse_choice(struct dray_srv_buf *out, const struct dray_srv_ident *id,
                        struct dray_srv_choice *c, bool with_usage_null)
{
    json_t *root = envelope(id, true), *choices = json_array();
    /* the role chunk carries "content": "" like OpenAI's; the finishing chunk an
     * empty delta; a text completion's chunk always has text */
    if (c->role && !c->tool_calls) {
        c->text = "";
        c->len = 0;
    } else if (!c->len && c->finish_reason) {
        c->text = NULL;
    }
    if (!c->text && id->kind == DRAY_SRV_COMPLETION)
        c->text = "";
    json_t *j = choice_json(id->kind, true, c);
    if (!root || !choices || !j || json_array_append_new(choices, j) ||
        json_object_set_new(root, "choices", choices) ||
        (with_usage_null && json_object_set_new(root, "usage", json_null()))) {
        json_decref(root);
        return DRAY_EINVAL;
    }
    return sse_event(out, root);
}

int dray_srv_sse_chunk(struct dray_srv_buf *out, const struct dray_srv_ident *id, bool role,
                       const char *text, size_t len, const char *finish_reason, bool with_usage_null)
{
    return dray_srv_sse_chunk_lp(out, id, role, text, len, finish_reason, with_usage_null, NULL);
}

int dray_srv_sse_chunk_lp(struct dray_srv_buf *out, const struct dray_srv_ident *id, bool role,
                          const char *text, size_t len, const char *finish_reason,
                          bool with_usage_null, json_t *logprobs)
{
    struct dray_srv_choice c = {.role = role, .text = text, .len = len,
                                .finish_reason = finish_reason, .logprobs = logprobs};
    return dray_srv_sse_choice(out, id, &c, with_usage_null);
}

int dray_srv_sse_usage(struct dray_srv_buf *out, const struct dray_srv_ident *id,
                       const struct dray_srv_usage *u)
{
    json_t *root = envelope(id, true);
    if (!root || json_object_set_new(root, "choices", json_array()) ||
        json_object_set_new(root, "usage", usage_json(u))) {
        json_decref(root);
        return DRAY_ENOMEM;
    }
    return sse_event(out, root);
}

int dray_srv_sse_error(struct dray_srv_buf *out, const struct dray_srv_error *e)
{
    char *text = dray_srv_error_json(e);
    if (!text)
        return DRAY_ENOMEM;
    int rc = dray_srv_buf_printf(out, "data: %s\n\n", text);
    free(text);
    return rc;
}

int dray_srv_sse_done(struct dray_srv_buf *out)
{
    static const char done[] = "data: [DONE]\n\n";
    return dray_srv_buf_add(out, done, sizeof(done) - 1);
}

char *dray_srv_tokens_json(const int32_t *ids, size_t n, uint32_t max_model_len)
{
    json_t *tokens = json_array();
    for (size_t i = 0; tokens && i < n; i++)
        if (json_array_append_new(tokens, json_integer(ids[i]))) {
            json_decref(tokens);
            return NULL;
        }
    json_t *root = tokens ? json_pack("{s:o, s:I, s:I}", "tokens", tokens, "count", (json_int_t)n,
                                      "max_model_len", (json_int_t)max_model_len)
                          : NULL;
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}

char *dray_srv_detokenized_json(const char *text, size_t len)
{
    json_t *s = json_stringn(text, len);
    json_t *root = s ? json_pack("{s:o}", "prompt", s) : NULL;
    char *out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return out;
}
