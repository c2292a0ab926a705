/* Gemma 3 chat format (see chat.h; facts: shared/reference/gemma3-gguf.md §6.5). */
#include "chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "utf8.h"

struct buf {
    char *s;
    size_t n, cap;
    int rc;
};

static void add(struct buf *b, const char *s, size_t n)
{
    if (b->rc)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->rc = DRAY_ENOMEM;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void adds(struct buf *b, const char *s)
{
    add(b, s, strlen(s));
}

static void add_trimmed(struct buf *b, const char *s)
{
    size_t start, n = dray_utf8_trim(s, strlen(s), &start);
    add(b, s + start, n);
}

static int check_template(const char *name, char *err, size_t errlen)
{
    if (!name || !strcmp(name, "gemma") || !strcmp(name, "gemma3"))
        return 0;
    return dray_fail(err, errlen, DRAY_ENOTSUP,
                     "chat template \"%s\" is not supported (supported: gemma)", name);
}

static bool is_role(const struct dray_chat_msg *m, const char *role)
{
    return m->role && !strcmp(m->role, role);
}

static bool is_model(const struct dray_chat_msg *m)
{
    return is_role(m, "assistant") || is_role(m, "model");
}

/* Turns of msgs[0..n), which must alternate starting with user; `base` is the
 * index of msgs[0] in the caller's list (for error messages). */
static int turns(struct buf *b, const struct dray_chat_msg *msgs, size_t n, size_t base,
                 const char *system, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        const struct dray_chat_msg *m = &msgs[i];
        bool want_user = i % 2 == 0;
        if (!m->role || !m->content)
            return dray_fail(err, errlen, DRAY_EINVAL, "chat: message %zu has no %s", base + i,
                             m->role ? "content" : "role");
        if (want_user ? !is_role(m, "user") : !is_model(m))
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "chat: message %zu has role \"%s\" where \"%s\" is expected (after an "
                             "optional first system message, roles alternate user/assistant)",
                             base + i, m->role, want_user ? "user" : "assistant");
        adds(b, want_user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == 0 && system) {
            adds(b, system);
            adds(b, "\n\n");
        }
        add_trimmed(b, m->content);
        adds(b, "<end_of_turn>\n");
    }
    return 0;
}

static int finish(struct buf *b, int rc, bool gen, char **out, char *err, size_t errlen)
{
    if (!rc && gen)
        adds(b, "<start_of_turn>model\n");
    if (!rc && b->rc)
        rc = dray_fail(err, errlen, b->rc, "chat: out of memory");
    if (rc) {
        free(b->s);
        return rc;
    }
    *out = b->s;
    return 0;
}

int dray_chat_render(const char *template_name, const struct dray_chat_msg *msgs, size_t n,
                     bool add_generation_prompt, char **out, char *err, size_t errlen)
{
    struct buf b = {0};
    const char *system = NULL;
    size_t first = 0;
    if (!out || (!msgs && n))
        return DRAY_EINVAL;
    *out = NULL;
    int rc = check_template(template_name, err, errlen);
    if (rc)
        return rc;
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "chat: no messages");
    if (is_role(&msgs[0], "system")) {
        if (!msgs[0].content)
            return dray_fail(err, errlen, DRAY_EINVAL, "chat: message 0 has no content");
        if (n == 1)
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "chat: a system message must be followed by a user message");
        system = msgs[0].content;
        first = 1;
    }
    adds(&b, "<bos>");
    rc = turns(&b, msgs + first, n - first, first, system, err, errlen);
    return finish(&b, rc, add_generation_prompt, out, err, errlen);
}

int dray_chat_render_turn(const char *template_name, const struct dray_chat_msg *msgs, size_t n,
                          bool eot_in_kv, bool add_generation_prompt, char **out, char *err,
                          size_t errlen)
{
    struct buf b = {0};
    if (!out || (!msgs && n))
        return DRAY_EINVAL;
    *out = NULL;
    int rc = check_template(template_name, err, errlen);
    if (rc)
        return rc;
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "chat: no new messages");
    adds(&b, eot_in_kv ? "\n" : "<end_of_turn>\n");
    rc = turns(&b, msgs, n, 0, NULL, err, errlen);
    return finish(&b, rc, add_generation_prompt, out, err, errlen);
}

const char *dray_chat_template_for(const struct dray_gguf *g)
{
    struct dray_str s;
    static const char marker[] = "<start_of_turn>";
    if (dray_gguf_get_str(g, "tokenizer.chat_template", &s, NULL, 0) == 0) {
        size_t m = sizeof(marker) - 1;
        for (uint64_t i = 0; i + m <= s.len; i++)
            if (!memcmp(s.ptr + i, marker, m))
                return "gemma";
        return NULL;
    }
    if (dray_gguf_get_str(g, "general.architecture", &s, NULL, 0) == 0 && s.len >= 5 &&
        !memcmp(s.ptr, "gemma", 5))
        return "gemma";
    return NULL;
}
