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
 * a text completion in "text". text == NULL: a delta with no content key.
 * logprobs (taken; NULL = null) is the choice's "logprobs". */
static json_t *choice_json(enum dray_srv_kind kind, bool chunk, bool role, const char *text,
                           size_t len, const char *finish_reason, json_t *logprobs)
{
    json_t *content = text ? json_stringn(text, len) : NULL;
    if (text && !content) {
        json_decref(logprobs);
        return NULL; /* not UTF-8 */
    }
    json_t *c = json_pack("{s:i, s:o, s:o}", "index", 0, "logprobs", logprobs ? logprobs : json_null(),
                          "finish_reason", finish_reason ? json_string(finish_reason) : json_null());
    if (!c)
        goto fail;
    if (kind == DRAY_SRV_COMPLETION) {
        if (json_object_set_new(c, "text", content ? content : json_string("")))
            goto fail_c;
        return c;
    }
    json_t *msg = json_object();
    if (!msg || (role && json_object_set_new(msg, "role", json_string("assistant"))) ||
        (content && json_object_set_new(msg, "content", content)) ||
        json_object_set_new(c, chunk ? "delta" : "message", msg)) {
        json_decref(c);
        return NULL;
    }
    return c;
fail_c:
    json_decref(c);
    return NULL;
fail:
    json_decref(content);
    return NULL;
}

static int add_choice(json_t *root, json_t *choice)
{
    if (!choice)
        return -1;
    return json_object_set_new(root, "choices", json_pack("[o]", choice));
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
    json_t *root = envelope(id, false);
    char *out = NULL;
    if (!root) {
        json_decref(logprobs);
        goto out;
    }
    if (add_choice(root, choice_json(id->kind, false, true, text, len, finish_reason, logprobs)) ||
        json_object_set_new(root, "usage", usage_json(u)))
        goto out;
    out = json_dumps(root, JSON_COMPACT);
out:
    json_decref(root);
    return out;
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

int dray_srv_sse_chunk(struct dray_srv_buf *out, const struct dray_srv_ident *id, bool role,
                       const char *text, size_t len, const char *finish_reason, bool with_usage_null)
{
    return dray_srv_sse_chunk_lp(out, id, role, text, len, finish_reason, with_usage_null, NULL);
}

int dray_srv_sse_chunk_lp(struct dray_srv_buf *out, const struct dray_srv_ident *id, bool role,
                          const char *text, size_t len, const char *finish_reason,
                          bool with_usage_null, json_t *logprobs)
{
    json_t *root = envelope(id, true);
    if (!root) {
        json_decref(logprobs);
        return DRAY_ENOMEM;
    }
    /* the role chunk carries "content": "" like OpenAI's; the finishing chunk an empty delta */
    const char *content = role ? "" : (len || !finish_reason ? text : NULL);
    if (!content && id->kind == DRAY_SRV_COMPLETION)
        content = "";
    if (add_choice(root, choice_json(id->kind, true, role, content, len, finish_reason, logprobs)) ||
        (with_usage_null && json_object_set_new(root, "usage", json_null()))) {
        json_decref(root);
        return DRAY_EINVAL;
    }
    return sse_event(out, root);
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
