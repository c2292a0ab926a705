/* KV manager: a block's KV in a vendor-neutral host layout. See kv.h. */
#include "kv_internal.h"

#include "error.h"

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
void kv_block_regions(const struct dray_kv *kv, const struct dray_kv_pool *pool, uint32_t block,
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
        kv_block_regions(kv, &kv->group[g].pools[li], block, v, n);
        const struct dray_kv_device *dv = &kv->dev[kv->group[g].pool_dev[li]];
        for (int i = 0; i < 4; i++) {
            if (n[i] && dv->ops->download(dv->ctx, p, v[i], n[i]))
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
        kv_block_regions(kv, &kv->group[g].pools[li], block, v, n);
        const struct dray_kv_device *dv = &kv->dev[kv->group[g].pool_dev[li]];
        for (int i = 0; i < 4; i++) {
            if (n[i] && dv->ops->upload(dv->ctx, v[i], p, n[i]))
                return DRAY_EBACKEND;
            p += n[i];
        }
    }
    /* the source must stay valid until the upload ran: wait here, since the
     * caller frees or reuses its host copy right after */
    for (uint32_t d = 0; d < kv->n_dev; d++)
        if (kv->dev_used[d] && kv->dev[d].ops->synchronize && kv->dev[d].ops->synchronize(kv->dev[d].ctx))
            return DRAY_EBACKEND;
    return 0;
}

void dray_kv_get_layout(const struct dray_kv *kv, struct dray_kv_layout *l)
{
    *l = (struct dray_kv_layout){.dtype = kv->d.dtype, .block_size = kv->d.block_size,
                                 .n_kv_head = kv->d.n_kv_head, .head_dim = kv->d.head_dim};
}
