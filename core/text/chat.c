/* Chat templates rendered as segments (see chat.h; facts:
 * docs/reference/gemma3-gguf.md §6.5, docs/reference/smollm2-gguf.md). */
#include "chat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "utf8.h"

/* ------------------------------------------------------------------ segments */

static void seg(struct dray_chat_segs *o, const char *s, size_t n, bool marker)
{
    if (o->rc || n == 0)
        return;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 32;
        struct dray_chat_seg *v = realloc(o->v, cap * sizeof(*v));
        if (!v) {
            o->rc = DRAY_ENOMEM;
            return;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = (struct dray_chat_seg){s, n, marker};
}

static void marker(struct dray_chat_segs *o, const char *s)
{
    seg(o, s, strlen(s), true);
}

static void text(struct dray_chat_segs *o, const char *s)
{
    seg(o, s, strlen(s), false);
}

static void content(struct dray_chat_segs *o, const char *s, bool trim)
{
    size_t start = 0, n = strlen(s);
    if (trim)
        n = dray_utf8_trim(s, n, &start);
    seg(o, s + start, n, false);
}

void dray_chat_segs_free(struct dray_chat_segs *s)
{
    free(s->v);
    *s = (struct dray_chat_segs){0};
}

/* ------------------------------------------------------------------ styles */

/* What differs between the two turn formats. */
struct style {
    const char *bos;          /* marker at the very start, or NULL */
    const char *start, *end;  /* turn markers */
    const char *user, *model; /* role text after the start marker, with its "\n" */
    bool trim;                /* Jinja |trim on contents */
    bool fold_system;         /* system prompt goes into the first user turn */
};

static const struct style gemma = {"<bos>", "<start_of_turn>", "<end_of_turn>", "user\n", "model\n",
                                   true, true};
static const struct style chatml = {NULL, "<|im_start|>", "<|im_end|>", "user\n", "assistant\n",
                                    false, false};

static const struct style *style_of(const struct dray_chat_template *t)
{
    return t && t->style == DRAY_CHAT_CHATML ? &chatml : &gemma;
}

const char *dray_chat_turn_end(const struct dray_chat_template *t)
{
    return t && t->style != DRAY_CHAT_NONE ? style_of(t)->end : NULL;
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
static int turns(const struct style *st, struct dray_chat_segs *o, const struct dray_chat_msg *msgs,
                 size_t n, size_t base, const char *fold, char *err, size_t errlen)
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
        marker(o, st->start);
        text(o, want_user ? st->user : st->model);
        if (i == 0 && fold) {
            content(o, fold, false);
            text(o, "\n\n");
        }
        content(o, m->content, st->trim);
        marker(o, st->end);
        text(o, "\n");
    }
    return 0;
}

static void system_turn(const struct style *st, struct dray_chat_segs *o, const char *system)
{
    marker(o, st->start);
    text(o, "system\n");
    content(o, system, st->trim);
    marker(o, st->end);
    text(o, "\n");
}

static int check_args(const struct dray_chat_template *t, const struct dray_chat_msg *msgs, size_t n,
                      struct dray_chat_segs *out, char *err, size_t errlen)
{
    if (!out || (!msgs && n))
        return dray_fail(err, errlen, DRAY_EINVAL, "chat: no output or no messages given");
    *out = (struct dray_chat_segs){0};
    if (t && t->style == DRAY_CHAT_NONE)
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s", t->why);
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "chat: no messages");
    return 0;
}

/* Whole conversation: [bos] [system] turns. */
static int render_full(const struct dray_chat_template *t, const struct style *st,
                       const struct dray_chat_msg *msgs, size_t n, struct dray_chat_segs *o,
                       char *err, size_t errlen)
{
    const char *system = NULL;
    size_t first = 0;
    if (is_role(&msgs[0], "system")) {
        if (!msgs[0].content)
            return dray_fail(err, errlen, DRAY_EINVAL, "chat: message 0 has no content");
        if (n == 1)
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "chat: a system message must be followed by a user message");
        system = msgs[0].content;
        first = 1;
    } else if (t && t->default_system) {
        system = t->default_system;
    }
    if (st->bos)
        marker(o, st->bos);
    if (system && !st->fold_system)
        system_turn(st, o, system);
    return turns(st, o, msgs + first, n - first, first, st->fold_system ? system : NULL, err, errlen);
}

int dray_chat_render_segs(const struct dray_chat_template *t, const struct dray_chat_msg *msgs,
                          size_t n, bool continuation, bool eot_in_kv, bool add_generation_prompt,
                          struct dray_chat_segs *out, char *err, size_t errlen)
{
    const struct style *st = style_of(t);
    int rc = check_args(t, msgs, n, out, err, errlen);
    if (rc)
        return rc;
    if (continuation) {
        if (!eot_in_kv)
            marker(out, st->end);
        text(out, "\n");
        rc = turns(st, out, msgs, n, 0, NULL, err, errlen);
    } else {
        rc = render_full(t, st, msgs, n, out, err, errlen);
    }
    if (!rc && add_generation_prompt) {
        marker(out, st->start);
        text(out, st->model);
    }
    if (!rc && out->rc)
        rc = dray_fail(err, errlen, out->rc, "chat: out of memory");
    if (rc)
        dray_chat_segs_free(out);
    return rc;
}

/* ------------------------------------------------------------------ as text */

static int join(struct dray_chat_segs *s, char **out, char *err, size_t errlen)
{
    size_t len = 0;
    for (size_t i = 0; i < s->n; i++)
        len += s->v[i].n;
    char *p = malloc(len + 1);
    if (!p) {
        dray_chat_segs_free(s);
        return dray_fail(err, errlen, DRAY_ENOMEM, "chat: out of memory");
    }
    *out = p;
    for (size_t i = 0; i < s->n; i++) {
        memcpy(p, s->v[i].s, s->v[i].n);
        p += s->v[i].n;
    }
    *p = 0;
    dray_chat_segs_free(s);
    return 0;
}

int dray_chat_render(const struct dray_chat_template *t, const struct dray_chat_msg *msgs, size_t n,
                     bool add_generation_prompt, char **out, char *err, size_t errlen)
{
    struct dray_chat_segs s;
    if (!out)
        return DRAY_EINVAL;
    *out = NULL;
    int rc = dray_chat_render_segs(t, msgs, n, false, false, add_generation_prompt, &s, err, errlen);
    return rc ? rc : join(&s, out, err, errlen);
}

int dray_chat_render_turn(const struct dray_chat_template *t, const struct dray_chat_msg *msgs,
                          size_t n, bool eot_in_kv, bool add_generation_prompt, char **out,
                          char *err, size_t errlen)
{
    struct dray_chat_segs s;
    if (!out)
        return DRAY_EINVAL;
    *out = NULL;
    int rc = dray_chat_render_segs(t, msgs, n, true, eot_in_kv, add_generation_prompt, &s, err, errlen);
    return rc ? rc : join(&s, out, err, errlen);
}

/* ------------------------------------------------------------------ choosing */

static void tmpl_set(struct dray_chat_template *t, enum dray_chat_style style)
{
    t->style = style;
    t->name = style == DRAY_CHAT_GEMMA ? "gemma" : style == DRAY_CHAT_CHATML ? "chatml" : NULL;
}

int dray_chat_template_named(const char *name, struct dray_chat_template *t, char *err, size_t errlen)
{
    *t = (struct dray_chat_template){0};
    if (name && (!strcmp(name, "gemma") || !strcmp(name, "gemma3")))
        tmpl_set(t, DRAY_CHAT_GEMMA);
    else if (name && !strcmp(name, "chatml"))
        tmpl_set(t, DRAY_CHAT_CHATML);
    else
        return dray_fail(err, errlen, DRAY_ENOTSUP,
                         "chat template \"%s\" is not supported (supported: %s)", name ? name : "",
                         DRAY_CHAT_TEMPLATE_NAMES);
    return 0;
}

void dray_chat_template_free(struct dray_chat_template *t)
{
    free(t->default_system);
    t->default_system = NULL;
}

static const char *find(const struct dray_str *s, const char *needle)
{
    size_t m = strlen(needle);
    for (uint64_t i = 0; i + m <= s->len; i++)
        if (!memcmp(s->ptr + i, needle, m))
            return s->ptr + i;
    return NULL;
}

/* The default system prompt of a ChatML Jinja template: the string literal
 * '<|im_start|>system\n...<|im_end|>' it writes when messages[0] is not a system
 * message (SmolLM2, Qwen2). "\n" may be a real newline or the escape \n inside
 * the literal. Anything with an expression inside (a quote, "{") is not a literal
 * default: NULL. */
static char *chatml_default_system(const struct dray_str *tmpl)
{
    static const char head[] = "<|im_start|>system";
    const char *p = find(tmpl, head), *end = tmpl->ptr + tmpl->len;
    if (!p)
        return NULL;
    p += sizeof(head) - 1;
    if (p < end && *p == '\n')
        p++;
    else if (p + 1 < end && p[0] == '\\' && p[1] == 'n')
        p += 2;
    else
        return NULL;
    struct dray_str rest = {p, (uint64_t)(end - p)};
    const char *q = find(&rest, "<|im_end|>");
    if (!q || q == p)
        return NULL;
    char *out = malloc((size_t)(q - p) + 1), *w = out;
    if (!out)
        return NULL;
    for (const char *r = p; r < q; r++) {
        if (*r == '\'' || *r == '"' || *r == '{' || *r == '}') {
            free(out);
            return NULL;
        }
        if (*r == '\\' && r + 1 < q) {
            r++;
            *w++ = *r == 'n' ? '\n' : *r;
            continue;
        }
        *w++ = *r;
    }
    *w = 0;
    return out;
}

static void describe_none(const struct dray_gguf *g, bool has_tmpl, struct dray_chat_template *t)
{
    struct dray_str arch = {"?", 1};
    dray_gguf_get_str(g, "general.architecture", &arch, NULL, 0);
    snprintf(t->why, sizeof(t->why),
             "chat: this model (architecture %.*s) %s; choose one with chat_template: in the config "
             "(supported: %s)",
             (int)(arch.len > 64 ? 64 : arch.len), arch.ptr,
             has_tmpl ? "has a tokenizer.chat_template that dray does not implement"
                      : "has no tokenizer.chat_template",
             DRAY_CHAT_TEMPLATE_NAMES);
}

int dray_chat_template_pick(const struct dray_gguf *g, const char *configured,
                            struct dray_chat_template *t, char *err, size_t errlen)
{
    struct dray_str s = {0}, arch = {0};
    bool has_tmpl = dray_gguf_get_str(g, "tokenizer.chat_template", &s, NULL, 0) == 0;
    *t = (struct dray_chat_template){0};
    if (configured && configured[0]) {
        int rc = dray_chat_template_named(configured, t, err, errlen);
        if (rc)
            return rc;
    } else if (has_tmpl && find(&s, "<start_of_turn>")) {
        tmpl_set(t, DRAY_CHAT_GEMMA);
    } else if (has_tmpl && find(&s, "<|im_start|>")) {
        tmpl_set(t, DRAY_CHAT_CHATML);
    } else if (!has_tmpl && dray_gguf_get_str(g, "general.architecture", &arch, NULL, 0) == 0 &&
               arch.len >= 5 && !memcmp(arch.ptr, "gemma", 5)) {
        tmpl_set(t, DRAY_CHAT_GEMMA);
    } else {
        describe_none(g, has_tmpl, t);
        return 0;
    }
    if (t->style == DRAY_CHAT_CHATML && has_tmpl)
        t->default_system = chatml_default_system(&s);
    return 0;
}
