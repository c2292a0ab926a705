/* KV manager: layer groups, block allocation and reference counts, sequences,
 * shared blocks. See kv.h; the state is in kv_internal.h. */
#include "kv_internal.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

/* -------------------------------------------------------------- create/free */

static void group_release(struct dray_kv *kv, struct kv_group *gr)
{
    for (uint32_t d = 0; d < kv->n_dev; d++)
        if (gr->buf[d])
            kv->dev[d].ops->free(kv->dev[d].ctx, gr->buf[d]);
    free(gr->pools);
    free(gr->pool_dev);
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
    for (uint32_t d = 0; d < kv->n_dev; d++) /* no queued op may still use our buffers */
        if (kv->dev[d].ops->synchronize)
            kv->dev[d].ops->synchronize(kv->dev[d].ctx);
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        group_release(kv, &kv->group[g]);
    for (uint32_t d = 0; d < kv->n_dev; d++)
        if (kv->meta_buf[d])
            kv->dev[d].ops->free(kv->dev[d].ctx, kv->meta_buf[d]);
    free(kv->layer_dev);
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
    free(kv->view_pools);
    free(kv);
}

/* Device buffer and host tables of group g. */
static int group_init(struct dray_kv *kv, uint32_t g, char *err, size_t errlen)
{
    const struct dray_kv_desc *d = &kv->d;
    const struct dray_kv_group_plan *gp = &kv->plan.group[g];
    struct kv_group *gr = &kv->group[g];
    size_t n_tab = (size_t)d->max_seqs * kv->max_bps;
    gr->pools = calloc(gp->n_layers, sizeof(*gr->pools));
    gr->pool_dev = calloc(gp->n_layers ? gp->n_layers : 1, 1);
    gr->free_list = malloc(sizeof(*gr->free_list) * gp->n_blocks);
    gr->ref = calloc(gp->n_blocks ? gp->n_blocks : 1, sizeof(*gr->ref));
    gr->tables = malloc(sizeof(*gr->tables) * n_tab);
    gr->first_live = calloc(d->max_seqs, sizeof(*gr->first_live));
    gr->held = calloc(d->max_seqs, sizeof(*gr->held));
    if (!gr->pools || !gr->pool_dev || !gr->free_list || !gr->ref || !gr->tables || !gr->first_live || !gr->held)
        return dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory for group tables");
    for (size_t i = 0; i < n_tab; i++)
        gr->tables[i] = -1;
    for (uint32_t b = 0; b < gp->n_blocks; b++) /* pops hand out 0, 1, 2, ... */
        gr->free_list[b] = gp->n_blocks - 1 - b;
    gr->n_free = gp->n_blocks;

    uint32_t n_on[DRAY_KV_MAX_DEVICES] = {0}, local[DRAY_KV_MAX_DEVICES] = {0};
    for (uint32_t il = 0; il < d->n_layer; il++)
        if (kv->layer_store[il] && kv->layer_group[il] == g) {
            gr->pool_dev[kv->layer_index[il]] = kv->layer_dev[il];
            n_on[kv->layer_dev[il]]++;
        }
    for (uint32_t dv = 0; dv < kv->n_dev; dv++) {
        const struct dray_ops *o = kv->dev[dv].ops;
        struct dray_ctx *c = kv->dev[dv].ctx;
        uint64_t total = gp->layer_bytes * n_on[dv];
        if (!n_on[dv])
            continue;
        if (o->alloc(c, (size_t)total, &gr->buf[dv]) || !gr->buf[dv]) {
            gr->buf[dv] = NULL;
            return dray_fail(err, errlen, DRAY_ENOMEM,
                             "kv: device allocation of %llu bytes for %u layers (window %u) on %s "
                             "(device %u) failed: %s", (unsigned long long)total, n_on[dv], gp->window,
                             o->name, dv, why(kv, dv));
        }
        /* Zeroed so that a kernel reading a never-written slot sees 0, not NaN. */
        if (o->fill && o->fill(c, view_at(gr->buf[dv], 0), 0, (size_t)total))
            return dray_fail(err, errlen, DRAY_EBACKEND, "kv: clearing the window-%u pool on %s "
                             "(device %u) failed: %s", gp->window, o->name, dv, why(kv, dv));
    }

    uint64_t n_slots = (uint64_t)gp->n_blocks * d->block_size;
    uint64_t kbytes = align_up(n_slots * d->n_kv_head * d->head_dim * el_size(d->dtype), KV_ALIGN);
    uint64_t sbytes = align_up(n_slots * d->n_kv_head * sizeof(float), KV_ALIGN);
    for (uint32_t li = 0; li < gp->n_layers; li++) {
        struct dray_kv_pool *pool = &gr->pools[li];
        uint32_t dv = gr->pool_dev[li];
        struct dray_buf *buf = gr->buf[dv];
        uint64_t base = local[dv]++ * gp->layer_bytes;
        pool->k = view_at(buf, base);
        pool->v = view_at(buf, base + kbytes);
        if (d->dtype == DRAY_I8) {
            pool->k_scale = view_at(buf, base + 2 * kbytes);
            pool->v_scale = view_at(buf, base + 2 * kbytes + sbytes);
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
    kv->lsteps = calloc((size_t)n * DRAY_KV_MAX_MB, sizeof(*kv->lsteps));
    kv->layer_dev = calloc(n, 1);
    kv->seq_len = calloc(s, sizeof(uint32_t));
    kv->seq_used = calloc(s, 1);
    kv->free_ids = calloc(s, sizeof(uint32_t));
    kv->step_ids = calloc(s, sizeof(uint32_t));
    kv->step_new = calloc(s, sizeof(uint32_t));
    kv->mark = calloc(s, 1);
    if (!kv->layer_dev || !kv->layer_group || !kv->layer_index || !kv->layer_store || !kv->lsteps || !kv->seq_len ||
        !kv->seq_used || !kv->free_ids || !kv->step_ids || !kv->step_new || !kv->mark)
        return DRAY_ENOMEM;
    for (uint32_t i = 0; i < s; i++) /* pops hand out 0, 1, 2, ... */
        kv->free_ids[i] = s - 1 - i;
    kv->n_free_ids = s;
    return 0;
}

/* Every layer on a device there is, shared layers with their target. */
static int check_devices(const struct dray_kv_desc *d, uint32_t n_dev, char *err, size_t errlen)
{
    for (uint32_t il = 0; d->layer_dev && il < d->n_layer; il++) {
        if (d->layer_dev[il] >= n_dev)
            return dray_fail(err, errlen, DRAY_EINVAL, "kv: layer %u on device %u of %u", il,
                             d->layer_dev[il], n_dev);
        if (!owns_kv(d, il) && (uint32_t)d->share_with[il] < d->n_layer &&
            d->layer_dev[d->share_with[il]] != d->layer_dev[il])
            return dray_fail(err, errlen, DRAY_EINVAL, "kv: layer %u shares the KV of layer %d, which is "
                             "on device %u, not %u", il, d->share_with[il], d->layer_dev[d->share_with[il]],
                             d->layer_dev[il]);
    }
    return 0;
}

int dray_kv_create(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_kv_desc *d,
                   struct dray_kv **out, char *err, size_t errlen)
{
    struct dray_kv_device dev = {ops, ctx};
    return dray_kv_create_on(&dev, 1, d, out, err, errlen);
}

int dray_kv_create_on(const struct dray_kv_device *devs, uint32_t n_dev, const struct dray_kv_desc *d,
                      struct dray_kv **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n_dev < 1 || n_dev > DRAY_KV_MAX_DEVICES)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: %u devices, expected 1..%u", n_dev,
                         DRAY_KV_MAX_DEVICES);
    for (uint32_t i = 0; i < n_dev; i++)
        if (!devs[i].ops || !devs[i].ops->alloc || !devs[i].ops->free || !devs[i].ops->upload)
            return dray_fail(err, errlen, DRAY_EINVAL, "kv: device %u's op table lacks alloc/free/upload", i);
    int rc = check_devices(d, n_dev, err, errlen);
    if (rc)
        return rc;
    struct dray_kv *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory");
    memcpy(kv->dev, devs, n_dev * sizeof(*devs));
    kv->n_dev = n_dev;
    rc = dray_kv_plan(d, &kv->plan, err, errlen);
    if (rc) {
        free(kv);
        return rc;
    }
    kv->d = *d;
    kv->d.window = NULL;
    kv->d.share_with = NULL;
    kv->d.layer_dev = NULL;
    kv->max_bps = div_up(d->max_ctx, d->block_size);
    if (kv_alloc_host(kv)) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory for %u sequences",
                       d->max_seqs);
        goto out_free;
    }
    for (uint32_t il = 0; d->layer_dev && il < d->n_layer; il++)
        kv->layer_dev[il] = d->layer_dev[il];
    for (uint32_t il = 0; il < d->n_layer; il++)
        kv->dev_used[kv->layer_dev[il]] = true;
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

uint64_t dray_kv_device_bytes(const struct dray_kv *kv, uint32_t dev)
{
    uint64_t n = 0;
    for (uint32_t g = 0; dev < kv->n_dev && g < kv->plan.n_group; g++)
        for (uint32_t li = 0; li < kv->plan.group[g].n_layers; li++)
            n += kv->group[g].pool_dev[li] == dev ? kv->plan.group[g].layer_bytes : 0;
    return n;
}

uint32_t dray_kv_capacity(const struct dray_kv *kv, uint32_t seq_len)
{
    return dray_kv_plan_capacity(&kv->plan, &kv->d, seq_len);
}

uint32_t dray_kv_block_size(const struct dray_kv *kv) { return kv->d.block_size; }

uint32_t dray_kv_group_free_blocks(const struct dray_kv *kv, uint32_t g)
{
    return g < kv->plan.n_group ? kv->group[g].n_free : 0;
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

/* Give back table entries [from, to) of seq in group g that still hold a block. */
void kv_release_entries(struct dray_kv *kv, uint32_t g, uint32_t seq, uint32_t from,
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

bool kv_in_step(const struct dray_kv *kv, uint32_t seq)
{
    for (uint32_t i = 0; kv->in_step && i < kv->step_n_seq; i++)
        if (kv->step_ids[i] == seq)
            return true;
    return false;
}

void dray_kv_seq_free(struct dray_kv *kv, uint32_t seq_id)
{
    if (!seq_ok(kv, seq_id) || kv_in_step(kv, seq_id))
        return;
    uint32_t n_ent = div_up(kv->seq_len[seq_id], kv->d.block_size);
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        kv_release_entries(kv, g, seq_id, 0, n_ent);
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

int dray_kv_seq_truncate(struct dray_kv *kv, uint32_t seq_id, uint32_t new_len)
{
    if (!seq_ok(kv, seq_id) || kv_in_step(kv, seq_id))
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
        kv_release_entries(kv, g, seq_id, div_up(new_len, bs), div_up(len, bs));
        if (!new_len)
            kv->group[g].first_live[seq_id] = 0;
    }
    kv->seq_len[seq_id] = new_len;
    return 0;
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
        kv_in_step(kv, seq_id))
        return DRAY_EINVAL;
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        uint32_t first = kept_from(kv, g, len);
        for (uint32_t e = first; e < n_ent; e++)
            if (blocks[g][e] < 0 || (uint32_t)blocks[g][e] >= kv->plan.group[g].n_blocks)
                return DRAY_EINVAL;
    }
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        struct kv_group *gr = &kv->group[g];
        uint32_t first = kept_from(kv, g, len);
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

uint32_t dray_kv_live_from(const struct dray_kv *kv, uint32_t g, uint32_t len)
{
    uint32_t w = g < kv->plan.n_group ? kv->plan.group[g].window : 0;
    return w ? dead_blocks(len, w, kv->d.block_size) : 0;
}

uint32_t dray_kv_kept_from(const struct dray_kv *kv, uint32_t g, uint32_t len)
{
    return g < kv->plan.n_group ? kept_from(kv, g, len) : 0;
}

bool dray_kv_window_moves(const struct dray_kv *kv, uint32_t a, uint32_t b)
{
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        if (kept_from(kv, g, a) != kept_from(kv, g, b))
            return true;
    return false;
}

uint32_t dray_kv_ckpt_gap(const struct dray_kv *kv)
{
    uint32_t ckpt_gap = 0;
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        uint32_t w = kv->plan.group[g].window, gap = w + kv->d.block_size - 2;
        if (w && (!ckpt_gap || gap < ckpt_gap))
            ckpt_gap = gap;
    }
    return ckpt_gap;
}

uint32_t dray_kv_make_free(struct dray_kv *kv, uint32_t g, uint32_t want)
{
    struct kv_group *gr = &kv->group[g];
    if (gr->n_free < want && kv->reclaim)
        kv->reclaim(kv->reclaim_user, g, want - gr->n_free);
    return gr->n_free;
}
