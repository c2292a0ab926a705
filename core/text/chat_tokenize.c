/* Chat segments to token ids (see chat_tokenize.h). */
#include "chat_tokenize.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "dray/dray.h"
#include "tokenizer.h"

struct idv {
    int32_t *v;
    size_t n, cap;
};

static int push(struct idv *o, const int32_t *ids, size_t n)
{
    if (o->n + n > o->cap) {
        size_t cap = (o->n + n) * 2 + 16;
        int32_t *v = realloc(o->v, cap * sizeof(*v));
        if (!v)
            return DRAY_ENOMEM;
        o->v = v;
        o->cap = cap;
    }
    memcpy(o->v + o->n, ids, n * sizeof(*ids));
    o->n += n;
    return 0;
}

/* Tokenize segments [from, to), all plain text, as one string. */
static int text_run(const struct dray_tokenizer *tok, const struct dray_chat_segs *s, size_t from,
                    size_t to, struct idv *o, char *err, size_t errlen)
{
    size_t len = 0, at = 0;
    for (size_t i = from; i < to; i++)
        len += s->v[i].n;
    if (len == 0)
        return 0;
    char *buf = malloc(len);
    if (!buf)
        return dray_fail(err, errlen, DRAY_ENOMEM, "chat: out of memory");
    for (size_t i = from; i < to; i++) {
        memcpy(buf + at, s->v[i].s, s->v[i].n);
        at += s->v[i].n;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    /* parse_special = false: control-token texts in here are just text */
    int rc = dray_tokenize(tok, buf, len, false, false, &ids, &n);
    free(buf);
    if (!rc)
        rc = push(o, ids, n);
    free(ids);
    if (rc)
        return dray_fail(err, errlen, rc, "chat: tokenizing a message: %s", dray_strerror(rc));
    return 0;
}

static int marker_id(const struct dray_tokenizer *tok, const struct dray_chat_seg *m, struct idv *o,
                     char *err, size_t errlen)
{
    int32_t id = dray_tokenizer_find(tok, m->s, m->n);
    if (id < 0)
        return dray_fail(err, errlen, DRAY_ENOTFOUND,
                         "chat: the template's token \"%.*s\" is not in this model's vocabulary "
                         "(wrong chat_template for this model?)",
                         (int)(m->n > 64 ? 64 : m->n), m->s);
    if (push(o, &id, 1))
        return dray_fail(err, errlen, DRAY_ENOMEM, "chat: out of memory");
    return 0;
}

/* Plain text, or a soft marker whose token this vocabulary lacks (Mistral v1's
 * [INST]): tokenized with the text around it, as the model's template text is. */
static bool is_text(const struct dray_tokenizer *tok, const struct dray_chat_seg *g)
{
    return !g->marker || (g->soft && dray_tokenizer_find(tok, g->s, g->n) < 0);
}

int dray_chat_tokenize_segs(const struct dray_tokenizer *tok, const struct dray_chat_segs *s,
                            int32_t **ids, size_t *n_ids, char *err, size_t errlen)
{
    struct idv o = {0};
    size_t run = 0; /* first plain segment not yet tokenized */
    int rc = 0;
    for (size_t i = 0; i <= s->n && !rc; i++) {
        if (i < s->n && is_text(tok, &s->v[i]))
            continue;
        rc = text_run(tok, s, run, i, &o, err, errlen);
        if (!rc && i < s->n)
            rc = marker_id(tok, &s->v[i], &o, err, errlen);
        run = i + 1;
    }
    if (!rc && !o.v && push(&o, &(int32_t){0}, 1) == 0)
        o.n = 0; /* non-NULL even when empty */
    if (!rc && !o.v)
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "chat: out of memory");
    if (rc) {
        free(o.v);
        return rc;
    }
    *ids = o.v;
    *n_ids = o.n;
    return 0;
}

int dray_chat_tokenize(const struct dray_tokenizer *tok, const struct dray_chat_template *t,
                       const struct dray_chat_msg *msgs, size_t n, bool continuation,
                       bool eot_in_kv, bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                       char *err, size_t errlen)
{
    struct dray_chat_segs s;
    int rc = dray_chat_render_segs(t, msgs, n, continuation, eot_in_kv, add_generation_prompt, &s,
                                   err, errlen);
    if (rc)
        return rc;
    rc = dray_chat_tokenize_segs(tok, &s, ids, n_ids, err, errlen);
    dray_chat_segs_free(&s);
    return rc;
}

/* The segments of s before the first one that points into text (a message's
 * content), or s->n if none does. */
static size_t segs_before(const struct dray_chat_segs *s, const char *text, size_t len)
{
    uintptr_t lo = (uintptr_t)text, hi = lo + len; /* different objects: compare as integers */
    for (size_t i = 0; i < s->n; i++)
        if ((uintptr_t)s->v[i].s >= lo && (uintptr_t)s->v[i].s < hi)
            return i;
    return s->n;
}

int dray_chat_next_user_head(const struct dray_tokenizer *tok, const struct dray_chat_template *t,
                             int32_t **ids, size_t *n_ids, char *err, size_t errlen)
{
    /* messages that start differently: a letter, punctuation, a space, a digit */
    static const char *const probe[] = {"Hello", "?", " x", "1"};
    int32_t *head = NULL;
    size_t n_head = 0;
    int rc = 0;
    *ids = NULL;
    *n_ids = 0;
    for (size_t p = 0; p < sizeof(probe) / sizeof(probe[0]) && !rc; p++) {
        struct dray_chat_msg m = {"user", probe[p]};
        struct dray_chat_segs s;
        /* the marker closing the reply is in the KV already: what follows it */
        rc = dray_chat_render_segs(t, &m, 1, true, true, false, &s, err, errlen);
        if (rc)
            break;
        size_t before = segs_before(&s, probe[p], strlen(probe[p]));
        struct dray_chat_segs upto = s, with = s;
        upto.n = before;
        with.n = before < s.n ? before + 1 : s.n;
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        rc = dray_chat_tokenize_segs(tok, &upto, &a, &na, err, errlen);
        if (!rc)
            rc = dray_chat_tokenize_segs(tok, &with, &b, &nb, err, errlen);
        dray_chat_segs_free(&s);
        if (!rc) {
            size_t k = 0, lim = p ? n_head : na; /* the first probe sets the candidates */
            while (k < lim && k < na && k < nb && a[k] == b[k] && (!p || head[k] == a[k]))
                k++;
            if (!p) {
                head = a;
                a = NULL;
            }
            n_head = k;
        }
        free(a);
        free(b);
    }
    if (rc) {
        free(head);
        return rc;
    }
    *ids = head;
    *n_ids = n_head;
    return 0;
}
