/* Small AVX2 helpers shared by the avx2_*.c kernels (compiled with -mavx2 -mfma
 * -mf16c; never include this from a file built without them). */
#ifndef DRAY_CPU_AVX2_UTIL_H
#define DRAY_CPU_AVX2_UTIL_H

#include <immintrin.h>
#include <stdint.h>

#define DRAY_AI static inline __attribute__((always_inline))

/* Sum of the 8 floats of v. */
DRAY_AI float dray_hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

DRAY_AI float dray_hmax_ps(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The four sums of the int32 lanes of a, b, c, d, as one vector {a, b, c, d}. */
DRAY_AI __m128i dray_hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_hadd_epi32(a, b);  /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256i cd = _mm256_hadd_epi32(c, d);
    __m256i abcd = _mm256_hadd_epi32(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 ... */
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

DRAY_AI int32_t dray_hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* e^x for 8 floats, relative error ~2e-7 over [-87, 88]; below -87.3 the result
 * is ~1e-38 rather than 0 (callers that need exact zeros mask them).
 * exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n*ln2 (split in two
 * constants so r is exact), exp(r) by its Taylor series to r^7 (|r| <= ln2/2,
 * truncation < 1e-8). */
DRAY_AI __m256 dray_exp_ps(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x); /* ln2 high part, exact product */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);    /* ln2 low part */
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n: n in [-126, 128]; 128 only for x near 88.7, split as 2^(n-1) * 2 */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(126)), 23);
    return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.0f));
}

/* tanh of 8 floats, absolute error ~2e-7: sign(x) (1 - e) / (1 + e) with
 * e = e^(-2|x|) (no overflow: e <= 1), and below |x| = 1/16, where 1 - e
 * cancels, its Taylor series x - x^3/3 + 2x^5/15 (truncation < 1e-10). */
DRAY_AI __m256 dray_tanh_ps(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 e = dray_exp_ps(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    __m256 big = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    __m256 x2 = _mm256_mul_ps(ax, ax);
    __m256 poly = _mm256_fmadd_ps(x2, _mm256_set1_ps(2.0f / 15.0f), _mm256_set1_ps(-1.0f / 3.0f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(poly, x2), ax, ax);
    __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(x, sign));
}

#endif
