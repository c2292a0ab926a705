/* KV manager: copy on write of a shared partial block. See kv.h. */
#include "kv_internal.h"

#include <stdlib.h>
#include <time.h>

#include "error.h"

/* Copy on write. A block may be shared (the prefix cache hands out, and keeps,
 * the partial last block of a prefix); a sequence about to write into it gets
 * its own copy first, so no holder ever sees another's writes. The only block a
 * step can write into that already exists is the one holding position len when
 * len is not block-aligned (later positions go to fresh blocks). */

/* Table entry of seq's partial last block in group g if it is shared, else -1. */
int32_t kv_shared_tail(const struct dray_kv *kv, uint32_t g, uint32_t seq)
{
    uint32_t len = kv->seq_len[seq], bs = kv->d.block_size;
    if (len % bs == 0)
        return -1;
    int32_t b = table_of(kv, g, seq)[len / bs];
    return b >= 0 && kv->group[g].ref[b] > 1 ? (int32_t)(len / bs) : -1;
}

/* Device copy of block src into block dst of group g, every layer: through the
 * plugin's copy, or download + upload where a plugin has none. */
static int block_copy(struct dray_kv *kv, uint32_t g, uint32_t dst, uint32_t src)
{
    unsigned char *tmp = NULL;
    int rc = 0;
    for (uint32_t li = 0; li < kv->plan.group[g].n_layers && !rc; li++) {
        struct dray_view vd[4], vs[4];
        size_t n[4];
        const struct dray_kv_device *dv = &kv->dev[kv->group[g].pool_dev[li]]; /* the layer's own */
        kv_block_regions(kv, &kv->group[g].pools[li], dst, vd, n);
        kv_block_regions(kv, &kv->group[g].pools[li], src, vs, n);
        for (int i = 0; i < 4 && !rc; i++) {
            if (!n[i])
                continue;
            if (dv->ops->copy) {
                rc = dv->ops->copy(dv->ctx, vd[i], vs[i], n[i]);
                continue;
            }
            if (!tmp && !(tmp = malloc(n[0])))
                return DRAY_ENOMEM;
            rc = dv->ops->download(dv->ctx, tmp, vs[i], n[i]) ||
                 dv->ops->upload(dv->ctx, vd[i], tmp, n[i]) ||
                 (dv->ops->synchronize && dv->ops->synchronize(dv->ctx));
        }
    }
    free(tmp);
    return rc ? DRAY_EBACKEND : 0;
}

/* Give seq a private copy of its shared partial last block in group g (a free
 * block must be there: step_begin checked). */
int kv_unshare_tail(struct dray_kv *kv, uint32_t g, uint32_t seq)
{
    int32_t e = kv_shared_tail(kv, g, seq);
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

void dray_kv_cow_stats(const struct dray_kv *kv, uint64_t *copies, double *seconds)
{
    *copies = kv->cow_copies;
    *seconds = kv->cow_s;
}
