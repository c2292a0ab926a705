/* What the KV manager's files share: its state and the small helpers they all
 * use. kv.c: create, sequences and shared blocks (allocator and reference
 * counts); kv_plan.c: budget planning; kv_step.c: per-step metadata; kv_cow.c:
 * copy on write; kv_host.c: a block's host layout. The KV room only. */
#ifndef DRAY_CORE_KV_INTERNAL_H
#define DRAY_CORE_KV_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"

#define KV_ALIGN 256u /* region alignment inside a group buffer, bytes */
#define META_ALIGN 64u /* array alignment inside the metadata buffer, bytes */

static inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
static inline uint32_t div_up(uint64_t a, uint32_t b) { return (uint32_t)((a + b - 1) / b); }
static inline uint32_t el_size(uint32_t dtype) { return dtype == DRAY_F16 ? 2 : 1; }

/* ------------------------------------------------------------------ state */

struct kv_group {
    struct dray_buf *buf[DRAY_KV_MAX_DEVICES]; /* each device's layers of the group, at
                                                * layer_bytes stride, in group order */
    struct dray_kv_pool *pools; /* [n_layers] views into their device's buf */
    uint8_t *pool_dev;          /* [n_layers] device of each pool */
    uint32_t *free_list;        /* stack of free block ids */
    uint32_t n_free;
    uint32_t *ref;              /* [n_blocks] holders: sequences' tables + the prefix cache */
    int32_t *tables;     /* [max_seqs][max_bps] logical block -> block id, -1 = none */
    uint32_t *first_live; /* [max_seqs] first table entry not recycled (window groups) */
    uint32_t *held;       /* [max_seqs] blocks the sequence holds now */
    /* current step, per micro-batch: byte offsets into the metadata buffer / host staging */
    size_t off_slots[DRAY_KV_MAX_MB], off_seqs[DRAY_KV_MAX_MB], off_bt[DRAY_KV_MAX_MB];
    uint32_t n_bt[DRAY_KV_MAX_MB];
};

struct dray_kv {
    struct dray_kv_device dev[DRAY_KV_MAX_DEVICES];
    uint32_t n_dev;
    uint8_t *layer_dev;    /* [n_layer] */
    bool dev_used[DRAY_KV_MAX_DEVICES]; /* holds a layer: gets the step metadata */
    struct dray_kv_desc d; /* window/share_with pointers are not kept */
    struct dray_kv_plan plan;
    uint32_t max_bps;      /* table entries per sequence = ceil(max_ctx / block_size) */
    uint32_t *layer_group; /* [n_layer] */
    uint32_t *layer_index; /* [n_layer] index inside the group (of the share target) */
    uint8_t *layer_store;  /* [n_layer] 0 for shared layers */
    struct kv_group group[DRAY_KV_MAX_GROUPS];

    uint32_t *seq_len; /* [max_seqs] committed tokens */
    uint8_t *seq_used; /* [max_seqs] */
    uint32_t *free_ids; /* stack of unused sequence ids */
    uint32_t n_free_ids;

    bool in_step;
    uint32_t step_n_seq, step_n_tok, step_max_kv;
    uint32_t step_n_mb, step_mb_end[DRAY_KV_MAX_MB]; /* micro-batches: sequence ends */
    uint32_t *step_ids; /* [max_seqs] */
    uint32_t *step_new; /* [max_seqs] */
    uint8_t *mark;      /* [max_seqs] duplicate check scratch */
    struct dray_kv_layer_step *lsteps; /* [DRAY_KV_MAX_MB][n_layer] */

    uint64_t cow_copies; /* shared partial blocks copied before a write */
    double cow_s;        /* host time spent issuing (and, without a copy op, doing) them */

    dray_kv_reclaim_fn reclaim; /* asked for blocks before a step fails (prefix cache) */
    void *reclaim_user;

    unsigned char *meta_host; /* staging for the one upload per step */
    size_t meta_host_cap;
    struct dray_buf *meta_buf[DRAY_KV_MAX_DEVICES];
    size_t meta_buf_cap[DRAY_KV_MAX_DEVICES];

    struct dray_kv_pool *view_pools; /* [n_layer] a view's copies (kv_view.c), else NULL */
};

static inline bool owns_kv(const struct dray_kv_desc *d, uint32_t il)
{
    return !d->share_with || d->share_with[il] < 0;
}

/* Device d's plugin's reason for its last failed call (for messages that also name it). */
static inline const char *why(const struct dray_kv *kv, uint32_t d)
{
    const struct dray_ops *o = kv->dev[d].ops;
    const char *w = o->last_error ? o->last_error(kv->dev[d].ctx) : NULL;
    return w && *w ? w : "no reason given";
}

static inline struct dray_view view_at(struct dray_buf *b, uint64_t off)
{
    struct dray_view v = {b, (size_t)off};
    return v;
}

static inline bool seq_ok(const struct dray_kv *kv, uint32_t id)
{
    return id < kv->d.max_seqs && kv->seq_used[id];
}

static inline int32_t *table_of(const struct dray_kv *kv, uint32_t g, uint32_t seq)
{
    return kv->group[g].tables + (size_t)seq * kv->max_bps;
}

/* A block goes back to the free list when its last holder lets go. */
static inline void unref(struct kv_group *gr, uint32_t b)
{
    if (--gr->ref[b] == 0)
        gr->free_list[gr->n_free++] = b;
}

/* Blocks of a window-w group that no query at position >= len can see:
 * block b is dead iff its last position (b+1)*bs-1 <= len - w. */
static inline uint32_t dead_blocks(uint32_t len, uint32_t w, uint32_t bs)
{
    return len + 1 > w ? (len + 1 - w) / bs : 0;
}

/* dray_kv_kept_from for a valid g: dead blocks measured from len's last block
 * boundary. */
static inline uint32_t kept_from(const struct dray_kv *kv, uint32_t g, uint32_t len)
{
    uint32_t w = kv->plan.group[g].window, bs = kv->d.block_size;
    return w ? dead_blocks(len / bs * bs, w, bs) : 0;
}

/* kv.c */
/* Is seq in the step begun and not yet ended (or aborted)? */
bool kv_in_step(const struct dray_kv *kv, uint32_t seq);
/* Give back table entries [from, to) of seq in group g that still hold a block. */
void kv_release_entries(struct dray_kv *kv, uint32_t g, uint32_t seq, uint32_t from,
                        uint32_t to);

/* kv_cow.c */
/* Table entry of seq's partial last block in group g if it is shared, else -1. */
int32_t kv_shared_tail(const struct dray_kv *kv, uint32_t g, uint32_t seq);
/* Give seq a private copy of its shared partial last block in group g (a free
 * block must be there: step_begin checked). */
int kv_unshare_tail(struct dray_kv *kv, uint32_t g, uint32_t seq);

/* kv_host.c */
/* The four regions of one block of one layer: device view, bytes. */
void kv_block_regions(const struct dray_kv *kv, const struct dray_kv_pool *pool, uint32_t block,
                      struct dray_view v[4], size_t n[4]);

#endif
