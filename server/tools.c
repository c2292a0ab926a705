/* Function calling: the fields, the prompt, the grammar and the calls in a
 * reply. See tools.h for the format. */
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "jfield.h"
#include "json_grammar.h"

#define CLOSE "</tool_call>"

/* ------------------------------------------------------------ the fields */

/* OpenAI's rule for function names, which also makes them safe in GBNF literals. */
static bool good_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return false;
    return true;
}

static int check_tool(json_t *t, size_t i, struct dray_srv_error *e)
{
    char param[96];
    snprintf(param, sizeof(param), "tools[%zu]", i);
    json_t *type = json_object_get(t, "type"), *f = json_object_get(t, "function");
    if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
        return dray_srv_bad(e, param, "%s must be {\"type\": \"function\", \"function\": {...}}", param);
    const char *key;
    json_t *v;
    json_object_foreach(t, key, v) {
        if (strcmp(key, "type") && strcmp(key, "function") && !json_is_null(v))
            return dray_srv_bad(e, param, "Unrecognized request argument supplied: %s.%.60s", param, key);
    }
    snprintf(param, sizeof(param), "tools[%zu].function", i);
    if (!json_is_object(f))
        return dray_srv_bad(e, param, "%s must be an object with a 'name'", param);
    json_object_foreach(f, key, v) {
        if (strcmp(key, "name") && strcmp(key, "description") && strcmp(key, "parameters") &&
            strcmp(key, "strict") && !json_is_null(v))
            return dray_srv_bad(e, param, "Unrecognized request argument supplied: %s.%.60s", param, key);
    }
    json_t *name = json_object_get(f, "name");
    snprintf(param, sizeof(param), "tools[%zu].function.name", i);
    if (!json_is_string(name) || !good_name(json_string_value(name)))
        return dray_srv_bad(e, param, "%s must be a string of 1 to 64 letters, digits, '_' or '-'", param);
    json_t *d = json_object_get(f, "description"), *p = json_object_get(f, "parameters");
    if (d && !json_is_null(d) && !json_is_string(d))
        return dray_srv_bad(e, param, "tools[%zu].function.description must be a string", i);
    if (p && !json_is_null(p) && !json_is_object(p))
        return dray_srv_bad(e, param, "tools[%zu].function.parameters must be a JSON Schema object", i);
    return 0;
}

static const char *tool_name(json_t *tools, size_t i)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"));
}

static int parse_choice(struct dray_srv_request *req, json_t *tools, struct dray_srv_error *e)
{
    json_t *c = dray_srv_field(req->root, "tool_choice");
    req->tool_choice = tools ? DRAY_SRV_TOOLS_AUTO : DRAY_SRV_TOOLS_OFF;
    if (!c)
        return 0;
    if (json_is_string(c)) {
        const char *s = json_string_value(c);
        if (!strcmp(s, "none"))
            req->tool_choice = DRAY_SRV_TOOLS_OFF;
        else if (!strcmp(s, "auto") || !strcmp(s, "required"))
            req->tool_choice = s[0] == 'a' ? DRAY_SRV_TOOLS_AUTO : DRAY_SRV_TOOLS_REQUIRED;
        else
            return dray_srv_bad(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", "
                                "\"required\" or {\"type\": \"function\", \"function\": {\"name\": "
                                "...}}, got \"%.40s\"", s);
    } else {
        json_t *f = json_object_get(c, "function"), *name = json_object_get(f, "name");
        if (!json_is_object(c) || !json_is_string(name))
            return dray_srv_bad(e, "tool_choice", "'tool_choice' must be a string or {\"type\": "
                                "\"function\", \"function\": {\"name\": ...}}");
        req->tool_choice = DRAY_SRV_TOOLS_NAMED;
        req->tool_named = json_string_value(name);
    }
    if (req->tool_choice != DRAY_SRV_TOOLS_OFF && !tools)
        return dray_srv_bad(e, "tool_choice", "'tool_choice' asks for a tool call, but 'tools' "
                            "lists no function");
    for (size_t i = 0; req->tool_named && i < json_array_size(tools); i++)
        if (!strcmp(tool_name(tools, i), req->tool_named))
            return 0;
    if (req->tool_named)
        return dray_srv_bad(e, "tool_choice", "'tool_choice' names the function \"%.64s\", which "
                            "'tools' does not list", req->tool_named);
    return 0;
}

/* The grammar of the calls tool_choice allows. */
static int calls_grammar(struct dray_srv_request *req, json_t *tools, struct dray_srv_error *e)
{
    struct dray_srv_buf g = {0};
    char param[96], prefix[32];
    bool parallel = req->parallel_tool_calls;
    int rc = dray_srv_buf_printf(&g, "root ::= %s\ncalls ::= call%s\ncall ::= ",
                                 req->tool_choice == DRAY_SRV_TOOLS_AUTO ? "calls | text" : "calls",
                                 parallel ? " (\"\\n\" call)*" : "");
    bool first = true;
    for (size_t i = 0; !rc && i < json_array_size(tools); i++) {
        const char *name = tool_name(tools, i);
        if (req->tool_named && strcmp(name, req->tool_named))
            continue;
        rc = dray_srv_buf_printf(&g, "%s\"<tool_call>\\n{\\\"name\\\": \\\"%s\\\", \\\"arguments\\\": \" "
                                 "args%zu \"}\\n</tool_call>\"", first ? "" : " | ", name, i);
        first = false;
    }
    rc = rc || dray_srv_buf_add(&g, "\n", 1);
    /* auto: a text reply may not start with '<' (then a reply that does is a call) */
    if (!rc && req->tool_choice == DRAY_SRV_TOOLS_AUTO)
        rc = dray_srv_buf_printf(&g, "text ::= ([^<] .*)?\n");
    if (rc) {
        dray_srv_buf_free(&g);
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *f = json_object_get(json_array_get(tools, i), "function");
        json_t *p = json_object_get(f, "parameters");
        if (req->tool_named && strcmp(tool_name(tools, i), req->tool_named))
            continue;
        snprintf(param, sizeof(param), "tools[%zu].function.parameters", i);
        snprintf(prefix, sizeof(prefix), "args%zu", i);
        json_t *any = NULL;
        if (!p || json_is_null(p)) /* no parameters: an empty object */
            p = any = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties",
                                "additionalProperties", 0);
        int r = p ? dray_srv_schema_rules(p, prefix, param, &g, e)
                  : dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        json_decref(any);
        if (r) {
            dray_srv_buf_free(&g);
            return -1;
        }
    }
    req->grammar = g.data; /* the buffer's memory is the request's now */
    return 0;
}

int dray_srv_parse_tools(struct dray_srv_request *req, struct dray_srv_error *e)
{
    json_t *tools = dray_srv_field(req->root, "tools");
    req->parallel_tool_calls = true;
    if (tools && !json_is_array(tools))
        return dray_srv_bad(e, "tools", "'tools' must be an array of {\"type\": \"function\", "
                            "\"function\": {...}}, got %s", dray_srv_kind_of(tools));
    if (tools && json_array_size(tools) > DRAY_SRV_MAX_TOOLS)
        return dray_srv_bad(e, "tools", "'tools' lists %zu functions, more than this server "
                            "accepts (%d)", json_array_size(tools), DRAY_SRV_MAX_TOOLS);
    if (tools && json_array_size(tools) == 0)
        tools = NULL;
    for (size_t i = 0; tools && i < json_array_size(tools); i++) {
        if (check_tool(json_array_get(tools, i), i, e))
            return -1;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(tool_name(tools, i), tool_name(tools, j)))
                return dray_srv_bad(e, "tools", "tools[%zu] and tools[%zu] are both named \"%s\"",
                                    j, i, tool_name(tools, i));
    }
    if (dray_srv_get_bool(req->root, "parallel_tool_calls", "parallel_tool_calls",
                          &req->parallel_tool_calls, e) ||
        parse_choice(req, tools, e))
        return -1;
    req->tools = tools;
    return req->tool_choice == DRAY_SRV_TOOLS_OFF ? 0 : calls_grammar(req, tools, e);
}

/* ------------------------------------------------------------ the prompt */

/* The system text that lists the functions. */
static int tools_text(json_t *tools, struct dray_srv_buf *b)
{
    int rc = dray_srv_buf_printf(b, "# Tools\n\nYou may call one or more functions to assist with "
                                 "the user query.\n\nYou are provided with function signatures "
                                 "within <tools></tools> XML tags:\n<tools>");
    for (size_t i = 0; !rc && i < json_array_size(tools); i++) {
        char *t = json_dumps(json_array_get(tools, i), JSON_COMPACT | JSON_PRESERVE_ORDER);
        rc = !t || dray_srv_buf_printf(b, "\n%s", t);
        free(t);
    }
    return rc || dray_srv_buf_printf(b, "\n</tools>\n\nFor each function call, return a json "
                                     "object with function name and arguments within "
                                     "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                                     "<function-name>, \"arguments\": <args-json-object>}\n"
                                     "</tool_call>");
}

/* An assistant message's tool_calls as the text the model would have written. */
static int calls_text(json_t *calls, size_t mi, struct dray_srv_buf *b, struct dray_srv_error *e)
{
    char param[96];
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu]", mi, i);
        json_t *f = json_object_get(c, "function");
        json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
        if (!json_is_string(name) || !json_is_string(args))
            return dray_srv_bad(e, param, "%s must be {\"id\", \"type\": \"function\", "
                                "\"function\": {\"name\": string, \"arguments\": string}}", param);
        json_error_t je;
        json_t *a = json_loads(json_string_value(args), JSON_DECODE_ANY, &je);
        char *at = a ? json_dumps(a, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY) : NULL;
        json_decref(a);
        if (!at)
            return dray_srv_bad(e, param, "%s.function.arguments is not JSON: %s", param, je.text);
        int rc = dray_srv_buf_printf(b, "%s<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n"
                                     "</tool_call>", b->len ? "\n" : "", json_string_value(name), at);
        free(at);
        if (rc)
            return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* Append a message (content taken) to the rewritten list, merging it into the
 * previous one when both are user turns. */
static int push(struct dray_srv_request *req, struct dray_chat_message *out, size_t *n,
                const char *role, char *content)
{
    if (!content)
        return -1;
    if (*n && !strcmp(role, "user") && !strcmp(out[*n - 1].role, "user")) {
        char *prev = req->owned[req->n_owned - 1];
        size_t a = strlen(prev), b = strlen(content);
        char *m = realloc(prev, a + b + 2);
        if (!m) {
            free(content);
            return -1;
        }
        m[a] = '\n';
        memcpy(m + a + 1, content, b + 1);
        free(content);
        req->owned[req->n_owned - 1] = m;
        out[*n - 1].content = m;
        return 0;
    }
    req->owned[req->n_owned++] = content;
    out[(*n)++] = (struct dray_chat_message){.role = role, .content = content};
    return 0;
}

static char *buf_string(struct dray_srv_buf *b)
{
    if (!b->data && dray_srv_buf_add(b, "", 0))
        return NULL;
    char *s = b->data ? b->data : strdup("");
    *b = (struct dray_srv_buf){0};
    return s;
}

static int render_one(struct dray_srv_request *req, size_t i, struct dray_chat_message *out, size_t *n,
                      struct dray_srv_error *e)
{
    const struct dray_chat_message *m = &req->msgs[i];
    struct dray_srv_buf b = {0};
    int rc = 0;
    if (!strcmp(m->role, "tool")) {
        rc = dray_srv_buf_printf(&b, "<tool_response>\n%s\n</tool_response>", m->content);
        return rc || push(req, out, n, "user", buf_string(&b))
                   ? dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
    }
    json_t *calls = req->msg_calls ? req->msg_calls[i] : NULL;
    bool sys = i == 0 && !strcmp(m->role, "system");
    if (m->content)
        rc = dray_srv_buf_printf(&b, "%s", m->content);
    if (!rc && calls && calls_text(calls, i, &b, e)) {
        dray_srv_buf_free(&b);
        return -1;
    }
    if (!rc && sys && req->tool_choice != DRAY_SRV_TOOLS_OFF)
        rc = (b.len && dray_srv_buf_add(&b, "\n\n", 2)) || tools_text(req->tools, &b);
    return rc || push(req, out, n, m->role, buf_string(&b))
               ? dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
}

int dray_srv_render_tools(struct dray_srv_request *req, struct dray_srv_error *e)
{
    bool any = req->tool_choice != DRAY_SRV_TOOLS_OFF;
    for (size_t i = 0; !any && i < req->n_msgs; i++)
        any = !strcmp(req->msgs[i].role, "tool") || (req->msg_calls && req->msg_calls[i]);
    if (!any)
        return 0;
    bool add_sys = req->tool_choice != DRAY_SRV_TOOLS_OFF && strcmp(req->msgs[0].role, "system");
    size_t cap = req->n_msgs + 1, n = 0;
    struct dray_chat_message *out = calloc(cap, sizeof(*out));
    req->owned = calloc(cap, sizeof(*req->owned));
    if (!out || !req->owned) {
        free(out);
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (add_sys) {
        struct dray_srv_buf b = {0};
        if (tools_text(req->tools, &b) || push(req, out, &n, "system", buf_string(&b))) {
            free(out);
            return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    for (size_t i = 0; i < req->n_msgs; i++)
        if (render_one(req, i, out, &n, e)) {
            free(out);
            return -1;
        }
    free(req->msgs);
    req->msgs = out;
    req->n_msgs = n;
    return 0;
}

/* ------------------------------------------------------------ the reply */

size_t dray_srv_tool_call_end(const char *text, size_t len, size_t from)
{
    size_t k = sizeof(CLOSE) - 1;
    for (size_t i = from; i + k <= len; i++)
        if (!memcmp(text + i, CLOSE, k))
            return i + k;
    return 0;
}

/* One call's text ("<tool_call>\n{...}\n</tool_call>") as an OpenAI tool call. */
static json_t *one_call(const char *s, size_t len, const char *salt, size_t i)
{
    size_t open = sizeof(DRAY_SRV_TOOL_CALL_OPEN) - 1, close = sizeof(CLOSE) - 1;
    if (len < open + close || memcmp(s, DRAY_SRV_TOOL_CALL_OPEN, open))
        return NULL;
    json_t *j = json_loadb(s + open, len - open - close, 0, NULL);
    json_t *name = json_object_get(j, "name"), *args = json_object_get(j, "arguments");
    char *at = args ? json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY) : NULL;
    char id[64];
    snprintf(id, sizeof(id), "call_%s_%zu", salt, i);
    json_t *call = json_is_string(name) && at
                       ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                                   "name", json_string_value(name), "arguments", at)
                       : NULL;
    free(at);
    json_decref(j);
    return call;
}

json_t *dray_srv_tool_calls_json(const char *text, size_t len, const char *salt)
{
    json_t *calls = json_array();
    size_t at = 0, end;
    while (calls && at < len && (end = dray_srv_tool_call_end(text, len, at))) {
        json_t *c = one_call(text + at, end - at, salt, json_array_size(calls));
        if (!c || json_array_append_new(calls, c)) {
            json_decref(calls);
            return NULL;
        }
        at = end;
        while (at < len && (text[at] == '\n' || text[at] == ' '))
            at++;
    }
    if (!calls || at < len || !json_array_size(calls)) { /* text, or a call cut short */
        json_decref(calls);
        return NULL;
    }
    return calls;
}
