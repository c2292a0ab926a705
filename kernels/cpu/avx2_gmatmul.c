/* AVX2 matmul over grouped weights (backend.h, matmul: DRAY_Q8G32, DRAY_Q4G32),
 * for CPUs without AVX-512 VNNI. Same plan as avx512vnni_gmatmul.c on 8 lanes:
 * each 64-byte unit of the 16-row layout is two 32-byte halves (rows 0-7 and
 * 8-15), one 32-bit lane per row, multiplied against 4 activation bytes
 * broadcast to every lane. Without vpdpbusd the 4 products of a lane are
 * vpmaddubsw (u8 x s8 into int16 pairs) then vpmaddwd by ones; the pairs cannot
 * saturate: Q8G32 multiplies |w| <= 128 by sign-adjusted q (|q| <= 127), Q4G32
 * nibbles <= 15 by q. The group's int32 sums are exact; the f32 scale products
 * are applied 8 rows at a time. */
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

/* o0 and o1 are multiples of 16 (the glue splits rows in 16s; n_out is one). */
void dray_cpu_avx2_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    const uint32_t G = a->k / 32;
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F);
    int q8 = a->wdtype == DRAY_Q8G32;
    for (uint32_t b = o0 / 16; b < o1 / 16; b++) {
        for (uint32_t t = 0; t < a->n_tok; t++) {
            const int8_t *qt = a->q + (size_t)t * a->q_stride;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            for (uint32_t g = 0; g < G; g++) {
                const int8_t *q = qt + 32 * g;
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
            float *out = a->out + (size_t)t * a->stride_out + 16 * b;
            if (a->accumulate) {
                acc0 = _mm256_add_ps(_mm256_loadu_ps(out), acc0);
                acc1 = _mm256_add_ps(_mm256_loadu_ps(out + 8), acc1);
            }
            _mm256_storeu_ps(out, acc0);
            _mm256_storeu_ps(out + 8, acc1);
        }
    }
}
