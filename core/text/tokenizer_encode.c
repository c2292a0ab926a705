/* Tokenizing (tokenizer.h): the special-token partition, then SentencePiece
 * merges best score first over each raw fragment (byte-level BPE fragments go
 * to tokenizer_bpe.c). */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_bpe.h"
#include "utf8.h"

/* ---------------------------------------------------------------- output vector */

struct ids {
    int32_t *v;
    size_t n, cap;
};

static int ids_push(struct ids *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc(o->v, cap * sizeof(*v));
        if (!v)
            return DRAY_ENOMEM;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

static int push_id(void *o, int32_t id)
{
    return ids_push(o, id);
}

/* ---------------------------------------------------------------- special partition */

/* llama.cpp's order: candidates by rank (longest text first, ties lower id), each
 * candidate's occurrences left to right; an occurrence is taken when its whole span
 * is still raw text.
 *
 * Done without a list of all occurrences, which grows with the input times the
 * specials that overlap (docs/performance.md). Each raw position
 * waits in the bucket of its longest remaining match, buckets are visited in rank
 * order and positions in a bucket in ascending order, which is exactly the (rank,
 * position) order. A match blocked by a span taken to its right sends the position
 * on to its next shorter match: a later bucket, since shorter means a larger rank.
 * Memory: a 4-byte link and a 1-byte state per input byte, 2 words per candidate. */

#define NO_POS UINT32_MAX

enum { SP_RAW = 0, SP_START, SP_INSIDE };

struct part {
    uint8_t *state;  /* [n]: SP_RAW, SP_START (a taken token starts here), SP_INSIDE */
    uint32_t *link;  /* [n]: next position in the same bucket while waiting; at an
                      * SP_START position, once partitioned, the token id */
    uint32_t *head, *tail; /* [n_spec]: first and last waiting position, NO_POS if none */
    uint8_t *unsorted;     /* [n_spec]: a position joined behind a larger one */
};

static bool spec_allowed(const struct dray_tokenizer *t, int32_t id, bool parse_special)
{
    return parse_special || t->type[id] == DRAY_TOKEN_USER_DEFINED;
}

/* Longest allowed candidate matching s[p..] that is shorter than below bytes; -1 if none. */
static int32_t longest_match(const struct dray_tokenizer *t, const char *s, uint32_t n,
                             uint32_t p, uint32_t below, bool parse_special)
{
    uint64_t h = FNV_INIT;
    int32_t best = -1;
    for (uint32_t l = 1; l < below && l <= t->spec_max_len && p + l <= n; l++) {
        h = fnv_step(h, (uint8_t)s[p + l - 1]);
        const struct prefix *e = pre_slot(t, h, s + p, l);
        if (e->src < 0)
            break;
        if (e->full >= 0 && spec_allowed(t, e->full, parse_special))
            best = e->full;
    }
    return best;
}

static void bucket_add(struct part *pt, uint32_t r, uint32_t p)
{
    pt->link[p] = NO_POS;
    if (pt->tail[r] == NO_POS)
        pt->head[r] = p;
    else
        pt->link[pt->tail[r]] = p;
    if (pt->tail[r] != NO_POS && pt->tail[r] > p)
        pt->unsorted[r] = 1;
    pt->tail[r] = p;
}

/* Merge sort of a bucket's list by position (links in pt->link); returns the new head. */
static uint32_t sort_list(uint32_t *link, uint32_t h, uint32_t len)
{
    if (len < 2)
        return h;
    uint32_t mid = h, a, b, out = NO_POS, *at = &out;
    for (uint32_t i = 1; i < len / 2; i++)
        mid = link[mid];
    b = link[mid];
    link[mid] = NO_POS;
    a = sort_list(link, h, len / 2);
    b = sort_list(link, b, len - len / 2);
    while (a != NO_POS && b != NO_POS) {
        uint32_t *from = a < b ? &a : &b;
        *at = *from;
        at = &link[*from];
        *from = link[*from];
    }
    *at = a != NO_POS ? a : b;
    return out;
}

static void sort_bucket(struct part *pt, uint32_t r)
{
    uint32_t len = 0, p;
    for (p = pt->head[r]; p != NO_POS; p = pt->link[p])
        len++;
    pt->head[r] = sort_list(pt->link, pt->head[r], len);
    for (p = pt->head[r]; pt->link[p] != NO_POS; p = pt->link[p])
        ;
    pt->tail[r] = p;
    pt->unsorted[r] = 0;
}

/* Candidate id at position p: take its span if still raw, else wait for a shorter one. */
static void try_take(const struct dray_tokenizer *t, const char *s, uint32_t n, bool parse_special,
                     struct part *pt, uint32_t p, int32_t id)
{
    uint32_t len = t->off[id + 1] - t->off[id], i;
    for (i = 0; i < len && pt->state[p + i] == SP_RAW; i++)
        ;
    if (i == len) {
        pt->state[p] = SP_START;
        pt->link[p] = (uint32_t)id; /* p has left its bucket */
        memset(pt->state + p + 1, SP_INSIDE, len - 1);
        return;
    }
    int32_t next = longest_match(t, s, n, p, len, parse_special);
    if (next >= 0)
        bucket_add(pt, t->rank[next], p);
}

/* Fills pt->state and, at SP_START positions, pt->link with the token id. */
static int partition(const struct dray_tokenizer *t, const char *s, uint32_t n, bool parse_special,
                     struct part *pt)
{
    size_t nb = t->n_spec ? t->n_spec : 1;
    pt->head = malloc(nb * sizeof(*pt->head));
    pt->tail = malloc(nb * sizeof(*pt->tail));
    pt->unsorted = calloc(nb, 1);
    if (!pt->head || !pt->tail || !pt->unsorted)
        return DRAY_ENOMEM;
    memset(pt->head, 0xff, nb * sizeof(*pt->head)); /* NO_POS */
    memset(pt->tail, 0xff, nb * sizeof(*pt->tail));
    for (uint32_t p = 0; p < n && t->n_spec; p++) {
        int32_t id = longest_match(t, s, n, p, UINT32_MAX, parse_special);
        if (id >= 0)
            bucket_add(pt, t->rank[id], p);
    }
    for (uint32_t r = 0; r < t->n_spec; r++) {
        if (pt->unsorted[r])
            sort_bucket(pt, r);
        /* try_take may append to later buckets only, never to this one */
        for (uint32_t p = pt->head[r], nx; p != NO_POS; p = nx) {
            nx = pt->link[p];
            if (pt->state[p] == SP_RAW)
                try_take(t, s, n, parse_special, pt, p, t->spec[r]);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- SPM merge */

struct sym {
    int32_t prev, next;
    uint32_t start, len; /* bytes in the escaped buffer */
};

struct bigram {
    float score;
    int32_t left, right;
    uint32_t size;
};

struct spm {
    const struct dray_tokenizer *t;
    const char *buf; /* escaped fragment */
    struct sym *sym;
    struct bigram *heap;
    size_t n_heap, cap_heap;
};

/* Max-heap order: higher score first, then smaller left index. */
static bool bg_before(const struct bigram *a, const struct bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct spm *m, struct bigram b)
{
    size_t i = m->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bg_before(&b, &m->heap[parent]))
            break;
        m->heap[i] = m->heap[parent];
        i = parent;
    }
    m->heap[i] = b;
}

static struct bigram heap_pop(struct spm *m)
{
    struct bigram top = m->heap[0], last = m->heap[--m->n_heap];
    size_t i = 0, n = m->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bg_before(&m->heap[c + 1], &m->heap[c]))
            c++;
        if (!bg_before(&m->heap[c], &last))
            break;
        m->heap[i] = m->heap[c];
        i = c;
    }
    if (n)
        m->heap[i] = last;
    return top;
}

static void try_bigram(struct spm *m, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return;
    uint32_t size = m->sym[left].len + m->sym[right].len;
    int32_t id = dray_tokenizer_find(m->t, m->buf + m->sym[left].start, size);
    if (id < 0)
        return;
    /* capacity: n-1 initial + 2 per merge (< n merges) never exceeds 3n */
    heap_push(m, (struct bigram){m->t->score[id], left, right, size});
}

static int emit_symbol(const struct spm *m, const struct sym *s, struct ids *o)
{
    int32_t id = dray_tokenizer_find(m->t, m->buf + s->start, s->len);
    if (id >= 0)
        return ids_push(o, id);
    /* Only unmerged characters get here (every merge is a vocabulary token). */
    for (uint32_t i = 0; i < s->len; i++) {
        int32_t b = m->t->byte_tok[(uint8_t)m->buf[s->start + i]];
        if (b < 0)
            return DRAY_ENOTFOUND;
        int rc = ids_push(o, b);
        if (rc)
            return rc;
    }
    return 0;
}

/* Tokenize one escaped fragment buf[0..n). */
static int spm_fragment(const struct dray_tokenizer *t, const char *buf, uint32_t n, struct ids *o)
{
    struct spm m = {.t = t, .buf = buf};
    int rc = 0;
    if (n == 0)
        return 0;
    m.sym = malloc(sizeof(*m.sym) * n);
    m.heap = malloc(sizeof(*m.heap) * 3 * (size_t)n);
    if (!m.sym || !m.heap) {
        rc = DRAY_ENOMEM;
        goto out;
    }
    int32_t ns = 0;
    for (uint32_t p = 0; p < n; ns++) {
        uint32_t len = (uint32_t)dray_utf8_lead_len((uint8_t)buf[p]);
        if (len > n - p)
            len = n - p;
        m.sym[ns] = (struct sym){ns - 1, -1, p, len};
        if (ns > 0)
            m.sym[ns - 1].next = ns;
        p += len;
    }
    for (int32_t i = 1; i < ns; i++)
        try_bigram(&m, i - 1, i);
    while (m.n_heap) {
        struct bigram b = heap_pop(&m);
        struct sym *l = &m.sym[b.left], *r = &m.sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size)
            continue; /* stale: one side was merged elsewhere meanwhile */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            m.sym[r->next].prev = b.left;
        try_bigram(&m, l->prev, b.left);
        try_bigram(&m, b.left, l->next);
    }
    for (int32_t i = 0; i >= 0 && !rc; i = m.sym[i].next)
        rc = emit_symbol(&m, &m.sym[i], o);
out:
    free(m.sym);
    free(m.heap);
    return rc;
}

/* Escape raw text: optional leading space, then ' ' -> "▁" (E2 96 81). */
static uint32_t escape(const char *s, uint32_t n, bool space_prefix, char *buf)
{
    uint32_t k = 0;
    if (space_prefix) {
        memcpy(buf, "\xE2\x96\x81", 3);
        k = 3;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf + k, "\xE2\x96\x81", 3);
            k += 3;
        } else {
            buf[k++] = s[i];
        }
    }
    return k;
}

/* Bytes in the longest run of raw (unpartitioned) text. */
static uint32_t longest_raw(const struct part *pt, uint32_t n)
{
    uint32_t best = 0, run = 0;
    for (uint32_t p = 0; p < n; p++) {
        run = pt->state[p] == SP_RAW ? run + 1 : 0;
        best = run > best ? run : best;
    }
    return best;
}

static int tokenize_marked(const struct dray_tokenizer *t, const char *s, uint32_t n,
                           const struct part *pt, char *buf, struct ids *o)
{
    bool prev_special = true; /* the text start counts as "after a special token" */
    uint32_t p = 0;
    while (p < n) {
        if (pt->state[p] == SP_START) {
            int32_t id = (int32_t)pt->link[p];
            int rc = ids_push(o, id);
            if (rc)
                return rc;
            p += t->off[id + 1] - t->off[id];
            prev_special = true;
            continue;
        }
        uint32_t e = p;
        while (e < n && pt->state[e] == SP_RAW)
            e++;
        if (t->bpe) {
            int rc = dray_bpe_encode(t->bpe, s + p, e - p, push_id, o);
            if (rc)
                return rc;
            p = e;
            continue;
        }
        uint32_t k = escape(s + p, e - p, t->add_space_prefix && prev_special, buf);
        int rc = spm_fragment(t, buf, k, o);
        if (rc)
            return rc;
        prev_special = false;
        p = e;
    }
    return 0;
}

int dray_tokenize(const struct dray_tokenizer *t, const char *text, size_t len, bool add_bos,
                  bool parse_special, int32_t **ids, size_t *n_ids)
{
    struct ids o = {0};
    struct part pt = {0};
    char *buf = NULL;
    int rc = 0;
    if (!t || !ids || !n_ids || (!text && len))
        return DRAY_EINVAL;
    *ids = NULL;
    *n_ids = 0;
    if (len > MAX_TEXT_BYTES)
        return DRAY_ERANGE;
    uint32_t n = (uint32_t)len;
    /* 5 bytes per input byte: the partition's state and links */
    pt.state = calloc((size_t)n + 1, 1);
    pt.link = malloc(((size_t)n + 1) * sizeof(*pt.link));
    if (!pt.state || !pt.link) {
        rc = DRAY_ENOMEM;
        goto out;
    }
    if (add_bos && t->add_bos && t->bos >= 0)
        rc = ids_push(&o, t->bos);
    if (!rc)
        rc = partition(t, text, n, parse_special, &pt);
    /* the escape buffer holds the longest raw fragment ("▁" is 3 bytes, plus a prefix) */
    if (!rc && !(buf = malloc((size_t)longest_raw(&pt, n) * 3 + 4)))
        rc = DRAY_ENOMEM;
    if (!rc)
        rc = tokenize_marked(t, text, n, &pt, buf, &o);
    if (!rc && add_bos && t->add_eos && t->eos >= 0)
        rc = ids_push(&o, t->eos);
    if (!rc && !o.v) { /* a non-NULL result even when empty */
        rc = ids_push(&o, 0);
        o.n = 0;
    }
out:
    free(pt.state);
    free(pt.link);
    free(pt.head);
    free(pt.tail);
    free(pt.unsorted);
    free(buf);
    if (rc) {
        free(o.v);
        return rc;
    }
    *ids = o.v;
    *n_ids = o.n;
    return 0;
}
