/* Chat templates rendered as segments (see chat.h; facts:
 * docs/reference/gemma3-gguf.md §6.5, docs/reference/smollm2-gguf.md). */
#include "chat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "gguf.h"
#include "utf8.h"

/* ------------------------------------------------------------------ segments */

static void seg(struct dray_chat_segs *o, const char *s, size_t n, bool marker, bool soft)
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
    o->v[o->n++] = (struct dray_chat_seg){s, n, marker, soft};
}

static void marker(struct dray_chat_segs *o, const char *s)
{
    if (s)
        seg(o, s, strlen(s), true, false);
}

static void text(struct dray_chat_segs *o, const char *s)
{
    if (s)
        seg(o, s, strlen(s), false, false);
}

static void content(struct dray_chat_segs *o, const char *s, bool trim)
{
    size_t start = 0, n = strlen(s);
    if (trim)
        n = dray_utf8_trim(s, n, &start);
    seg(o, s + start, n, false, false);
}

void dray_chat_segs_free(struct dray_chat_segs *s)
{
    free(s->v);
    *s = (struct dray_chat_segs){0};
}

/* ------------------------------------------------------------------ styles */

/* One piece of template text: a control token (marker), a control token that
 * some vocabularies of the family lack (soft: Mistral v1's [INST], OLMo 2's
 * <|user|>), or plain text. */
enum piece_kind { P_END, P_TEXT, P_MARK, P_SOFT };
struct piece {
    enum piece_kind kind;
    const char *s;
};
#define PIECES 5 /* at most 4 pieces, then P_END */

/* Where a system message goes. */
enum sys_place {
    SYS_TURN,       /* a turn of its own, before the others */
    SYS_FOLD_FIRST, /* "{system}\n\n" opens the first user message */
    SYS_FOLD_LAST,  /* "{system}\n\n" opens the user message that ends the conversation */
};

/* A template family's turn format. A turn is head + content + tail; an
 * assistant's tail is always `end` followed by `after_end`. */
struct style {
    const char *name;
    struct piece bos;                     /* at the very start (P_END: none) */
    struct piece user[PIECES];            /* head of a user turn */
    struct piece model[PIECES];           /* head of an assistant turn */
    struct piece system[PIECES];          /* head of a system turn (SYS_TURN) */
    struct piece user_tail[PIECES];       /* after a user or system message */
    struct piece gen[PIECES];             /* the generation prompt */
    const char *end;                      /* marker closing an assistant turn */
    const char *after_end;                /* text after it, or NULL */
    bool after_end_if_more;               /* ... only where another message follows */
    bool trim_user, trim_model, trim_sys; /* Jinja |trim on those contents */
    enum sys_place sys;
    const char *no_gen_tail; /* marker ending a render without generation prompt */
    bool skip_empty_system;  /* an empty system message writes no turn (Phi-3.5) */
};

#define M(s) {P_MARK, s}
#define T(s) {P_TEXT, s}
#define S(s) {P_SOFT, s}

static const struct style styles[] = {
    [DRAY_CHAT_GEMMA] = {.name = "gemma", .bos = M("<bos>"),
                         .user = {M("<start_of_turn>"), T("user\n")},
                         .model = {M("<start_of_turn>"), T("model\n")},
                         .user_tail = {M("<end_of_turn>"), T("\n")},
                         .gen = {M("<start_of_turn>"), T("model\n")},
                         .end = "<end_of_turn>", .after_end = "\n",
                         .trim_user = true, .trim_model = true, .sys = SYS_FOLD_FIRST},
    [DRAY_CHAT_CHATML] = {.name = "chatml",
                          .user = {M("<|im_start|>"), T("user\n")},
                          .model = {M("<|im_start|>"), T("assistant\n")},
                          .system = {M("<|im_start|>"), T("system\n")},
                          .user_tail = {M("<|im_end|>"), T("\n")},
                          .gen = {M("<|im_start|>"), T("assistant\n")},
                          .end = "<|im_end|>", .after_end = "\n"},
    [DRAY_CHAT_LLAMA3] = {.name = "llama3", .bos = M("<|begin_of_text|>"),
                          .user = {M("<|start_header_id|>"), T("user"), M("<|end_header_id|>"),
                                   T("\n\n")},
                          .model = {M("<|start_header_id|>"), T("assistant"), M("<|end_header_id|>"),
                                   T("\n\n")},
                          .system = {M("<|start_header_id|>"), T("system"), M("<|end_header_id|>"),
                                   T("\n\n")},
                          .user_tail = {M("<|eot_id|>")},
                          .gen = {M("<|start_header_id|>"), T("assistant"), M("<|end_header_id|>"),
                                   T("\n\n")},
                          .end = "<|eot_id|>",
                          .trim_user = true, .trim_model = true, .trim_sys = true},
    [DRAY_CHAT_MISTRAL] = {.name = "mistral", .bos = M("<s>"),
                           .user = {S("[INST]"), T(" ")},
                           .model = {T(" ")},
                           .user_tail = {S("[/INST]")},
                           .end = "</s>", .trim_model = true, .sys = SYS_FOLD_LAST},
    [DRAY_CHAT_MISTRAL_V1] = {.name = "mistral-v1", .bos = M("<s>"),
                              .user = {T(" "), S("[INST]"), T(" ")},
                              .model = {T(" ")},
                              .user_tail = {T(" "), S("[/INST]")},
                              .end = "</s>", .sys = SYS_FOLD_FIRST},
    [DRAY_CHAT_PHI3] = {.name = "phi3",
                        .user = {M("<|user|>"), T("\n")},
                        .model = {M("<|assistant|>"), T("\n")},
                        .system = {M("<|system|>"), T("\n")},
                        .user_tail = {M("<|end|>"), T("\n")},
                        .gen = {M("<|assistant|>"), T("\n")},
                        .end = "<|end|>", .after_end = "\n", .no_gen_tail = "<|endoftext|>",
                        .skip_empty_system = true},
    [DRAY_CHAT_GRANITE] = {.name = "granite",
                           .user = {M("<|start_of_role|>"), T("user"), M("<|end_of_role|>")},
                           .model = {M("<|start_of_role|>"), T("assistant"), M("<|end_of_role|>")},
                           .system = {M("<|start_of_role|>"), T("system"), M("<|end_of_role|>")},
                           .user_tail = {M("<|end_of_text|>"), T("\n")},
                           .gen = {M("<|start_of_role|>"), T("assistant"), M("<|end_of_role|>")},
                           .end = "<|end_of_text|>", .after_end = "\n"},
    [DRAY_CHAT_OLMO2] = {.name = "olmo2", .bos = M("<|endoftext|>"),
                         .user = {S("<|user|>"), T("\n")},
                         .model = {S("<|assistant|>"), T("\n")},
                         .system = {S("<|system|>"), T("\n")},
                         .user_tail = {T("\n")},
                         .gen = {S("<|assistant|>"), T("\n")},
                         .end = "<|endoftext|>", .after_end = "\n", .after_end_if_more = true},
};

#undef M
#undef T
#undef S

static const struct style *style_of(const struct dray_chat_template *t)
{
    return &styles[t && t->style != DRAY_CHAT_NONE ? t->style : DRAY_CHAT_GEMMA];
}

const char *dray_chat_turn_end(const struct dray_chat_template *t)
{
    return t && t->style != DRAY_CHAT_NONE ? style_of(t)->end : NULL;
}

static void piece(struct dray_chat_segs *o, struct piece p)
{
    if (p.kind != P_END)
        seg(o, p.s, strlen(p.s), p.kind != P_TEXT, p.kind == P_SOFT);
}

static void pieces(struct dray_chat_segs *o, const struct piece *p)
{
    for (int i = 0; i < PIECES && p[i].kind != P_END; i++)
        piece(o, p[i]);
}

static bool is_role(const struct dray_chat_msg *m, const char *role)
{
    return m->role && !strcmp(m->role, role);
}

static bool is_model(const struct dray_chat_msg *m)
{
    return is_role(m, "assistant") || is_role(m, "model");
}

/* A system prompt that opens user message `at` of a turns() list (folding
 * styles), or none (system NULL). */
struct fold {
    const char *system;
    size_t at;
};

static int check_turn(const struct dray_chat_msg *m, size_t i, size_t base, char *err, size_t errlen)
{
    bool want_user = i % 2 == 0;
    if (!m->role || !m->content)
        return dray_fail(err, errlen, DRAY_EINVAL, "chat: message %zu has no %s", base + i,
                         m->role ? "content" : "role");
    if (want_user ? !is_role(m, "user") : !is_model(m))
        return dray_fail(err, errlen, DRAY_EINVAL,
                         "chat: message %zu has role \"%s\" where \"%s\" is expected (after an "
                         "optional first system message, roles alternate user/assistant)",
                         base + i, m->role, want_user ? "user" : "assistant");
    return 0;
}

/* The turns of msgs[0..n), which must alternate starting with user; `base` is
 * the index of msgs[0] in the caller's list (for error messages). */
static int turns(const struct style *st, struct dray_chat_segs *o, const struct dray_chat_msg *msgs,
                 size_t n, size_t base, struct fold fold, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        int rc = check_turn(&msgs[i], i, base, err, errlen);
        if (rc)
            return rc;
        if (i % 2 == 0) {
            pieces(o, st->user);
            if (fold.system && i == fold.at) {
                content(o, fold.system, false);
                text(o, "\n\n");
            }
            content(o, msgs[i].content, st->trim_user);
            pieces(o, st->user_tail);
        } else {
            pieces(o, st->model);
            content(o, msgs[i].content, st->trim_model);
            marker(o, st->end);
            if (!st->after_end_if_more || i + 1 < n)
                text(o, st->after_end);
        }
    }
    return 0;
}

/* The system turn of SYS_TURN styles; prefix (Llama 3.1's date lines) comes
 * first and makes the turn unconditional. */
static void system_turn(const struct style *st, struct dray_chat_segs *o, const char *prefix,
                        const char *system)
{
    if (!system && !prefix)
        return;
    pieces(o, st->system);
    if (prefix)
        text(o, prefix);
    if (system)
        content(o, system, st->trim_sys);
    pieces(o, st->user_tail);
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

/* Where a folding style puts the system prompt: the first user message, or
 * (Mistral v0.3) the last message when it is a user message, else nowhere. */
static struct fold fold_of(const struct style *st, const char *system, size_t n_turns)
{
    if (!system || st->sys == SYS_TURN)
        return (struct fold){0};
    if (st->sys == SYS_FOLD_FIRST)
        return (struct fold){system, 0};
    return n_turns % 2 == 1 ? (struct fold){system, n_turns - 1} : (struct fold){0};
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
    if (system && !system[0] && st->skip_empty_system)
        system = NULL;
    piece(o, st->bos);
    if (st->sys == SYS_TURN)
        system_turn(st, o, t ? t->system_prefix : NULL, system);
    return turns(st, o, msgs + first, n - first, first, fold_of(st, system, n - first), err,
                 errlen);
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
        text(out, st->after_end);
        rc = turns(st, out, msgs, n, 0, (struct fold){0}, err, errlen);
    } else {
        rc = render_full(t, st, msgs, n, out, err, errlen);
    }
    if (!rc && add_generation_prompt)
        pieces(out, st->gen);
    else if (!rc)
        marker(out, st->no_gen_tail);
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

/* Names accepted by dray_chat_template_named besides the styles' own. */
static const struct {
    const char *alias;
    enum dray_chat_style style;
} aliases[] = {
    {"gemma3", DRAY_CHAT_GEMMA},        {"gemma2", DRAY_CHAT_GEMMA},
    {"qwen2", DRAY_CHAT_CHATML},        {"qwen3", DRAY_CHAT_CHATML},
    {"llama3.0", DRAY_CHAT_LLAMA3},     {"mistral-v3", DRAY_CHAT_MISTRAL},
    {"phi3.5", DRAY_CHAT_PHI3},         {"granite3", DRAY_CHAT_GRANITE},
};

/* Llama 3.1+'s system turn opens with these lines (no tools); %s is the date. */
#define LLAMA31_PREFIX "Cutting Knowledge Date: December 2023\nToday Date: %s\n\n"
#define LLAMA31_DATE "26 Jul 2024" /* the 3.1 template's date_string default */

static void tmpl_set(struct dray_chat_template *t, enum dray_chat_style style)
{
    t->style = style;
    t->name = style == DRAY_CHAT_NONE ? NULL : styles[style].name;
}

/* malloc'd snprintf of one %s, or NULL. */
static char *format1(const char *fmt, const char *arg)
{
    size_t n = strlen(fmt) + strlen(arg) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, fmt, arg);
    return s;
}

int dray_chat_template_named(const char *name, struct dray_chat_template *t, char *err, size_t errlen)
{
    *t = (struct dray_chat_template){0};
    for (int i = 1; name && i < (int)(sizeof(styles) / sizeof(styles[0])); i++)
        if (!strcmp(name, styles[i].name))
            tmpl_set(t, (enum dray_chat_style)i);
    for (size_t i = 0; name && !t->name && i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (!strcmp(name, aliases[i].alias))
            tmpl_set(t, aliases[i].style);
    if (!t->name)
        return dray_fail(err, errlen, DRAY_ENOTSUP,
                         "chat template \"%s\" is not supported (supported: %s)", name ? name : "",
                         DRAY_CHAT_TEMPLATE_NAMES);
    /* "llama3" is the 3.1+ template; "llama3.0" the first one, without date lines */
    if (t->style == DRAY_CHAT_LLAMA3 && strcmp(name, "llama3.0")) {
        t->system_prefix = format1(LLAMA31_PREFIX, LLAMA31_DATE);
        if (!t->system_prefix)
            return dray_fail(err, errlen, DRAY_ENOMEM, "chat: out of memory");
    }
    return 0;
}

void dray_chat_template_free(struct dray_chat_template *t)
{
    free(t->default_system);
    free(t->system_prefix);
    t->default_system = NULL;
    t->system_prefix = NULL;
}

static const char *find(const struct dray_str *s, const char *needle)
{
    size_t m = strlen(needle);
    for (uint64_t i = 0; i + m <= s->len; i++)
        if (!memcmp(s->ptr + i, needle, m))
            return s->ptr + i;
    return NULL;
}

static bool has(const struct dray_str *s, const char *needle)
{
    return find(s, needle) != NULL;
}

/* The ChatML default system prompt at p (just after "<|im_start|>system"): the
 * rest of a string literal up to <|im_end|>. "\n" may be a real newline or the
 * escape \n inside the literal. Anything with an expression inside (a quote,
 * "{") is not a literal default: NULL. */
static char *chatml_literal_at(const char *p, const char *end)
{
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
    for (const char *r = p; r < q; r++)
        if (*r == '\'' || *r == '"' || *r == '{' || *r == '}')
            return NULL;
    char *out = malloc((size_t)(q - p) + 1), *w = out;
    if (!out)
        return NULL;
    for (const char *r = p; r < q; r++) {
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

/* The default system prompt of a ChatML Jinja template: the first string
 * literal '<|im_start|>system\n...<|im_end|>' it writes (SmolLM2, Qwen2,
 * Qwen2.5, whose tools branch comes first and writes an expression). */
static char *chatml_default_system(const struct dray_str *tmpl)
{
    static const char head[] = "<|im_start|>system";
    const char *end = tmpl->ptr + tmpl->len;
    struct dray_str rest = *tmpl;
    for (const char *p; (p = find(&rest, head)) != NULL;) {
        p += sizeof(head) - 1;
        char *lit = chatml_literal_at(p, end);
        if (lit)
            return lit;
        rest = (struct dray_str){p, (uint64_t)(end - p)};
    }
    return NULL;
}

/* Today's date as strftime_now(fmt) writes it (the C locale: English names). */
static void today(const char *fmt, char *buf, size_t len)
{
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(buf, len, fmt, &tm))
        snprintf(buf, len, "%s", LLAMA31_DATE);
}

/* Llama 3.1+: the date lines of the system turn, or NULL for Llama 3.0's
 * template (no "Cutting Knowledge Date"). The date is today's where the template
 * asks strftime_now for it (3.2, 3.3, as transformers renders), else the 3.1
 * template's fixed default. */
static int llama3_prefix(const struct dray_str *tmpl, struct dray_chat_template *t)
{
    char date[64] = LLAMA31_DATE;
    if (!has(tmpl, "Cutting Knowledge Date: December 2023"))
        return 0;
    if (has(tmpl, "strftime_now(\"%d %b %Y\")"))
        today("%d %b %Y", date, sizeof(date));
    t->system_prefix = format1(LLAMA31_PREFIX, date);
    return t->system_prefix ? 0 : DRAY_ENOMEM;
}

/* Granite 3.1+ without a system message writes a default one with today's date
 * (strftime_now('%B %d, %Y')); Granite 3.0's template has none. */
static int granite_default_system(const struct dray_str *tmpl, struct dray_chat_template *t)
{
    static const char fmt[] = "Knowledge Cutoff Date: April 2024.\nToday's Date: %s.\n"
                              "You are Granite, developed by IBM. You are a helpful AI assistant.";
    char date[64];
    if (!has(tmpl, "Knowledge Cutoff Date: April 2024.") ||
        !has(tmpl, "You are Granite, developed by IBM.") ||
        !has(tmpl, " You are a helpful AI assistant."))
        return 0;
    today("%B %d, %Y", date, sizeof(date));
    t->default_system = format1(fmt, date);
    return t->default_system ? 0 : DRAY_ENOMEM;
}

/* The family of a Jinja template, from text only its family writes; NONE when
 * it is none dray implements (a near miss is NONE too: a wrong format is
 * worse than an error naming the chat_template key). */
static enum dray_chat_style style_from_template(const struct dray_str *s)
{
    if (has(s, "<start_of_turn>"))
        return DRAY_CHAT_GEMMA;
    if (has(s, "<|im_start|>"))
        return DRAY_CHAT_CHATML;
    if (has(s, "<|start_header_id|>"))
        return DRAY_CHAT_LLAMA3;
    if (has(s, "<|start_of_role|>"))
        return DRAY_CHAT_GRANITE;
    if (has(s, "' [INST] ' + system_message"))
        return DRAY_CHAT_MISTRAL_V1;
    if (has(s, "\"[INST] \" + system_message"))
        return DRAY_CHAT_MISTRAL;
    if (has(s, "<|user|>") && has(s, "<|assistant|>") && has(s, "<|end|>"))
        return DRAY_CHAT_PHI3;
    if (has(s, "'<|user|>\\n' + message['content'] + '\\n'"))
        return DRAY_CHAT_OLMO2;
    return DRAY_CHAT_NONE;
}

/* What the model's own template adds to its family's format: a default system
 * prompt (ChatML, Granite), Llama 3.1's date lines. */
static int template_extras(const struct dray_str *s, struct dray_chat_template *t)
{
    if (t->style == DRAY_CHAT_CHATML) {
        t->default_system = chatml_default_system(s);
    } else if (t->style == DRAY_CHAT_LLAMA3) {
        free(t->system_prefix);
        t->system_prefix = NULL;
        return llama3_prefix(s, t);
    } else if (t->style == DRAY_CHAT_GRANITE) {
        return granite_default_system(s, t);
    }
    return 0;
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
    enum dray_chat_style found = has_tmpl ? style_from_template(&s) : DRAY_CHAT_NONE;
    *t = (struct dray_chat_template){0};
    if (configured && configured[0]) {
        int rc = dray_chat_template_named(configured, t, err, errlen);
        if (rc)
            return rc;
    } else if (found != DRAY_CHAT_NONE) {
        tmpl_set(t, found);
    } else if (!has_tmpl && dray_gguf_get_str(g, "general.architecture", &arch, NULL, 0) == 0 &&
               arch.len >= 5 && !memcmp(arch.ptr, "gemma", 5)) {
        tmpl_set(t, DRAY_CHAT_GEMMA);
    } else {
        describe_none(g, has_tmpl, t);
        return 0;
    }
    /* a configured name of the model's own family still takes its extras
     * ("llama3.0" asks for the template without date lines) */
    bool extras = has_tmpl && found == t->style && !(configured && !strcmp(configured, "llama3.0"));
    if (extras && template_extras(&s, t)) {
        dray_chat_template_free(t);
        return dray_fail(err, errlen, DRAY_ENOMEM, "chat: out of memory");
    }
    return 0;
}
