/* What the prefix cache's files share (prefix_cache.c: the table, LRU order,
 * insert and lookup; pcache_tier.c: eviction and the host tier): its entries and
 * state, and the small helpers both use. The KV room only. */
#ifndef DRAY_CORE_PREFIX_CACHE_INTERNAL_H
#define DRAY_CORE_PREFIX_CACHE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "prefix_cache.h"

struct pc_entry {
    uint64_t hash;            /* chained hash of the prefix up to this block's end */
    uint64_t salt;            /* tenant (compared where entries are scanned, not hashed) */
    struct pc_entry *parent;  /* the entry one block shorter, NULL for block 0 */
    struct pc_entry *next;    /* bucket chain */
    struct pc_entry *newer, *older; /* LRU list */
    struct pc_entry *child, *sibling; /* children list (full and partial) */
    uint32_t n_tok;           /* prefix length: parent's n_tok + n_part */
    uint32_t n_part;          /* tokens of this block: block size, or fewer for a partial
                               * tail (the end of an inserted sequence; always a leaf) */
    uint32_t n_children;
    int32_t gblock[DRAY_KV_MAX_GROUPS]; /* this block in each global group, -1 in window groups */
    int32_t *ckpt;            /* window checkpoint: per window group, the blocks of entries
                               * kept_from(n_tok) .. ceil(n_tok/bs) - 1, concatenated
                               * (the last one partial for a tail); NULL if none */
    uint32_t n_ckpt;
    /* host tier: the same blocks in kv.h's vendor-neutral layout, once spilled */
    unsigned char *host_g;    /* every global group's block, in group order; NULL if on device */
    unsigned char *host_ckpt; /* the checkpoint's blocks, in ckpt order; NULL if none */
    bool pinned;              /* on the path of an attach in progress: never spilled */
    int32_t tok[];            /* the block's tokens [n_part] (room for bs) */
};

struct dray_pcache {
    struct dray_kv *kv;
    uint32_t bs, n_group;
    bool window[DRAY_KV_MAX_GROUPS];
    bool has_window;
    uint32_t max_window;      /* the widest window group's window, tokens */
    struct pc_entry **bucket;
    size_t n_bucket;          /* power of two */
    struct pc_entry *newest, *oldest;
    struct pc_entry *roots;   /* entries of block 0, every tenant */
    uint64_t host_budget;     /* bytes of host memory for spilled blocks */
    uint64_t g_bytes;         /* host bytes of one entry's global blocks */
    uint64_t wblock_bytes[DRAY_KV_MAX_GROUPS];
    struct dray_pcache_stats st;
};

/* Blocks of e's checkpoint, walked group by group: calls fn(g, index in ckpt). */
#define FOR_CKPT(pc, e, g, k, i)                                                              \
    for (uint32_t g = 0, i = 0; g < (pc)->n_group; g++)                                        \
        for (uint32_t k = dray_kv_kept_from((pc)->kv, g, (e)->n_tok);                          \
             (pc)->window[g] && k < ((e)->n_tok + (pc)->bs - 1) / (pc)->bs; k++, i++)

static inline struct pc_entry **slot_of(struct dray_pcache *pc, uint64_t h)
{
    return &pc->bucket[h & (pc->n_bucket - 1)];
}

static inline struct pc_entry **children_of(struct dray_pcache *pc, struct pc_entry *parent)
{
    return parent ? &parent->child : &pc->roots;
}

static inline void lru_unlink(struct dray_pcache *pc, struct pc_entry *e)
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

static inline bool has_ckpt(const struct pc_entry *e)
{
    return e->ckpt || e->host_ckpt;
}

/* pcache_tier.c */
/* Drop e (a leaf): its blocks, host copies and checkpoint go. */
void pc_drop_entry(struct dray_pcache *pc, struct pc_entry *e);
/* Host -> device: e's global blocks, or its checkpoint, into fresh blocks. */
bool pc_restore_global(struct dray_pcache *pc, struct pc_entry *e);
bool pc_restore_ckpt(struct dray_pcache *pc, struct pc_entry *e);
/* The KV manager's reclaim callback (dray_kv_reclaim_fn). */
void pc_reclaim(void *user, uint32_t g, uint32_t need);

#endif
