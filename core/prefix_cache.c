/* Prefix cache: chained block hashes -> shared KV blocks (see prefix_cache.h). */
#include "prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dray/backend.h"
#include "kv.h"

struct pc_entry {
    uint64_t hash;            /* chained hash of the prefix up to this block's end */
    struct pc_entry *parent;  /* the entry one block shorter, NULL for block 0 */
    struct pc_entry *next;    /* bucket chain */
    struct pc_entry *newer, *older; /* LRU list */
    uint32_t n_tok;           /* prefix length: (block index + 1) * block size */
    uint32_t n_children;
    int32_t gblock[DRAY_KV_MAX_GROUPS]; /* this block in each global group, -1 in window groups */
    int32_t *ckpt;            /* window checkpoint: per window group, the blocks of entries
                               * live_from(n_tok) .. n_tok/bs - 1, concatenated; NULL if none */
    uint32_t n_ckpt;
    int32_t tok[];            /* the block's tokens [bs] */
};

struct dray_pcache {
    struct dray_kv *kv;
    uint32_t bs, n_group;
    bool window[DRAY_KV_MAX_GROUPS];
    bool has_window;
    struct pc_entry **bucket;
    size_t n_bucket;          /* power of two */
    struct pc_entry *newest, *oldest;
    struct dray_pcache_stats st;
};

/* ------------------------------------------------------------- table */

static struct pc_entry **slot_of(struct dray_pcache *pc, uint64_t h)
{
    return &pc->bucket[h & (pc->n_bucket - 1)];
}

static struct pc_entry *find(struct dray_pcache *pc, uint64_t h, const struct pc_entry *parent,
                             const int32_t *tok)
{
    for (struct pc_entry *e = *slot_of(pc, h); e; e = e->next)
        if (e->hash == h && e->parent == parent && !memcmp(e->tok, tok, pc->bs * sizeof(int32_t)))
            return e;
    return NULL;
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

static void lru_unlink(struct dray_pcache *pc, struct pc_entry *e)
{
    if (e->newer)
        e->newer->older = e->older;
    else
        pc->newest = e->older;
    if (e->older)
        e->older->newer = e->newer;
    else
        pc->oldest = e->newer;
    e->newer = e->older = NULL;
}

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

/* ------------------------------------------------------------- eviction */

static void drop_ckpt(struct dray_pcache *pc, struct pc_entry *e)
{
    uint32_t i = 0;
    for (uint32_t g = 0; g < pc->n_group; g++) {
        if (!pc->window[g])
            continue;
        uint32_t from = dray_kv_live_from(pc->kv, g, e->n_tok), to = e->n_tok / pc->bs;
        for (uint32_t k = from; k < to; k++)
            dray_kv_block_unref(pc->kv, g, (uint32_t)e->ckpt[i++]);
    }
    pc->st.blocks -= e->n_ckpt;
    pc->st.checkpoints--;
    free(e->ckpt);
    e->ckpt = NULL;
    e->n_ckpt = 0;
}

static void drop_entry(struct dray_pcache *pc, struct pc_entry *e)
{
    if (e->ckpt)
        drop_ckpt(pc, e);
    for (uint32_t g = 0; g < pc->n_group; g++)
        if (!pc->window[g]) {
            dray_kv_block_unref(pc->kv, g, (uint32_t)e->gblock[g]);
            pc->st.blocks--;
        }
    struct pc_entry **p = slot_of(pc, e->hash);
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    lru_unlink(pc, e);
    if (e->parent)
        e->parent->n_children--;
    pc->st.entries--;
    free(e);
}

/* The KV manager needs `need` more free blocks in group g: drop checkpoints
 * (window group) or leaf entries (global group), oldest first, until it has
 * them or nothing more can go. */
static void reclaim(void *user, uint32_t g, uint32_t need)
{
    struct dray_pcache *pc = user;
    uint32_t have = dray_kv_group_free_blocks(pc->kv, g), want = have + need;
    struct pc_entry *e = pc->oldest;
    while (e && dray_kv_group_free_blocks(pc->kv, g) < want) {
        struct pc_entry *newer = e->newer;
        if (pc->window[g] && e->ckpt) {
            drop_ckpt(pc, e);
            pc->st.evictions++;
        } else if (!pc->window[g] && e->n_children == 0) {
            struct pc_entry *parent = e->parent;
            drop_entry(pc, e);
            pc->st.evictions++;
            /* the parent may have become a leaf older than `newer` */
            if (parent && parent->n_children == 0) {
                newer = pc->oldest;
            }
        }
        e = newer;
    }
}

/* ------------------------------------------------------------- API */

int dray_pcache_create(struct dray_kv *kv, struct dray_pcache **out)
{
    struct dray_pcache *pc = calloc(1, sizeof(*pc));
    *out = NULL;
    if (!pc)
        return DRAY_ENOMEM;
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    pc->kv = kv;
    pc->bs = dray_kv_block_size(kv);
    pc->n_group = p->n_group;
    for (uint32_t g = 0; g < p->n_group; g++) {
        pc->window[g] = p->group[g].window != 0;
        pc->has_window |= pc->window[g];
    }
    pc->n_bucket = 1024;
    pc->bucket = calloc(pc->n_bucket, sizeof(*pc->bucket));
    if (!pc->bucket) {
        free(pc);
        return DRAY_ENOMEM;
    }
    dray_kv_set_reclaim(kv, reclaim, pc);
    *out = pc;
    return 0;
}

void dray_pcache_free(struct dray_pcache *pc)
{
    if (!pc)
        return;
    /* oldest first drops children before their parents */
    while (pc->oldest) {
        struct pc_entry *e = pc->oldest;
        while (e && e->n_children)
            e = e->newer;
        if (!e)
            break; /* cannot happen: some entry is always a leaf */
        drop_entry(pc, e);
    }
    dray_kv_set_reclaim(pc->kv, NULL, NULL);
    free(pc->bucket);
    free(pc);
}

uint64_t dray_pcache_salt(const char *tenant)
{
    return tenant && tenant[0] ? XXH3_64bits(tenant, strlen(tenant)) : 0;
}

static uint64_t block_hash(const int32_t *tok, uint32_t bs, uint64_t prev)
{
    return XXH3_64bits_withSeed(tok, bs * sizeof(int32_t), prev);
}

/* Window blocks a query at position e->n_tok sees, taken from seq; false (and
 * nothing held) when some of them are gone. */
static bool take_ckpt(struct dray_pcache *pc, struct pc_entry *e, uint32_t seq)
{
    uint32_t n = 0, to = e->n_tok / pc->bs;
    for (uint32_t g = 0; g < pc->n_group; g++)
        if (pc->window[g])
            n += to - dray_kv_live_from(pc->kv, g, e->n_tok);
    int32_t *ck = malloc((n ? n : 1) * sizeof(int32_t));
    if (!ck)
        return false;
    uint32_t i = 0;
    for (uint32_t g = 0; g < pc->n_group; g++)
        for (uint32_t k = dray_kv_live_from(pc->kv, g, e->n_tok); pc->window[g] && k < to; k++)
            if ((ck[i++] = dray_kv_seq_block(pc->kv, seq, g, k)) < 0) {
                free(ck);
                return false;
            }
    i = 0;
    for (uint32_t g = 0; g < pc->n_group; g++)
        for (uint32_t k = dray_kv_live_from(pc->kv, g, e->n_tok); pc->window[g] && k < to; k++)
            dray_kv_block_ref(pc->kv, g, (uint32_t)ck[i++]);
    e->ckpt = ck;
    e->n_ckpt = n;
    pc->st.blocks += n;
    pc->st.checkpoints++;
    return true;
}

static struct pc_entry *add_entry(struct dray_pcache *pc, uint64_t h, struct pc_entry *parent,
                                  const int32_t *tok, uint32_t k, uint32_t seq)
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
    e->parent = parent;
    e->n_tok = (k + 1) * pc->bs;
    memcpy(e->tok, tok, pc->bs * sizeof(int32_t));
    struct pc_entry **slot = slot_of(pc, h);
    e->next = *slot;
    *slot = e;
    if (parent)
        parent->n_children++;
    if (++pc->st.entries > pc->n_bucket)
        grow_table(pc);
    return e;
}

void dray_pcache_insert(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t len,
                        uint32_t seq)
{
    uint32_t n_full = (uint32_t)(len / pc->bs);
    uint64_t h = salt;
    struct pc_entry *e = NULL;
    for (uint32_t k = 0; k < n_full; k++) {
        const int32_t *tok = ids + (size_t)k * pc->bs;
        h = block_hash(tok, pc->bs, h);
        struct pc_entry *next = find(pc, h, e, tok);
        if (!next)
            next = add_entry(pc, h, e, tok, k, seq);
        if (!next)
            break;
        e = next;
    }
    if (!e)
        return;
    if (pc->has_window && !e->ckpt)
        take_ckpt(pc, e, seq);
    touch_path(pc, e);
}

uint32_t dray_pcache_attach(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t n,
                            uint32_t seq)
{
    uint32_t n_full = (uint32_t)(n / pc->bs);
    uint64_t h = salt;
    struct pc_entry *e = NULL, *best = NULL;
    pc->st.lookups++;
    pc->st.lookup_tokens += n;
    for (uint32_t k = 0; k < n_full; k++) {
        const int32_t *tok = ids + (size_t)k * pc->bs;
        h = block_hash(tok, pc->bs, h);
        e = find(pc, h, e, tok);
        if (!e)
            break;
        if (!pc->has_window || e->ckpt)
            best = e;
    }
    if (!best)
        return 0;
    uint32_t n_ent = best->n_tok / pc->bs;
    int32_t *tab = malloc((size_t)pc->n_group * n_ent * sizeof(int32_t));
    const int32_t *rows[DRAY_KV_MAX_GROUPS];
    if (!tab)
        return 0;
    uint32_t i = 0;
    for (uint32_t g = 0; g < pc->n_group; g++) {
        int32_t *row = tab + (size_t)g * n_ent;
        rows[g] = row;
        if (pc->window[g]) {
            for (uint32_t k = dray_kv_live_from(pc->kv, g, best->n_tok); k < n_ent; k++)
                row[k] = best->ckpt[i++];
            continue;
        }
        uint32_t k = n_ent;
        for (struct pc_entry *p = best; p; p = p->parent)
            row[--k] = p->gblock[g];
    }
    uint32_t got = dray_kv_seq_attach(pc->kv, seq, best->n_tok, rows) ? 0 : best->n_tok;
    free(tab);
    if (got) {
        touch_path(pc, best);
        pc->st.hit_tokens += got;
    }
    return got;
}

void dray_pcache_get_stats(const struct dray_pcache *pc, struct dray_pcache_stats *st)
{
    *st = pc->st;
}
