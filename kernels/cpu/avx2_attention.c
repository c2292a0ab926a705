/* AVX2 paged attention, one pass with an online softmax (flash style).
 * A work item is one sequence's block of up to DRAY_CPU_ATT_QBLOCK query rows
 * times the query heads that share one kv head, so every K/V row is read from
 * the cache and dequantized once per item and reused by all its query vectors
 * (MQA/GQA). Keys go in tiles of 32 positions: scores for all query vectors,
 * one rescale of the running sums per tile, then the V accumulation.
 *
 * Both products are register blocked over two query vectors at a time (four
 * in the AVX-512 build where head_dim allows: qk_block4, pv_block4):
 *   scores  2 vectors x 4 keys, 8 independent accumulators along head_dim,
 *           reduced with hadd at the end (no dependent FMA chain, no per-key
 *           horizontal sum);
 *   P.V     2 vectors x 32 dims held in 8 registers across all keys of the tile.
 * The int8 K scale is not applied to the tile but to the scores (with the
 * softmax scale), one multiply per key instead of one per element.
 * With a softcap (v4, Gemma 2) the scaled scores of a tile go through
 * cap * tanh(s / cap) before the mask; without one that step is skipped.
 * Probabilities below e^-60 of the running maximum are flushed to 0: their
 * contribution is far below any tolerance, and products of ~1e-38 weights
 * would be denormals, which cost a microcode assist per FMA.
 *
 * avx512_attention.c builds this file a second time with DRAY_ATT_512: the
 * two products then run 16-lane steps first (qk_512, pv_512) and the 8-lane
 * code takes what is left; everything else is shared. */
#include <math.h>
#include <string.h>

#include "avx2_util.h"
#include "cpu_kernels.h"

#define TILE 32u
#define FLUSH (-60.0f) /* log of the smallest probability kept, relative to the max */

/* Cache rows (slot * n_kv_head + g) of positions j0 .. j0+n-1 into rows[]:
 * one division for the tile, then a walk through its blocks. */
static void tile_rows(const struct dray_cpu_kv *p, const int32_t *bt, uint32_t g, uint32_t j0, uint32_t n,
                      size_t *rows)
{
    uint32_t bs = p->block_size, b = j0 / bs, off = j0 % bs;
    for (uint32_t jj = 0; jj < n; jj++) {
        rows[jj] = ((size_t)bt[b] * bs + off) * p->n_kv_head + g;
        if (++off == bs)
            off = 0, b++;
    }
}

/* K scales of the tile's rows (1 for f16, 0 past n). */
static void load_kscales(const struct dray_cpu_kv *p, const size_t *rows, uint32_t n, float *ksc)
{
    for (uint32_t jj = 0; jj < TILE; jj++)
        ksc[jj] = jj >= n ? 0.0f : p->is_i8 ? p->k_scale[rows[jj]] : 1.0f;
}

/* K or V of the tile's n rows into tile[TILE][hd] as floats: int8 K without
 * its scale (applied to the scores), int8 V with it. Rows n .. TILE-1 are
 * zeroed so every dot product stays finite. */
static void load_tile(const struct dray_cpu_kv *p, const size_t *rows, int is_v, uint32_t n, float *tile)
{
    uint32_t hd = p->head_dim;
    const void *base = is_v ? p->v : p->k;
    for (uint32_t jj = 0; jj < n; jj++) {
        size_t row = rows[jj];
        float *dst = tile + (size_t)jj * hd;
        uint32_t i = 0;
        if (p->is_i8) {
            const int8_t *q = (const int8_t *)base + row * hd;
            float s = is_v ? p->v_scale[row] : 1.0f;
#ifdef DRAY_ATT_512
            __m512 ws = _mm512_set1_ps(s);
            for (; i + 16 <= hd; i += 16) {
                __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + i)));
                _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(b), ws));
            }
#endif
            __m256 vs = _mm256_set1_ps(s);
            for (; i + 16 <= hd; i += 16) {
                __m128i b = _mm_loadu_si128((const __m128i *)(q + i));
                __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(lo, vs));
                _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(hi, vs));
            }
            for (; i < hd; i++)
                dst[i] = (float)q[i] * s;
        } else {
            const uint16_t *h = (const uint16_t *)base + row * hd;
#ifdef DRAY_ATT_512
            for (; i + 16 <= hd; i += 16)
                _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#endif
            for (; i + 8 <= hd; i += 8)
                _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
            for (; i < hd; i++)
                dst[i] = dray_util_f16_to_f32(h[i]);
        }
    }
    if (n < TILE)
        memset(tile + (size_t)n * hd, 0, (size_t)(TILE - n) * hd * sizeof(float));
}

/* {a, b, c, d}: the sums of the lanes of each. */
DRAY_AI __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

#ifdef DRAY_ATT_512
/* The 8 lanes of sums of a 16-lane vector's halves. */
DRAY_AI __m256 fold_ps(__m512 v)
{
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* qk_block's dimensions in steps of 16 (from *d while 16 remain), folded into
 * its 8-lane accumulators, which then take the rest. */
DRAY_AI void qk_512(const float *q0, const float *q1, int two, const float *k0, const float *k1, const float *k2,
                    const float *k3, uint32_t hd, uint32_t *dp, __m256 *a0, __m256 *a1, __m256 *a2, __m256 *a3,
                    __m256 *b0, __m256 *b1, __m256 *b2, __m256 *b3)
{
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, e0 = c0, e1 = c0, e2 = c0, e3 = c0;
    uint32_t d = *dp;
    for (; d + 16 <= hd; d += 16) {
        __m512 x = _mm512_loadu_ps(q0 + d);
        __m512 v0 = _mm512_loadu_ps(k0 + d), v1 = _mm512_loadu_ps(k1 + d);
        __m512 v2 = _mm512_loadu_ps(k2 + d), v3 = _mm512_loadu_ps(k3 + d);
        c0 = _mm512_fmadd_ps(x, v0, c0);
        c1 = _mm512_fmadd_ps(x, v1, c1);
        c2 = _mm512_fmadd_ps(x, v2, c2);
        c3 = _mm512_fmadd_ps(x, v3, c3);
        if (two) {
            __m512 y = _mm512_loadu_ps(q1 + d);
            e0 = _mm512_fmadd_ps(y, v0, e0);
            e1 = _mm512_fmadd_ps(y, v1, e1);
            e2 = _mm512_fmadd_ps(y, v2, e2);
            e3 = _mm512_fmadd_ps(y, v3, e3);
        }
    }
    *dp = d;
    *a0 = fold_ps(c0), *a1 = fold_ps(c1), *a2 = fold_ps(c2), *a3 = fold_ps(c3);
    *b0 = fold_ps(e0), *b1 = fold_ps(e1), *b2 = fold_ps(e2), *b3 = fold_ps(e3);
}

/* pv_block's dimensions in steps of 64 (from *dp while 64 remain). Per
 * element the same operations in the same order as the 8-lane code. */
DRAY_AI void pv_512(float *y0, float *y1, int two, float c0, float c1, const float *p0, const float *p1,
                    const float *tile, uint32_t nj, uint32_t hd, uint32_t *dp)
{
    __m512 vc0 = _mm512_set1_ps(c0), vc1 = _mm512_set1_ps(c1);
    uint32_t d = *dp;
    for (; d + 64 <= hd; d += 64) {
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(y0 + d), vc0);
        __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(y0 + d + 16), vc0);
        __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(y0 + d + 32), vc0);
        __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(y0 + d + 48), vc0);
        __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        if (two) {
            b0 = _mm512_mul_ps(_mm512_loadu_ps(y1 + d), vc1);
            b1 = _mm512_mul_ps(_mm512_loadu_ps(y1 + d + 16), vc1);
            b2 = _mm512_mul_ps(_mm512_loadu_ps(y1 + d + 32), vc1);
            b3 = _mm512_mul_ps(_mm512_loadu_ps(y1 + d + 48), vc1);
        }
        const float *v = tile + d;
        for (uint32_t j = 0; j < nj; j++, v += hd) {
            __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            __m512 v2 = _mm512_loadu_ps(v + 32), v3 = _mm512_loadu_ps(v + 48);
            __m512 x = _mm512_set1_ps(p0[j]);
            a0 = _mm512_fmadd_ps(x, v0, a0);
            a1 = _mm512_fmadd_ps(x, v1, a1);
            a2 = _mm512_fmadd_ps(x, v2, a2);
            a3 = _mm512_fmadd_ps(x, v3, a3);
            if (two) {
                __m512 z = _mm512_set1_ps(p1[j]);
                b0 = _mm512_fmadd_ps(z, v0, b0);
                b1 = _mm512_fmadd_ps(z, v1, b1);
                b2 = _mm512_fmadd_ps(z, v2, b2);
                b3 = _mm512_fmadd_ps(z, v3, b3);
            }
        }
        _mm512_storeu_ps(y0 + d, a0);
        _mm512_storeu_ps(y0 + d + 16, a1);
        _mm512_storeu_ps(y0 + d + 32, a2);
        _mm512_storeu_ps(y0 + d + 48, a3);
        if (two) {
            _mm512_storeu_ps(y1 + d, b0);
            _mm512_storeu_ps(y1 + d + 16, b1);
            _mm512_storeu_ps(y1 + d + 32, b2);
            _mm512_storeu_ps(y1 + d + 48, b3);
        }
    }
    *dp = d;
}

/* Four query vectors q[0..3] against the 4 rows k[0..3] (stride hd, a
 * multiple of 16) into o[r * TILE + 0..3]: 16 accumulators, so each K load
 * serves four vectors instead of two. Per (vector, key) the same 16-lane sums
 * in the same order, folded and reduced as qk_block does: the scores are
 * bit for bit those of qk_block, whatever block a vector lands in. Not
 * inlined, like pv_block4. */
__attribute__((noinline)) static void qk_block4(const float *const *q, const float *k, uint32_t hd,
                                                float *o)
{
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    const float *k0 = k, *k1 = k + hd, *k2 = k + 2 * (size_t)hd, *k3 = k + 3 * (size_t)hd;
    /* named, not an array: out of line, GCC 12 keeps an array of them in memory */
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
    __m512 c10 = c00, c11 = c00, c12 = c00, c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    __m512 c30 = c00, c31 = c00, c32 = c00, c33 = c00;
    for (uint32_t d = 0; d < hd; d += 16) {
        __m512 v0 = _mm512_loadu_ps(k0 + d), v1 = _mm512_loadu_ps(k1 + d);
        __m512 v2 = _mm512_loadu_ps(k2 + d), v3 = _mm512_loadu_ps(k3 + d);
        __m512 x = _mm512_loadu_ps(q0 + d);
        c00 = _mm512_fmadd_ps(x, v0, c00), c01 = _mm512_fmadd_ps(x, v1, c01);
        c02 = _mm512_fmadd_ps(x, v2, c02), c03 = _mm512_fmadd_ps(x, v3, c03);
        x = _mm512_loadu_ps(q1 + d);
        c10 = _mm512_fmadd_ps(x, v0, c10), c11 = _mm512_fmadd_ps(x, v1, c11);
        c12 = _mm512_fmadd_ps(x, v2, c12), c13 = _mm512_fmadd_ps(x, v3, c13);
        x = _mm512_loadu_ps(q2 + d);
        c20 = _mm512_fmadd_ps(x, v0, c20), c21 = _mm512_fmadd_ps(x, v1, c21);
        c22 = _mm512_fmadd_ps(x, v2, c22), c23 = _mm512_fmadd_ps(x, v3, c23);
        x = _mm512_loadu_ps(q3 + d);
        c30 = _mm512_fmadd_ps(x, v0, c30), c31 = _mm512_fmadd_ps(x, v1, c31);
        c32 = _mm512_fmadd_ps(x, v2, c32), c33 = _mm512_fmadd_ps(x, v3, c33);
    }
#define DRAY_QK4_ROW(r, a, b, c, d) \
    _mm_storeu_ps(o + (r) * TILE, hsum4(fold_ps(a), fold_ps(b), fold_ps(c), fold_ps(d)))
    DRAY_QK4_ROW(0, c00, c01, c02, c03);
    DRAY_QK4_ROW(1, c10, c11, c12, c13);
    DRAY_QK4_ROW(2, c20, c21, c22, c23);
    DRAY_QK4_ROW(3, c30, c31, c32, c33);
#undef DRAY_QK4_ROW
}

/* Four vectors' y[r] = y[r]*c[r] + sum_j p[r * TILE + j] tile[j] (y rows
 * hd apart, hd a multiple of 64): each V load serves four vectors. Per element
 * pv_512's operations in its order. The probabilities are read at constant
 * offsets from one pointer, and the function is never inlined: inside
 * do_item, GCC 12 keeps the V vectors on the stack. */
__attribute__((noinline)) static void pv_block4(float *y, const float *c, const float *p,
                                                const float *tile, uint32_t nj, uint32_t hd)
{
    for (uint32_t d = 0; d < hd; d += 64) {
        __m512 a[4][4];
        for (int r = 0; r < 4; r++) {
            __m512 vc = _mm512_set1_ps(c[r]);
            for (int i = 0; i < 4; i++)
                a[r][i] = _mm512_mul_ps(_mm512_loadu_ps(y + (size_t)r * hd + d + 16 * i), vc);
        }
        const float *v = tile + d;
        for (uint32_t j = 0; j < nj; j++, v += hd) {
            __m512 w0 = _mm512_loadu_ps(v), w1 = _mm512_loadu_ps(v + 16);
            __m512 w2 = _mm512_loadu_ps(v + 32), w3 = _mm512_loadu_ps(v + 48);
            for (int r = 0; r < 4; r++) {
                __m512 x = _mm512_set1_ps(p[r * TILE + j]);
                a[r][0] = _mm512_fmadd_ps(x, w0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(x, w1, a[r][1]);
                a[r][2] = _mm512_fmadd_ps(x, w2, a[r][2]);
                a[r][3] = _mm512_fmadd_ps(x, w3, a[r][3]);
            }
        }
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < 4; i++)
                _mm512_storeu_ps(y + (size_t)r * hd + d + 16 * i, a[r][i]);
    }
}
#endif

/* Dot products of q0 (and q1 when two) with the 4 rows k[0..3] (stride hd):
 * o0[0..3], o1[0..3]. */
DRAY_AI void qk_block(const float *q0, const float *q1, int two, const float *k, uint32_t hd, float *o0,
                      float *o1)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float *k0 = k, *k1 = k + hd, *k2 = k + 2 * (size_t)hd, *k3 = k + 3 * (size_t)hd;
    uint32_t d = 0;
#ifdef DRAY_ATT_512
    qk_512(q0, q1, two, k0, k1, k2, k3, hd, &d, &a0, &a1, &a2, &a3, &b0, &b1, &b2, &b3);
#endif
    for (; d + 8 <= hd; d += 8) {
        __m256 x = _mm256_loadu_ps(q0 + d);
        __m256 v0 = _mm256_loadu_ps(k0 + d), v1 = _mm256_loadu_ps(k1 + d);
        __m256 v2 = _mm256_loadu_ps(k2 + d), v3 = _mm256_loadu_ps(k3 + d);
        a0 = _mm256_fmadd_ps(x, v0, a0);
        a1 = _mm256_fmadd_ps(x, v1, a1);
        a2 = _mm256_fmadd_ps(x, v2, a2);
        a3 = _mm256_fmadd_ps(x, v3, a3);
        if (two) {
            __m256 y = _mm256_loadu_ps(q1 + d);
            b0 = _mm256_fmadd_ps(y, v0, b0);
            b1 = _mm256_fmadd_ps(y, v1, b1);
            b2 = _mm256_fmadd_ps(y, v2, b2);
            b3 = _mm256_fmadd_ps(y, v3, b3);
        }
    }
    __m128 s0 = hsum4(a0, a1, a2, a3);
    __m128 s1 = two ? hsum4(b0, b1, b2, b3) : _mm_setzero_ps();
    if (d < hd) { /* head_dim not a multiple of 8 */
        float t0[4] = {0}, t1[4] = {0};
        for (; d < hd; d++)
            for (int c = 0; c < 4; c++) {
                t0[c] += q0[d] * k[(size_t)c * hd + d];
                if (two)
                    t1[c] += q1[d] * k[(size_t)c * hd + d];
            }
        s0 = _mm_add_ps(s0, _mm_loadu_ps(t0));
        s1 = _mm_add_ps(s1, _mm_loadu_ps(t1));
    }
    _mm_storeu_ps(o0, s0);
    if (two)
        _mm_storeu_ps(o1, s1);
}

/* y0 = y0*c0 + sum_j p0[j] tile[j] (and y1 likewise when two) for j < nj. */
DRAY_AI void pv_block(float *y0, float *y1, int two, float c0, float c1, const float *p0, const float *p1,
                      const float *tile, uint32_t nj, uint32_t hd)
{
    uint32_t d = 0;
#ifdef DRAY_ATT_512
    pv_512(y0, y1, two, c0, c1, p0, p1, tile, nj, hd, &d);
#endif
    __m256 vc0 = _mm256_set1_ps(c0), vc1 = _mm256_set1_ps(c1);
    for (; d + 32 <= hd; d += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(y0 + d), vc0);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(y0 + d + 8), vc0);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(y0 + d + 16), vc0);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(y0 + d + 24), vc0);
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        if (two) {
            b0 = _mm256_mul_ps(_mm256_loadu_ps(y1 + d), vc1);
            b1 = _mm256_mul_ps(_mm256_loadu_ps(y1 + d + 8), vc1);
            b2 = _mm256_mul_ps(_mm256_loadu_ps(y1 + d + 16), vc1);
            b3 = _mm256_mul_ps(_mm256_loadu_ps(y1 + d + 24), vc1);
        }
        const float *v = tile + d;
        for (uint32_t j = 0; j < nj; j++, v += hd) {
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
            __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
            __m256 x = _mm256_broadcast_ss(p0 + j);
            a0 = _mm256_fmadd_ps(x, v0, a0);
            a1 = _mm256_fmadd_ps(x, v1, a1);
            a2 = _mm256_fmadd_ps(x, v2, a2);
            a3 = _mm256_fmadd_ps(x, v3, a3);
            if (two) {
                __m256 z = _mm256_broadcast_ss(p1 + j);
                b0 = _mm256_fmadd_ps(z, v0, b0);
                b1 = _mm256_fmadd_ps(z, v1, b1);
                b2 = _mm256_fmadd_ps(z, v2, b2);
                b3 = _mm256_fmadd_ps(z, v3, b3);
            }
        }
        _mm256_storeu_ps(y0 + d, a0);
        _mm256_storeu_ps(y0 + d + 8, a1);
        _mm256_storeu_ps(y0 + d + 16, a2);
        _mm256_storeu_ps(y0 + d + 24, a3);
        if (two) {
            _mm256_storeu_ps(y1 + d, b0);
            _mm256_storeu_ps(y1 + d + 8, b1);
            _mm256_storeu_ps(y1 + d + 16, b2);
            _mm256_storeu_ps(y1 + d + 24, b3);
        }
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(y0 + d), vc0);
        __m256 b = two ? _mm256_mul_ps(_mm256_loadu_ps(y1 + d), vc1) : a;
        for (uint32_t j = 0; j < nj; j++) {
            __m256 v = _mm256_loadu_ps(tile + (size_t)j * hd + d);
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), v, a);
            if (two)
                b = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), v, b);
        }
        _mm256_storeu_ps(y0 + d, a);
        if (two)
            _mm256_storeu_ps(y1 + d, b);
    }
    for (; d < hd; d++) {
        float a = y0[d] * c0, b = two ? y1[d] * c1 : 0.0f;
        for (uint32_t j = 0; j < nj; j++) {
            a += p0[j] * tile[(size_t)j * hd + d];
            if (two)
                b += p1[j] * tile[(size_t)j * hd + d];
        }
        y0[d] = a;
        if (two)
            y1[d] = b;
    }
}

struct item_state {
    uint32_t rows;       /* query vectors: (query row, head) pairs */
    uint32_t group;      /* heads per kv head */
    uint32_t r0;         /* first query row of the item, relative to the sequence */
    uint32_t first_pos;  /* position of query row 0 of the sequence */
    float *acc, *m, *l, *tile, *sc, *ksc;
};

static float *align8(float *p)
{
    return (float *)(((uintptr_t)p + 31) & ~(uintptr_t)31);
}

/* Raw scores of every query vector against the K tile into st->sc[r][TILE]. */
static void scores(const struct item_state *st, const float *const *qv, uint32_t hd)
{
    uint32_t r = 0;
#ifdef DRAY_ATT_512
    for (; hd % 16 == 0 && r + 4 <= st->rows; r += 4)
        for (uint32_t j = 0; j < TILE; j += 4)
            qk_block4(qv + r, st->tile + (size_t)j * hd, hd, st->sc + (size_t)r * TILE + j);
#endif
    for (; r + 2 <= st->rows; r += 2)
        for (uint32_t j = 0; j < TILE; j += 4)
            qk_block(qv[r], qv[r + 1], 1, st->tile + (size_t)j * hd, hd, st->sc + (size_t)r * TILE + j,
                     st->sc + (size_t)(r + 1) * TILE + j);
    if (r < st->rows)
        for (uint32_t j = 0; j < TILE; j += 4)
            qk_block(qv[r], qv[r], 0, st->tile + (size_t)j * hd, hd, st->sc + (size_t)r * TILE + j, NULL);
}

/* Gemma 2's soft-capping of 8 scaled scores: cap * tanh(s / cap) (v4). */
DRAY_AI __m256 softcap8(__m256 s, __m256 cap, __m256 inv_cap)
{
    return _mm256_mul_ps(cap, dray_tanh_ps(_mm256_mul_ps(s, inv_cap)));
}

/* The online-softmax update for keys j0 .. j0+TILE-1 from the raw scores:
 * masked keys (outside [lo, pos], which also covers the zeroed rows past the
 * tile's end) get probability exactly 0. Leaves in st->sc the probabilities
 * and in cs[r] each vector's rescale factor. Returns whether
 * any vector saw a visible key (so V must be accumulated). */
static int softmax_tile(const struct dray_cpu_attention *a, struct item_state *st, uint32_t j0, float *cs)
{
    int any = 0;
    __m256i jv[TILE / 8];
    __m256 ks[TILE / 8];
    for (uint32_t c = 0; c < TILE / 8; c++) {
        jv[c] = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(j0 + 8 * c)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        ks[c] = _mm256_mul_ps(_mm256_loadu_ps(st->ksc + 8 * c), _mm256_set1_ps(a->scale));
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const int capped = a->softcap > 0.0f; /* one test per tile: uncapped scores pay nothing */
    const __m256 cap = _mm256_set1_ps(a->softcap), inv_cap = _mm256_set1_ps(capped ? 1.0f / a->softcap : 0.0f);
    for (uint32_t r = 0; r < st->rows; r++) {
        uint32_t pos = st->first_pos + st->r0 + r / st->group;
        uint32_t lo = dray_cpu_att_lo(pos, a->window);
        __m256i vlo = _mm256_set1_epi32((int32_t)lo), vpos = _mm256_set1_epi32((int32_t)pos);
        float *s = st->sc + (size_t)r * TILE;
        __m256 sv[TILE / 8];
        __m256 mxv = ninf;
        for (uint32_t c = 0; c < TILE / 8; c++) {
            __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(vlo, jv[c]), _mm256_cmpgt_epi32(jv[c], vpos));
            __m256 bad = _mm256_castsi256_ps(out);
            __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + 8 * c), ks[c]);
            if (capped)
                x = softcap8(x, cap, inv_cap);
            sv[c] = _mm256_blendv_ps(x, ninf, bad);
            mxv = _mm256_max_ps(mxv, sv[c]);
        }
        float mx = dray_hmax_ps(mxv);
        float mnew = mx > st->m[r] ? mx : st->m[r];
        if (mnew == -INFINITY) { /* nothing visible yet: leave the sums alone */
            cs[r] = 1.0f;
            memset(s, 0, TILE * sizeof(float));
            continue;
        }
        /* m is -inf before the first visible key: no running sums to keep */
        cs[r] = st->m[r] - mnew < FLUSH ? 0.0f : expf(st->m[r] - mnew);
        st->m[r] = mnew;
        __m256 vm = _mm256_set1_ps(mnew), sum = _mm256_setzero_ps();
        for (uint32_t c = 0; c < TILE / 8; c++) {
            __m256 x = _mm256_sub_ps(sv[c], vm); /* masked keys: -inf */
            __m256 e = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(FLUSH), _CMP_GE_OQ), dray_exp_ps(x));
            sum = _mm256_add_ps(sum, e);
            _mm256_storeu_ps(s + 8 * c, e);
        }
        st->l[r] = st->l[r] * cs[r] + dray_hsum_ps(sum);
        any |= mx != -INFINITY;
    }
    return any;
}

static void do_item(const struct dray_cpu_attention *a, uint32_t i, void *scratch)
{
    const uint32_t *it = a->item[i];
    const struct dray_cpu_kv *p = a->pool;
    uint32_t hd = p->head_dim, group = a->n_head / p->n_kv_head;
    const int32_t *sq = a->seqs + (size_t)it[0] * 4;
    uint32_t q_start = (uint32_t)sq[0], n_q = (uint32_t)sq[1], kv_len = (uint32_t)sq[2];
    const int32_t *bt = a->block_table + sq[3];
    uint32_t g = it[3];
    struct item_state st = {.rows = (it[2] - it[1]) * group, .group = group, .r0 = it[1], .first_pos = kv_len - n_q};
    st.acc = align8(scratch);
    st.m = align8(st.acc + (size_t)st.rows * hd);
    st.l = align8(st.m + st.rows);
    st.tile = align8(st.l + st.rows);
    st.sc = align8(st.tile + (size_t)TILE * hd);
    st.ksc = align8(st.sc + (size_t)st.rows * TILE);
    memset(st.acc, 0, (size_t)st.rows * hd * sizeof(float));
    const float *qv[DRAY_CPU_ATT_QBLOCK * 64];
    float cs[DRAY_CPU_ATT_QBLOCK * 64];
    for (uint32_t r = 0; r < st.rows; r++) {
        st.m[r] = -INFINITY;
        st.l[r] = 0.0f;
        size_t t = (size_t)q_start + it[1] + r / group;
        qv[r] = a->q + t * a->stride_q + (size_t)(g * group + r % group) * hd;
    }
    uint32_t pos_lo = st.first_pos + it[1], pos_hi = st.first_pos + it[2] - 1;
    uint32_t j_lo = dray_cpu_att_lo(pos_lo, a->window), j_end = pos_hi + 1;
    if (it[5] > 1) /* one chunk of one query row's keys */
        dray_cpu_att_chunk(j_lo, pos_hi, it[4], it[5], &j_lo, &j_end);
    for (uint32_t j0 = j_lo; j0 < j_end; j0 += TILE) {
        uint32_t nj = j_end - j0 < TILE ? j_end - j0 : TILE;
        size_t rows[TILE];
        tile_rows(p, bt, g, j0, nj, rows);
        load_kscales(p, rows, nj, st.ksc);
        load_tile(p, rows, 0, nj, st.tile);
        scores(&st, qv, hd);
        if (!softmax_tile(a, &st, j0, cs))
            continue;
        load_tile(p, rows, 1, nj, st.tile);
        uint32_t r = 0;
#ifdef DRAY_ATT_512
        for (; hd % 64 == 0 && r + 4 <= st.rows; r += 4)
            pv_block4(st.acc + (size_t)r * hd, cs + r, st.sc + (size_t)r * TILE, st.tile, nj, hd);
#endif
        for (; r + 2 <= st.rows; r += 2)
            pv_block(st.acc + (size_t)r * hd, st.acc + (size_t)(r + 1) * hd, 1, cs[r], cs[r + 1],
                     st.sc + (size_t)r * TILE, st.sc + (size_t)(r + 1) * TILE, st.tile, nj, hd);
        if (r < st.rows)
            pv_block(st.acc + (size_t)r * hd, NULL, 0, cs[r], 1.0f, st.sc + (size_t)r * TILE, NULL, st.tile, nj,
                     hd);
    }
    if (it[5] > 1) { /* the chunk's partial sums, merged by the glue */
        float *part = a->part + i * a->part_stride;
        memcpy(part, st.acc, (size_t)st.rows * hd * sizeof(float));
        memcpy(part + (size_t)st.rows * hd, st.m, st.rows * sizeof(float));
        memcpy(part + (size_t)st.rows * (hd + 1), st.l, st.rows * sizeof(float));
        return;
    }
    for (uint32_t r = 0; r < st.rows; r++) {
        size_t t = (size_t)q_start + it[1] + r / group;
        float *o = a->out + t * a->stride_out + (size_t)(g * group + r % group) * hd;
        float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
        for (uint32_t i = 0; i < hd; i++)
            o[i] = st.acc[(size_t)r * hd + i] * inv;
    }
}

#ifndef DRAY_ATT_ENTRY
#define DRAY_ATT_ENTRY dray_cpu_avx2_attention
#endif
void DRAY_ATT_ENTRY(const struct dray_cpu_attention *a, uint32_t i0, uint32_t i1, void *scratch)
{
    uint32_t group = a->n_head / a->pool->n_kv_head;
    if (group > 64) { /* more query vectors than the stack arrays hold */
        dray_cpu_ref_attention(a, i0, i1, scratch);
        return;
    }
    for (uint32_t i = i0; i < i1; i++)
        do_item(a, i, scratch);
}
