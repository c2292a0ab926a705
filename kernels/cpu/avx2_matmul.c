/* AVX2 matmul. I8 path: activations are quantized per token (bit-identical to
 * the reference: same division, same rounding), then int8 dot products with the
 * sign trick: maddubs needs one unsigned operand, so it multiplies |w| (0..128,
 * unsigned) by sign(w)*q (-127..127); a pair sums to at most 2*128*127 = 32512,
 * so the int16 result never saturates. madd with ones widens to int32.
 *
 * Loop order (weights are row-major [n_out][k], fixed by the ABI, no repacking):
 * output rows in blocks small enough to stay in L1/L2; inside a block, tokens in
 * groups of 8 with a 1-row x 8-token microkernel (then a group of 4 with 2x4),
 * so every weight vector loaded feeds 8 tokens; left-over tokens (decode: all of
 * them) use a 4-row x 1-token kernel that streams 4 weight rows at once. */
#include <math.h>
#include <string.h>

#include "avx2_util.h"
#include "cpu_kernels.h"

/* ---------------------------------------------------------------- quantize */

/* max |x[i]| for i in [i0, i1) */
static float amax_range(const float *x, uint32_t i0, uint32_t i1)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    uint32_t i = i0;
    for (; i + 8 <= i1; i += 8)
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
    float r = dray_hmax_ps(m);
    for (; i < i1; i++) {
        float v = x[i] < 0 ? -x[i] : x[i];
        r = v > r ? v : r;
    }
    return r;
}

static int8_t quant1(float x, float sx)
{
    float v = nearbyintf(x / sx);
    return (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
}

/* q[i] = round(x[i] / sx) for i in [i0, i1); 32 at a time, then one by one. */
static void quant_range(const float *x, int8_t *q, float sx, uint32_t i0, uint32_t i1)
{
    const __m256 vs = _mm256_set1_ps(sx);
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    uint32_t i = i0;
    for (; i + 32 <= i1; i += 32) {
        __m256i v[4];
        for (int j = 0; j < 4; j++) {
            /* cvtps rounds with MXCSR: to nearest, ties to even, like nearbyintf */
            __m256i r = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * j), vs));
            v[j] = _mm256_max_epi32(_mm256_min_epi32(r, lim), nlim);
        }
        __m256i ab = _mm256_packs_epi32(v[0], v[1]);
        __m256i cd = _mm256_packs_epi32(v[2], v[3]);
        __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), perm);
        _mm256_storeu_si256((__m256i *)(q + i), b);
    }
    for (; i < i1; i++)
        q[i] = quant1(x[i], sx);
}

void dray_cpu_avx2_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = a->x + (size_t)t * a->stride_x;
        int8_t *q = a->q + (size_t)t * a->q_stride;
        /* segments between outlier channels (which are excluded and get q = 0) */
        float amax = 0.0f;
        uint32_t prev = 0;
        for (uint32_t j = 0; j <= a->n_outlier; j++) {
            uint32_t end = j < a->n_outlier ? (uint32_t)a->outlier_idx[j] : a->k;
            float m = amax_range(x, prev, end);
            amax = m > amax ? m : amax;
            prev = end + 1;
        }
        float sx = amax / 127.0f;
        a->sx[t] = sx;
        if (a->xo) {
            float *xo = a->xo + (size_t)t * a->xo_stride;
            for (uint32_t j = 0; j < a->xo_stride; j++)
                xo[j] = j < a->n_outlier ? x[a->outlier_idx[j]] : 0.0f;
        }
        memset(q, 0, a->q_stride);
        if (sx == 0.0f)
            continue;
        prev = 0;
        for (uint32_t j = 0; j <= a->n_outlier; j++) {
            uint32_t end = j < a->n_outlier ? (uint32_t)a->outlier_idx[j] : a->k;
            quant_range(x, q, sx, prev, end);
            prev = end + 1;
        }
    }
}

/* ---------------------------------------------------------------- int8 kernels */

/* acc += q . w over 32 bytes, the sign trick (see the top of the file) */
DRAY_AI __m256i dot32(__m256i acc, __m256i aw, __m256i w, __m256i q, __m256i ones)
{
    __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(q, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
}

/* Scalar tail k32..k of one row/token pair. */
DRAY_AI int32_t tail_dot(const int8_t *w, const int8_t *q, uint32_t k32, uint32_t k)
{
    int32_t s = 0;
    for (uint32_t c = k32; c < k; c++)
        s += (int32_t)w[c] * q[c];
    return s;
}

/* 4 rows (w, w+k, w+2k, w+3k) x 1 token q: sums into r[4]. */
static void mk_4x1(const int8_t *w, uint32_t k, const int8_t *q, int32_t r[4])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    const int8_t *w0 = w, *w1 = w + k, *w2 = w + 2 * (size_t)k, *w3 = w + 3 * (size_t)k;
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(q + c));
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(w0 + c));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(w1 + c));
        __m256i v2 = _mm256_loadu_si256((const __m256i *)(w2 + c));
        __m256i v3 = _mm256_loadu_si256((const __m256i *)(w3 + c));
        a0 = dot32(a0, _mm256_abs_epi8(v0), v0, x, ones);
        a1 = dot32(a1, _mm256_abs_epi8(v1), v1, x, ones);
        a2 = dot32(a2, _mm256_abs_epi8(v2), v2, x, ones);
        a3 = dot32(a3, _mm256_abs_epi8(v3), v3, x, ones);
    }
    _mm_storeu_si128((__m128i *)r, dray_hsum4_epi32(a0, a1, a2, a3));
    if (k32 < k) {
        r[0] += tail_dot(w0, q, k32, k);
        r[1] += tail_dot(w1, q, k32, k);
        r[2] += tail_dot(w2, q, k32, k);
        r[3] += tail_dot(w3, q, k32, k);
    }
}

/* 1 row x 1 token. */
static int32_t mk_1x1(const int8_t *w, uint32_t k, const int8_t *q)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_setzero_si256();
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + c));
        a = dot32(a, _mm256_abs_epi8(v), v, _mm256_loadu_si256((const __m256i *)(q + c)), ones);
    }
    return dray_hsum_epi32(a) + tail_dot(w, q, k32, k);
}

/* 2 rows x 4 tokens (q rows qs bytes apart): r[row][token]. */
static void mk_2x4(const int8_t *w, uint32_t k, const int8_t *q, size_t qs, int32_t r[2][4])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a03 = a00;
    __m256i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    const int8_t *w0 = w, *w1 = w + k;
    const int8_t *q0 = q, *q1 = q + qs, *q2 = q + 2 * qs, *q3 = q + 3 * qs;
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(w0 + c));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(w1 + c));
        __m256i u0 = _mm256_abs_epi8(v0), u1 = _mm256_abs_epi8(v1);
        __m256i x;
        x = _mm256_load_si256((const __m256i *)(q0 + c));
        a00 = dot32(a00, u0, v0, x, ones);
        a10 = dot32(a10, u1, v1, x, ones);
        x = _mm256_load_si256((const __m256i *)(q1 + c));
        a01 = dot32(a01, u0, v0, x, ones);
        a11 = dot32(a11, u1, v1, x, ones);
        x = _mm256_load_si256((const __m256i *)(q2 + c));
        a02 = dot32(a02, u0, v0, x, ones);
        a12 = dot32(a12, u1, v1, x, ones);
        x = _mm256_load_si256((const __m256i *)(q3 + c));
        a03 = dot32(a03, u0, v0, x, ones);
        a13 = dot32(a13, u1, v1, x, ones);
    }
    _mm_storeu_si128((__m128i *)r[0], dray_hsum4_epi32(a00, a01, a02, a03));
    _mm_storeu_si128((__m128i *)r[1], dray_hsum4_epi32(a10, a11, a12, a13));
    if (k32 < k)
        for (int i = 0; i < 2; i++)
            for (int t = 0; t < 4; t++)
                r[i][t] += tail_dot(w + (size_t)i * k, q + (size_t)t * qs, k32, k);
}

/* 1 row x 8 tokens: r[token]. 8 accumulators + 5 temporaries fit the 16
 * registers (a 2x4 tile spills with gcc 12). */
static void mk_1x8(const int8_t *w, uint32_t k, const int8_t *q, size_t qs, int32_t r[8])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a[8];
    for (int t = 0; t < 8; t++)
        a[t] = _mm256_setzero_si256();
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + c));
        __m256i u = _mm256_abs_epi8(v);
        for (int t = 0; t < 8; t++)
            a[t] = dot32(a[t], u, v, _mm256_load_si256((const __m256i *)(q + t * qs + c)), ones);
    }
    _mm_storeu_si128((__m128i *)r, dray_hsum4_epi32(a[0], a[1], a[2], a[3]));
    _mm_storeu_si128((__m128i *)(r + 4), dray_hsum4_epi32(a[4], a[5], a[6], a[7]));
    if (k32 < k)
        for (int t = 0; t < 8; t++)
            r[t] += tail_dot(w, q + (size_t)t * qs, k32, k);
}

DRAY_AI void put(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o, int32_t isum)
{
    float v = dray_avx2_mm_finish(a, t, o, isum);
    float *y = a->out + (size_t)t * a->stride_out + o;
    *y = a->accumulate ? *y + v : v;
}

static void matmul_i8_block(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    const int8_t *W = a->w;
    uint32_t k = a->k;
    uint32_t t = 0;
    /* token groups of 8: 1x8 microkernel over the row block */
    for (; t + 8 <= a->n_tok; t += 8) {
        const int8_t *q = a->q + (size_t)t * a->q_stride;
        for (uint32_t o = o0; o < o1; o++) {
            int32_t r[8];
            mk_1x8(W + (size_t)o * k, k, q, a->q_stride, r);
            for (uint32_t j = 0; j < 8; j++)
                put(a, t + j, o, r[j]);
        }
    }
    /* token groups of 4: 2x4 microkernel over the row block */
    for (; t + 4 <= a->n_tok; t += 4) {
        const int8_t *q = a->q + (size_t)t * a->q_stride;
        uint32_t o = o0;
        for (; o + 2 <= o1; o += 2) {
            int32_t r[2][4];
            mk_2x4(W + (size_t)o * k, k, q, a->q_stride, r);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 4; j++)
                    put(a, t + (uint32_t)j, o + (uint32_t)i, r[i][j]);
        }
        for (; o < o1; o++)
            for (uint32_t j = 0; j < 4; j++)
                put(a, t + j, o, mk_1x1(W + (size_t)o * k, k, q + (size_t)j * a->q_stride));
    }
    /* remaining tokens one at a time, 4 rows at once */
    for (; t < a->n_tok; t++) {
        const int8_t *q = a->q + (size_t)t * a->q_stride;
        uint32_t o = o0;
        for (; o + 4 <= o1; o += 4) {
            int32_t r[4];
            mk_4x1(W + (size_t)o * k, k, q, r);
            for (uint32_t i = 0; i < 4; i++)
                put(a, t, o + i, r[i]);
        }
        for (; o < o1; o++)
            put(a, t, o, mk_1x1(W + (size_t)o * k, k, q));
    }
}

/* ---------------------------------------------------------------- f32 kernels */

/* 4 rows x 1 token in f32 FMA. */
static void mk_f32_4x1(const float *w, uint32_t k, const float *x, float r[4])
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *w0 = w, *w1 = w + k, *w2 = w + 2 * (size_t)k, *w3 = w + 3 * (size_t)k;
    uint32_t k8 = k & ~7u;
    for (uint32_t c = 0; c < k8; c += 8) {
        __m256 xv = _mm256_loadu_ps(x + c);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + c), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + c), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + c), xv, a3);
    }
    r[0] = dray_hsum_ps(a0);
    r[1] = dray_hsum_ps(a1);
    r[2] = dray_hsum_ps(a2);
    r[3] = dray_hsum_ps(a3);
    for (uint32_t c = k8; c < k; c++) {
        r[0] += w0[c] * x[c];
        r[1] += w1[c] * x[c];
        r[2] += w2[c] * x[c];
        r[3] += w3[c] * x[c];
    }
}

static float mk_f32_1x1(const float *w, uint32_t k, const float *x)
{
    __m256 a = _mm256_setzero_ps();
    uint32_t k8 = k & ~7u;
    for (uint32_t c = 0; c < k8; c += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a);
    float r = dray_hsum_ps(a);
    for (uint32_t c = k8; c < k; c++)
        r += w[c] * x[c];
    return r;
}

static void matmul_f32_block(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    const float *W = a->w;
    uint32_t k = a->k;
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *x = a->x + (size_t)t * a->stride_x;
        float *y = a->out + (size_t)t * a->stride_out;
        uint32_t o = o0;
        for (; o + 4 <= o1; o += 4) {
            float r[4];
            mk_f32_4x1(W + (size_t)o * k, k, x, r);
            for (uint32_t i = 0; i < 4; i++)
                y[o + i] = a->accumulate ? y[o + i] + r[i] : r[i];
        }
        for (; o < o1; o++) {
            float r = mk_f32_1x1(W + (size_t)o * k, k, x);
            y[o] = a->accumulate ? y[o] + r : r;
        }
    }
}

void dray_cpu_avx2_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    /* Row blocks of about 16 KiB of weights: re-read from L1/L2 for every token
     * group instead of from memory. */
    size_t row_bytes = (size_t)a->k * (a->is_i8 ? 1 : 4);
    uint32_t blk = (uint32_t)(16384 / row_bytes);
    blk = blk < 4 ? 4 : blk > 64 ? 64 : blk & ~3u;
    for (uint32_t o = o0; o < o1; o += blk) {
        uint32_t e = o + blk < o1 ? o + blk : o1;
        if (a->is_i8)
            matmul_i8_block(a, o, e);
        else
            matmul_f32_block(a, o, e);
    }
}
