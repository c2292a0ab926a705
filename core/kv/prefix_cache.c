/* Prefix cache: chained block hashes -> shared KV blocks (see prefix_cache.h). */
#include "prefix_cache_internal.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dray/backend.h"

/* ------------------------------------------------------------- table */

/* The full-block entry of hash h under parent with these bs tokens. */
static struct pc_entry *find(struct dray_pcache *pc, uint64_t h, const struct pc_entry *parent,
                             const int32_t *tok)
{
    for (struct pc_entry *e = *slot_of(pc, h); e; e = e->next)
        if (e->hash == h && e->parent == parent && e->n_part == pc->bs &&
            !memcmp(e->tok, tok, pc->bs * sizeof(int32_t)))
            return e;
    return NULL;
}

/* Tokens a and b have in common from the start, at most n. */
static uint32_t common_len(const int32_t *a, const int32_t *b, uint32_t n)
{
    uint32_t m = 0;
    while (m < n && a[m] == b[m])
        m++;
    return m;
}

static void grow_table(struct dray_pcache *pc)
{
    size_t n = pc->n_bucket * 2;
    struct pc_entry **b = calloc(n, sizeof(*b));
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < pc->n_bucket; i++)
        for (struct pc_entry *e = pc->bucket[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    free(pc->bucket);
    pc->bucket = b;
    pc->n_bucket = n;
}

/* ------------------------------------------------------------- LRU */

static void lru_touch(struct dray_pcache *pc, struct pc_entry *e)
{
    if (pc->newest == e)
        return;
    if (e->newer || e->older || pc->oldest == e)
        lru_unlink(pc, e);
    e->older = pc->newest;
    if (pc->newest)
        pc->newest->newer = e;
    pc->newest = e;
    if (!pc->oldest)
        pc->oldest = e;
}

/* Touch a path leaf first, so that parents are always newer than their
 * children and the oldest entries are leaves. */
static void touch_path(struct dray_pcache *pc, struct pc_entry *leaf)
{
    for (struct pc_entry *e = leaf; e; e = e->parent)
        lru_touch(pc, e);
}

/* ------------------------------------------------------------- API */

int dray_pcache_create(struct dray_kv *kv, uint64_t host_bytes, struct dray_pcache **out)
{
    struct dray_pcache *pc = calloc(1, sizeof(*pc));
    *out = NULL;
    if (!pc)
        return DRAY_ENOMEM;
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    pc->kv = kv;
    pc->bs = dray_kv_block_size(kv);
    pc->n_group = p->n_group;
    pc->host_budget = host_bytes;
    for (uint32_t g = 0; g < p->n_group; g++) {
        pc->window[g] = p->group[g].window != 0;
        pc->has_window |= pc->window[g];
        if (p->group[g].window > pc->max_window)
            pc->max_window = p->group[g].window;
        pc->wblock_bytes[g] = dray_kv_block_host_bytes(kv, g);
        if (!pc->window[g])
            pc->g_bytes += pc->wblock_bytes[g];
    }
    pc->n_bucket = 1024;
    pc->bucket = calloc(pc->n_bucket, sizeof(*pc->bucket));
    if (!pc->bucket) {
        free(pc);
        return DRAY_ENOMEM;
    }
    dray_kv_set_reclaim(kv, pc_reclaim, pc);
    *out = pc;
    return 0;
}

void dray_pcache_free(struct dray_pcache *pc)
{
    if (!pc)
        return;
    /* leaves first: children go before their parents */
    while (pc->oldest) {
        struct pc_entry *e = pc->oldest;
        while (e && e->n_children)
            e = e->newer;
        if (!e)
            break; /* cannot happen: some entry is always a leaf */
        pc_drop_entry(pc, e);
    }
    dray_kv_set_reclaim(pc->kv, NULL, NULL);
    free(pc->bucket);
    free(pc);
}

uint64_t dray_pcache_salt(const char *tenant)
{
    return tenant && tenant[0] ? XXH3_64bits(tenant, strlen(tenant)) : 0;
}

static uint64_t block_hash(const int32_t *tok, uint32_t n, uint64_t prev)
{
    return XXH3_64bits_withSeed(tok, n * sizeof(int32_t), prev);
}

/* Window blocks a query at position e->n_tok sees, taken from seq; false (and
 * nothing held) when some of them are gone. */
static bool take_ckpt(struct dray_pcache *pc, struct pc_entry *e, uint32_t seq)
{
    uint32_t n = 0;
    FOR_CKPT(pc, e, g, k, i)
        n++;
    int32_t *ck = malloc((n ? n : 1) * sizeof(int32_t));
    if (!ck)
        return false;
    FOR_CKPT(pc, e, g, k, i)
        if ((ck[i] = dray_kv_seq_block(pc->kv, seq, g, k)) < 0) {
            free(ck);
            return false;
        }
    FOR_CKPT(pc, e, g, k, i)
        dray_kv_block_ref(pc->kv, g, (uint32_t)ck[i]);
    e->ckpt = ck;
    e->n_ckpt = n;
    pc->st.blocks += n;
    pc->st.checkpoints++;
    return true;
}

/* Entry for block k of seq (n_part of its tokens, from tok) under parent. */
static struct pc_entry *add_entry(struct dray_pcache *pc, uint64_t h, uint64_t salt,
                                  struct pc_entry *parent, const int32_t *tok, uint32_t k,
                                  uint32_t n_part, uint32_t seq)
{
    struct pc_entry *e = calloc(1, sizeof(*e) + pc->bs * sizeof(int32_t));
    if (!e)
        return NULL;
    for (uint32_t g = 0; g < pc->n_group; g++) {
        e->gblock[g] = pc->window[g] ? -1 : dray_kv_seq_block(pc->kv, seq, g, k);
        if (!pc->window[g] && e->gblock[g] < 0) {
            free(e);
            return NULL;
        }
    }
    for (uint32_t g = 0; g < pc->n_group; g++)
        if (!pc->window[g]) {
            dray_kv_block_ref(pc->kv, g, (uint32_t)e->gblock[g]);
            pc->st.blocks++;
        }
    e->hash = h;
    e->salt = salt;
    e->parent = parent;
    e->n_part = n_part;
    e->n_tok = k * pc->bs + n_part;
    memcpy(e->tok, tok, n_part * sizeof(int32_t));
    struct pc_entry **slot = slot_of(pc, h);
    e->next = *slot;
    *slot = e;
    struct pc_entry **kids = children_of(pc, parent);
    e->sibling = *kids;
    *kids = e;
    if (parent)
        parent->n_children++;
    if (++pc->st.entries > pc->n_bucket)
        grow_table(pc);
    return e;
}

/* The tail of an inserted sequence: the partial block after e (p tokens, tok),
 * unless a tail that covers it is there already. Tails it covers go: every query
 * they would serve, it serves at least as far. */
static struct pc_entry *insert_tail(struct dray_pcache *pc, uint64_t salt, struct pc_entry *e,
                                    uint64_t h, const int32_t *tok, uint32_t p, uint32_t seq)
{
    uint32_t k = e ? e->n_tok / pc->bs : 0;
    for (struct pc_entry **c = children_of(pc, e), *cur; (cur = *c);) {
        bool mine = cur->salt == salt && cur->n_part < pc->bs;
        uint32_t m = mine ? common_len(cur->tok, tok, cur->n_part < p ? cur->n_part : p) : 0;
        if (mine && m == p && cur->n_part >= p && (has_ckpt(cur) || !pc->has_window))
            return cur; /* covers ours */
        if (mine && m == cur->n_part && !cur->pinned) {
            pc_drop_entry(pc, cur); /* ours covers it */
            continue;
        }
        c = &cur->sibling;
    }
    struct pc_entry *t = add_entry(pc, block_hash(tok, p, h), salt, e, tok, k, p, seq);
    if (t && pc->has_window && !take_ckpt(pc, t, seq)) {
        pc_drop_entry(pc, t);
        return NULL;
    }
    return t;
}

void dray_pcache_insert(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t len,
                        uint32_t seq)
{
    uint32_t n_full = (uint32_t)(len / pc->bs), p = (uint32_t)(len % pc->bs), k = 0;
    uint64_t h = salt;
    struct pc_entry *e = NULL;
    for (; k < n_full; k++) {
        const int32_t *tok = ids + (size_t)k * pc->bs;
        uint64_t hk = block_hash(tok, pc->bs, h);
        struct pc_entry *next = find(pc, hk, e, tok);
        if (!next)
            next = add_entry(pc, hk, salt, e, tok, k, pc->bs, seq);
        if (!next)
            break;
        e = next;
        h = hk;
    }
    /* the checkpoint goes at the very end: the tail's also serves a query at its
     * block boundary, so the full entry before it needs none */
    struct pc_entry *last = e;
    if (k == n_full && p) {
        struct pc_entry *t = insert_tail(pc, salt, e, h, ids + (size_t)k * pc->bs, p, seq);
        if (t)
            last = t;
    }
    if (!last)
        return;
    if (pc->has_window && !has_ckpt(last))
        take_ckpt(pc, last, seq);
    touch_path(pc, last);
}

/* A hit: the path root..leaf of full entries, then (optionally) the first
 * len - leaf's n_tok tokens of tail, a child of leaf. src holds the window
 * checkpoint (tail or leaf; NULL without window groups). */
struct pc_hit {
    struct pc_entry *leaf, *tail, *src;
    uint32_t len;
};

/* Bring what the hit uses back to the device where it was spilled. */
static bool restore_hit(struct dray_pcache *pc, const struct pc_hit *h)
{
    for (struct pc_entry *e = h->leaf; e; e = e->parent)
        if (e->host_g && !pc_restore_global(pc, e))
            return false;
    if (h->tail && h->tail->host_g && !pc_restore_global(pc, h->tail))
        return false;
    return !h->src || !h->src->host_ckpt || pc_restore_ckpt(pc, h->src);
}

static void pin_hit(const struct pc_hit *h, bool pin)
{
    for (struct pc_entry *e = h->leaf; e; e = e->parent)
        e->pinned = pin;
    if (h->tail)
        h->tail->pinned = pin;
}

#define PC_MAX_CANDS 64 /* checkpoints looked at for one assembled hit */

/* Window blocks of a hit gathered from several checkpoints: for window group g
 * and table entry k, block[g][k - first[g]] (see assemble_window). */
struct pc_wtab {
    uint32_t first[DRAY_KV_MAX_GROUPS], n[DRAY_KV_MAX_GROUPS];
    int32_t *block[DRAY_KV_MAX_GROUPS];
    struct pc_entry *src[PC_MAX_CANDS]; /* the checkpoints they come from, pinned */
    uint32_t n_src;
};

static int attach_device(struct dray_pcache *pc, const struct pc_hit *h, const struct pc_wtab *wt,
                         uint32_t seq)
{
    uint32_t n_ent = (h->len + pc->bs - 1) / pc->bs, w = n_ent + 1; /* src may hold one more */
    int32_t *tab = malloc((size_t)pc->n_group * w * sizeof(int32_t));
    const int32_t *rows[DRAY_KV_MAX_GROUPS];
    if (!tab)
        return DRAY_ENOMEM;
    for (uint32_t g = 0; g < pc->n_group; g++) {
        int32_t *row = tab + (size_t)g * w;
        rows[g] = row;
        for (uint32_t k = 0; k < w; k++)
            row[k] = -1;
        if (!pc->window[g]) {
            uint32_t k = h->leaf ? h->leaf->n_tok / pc->bs : 0;
            if (h->tail && k < n_ent)
                row[k] = h->tail->gblock[g];
            for (struct pc_entry *p = h->leaf; p; p = p->parent)
                row[--k] = p->gblock[g];
        }
    }
    if (h->src)
        FOR_CKPT(pc, h->src, g, k, i)
            tab[(size_t)g * w + k] = h->src->ckpt[i];
    for (uint32_t g = 0; wt && g < pc->n_group; g++)
        for (uint32_t j = 0; j < wt->n[g]; j++)
            tab[(size_t)g * w + wt->first[g] + j] = wt->block[g][j];
    int rc = dray_kv_seq_attach(pc->kv, seq, h->len, rows);
    free(tab);
    return rc;
}

/* Does the checkpoint of e hold every window block a query at len needs? */
static bool ckpt_serves(struct dray_pcache *pc, const struct pc_entry *e, uint32_t len)
{
    if (!pc->has_window)
        return true;
    uint32_t bs = pc->bs;
    if (!has_ckpt(e) || len > e->n_tok || (len + bs - 1) / bs > (e->n_tok + bs - 1) / bs)
        return false;
    for (uint32_t g = 0; g < pc->n_group; g++)
        if (pc->window[g] && dray_kv_kept_from(pc->kv, g, len) < dray_kv_kept_from(pc->kv, g, e->n_tok))
            return false;
    return true;
}

/* Offer the children of e (the match of ids[0..base)) as hits: each is used up
 * to where it stops matching (a partial tail, or a full block the query diverges
 * inside or ends in). */
static void scan_children(struct dray_pcache *pc, uint64_t salt, struct pc_entry *e,
                          const int32_t *ids, size_t n, struct pc_hit *best)
{
    uint32_t base = e ? e->n_tok : 0;
    uint32_t avail = n - base < pc->bs ? (uint32_t)(n - base) : pc->bs;
    for (struct pc_entry *c = *children_of(pc, e); c; c = c->sibling) {
        if (c->salt != salt)
            continue;
        uint32_t m = common_len(c->tok, ids + base, c->n_part < avail ? c->n_part : avail);
        if (base + m > best->len && (m || pc->has_window) && ckpt_serves(pc, c, base + m))
            *best = (struct pc_hit){.leaf = e, .tail = m ? c : NULL,
                                    .src = pc->has_window ? c : NULL, .len = base + m};
    }
}

/* The longest hit for ids[0..n): full blocks as far as they match; at each
 * level, a full entry that can serve (with a checkpoint where there are window
 * groups) or a child used up to where it stops matching. The root's children
 * (every tenant's first blocks) are scanned only when nothing else matched.
 * *match: the longest cached prefix, whether or not one checkpoint serves it
 * (leaf: the last full entry that matches; tail: its child that matches
 * furthest, or NULL when none matches a token). */
static struct pc_hit longest_hit(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t n,
                                 struct pc_hit *match)
{
    uint32_t n_full = (uint32_t)(n / pc->bs);
    uint64_t h = salt;
    struct pc_entry *e = NULL;
    struct pc_hit best = {0};
    for (uint32_t k = 0; k < n_full; k++) {
        const int32_t *tok = ids + (size_t)k * pc->bs;
        struct pc_entry *next = find(pc, h = block_hash(tok, pc->bs, h), e, tok);
        if (!next)
            break;
        e = next;
        if (ckpt_serves(pc, e, e->n_tok))
            best = (struct pc_hit){.leaf = e, .src = pc->has_window ? e : NULL, .len = e->n_tok};
        if (e->parent)
            scan_children(pc, salt, e->parent, ids, n, &best);
    }
    scan_children(pc, salt, e, ids, n, &best);
    *match = (struct pc_hit){.leaf = e, .len = e ? e->n_tok : 0};
    uint32_t base = match->len, avail = n - base < pc->bs ? (uint32_t)(n - base) : pc->bs;
    for (struct pc_entry *c = *children_of(pc, e); c; c = c->sibling) {
        uint32_t m = c->salt == salt ? common_len(c->tok, ids + base, c->n_part < avail ? c->n_part : avail) : 0;
        if (base + m > match->len) {
            match->tail = c;
            match->len = base + m;
        }
    }
    return best;
}

/* ------------------------------------------------------------- assembled window
 * A query that diverges at M inside a cached prefix where no checkpoint ends in
 * M's block (an earlier message edited, a reply continued some other way) needs,
 * besides the global blocks up to M, the window blocks of entries
 * kept_from(M) .. ceil(M / bs) - 1. Recomputing them is no cheap way
 * out: a window layer's KV at position q comes from the hidden state at q, which
 * every window layer below took from the window before q, so exact window KV at
 * M - window .. M needs (window layers) x window positions recomputed. But the
 * checkpoints around M hold those blocks when they lie less than a window apart
 * (every turn of a chat leaves one at its reply's end and after the next user
 * header): a checkpoint at c whose sequence matches the query for v tokens holds
 * a valid block k when it covers entry k and v >= min((k + 1) * bs, M). The
 * checkpoints looked at are those on the matched path and its tails, and in the
 * subtree past the divergence (every sequence there matches all M tokens), down
 * to where checkpoints no longer cover M's entries. */

struct pc_cands {
    struct pc_entry *x[PC_MAX_CANDS];
    uint32_t valid[PC_MAX_CANDS]; /* tokens the checkpoint's sequence shares with the query */
    uint32_t n;
};

static void add_cand(struct pc_cands *cs, struct pc_entry *x, uint32_t valid)
{
    if (has_ckpt(x) && cs->n < PC_MAX_CANDS) {
        cs->x[cs->n] = x;
        cs->valid[cs->n++] = valid;
    }
}

static void add_subtree(struct dray_pcache *pc, struct pc_cands *cs, struct pc_entry *x,
                        uint32_t valid, uint32_t limit)
{
    if (x->n_tok - x->n_part > limit)
        return;
    add_cand(cs, x, valid);
    for (struct pc_entry *c = x->child; c; c = c->sibling)
        add_subtree(pc, cs, c, valid, limit);
}

/* Index of window group g's entry k in x's checkpoint, or -1. */
static int ckpt_slot(const struct dray_pcache *pc, const struct pc_entry *x, uint32_t g, uint32_t k)
{
    FOR_CKPT(pc, x, gg, kk, i)
        if (gg == g && kk == k)
            return (int)i;
    return -1;
}

/* Unpin wt's sources and free its tables. */
static void wtab_free(struct pc_wtab *wt)
{
    for (uint32_t s = 0; s < wt->n_src; s++)
        wt->src[s]->pinned = false;
    for (uint32_t g = 0; g < DRAY_KV_MAX_GROUPS; g++)
        free(wt->block[g]);
    memset(wt, 0, sizeof(*wt));
}

/* Fill wt for a hit at m->len from the checkpoints around it; false when some
 * block is in none of them (or a restore from the host tier failed). The
 * sources stay pinned until wtab_free, so that nothing reclaims their blocks
 * before the attach takes its references. */
static bool assemble_window(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t n,
                            const struct pc_hit *m, struct pc_wtab *wt)
{
    uint32_t bs = pc->bs, M = m->len, reach = pc->max_window + 2 * bs;
    uint32_t lo = M > reach ? M - reach : 0, limit = M + reach;
    struct pc_cands cs = {.n = 0};
    for (struct pc_entry *p = m->leaf;; p = p->parent) {
        uint32_t base = p ? p->n_tok : 0;
        if (p)
            add_cand(&cs, p, base);
        uint32_t avail = n - base < bs ? (uint32_t)(n - base) : bs;
        for (struct pc_entry *c = *children_of(pc, p); c; c = c->sibling)
            if (c->salt == salt && c != m->tail && c->n_part < bs)
                add_cand(&cs, c, base + common_len(c->tok, ids + base, c->n_part < avail ? c->n_part : avail));
        if (!p || base < lo)
            break;
    }
    if (m->tail)
        add_subtree(pc, &cs, m->tail, M, limit);
    else
        for (struct pc_entry *c = *children_of(pc, m->leaf); c; c = c->sibling)
            if (c->salt == salt)
                add_subtree(pc, &cs, c, M, limit);

    /* a source for every block the query needs */
    struct pc_entry **src = wt->src;
    uint32_t n_src = 0;
    bool ok = true;
    memset(wt, 0, sizeof(*wt));
    for (uint32_t g = 0; ok && g < pc->n_group; g++) {
        if (!pc->window[g])
            continue;
        wt->first[g] = dray_kv_kept_from(pc->kv, g, M);
        wt->n[g] = (M + bs - 1) / bs - wt->first[g];
        wt->block[g] = malloc((wt->n[g] ? wt->n[g] : 1) * sizeof(int32_t));
        ok = wt->block[g] != NULL;
        for (uint32_t j = 0; ok && j < wt->n[g]; j++) {
            uint32_t k = wt->first[g] + j, need = (k + 1) * bs < M ? (k + 1) * bs : M;
            int best = -1;
            for (uint32_t c = 0; c < cs.n; c++)
                if (cs.valid[c] >= need && ckpt_slot(pc, cs.x[c], g, k) >= 0 &&
                    (best < 0 || (!cs.x[best]->ckpt && cs.x[c]->ckpt)))
                    best = (int)c; /* a device-resident one if there is one */
            ok = best >= 0;
            if (!ok)
                break;
            wt->block[g][j] = best; /* the candidate for now; its block below */
            uint32_t s = 0;
            while (s < n_src && src[s] != cs.x[best])
                s++;
            if (s == n_src)
                src[n_src++] = cs.x[best];
        }
    }
    for (uint32_t s = 0; s < n_src; s++)
        src[s]->pinned = true;
    wt->n_src = n_src;
    for (uint32_t s = 0; ok && s < n_src; s++)
        if (!src[s]->ckpt)
            ok = pc_restore_ckpt(pc, src[s]);
    for (uint32_t g = 0; ok && g < pc->n_group; g++)
        for (uint32_t j = 0; j < wt->n[g]; j++) {
            struct pc_entry *x = cs.x[wt->block[g][j]];
            wt->block[g][j] = x->ckpt[ckpt_slot(pc, x, g, wt->first[g] + j)];
        }
    if (!ok)
        wtab_free(wt);
    return ok;
}

uint32_t dray_pcache_attach(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t n,
                            uint32_t seq)
{
    pc->st.lookups++;
    pc->st.lookup_tokens += n;
    struct pc_hit m, h = longest_hit(pc, salt, ids, n, &m);
    if (m.len > h.len && pc->has_window) {
        /* past the last checkpoint that serves alone: gather the window blocks */
        struct pc_wtab wt = {.n_src = 0};
        pin_hit(&m, true);
        bool got = restore_hit(pc, &m) && assemble_window(pc, salt, ids, n, &m, &wt);
        bool ok = got && attach_device(pc, &m, &wt, seq) == 0;
        if (got) {
            for (uint32_t s = 0; s < wt.n_src; s++)
                touch_path(pc, wt.src[s]);
            wtab_free(&wt);
        }
        pin_hit(&m, false);
        if (ok) {
            touch_path(pc, m.tail ? m.tail : m.leaf);
            pc->st.assembled++;
            pc->st.hit_tokens += m.len;
            return m.len;
        }
    }
    if (!h.len)
        return 0;
    pin_hit(&h, true);
    if (h.src)
        h.src->pinned = true;
    bool ok = restore_hit(pc, &h) && attach_device(pc, &h, NULL, seq) == 0;
    pin_hit(&h, false);
    if (h.src)
        h.src->pinned = false;
    if (!ok)
        return 0;
    touch_path(pc, h.tail ? h.tail : h.src && h.src != h.leaf ? h.src : h.leaf);
    pc->st.hit_tokens += h.len;
    return h.len;
}

void dray_pcache_get_stats(const struct dray_pcache *pc, struct dray_pcache_stats *st)
{
    *st = pc->st;
}
