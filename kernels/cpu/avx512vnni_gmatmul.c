/* AVX-512 VNNI matmul over grouped weights (backend.h, matmul: DRAY_Q8G32 and
 * DRAY_Q4G32). One zmm covers 64 input channels, two groups: vpdpbusd sums each
 * 4 adjacent products into one of 16 int32 lanes, so lanes 0-7 belong to the
 * first group and 8-15 to the second. Each lane is converted to f32 and scaled
 * by its group's factors, which a broadcast of two (or four) floats supplies;
 * the 16 lanes are reduced once per output. The int32 group sums are exact as
 * in the reference; only the f32 summation order differs (within the op's
 * tolerance).
 *   Q8G32: vpdpbusd takes u8 x s8, so the weights enter as w + 128 (xor 0x80)
 *          and each lane starts from -128 * (its 4 q summed) = lsum, which the
 *          quantize step stores once per token.
 *   Q4G32: the nibbles are already u8 0..15: unpacked with one permute, one
 *          masked shift and an and; the min term m * sum(q) of a group is
 *          spread over its lanes as m * lsum. */
#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"

void dray_cpu_avx512vnni_gquantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    dray_cpu_ref_gquantize(a, t0, t1);
    for (uint32_t t = t0; t < t1; t++) {
        const int8_t *q = a->q + (size_t)t * a->q_stride;
        int32_t *ls = a->lsum + (size_t)t * (a->k / 4);
        for (uint32_t i = 0; i < a->k / 4; i++)
            ls[i] = (int32_t)q[4 * i] + q[4 * i + 1] + q[4 * i + 2] + q[4 * i + 3];
    }
}

/* Lanes 0-7 = v[0], lanes 8-15 = v[1]. */
static inline __m512 spread2(__m128 v)
{
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/* Two floats from p (one when only one group is left; the other lane is 0). */
static inline __m128 load2(const float *p, int two)
{
    return two ? _mm_castpd_ps(_mm_load_sd((const double *)p)) : _mm_load_ss(p);
}

static float dot_q8g(const struct dray_cpu_matmul *a, const int8_t *w, const float *ws, uint32_t t)
{
    const int8_t *q = a->q + (size_t)t * a->q_stride;
    const int32_t *ls = a->lsum + (size_t)t * (a->k / 4);
    const float *sx = a->gsx + (size_t)t * (a->k / 32);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t c = 0; c < a->k; c += 64) {
        int two = a->k - c >= 64;
        __mmask64 mb = two ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
        __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mb, w + c), bias);
        __m512i av = _mm512_load_si512((const void *)(q + c)); /* rows are zero-padded to 64 */
        __m512i corr = _mm512_maskz_loadu_epi32(two ? 0xFFFF : 0x00FF, ls + c / 4);
        __m512i dot = _mm512_dpbusd_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(corr, 7)),
                                          wv, av);
        __m128 s = _mm_mul_ps(load2(ws + c / 32, two), load2(sx + c / 32, two));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), spread2(s), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static float dot_q4g(const struct dray_cpu_matmul *a, const uint8_t *w, const float *dm, uint32_t t)
{
    const int8_t *q = a->q + (size_t)t * a->q_stride;
    const int32_t *ls = a->lsum + (size_t)t * (a->k / 4);
    const float *sx = a->gsx + (size_t)t * (a->k / 32);
    /* 128-bit lanes of the result: bytes 0-15, 0-15, 16-31, 16-31 of the 32 loaded */
    const __m512i dup = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i di = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i mi = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t c = 0; c < a->k; c += 64) {
        int two = a->k - c >= 64;
        __m256i packed = _mm256_maskz_loadu_epi8(two ? 0xFFFFFFFFu : 0xFFFFu, w + c / 2);
        __m512i z = _mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(packed));
        z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4); /* 128-bit lanes 1 and 3: high nibbles */
        __m512i wv = _mm512_and_si512(z, lo4);
        __m512i av = _mm512_load_si512((const void *)(q + c));
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, av);
        __m512 qs = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(two ? 0xFFFF : 0x00FF, ls + c / 4));
        __m512 f4 = _mm512_castps128_ps512(_mm_maskz_loadu_ps(two ? 0xF : 0x3, dm + c / 16));
        __m512 d = _mm512_permutexvar_ps(di, f4), m = _mm512_permutexvar_ps(mi, f4);
        __m512 term = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), _mm512_mul_ps(m, qs));
        acc = _mm512_fmadd_ps(spread2(load2(sx + c / 32, two)), term, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

void dray_cpu_avx512vnni_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    uint32_t G = a->k / 32;
    for (uint32_t o = o0; o < o1; o++) {
        for (uint32_t t = 0; t < a->n_tok; t++) {
            float v = a->wdtype == DRAY_Q8G32
                          ? dot_q8g(a, (const int8_t *)a->w + (size_t)o * a->k, a->wscale + (size_t)o * G, t)
                          : dot_q4g(a, (const uint8_t *)a->w + (size_t)o * (a->k / 2),
                                    a->wscale + (size_t)o * G * 2, t);
            float *y = a->out + (size_t)t * a->stride_out + o;
            *y = a->accumulate ? *y + v : v;
        }
    }
}
