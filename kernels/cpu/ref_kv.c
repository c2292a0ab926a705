/* Reference KV store: each token's K and V heads go to their slot, quantized per
 * token per head to int8 (scale = max|x|/127, round to nearest even) or f16. */
#include <math.h>

#include "cpu_kernels.h"

float dray_cpu_ref_quant_row(const float *x, uint32_t n, int8_t *q)
{
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    float scale = amax / 127.0f;
    for (uint32_t i = 0; i < n; i++) {
        float v = scale == 0.0f ? 0.0f : nearbyintf(x[i] / scale);
        q[i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
    return scale;
}

static void store_one(const struct dray_cpu_kv *p, void *dst, float *scale_dst, size_t slot,
                      uint32_t h, const float *src)
{
    size_t row = slot * p->n_kv_head + h; /* [n_slots][n_kv_head] rows of head_dim */
    if (p->is_i8) {
        scale_dst[row] = dray_cpu_ref_quant_row(src, p->head_dim, (int8_t *)dst + row * p->head_dim);
    } else {
        uint16_t *d = (uint16_t *)dst + row * p->head_dim;
        for (uint32_t i = 0; i < p->head_dim; i++)
            d[i] = dray_util_f32_to_f16(src[i]);
    }
}

void dray_cpu_ref_kv_store(const struct dray_cpu_kv_store *a, uint32_t t0, uint32_t t1)
{
    const struct dray_cpu_kv *p = a->pool;
    for (uint32_t t = t0; t < t1; t++) {
        if (a->slots[t] < 0) /* padding token: not stored */
            continue;
        size_t slot = (size_t)a->slots[t];
        for (uint32_t h = 0; h < p->n_kv_head; h++) {
            store_one(p, p->k, p->k_scale, slot, h, a->k + (size_t)t * a->stride_k + (size_t)h * p->head_dim);
            store_one(p, p->v, p->v_scale, slot, h, a->v + (size_t)t * a->stride_v + (size_t)h * p->head_dim);
        }
    }
}
