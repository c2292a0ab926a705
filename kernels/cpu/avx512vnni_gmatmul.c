/* AVX-512 VNNI matmul over grouped weights (backend.h, matmul: DRAY_Q8G32,
 * DRAY_Q4G32, DRAY_Q5G32 and DRAY_Q4G32H). The layout puts 16 rows side by side, 4 inputs each, in every
 * 64-byte unit, so one vpdpbusd against 4 activation bytes broadcast to all
 * lanes adds 4 products to each of 16 rows at once: a group of 32 inputs is 8
 * of them, and the group's int32 sums come out with one row per lane. Each
 * group then costs one conversion and two or three fused multiply-adds per 16
 * rows, against the f32 scales stored 16 to a vector; on Zen 4 each of those
 * takes a vpdpbusd's slot, so they are kept to that floor. A pass covers one
 * block of 16 rows for up to eight q rows, so a unit is loaded (and unpacked)
 * once per eight. The int32 group sums are exact as in the reference; only the
 * f32 rounding of the scale products may differ (within the op's tolerance).
 *   Q8G32: vpdpbusd takes u8 x s8, so the weights enter as w + 128 (xor 0x80)
 *          and each group's sum starts from -128 * (the group's q summed),
 *          which the quantize step keeps (gsum).
 *   Q4G32: the nibbles are already u8 0..15: the low and high nibbles of a unit
 *          are inputs 4u.. and 16+4u.. of the group; the min term adds
 *          m * gmin (sx * gsum, from the quantize step) per group.
 *   Q5G32: Q4G32's nibbles, and each of the 8 nibble vectors gets its bit 4 from
 *          one 64-bit word of the high unit loaded straight into a mask
 *          register: a masked byte add of 16 (no shuffles), then as Q4G32 with
 *          codes 0..31; d and m are f16, widened 16 at a time (vcvtph2ps).
 *   Q4G32H: Q5G32's pass without the high unit (Q4G32's nibbles, f16 d and m).
 * Two-pass activations (a->pairs) are two q rows per token: a pass of eight
 * rows covers four tokens, both passes against one load of the weights, and
 * a token's two rows share one accumulator, so d, m and the output are
 * applied once per token (docs/performance.md, "CPU grouped kernels"). */
#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"

#define TB 8 /* q rows per pass (tokens, or halves of two-pass tokens) */
/* Groups ahead that each pass prefetches its weights and scales (a (b, g) is
 * contiguous after the one before, across blocks too, so this is a plain
 * stream; a prefetch past the end is a hint and never faults): the hardware
 * prefetcher alone left decode-shaped matmuls short of one core's bandwidth, in
 * every pass (docs/performance.md, "CPU grouped kernels"). */
#define PF_AHEAD 16
#define AI inline __attribute__((always_inline))

/* 4 activation bytes of token row q at input c, in every lane. */
static AI __m512i bcast4(const int8_t *q, uint32_t c)
{
    int32_t v;
    memcpy(&v, q + c, 4);
    return _mm512_set1_epi32(v);
}

/* sx * sum(q*code) of q row r and one group against unpacked codes (lo[u]:
 * inputs 4u.., hi[u]: 16+4u.., one row per 32-bit lane), plus p. Two chains of
 * 4 dependent vpdpbusd instead of one of 8; the int32 sum is exact either way. */
static AI __m512 nibble_dot(const struct dray_cpu_matmul *a, size_t r, uint32_t g, const __m512i *lo,
                            const __m512i *hi, __m512 p)
{
    const uint32_t G = a->k / 32;
    const int8_t *q = a->q + r * a->q_stride + 32 * g;
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int u = 0; u < 4; u++) {
        s0 = _mm512_dpbusd_epi32(s0, lo[u], bcast4(q, 4u * (uint32_t)u));
        s1 = _mm512_dpbusd_epi32(s1, hi[u], bcast4(q, 16u + 4u * (uint32_t)u));
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(a->gsx[r * G + g]), p);
}

/* One group of token j of the pass (q row r, and r + 1 too when P: two-pass)
 * with scale d and min m: acc + d * sum over its rows of sx * sum(q*code)
 * + m * gmin (the quantize step's sx * sum(q) of both rows). Per 16 rows that
 * is one multiply and two multiply-adds a token, one more for a second row:
 * on Zen 4 each costs a vpdpbusd slot, so that sum is the floor. */
static AI __m512 nibble_group(const struct dray_cpu_matmul *a, size_t r, uint32_t g, const __m512i *lo,
                              const __m512i *hi, __m512 d, __m512 m, __m512 acc, int P)
{
    const uint32_t G = a->k / 32;
    __m512 p = nibble_dot(a, r, g, lo, hi, _mm512_setzero_ps());
    float mt = a->gmin[r * G + g];
    if (P) {
        p = nibble_dot(a, r + 1, g, lo, hi, p);
        mt += a->gmin[(r + 1) * G + g];
    }
    acc = _mm512_fmadd_ps(d, p, acc);
    return _mm512_fmadd_ps(m, _mm512_set1_ps(mt), acc);
}

/* Rows 16b .. 16b+15 for q rows t0 .. t0+nb-1 into y[j], one per token: nb
 * tokens, or nb / 2 two-pass ones when P. Always inlined with constant nb and
 * P, so the accumulators stay in registers. */
static AI void pass_q8g(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t0, uint32_t nb, __m512 *y, int P)
{
    const uint32_t G = a->k / 32, nt = nb >> P;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 acc[TB];
    for (uint32_t j = 0; j < nt; j++)
        acc[j] = _mm512_setzero_ps();
    for (uint32_t g = 0; g < G; g++) {
        const int8_t *w = (const int8_t *)a->w + ((size_t)b * G + g) * 8 * 64;
        for (int l = 0; l < 8; l++) /* see PF_AHEAD */
            _mm_prefetch((const char *)(w + PF_AHEAD * 512 + 64 * l), _MM_HINT_T0);
        _mm_prefetch((const char *)(a->wscale + ((size_t)b * G + g + PF_AHEAD) * 16), _MM_HINT_T0);
        __m512i wv[8];
        for (int i = 0; i < 8; i++)
            wv[i] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + 64 * i)), bias);
        __m512 ws = _mm512_loadu_ps(a->wscale + ((size_t)b * G + g) * 16);
        for (uint32_t j = 0; j < nt; j++) {
            __m512 p = _mm512_setzero_ps();
            for (uint32_t e = 0; e <= (uint32_t)P; e++) {
                size_t t = t0 + (j << P) + e;
                const int8_t *q = a->q + t * a->q_stride + 32 * g;
                __m512i isum = _mm512_set1_epi32(-128 * a->gsum[t * G + g]);
                for (int i = 0; i < 8; i++)
                    isum = _mm512_dpbusd_epi32(isum, wv[i], bcast4(q, 4u * (uint32_t)i));
                p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a->gsx[t * G + g]), p);
            }
            acc[j] = _mm512_fmadd_ps(p, ws, acc[j]);
        }
    }
    for (uint32_t j = 0; j < nt; j++)
        y[j] = acc[j];
}

static AI void pass_q4g(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t0, uint32_t nb, __m512 *y, int P)
{
    const uint32_t G = a->k / 32, nt = nb >> P;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 acc[TB];
    for (uint32_t j = 0; j < nt; j++)
        acc[j] = _mm512_setzero_ps();
    for (uint32_t g = 0; g < G; g++) {
        const uint8_t *w = (const uint8_t *)a->w + ((size_t)b * G + g) * 4 * 64;
        for (int l = 0; l < 4; l++) /* see PF_AHEAD */
            _mm_prefetch((const char *)(w + PF_AHEAD * 256 + 64 * l), _MM_HINT_T0);
        for (int l = 0; l < 2; l++)
            _mm_prefetch((const char *)(a->wscale + ((size_t)b * G + g + PF_AHEAD) * 32 + 16 * l), _MM_HINT_T0);
        __m512i lo[4], hi[4];
        for (int u = 0; u < 4; u++) {
            __m512i z = _mm512_loadu_si512((const void *)(w + 64 * u));
            lo[u] = _mm512_and_si512(z, lo4);
            hi[u] = _mm512_and_si512(_mm512_srli_epi16(z, 4), lo4);
        }
        const float *dm = a->wscale + ((size_t)b * G + g) * 32;
        __m512 d = _mm512_loadu_ps(dm), m = _mm512_loadu_ps(dm + 16);
        for (uint32_t j = 0; j < nt; j++)
            acc[j] = nibble_group(a, t0 + (j << P), g, lo, hi, d, m, acc[j], P);
    }
    for (uint32_t j = 0; j < nt; j++)
        y[j] = acc[j];
}

/* Two-level d and m of group g (rows of block b) from its super-block's scales
 * at sb (cpu_kernels.h, DRAY_CPU_K4/K5): 6-bit s and n from a nibble byte and
 * two bits of the row's high word, times the f16 super-scales: the products
 * are exact in f32, so d and m are backend.h's. */
static AI void k_dm(const uint8_t *sb, uint32_t j, __m512 *d, __m512 *m)
{
    const __m512i f = _mm512_set1_epi32(15), t = _mm512_set1_epi32(3);
    __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)sb));
    __m512 M = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(sb + 32)));
    __m512i hs = _mm512_srl_epi32(_mm512_loadu_si512((const void *)(sb + 64)), _mm_cvtsi32_si128((int)(4 * j)));
    __m512i nb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(sb + 128 + 16 * j)));
    __m512i sc = _mm512_or_si512(_mm512_and_si512(nb, f), _mm512_slli_epi32(_mm512_and_si512(hs, t), 4));
    __m512i mn = _mm512_or_si512(_mm512_srli_epi32(nb, 4),
                                 _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hs, 2), t), 4));
    *d = _mm512_mul_ps(D, _mm512_cvtepi32_ps(sc));
    *m = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), M), _mm512_cvtepi32_ps(mn)); /* -(M n) exactly */
}

/* Decode is memory-bound: 320 bytes of weights and 64 of scales per 16 rows and
 * group, against 8 vpdpbusd per row of q. hib 0 is Q4G32H: the same pass
 * without the high unit (256 bytes of weights per 16 rows and group). two: the
 * same codes under two-level scales (DRAY_CPU_K4 and K5), d and m decoded per
 * group (k_dm) from 16 bytes a row per 256 inputs instead of 4 per 32. Always
 * inlined with constant hib and two, so the other parts are compiled out. */
static AI void pass_q5g(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t0, uint32_t nb, __m512 *y, int P,
                        int hib, int two)
{
    const uint32_t units = hib ? 5 : 4;
    const uint32_t G = a->k / 32, S = a->k / 256, nt = nb >> P;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), c16 = _mm512_set1_epi8(16);
    const uint16_t *sc = (const uint16_t *)(const void *)a->wscale;
    __m512 acc[TB];
    for (uint32_t j = 0; j < nt; j++)
        acc[j] = _mm512_setzero_ps();
    for (uint32_t g = 0; g < G; g++) {
        const uint8_t *w = (const uint8_t *)a->w + ((size_t)b * G + g) * units * 64;
        const uint8_t *hb = w + 4 * 64; /* word u: unit u's low nibbles, word 4+u: its high */
        for (uint32_t l = 0; l < units; l++)
            _mm_prefetch((const char *)(w + PF_AHEAD * units * 64 + 64 * l), _MM_HINT_T0);
        const uint8_t *sb = (const uint8_t *)sc + ((size_t)b * S + g / 8) * 256; /* two-level */
        if (!two)
            _mm_prefetch((const char *)(sc + ((size_t)b * G + g + PF_AHEAD) * 32), _MM_HINT_T0);
        else if (g % 8 == 0) /* two super-blocks (16 groups) ahead */
            for (uint32_t l = 0; l < 4; l++)
                _mm_prefetch((const char *)(sb + 2 * 256 + 64 * l), _MM_HINT_T0);
        __m512i lo[4], hi[4];
        for (int u = 0; u < 4; u++) {
            __m512i z = _mm512_loadu_si512((const void *)(w + 64 * u));
            __m512i l = _mm512_and_si512(z, lo4), h = _mm512_and_si512(_mm512_srli_epi16(z, 4), lo4);
            if (hib) {
                uint64_t ml, mh;
                memcpy(&ml, hb + 8 * u, 8);
                memcpy(&mh, hb + 32 + 8 * u, 8);
                l = _mm512_mask_add_epi8(l, _cvtu64_mask64(ml), l, c16);
                h = _mm512_mask_add_epi8(h, _cvtu64_mask64(mh), h, c16);
            }
            lo[u] = l;
            hi[u] = h;
        }
        __m512 d, m;
        if (two) {
            k_dm(sb, g % 8, &d, &m);
        } else {
            __m512i dm16 = _mm512_loadu_si512((const void *)(sc + ((size_t)b * G + g) * 32));
            d = _mm512_cvtph_ps(_mm512_castsi512_si256(dm16));
            m = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm16, 1));
        }
        for (uint32_t j = 0; j < nt; j++)
            acc[j] = nibble_group(a, t0 + (j << P), g, lo, hi, d, m, acc[j], P);
    }
    for (uint32_t j = 0; j < nt; j++)
        y[j] = acc[j];
}

/* sx * (d0 * sum over inputs 0-15 of q*(code-32) + d1 * the same over 16-31)
 * of q row r and one DRAY_CPU_K6 group, plus p: each half's int32 sum starts
 * from -32 times its sum of q (glo), so the codes enter unsigned. */
static AI __m512 k6_dot(const struct dray_cpu_matmul *a, size_t r, uint32_t g, const __m512i *lo,
                        const __m512i *hi, __m512 d0, __m512 d1, __m512 p)
{
    const uint32_t G = a->k / 32;
    const int8_t *q = a->q + r * a->q_stride + 32 * g;
    int32_t l = a->glo[r * G + g], h = a->gsum[r * G + g] - l;
    __m512i s0 = _mm512_set1_epi32(-32 * l), s1 = _mm512_set1_epi32(-32 * h);
    for (int u = 0; u < 4; u++) {
        s0 = _mm512_dpbusd_epi32(s0, lo[u], bcast4(q, 4u * (uint32_t)u));
        s1 = _mm512_dpbusd_epi32(s1, hi[u], bcast4(q, 16u + 4u * (uint32_t)u));
    }
    __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), d1, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), d0));
    return _mm512_fmadd_ps(v, _mm512_set1_ps(a->gsx[r * G + g]), p);
}

/* DRAY_CPU_K6: the nibbles with bits 4-5 from the two high units (unit u's
 * at bits 2u of each byte), and an int8 scale per half-group under D. */
static AI void pass_k6(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t0, uint32_t nb, __m512 *y, int P)
{
    const uint32_t G = a->k / 32, S = a->k / 256, nt = nb >> P;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), b45 = _mm512_set1_epi8(0x30);
    const uint8_t *scales = (const uint8_t *)(const void *)a->wscale;
    __m512 acc[TB];
    for (uint32_t j = 0; j < nt; j++)
        acc[j] = _mm512_setzero_ps();
    for (uint32_t g = 0; g < G; g++) {
        const uint8_t *w = (const uint8_t *)a->w + ((size_t)b * G + g) * 6 * 64;
        const uint8_t *sb = scales + ((size_t)b * S + g / 8) * 288;
        for (uint32_t l = 0; l < 6; l++)
            _mm_prefetch((const char *)(w + PF_AHEAD * 6 * 64 + 64 * l), _MM_HINT_T0);
        if (g % 8 == 0)
            for (uint32_t l = 0; l < 5; l++)
                _mm_prefetch((const char *)(sb + 2 * 288 + 64 * l), _MM_HINT_T0);
        __m512i h0 = _mm512_loadu_si512((const void *)(w + 256)), h1 = _mm512_loadu_si512((const void *)(w + 320));
        __m512i lo[4], hi[4];
        for (int u = 0; u < 4; u++) {
            __m512i z = _mm512_loadu_si512((const void *)(w + 64 * u));
            /* bits 2u, 2u+1 of the high units to bits 4-5 */
            __m512i e0 = u == 0 ? _mm512_slli_epi16(h0, 4) : u == 1 ? _mm512_slli_epi16(h0, 2)
                       : u == 2 ? h0 : _mm512_srli_epi16(h0, 2);
            __m512i e1 = u == 0 ? _mm512_slli_epi16(h1, 4) : u == 1 ? _mm512_slli_epi16(h1, 2)
                       : u == 2 ? h1 : _mm512_srli_epi16(h1, 2);
            lo[u] = _mm512_or_si512(_mm512_and_si512(z, lo4), _mm512_and_si512(e0, b45));
            hi[u] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(z, 4), lo4), _mm512_and_si512(e1, b45));
        }
        __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)sb));
        const uint8_t *hs = sb + 32 + 32 * (g % 8);
        __m512 d0 = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)hs))));
        __m512 d1 = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(hs + 16)))));
        for (uint32_t j = 0; j < nt; j++) {
            size_t r = t0 + (j << P);
            __m512 p = k6_dot(a, r, g, lo, hi, d0, d1, _mm512_setzero_ps());
            if (P)
                p = k6_dot(a, r + 1, g, lo, hi, d0, d1, p);
            acc[j] = _mm512_add_ps(acc[j], p);
        }
    }
    for (uint32_t j = 0; j < nt; j++)
        y[j] = acc[j];
}

/* One pass of nb q rows (constant) against block b, its tokens into y. */
static AI void pass(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t0, uint32_t nb, __m512 *y, int P)
{
    switch (a->wdtype) {
    case DRAY_Q8G32: pass_q8g(a, b, t0, nb, y, P); break;
    case DRAY_Q5G32: pass_q5g(a, b, t0, nb, y, P, 1, 0); break;
    case DRAY_Q4G32H: pass_q5g(a, b, t0, nb, y, P, 0, 0); break;
    case DRAY_CPU_K4: pass_q5g(a, b, t0, nb, y, P, 0, 1); break;
    case DRAY_CPU_K5: pass_q5g(a, b, t0, nb, y, P, 1, 1); break;
    case DRAY_CPU_K6: pass_k6(a, b, t0, nb, y, P); break;
    default: pass_q4g(a, b, t0, nb, y, P); break;
    }
}

/* Rows o0 .. o1 of q rows [t0, t0 + nb) (nb even when P), into the output. */
static AI void run_block(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1, uint32_t t0, uint32_t nb,
                         int P)
{
    __m512 y[TB];
    for (uint32_t b = o0 / 16; b < o1 / 16; b++) {
        pass(a, b, t0, nb, y, P);
        for (uint32_t j = 0; j < nb >> P; j++) {
            float *out = a->out + (size_t)((t0 >> P) + j) * a->stride_out + 16 * b;
            __m512 v = a->accumulate ? _mm512_add_ps(_mm512_loadu_ps(out), y[j]) : y[j];
            _mm512_storeu_ps(out, v);
        }
    }
}

/* o0 and o1 are multiples of 16 (the glue splits rows in 16s; n_out is one).
 * The q rows go 8 at a time (the unpacked weights of a group serve 8 rows),
 * then 4, 2 and 1; with two-pass activations the row count is even. */
void dray_cpu_avx512vnni_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    for (uint32_t t0 = 0, nb; t0 < a->n_tok; t0 += nb) {
        uint32_t left = a->n_tok - t0;
        nb = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        if (a->pairs)
            switch (nb) { /* constants, so the passes keep their accumulators in registers */
            case 8: run_block(a, o0, o1, t0, 8, 1); break;
            case 4: run_block(a, o0, o1, t0, 4, 1); break;
            default: run_block(a, o0, o1, t0, 2, 1); break;
            }
        else
            switch (nb) {
            case 8: run_block(a, o0, o1, t0, 8, 0); break;
            case 4: run_block(a, o0, o1, t0, 4, 0); break;
            case 2: run_block(a, o0, o1, t0, 2, 0); break;
            default: run_block(a, o0, o1, t0, 1, 0); break;
            }
    }
}
