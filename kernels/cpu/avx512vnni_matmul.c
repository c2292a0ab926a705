/* AVX-512 VNNI int8 matmul (512-bit EVEX vpdpbusd; built with -mavx512f
 * -mavx512bw -mavx512vl -mavx512vnni plus the AVX2 flags for this file only,
 * called only when CPUID and XCR0 say the CPU and the OS have them).
 *
 * The arithmetic is the AVX-VNNI kernel's (avxvnni_matmul.c), twice as wide:
 * the quantize step stores q + 128 as u8 (the AVX2 quantize, then every byte
 * xor 0x80), vpdpbusd sums u8 x s8 products exactly mod 2^32, and per output
 *     sum_c q[c] w[c] = sum_c (q[c] + 128) w[c] - 128 sum_c w[c].
 * The row correction 128 * sum w is computed once per row block (vpdpbusd of
 * the constant 0x80 with the weights) and shared by every token; for one or
 * two tokens (decode) each tile computes it alongside instead, so the weights
 * stream through the core once. A k that is not a multiple of 64 ends in one
 * masked step: the weight bytes past k load as 0, so the activation padding
 * (q_stride is a multiple of 64) adds nothing, and there is no scalar tail.
 * The integer sums therefore equal the reference sums bit for bit. The finish
 * is dray_avx2_mm_finish per output in decode and its 16-lane copy
 * (avx512_finish.h) in prefill, so results are the AVX2 kernels' bits.
 *
 * Weights stay row-major [n_out][k] (ABI; no repacking). A prefill tile is 4
 * rows x up to 6 tokens: 24 accumulators + 4 weight vectors + 1 activation
 * vector of the 32 zmm registers, so each weight load feeds up to 6 vpdpbusd.
 * F32 weights go to the AVX2 kernel. */
#include <string.h>

#include "avx512_finish.h"

/* Full unrolling of the constant-trip loops over rows and tokens, so the
 * accumulator arrays are scalar-replaced into registers (without it gcc 12
 * keeps them in memory). */
#ifdef __clang__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL _Pragma("GCC unroll 8")
#endif

#define TR 4u /* tile rows */
#define TT 6u /* tile tokens, at most */

/* ---------------------------------------------------------------- quantize */

void dray_cpu_avx512vnni_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    dray_cpu_avx2_quantize(a, t0, t1);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (uint32_t t = t0; t < t1; t++) {
        int8_t *q = a->q + (size_t)t * a->q_stride;
        for (size_t c = 0; c < a->q_stride; c += 64) /* q_stride is a multiple of 64, rows 64-aligned */
            _mm512_store_si512((void *)(q + c), _mm512_xor_si512(_mm512_load_si512((const void *)(q + c)), bias));
    }
}

/* ---------------------------------------------------------------- kernels */

/* Bytes [c, c+64) of a weight row, those at or past k read as 0. */
DRAY_AI __m512i wload(const int8_t *w, uint32_t c, __mmask64 m)
{
    return _mm512_maskz_loadu_epi8(m, w + c);
}

/* Mask of the bytes of the step at c that lie below k. */
DRAY_AI __mmask64 kmask(uint32_t c, uint32_t k)
{
    uint32_t n = k - c;
    return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
}

/* 128 * sum of w[0 .. k) for n rows (k apart) into corr[n]. */
void dray_cpu_avx512vnni_row_corr(const int8_t *w, uint32_t k, uint32_t n, int32_t *corr)
{
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    for (uint32_t r = 0; r < n; r++) {
        const int8_t *wr = w + (size_t)r * k;
        __m512i s0 = _mm512_setzero_si512(), s1 = s0;
        uint32_t c = 0;
        for (; c + 128 <= k; c += 128) {
            s0 = _mm512_dpbusd_epi32(s0, c80, _mm512_loadu_si512((const void *)(wr + c)));
            s1 = _mm512_dpbusd_epi32(s1, c80, _mm512_loadu_si512((const void *)(wr + c + 64)));
        }
        for (; c < k; c += 64)
            s0 = _mm512_dpbusd_epi32(s0, c80, wload(wr, c, kmask(c, k)));
        corr[r] = _mm512_reduce_add_epi32(_mm512_add_epi32(s0, s1));
    }
}

/* Sum of the lanes of a 512-bit vector folded to 256 bits (for dray_hsum4_epi32). */
DRAY_AI __m256i fold(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* acc += u8 x . s8 w per int32 lane. Inline asm rather than the intrinsic:
 * gcc 12 copies every accumulator to a fresh register around
 * _mm512_dpbusd_epi32 and spills the tile; the tied "+v" keeps it in place. */
#define DP(acc, x, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w))

/* One 64-byte step at c of an R x T tile (m masks the weight bytes past k);
 * with C the row corrections accumulate alongside in column T. */
DRAY_AI void step(__m512i acc[TR][TT + 1], const int8_t *w, uint32_t k, const int8_t *q, size_t qs,
                  uint32_t R, uint32_t T, uint32_t C, uint32_t c, __mmask64 m)
{
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    __m512i wv[TR];
    UNROLL for (uint32_t i = 0; i < R; i++)
        wv[i] = wload(w + (size_t)i * k, c, m);
    if (C)
        UNROLL for (uint32_t i = 0; i < R; i++)
            DP(acc[i][T], c80, wv[i]);
    UNROLL for (uint32_t j = 0; j < T; j++) {
        __m512i x = _mm512_load_si512((const void *)(q + j * qs + c));
        UNROLL for (uint32_t i = 0; i < R; i++)
            DP(acc[i][j], x, wv[i]);
    }
}

/* R rows x T tokens (R <= 4, T <= 6, both compile-time constants after
 * inlining, so the accumulator array lives in registers): raw biased sums
 * r[row][token] over [0, k), and with C the row corrections in r[row][T]
 * (decode: the weights then stream through the core once). */
DRAY_AI void tile(const int8_t *w, uint32_t k, const int8_t *q, size_t qs, uint32_t R, uint32_t T,
                  uint32_t C, int32_t r[TR][TT + 1])
{
    __m512i acc[TR][TT + 1];
    T += C; /* the correction is one more column for the zeroing and the sums */
    UNROLL for (uint32_t i = 0; i < R; i++)
        UNROLL for (uint32_t j = 0; j < T; j++)
            acc[i][j] = _mm512_setzero_si512();
    T -= C;
    uint32_t k64 = k & ~63u;
    for (uint32_t c = 0; c < k64; c += 64)
        step(acc, w, k, q, qs, R, T, C, c, ~(__mmask64)0);
    if (k64 < k)
        step(acc, w, k, q, qs, R, T, C, k64, kmask(k64, k));
    T += C;
    /* four sums at a time: fold 512 -> 256 bits, then the AVX2 4-way reduction */
    int32_t flat[TR * (TT + 1) + 3];
    uint32_t n = 0;
    __m256i f[4];
    UNROLL for (uint32_t i = 0; i < R; i++)
        UNROLL for (uint32_t j = 0; j < T; j++) {
            f[n % 4] = fold(acc[i][j]);
            if (++n % 4 == 0)
                _mm_storeu_si128((__m128i *)(flat + n - 4), dray_hsum4_epi32(f[0], f[1], f[2], f[3]));
        }
    if (n % 4) {
        for (uint32_t z = n % 4; z < 4; z++)
            f[z] = _mm256_setzero_si256();
        _mm_storeu_si128((__m128i *)(flat + (n & ~3u)), dray_hsum4_epi32(f[0], f[1], f[2], f[3]));
    }
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t j = 0; j < T; j++)
            r[i][j] = flat[i * T + j];
}

/* The tile shapes the kernel uses, each its own function so the compiler sees
 * constant R, T and C. */
#define TILE_FN(R, T, C)                                                                          \
    static void tile_##R##x##T##_##C(const int8_t *w, uint32_t k, const int8_t *q, size_t qs,      \
                                     int32_t r[TR][TT + 1])                                       \
    {                                                                                             \
        tile(w, k, q, qs, R, T, C, r);                                                            \
    }
TILE_FN(4, 1, 1)
TILE_FN(4, 2, 1)
TILE_FN(4, 1, 0)
TILE_FN(4, 2, 0)
TILE_FN(4, 3, 0)
TILE_FN(4, 4, 0)
TILE_FN(4, 5, 0)
TILE_FN(4, 6, 0)
TILE_FN(1, 1, 1)
TILE_FN(1, 1, 0)
TILE_FN(1, 6, 0)

typedef void (*tile_fn)(const int8_t *, uint32_t, const int8_t *, size_t, int32_t[TR][TT + 1]);
static const tile_fn tiles4[TT + 1] = {NULL, tile_4x1_0, tile_4x2_0, tile_4x3_0, tile_4x4_0, tile_4x5_0, tile_4x6_0};

/* Finish an R x T tile: subtract the row corrections, scale, outliers, store.
 * Unsigned arithmetic: the biased sums may pass int32 before the correction. */
static void put_tile(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o, uint32_t R, uint32_t T,
                     int32_t r[TR][TT + 1], const int32_t *corr)
{
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t j = 0; j < T; j++) {
            int32_t s = (int32_t)((uint32_t)r[i][j] - (uint32_t)corr[i]);
            float v = dray_avx2_mm_finish(a, t + j, o + i, s);
            float *y = a->out + (size_t)(t + j) * a->stride_out + o + i;
            *y = a->accumulate ? *y + v : v;
        }
}

/* Decode (one or two tokens): no shared correction pass, each tile computes its
 * rows' corrections alongside. */
static void matmul_i8_decode(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    const int8_t *W = a->w;
    uint32_t k = a->k, T = a->n_tok;
    size_t qs = a->q_stride;
    int32_t r[TR][TT + 1], corr[TR];
    uint32_t o = o0;
    for (; o + TR <= o1; o += TR) {
        (T == 2 ? tile_4x2_1 : tile_4x1_1)(W + (size_t)o * k, k, a->q, qs, r);
        for (uint32_t i = 0; i < TR; i++)
            corr[i] = r[i][T];
        put_tile(a, 0, o, TR, T, r, corr);
    }
    for (; o < o1; o++)
        for (uint32_t j = 0; j < T; j++) {
            tile_1x1_1(W + (size_t)o * k, k, a->q + j * qs, qs, r);
            corr[0] = r[0][1];
            put_tile(a, j, o, 1, 1, r, corr);
        }
}

/* Tokens [t, t+T) of a row block: every tile's corrected sums into
 * s[token][row - o0]. */
static void block_sums(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1, uint32_t t, uint32_t T,
                       const int32_t *corr, int32_t s[TT][64])
{
    const int8_t *W = a->w;
    uint32_t k = a->k;
    size_t qs = a->q_stride;
    const int8_t *q = a->q + (size_t)t * qs;
    int32_t r[TR][TT + 1];
    uint32_t o = o0;
    for (; o + TR <= o1; o += TR) {
        tiles4[T](W + (size_t)o * k, k, q, qs, r);
        for (uint32_t i = 0; i < TR; i++)
            for (uint32_t j = 0; j < T; j++)
                s[j][o - o0 + i] = (int32_t)((uint32_t)r[i][j] - (uint32_t)corr[o - o0 + i]);
    }
    for (; o < o1; o++) {
        if (T == TT) {
            tile_1x6_0(W + (size_t)o * k, k, q, qs, r);
        } else {
            for (uint32_t j = 0; j < T; j++) {
                int32_t r1[TR][TT + 1];
                tile_1x1_0(W + (size_t)o * k, k, q + j * qs, qs, r1);
                r[0][j] = r1[0][0];
            }
        }
        for (uint32_t j = 0; j < T; j++)
            s[j][o - o0] = (int32_t)((uint32_t)r[0][j] - (uint32_t)corr[o - o0]);
    }
}

/* Prefill: rows [o0, o1) (at most 64) for every token, T <= 6 tokens at a time;
 * the finish runs 16 rows at once (avx512_finish.h) with this block's outlier
 * weights transposed once, or per output when there are too many outliers. */
static void matmul_i8_block(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    uint32_t n = o1 - o0;
    int32_t corr[64]; /* the block has at most 64 rows */
    float owt[DRAY_AVX512_MAX_OUTL * 64];
    int vec = a->n_outlier <= DRAY_AVX512_MAX_OUTL;
    dray_cpu_avx512vnni_row_corr((const int8_t *)a->w + (size_t)o0 * a->k, a->k, n, corr);
    if (vec && a->n_outlier)
        dray_avx512_transpose_outliers(a, o0, n, owt, 64);
    for (uint32_t t = 0; t < a->n_tok; t += TT) {
        uint32_t T = a->n_tok - t < TT ? a->n_tok - t : TT;
        int32_t s[TT][64];
        block_sums(a, o0, o1, t, T, corr, s);
        for (uint32_t j = 0; j < T; j++) {
            if (vec) {
                for (uint32_t r0 = 0; r0 < n; r0 += 16) {
                    uint32_t m = n - r0 < 16 ? n - r0 : 16;
                    __m512i isum = _mm512_maskz_loadu_epi32((__mmask16)((1u << m) - 1), s[j] + r0);
                    dray_avx512_finish16(a, t + j, o0 + r0, m, isum, owt + r0, 64);
                }
                continue;
            }
            float *y = a->out + (size_t)(t + j) * a->stride_out + o0;
            for (uint32_t i = 0; i < n; i++) {
                float v = dray_avx2_mm_finish(a, t + j, o0 + i, s[j][i]);
                y[i] = a->accumulate ? y[i] + v : v;
            }
        }
    }
}

void dray_cpu_avx512vnni_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    if (!a->is_i8) {
        dray_cpu_avx2_matmul(a, o0, o1);
        return;
    }
    if (a->n_tok <= 2) {
        matmul_i8_decode(a, o0, o1);
        return;
    }
    /* Row blocks of about 16 KiB of weights (at most 64 rows: corr[] above), so
     * they are re-read from L1/L2 for every token group. */
    uint32_t blk = (uint32_t)(16384 / a->k);
    blk = blk < 4 ? 4 : blk > 64 ? 64 : blk & ~3u;
    for (uint32_t o = o0; o < o1; o += blk)
        matmul_i8_block(a, o, o + blk < o1 ? o + blk : o1);
}
