/* AVX2 matmul over grouped weights (backend.h, matmul: DRAY_Q8G32, DRAY_Q4G32,
 * DRAY_Q5G32, DRAY_Q4G32H (Q5G32's code without the high unit)),
 * for CPUs without AVX-512 VNNI. Same plan as avx512vnni_gmatmul.c on 8 lanes:
 * each 64-byte unit of the 16-row layout is two 32-byte halves (rows 0-7 and
 * 8-15), one 32-bit lane per row, multiplied against 4 activation bytes
 * broadcast to every lane. Without vpdpbusd the 4 products of a lane are
 * vpmaddubsw (u8 x s8 into int16 pairs) then vpmaddwd by ones; the pairs cannot
 * saturate: Q8G32 multiplies |w| <= 128 by sign-adjusted q (|q| <= 127), Q4G32
 * nibbles <= 15 by q (Q5G32 codes <= 31: pairs within 2 * 31 * 127). The group's
 * int32 sums are exact; the f32 scale products are applied 8 rows at a time.
 * Q5G32's bit 4 arrives as 32 bits per half unit (one per byte), spread to
 * bytes with a byte shuffle and a compare against each byte's own bit. */
#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"

static inline __m256i bcast4(const int8_t *q, uint32_t c)
{
    int32_t v;
    memcpy(&v, q + c, 4);
    return _mm256_set1_epi32(v);
}

/* 4 products per lane: w (s8) . a (s8) via |w| . sign(a, w) */
static inline __m256i dot4_s8(__m256i w, __m256i a, __m256i ones)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)), ones);
}

/* 4 products per lane: w (u8 0..15) . a (s8) */
static inline __m256i dot4_u4(__m256i w, __m256i a, __m256i ones)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
}

/* 16 where bit i of m is set, for byte i (0..31). */
static inline __m256i bits16(uint32_t m)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                            2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(16));
}

/* Rows 16b .. 16b+7 (half 0) or 16b+8 .. 16b+15 (half 1) of one Q5G32 group of
 * token row q: the int32 sums of q * code, one row per lane. hib 0: a Q4G32H
 * group (the nibbles alone; inlined with a constant, the high unit's part is
 * compiled out). */
static inline __attribute__((always_inline)) __m256i q5_half(const uint8_t *w, const int8_t *q, int half,
                                                             __m256i ones, __m256i lo4, int hib)
{
    __m256i s = _mm256_setzero_si256();
    for (uint32_t u = 0; u < 4; u++) {
        __m256i z = _mm256_loadu_si256((const void *)(w + 64 * u + 32 * half));
        __m256i l = _mm256_and_si256(z, lo4);
        __m256i h = _mm256_and_si256(_mm256_srli_epi16(z, 4), lo4);
        if (hib) {
            uint32_t ml, mh; /* bits 32*half .. of words u and 4+u */
            memcpy(&ml, w + 256 + 8 * u + 4 * half, 4);
            memcpy(&mh, w + 256 + 32 + 8 * u + 4 * half, 4);
            l = _mm256_or_si256(l, bits16(ml));
            h = _mm256_or_si256(h, bits16(mh));
        }
        s = _mm256_add_epi32(s, dot4_u4(l, bcast4(q, 4 * u), ones));
        s = _mm256_add_epi32(s, dot4_u4(h, bcast4(q, 16 + 4 * u), ones));
    }
    return s;
}

/* One group of 32 inputs into int8 as ref_gmatmul.c does it, bit for bit: the
 * scale amax/127 divided once, each x/sx by a true division (not a reciprocal)
 * rounded to nearest even, clamped; returns the group's sum of q. */
static int32_t quant_group(const float *x, int8_t *q, float *sx_out)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float sx = _mm_cvtss_f32(h) / 127.0f;
    *sx_out = sx;
    if (sx == 0.0f) {
        memset(q, 0, 32);
        return 0;
    }
    const __m256 vs = _mm256_set1_ps(sx), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    __m256i n[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256 r = _mm256_round_ps(_mm256_div_ps(v[i], vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        n[i] = _mm256_cvtps_epi32(_mm256_max_ps(lo, _mm256_min_ps(hi, r)));
        sum = _mm256_add_epi32(sum, n[i]);
    }
    /* packs work within 128-bit lanes: 4-byte runs come out as 0 2 4 6 1 3 5 7 */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)q, b);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    return _mm_cvtsi128_si32(s4);
}

/* The grouped quantize step (cpu_kernels.h), results identical to
 * dray_cpu_ref_gquantize, without the reference's division and libm call per
 * input (docs/performance.md: they were a noticeable share of a prefill). */
void dray_cpu_avx2_gquantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    const uint32_t G = a->k / 32;
    float r[32];
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = a->x + (size_t)t * a->stride_x;
        size_t row = (size_t)t << a->pairs;
        for (uint32_t p = 0; p <= a->pairs; p++) /* the padding after k stays zero */
            memset(a->q + (row + p) * a->q_stride + a->k, 0, a->q_stride - a->k);
        for (uint32_t g = 0; g < G; g++) {
            int8_t *q = a->q + row * a->q_stride + 32 * g;
            float *sx = a->gsx + row * G + g;
            a->gsum[row * G + g] = quant_group(x + 32 * g, q, sx);
            if (!a->pairs)
                continue;
            /* the residual (backend.h, two-pass activations): product, then
             * difference, as the reference computes it */
            __m256 vs = _mm256_set1_ps(*sx);
            for (int i = 0; i < 4; i++) {
                __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(q + 8 * i))));
                _mm256_storeu_ps(r + 8 * i, _mm256_sub_ps(_mm256_loadu_ps(x + 32 * g + 8 * i), _mm256_mul_ps(qf, vs)));
            }
            a->gsum[(row + 1) * G + g] = quant_group(r, q + a->q_stride, sx + G);
        }
    }
}

/* Groups ahead whose weights and scales the first token's pass prefetches: the
 * (b, g) blocks follow each other in memory, so this is a plain stream, which
 * the hardware prefetcher alone left short of one core's bandwidth (as in
 * avx512vnni_gmatmul.c; docs/performance.md); a prefetch past the end never
 * faults. */
#define PF_AHEAD 16

static inline void prefetch_group(const struct dray_cpu_matmul *a, size_t bg, size_t wb, size_t sb)
{
    const char *w = (const char *)a->w + (bg + PF_AHEAD) * wb, *s = (const char *)a->wscale + (bg + PF_AHEAD) * sb;
    for (size_t l = 0; l < wb; l += 64)
        _mm_prefetch(w + l, _MM_HINT_T0);
    for (size_t l = 0; l < sb; l += 64)
        _mm_prefetch(s + l, _MM_HINT_T0);
}

/* o0 and o1 are multiples of 16 (the glue splits rows in 16s; n_out is one). */
void dray_cpu_avx2_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    const uint32_t G = a->k / 32;
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F);
    int q8 = a->wdtype == DRAY_Q8G32, q5 = a->wdtype == DRAY_Q5G32, q4h = a->wdtype == DRAY_Q4G32H;
    /* bytes of one (b, g): weights, scales */
    const size_t wb = q8 ? 512 : q5 ? 320 : 256, sb = q8 || q5 || q4h ? 64 : 128;
    for (uint32_t b = o0 / 16; b < o1 / 16; b++) {
        for (uint32_t t = 0; t < a->n_tok; t++) {
            const int8_t *qt = a->q + (size_t)t * a->q_stride;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            for (uint32_t g = 0; g < G; g++) {
                const int8_t *q = qt + 32 * g;
                if (t == 0) /* later tokens find this block's weights in cache */
                    prefetch_group(a, (size_t)b * G + g, wb, sb);
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                float sx = a->gsx[(size_t)t * G + g];
                if (q8) {
                    const uint8_t *w = (const uint8_t *)a->w + ((size_t)b * G + g) * 8 * 64;
                    for (uint32_t i = 0; i < 8; i++) {
                        __m256i av = bcast4(q, 4 * i);
                        s0 = _mm256_add_epi32(s0, dot4_s8(_mm256_loadu_si256((const void *)(w + 64 * i)), av, ones));
                        s1 = _mm256_add_epi32(s1, dot4_s8(_mm256_loadu_si256((const void *)(w + 64 * i + 32)), av, ones));
                    }
                    const float *ws = a->wscale + ((size_t)b * G + g) * 16;
                    __m256 vs = _mm256_set1_ps(sx);
                    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(vs, _mm256_loadu_ps(ws)), acc0);
                    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(vs, _mm256_loadu_ps(ws + 8)), acc1);
                } else if (q5 || q4h) { /* f16 d and m */
                    const uint8_t *w = (const uint8_t *)a->w + ((size_t)b * G + g) * wb;
                    s0 = q5 ? q5_half(w, q, 0, ones, lo4, 1) : q5_half(w, q, 0, ones, lo4, 0);
                    s1 = q5 ? q5_half(w, q, 1, ones, lo4, 1) : q5_half(w, q, 1, ones, lo4, 0);
                    const uint16_t *dm = (const uint16_t *)(const void *)a->wscale + ((size_t)b * G + g) * 32;
                    __m256 vs = _mm256_set1_ps(sx), qs = _mm256_set1_ps((float)a->gsum[(size_t)t * G + g]);
                    __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)dm));
                    __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 8)));
                    __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 16)));
                    __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 24)));
                    acc0 = _mm256_fmadd_ps(vs, _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(s0), _mm256_mul_ps(m0, qs)), acc0);
                    acc1 = _mm256_fmadd_ps(vs, _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(s1), _mm256_mul_ps(m1, qs)), acc1);
                } else {
                    const uint8_t *w = (const uint8_t *)a->w + ((size_t)b * G + g) * 4 * 64;
                    for (uint32_t u = 0; u < 4; u++) {
                        __m256i al = bcast4(q, 4 * u), ah = bcast4(q, 16 + 4 * u);
                        __m256i z0 = _mm256_loadu_si256((const void *)(w + 64 * u));
                        __m256i z1 = _mm256_loadu_si256((const void *)(w + 64 * u + 32));
                        s0 = _mm256_add_epi32(s0, dot4_u4(_mm256_and_si256(z0, lo4), al, ones));
                        s0 = _mm256_add_epi32(s0, dot4_u4(_mm256_and_si256(_mm256_srli_epi16(z0, 4), lo4), ah, ones));
                        s1 = _mm256_add_epi32(s1, dot4_u4(_mm256_and_si256(z1, lo4), al, ones));
                        s1 = _mm256_add_epi32(s1, dot4_u4(_mm256_and_si256(_mm256_srli_epi16(z1, 4), lo4), ah, ones));
                    }
                    const float *dm = a->wscale + ((size_t)b * G + g) * 32;
                    __m256 vs = _mm256_set1_ps(sx), qs = _mm256_set1_ps((float)a->gsum[(size_t)t * G + g]);
                    __m256 t0 = _mm256_fmadd_ps(_mm256_loadu_ps(dm), _mm256_cvtepi32_ps(s0),
                                                _mm256_mul_ps(_mm256_loadu_ps(dm + 16), qs));
                    __m256 t1 = _mm256_fmadd_ps(_mm256_loadu_ps(dm + 8), _mm256_cvtepi32_ps(s1),
                                                _mm256_mul_ps(_mm256_loadu_ps(dm + 24), qs));
                    acc0 = _mm256_fmadd_ps(vs, t0, acc0);
                    acc1 = _mm256_fmadd_ps(vs, t1, acc1);
                }
            }
            float *out = dray_cpu_gout(a, t) + 16 * b; /* a residual row adds to its first */
            if (dray_cpu_gadds(a, t)) {
                acc0 = _mm256_add_ps(_mm256_loadu_ps(out), acc0);
                acc1 = _mm256_add_ps(_mm256_loadu_ps(out + 8), acc1);
            }
            _mm256_storeu_ps(out, acc0);
            _mm256_storeu_ps(out + 8, acc1);
        }
    }
}
