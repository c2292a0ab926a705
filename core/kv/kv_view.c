/* A KV view (kv.h dray_kv_view_new): the layer views of one step, filled in
 * from outside, for a rank that holds layers but not the block structure. */
#include "kv_internal.h"

#include <stdlib.h>

#include "error.h"

int dray_kv_view_new(uint32_t n_layer, struct dray_kv **out)
{
    struct dray_kv *kv = calloc(1, sizeof(*kv));
    *out = NULL;
    if (!kv)
        return DRAY_ENOMEM;
    kv->d.n_layer = n_layer;
    kv->lsteps = calloc(n_layer ? n_layer : 1, sizeof(*kv->lsteps));
    kv->view_pools = calloc(n_layer ? n_layer : 1, sizeof(*kv->view_pools));
    if (!kv->lsteps || !kv->view_pools) {
        dray_kv_free(kv);
        return DRAY_ENOMEM;
    }
    kv->in_step = true;
    kv->step_n_mb = 1;
    *out = kv;
    return 0;
}

void dray_kv_view_set(struct dray_kv *kv, uint32_t il, const struct dray_kv_layer_step *st,
                      const struct dray_kv_pool *pool)
{
    if (!kv->view_pools || il >= kv->d.n_layer)
        return;
    kv->lsteps[il] = *st;
    if (pool)
        kv->view_pools[il] = *pool;
    kv->lsteps[il].pool = pool ? &kv->view_pools[il] : NULL;
}
