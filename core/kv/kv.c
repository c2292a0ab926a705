/* KV manager: layer groups, block allocation, per-step metadata. See kv.h. */
#include "kv.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

#define KV_ALIGN 256u /* region alignment inside a group buffer, bytes */
#define META_ALIGN 64u /* array alignment inside the metadata buffer, bytes */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
static uint32_t div_up(uint64_t a, uint32_t b) { return (uint32_t)((a + b - 1) / b); }

/* ------------------------------------------------------------------ state */

struct kv_group {
    struct dray_buf *buf;       /* [n_layers][layer_bytes] */
    struct dray_kv_pool *pools; /* [n_layers] views into buf */
    uint32_t *free_list;        /* stack of free block ids */
    uint32_t n_free;
    uint32_t *ref;              /* [n_blocks] holders: sequences' tables + the prefix cache */
    int32_t *tables;     /* [max_seqs][max_bps] logical block -> block id, -1 = none */
    uint32_t *first_live; /* [max_seqs] first table entry not recycled (window groups) */
    uint32_t *held;       /* [max_seqs] blocks the sequence holds now */
    /* current step, byte offsets into the metadata buffer / host staging */
    size_t off_slots, off_seqs, off_bt;
    uint32_t n_bt;
};

struct dray_kv {
    const struct dray_ops *ops;
    struct dray_ctx *ctx;
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
    uint32_t *step_ids; /* [max_seqs] */
    uint32_t *step_new; /* [max_seqs] */
    uint8_t *mark;      /* [max_seqs] duplicate check scratch */
    struct dray_kv_layer_step *lsteps; /* [n_layer] */

    uint64_t cow_copies; /* shared partial blocks copied before a write */
    double cow_s;        /* host time spent issuing (and, without a copy op, doing) them */

    dray_kv_reclaim_fn reclaim; /* asked for blocks before a step fails (prefix cache) */
    void *reclaim_user;

    unsigned char *meta_host; /* staging for the one upload per step */
    size_t meta_host_cap;
    struct dray_buf *meta_buf;
    size_t meta_buf_cap;
};

/* ----------------------------------------------------------------- plan */

static uint32_t el_size(uint32_t dtype) { return dtype == DRAY_F16 ? 2 : 1; }

static uint64_t slot_bytes(const struct dray_kv_desc *d)
{
    uint64_t kv = 2ull * d->n_kv_head * d->head_dim * el_size(d->dtype);
    return kv + (d->dtype == DRAY_I8 ? 2ull * d->n_kv_head * sizeof(float) : 0);
}

/* Per-layer stride of a group buffer holding n_blocks blocks (regions aligned). */
static uint64_t layer_bytes(const struct dray_kv_desc *d, uint32_t n_blocks)
{
    uint64_t n_slots = (uint64_t)n_blocks * d->block_size;
    uint64_t b = 2 * align_up(n_slots * d->n_kv_head * d->head_dim * el_size(d->dtype), KV_ALIGN);
    if (d->dtype == DRAY_I8)
        b += 2 * align_up(n_slots * d->n_kv_head * sizeof(float), KV_ALIGN);
    return b;
}

static int check_desc(const struct dray_kv_desc *d, char *err, size_t errlen)
{
    if (!d || !d->window || d->n_layer == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: desc needs n_layer >= 1 and a window array");
    if (d->dtype != DRAY_I8 && d->dtype != DRAY_F16)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: dtype %u, expected DRAY_I8 or DRAY_F16",
                         d->dtype);
    if (!d->n_kv_head || !d->head_dim || !d->block_size || !d->max_seqs || !d->max_ctx)
        return dray_fail(err, errlen, DRAY_EINVAL,
                         "kv: n_kv_head %u, head_dim %u, block_size %u, max_seqs %u, max_ctx %u "
                         "must all be >= 1",
                         d->n_kv_head, d->head_dim, d->block_size, d->max_seqs, d->max_ctx);
    for (uint32_t il = 0; d->share_with && il < d->n_layer; il++) {
        int32_t j = d->share_with[il];
        if (j < -1 || j >= (int32_t)il)
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "kv: share_with[%u] = %d, expected -1 or an earlier layer", il, j);
        if (j >= 0 && d->share_with[j] != -1)
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "kv: share_with[%u] = %d, but layer %d itself shares; point at the "
                             "owner",
                             il, j, j);
        if (j >= 0 && d->window[j] != d->window[il])
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "kv: layer %u (window %u) shares with layer %d (window %u); windows "
                             "must match",
                             il, d->window[il], j, d->window[j]);
    }
    return 0;
}

/* Group index of a window value among the storage layers, creating it if new. */
static int group_of(struct dray_kv_plan *p, uint32_t window)
{
    for (uint32_t g = 0; g < p->n_group; g++)
        if (p->group[g].window == window)
            return (int)g;
    if (p->n_group == DRAY_KV_MAX_GROUPS)
        return -1;
    p->group[p->n_group].window = window;
    return (int)p->n_group++;
}

static bool owns_kv(const struct dray_kv_desc *d, uint32_t il)
{
    return !d->share_with || d->share_with[il] < 0;
}

/* Budget split: window groups are bounded per sequence, so they get what max_seqs
 * sequences need (or, under a tight budget, what as many full-length sequences as
 * the budget holds need); the global group takes the rest, up to max_seqs x max_ctx. */
static int split_budget(const struct dray_kv_desc *d, struct dray_kv_plan *p, char *err,
                        size_t errlen)
{
    uint64_t win_seq = 0, glob_seq = 0;
    int glob = -1;
    for (uint32_t g = 0; g < p->n_group; g++) {
        uint64_t b = (uint64_t)p->group[g].seq_blocks_max * p->group[g].block_bytes;
        if (p->group[g].window)
            win_seq += b;
        else {
            glob_seq += b;
            glob = (int)g;
        }
    }
    uint64_t n_w = d->max_seqs, glob_blocks_max = 0;
    if (glob >= 0)
        glob_blocks_max = (uint64_t)d->max_seqs * p->group[glob].seq_blocks_max;
    if (d->budget_bytes) {
        if (d->budget_bytes < win_seq + glob_seq)
            return dray_fail(err, errlen, DRAY_ERANGE,
                             "kv: budget of %llu bytes cannot hold one sequence of max_ctx %u "
                             "tokens (needs %llu: %llu in window layers, %llu in global layers)",
                             (unsigned long long)d->budget_bytes, d->max_ctx,
                             (unsigned long long)(win_seq + glob_seq),
                             (unsigned long long)win_seq, (unsigned long long)glob_seq);
        if (glob < 0)
            n_w = d->budget_bytes / win_seq;
        else if (d->budget_bytes < n_w * win_seq + glob_seq)
            n_w = d->budget_bytes / (win_seq + glob_seq);
        if (n_w > d->max_seqs)
            n_w = d->max_seqs;
        if (glob >= 0) {
            uint64_t rest = (d->budget_bytes - n_w * win_seq) / p->group[glob].block_bytes;
            if (rest < glob_blocks_max)
                glob_blocks_max = rest;
        }
    }
    for (uint32_t g = 0; g < p->n_group; g++) {
        uint64_t nb = p->group[g].window ? n_w * p->group[g].seq_blocks_max : glob_blocks_max;
        if (nb > INT32_MAX / d->block_size)
            return dray_fail(err, errlen, DRAY_ERANGE,
                             "kv: group with window %u needs %llu blocks of %u tokens; slot ids "
                             "must fit in int32",
                             p->group[g].window, (unsigned long long)nb, d->block_size);
        p->group[g].n_blocks = (uint32_t)nb;
    }
    return 0;
}

int dray_kv_plan(const struct dray_kv_desc *d, struct dray_kv_plan *p, char *err, size_t errlen)
{
    int rc = check_desc(d, err, errlen);
    if (rc)
        return rc;
    memset(p, 0, sizeof(*p));
    p->slot_bytes = slot_bytes(d);
    p->max_chunk = d->max_chunk ? d->max_chunk
                                : (d->max_ctx < DRAY_KV_DEFAULT_CHUNK ? d->max_ctx
                                                                      : DRAY_KV_DEFAULT_CHUNK);
    uint32_t max_bps = div_up(d->max_ctx, d->block_size);
    for (uint32_t il = 0; il < d->n_layer; il++) {
        if (!owns_kv(d, il))
            continue;
        int g = group_of(p, d->window[il]);
        if (g < 0)
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "kv: more than %d distinct window values (layer %u)",
                             DRAY_KV_MAX_GROUPS, il);
        p->group[g].n_layers++;
    }
    for (uint32_t g = 0; g < p->n_group; g++) {
        struct dray_kv_group_plan *gp = &p->group[g];
        gp->block_bytes = (uint64_t)gp->n_layers * d->block_size * p->slot_bytes;
        gp->seq_blocks_max = max_bps;
        if (gp->window) {
            /* +2: a partial block at each end, and one more kept alive from the
             * last block boundary (step_end) */
            uint32_t bound = div_up((uint64_t)gp->window + p->max_chunk, d->block_size) + 2;
            if (bound < max_bps)
                gp->seq_blocks_max = bound;
        }
    }
    rc = split_budget(d, p, err, errlen);
    if (rc)
        return rc;
    for (uint32_t g = 0; g < p->n_group; g++) {
        struct dray_kv_group_plan *gp = &p->group[g];
        gp->layer_bytes = layer_bytes(d, gp->n_blocks);
        p->total_bytes += gp->layer_bytes * gp->n_layers;
        if (gp->window)
            p->window_bytes_per_seq += (uint64_t)gp->seq_blocks_max * gp->block_bytes;
        else
            p->global_bytes_per_token += gp->n_layers * p->slot_bytes;
    }
    return 0;
}

uint32_t dray_kv_plan_capacity(const struct dray_kv_plan *p, const struct dray_kv_desc *d,
                               uint32_t seq_len)
{
    if (seq_len == 0 || seq_len > d->max_ctx)
        return 0;
    uint64_t cap = d->max_seqs;
    for (uint32_t g = 0; g < p->n_group; g++) {
        uint32_t need = div_up(seq_len, d->block_size);
        if (need > p->group[g].seq_blocks_max)
            need = p->group[g].seq_blocks_max;
        uint64_t n = p->group[g].n_blocks / need;
        if (n < cap)
            cap = n;
    }
    return (uint32_t)cap;
}

/* -------------------------------------------------------------- create/free */

static void group_release(struct dray_kv *kv, struct kv_group *gr)
{
    if (gr->buf)
        kv->ops->free(kv->ctx, gr->buf);
    free(gr->pools);
    free(gr->free_list);
    free(gr->ref);
    free(gr->tables);
    free(gr->first_live);
    free(gr->held);
}

void dray_kv_free(struct dray_kv *kv)
{
    if (!kv)
        return;
    if (kv->ops->synchronize)
        kv->ops->synchronize(kv->ctx); /* no queued op may still use our buffers */
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        group_release(kv, &kv->group[g]);
    if (kv->meta_buf)
        kv->ops->free(kv->ctx, kv->meta_buf);
    free(kv->layer_group);
    free(kv->layer_index);
    free(kv->layer_store);
    free(kv->seq_len);
    free(kv->seq_used);
    free(kv->free_ids);
    free(kv->step_ids);
    free(kv->step_new);
    free(kv->mark);
    free(kv->lsteps);
    free(kv->meta_host);
    free(kv);
}

/* The plugin's reason for its last failed call (for messages that also name it). */
static const char *why(const struct dray_kv *kv)
{
    const char *w = kv->ops->last_error ? kv->ops->last_error(kv->ctx) : NULL;
    return w && *w ? w : "no reason given";
}

static struct dray_view view_at(struct dray_buf *b, uint64_t off)
{
    struct dray_view v = {b, (size_t)off};
    return v;
}

/* Device buffer and host tables of group g. */
static int group_init(struct dray_kv *kv, uint32_t g, char *err, size_t errlen)
{
    const struct dray_kv_desc *d = &kv->d;
    const struct dray_kv_group_plan *gp = &kv->plan.group[g];
    struct kv_group *gr = &kv->group[g];
    size_t n_tab = (size_t)d->max_seqs * kv->max_bps;
    gr->pools = calloc(gp->n_layers, sizeof(*gr->pools));
    gr->free_list = malloc(sizeof(*gr->free_list) * gp->n_blocks);
    gr->ref = calloc(gp->n_blocks ? gp->n_blocks : 1, sizeof(*gr->ref));
    gr->tables = malloc(sizeof(*gr->tables) * n_tab);
    gr->first_live = calloc(d->max_seqs, sizeof(*gr->first_live));
    gr->held = calloc(d->max_seqs, sizeof(*gr->held));
    if (!gr->pools || !gr->free_list || !gr->ref || !gr->tables || !gr->first_live || !gr->held)
        return dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory for group tables");
    for (size_t i = 0; i < n_tab; i++)
        gr->tables[i] = -1;
    for (uint32_t b = 0; b < gp->n_blocks; b++) /* pops hand out 0, 1, 2, ... */
        gr->free_list[b] = gp->n_blocks - 1 - b;
    gr->n_free = gp->n_blocks;

    uint64_t total = gp->layer_bytes * gp->n_layers;
    if (kv->ops->alloc(kv->ctx, (size_t)total, &gr->buf) || !gr->buf) {
        gr->buf = NULL;
        return dray_fail(err, errlen, DRAY_ENOMEM,
                         "kv: device allocation of %llu bytes for %u layers (window %u) on %s failed: %s",
                         (unsigned long long)total, gp->n_layers, gp->window, kv->ops->name, why(kv));
    }
    /* Zeroed so that a kernel reading a never-written slot sees 0, not NaN. */
    if (kv->ops->fill && kv->ops->fill(kv->ctx, view_at(gr->buf, 0), 0, (size_t)total))
        return dray_fail(err, errlen, DRAY_EBACKEND, "kv: clearing the window-%u pool on %s failed: %s",
                         gp->window, kv->ops->name, why(kv));

    uint64_t n_slots = (uint64_t)gp->n_blocks * d->block_size;
    uint64_t kbytes = align_up(n_slots * d->n_kv_head * d->head_dim * el_size(d->dtype), KV_ALIGN);
    uint64_t sbytes = align_up(n_slots * d->n_kv_head * sizeof(float), KV_ALIGN);
    for (uint32_t li = 0; li < gp->n_layers; li++) {
        struct dray_kv_pool *pool = &gr->pools[li];
        uint64_t base = li * gp->layer_bytes;
        pool->k = view_at(gr->buf, base);
        pool->v = view_at(gr->buf, base + kbytes);
        if (d->dtype == DRAY_I8) {
            pool->k_scale = view_at(gr->buf, base + 2 * kbytes);
            pool->v_scale = view_at(gr->buf, base + 2 * kbytes + sbytes);
        }
        pool->dtype = d->dtype;
        pool->n_kv_head = d->n_kv_head;
        pool->head_dim = d->head_dim;
        pool->block_size = d->block_size;
        pool->n_slots = (uint32_t)n_slots;
    }
    return 0;
}

/* Per-layer maps: group, index inside the group, store flag. */
static void map_layers(struct dray_kv *kv, const struct dray_kv_desc *d)
{
    uint32_t count[DRAY_KV_MAX_GROUPS] = {0};
    for (uint32_t il = 0; il < d->n_layer; il++) {
        if (!owns_kv(d, il)) {
            uint32_t j = (uint32_t)d->share_with[il];
            kv->layer_group[il] = kv->layer_group[j];
            kv->layer_index[il] = kv->layer_index[j];
            continue;
        }
        uint32_t g = 0;
        while (kv->plan.group[g].window != d->window[il])
            g++;
        kv->layer_group[il] = g;
        kv->layer_index[il] = count[g]++;
        kv->layer_store[il] = 1;
    }
}

static int kv_alloc_host(struct dray_kv *kv)
{
    uint32_t n = kv->d.n_layer, s = kv->d.max_seqs;
    kv->layer_group = calloc(n, sizeof(uint32_t));
    kv->layer_index = calloc(n, sizeof(uint32_t));
    kv->layer_store = calloc(n, 1);
    kv->lsteps = calloc(n, sizeof(*kv->lsteps));
    kv->seq_len = calloc(s, sizeof(uint32_t));
    kv->seq_used = calloc(s, 1);
    kv->free_ids = calloc(s, sizeof(uint32_t));
    kv->step_ids = calloc(s, sizeof(uint32_t));
    kv->step_new = calloc(s, sizeof(uint32_t));
    kv->mark = calloc(s, 1);
    if (!kv->layer_group || !kv->layer_index || !kv->layer_store || !kv->lsteps || !kv->seq_len ||
        !kv->seq_used || !kv->free_ids || !kv->step_ids || !kv->step_new || !kv->mark)
        return DRAY_ENOMEM;
    for (uint32_t i = 0; i < s; i++) /* pops hand out 0, 1, 2, ... */
        kv->free_ids[i] = s - 1 - i;
    kv->n_free_ids = s;
    return 0;
}

int dray_kv_create(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_kv_desc *d,
                   struct dray_kv **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!ops || !ops->alloc || !ops->free || !ops->upload)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: op table lacks alloc/free/upload");
    struct dray_kv *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory");
    kv->ops = ops;
    kv->ctx = ctx;
    int rc = dray_kv_plan(d, &kv->plan, err, errlen);
    if (rc) {
        free(kv);
        return rc;
    }
    kv->d = *d;
    kv->d.window = NULL;
    kv->d.share_with = NULL;
    kv->max_bps = div_up(d->max_ctx, d->block_size);
    if (kv_alloc_host(kv)) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory for %u sequences",
                       d->max_seqs);
        goto out_free;
    }
    map_layers(kv, d);
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        rc = group_init(kv, g, err, errlen);
        if (rc)
            goto out_free;
    }
    *out = kv;
    return 0;
out_free:
    dray_kv_free(kv);
    return rc;
}

const struct dray_kv_plan *dray_kv_get_plan(const struct dray_kv *kv) { return &kv->plan; }

uint32_t dray_kv_capacity(const struct dray_kv *kv, uint32_t seq_len)
{
    return dray_kv_plan_capacity(&kv->plan, &kv->d, seq_len);
}

uint32_t dray_kv_block_size(const struct dray_kv *kv) { return kv->d.block_size; }

uint32_t dray_kv_group_free_blocks(const struct dray_kv *kv, uint32_t g)
{
    return g < kv->plan.n_group ? kv->group[g].n_free : 0;
}

static bool seq_ok(const struct dray_kv *kv, uint32_t id)
{
    return id < kv->d.max_seqs && kv->seq_used[id];
}

uint32_t dray_kv_seq_blocks(const struct dray_kv *kv, uint32_t seq_id, uint32_t g)
{
    return g < kv->plan.n_group && seq_ok(kv, seq_id) ? kv->group[g].held[seq_id] : 0;
}

uint32_t dray_kv_layer_group(const struct dray_kv *kv, uint32_t il)
{
    return il < kv->d.n_layer ? kv->layer_group[il] : 0;
}

/* ------------------------------------------------------------- sequences */

static int32_t *table_of(const struct dray_kv *kv, uint32_t g, uint32_t seq)
{
    return kv->group[g].tables + (size_t)seq * kv->max_bps;
}

/* A block goes back to the free list when its last holder lets go. */
static void unref(struct kv_group *gr, uint32_t b)
{
    if (--gr->ref[b] == 0)
        gr->free_list[gr->n_free++] = b;
}

/* Give back table entries [from, to) of seq in group g that still hold a block. */
static void release_entries(struct dray_kv *kv, uint32_t g, uint32_t seq, uint32_t from,
                            uint32_t to)
{
    struct kv_group *gr = &kv->group[g];
    int32_t *t = table_of(kv, g, seq);
    for (uint32_t e = to; e-- > from;) {
        if (t[e] < 0)
            continue;
        unref(gr, (uint32_t)t[e]);
        t[e] = -1;
        gr->held[seq]--;
    }
}

int dray_kv_seq_new(struct dray_kv *kv, uint32_t *seq_id)
{
    if (!kv->n_free_ids)
        return DRAY_ENOMEM;
    uint32_t id = kv->free_ids[--kv->n_free_ids];
    kv->seq_used[id] = 1;
    kv->seq_len[id] = 0;
    *seq_id = id;
    return 0;
}

static bool in_current_step(const struct dray_kv *kv, uint32_t seq)
{
    for (uint32_t i = 0; kv->in_step && i < kv->step_n_seq; i++)
        if (kv->step_ids[i] == seq)
            return true;
    return false;
}

void dray_kv_seq_free(struct dray_kv *kv, uint32_t seq_id)
{
    if (!seq_ok(kv, seq_id) || in_current_step(kv, seq_id))
        return;
    uint32_t n_ent = div_up(kv->seq_len[seq_id], kv->d.block_size);
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        release_entries(kv, g, seq_id, 0, n_ent);
        kv->group[g].first_live[seq_id] = 0;
    }
    kv->seq_used[seq_id] = 0;
    kv->seq_len[seq_id] = 0;
    kv->free_ids[kv->n_free_ids++] = seq_id;
}

uint32_t dray_kv_seq_len(const struct dray_kv *kv, uint32_t seq_id)
{
    return seq_ok(kv, seq_id) ? kv->seq_len[seq_id] : 0;
}

/* Blocks of a window-w group that no query at position >= len can see:
 * block b is dead iff its last position (b+1)*bs-1 <= len - w. */
static uint32_t dead_blocks(uint32_t len, uint32_t w, uint32_t bs)
{
    return len + 1 > w ? (len + 1 - w) / bs : 0;
}

int dray_kv_seq_truncate(struct dray_kv *kv, uint32_t seq_id, uint32_t new_len)
{
    if (!seq_ok(kv, seq_id) || in_current_step(kv, seq_id))
        return DRAY_EINVAL;
    uint32_t len = kv->seq_len[seq_id], bs = kv->d.block_size;
    if (new_len > len)
        return DRAY_ERANGE;
    for (uint32_t g = 0; new_len && g < kv->plan.n_group; g++) {
        uint32_t w = kv->plan.group[g].window;
        if (w && dead_blocks(new_len, w, bs) < kv->group[g].first_live[seq_id])
            return DRAY_ERANGE; /* the window at new_len reaches a recycled block */
    }
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        release_entries(kv, g, seq_id, div_up(new_len, bs), div_up(len, bs));
        if (!new_len)
            kv->group[g].first_live[seq_id] = 0;
    }
    kv->seq_len[seq_id] = new_len;
    return 0;
}

/* ------------------------------------------------------------------ steps */

static int step_check(struct dray_kv *kv, uint32_t n_seq, const uint32_t *ids, const uint32_t *n_new,
                      char *err, size_t errlen)
{
    if (kv->in_step)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: step_begin inside a step (call step_end)");
    if (n_seq == 0 || n_seq > kv->d.max_seqs || !ids || !n_new)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: step of %u sequences, expected 1..%u",
                         n_seq, kv->d.max_seqs);
    int rc = 0;
    uint64_t n_tok = 0;
    for (uint32_t i = 0; i < n_seq; i++)
        n_tok += n_new[i];
    if (n_tok > INT32_MAX)
        return dray_fail(err, errlen, DRAY_ERANGE, "kv: step of %llu tokens is too large",
                         (unsigned long long)n_tok);
    for (uint32_t i = 0; i < n_seq && !rc; i++) {
        if (!seq_ok(kv, ids[i]))
            rc = dray_fail(err, errlen, DRAY_EINVAL, "kv: step entry %u: no sequence %u", i, ids[i]);
        else if (kv->mark[ids[i]])
            rc = dray_fail(err, errlen, DRAY_EINVAL, "kv: sequence %u appears twice in a step",
                           ids[i]);
        else if (n_new[i] == 0)
            rc = dray_fail(err, errlen, DRAY_EINVAL, "kv: sequence %u: n_new is 0", ids[i]);
        else if ((uint64_t)kv->seq_len[ids[i]] + n_new[i] > kv->d.max_ctx)
            rc = dray_fail(err, errlen, DRAY_ERANGE,
                           "kv: sequence %u: %u + %u tokens exceed max_ctx %u", ids[i],
                           kv->seq_len[ids[i]], n_new[i], kv->d.max_ctx);
        else
            kv->mark[ids[i]] = 1;
    }
    for (uint32_t i = 0; i < n_seq; i++)
        if (ids[i] < kv->d.max_seqs)
            kv->mark[ids[i]] = 0;
    return rc;
}

/* Copy on write. A block may be shared (the prefix cache hands out, and keeps,
 * the partial last block of a prefix); a sequence about to write into it gets
 * its own copy first, so no holder ever sees another's writes. The only block a
 * step can write into that already exists is the one holding position len when
 * len is not block-aligned (later positions go to fresh blocks). */

/* Table entry of seq's partial last block in group g if it is shared, else -1. */
static int32_t shared_tail(const struct dray_kv *kv, uint32_t g, uint32_t seq)
{
    uint32_t len = kv->seq_len[seq], bs = kv->d.block_size;
    if (len % bs == 0)
        return -1;
    int32_t b = table_of(kv, g, seq)[len / bs];
    return b >= 0 && kv->group[g].ref[b] > 1 ? (int32_t)(len / bs) : -1;
}

static void block_regions(const struct dray_kv *kv, const struct dray_kv_pool *pool, uint32_t block,
                          struct dray_view v[4], size_t n[4]);

/* Device copy of block src into block dst of group g, every layer: through the
 * plugin's copy, or download + upload where a plugin has none. */
static int block_copy(struct dray_kv *kv, uint32_t g, uint32_t dst, uint32_t src)
{
    unsigned char *tmp = NULL;
    int rc = 0;
    for (uint32_t li = 0; li < kv->plan.group[g].n_layers && !rc; li++) {
        struct dray_view vd[4], vs[4];
        size_t n[4];
        block_regions(kv, &kv->group[g].pools[li], dst, vd, n);
        block_regions(kv, &kv->group[g].pools[li], src, vs, n);
        for (int i = 0; i < 4 && !rc; i++) {
            if (!n[i])
                continue;
            if (kv->ops->copy) {
                rc = kv->ops->copy(kv->ctx, vd[i], vs[i], n[i]);
                continue;
            }
            if (!tmp && !(tmp = malloc(n[0])))
                return DRAY_ENOMEM;
            rc = kv->ops->download(kv->ctx, tmp, vs[i], n[i]) ||
                 kv->ops->upload(kv->ctx, vd[i], tmp, n[i]) ||
                 (kv->ops->synchronize && kv->ops->synchronize(kv->ctx));
        }
    }
    free(tmp);
    return rc ? DRAY_EBACKEND : 0;
}

/* Give seq a private copy of its shared partial last block in group g (a free
 * block must be there: step_begin checked). */
static int unshare_tail(struct dray_kv *kv, uint32_t g, uint32_t seq)
{
    int32_t e = shared_tail(kv, g, seq);
    if (e < 0)
        return 0;
    struct kv_group *gr = &kv->group[g];
    int32_t *t = table_of(kv, g, seq);
    uint32_t old = (uint32_t)t[e], nb = gr->free_list[--gr->n_free];
    gr->ref[nb] = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = block_copy(kv, g, nb, old);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kv->cow_s += (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    kv->cow_copies++;
    if (rc) {
        unref(gr, nb);
        return rc;
    }
    unref(gr, old);
    t[e] = (int32_t)nb;
    return 0;
}

/* Lay out the metadata of every group; returns total bytes. */
static size_t meta_layout(struct dray_kv *kv, uint32_t n_seq, const uint32_t *ids,
                          const uint32_t *n_new, uint32_t n_tok)
{
    uint32_t n_bt = 0;
    for (uint32_t i = 0; i < n_seq; i++)
        n_bt += div_up(kv->seq_len[ids[i]] + n_new[i], kv->d.block_size);
    size_t off = 0;
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        struct kv_group *gr = &kv->group[g];
        gr->off_slots = off;
        off = align_up(off + (size_t)n_tok * 4, META_ALIGN);
        gr->off_seqs = off;
        off = align_up(off + (size_t)n_seq * 16, META_ALIGN);
        gr->off_bt = off;
        off = align_up(off + (size_t)n_bt * 4, META_ALIGN);
        gr->n_bt = n_bt;
    }
    return off;
}

/* Host staging and device buffer of at least n bytes. The device buffer is only
 * replaced after the queue drained, since earlier steps' ops may still read it. */
static int meta_reserve(struct dray_kv *kv, size_t n, char *err, size_t errlen)
{
    if (n > kv->meta_host_cap) {
        void *p = realloc(kv->meta_host, n);
        if (!p)
            return dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory (%zu bytes)", n);
        kv->meta_host = p;
        kv->meta_host_cap = n;
    }
    if (n <= kv->meta_buf_cap)
        return 0;
    size_t cap = kv->meta_buf_cap * 2 > n ? kv->meta_buf_cap * 2 : n;
    if (kv->meta_buf) {
        /* a queued op may still read the old metadata: free it only once idle */
        if (kv->ops->synchronize && kv->ops->synchronize(kv->ctx))
            return dray_fail(err, errlen, DRAY_EBACKEND, "kv: waiting for %s before growing the step "
                             "metadata failed: %s", kv->ops->name, why(kv));
        kv->ops->free(kv->ctx, kv->meta_buf);
        kv->meta_buf = NULL;
        kv->meta_buf_cap = 0;
    }
    if (kv->ops->alloc(kv->ctx, cap, &kv->meta_buf) || !kv->meta_buf) {
        kv->meta_buf = NULL;
        return dray_fail(err, errlen, DRAY_ENOMEM,
                         "kv: device allocation of %zu bytes for step metadata on %s failed: %s", cap,
                         kv->ops->name, why(kv));
    }
    kv->meta_buf_cap = cap;
    return 0;
}

/* Take blocks for the new tokens' table entries of every sequence in group g. */
static void reserve_group(struct dray_kv *kv, uint32_t g)
{
    struct kv_group *gr = &kv->group[g];
    for (uint32_t i = 0; i < kv->step_n_seq; i++) {
        uint32_t s = kv->step_ids[i], len = kv->seq_len[s];
        int32_t *t = table_of(kv, g, s);
        uint32_t to = div_up(len + kv->step_new[i], kv->d.block_size);
        for (uint32_t e = div_up(len, kv->d.block_size); e < to; e++) {
            t[e] = (int32_t)gr->free_list[--gr->n_free];
            gr->ref[t[e]] = 1;
            gr->held[s]++;
        }
    }
}

/* Fill group g's slots, seqs and block_table in the host staging area. */
static void build_group(struct dray_kv *kv, uint32_t g)
{
    struct kv_group *gr = &kv->group[g];
    uint32_t bs = kv->d.block_size, q = 0, bt = 0;
    int32_t *slots = (int32_t *)(kv->meta_host + gr->off_slots);
    int32_t *seqs = (int32_t *)(kv->meta_host + gr->off_seqs);
    int32_t *tab = (int32_t *)(kv->meta_host + gr->off_bt);
    for (uint32_t i = 0; i < kv->step_n_seq; i++) {
        uint32_t s = kv->step_ids[i], len = kv->seq_len[s], n = kv->step_new[i];
        const int32_t *t = table_of(kv, g, s);
        for (uint32_t p = len; p < len + n; p++)
            slots[q + p - len] = t[p / bs] * (int32_t)bs + (int32_t)(p % bs);
        seqs[4 * i + 0] = (int32_t)q;
        seqs[4 * i + 1] = (int32_t)n;
        seqs[4 * i + 2] = (int32_t)(len + n);
        seqs[4 * i + 3] = (int32_t)bt;
        uint32_t n_ent = div_up(len + n, bs);
        memcpy(tab + bt, t, n_ent * sizeof(*t)); /* recycled window entries are -1 */
        bt += n_ent;
        q += n;
    }
}

static void fill_layer_steps(struct dray_kv *kv)
{
    for (uint32_t il = 0; il < kv->d.n_layer; il++) {
        uint32_t g = kv->layer_group[il];
        const struct kv_group *gr = &kv->group[g];
        struct dray_kv_layer_step *ls = &kv->lsteps[il];
        ls->pool = &gr->pools[kv->layer_index[il]];
        ls->slots = view_at(kv->meta_buf, gr->off_slots);
        ls->seqs = view_at(kv->meta_buf, gr->off_seqs);
        ls->block_table = view_at(kv->meta_buf, gr->off_bt);
        ls->n_tok = kv->step_n_tok;
        ls->n_seq = kv->step_n_seq;
        ls->max_kv_len = kv->step_max_kv;
        ls->window = kv->plan.group[g].window;
        ls->store = kv->layer_store[il] != 0;
    }
}

static void unreserve(struct dray_kv *kv)
{
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        for (uint32_t i = kv->step_n_seq; i-- > 0;) {
            uint32_t s = kv->step_ids[i], len = kv->seq_len[s];
            release_entries(kv, g, s, div_up(len, kv->d.block_size),
                            div_up(len + kv->step_new[i], kv->d.block_size));
        }
}

int dray_kv_step_begin(struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                       const uint32_t *n_new, char *err, size_t errlen)
{
    int rc = step_check(kv, n_seq, seq_ids, n_new, err, errlen);
    if (rc)
        return rc;
    uint32_t n_tok = 0, max_kv = 0, need = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        uint32_t len = kv->seq_len[seq_ids[i]];
        n_tok += n_new[i];
        need += div_up(len + n_new[i], kv->d.block_size) - div_up(len, kv->d.block_size);
        if (len + n_new[i] > max_kv)
            max_kv = len + n_new[i];
    }
    /* every group gives each new table entry one block, plus one per shared
     * partial block this step writes into (copy on write) */
    uint32_t need_g[DRAY_KV_MAX_GROUPS];
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        need_g[g] = need;
        for (uint32_t i = 0; i < n_seq; i++)
            need_g[g] += shared_tail(kv, g, seq_ids[i]) >= 0;
        if (need_g[g] > kv->group[g].n_free && kv->reclaim)
            kv->reclaim(kv->reclaim_user, g, need_g[g] - kv->group[g].n_free);
    }
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        if (need_g[g] > kv->group[g].n_free)
            return dray_fail(err, errlen, DRAY_ENOMEM,
                             "kv: step needs %u blocks in the window-%u group, %u free", need_g[g],
                             kv->plan.group[g].window, kv->group[g].n_free);
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        for (uint32_t i = 0; i < n_seq; i++)
            if ((rc = unshare_tail(kv, g, seq_ids[i])))
                return dray_fail(err, errlen, rc,
                                 "kv: copy of a shared block before writing failed: %s",
                                 kv->ops->last_error ? kv->ops->last_error(kv->ctx) : "");
    rc = meta_reserve(kv, meta_layout(kv, n_seq, seq_ids, n_new, n_tok), err, errlen);
    if (rc)
        return rc;
    kv->step_n_seq = n_seq;
    kv->step_n_tok = n_tok;
    kv->step_max_kv = max_kv;
    memcpy(kv->step_ids, seq_ids, n_seq * sizeof(*seq_ids));
    memcpy(kv->step_new, n_new, n_seq * sizeof(*n_new));
    size_t total = 0;
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        reserve_group(kv, g);
        build_group(kv, g);
        total = kv->group[g].off_bt + (size_t)kv->group[g].n_bt * 4;
    }
    rc = kv->ops->upload(kv->ctx, view_at(kv->meta_buf, 0), kv->meta_host, total);
    if (rc) {
        unreserve(kv);
        return dray_fail(err, errlen, rc < 0 ? rc : DRAY_EBACKEND,
                         "kv: upload of %zu bytes of step metadata to %s failed: %s", total,
                         kv->ops->name, why(kv));
    }
    fill_layer_steps(kv);
    kv->in_step = true;
    return 0;
}

const struct dray_kv_layer_step *dray_kv_layer(const struct dray_kv *kv, uint32_t il)
{
    return kv->in_step && il < kv->d.n_layer ? &kv->lsteps[il] : NULL;
}

const int32_t *dray_kv_step_host(const struct dray_kv *kv, uint32_t g, const int32_t **seqs,
                                 const int32_t **block_table, uint32_t *n_bt)
{
    if (!kv->in_step || g >= kv->plan.n_group)
        return NULL;
    const struct kv_group *gr = &kv->group[g];
    if (seqs)
        *seqs = (const int32_t *)(kv->meta_host + gr->off_seqs);
    if (block_table)
        *block_table = (const int32_t *)(kv->meta_host + gr->off_bt);
    if (n_bt)
        *n_bt = gr->n_bt;
    return (const int32_t *)(kv->meta_host + gr->off_slots);
}

void dray_kv_step_end(struct dray_kv *kv)
{
    if (!kv->in_step)
        return;
    for (uint32_t i = 0; i < kv->step_n_seq; i++) {
        uint32_t s = kv->step_ids[i];
        kv->seq_len[s] += kv->step_new[i];
        for (uint32_t g = 0; g < kv->plan.n_group; g++) {
            uint32_t w = kv->plan.group[g].window;
            uint32_t *fl = &kv->group[g].first_live[s];
            /* measured from the last block boundary, so the blocks a query at that
             * boundary sees stay alive: the prefix cache checkpoints there */
            uint32_t bs = kv->d.block_size;
            uint32_t dead = w ? dead_blocks(kv->seq_len[s] / bs * bs, w, bs) : 0;
            if (dead > *fl) {
                release_entries(kv, g, s, *fl, dead);
                *fl = dead;
            }
        }
    }
    kv->in_step = false;
}

void dray_kv_step_abort(struct dray_kv *kv)
{
    if (!kv->in_step)
        return;
    unreserve(kv);
    kv->in_step = false;
}

/* ------------------------------------------------------- shared blocks */

void dray_kv_set_reclaim(struct dray_kv *kv, dray_kv_reclaim_fn fn, void *user)
{
    kv->reclaim = fn;
    kv->reclaim_user = user;
}

int32_t dray_kv_seq_block(const struct dray_kv *kv, uint32_t seq_id, uint32_t g, uint32_t entry)
{
    if (!seq_ok(kv, seq_id) || g >= kv->plan.n_group || entry >= kv->max_bps)
        return -1;
    return table_of(kv, g, seq_id)[entry];
}

void dray_kv_block_ref(struct dray_kv *kv, uint32_t g, uint32_t block)
{
    kv->group[g].ref[block]++;
}

void dray_kv_block_unref(struct dray_kv *kv, uint32_t g, uint32_t block)
{
    unref(&kv->group[g], block);
}

uint32_t dray_kv_block_refs(const struct dray_kv *kv, uint32_t g, uint32_t block)
{
    return g < kv->plan.n_group && block < kv->plan.group[g].n_blocks ? kv->group[g].ref[block] : 0;
}

int dray_kv_block_alloc(struct dray_kv *kv, uint32_t g, uint32_t *block)
{
    struct kv_group *gr = &kv->group[g];
    if (!gr->n_free && kv->reclaim)
        kv->reclaim(kv->reclaim_user, g, 1);
    if (!gr->n_free)
        return DRAY_ENOMEM;
    *block = gr->free_list[--gr->n_free];
    gr->ref[*block] = 1;
    return 0;
}

int dray_kv_seq_attach(struct dray_kv *kv, uint32_t seq_id, uint32_t len,
                       const int32_t *const *blocks)
{
    uint32_t bs = kv->d.block_size, n_ent = div_up(len, bs);
    if (!seq_ok(kv, seq_id) || kv->seq_len[seq_id] || len > kv->d.max_ctx ||
        in_current_step(kv, seq_id))
        return DRAY_EINVAL;
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        uint32_t w = kv->plan.group[g].window, first = w ? dead_blocks(len / bs * bs, w, bs) : 0;
        for (uint32_t e = first; e < n_ent; e++)
            if (blocks[g][e] < 0 || (uint32_t)blocks[g][e] >= kv->plan.group[g].n_blocks)
                return DRAY_EINVAL;
    }
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        struct kv_group *gr = &kv->group[g];
        uint32_t w = kv->plan.group[g].window, first = w ? dead_blocks(len / bs * bs, w, bs) : 0;
        int32_t *t = table_of(kv, g, seq_id);
        for (uint32_t e = first; e < n_ent; e++) {
            t[e] = blocks[g][e];
            gr->ref[t[e]]++;
            gr->held[seq_id]++;
        }
        gr->first_live[seq_id] = first;
    }
    kv->seq_len[seq_id] = len;
    return 0;
}

void dray_kv_cow_stats(const struct dray_kv *kv, uint64_t *copies, double *seconds)
{
    *copies = kv->cow_copies;
    *seconds = kv->cow_s;
}

uint32_t dray_kv_live_from(const struct dray_kv *kv, uint32_t g, uint32_t len)
{
    uint32_t w = g < kv->plan.n_group ? kv->plan.group[g].window : 0;
    return w ? dead_blocks(len, w, kv->d.block_size) : 0;
}

uint32_t dray_kv_make_free(struct dray_kv *kv, uint32_t g, uint32_t want)
{
    struct kv_group *gr = &kv->group[g];
    if (gr->n_free < want && kv->reclaim)
        kv->reclaim(kv->reclaim_user, g, want - gr->n_free);
    return gr->n_free;
}

/* ------------------------------------------------------- host copies */

static uint64_t row_bytes(const struct dray_kv *kv)
{
    return (uint64_t)kv->d.n_kv_head * kv->d.head_dim * el_size(kv->d.dtype);
}

uint64_t dray_kv_block_host_bytes(const struct dray_kv *kv, uint32_t g)
{
    uint64_t per_layer = 2 * row_bytes(kv);
    if (kv->d.dtype == DRAY_I8)
        per_layer += 2 * (uint64_t)kv->d.n_kv_head * sizeof(float);
    return per_layer * kv->d.block_size * kv->plan.group[g].n_layers;
}

/* The four regions of one block of one layer: device view, bytes. */
static void block_regions(const struct dray_kv *kv, const struct dray_kv_pool *pool, uint32_t block,
                          struct dray_view v[4], size_t n[4])
{
    uint64_t slot0 = (uint64_t)block * kv->d.block_size, rb = row_bytes(kv);
    uint64_t sb = (uint64_t)kv->d.n_kv_head * sizeof(float);
    const struct dray_view *base[4] = {&pool->k, &pool->v, &pool->k_scale, &pool->v_scale};
    for (int i = 0; i < 4; i++) {
        uint64_t each = i < 2 ? rb : sb;
        v[i] = view_at(base[i]->buf, base[i]->offset + slot0 * each);
        n[i] = i < 2 || kv->d.dtype == DRAY_I8 ? (size_t)(each * kv->d.block_size) : 0;
    }
}

int dray_kv_block_download(struct dray_kv *kv, uint32_t g, uint32_t block, void *host)
{
    unsigned char *p = host;
    for (uint32_t li = 0; li < kv->plan.group[g].n_layers; li++) {
        struct dray_view v[4];
        size_t n[4];
        block_regions(kv, &kv->group[g].pools[li], block, v, n);
        for (int i = 0; i < 4; i++) {
            if (n[i] && kv->ops->download(kv->ctx, p, v[i], n[i]))
                return DRAY_EBACKEND;
            p += n[i];
        }
    }
    return 0;
}

int dray_kv_block_upload(struct dray_kv *kv, uint32_t g, uint32_t block, const void *host)
{
    const unsigned char *p = host;
    for (uint32_t li = 0; li < kv->plan.group[g].n_layers; li++) {
        struct dray_view v[4];
        size_t n[4];
        block_regions(kv, &kv->group[g].pools[li], block, v, n);
        for (int i = 0; i < 4; i++) {
            if (n[i] && kv->ops->upload(kv->ctx, v[i], p, n[i]))
                return DRAY_EBACKEND;
            p += n[i];
        }
    }
    /* the source must stay valid until the upload ran: wait here, since the
     * caller frees or reuses its host copy right after */
    return kv->ops->synchronize ? kv->ops->synchronize(kv->ctx) : 0;
}

void dray_kv_get_layout(const struct dray_kv *kv, struct dray_kv_layout *l)
{
    *l = (struct dray_kv_layout){.dtype = kv->d.dtype, .block_size = kv->d.block_size,
                                 .n_kv_head = kv->d.n_kv_head, .head_dim = kv->d.head_dim};
}
