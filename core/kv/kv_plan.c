/* KV manager: what a desc costs (groups, block counts, the budget split),
 * computed without touching a device. See kv.h. */
#include "kv_internal.h"

#include <string.h>

#include "error.h"

/* ----------------------------------------------------------------- plan */

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
