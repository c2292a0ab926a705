/* Reference matmul over grouped weights (backend.h, matmul: DRAY_Q8G32,
 * DRAY_Q4G32, DRAY_Q5G32 and DRAY_Q4G32H, and their two-pass forms): activations quantized per token and per
 * group of 32 channels (two passes: then the residual the same way), exact int32
 * dot products per group, group terms summed in f32 in increasing group order.
 * This is the truth the fast kernels are checked against. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

#define GROUP 32u

/* One token's k inputs into int8 per group of 32: q, and each group's scale
 * and sum of q. */
static void quantize_groups(const float *x, uint32_t G, int8_t *q, float *gsx, int32_t *gsum)
{
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
        gsx[g] = sx;
        gsum[g] = sum;
    }
}

void dray_cpu_ref_gquantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    uint32_t G = a->k / GROUP;
    float r[GROUP];
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = a->x + (size_t)t * a->stride_x;
        size_t row = (size_t)t << a->pairs;
        int8_t *q = a->q + row * a->q_stride;
        float *sx = a->gsx + row * G;
        memset(q, 0, a->q_stride << a->pairs);
        quantize_groups(x, G, q, sx, a->gsum + row * G);
        if (a->pairs)
            /* the residual, group by group, into the next row (backend.h: two-pass
             * activations) */
            for (uint32_t g = 0; g < G; g++) {
                for (uint32_t c = 0; c < GROUP; c++)
                    r[c] = x[g * GROUP + c] - (float)q[g * GROUP + c] * sx[g];
                quantize_groups(r, 1, q + a->q_stride + g * GROUP, sx + G + g, a->gsum + (row + 1) * G + g);
            }
        dray_cpu_gmin_fill(a, t);
    }
}

/* Weight codes and scales at row o, input c (backend.h: rows in blocks of 16,
 * each group stored as 64-byte units of 4 inputs x 16 rows). */
static inline int32_t w8_at(const int8_t *w, uint32_t G, uint32_t o, uint32_t c)
{
    size_t unit = ((size_t)(o / 16) * G + c / 32) * 8 + (c % 32) / 4;
    return w[unit * 64 + (o % 16) * 4 + c % 4];
}

/* The 4-bit code (Q4G32, units = 4) or the low 4 bits of the 5-bit one
 * (Q5G32, units = 5: the same four nibble units, then the high-bit unit). */
static inline int32_t nib_at(const uint8_t *w, uint32_t G, uint32_t units, uint32_t o, uint32_t c)
{
    uint32_t cc = c % 32;
    size_t unit = ((size_t)(o / 16) * G + c / 32) * units + (cc % 16) / 4;
    uint8_t b = w[unit * 64 + (o % 16) * 4 + cc % 4];
    return cc < 16 ? (int32_t)(b & 15u) : (int32_t)(b >> 4);
}

/* Q5G32's code 0..31: the nibble plus 16 times bit 4r+e of 64-bit word j of the
 * high unit, for input 32g + 4j + e of row 16b + r. */
static inline int32_t code5_at(const uint8_t *w, uint32_t G, uint32_t o, uint32_t c)
{
    uint32_t cc = c % 32, bit = (o % 16) * 4 + cc % 4;
    size_t hi = (((size_t)(o / 16) * G + c / 32) * 5 + 4) * 64 + (cc / 4) * 8 + bit / 8;
    return nib_at(w, G, 5, o, c) + 16 * (int32_t)((w[hi] >> (bit % 8)) & 1u);
}

/* Scale j (Q8G32: 0; Q4G32: 0 = d, 1 = m) of row o, group g; per = 1 or 2. */
static inline float scale_at(const float *s, uint32_t G, uint32_t per, uint32_t o, uint32_t g, uint32_t j)
{
    return s[(((size_t)(o / 16) * G + g) * per + j) * 16 + o % 16];
}

/* Q5G32's f16 d (j = 0) or m (j = 1) of row o, group g, widened exactly. */
static inline float scale16_at(const void *s, uint32_t G, uint32_t o, uint32_t g, uint32_t j)
{
    return dray_util_f16_to_f32(((const uint16_t *)s)[(((size_t)(o / 16) * G + g) * 2 + j) * 16 + o % 16]);
}

/* d (j = 0) or m (j = 1) of a 4- or 5-bit layout: f32 (Q4G32) or f16 (Q5G32,
 * Q4G32H) pairs. */
static inline float dm_at(uint32_t dtype, const void *s, uint32_t G, uint32_t o, uint32_t g, uint32_t j)
{
    return dray_util_half_scales(dtype) ? scale16_at(s, G, o, g, j) : scale_at(s, G, 2, o, g, j);
}

/* The code of row o, input c of a two-level layout (cpu_kernels.h). */
static inline int32_t kcode_at(uint32_t layout, const uint8_t *w, uint32_t G, uint32_t o, uint32_t c)
{
    if (layout == DRAY_CPU_K4)
        return nib_at(w, G, 4, o, c);
    if (layout == DRAY_CPU_K5)
        return code5_at(w, G, o, c);
    uint32_t cc = c % 32;
    size_t unit = ((size_t)(o / 16) * G + c / 32) * 6;
    uint8_t hi = w[(unit + 4 + cc / 16) * 64 + (o % 16) * 4 + cc % 4];
    return nib_at(w, G, 6, o, c) + 16 * (int32_t)((hi >> (2 * ((cc % 16) / 4))) & 3u);
}

/* d and m' of scale unit u (a group; a half-group for K6) of row o. */
static inline void kdm_at(uint32_t layout, const uint8_t *s, uint32_t S, uint32_t o, uint32_t u, float *d,
                          float *m)
{
    uint32_t r = o % 16;
    if (layout == DRAY_CPU_K6) {
        const uint8_t *sb = s + ((size_t)(o / 16) * S + u / 16) * 288;
        uint16_t D;
        memcpy(&D, sb + 2 * r, 2);
        *d = dray_util_f16_to_f32(D) * (float)(int8_t)sb[32 + 16 * (u % 16) + r];
        *m = -32.0f * *d;
        return;
    }
    const uint8_t *sb = s + ((size_t)(o / 16) * S + u / 8) * 256;
    uint32_t j = u % 8, hi;
    uint16_t D, M;
    memcpy(&D, sb + 2 * r, 2);
    memcpy(&M, sb + 32 + 2 * r, 2);
    memcpy(&hi, sb + 64 + 4 * r, 4);
    uint32_t nb = sb[128 + 16 * j + r];
    uint32_t sc = (nb & 15u) | ((hi >> (4 * j)) & 3u) << 4, mn = (nb >> 4) | ((hi >> (4 * j + 2)) & 3u) << 4;
    *d = dray_util_f16_to_f32(D) * (float)sc;
    *m = -(dray_util_f16_to_f32(M) * (float)mn);
}

/* One output of a two-level layout: backend.h's sum, half-groups as their own
 * terms (K6). */
static float kdot(const struct dray_cpu_matmul *a, const int8_t *q, const float *sx, uint32_t o)
{
    const uint32_t G = a->k / GROUP, S = a->k / 256, U = a->wdtype == DRAY_CPU_K6 ? 2 : 1;
    float acc = 0.0f;
    for (uint32_t g = 0; g < G; g++) {
        float part = 0.0f;
        for (uint32_t h = 0; h < U; h++) {
            int32_t isum = 0, qsum = 0;
            for (uint32_t c = g * GROUP + h * GROUP / U; c < g * GROUP + (h + 1) * GROUP / U; c++) {
                isum += (int32_t)q[c] * kcode_at(a->wdtype, a->w, G, o, c);
                qsum += q[c];
            }
            float d, m;
            kdm_at(a->wdtype, (const uint8_t *)a->wscale, S, o, g * U + h, &d, &m);
            part += d * (float)isum + m * (float)qsum;
        }
        acc += sx[g] * part;
    }
    return acc;
}

void dray_cpu_ref_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    uint32_t G = a->k / GROUP;
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const int8_t *q = a->q + (size_t)t * a->q_stride;
        const float *sx = a->gsx + (size_t)t * G;
        const int32_t *qs = a->gsum + (size_t)t * G;
        float *y = dray_cpu_gout(a, t);
        int adds = dray_cpu_gadds(a, t);
        for (uint32_t o = o0; o < o1 && dray_cpu_is_k(a->wdtype); o++) {
            float acc = kdot(a, q, sx, o);
            y[o] = adds ? y[o] + acc : acc;
        }
        for (uint32_t o = o0; o < o1 && !dray_cpu_is_k(a->wdtype); o++) {
            float acc = 0.0f;
            for (uint32_t g = 0; g < G; g++) {
                int32_t isum = 0;
                if (a->wdtype == DRAY_Q8G32) {
                    for (uint32_t c = 0; c < GROUP; c++)
                        isum += (int32_t)q[g * GROUP + c] * w8_at(a->w, G, o, g * GROUP + c);
                    acc += (float)isum * (sx[g] * scale_at(a->wscale, G, 1, o, g, 0));
                } else { /* Q4G32, Q4G32H, Q5G32: code * d + m */
                    int q5 = a->wdtype == DRAY_Q5G32;
                    for (uint32_t c = 0; c < GROUP; c++)
                        isum += (int32_t)q[g * GROUP + c] *
                                (q5 ? code5_at(a->w, G, o, g * GROUP + c) : nib_at(a->w, G, 4, o, g * GROUP + c));
                    acc += sx[g] * (dm_at(a->wdtype, a->wscale, G, o, g, 0) * (float)isum +
                                    dm_at(a->wdtype, a->wscale, G, o, g, 1) * (float)qs[g]);
                }
            }
            y[o] = adds ? y[o] + acc : acc;
        }
    }
}

void dray_cpu_ref_grow(uint32_t dtype, const void *table, const float *rs, size_t r, uint32_t dim,
                       float scale, float *y)
{
    uint32_t G = dim / GROUP, o = (uint32_t)r;
    for (uint32_t i = 0; i < dim; i++) {
        uint32_t g = i / GROUP;
        y[i] = dtype == DRAY_Q8G32
                   ? (float)w8_at(table, G, o, i) * scale_at(rs, G, 1, o, g, 0) * scale
                   : ((float)(dtype == DRAY_Q5G32 ? code5_at(table, G, o, i) : nib_at(table, G, 4, o, i)) *
                          dm_at(dtype, rs, G, o, g, 0) +
                      dm_at(dtype, rs, G, o, g, 1)) *
                         scale;
    }
}
