/* The matcher: a set of pushdown stacks of grammar positions per code point,
 * each distinct set interned as a state of a DFA built on demand (see
 * grammar_internal.h). A transition pops the matching terminal, then expands
 * rule references until every stack has a terminal on top (or is empty: root
 * complete); the result is deduplicated and sorted, so equal sets are one state
 * and the set never holds two copies of a stack. The DFA lives in the matcher
 * (no locks; a clone copies it) and is rebuilt from the states in use when it
 * outgrows its budget. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "error.h"
#include "grammar_internal.h"


/* The same for uint32_t capacities. */
static int grow32(void **p, uint32_t *cap, size_t need, size_t sz)
{
    size_t c = *cap;
    int rc = dray_gram_grow(p, &c, need, sz);
    if (!rc)
        *cap = (uint32_t)c;
    return rc;
}

/* ------------------------------------------------------------ scratch stacks */
static void scratch_reset(struct gram_scratch *x)
{
    for (uint32_t k = 0; k < x->n_refs; k++)
        x->seen[x->refs[k].slot] = 0;
    x->n_w = 0;
    x->n_refs = x->n_work = x->n_out = 0;
}

static bool ref_eq(const struct gram_scratch *x, const struct gram_ref *a, const struct gram_ref *b)
{
    return a->hash == b->hash && a->len == b->len &&
           memcmp(x->w + a->off, x->w + b->off, a->len * sizeof(*x->w)) == 0;
}

/* Double the seen set and re-insert. */
static int seen_grow(struct gram_scratch *x)
{
    uint32_t cap = x->seen_cap ? x->seen_cap * 2 : 64;
    uint32_t *t = calloc(cap, sizeof(*t));
    if (!t)
        return DRAY_ENOMEM;
    for (uint32_t k = 0; k < x->seen_cap; k++) {
        if (!x->seen[k])
            continue;
        uint32_t j = (uint32_t)x->refs[x->seen[k] - 1].hash & (cap - 1);
        while (t[j])
            j = (j + 1) & (cap - 1);
        t[j] = x->seen[k];
        x->refs[x->seen[k] - 1].slot = j;
    }
    free(x->seen);
    x->seen = t;
    x->seen_cap = cap;
    return 0;
}

/* The stack just built at x->w[off..n_w): a new one goes on the work list, a
 * stack seen before in this transition is dropped. 0 or DRAY_ENOMEM. */
static int scratch_add(struct gram_scratch *x, size_t off)
{
    struct gram_ref r = {(uint32_t)off, (uint32_t)(x->n_w - off), 0, 0};
    r.hash = XXH3_64bits(x->w + off, r.len * sizeof(*x->w));
    if ((x->n_refs + 1) * 2 > x->seen_cap && seen_grow(x))
        return DRAY_ENOMEM;
    uint32_t j = (uint32_t)r.hash & (x->seen_cap - 1);
    for (; x->seen[j]; j = (j + 1) & (x->seen_cap - 1)) {
        if (ref_eq(x, &x->refs[x->seen[j] - 1], &r)) {
            x->n_w = off;
            return 0;
        }
    }
    if (grow32((void **)&x->refs, &x->cap_refs, x->n_refs + 1, sizeof(*x->refs)))
        return DRAY_ENOMEM;
    if (x->n_refs + 1 > x->cap_idx) {
        uint32_t c = x->cap_idx ? x->cap_idx * 2 : 64;
        uint32_t *w = realloc(x->work, c * sizeof(*w));
        if (!w)
            return DRAY_ENOMEM;
        x->work = w;
        uint32_t *o = realloc(x->out, c * sizeof(*o));
        if (!o)
            return DRAY_ENOMEM;
        x->out = o;
        x->cap_idx = c;
    }
    r.slot = j;
    x->refs[x->n_refs] = r;
    x->seen[j] = x->n_refs + 1;
    x->work[x->n_work++] = x->n_refs++;
    return 0;
}

/* Build a stack of n positions, then up to two more (UINT32_MAX: none), and
 * add it. The n come from ext, or from x->w[w_off..] when ext is NULL. */
static int scratch_push(struct gram_scratch *x, const uint32_t *ext, size_t w_off, size_t n,
                        uint32_t a, uint32_t b)
{
    size_t off = x->n_w;
    if (dray_gram_grow((void **)&x->w, &x->cap_w, off + n + 2, sizeof(*x->w)))
        return DRAY_ENOMEM;
    if (n)
        memcpy(x->w + off, ext ? ext : x->w + w_off, n * sizeof(*x->w));
    x->n_w = off + n;
    if (a != UINT32_MAX)
        x->w[x->n_w++] = a;
    if (b != UINT32_MAX)
        x->w[x->n_w++] = b;
    return scratch_add(x, off);
}

/* Expand the work list until every stack has a terminal on top or is empty;
 * those go to x->out. Within the step's budget (grammar_budget.c): the stacks
 * of an ambiguous grammar can multiply with every character. */
static int closure(struct dray_grammar_matcher *m)
{
    const struct dray_grammar *g = m->g;
    struct gram_scratch *x = &m->x;
    while (x->n_work > 0) {
        int over = dray_gram_budget(m, x->n_w);
        if (over)
            return over;
        uint32_t k = x->work[--x->n_work];
        struct gram_ref r = x->refs[k];
        if (r.len == 0 || g->el[x->w[r.off + r.len - 1]].kind != GRAM_REF) {
            x->out[x->n_out++] = k;
            continue;
        }
        uint32_t pos = x->w[r.off + r.len - 1];
        const struct gram_rule *u = &g->rules[g->el[pos].val];
        uint32_t next = g->el[pos + 1].kind != GRAM_END ? pos + 1 : UINT32_MAX;
        for (uint32_t a = u->alt0; a < u->alt0 + u->n_alt; a++) {
            uint32_t first = g->el[g->alts[a]].kind != GRAM_END ? g->alts[a] : UINT32_MAX;
            int rc = scratch_push(x, NULL, r.off, r.len - 1, next, first);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Stack order for the canonical form: shorter first, then by positions. */
static int ref_cmp(const struct gram_scratch *x, uint32_t a, uint32_t b)
{
    const struct gram_ref *p = &x->refs[a], *q = &x->refs[b];
    if (p->len != q->len)
        return p->len < q->len ? -1 : 1;
    for (uint32_t k = 0; k < p->len; k++)
        if (x->w[p->off + k] != x->w[q->off + k])
            return x->w[p->off + k] < x->w[q->off + k] ? -1 : 1;
    return 0;
}

/* Sort v[0..n) (merge sort, tmp of n), within the step's budget: a million
 * stacks take a while. */
static int sort_out(struct dray_grammar_matcher *m, uint32_t *v, uint32_t *tmp, uint32_t n)
{
    const struct gram_scratch *x = &m->x;
    if (n < 2)
        return 0;
    uint32_t h = n / 2;
    int rc = dray_gram_budget(m, 0);
    if (rc || (rc = sort_out(m, v, tmp, h)) || (rc = sort_out(m, v + h, tmp, n - h)))
        return rc;
    uint32_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = ref_cmp(x, v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(*v));
    return 0;
}

/* ------------------------------------------------------------ DFA states */
static size_t dfa_bytes(const struct gram_dfa *d)
{
    return (size_t)d->n_st * (d->row_len * sizeof(*d->trans) + sizeof(*d->st)) +
           d->n_pool * sizeof(*d->pool) + d->tab_cap * sizeof(*d->tab);
}

bool dray_gram_over_budget(const struct dray_grammar_matcher *m)
{
    return dfa_bytes(&m->d) > m->d.budget;
}

static bool state_eq(const struct gram_dfa *d, const struct gram_state *s, const uint32_t *c,
                     uint32_t len, uint64_t hash)
{
    return s->hash == hash && s->len == len &&
           memcmp(d->pool + s->off, c, len * sizeof(*c)) == 0;
}

/* Double the intern table and re-insert. */
static int tab_grow(struct gram_dfa *d)
{
    uint32_t cap = d->tab_cap ? d->tab_cap * 2 : 256;
    uint32_t *t = calloc(cap, sizeof(*t));
    if (!t)
        return DRAY_ENOMEM;
    for (uint32_t k = 0; k < d->n_st; k++) {
        uint32_t j = (uint32_t)d->st[k].hash & (cap - 1);
        while (t[j])
            j = (j + 1) & (cap - 1);
        t[j] = k + 1;
    }
    free(d->tab);
    d->tab = t;
    d->tab_cap = cap;
    return 0;
}

/* The distinct terminals atop state s's stacks, appended to the pool: linear
 * in the stacks (a million of them may share a thousand tops), marking each
 * top seen in d->mark and clearing the marks after. */
static int state_tops(const struct dray_grammar *g, struct gram_dfa *d, struct gram_state *s)
{
    (void)g;
    s->tops = (uint32_t)d->n_pool;
    s->n_tops = 0;
    int rc = 0;
    for (uint32_t k = 0, o = s->off; k < s->n_stacks && !rc; k++, o += 1 + d->pool[o]) {
        uint32_t len = d->pool[o];
        if (len == 0) {
            s->accept = true;
            continue;
        }
        uint32_t top = d->pool[o + len];
        if (d->mark[top >> 6] >> (top & 63) & 1)
            continue;
        if (dray_gram_grow((void **)&d->pool, &d->cap_pool, d->n_pool + 1, sizeof(*d->pool))) {
            rc = DRAY_ENOMEM;
            break;
        }
        d->mark[top >> 6] |= 1ull << (top & 63);
        d->pool[d->n_pool++] = top;
        s->n_tops++;
    }
    for (uint32_t t = 0; t < s->n_tops; t++)
        d->mark[d->pool[s->tops + t] >> 6] = 0;
    return rc;
}

/* The id of the state whose canonical stacks are c[0..len) (n stacks), added
 * when new. */
static int intern(const struct dray_grammar *g, struct gram_dfa *d, const uint32_t *c,
                  uint32_t len, uint32_t n, uint32_t *id)
{
    uint64_t hash = XXH3_64bits(c, len * sizeof(*c));
    if ((d->n_st + 1) * 2 > d->tab_cap && tab_grow(d))
        return DRAY_ENOMEM;
    uint32_t j = (uint32_t)hash & (d->tab_cap - 1);
    for (; d->tab[j]; j = (j + 1) & (d->tab_cap - 1)) {
        if (state_eq(d, &d->st[d->tab[j] - 1], c, len, hash)) {
            *id = d->tab[j] - 1;
            return 0;
        }
    }
    if (grow32((void **)&d->st, &d->cap_st, d->n_st + 1, sizeof(*d->st)) ||
        dray_gram_grow((void **)&d->pool, &d->cap_pool, d->n_pool + len, sizeof(*d->pool)))
        return DRAY_ENOMEM;
    if (d->n_st + 1 > d->cap_rows) {
        uint32_t rows = d->cap_rows ? d->cap_rows * 2 : 16;
        uint32_t *t = realloc(d->trans, (size_t)rows * d->row_len * sizeof(*t));
        if (!t)
            return DRAY_ENOMEM;
        d->trans = t;
        d->cap_rows = rows;
    }
    memset(d->trans + (size_t)d->n_st * d->row_len, 0, d->row_len * sizeof(*d->trans));
    struct gram_state *s = &d->st[d->n_st];
    *s = (struct gram_state){.off = (uint32_t)d->n_pool, .len = len, .n_stacks = n, .hash = hash};
    memcpy(d->pool + d->n_pool, c, len * sizeof(*c));
    d->n_pool += len;
    if (state_tops(g, d, s))
        return DRAY_ENOMEM;
    d->tab[j] = d->n_st + 1;
    *id = d->n_st++;
    return 0;
}

/* Intern the stacks in x->out (sorted into canonical order first). */
static int intern_out(struct dray_grammar_matcher *m, uint32_t *id)
{
    struct gram_scratch *x = &m->x;
    uint32_t n = x->n_out;
    size_t len = n;
    for (uint32_t k = 0; k < n; k++)
        len += x->refs[x->out[k]].len;
    /* the tail of x->work is free: n_work is 0 after the closure */
    int rc = sort_out(m, x->out, x->work, n);
    if (rc)
        return rc;
    uint32_t *c = malloc((len ? len : 1) * sizeof(*c));
    if (!c)
        return DRAY_ENOMEM;
    size_t o = 0;
    for (uint32_t k = 0; k < n; k++) {
        const struct gram_ref *r = &x->refs[x->out[k]];
        c[o++] = r->len;
        memcpy(c + o, x->w + r->off, r->len * sizeof(*c));
        o += r->len;
    }
    rc = intern(m->g, &m->d, c, (uint32_t)len, n, id);
    free(c);
    return rc;
}

/* Whether terminal el[pos] matches code point cp. */
static bool term_match(const struct dray_grammar *g, uint32_t pos, uint32_t cp)
{
    return dray_gram_term_hits(g, pos, cp, cp);
}

/* The state after code point cp from state s: its id + GRAM_OK, or GRAM_REJECT
 * when no stack takes cp; DRAY_ENOMEM or DRAY_ERANGE (over the step's budget;
 * negative) on failure. */
static long advance(struct dray_grammar_matcher *m, uint32_t s, uint32_t cp)
{
    const struct dray_grammar *g = m->g;
    struct gram_scratch *x = &m->x;
    scratch_reset(x);
    const struct gram_state *st = &m->d.st[s];
    for (uint32_t k = 0, o = st->off; k < st->n_stacks; k++, o += 1 + m->d.pool[o]) {
        uint32_t len = m->d.pool[o];
        int over = dray_gram_budget(m, x->n_w);
        if (over)
            return over;
        if (len == 0 || !term_match(g, m->d.pool[o + len], cp))
            continue;
        uint32_t top = m->d.pool[o + len];
        uint32_t next = g->el[top + 1].kind != GRAM_END ? top + 1 : UINT32_MAX;
        if (scratch_push(x, m->d.pool + o + 1, 0, len - 1, next, UINT32_MAX))
            return DRAY_ENOMEM;
    }
    if (x->n_work == 0)
        return GRAM_REJECT;
    int rc = closure(m);
    if (rc)
        return rc;
    uint32_t id;
    if ((rc = intern_out(m, &id)))
        return rc;
    return (long)id + GRAM_OK;
}

/* The initial state: the closure of the stack [REF root]. */
static int initial_state(struct dray_grammar_matcher *m, uint32_t *id)
{
    scratch_reset(&m->x);
    if (scratch_push(&m->x, NULL, 0, 0, m->g->start, UINT32_MAX))
        return DRAY_ENOMEM;
    int rc = closure(m);
    return rc ? rc : intern_out(m, id);
}

/* ------------------------------------------------------------ the byte step */
/* Whether some terminal atop state s matches a code point in [lo, hi]. */
static bool state_hits(const struct dray_grammar_matcher *m, uint32_t s, uint32_t lo, uint32_t hi)
{
    const struct gram_state *st = &m->d.st[s];
    for (uint32_t t = 0; t < st->n_tops; t++)
        if (dray_gram_term_hits(m->g, m->d.pool[st->tops + t], lo, hi))
            return true;
    return false;
}

/* The code points a character in flight at *p can still become. */
static void pending_range(const struct gram_pos *p, uint32_t *lo, uint32_t *hi)
{
    unsigned sh = 6u * (p->rem - 1u);
    *lo = (p->acc << 6 | (p->lo & 0x3Fu)) << sh;
    *hi = ((p->acc << 6 | (p->hi & 0x3Fu)) << sh) | ((1u << sh) - 1);
}

/* A first byte from *p: ASCII moves, a lead byte starts a character. */
static int step_first(struct dray_grammar_matcher *m, struct gram_pos *p, uint8_t b)
{
    size_t at = (size_t)p->s * m->d.row_len + b;
    uint32_t v = m->d.trans[at];
    if (v == 0 && b < 0x80) {
        long r = advance(m, p->s, b);
        if (r < 0)
            return (int)r;
        m->d.trans[(size_t)p->s * m->d.row_len + b] = v = (uint32_t)r;
    } else if (v == 0) {
        struct gram_pos q = *p;
        bool ok = b >= 0xC2 && b <= 0xF4;
        uint32_t lo, hi;
        if (ok) {
            dray_gram_lead(&q, b);
            pending_range(&q, &lo, &hi);
            ok = state_hits(m, p->s, lo, hi);
        }
        m->d.trans[at] = v = ok ? GRAM_OK : GRAM_REJECT;
    }
    if (v == GRAM_REJECT)
        return 0;
    if (b < 0x80)
        p->s = v - GRAM_OK;
    else
        dray_gram_lead(p, b);
    return 1;
}

/* The entry of non-ASCII atom a in state s's row (cp one of its code points),
 * computed when unknown. */
static int atom_entry(struct dray_grammar_matcher *m, uint32_t s, uint32_t a, uint32_t cp,
                      uint32_t *x)
{
    *x = m->d.trans[(size_t)s * m->d.row_len + 128 + a];
    if (*x)
        return 0;
    long r = advance(m, s, cp);
    if (r < 0)
        return (int)r;
    m->d.trans[(size_t)s * m->d.row_len + 128 + a] = *x = (uint32_t)r;
    return 0;
}

/* A continuation byte of the character in flight at *p. */
static int step_cont(struct dray_grammar_matcher *m, struct gram_pos *p, uint8_t b)
{
    if (b < p->lo || b > p->hi)
        return 0;
    struct gram_pos q = {p->s, p->acc << 6 | (b & 0x3Fu), (uint8_t)(p->rem - 1), 0x80, 0xBF};
    uint32_t x;
    int rc;
    if (q.rem == 0) {
        if ((rc = atom_entry(m, q.s, dray_gram_atom(m->g, q.acc), q.acc, &x)))
            return rc;
        if (x == GRAM_REJECT)
            return 0;
        *p = (struct gram_pos){x - GRAM_OK, 0, 0, 0, 0};
        return 1;
    }
    uint32_t lo, hi, a = dray_gram_atom_span(m->g, q.acc, q.rem);
    pending_range(&q, &lo, &hi);
    bool ok;
    if (a != UINT32_MAX) { /* one atom: its transition says */
        if ((rc = atom_entry(m, q.s, a, lo, &x)))
            return rc;
        ok = x != GRAM_REJECT;
    } else {
        ok = state_hits(m, q.s, lo, hi);
    }
    if (!ok)
        return 0;
    *p = q;
    return 1;
}

int dray_gram_step_slow(struct dray_grammar_matcher *m, struct gram_pos *p, uint8_t b)
{
    return p->rem == 0 ? step_first(m, p, b) : step_cont(m, p, b);
}

/* ------------------------------------------------------------ rebuilding */
void dray_gram_lru_clear(struct dray_grammar_matcher *m)
{
    for (int k = 0; k < GRAM_MASK_LRU; k++)
        m->lru[k].vocab = 0;
}

static void dfa_clear(struct gram_dfa *d)
{
    d->n_st = 0;
    d->n_pool = 0;
    if (d->tab)
        memset(d->tab, 0, d->tab_cap * sizeof(*d->tab));
}

/* All or nothing: the one allocation comes first; re-interning the kept states
 * then fits in the arrays they already filled, so it cannot fail. */
int dray_gram_rebuild(struct dray_grammar_matcher *m, uint32_t *ids, size_t n)
{
    struct gram_dfa *d = &m->d;
    size_t len = 0;
    for (size_t k = 0; k < n; k++)
        len += 2 + d->st[ids[k]].len;
    uint32_t *keep = malloc((len ? len : 1) * sizeof(*keep));
    if (!keep)
        return DRAY_ENOMEM;
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        const struct gram_state *s = &d->st[ids[k]];
        keep[o++] = s->len;
        keep[o++] = s->n_stacks;
        memcpy(keep + o, d->pool + s->off, s->len * sizeof(*keep));
        o += s->len;
    }
    dfa_clear(d);
    dray_gram_lru_clear(m);
    int rc = 0;
    o = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        uint32_t l = keep[o], ns = keep[o + 1];
        rc = intern(m->g, d, keep + o + 2, l, ns, &ids[k]);
        o += 2 + l;
    }
    free(keep);
    return rc;
}

/* ------------------------------------------------------------ the matcher */
int dray_grammar_matcher_new(const struct dray_grammar *g, struct dray_grammar_matcher **out)
{
    *out = NULL;
    if (!g)
        return DRAY_EINVAL;
    struct dray_grammar_matcher *m = calloc(1, sizeof(*m));
    if (!m)
        return DRAY_ENOMEM;
    m->g = g;
    m->d.row_len = g->n_atoms + 128; /* 256 byte entries + atoms 128.. */
    size_t row_bytes = m->d.row_len * sizeof(uint32_t);
    m->d.budget = g->lim.cache > 256 * row_bytes ? g->lim.cache : 256 * row_bytes;
    m->d.mark = calloc(((size_t)g->n_el + 63) / 64, sizeof(*m->d.mark));
    int rc = m->d.mark ? dray_gram_enter(m) : DRAY_ENOMEM;
    rc = rc ? rc : initial_state(m, &m->pos.s);
    if (rc) {
        dray_grammar_matcher_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* *dst = a malloc'd copy of n elements of size sz at src (NULL for none). */
static int dup_array(void **dst, const void *src, size_t n, size_t sz)
{
    *dst = NULL;
    if (!src || n == 0)
        return 0;
    *dst = malloc(n * sz);
    if (!*dst)
        return DRAY_ENOMEM;
    memcpy(*dst, src, n * sz);
    return 0;
}

int dray_grammar_matcher_clone(const struct dray_grammar_matcher *m,
                               struct dray_grammar_matcher **out)
{
    *out = NULL;
    struct dray_grammar_matcher *c = calloc(1, sizeof(*c));
    if (!c)
        return DRAY_ENOMEM;
    const struct gram_dfa *d = &m->d;
    c->g = m->g;
    c->pos = m->pos;
    c->failed = m->failed;
    memcpy(c->why, m->why, sizeof(c->why));
    c->tick = m->tick;
    c->d.row_len = d->row_len;
    c->d.budget = d->budget;
    c->d.n_st = c->d.cap_st = c->d.cap_rows = d->n_st;
    c->d.n_pool = c->d.cap_pool = d->n_pool;
    c->d.tab_cap = d->tab_cap;
    int rc = dup_array((void **)&c->d.st, d->st, d->n_st, sizeof(*d->st));
    rc = rc ? rc : dup_array((void **)&c->d.trans, d->trans, (size_t)d->n_st * d->row_len,
                             sizeof(*d->trans));
    rc = rc ? rc : dup_array((void **)&c->d.pool, d->pool, d->n_pool, sizeof(*d->pool));
    rc = rc ? rc : dup_array((void **)&c->d.tab, d->tab, d->tab_cap, sizeof(*d->tab));
    if (!rc && !(c->d.mark = calloc(((size_t)m->g->n_el + 63) / 64, sizeof(*c->d.mark))))
        rc = DRAY_ENOMEM;
    c->lru_words = m->lru_words;
    for (int k = 0; k < GRAM_MASK_LRU && !rc; k++) {
        c->lru[k] = m->lru[k];
        c->lru[k].bits = NULL;
        if (m->lru[k].vocab)
            rc = dup_array((void **)&c->lru[k].bits, m->lru[k].bits, m->lru_words,
                           sizeof(uint32_t));
        else
            c->lru[k].vocab = 0;
    }
    if (rc) {
        dray_grammar_matcher_free(c);
        return DRAY_ENOMEM;
    }
    *out = c;
    return 0;
}

void dray_grammar_matcher_free(struct dray_grammar_matcher *m)
{
    if (!m)
        return;
    free(m->d.st), free(m->d.trans), free(m->d.pool), free(m->d.tab), free(m->d.mark);
    free(m->x.w), free(m->x.refs), free(m->x.work), free(m->x.out), free(m->x.seen);
    for (int k = 0; k < GRAM_MASK_LRU; k++)
        free(m->lru[k].bits);
    free(m->walk);
    free(m->bits);
    free(m);
}

/* Step over bytes; commit: move there, else stay (a peek). */
static int feed(struct dray_grammar_matcher *m, const char *bytes, size_t n, bool commit)
{
    uint32_t keep[2] = {m->pos.s, m->pos.s}; /* where it started, where it is */
    struct gram_pos p = m->pos;
    int rc = dray_gram_enter(m);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int r = dray_gram_step(m, &p, (uint8_t)bytes[i]);
        if (r <= 0) {
            m->pos.s = keep[0];
            return r < 0 ? r : DRAY_EINVAL;
        }
        if (dray_gram_over_budget(m)) {
            keep[1] = p.s;
            if (dray_gram_rebuild(m, keep, 2))
                return DRAY_ENOMEM; /* nothing changed: m->pos is still valid */
            p.s = keep[1];
            m->pos.s = keep[0];
        }
    }
    if (commit)
        m->pos = p;
    return 0;
}

int dray_grammar_accept_bytes(struct dray_grammar_matcher *m, const char *bytes, size_t n)
{
    return feed(m, bytes, n, true);
}

int dray_grammar_peek_bytes(struct dray_grammar_matcher *m, const char *bytes, size_t n)
{
    return feed(m, bytes, n, false);
}

bool dray_grammar_can_end(const struct dray_grammar_matcher *m)
{
    return !m->failed && m->pos.rem == 0 && m->d.st[m->pos.s].accept;
}

bool dray_grammar_must_end(const struct dray_grammar_matcher *m)
{
    return dray_grammar_can_end(m) && m->d.st[m->pos.s].n_tops == 0;
}
