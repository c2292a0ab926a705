/* AVX-VNNI int8 matmul (256-bit VEX vpdpbusd; built with -mavx2 -mfma -mf16c
 * -mavxvnni for this file only, called only when CPUID says AVX-VNNI).
 *
 * vpdpbusd adds, per int32 lane, four products u8 x s8 with no intermediate
 * saturation (the non-"s" form wraps mod 2^32). The activations become the
 * unsigned operand by a bias: after the AVX2 quantize step (the very same code,
 * so q and sx are bit-identical) every byte of q is xored with 0x80, i.e. the
 * buffer holds q + 128 in 0..254 as u8. Then for one output
 *     sum_c q[c] w[c] = sum_c (q[c] + 128) w[c] - 128 sum_c w[c]
 * and the second term is a per-row constant (computed once per row block, or
 * alongside in the one-token kernel). Every step is an integer sum, exact mod
 * 2^32, and the true value fits in int32 (|sum| <= 65536 * 127 * 128 < 2^31),
 * so the result equals the AVX2 and reference sums bit for bit; the finish
 * (scales, outlier channels, accumulate) is the shared dray_avx2_mm_finish.
 *
 * Weights stay row-major [n_out][k] (ABI; no repacking) and are the memory
 * operand of vpdpbusd, so a tile keeps only accumulators and one activation
 * vector in registers: prefill uses 4 rows x 3 tokens (12 accumulators), the
 * left-over tokens (decode: all) 4 rows x 1 token. F32 weights go to the AVX2
 * kernels. */
#include <string.h>

#include "avx2_util.h"
#include "cpu_kernels.h"

#define TR 4u /* tile rows */
#define TT 3u /* tile tokens */

/* ---------------------------------------------------------------- quantize */

void dray_cpu_avxvnni_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    dray_cpu_avx2_quantize(a, t0, t1);
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (uint32_t t = t0; t < t1; t++) {
        int8_t *q = a->q + (size_t)t * a->q_stride;
        for (size_t c = 0; c < a->q_stride; c += 32) /* q_stride is a multiple of 64 */
            _mm256_store_si256((__m256i *)(q + c),
                               _mm256_xor_si256(_mm256_load_si256((const __m256i *)(q + c)), bias));
    }
}

/* ---------------------------------------------------------------- kernels */

DRAY_AI __m256i ld(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* acc += u8 x . s8 w, per int32 lane. Inline asm rather than the intrinsic:
 * gcc 12 copies the accumulator to a new register around every
 * _mm256_dpbusd_avx_epi32 and spills the tile; the tied "+x" keeps it in place
 * and "m" lets the weights be the memory operand. */
#define DPM(acc, x, wp) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(x), "m"(*(const __m256i_u *)(wp)))
#define DPR(acc, x, w) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(x), "x"(w))

/* Scalar tail k32..k of one row with biased activations qb. Unbias to s8 and
 * multiply s8 x s8: written as w * ((u8)qb - 128), gcc 12 -O3 -mavxvnni
 * vectorizes the loop into a wrong vpdpbusd sum (tails of 16 or more). */
DRAY_AI int32_t tail_dot(const int8_t *w, const int8_t *qb, uint32_t k32, uint32_t k)
{
    int32_t s = 0;
    for (uint32_t c = k32; c < k; c++)
        s += (int32_t)w[c] * (int8_t)(qb[c] ^ 0x80);
    return s;
}

/* 128 * sum of w[0 .. k32) for n rows (k apart) into corr[n]. */
static void row_corr(const int8_t *w, uint32_t k, uint32_t n, int32_t *corr)
{
    const __m256i c80 = _mm256_set1_epi8((char)0x80);
    uint32_t k32 = k & ~31u;
    for (uint32_t r = 0; r < n; r++) {
        const int8_t *wr = w + (size_t)r * k;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        uint32_t c = 0;
        for (; c + 64 <= k32; c += 64) {
            DPM(s0, c80, wr + c);
            DPM(s1, c80, wr + c + 32);
        }
        if (c < k32)
            DPM(s0, c80, wr + c);
        corr[r] = dray_hsum_epi32(_mm256_add_epi32(s0, s1));
    }
}


/* 4 rows x 3 tokens: raw biased sums r[row][token] over [0, k32) (no tail, no
 * correction). Named accumulators: with an array gcc 12 shuffles and spills
 * them around the tied vpdpbusd operand. */
static void mk_4x3(const int8_t *w, uint32_t k, const int8_t *q, size_t qs, int32_t r[TR][TT])
{
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256i a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    const int8_t *w0 = w, *w1 = w + k, *w2 = w + 2 * (size_t)k, *w3 = w + 3 * (size_t)k;
    const int8_t *q0 = q, *q1 = q + qs, *q2 = q + 2 * qs;
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i x = _mm256_load_si256((const __m256i *)(q0 + c));
        DPM(a00, x, w0 + c);
        DPM(a10, x, w1 + c);
        DPM(a20, x, w2 + c);
        DPM(a30, x, w3 + c);
        x = _mm256_load_si256((const __m256i *)(q1 + c));
        DPM(a01, x, w0 + c);
        DPM(a11, x, w1 + c);
        DPM(a21, x, w2 + c);
        DPM(a31, x, w3 + c);
        x = _mm256_load_si256((const __m256i *)(q2 + c));
        DPM(a02, x, w0 + c);
        DPM(a12, x, w1 + c);
        DPM(a22, x, w2 + c);
        DPM(a32, x, w3 + c);
    }
    __m128i s0 = dray_hsum4_epi32(a00, a01, a02, a10), s1 = dray_hsum4_epi32(a11, a12, a20, a21);
    __m128i s2 = dray_hsum4_epi32(a22, a30, a31, a32);
    int32_t flat[12];
    _mm_storeu_si128((__m128i *)flat, s0);
    _mm_storeu_si128((__m128i *)(flat + 4), s1);
    _mm_storeu_si128((__m128i *)(flat + 8), s2);
    memcpy(r, flat, sizeof(flat));
}

/* 1 row x 3 tokens, like mk_4x3. */
static void mk_1x3(const int8_t *w, uint32_t k, const int8_t *q, size_t qs, int32_t r[TR][TT])
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0;
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i v = ld(w + c);
        DPR(a0, _mm256_load_si256((const __m256i *)(q + c)), v);
        DPR(a1, _mm256_load_si256((const __m256i *)(q + qs + c)), v);
        DPR(a2, _mm256_load_si256((const __m256i *)(q + 2 * qs + c)), v);
    }
    r[0][0] = dray_hsum_epi32(a0);
    r[0][1] = dray_hsum_epi32(a1);
    r[0][2] = dray_hsum_epi32(a2);
}

/* 4 rows x 1 token with the row correction accumulated alongside (decode: the
 * weights stream from memory once, no separate pass for the row sums). */
static void mk_4x1(const int8_t *w, uint32_t k, const int8_t *q, int32_t r[4])
{
    const __m256i c80 = _mm256_set1_epi8((char)0x80);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    __m256i b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const int8_t *w0 = w, *w1 = w + k, *w2 = w + 2 * (size_t)k, *w3 = w + 3 * (size_t)k;
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i x = _mm256_load_si256((const __m256i *)(q + c));
        __m256i v0 = ld(w0 + c), v1 = ld(w1 + c), v2 = ld(w2 + c), v3 = ld(w3 + c);
        DPR(a0, x, v0);
        DPR(b0, c80, v0);
        DPR(a1, x, v1);
        DPR(b1, c80, v1);
        DPR(a2, x, v2);
        DPR(b2, c80, v2);
        DPR(a3, x, v3);
        DPR(b3, c80, v3);
    }
    /* lane-wise a - b wraps like the sums themselves; the total is exact */
    __m128i s = dray_hsum4_epi32(_mm256_sub_epi32(a0, b0), _mm256_sub_epi32(a1, b1),
                                 _mm256_sub_epi32(a2, b2), _mm256_sub_epi32(a3, b3));
    _mm_storeu_si128((__m128i *)r, s);
    if (k32 < k) {
        r[0] += tail_dot(w0, q, k32, k);
        r[1] += tail_dot(w1, q, k32, k);
        r[2] += tail_dot(w2, q, k32, k);
        r[3] += tail_dot(w3, q, k32, k);
    }
}

/* 1 row x 1 token, correction alongside. */
static int32_t mk_1x1(const int8_t *w, uint32_t k, const int8_t *q)
{
    const __m256i c80 = _mm256_set1_epi8((char)0x80);
    __m256i a = _mm256_setzero_si256(), b = a;
    uint32_t k32 = k & ~31u;
    for (uint32_t c = 0; c < k32; c += 32) {
        __m256i v = ld(w + c);
        DPR(a, _mm256_load_si256((const __m256i *)(q + c)), v);
        DPR(b, c80, v);
    }
    return dray_hsum_epi32(_mm256_sub_epi32(a, b)) + tail_dot(w, q, k32, k);
}

DRAY_AI void put(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o, int32_t isum)
{
    float v = dray_avx2_mm_finish(a, t, o, isum);
    float *y = a->out + (size_t)t * a->stride_out + o;
    *y = a->accumulate ? *y + v : v;
}

/* Finish an R x T tile: subtract the row corrections, add the tails, store.
 * Unsigned arithmetic: the biased sums may exceed int32 before the correction. */
DRAY_AI void put_tile(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o, uint32_t R, uint32_t T,
                      int32_t r[TR][TT], const int32_t *corr)
{
    const int8_t *W = (const int8_t *)a->w + (size_t)o * a->k;
    const int8_t *q = a->q + (size_t)t * a->q_stride;
    uint32_t k32 = a->k & ~31u;
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t j = 0; j < T; j++) {
            uint32_t s = (uint32_t)r[i][j] - (uint32_t)corr[i];
            if (k32 < a->k)
                s += (uint32_t)tail_dot(W + (size_t)i * a->k, q + (size_t)j * a->q_stride, k32, a->k);
            put(a, t + j, o + i, (int32_t)s);
        }
}

static void matmul_i8_block(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    const int8_t *W = a->w;
    uint32_t k = a->k;
    size_t qs = a->q_stride;
    uint32_t t = 0;
    if (a->n_tok >= TT) {
        int32_t corr[64]; /* the block has at most 64 rows */
        row_corr(W + (size_t)o0 * k, k, o1 - o0, corr);
        for (; t + TT <= a->n_tok; t += TT) {
            const int8_t *q = a->q + (size_t)t * qs;
            uint32_t o = o0;
            for (; o + TR <= o1; o += TR) {
                int32_t r[TR][TT];
                mk_4x3(W + (size_t)o * k, k, q, qs, r);
                put_tile(a, t, o, TR, TT, r, corr + (o - o0));
            }
            for (; o < o1; o++) {
                int32_t r[TR][TT];
                mk_1x3(W + (size_t)o * k, k, q, qs, r);
                put_tile(a, t, o, 1, TT, r, corr + (o - o0));
            }
        }
    }
    /* remaining tokens one at a time, 4 rows at once */
    for (; t < a->n_tok; t++) {
        const int8_t *q = a->q + (size_t)t * qs;
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

void dray_cpu_avxvnni_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    if (!a->is_i8) {
        dray_cpu_avx2_matmul(a, o0, o1);
        return;
    }
    /* Row blocks of about 16 KiB of weights (at most 64 rows: corr[] above), so
     * they are re-read from L1/L2 for every token group. */
    uint32_t blk = (uint32_t)(16384 / a->k);
    blk = blk < 4 ? 4 : blk > 64 ? 64 : blk & ~3u;
    for (uint32_t o = o0; o < o1; o += blk)
        matmul_i8_block(a, o, o + blk < o1 ? o + blk : o1);
}
