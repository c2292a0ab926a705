/*
 * KV manager: a paged KV cache for models whose layers attend differently
 * (global layers, sliding-window layers, layers that reuse another layer's KV).
 *
 * Layer groups. Layers are grouped by window (0 = global). All layers of a group
 * share ONE block structure: one block allocator and one block table per
 * sequence, because they see the same tokens at the same positions. The group
 * owns one device buffer that holds every layer's pool at a per-layer stride:
 *   buf = [layer 0 | layer 1 | ...], each layer_bytes long, each holding
 *         k [n_slots][n_kv_head][head_dim] dtype, v (same),
 *         k_scale, v_scale F32 [n_slots][n_kv_head] (I8 only),
 *   each region 256-byte aligned. Layer il's struct dray_kv_pool is a set of
 *   views into that buffer (see backend.h for the pool layout).
 * A layer with share_with[il] = j >= 0 owns no storage; it returns layer j's
 * pool and its step says store = false (the model skips kv_store for it).
 *
 * Window groups keep only what future queries can see: at step end, a block whose
 * every position j satisfies j <= L - window, where L is len rounded down to a
 * block boundary (a query at L sees j > L - window; keeping what it sees lets the
 * prefix cache checkpoint at L), goes back to the free list and its table entry
 * becomes -1. So a sequence holds at most ceil((window + chunk) / block_size) + 2
 * blocks of a window group while a step of chunk new tokens runs. Global groups
 * grow with the sequence.
 *
 * Block tables handed to attention always cover positions 0 .. kv_len-1 of every
 * sequence: entries of recycled window blocks are present and hold -1. This keeps
 * backend.h's promise "block_table[bt_start + p/block_size] addresses position p;
 * entries the mask never reaches may be -1" for every p < kv_len, so a kernel may
 * read the entry before it applies the mask (the padding costs 4 bytes per
 * block_size tokens per sequence; docs/design.md, "Designs tried and left").
 *
 * Steps. A forward pass is bracketed by dray_kv_step_begin (reserve slots for the
 * new tokens of each sequence in every group, build slots/seqs/block_table and
 * upload them in ONE transfer into one device metadata buffer) and
 * dray_kv_step_end (commit lengths, recycle window blocks) or dray_kv_step_abort
 * (give back what begin reserved). Between them, dray_kv_layer(kv, il) describes
 * layer il for kv_store and attention.
 *
 * Uploads: the metadata host staging area is rewritten at the next step_begin, so
 * the plugin's upload must have consumed its source by then (backend.h's queue
 * order makes the device side safe: the next upload runs after this step's ops).
 *
 * Devices. The pools of one model may live on several devices (a split over
 * plugins, core/split.h): desc.layer_dev names each layer's device, each group
 * keeps one buffer per device that holds its layers, and every touch of a pool
 * (copy on write, host copies) goes through the layer's own device. The block
 * structure stays one and device-agnostic; only the step metadata is uploaded
 * to every device that holds a layer.
 *
 * Micro-batches. dray_kv_step_begin_split cuts a step's sequences into
 * consecutive micro-batches, each with slots, seqs and block tables of its own
 * as if it were a step (q_start and bt_start restart at 0), so devices of a
 * split work on different micro-batches at once.
 *
 * Not thread-safe: one scheduler thread drives one dray_kv. During a step,
 * dray_kv_layer_mb may be called from several threads at once (pure reads).
 */
#ifndef DRAY_CORE_KV_H
#define DRAY_CORE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"

#define DRAY_KV_MAX_GROUPS 8      /* distinct window values in one model */
#define DRAY_KV_DEFAULT_CHUNK 512 /* tokens per sequence per step when desc.max_chunk = 0 */
#define DRAY_KV_MAX_DEVICES 8     /* devices one KV's pools may span */
#define DRAY_KV_MAX_MB 16         /* micro-batches in one step */

/* One device the pools live on: a plugin's op table and context. */
struct dray_kv_device {
    const struct dray_ops *ops;
    struct dray_ctx *ctx;
};

struct dray_kv_desc {
    uint32_t n_layer;
    const uint32_t *window;    /* [n_layer] tokens a query sees, 0 = global */
    const int32_t *share_with; /* [n_layer] earlier layer whose KV layer il reuses, -1 = own;
                                * NULL = every layer owns its KV. Same window required. */
    uint32_t n_kv_head, head_dim;
    uint32_t dtype;            /* DRAY_I8 (with f32 scales) or DRAY_F16 */
    uint32_t block_size;       /* tokens per block, >= 1 */
    uint32_t max_seqs;         /* live sequences at once */
    uint32_t max_ctx;          /* tokens per sequence */
    uint32_t max_chunk;        /* new tokens per sequence per step the window groups are
                                * sized for; 0 = DRAY_KV_DEFAULT_CHUNK (capped at max_ctx) */
    const uint8_t *layer_dev;  /* [n_layer] device of each layer's pools (dray_kv_create_on);
                                * NULL = all on device 0. A layer that shares KV must be on
                                * its target's device. Not kept after create. */
    uint64_t budget_bytes;     /* device bytes for all pools; 0 = enough for
                                * max_seqs sequences of max_ctx tokens */
};

/* What a desc costs, computed without touching a device (dray_kv_plan). */
struct dray_kv_group_plan {
    uint32_t window;         /* 0 = global */
    uint32_t n_layers;       /* layers with storage in this group */
    uint32_t n_blocks;       /* blocks allocated */
    uint32_t seq_blocks_max; /* most blocks one sequence can hold (window: the bound) */
    uint64_t layer_bytes;    /* per-layer stride in the group buffer */
    uint64_t block_bytes;    /* one block of all the group's layers (pool data only) */
};

struct dray_kv_plan {
    uint32_t n_group;
    struct dray_kv_group_plan group[DRAY_KV_MAX_GROUPS];
    uint64_t slot_bytes;           /* one token of one layer: k+v (+ scales) */
    uint64_t global_bytes_per_token; /* context growth cost: sum over global layers */
    uint64_t window_bytes_per_seq;   /* fixed cost of one sequence in all window groups */
    uint64_t total_bytes;            /* device bytes of all group buffers */
    uint32_t max_chunk;              /* effective chunk */
};

struct dray_kv_layer_step {
    const struct dray_kv_pool *pool; /* this layer's (or its share target's) pool */
    struct dray_view slots;       /* I32 [n_tok] slot of each new token, group-wide */
    struct dray_view seqs;        /* I32 [n_seq][4] {q_start, n_q, kv_len, bt_start} */
    struct dray_view block_table; /* I32, see backend.h dray_attention_args */
    uint32_t n_tok, n_seq;
    uint32_t max_kv_len;
    uint32_t window;              /* 0 = global; pass to attention */
    bool store;                   /* false: shares KV, skip kv_store */
};

struct dray_ctx;
struct dray_ops;
struct dray_kv;

/* Validate d and compute the group split, block counts and byte totals. Fails
 * (DRAY_EINVAL / DRAY_ERANGE with a reason) when the desc is malformed or the
 * budget cannot hold one sequence of max_ctx tokens. */
int dray_kv_plan(const struct dray_kv_desc *d, struct dray_kv_plan *p, char *err, size_t errlen);
/* How many sequences of seq_len tokens fit in a plan (<= max_seqs). */
uint32_t dray_kv_plan_capacity(const struct dray_kv_plan *p, const struct dray_kv_desc *d,
                               uint32_t seq_len);

/* Allocate every group's buffer through ops on ctx. On failure *out is NULL. */
int dray_kv_create(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_kv_desc *d,
                   struct dray_kv **out, char *err, size_t errlen);
/* The same over n_dev (1..DRAY_KV_MAX_DEVICES) devices, each layer's pools on
 * devs[d->layer_dev[il]]. DRAY_EINVAL naming the layer for a bad layer_dev. */
int dray_kv_create_on(const struct dray_kv_device *devs, uint32_t n_dev, const struct dray_kv_desc *d,
                      struct dray_kv **out, char *err, size_t errlen);
void dray_kv_free(struct dray_kv *kv);
/* Pool bytes (every group) on device dev; 0 for a bad index. They sum to the
 * plan's total_bytes. */
uint64_t dray_kv_device_bytes(const struct dray_kv *kv, uint32_t dev);
const struct dray_kv_plan *dray_kv_get_plan(const struct dray_kv *kv);
uint32_t dray_kv_capacity(const struct dray_kv *kv, uint32_t seq_len);

/* Sequences. Ids are small integers < max_seqs, reused after free. */
int dray_kv_seq_new(struct dray_kv *kv, uint32_t *seq_id);       /* DRAY_ENOMEM when full */
void dray_kv_seq_free(struct dray_kv *kv, uint32_t seq_id);      /* ignores unknown ids */
uint32_t dray_kv_seq_len(const struct dray_kv *kv, uint32_t seq_id); /* 0 for unknown ids */
/* Drop positions >= new_len. DRAY_ERANGE if new_len > len, or if a window group
 * already recycled a block the next query (at new_len) would need. */
int dray_kv_seq_truncate(struct dray_kv *kv, uint32_t seq_id, uint32_t new_len);

/* Tokens per block (the same in every group). */
uint32_t dray_kv_block_size(const struct dray_kv *kv);
/* Blocks free now in group g (for tests and the scheduler). */
uint32_t dray_kv_group_free_blocks(const struct dray_kv *kv, uint32_t g);
/* Blocks sequence seq holds in group g. */
uint32_t dray_kv_seq_blocks(const struct dray_kv *kv, uint32_t seq_id, uint32_t g);
/* Group of layer il (of its share target for shared layers). */
uint32_t dray_kv_layer_group(const struct dray_kv *kv, uint32_t il);

/* Reserve slots for n_new[i] (>= 1) tokens at the end of sequence seq_ids[i] in
 * every group and upload the step's metadata. DRAY_ENOMEM when a group runs out of
 * blocks: nothing is changed, so the caller can preempt a sequence and retry.
 * DRAY_ERANGE when a sequence would exceed max_ctx. */
int dray_kv_step_begin(struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                       const uint32_t *n_new, char *err, size_t errlen);
/* The same, the sequences cut into n_mb (1..DRAY_KV_MAX_MB, <= n_seq) micro-
 * batches: micro-batch i holds sequences [mb_end[i-1], mb_end[i]) (mb_end[-1] =
 * 0), strictly ascending, mb_end[n_mb-1] = n_seq; DRAY_EINVAL otherwise, with
 * nothing reserved. Blocks, copy on write, end and abort are the whole step's. */
int dray_kv_step_begin_split(struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                             const uint32_t *n_new, uint32_t n_mb, const uint32_t *mb_end, char *err,
                             size_t errlen);
/* Layer il's view of the current step (micro-batch 0); NULL outside a step or
 * for a bad il. */
const struct dray_kv_layer_step *dray_kv_layer(const struct dray_kv *kv, uint32_t il);
/* Layer il's view of micro-batch mb: its pool on the layer's device, the
 * arrays in that device's metadata buffer. NULL outside a step or for a bad il
 * or mb. Valid until step_end or step_abort; safe from several threads. */
const struct dray_kv_layer_step *dray_kv_layer_mb(const struct dray_kv *kv, uint32_t il, uint32_t mb);
/* Micro-batches of the current step, 0 outside a step. */
uint32_t dray_kv_step_mbs(const struct dray_kv *kv);
/* Host copies of group g's step arrays of micro-batch mb (tests, host kernels). */
const int32_t *dray_kv_step_host_mb(const struct dray_kv *kv, uint32_t g, uint32_t mb, const int32_t **seqs,
                                    const int32_t **block_table, uint32_t *n_bt);
/* Host copies of group g's step arrays (micro-batch 0; for tests and host-side kernels). */
const int32_t *dray_kv_step_host(const struct dray_kv *kv, uint32_t g, const int32_t **seqs,
                                 const int32_t **block_table, uint32_t *n_bt);
/* A view: no blocks or sequences, only one step's layer views that someone
 * else computed (another rank's KV, core/dist.h), for a model's forward to read
 * through dray_kv_layer. dray_kv_free frees it. */
int dray_kv_view_new(uint32_t n_layer, struct dray_kv **out);
/* Layer il's view: a copy of st, its pool a copy of *pool (NULL: none). */
void dray_kv_view_set(struct dray_kv *kv, uint32_t il, const struct dray_kv_layer_step *st,
                      const struct dray_kv_pool *pool);

/* Commit the step: lengths grow by n_new, window blocks out of reach are freed. */
void dray_kv_step_end(struct dray_kv *kv);
/* Undo step_begin (the forward pass failed): reserved blocks go back. */
void dray_kv_step_abort(struct dray_kv *kv);


/* ------------------------------------------------------------ shared blocks
 * Blocks are reference counted: every sequence table entry holding a block is
 * one reference, and the prefix cache may hold more. A block returns to the free
 * list when its count reaches 0. A sequence writes only at positions >= its
 * length: full blocks below it are never written again; a partial last block may
 * be shared (the prefix cache keeps the tail of a finished request and hands it
 * to the next one), and step_begin gives a sequence its own copy of it (through
 * the plugin's copy op) before writing into it: copy on write. */

/* Called when a step (or dray_kv_block_alloc) needs `need` more blocks than group
 * g has free; the callback drops references (evicts cached blocks) if it can. */
typedef void (*dray_kv_reclaim_fn)(void *user, uint32_t g, uint32_t need);
void dray_kv_set_reclaim(struct dray_kv *kv, dray_kv_reclaim_fn fn, void *user);
/* Block of table entry `entry` (positions entry*bs ..) of a sequence in group g,
 * or -1 (none, recycled, or bad arguments). */
int32_t dray_kv_seq_block(const struct dray_kv *kv, uint32_t seq_id, uint32_t g, uint32_t entry);
void dray_kv_block_ref(struct dray_kv *kv, uint32_t g, uint32_t block);
void dray_kv_block_unref(struct dray_kv *kv, uint32_t g, uint32_t block);
uint32_t dray_kv_block_refs(const struct dray_kv *kv, uint32_t g, uint32_t block);
/* Free blocks in group g after asking the reclaim callback for up to `want`. */
uint32_t dray_kv_make_free(struct dray_kv *kv, uint32_t g, uint32_t want);
/* A fresh block with one reference (the caller's). DRAY_ENOMEM when none is free
 * even after reclaiming. */
int dray_kv_block_alloc(struct dray_kv *kv, uint32_t g, uint32_t *block);
/* Copies on write so far (one block of one group each) and the host time they
 * took (the copy op is queued, so on an asynchronous device this is the issue
 * time; the copy itself runs with the step). */
void dray_kv_cow_stats(const struct dray_kv *kv, uint64_t *copies, double *seconds);
/* First table entry a sequence of length len still needs in group g (0 for
 * global groups; window groups drop entries no future query can see). */
uint32_t dray_kv_live_from(const struct dray_kv *kv, uint32_t g, uint32_t len);
/* The window arithmetic of checkpoints, in one place. A sequence of len tokens
 * keeps in group g the table entries from dray_kv_kept_from(g, len) on, which is
 * dray_kv_live_from(g, len / bs * bs): what a query at len's last block boundary
 * sees, since step_end recycles from there (0 for global groups). A checkpoint
 * of len tokens holds these blocks. */
uint32_t dray_kv_kept_from(const struct dray_kv *kv, uint32_t g, uint32_t len);
/* Whether a window group lets go of a block between lengths a and b (the kept
 * entries differ): a sequence grown from a to b cannot be truncated back to a. */
bool dray_kv_window_moves(const struct dray_kv *kv, uint32_t a, uint32_t b);
/* The most tokens two consecutive checkpoints of a sequence may lie apart and
 * still serve every length between them: the blocks the later one holds start
 * at or before the earlier one's block when c2 - c1 <= window + bs - 2 (a query
 * at L keeps the positions > L - window), for the narrowest window group; 0
 * without window groups. */
uint32_t dray_kv_ckpt_gap(const struct dray_kv *kv);
/* Give an empty sequence the first len tokens from shared blocks: blocks[g][e]
 * for entries dray_kv_kept_from(g, len) .. ceil(len / bs) - 1 of every
 * group (each gains a reference). When len is not block-aligned the last block
 * is partial: its positions >= len % bs are overwritten by the sequence, after
 * the copy on write of step_begin. DRAY_EINVAL if the sequence is not empty or a
 * block id is out of range. */
int dray_kv_seq_attach(struct dray_kv *kv, uint32_t seq_id, uint32_t len,
                       const int32_t *const *blocks);

/* ------------------------------------------------------------ host copies
 * A block's KV in a vendor-neutral host layout, so a block one plugin wrote can
 * be loaded by another: for each storage layer of group g, in layer order,
 *     K  [block_size][n_kv_head][head_dim]  dtype (int8 or f16)
 *     V  [block_size][n_kv_head][head_dim]  dtype
 *     (int8 only) K scales [block_size][n_kv_head] f32, then V scales (same)
 * The numbers that define it are dray_kv_layout; two KV managers with the same
 * layout and group layer count read each other's copies. */
struct dray_kv_layout {
    uint32_t dtype, block_size, n_kv_head, head_dim;
};
void dray_kv_get_layout(const struct dray_kv *kv, struct dray_kv_layout *l);
uint64_t dray_kv_block_host_bytes(const struct dray_kv *kv, uint32_t g);
/* Copy block `block` of group g to host (dray_kv_block_host_bytes bytes) and back.
 * DRAY_EBACKEND when the plugin's transfer fails. */
int dray_kv_block_download(struct dray_kv *kv, uint32_t g, uint32_t block, void *host);
int dray_kv_block_upload(struct dray_kv *kv, uint32_t g, uint32_t block, const void *host);

#endif
