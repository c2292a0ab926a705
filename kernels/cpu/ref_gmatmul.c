/* Reference matmul over grouped weights (backend.h, matmul: DRAY_Q8G32 and
 * DRAY_Q4G32): activations quantized per token and per group of 32 channels,
 * exact int32 dot products per group, group terms summed in f32 in increasing
 * group order. This is the truth the fast kernels are checked against. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

#define GROUP 32u

void dray_cpu_ref_gquantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    uint32_t G = a->k / GROUP;
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = a->x + (size_t)t * a->stride_x;
        int8_t *q = a->q + (size_t)t * a->q_stride;
        memset(q, 0, a->q_stride);
        for (uint32_t g = 0; g < G; g++) {
            const float *xg = x + g * GROUP;
            float amax = 0.0f;
            for (uint32_t c = 0; c < GROUP; c++)
                amax = fabsf(xg[c]) > amax ? fabsf(xg[c]) : amax;
            float sx = amax / 127.0f;
            int32_t sum = 0;
            if (sx != 0.0f)
                for (uint32_t c = 0; c < GROUP; c++) {
                    float v = nearbyintf(xg[c] / sx); /* nearest, ties to even */
                    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                    q[g * GROUP + c] = (int8_t)v;
                    sum += (int32_t)v;
                }
            a->gsx[(size_t)t * G + g] = sx;
            a->gsum[(size_t)t * G + g] = sum;
        }
    }
}

/* The 4-bit weight of input channel 32g + c of a Q4G32 row (c < 32). */
static inline int32_t nib(const uint8_t *row, uint32_t g, uint32_t c)
{
    uint8_t b = row[g * 16u + (c & 15u)];
    return c < 16u ? (int32_t)(b & 15u) : (int32_t)(b >> 4);
}

void dray_cpu_ref_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    uint32_t G = a->k / GROUP;
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const int8_t *q = a->q + (size_t)t * a->q_stride;
        const float *sx = a->gsx + (size_t)t * G;
        const int32_t *qs = a->gsum + (size_t)t * G;
        float *y = a->out + (size_t)t * a->stride_out;
        for (uint32_t o = o0; o < o1; o++) {
            float acc = 0.0f;
            if (a->wdtype == DRAY_Q8G32) {
                const int8_t *w = (const int8_t *)a->w + (size_t)o * a->k;
                const float *ws = a->wscale + (size_t)o * G;
                for (uint32_t g = 0; g < G; g++) {
                    int32_t isum = 0;
                    for (uint32_t c = 0; c < GROUP; c++)
                        isum += (int32_t)q[g * GROUP + c] * w[g * GROUP + c];
                    acc += (float)isum * (sx[g] * ws[g]);
                }
            } else {
                const uint8_t *w = (const uint8_t *)a->w + (size_t)o * (a->k / 2);
                const float *dm = a->wscale + (size_t)o * G * 2;
                for (uint32_t g = 0; g < G; g++) {
                    int32_t isum = 0;
                    for (uint32_t c = 0; c < GROUP; c++)
                        isum += (int32_t)q[g * GROUP + c] * nib(w, g, c);
                    acc += sx[g] * (dm[2 * g] * (float)isum + dm[2 * g + 1] * (float)qs[g]);
                }
            }
            y[o] = a->accumulate ? y[o] + acc : acc;
        }
    }
}

void dray_cpu_ref_grow(uint32_t dtype, const void *table, const float *rs, size_t r, uint32_t dim,
                       float scale, float *y)
{
    uint32_t G = dim / GROUP;
    if (dtype == DRAY_Q8G32) {
        const int8_t *w = (const int8_t *)table + r * dim;
        for (uint32_t i = 0; i < dim; i++)
            y[i] = (float)w[i] * rs[r * G + i / GROUP] * scale;
    } else {
        const uint8_t *w = (const uint8_t *)table + r * (dim / 2);
        const float *dm = rs + r * G * 2;
        for (uint32_t i = 0; i < dim; i++) {
            uint32_t g = i / GROUP;
            y[i] = ((float)nib(w, g, i % GROUP) * dm[2 * g] + dm[2 * g + 1]) * scale;
        }
    }
}
