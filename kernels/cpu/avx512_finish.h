/* The int8 matmul epilogue for 16 output rows at once in AVX-512, shared by
 * the AVX-512 VNNI and AMX kernels (include only from files built with the
 * AVX-512 flags and -ffp-contract=off). It performs, lane by lane, exactly the
 * roundings of dray_avx2_mm_finish in the same order, so every kernel set
 * gives the same bits:
 *   v = ((float)isum * sx[t]) * wscale[o]
 *   outliers: 8 fma chains over the channels j = l mod 8 below the last
 *   multiple of 8, reduced as ((0+4) + (2+6)) + ((1+5) + (3+7)), then one
 *   multiply and one add per channel left over; v + that sum
 *   accumulate: out + v.
 * Per output it costs about n_outlier / 16 fma instead of a horizontal
 * reduction, which made the scalar epilogue the larger part of a prefill
 * matmul with 16 or 32 outlier channels. */
#ifndef DRAY_CPU_AVX512_FINISH_H
#define DRAY_CPU_AVX512_FINISH_H

#include "avx2_util.h"
#include "cpu_kernels.h"

/* Outlier channels the vector finish takes (callers transpose their weights
 * on the stack); with more, callers use dray_avx2_mm_finish per output. */
#define DRAY_AVX512_MAX_OUTL 64u

/* The outlier sums of 16 rows: owt[j * ld + i] is the weight of channel j for
 * row i, xo the token's gathered outlier inputs. */
DRAY_AI __m512 dray_avx512_outliers(const float *owt, uint32_t ld, uint32_t n_outlier, const float *xo)
{
    uint32_t n8 = n_outlier & ~7u;
    __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, p4 = p0, p5 = p0, p6 = p0, p7 = p0;
    for (uint32_t j = 0; j < n8; j += 8) {
        const float *w = owt + (size_t)j * ld;
        p0 = _mm512_fmadd_ps(_mm512_loadu_ps(w), _mm512_set1_ps(xo[j]), p0);
        p1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + ld), _mm512_set1_ps(xo[j + 1]), p1);
        p2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 2 * ld), _mm512_set1_ps(xo[j + 2]), p2);
        p3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 3 * ld), _mm512_set1_ps(xo[j + 3]), p3);
        p4 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 4 * ld), _mm512_set1_ps(xo[j + 4]), p4);
        p5 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 5 * ld), _mm512_set1_ps(xo[j + 5]), p5);
        p6 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 6 * ld), _mm512_set1_ps(xo[j + 6]), p6);
        p7 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 7 * ld), _mm512_set1_ps(xo[j + 7]), p7);
    }
    __m512 q0 = _mm512_add_ps(p0, p4), q1 = _mm512_add_ps(p1, p5);
    __m512 q2 = _mm512_add_ps(p2, p6), q3 = _mm512_add_ps(p3, p7);
    __m512 s = _mm512_add_ps(_mm512_add_ps(q0, q2), _mm512_add_ps(q1, q3));
    for (uint32_t j = n8; j < n_outlier; j++)
        s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_loadu_ps(owt + (size_t)j * ld), _mm512_set1_ps(xo[j])));
    return s;
}

/* Finish rows o .. o+n-1 (n <= 16) of token t from their corrected integer
 * sums (lane i: row o + i). owt/ld as above (ignored without outliers; the
 * caller checked n_outlier <= DRAY_AVX512_MAX_OUTL). Lanes past n are not
 * stored. */
DRAY_AI void dray_avx512_finish16(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o, uint32_t n,
                                  __m512i isum, const float *owt, uint32_t ld)
{
    __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    float *y = a->out + (size_t)t * a->stride_out + o;
    __m512 ws = _mm512_maskz_loadu_ps(m, a->wscale + o);
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a->sx[t])), ws);
    if (a->n_outlier)
        v = _mm512_add_ps(v, dray_avx512_outliers(owt, ld, a->n_outlier, a->xo + (size_t)t * a->xo_stride));
    if (a->accumulate)
        v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y), v);
    _mm512_mask_storeu_ps(y, m, v);
}

/* owt[j * ld + i] = outlier weight j of row o + i, for n rows (n <= ld). */
static inline void dray_avx512_transpose_outliers(const struct dray_cpu_matmul *a, uint32_t o, uint32_t n,
                                                  float *owt, uint32_t ld)
{
    for (uint32_t i = 0; i < n; i++) {
        const float *src = a->outlier_w + (size_t)(o + i) * a->n_outlier;
        for (uint32_t j = 0; j < a->n_outlier; j++)
            owt[(size_t)j * ld + i] = src[j];
    }
    for (uint32_t i = n; i < ld; i++) /* lanes past n: defined values, never stored */
        for (uint32_t j = 0; j < a->n_outlier; j++)
            owt[(size_t)j * ld + i] = 0.0f;
}

#endif
