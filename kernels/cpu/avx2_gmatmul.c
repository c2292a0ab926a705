/* AVX2 matmul over grouped weights (backend.h, matmul: DRAY_Q8G32, DRAY_Q4G32,
 * DRAY_Q5G32, DRAY_Q4G32H (Q5G32's code without the high unit)),
 * for CPUs without AVX-512 VNNI. Same plan as avx512vnni_gmatmul.c on 8 lanes:
 * each 64-byte unit of the 16-row layout is two 32-byte halves (rows 0-7 and
 * 8-15), one 32-bit lane per row, multiplied against 4 activation bytes
 * broadcast to every lane. Without vpdpbusd the 4 products of a lane are
 * vpmaddubsw (u8 x s8 into int16 pairs) then vpmaddwd by ones; the pairs cannot
 * saturate: Q8G32 multiplies |w| <= 128 by sign-adjusted q (|q| <= 127), Q4G32
 * nibbles <= 15 by q (Q5G32 codes <= 31: pairs within 2 * 31 * 127). The group's
 * int32 sums are exact; the f32 scale products are applied 8 rows at a time,
 * each group's (d * sx) * sum + m * gmin (gmin = sx * sum(q) from the quantize
 * step, as in the AVX-512 kernel), the same in every path so a token's
 * result does not depend on the rows it shares a pass with.
 * Each dtype has its own inlined loop (one generic loop spilled its
 * accumulators), and q rows go four at a time (4- and 5-bit) or two at a
 * time through one load and unpack of a block's weights. Q5G32's bit 4 arrives as 32 bits per half unit (one per byte), spread to
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

/* 16 where bit i of m is set, for byte i (0..31). */
static inline __m256i bits16(uint32_t m)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                            2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(16));
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
        dray_cpu_gmin_fill(a, t);
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

/* Keeps v in a register as it is at this point. GCC 12 reassociates the
 * unrolled int16 sums into a tree over all the products first and spills most
 * of them to the stack (docs/performance.md, "CPU grouped kernels"); a barrier
 * after each add keeps the running sums. */
#define KEEP(v) __asm__("" : "+x"(v))

enum gkind { G_Q8, G_Q4, G_Q4H, G_Q5, G_K4, G_K5 };
#define IS5(k) ((k) == G_Q5 || (k) == G_K5)       /* 5-bit codes: a high unit */
#define ISK(k) ((k) == G_K4 || (k) == G_K5)       /* two-level scales (cpu_kernels.h) */
/* Bytes of one (b, g)'s codes, and of its scales (two levels: a (b, s)'s / 8). */
#define WB(k) ((k) == G_Q8 ? 512u : IS5(k) ? 320u : 256u)
#define SB(k) ((k) == G_Q4 ? 128u : (k) == G_Q8 || (k) == G_Q4H || (k) == G_Q5 ? 64u : 32u)
#define AI inline __attribute__((always_inline))

/* Unit u's codes of half h (rows 8h .. 8h+7) of one group at w: the low
 * nibbles (inputs 4u + e) into *l and the high ones (16 + 4u + e) into *m,
 * bit 4 added for 5-bit codes. */
static AI void unit_codes(const uint8_t *w, uint32_t u, int h, enum gkind kind, __m256i *l, __m256i *m)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    __m256i z = _mm256_loadu_si256((const void *)(w + 64 * u + 32 * h));
    *l = _mm256_and_si256(z, lo4);
    *m = _mm256_and_si256(_mm256_srli_epi16(z, 4), lo4);
    if (IS5(kind)) {
        uint32_t ml, mh; /* bits 32*h .. of words u and 4+u */
        memcpy(&ml, w + 256 + 8 * u + 4 * h, 4);
        memcpy(&mh, w + 256 + 32 + 8 * u + 4 * h, 4);
        *l = _mm256_or_si256(*l, bits16(ml));
        *m = _mm256_or_si256(*m, bits16(mh));
    }
}

/* d and m of group g, rows 8h .. 8h+7 of block b, from two-level scales
 * (cpu_kernels.h, DRAY_CPU_K4/K5): 6-bit s and n times the f16 super-scales,
 * products exact in f32 (backend.h's values). */
static AI void k_dm(const struct dray_cpu_matmul *a, uint32_t b, uint32_t g, int h, __m256 *d, __m256 *m)
{
    const uint8_t *sb = (const uint8_t *)(const void *)a->wscale + ((size_t)b * (a->k / 256) + g / 8) * 256;
    const uint32_t j = g % 8;
    const __m256i f = _mm256_set1_epi32(15), t = _mm256_set1_epi32(3);
    __m256 D = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(sb + 16 * h)));
    __m256 M = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(sb + 32 + 16 * h)));
    __m256i hs = _mm256_srl_epi32(_mm256_loadu_si256((const void *)(sb + 64 + 32 * h)), _mm_cvtsi32_si128((int)(4 * j)));
    __m256i nb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)(sb + 128 + 16 * j + 8 * h)));
    __m256i sc = _mm256_or_si256(_mm256_and_si256(nb, f), _mm256_slli_epi32(_mm256_and_si256(hs, t), 4));
    __m256i mn = _mm256_or_si256(_mm256_srli_epi32(nb, 4),
                                 _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hs, 2), t), 4));
    *d = _mm256_mul_ps(D, _mm256_cvtepi32_ps(sc));
    *m = _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), M), _mm256_cvtepi32_ps(mn)); /* -(M n) exactly */
}

/* The int32 sums of q * code for rows 16b+8h .. 16b+8h+7 (half h) of one
 * 8-bit or 5-bit group at w, one row per lane, for nt token rows q[0..nt) at
 * once: the weights are loaded and unpacked once for all of them. 5-bit
 * products are summed in int16 first (a lane's vpmaddubsw pair is at most
 * 2 * 31 * 127 = 7874, so four fit), then widened by one vpmaddwd: exact, as
 * the reference's int32 sums. */
static AI void half_sums(const uint8_t *w, const int8_t *const *q, int h, enum gkind kind, int nt,
                         __m256i *s)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (kind == G_Q8) {
        for (int j = 0; j < nt; j++)
            s[j] = _mm256_setzero_si256();
        for (uint32_t i = 0; i < 8; i++) {
            __m256i z = _mm256_loadu_si256((const void *)(w + 64 * i + 32 * h));
            for (int j = 0; j < nt; j++)
                s[j] = _mm256_add_epi32(s[j], dot4_s8(z, bcast4(q[j], 4 * i), ones));
        }
        return;
    }
    __m256i lo[2], hi[2]; /* int16 sums of the units' low and high codes */
    for (int j = 0; j < nt; j++)
        lo[j] = hi[j] = _mm256_setzero_si256();
    for (uint32_t u = 0; u < 4; u++) {
        __m256i l, m;
        unit_codes(w, u, h, kind, &l, &m);
        for (int j = 0; j < nt; j++) {
            lo[j] = _mm256_add_epi16(lo[j], _mm256_maddubs_epi16(l, bcast4(q[j], 4 * u)));
            hi[j] = _mm256_add_epi16(hi[j], _mm256_maddubs_epi16(m, bcast4(q[j], 16 + 4 * u)));
            KEEP(lo[j]);
            KEEP(hi[j]);
        }
    }
    for (int j = 0; j < nt; j++)
        s[j] = _mm256_add_epi32(_mm256_madd_epi16(lo[j], ones), _mm256_madd_epi16(hi[j], ones));
}

/* Both halves of one 4-bit group (rows 0-7 into s0, 8-15 into s1) for nt q
 * rows: each broadcast of 4 activation bytes feeds four vpmaddubsw, and a
 * row's low and high nibble products share one int16 sum (eight pairs of at
 * most 3810 each). */
static AI void q4_sums(const uint8_t *w, const int8_t *const *q, int nt, __m256i *s0, __m256i *s1)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a0[2], a1[2];
    for (int j = 0; j < nt; j++)
        a0[j] = a1[j] = _mm256_setzero_si256();
    for (uint32_t u = 0; u < 4; u++) {
        __m256i l0, h0, l1, h1;
        unit_codes(w, u, 0, G_Q4, &l0, &h0);
        unit_codes(w, u, 1, G_Q4, &l1, &h1);
        for (int j = 0; j < nt; j++) {
            __m256i bl = bcast4(q[j], 4 * u), bh = bcast4(q[j], 16 + 4 * u);
            a0[j] = _mm256_add_epi16(a0[j], _mm256_add_epi16(_mm256_maddubs_epi16(l0, bl), _mm256_maddubs_epi16(h0, bh)));
            a1[j] = _mm256_add_epi16(a1[j], _mm256_add_epi16(_mm256_maddubs_epi16(l1, bl), _mm256_maddubs_epi16(h1, bh)));
            KEEP(a0[j]);
            KEEP(a1[j]);
        }
    }
    for (int j = 0; j < nt; j++) {
        s0[j] = _mm256_madd_epi16(a0[j], ones);
        s1[j] = _mm256_madd_epi16(a1[j], ones);
    }
}

/* A batch of tokens (CODES_MIN_TOK or more) first unpacks each 16-row block of
 * 4- and 5-bit codes to bytes, once, so that every token's pass is loads and
 * vpmaddubsw only: group g's 512 bytes at codes + 512 g hold vector v (0..3 the
 * low nibbles of unit v, 4..7 the high nibbles of unit v-4, with bit 4 added
 * for 5-bit codes) at +64 v, its two 32-byte halves rows 0-7 and 8-15. Blocks of
 * more than CODES_MAX_G groups keep the packed path. */
#define CODES_MIN_TOK 4u
#define CODES_MAX_G 64u /* 32 KiB of stack; k up to 2048 */

static AI void unpack_block(const struct dray_cpu_matmul *a, uint32_t b, enum gkind kind, uint8_t *codes)
{
    const uint32_t G = a->k / 32;
    const size_t wb = WB(kind), sb = SB(kind);
    for (uint32_t g = 0; g < G; g++) {
        const size_t bg = (size_t)b * G + g;
        prefetch_group(a, bg, wb, sb);
        const uint8_t *w = (const uint8_t *)a->w + bg * wb;
        for (uint32_t u = 0; u < 4; u++)
            for (int h = 0; h < 2; h++) {
                __m256i l, m;
                unit_codes(w, u, h, kind, &l, &m);
                _mm256_store_si256((void *)(codes + 512 * g + 64 * u + 32 * h), l);
                _mm256_store_si256((void *)(codes + 512 * g + 64 * (4 + u) + 32 * h), m);
            }
    }
}

/* Both halves' sums of one unpacked group c for nt q rows: int16 sums of at
 * most eight nibble pairs (4-bit) or four 5-bit pairs, as in q4_sums. */
static AI void codes_sums(const uint8_t *c, const int8_t *const *q, int nt, enum gkind kind, __m256i *s0,
                          __m256i *s1)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a0[2][2], a1[2][2]; /* [j][0]: vectors 0..3, [j][1]: 4..7 (5-bit codes only) */
    for (int j = 0; j < nt; j++)
        a0[j][0] = a1[j][0] = a0[j][1] = a1[j][1] = _mm256_setzero_si256();
    /* each token's 16 activation bytes of a half group in both 128-bit lanes,
     * and 4 of them broadcast to every lane by a shuffle: one load a half
     * group instead of four broadcast loads. Loads are what an unpacked
     * group's pass waits on (two code loads per two vpmaddubsw); the packed
     * 4-bit path, which waits on its unpacking, keeps its broadcast loads
     * (docs/performance.md, "CPU grouped kernels"). */
    __m256i qb[2];
#define CODES_STEP(v) /* vectors v of the group, the unit (v) % 4 of qb */                         \
    do {                                                                                            \
        const int p = kind == G_Q5 && (v) >= 4;                                                     \
        __m256i c0 = _mm256_load_si256((const void *)(c + 64 * (v)));                               \
        __m256i c1 = _mm256_load_si256((const void *)(c + 64 * (v) + 32));                          \
        for (int j = 0; j < nt; j++) {                                                              \
            __m256i bc = _mm256_shuffle_epi32(qb[j], ((v) & 3) * 0x55);                             \
            a0[j][p] = _mm256_add_epi16(a0[j][p], _mm256_maddubs_epi16(c0, bc));                    \
            a1[j][p] = _mm256_add_epi16(a1[j][p], _mm256_maddubs_epi16(c1, bc));                    \
            KEEP(a0[j][p]);                                                                         \
            KEEP(a1[j][p]);                                                                         \
        }                                                                                           \
    } while (0)
    for (int j = 0; j < nt; j++)
        qb[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const void *)q[j]));
    CODES_STEP(0);
    CODES_STEP(1);
    CODES_STEP(2);
    CODES_STEP(3);
    for (int j = 0; j < nt; j++)
        qb[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const void *)(q[j] + 16)));
    CODES_STEP(4);
    CODES_STEP(5);
    CODES_STEP(6);
    CODES_STEP(7);
#undef CODES_STEP
    for (int j = 0; j < nt; j++) {
        s0[j] = _mm256_madd_epi16(a0[j][0], ones);
        s1[j] = _mm256_madd_epi16(a1[j][0], ones);
        if (IS5(kind)) {
            s0[j] = _mm256_add_epi32(s0[j], _mm256_madd_epi16(a0[j][1], ones));
            s1[j] = _mm256_add_epi32(s1[j], _mm256_madd_epi16(a1[j][1], ones));
        }
    }
}

/* Block b (16 rows) for the nt (1 or 2) q rows from t: every group's sums, then
 * the f32 scale products 8 rows at a time, group by group. codes:
 * the block unpacked (unpack_block), or NULL to read the packed weights. */
static AI void block_rows(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t, int nt, enum gkind kind,
                          const uint8_t *codes)
{
    const uint32_t G = a->k / 32;
    const size_t wb = WB(kind), sb = SB(kind);
    const int8_t *qt[2];
    __m256 acc0[2], acc1[2];
    for (int j = 0; j < nt; j++) {
        qt[j] = a->q + (size_t)(t + j) * a->q_stride;
        acc0[j] = acc1[j] = _mm256_setzero_ps();
    }
    for (uint32_t g = 0; g < G; g++) {
        const size_t bg = (size_t)b * G + g;
        if (t == 0 && !codes) /* later tokens find this block's weights in cache */
            prefetch_group(a, bg, wb, sb);
        const uint8_t *w = (const uint8_t *)a->w + bg * wb;
        const int8_t *q[2] = {qt[0] + 32 * g, nt > 1 ? qt[1] + 32 * g : NULL};
        __m256i s0[2], s1[2];
        if (codes) {
            codes_sums(codes + 512 * g, q, nt, kind, s0, s1);
        } else if (kind == G_Q4 || kind == G_Q4H || kind == G_K4) {
            q4_sums(w, q, nt, s0, s1);
        } else {
            half_sums(w, q, 0, kind, nt, s0);
            half_sums(w, q, 1, kind, nt, s1);
        }
        for (int j = 0; j < nt; j++) {
            const size_t tg = (size_t)(t + j) * G + g;
            __m256 vs = _mm256_set1_ps(a->gsx[tg]);
            if (kind == G_Q8) {
                const float *ws = a->wscale + bg * 16;
                acc0[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0[j]), _mm256_mul_ps(vs, _mm256_loadu_ps(ws)), acc0[j]);
                acc1[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[j]), _mm256_mul_ps(vs, _mm256_loadu_ps(ws + 8)), acc1[j]);
                continue;
            }
            __m256 gm = _mm256_set1_ps(a->gmin[tg]), d0, d1, m0, m1;
            if (ISK(kind)) {
                k_dm(a, b, g, 0, &d0, &m0);
                k_dm(a, b, g, 1, &d1, &m1);
            } else if (kind == G_Q4) {
                const float *dm = a->wscale + bg * 32;
                d0 = _mm256_loadu_ps(dm), d1 = _mm256_loadu_ps(dm + 8);
                m0 = _mm256_loadu_ps(dm + 16), m1 = _mm256_loadu_ps(dm + 24);
            } else { /* f16 d and m */
                const uint16_t *dm = (const uint16_t *)(const void *)a->wscale + bg * 32;
                d0 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)dm));
                d1 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 8)));
                m0 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 16)));
                m1 = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 24)));
            }
            acc0[j] = _mm256_fmadd_ps(m0, gm, _mm256_fmadd_ps(_mm256_mul_ps(d0, vs), _mm256_cvtepi32_ps(s0[j]), acc0[j]));
            acc1[j] = _mm256_fmadd_ps(m1, gm, _mm256_fmadd_ps(_mm256_mul_ps(d1, vs), _mm256_cvtepi32_ps(s1[j]), acc1[j]));
        }
    }
    for (int j = 0; j < nt; j++) {
        float *out = dray_cpu_gout(a, t + j) + 16 * b; /* a residual row adds to its first */
        if (dray_cpu_gadds(a, t + j)) {
            acc0[j] = _mm256_add_ps(_mm256_loadu_ps(out), acc0[j]);
            acc1[j] = _mm256_add_ps(_mm256_loadu_ps(out + 8), acc1[j]);
        }
        _mm256_storeu_ps(out, acc0[j]);
        _mm256_storeu_ps(out + 8, acc1[j]);
    }
}

/* The four rows' results of block b into their outputs. */
static AI void quad_store(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t, float acc[4][16])
{
    for (int j = 0; j < 4; j++) {
        float *out = dray_cpu_gout(a, t + j) + 16 * b; /* a residual row adds to its first */
        __m256 r0 = _mm256_load_ps(acc[j]), r1 = _mm256_load_ps(acc[j] + 8);
        if (dray_cpu_gadds(a, t + j)) {
            r0 = _mm256_add_ps(_mm256_loadu_ps(out), r0);
            r1 = _mm256_add_ps(_mm256_loadu_ps(out + 8), r1);
        }
        _mm256_storeu_ps(out, r0);
        _mm256_storeu_ps(out + 8, r1);
    }
}

/* The f32 scale products of one group g of block row bg for four q rows from
 * t, added to acc in memory: s0/s1 the int16 sums of rows 0-7 / 8-15, plus
 * the int32 sums in lo when not NULL (a 5-bit group's first half). */
static AI void quad_scale(const struct dray_cpu_matmul *a, size_t bg, uint32_t g, uint32_t t, enum gkind kind,
                          const __m256i *s0, const __m256i *s1, int32_t (*lo)[16], float (*acc)[16])
{
    const uint32_t G = a->k / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int hh = 0; hh < 2; hh++) {
        __m256 d, mn;
        if (ISK(kind)) {
            k_dm(a, (uint32_t)(bg / G), g, hh, &d, &mn);
        } else if (kind == G_Q4) {
            const float *dm = a->wscale + bg * 32;
            d = _mm256_loadu_ps(dm + 8 * hh), mn = _mm256_loadu_ps(dm + 16 + 8 * hh);
        } else { /* f16 d and m */
            const uint16_t *dm = (const uint16_t *)(const void *)a->wscale + bg * 32;
            d = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 8 * hh)));
            mn = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + 16 + 8 * hh)));
        }
        for (int j = 0; j < 4; j++) {
            const size_t tg = (size_t)(t + j) * G + g;
            __m256 vs = _mm256_set1_ps(a->gsx[tg]), gm = _mm256_set1_ps(a->gmin[tg]);
            __m256i si = _mm256_madd_epi16(hh ? s1[j] : s0[j], ones);
            if (lo)
                si = _mm256_add_epi32(_mm256_load_si256((const void *)(lo[j] + 8 * hh)), si);
            __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(d, vs), _mm256_cvtepi32_ps(si), _mm256_load_ps(acc[j] + 8 * hh));
            _mm256_store_ps(acc[j] + 8 * hh, _mm256_fmadd_ps(mn, gm, t));
        }
    }
}

/* Four q rows from t against packed 4-bit block b: each 32-byte load and
 * nibble unpack feeds eight vpmaddubsw, twice block_rows' four. The sums of a
 * group (eight int16 vectors) and the unpacked codes take AVX2's registers, so
 * the f32 accumulators live in memory (a load and a store per group and half).
 * Same sums in the same order as block_rows: bit for bit the same. */
static AI void quad_rows(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t, enum gkind kind)
{
    const uint32_t G = a->k / 32;
    const size_t sb = SB(kind);
    const int8_t *qt[4];
    _Alignas(32) float acc[4][16] = {{0}};
    for (int j = 0; j < 4; j++)
        qt[j] = a->q + (size_t)(t + j) * a->q_stride;
    for (uint32_t g = 0; g < G; g++) {
        const size_t bg = (size_t)b * G + g;
        if (t == 0) /* later passes find this block's weights in cache */
            prefetch_group(a, bg, 256, sb);
        const uint8_t *w = (const uint8_t *)a->w + bg * 256;
        __m256i s0[4], s1[4];
        for (int j = 0; j < 4; j++)
            s0[j] = s1[j] = _mm256_setzero_si256();
        for (uint32_t u = 0; u < 4; u++) {
            __m256i l0, h0, l1, h1;
            unit_codes(w, u, 0, G_Q4, &l0, &h0);
            unit_codes(w, u, 1, G_Q4, &l1, &h1);
            for (int j = 0; j < 4; j++) {
                __m256i bl = bcast4(qt[j] + 32 * g, 4 * u), bh = bcast4(qt[j] + 32 * g, 16 + 4 * u);
                s0[j] = _mm256_add_epi16(s0[j], _mm256_add_epi16(_mm256_maddubs_epi16(l0, bl), _mm256_maddubs_epi16(h0, bh)));
                s1[j] = _mm256_add_epi16(s1[j], _mm256_add_epi16(_mm256_maddubs_epi16(l1, bl), _mm256_maddubs_epi16(h1, bh)));
                KEEP(s0[j]);
                KEEP(s1[j]);
            }
        }
        quad_scale(a, bg, g, t, kind, s0, s1, NULL, acc);
    }
    quad_store(a, b, t, acc);
}

/* Four q rows from t against unpacked 5-bit block b (codes, unpack_block):
 * each code vector loaded feeds four vpmaddubsw, and each broadcast of 4
 * activation bytes two. A group's vectors 0-3 are summed in int16, widened
 * and kept in memory while 4-7 are (four 5-bit pairs fill an int16), as the
 * f32 accumulators are: the registers hold one set of sums and the codes.
 * Same sums in the same order as block_rows: bit for bit the same. */
static AI void quad_codes(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t, const uint8_t *codes,
                          enum gkind kind)
{
    const uint32_t G = a->k / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *qt[4];
    _Alignas(32) float acc[4][16] = {{0}};
    _Alignas(32) int32_t lo[4][16];
    for (int j = 0; j < 4; j++)
        qt[j] = a->q + (size_t)(t + j) * a->q_stride;
    for (uint32_t g = 0; g < G; g++) {
        const size_t bg = (size_t)b * G + g;
        const uint8_t *c = codes + 512 * g;
        __m256i s0[4], s1[4];
        for (int p = 0; p < 2; p++) { /* vectors 4p .. 4p+3 */
            for (int j = 0; j < 4; j++)
                s0[j] = s1[j] = _mm256_setzero_si256();
            __m256i qb[4];
            for (int j = 0; j < 4; j++)
                qb[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const void *)(qt[j] + 32 * g + 16 * p)));
#define QUAD_STEP(u) /* vector 4p + u, activations unit u of qb */                                    \
    do {                                                                                            \
        __m256i c0 = _mm256_load_si256((const void *)(c + 64 * (4 * p + (u))));                     \
        __m256i c1 = _mm256_load_si256((const void *)(c + 64 * (4 * p + (u)) + 32));                \
        for (int j = 0; j < 4; j++) {                                                               \
            __m256i bc = _mm256_shuffle_epi32(qb[j], (u) * 0x55);                                   \
            s0[j] = _mm256_add_epi16(s0[j], _mm256_maddubs_epi16(c0, bc));                          \
            s1[j] = _mm256_add_epi16(s1[j], _mm256_maddubs_epi16(c1, bc));                          \
            KEEP(s0[j]);                                                                            \
            KEEP(s1[j]);                                                                            \
        }                                                                                           \
    } while (0)
            QUAD_STEP(0);
            QUAD_STEP(1);
            QUAD_STEP(2);
            QUAD_STEP(3);
#undef QUAD_STEP
            if (p == 0)
                for (int j = 0; j < 4; j++) {
                    _mm256_store_si256((void *)lo[j], _mm256_madd_epi16(s0[j], ones));
                    _mm256_store_si256((void *)(lo[j] + 8), _mm256_madd_epi16(s1[j], ones));
                }
        }
        quad_scale(a, bg, g, t, kind, s0, s1, lo, acc);
    }
    quad_store(a, b, t, acc);
}

/* Blocks o0/16 .. o1/16, the q rows four at a time where the dtype has a quad
 * path, then two at a time (one weight load for all of them) */
static AI void gmatmul_kind(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1, enum gkind kind)
{
    _Alignas(32) uint8_t codes[CODES_MAX_G * 512];
    const int unpack = IS5(kind) && a->n_tok >= CODES_MIN_TOK && a->k / 32 <= CODES_MAX_G;
    for (uint32_t b = o0 / 16; b < o1 / 16; b++) {
        if (unpack)
            unpack_block(a, b, kind, codes);
        uint32_t t = 0;
        for (; (unpack || kind == G_Q4 || kind == G_Q4H || kind == G_K4) && t + 4 <= a->n_tok; t += 4) {
            if (unpack)
                quad_codes(a, b, t, codes, kind);
            else
                quad_rows(a, b, t, kind);
        }
        for (; t + 2 <= a->n_tok; t += 2)
            block_rows(a, b, t, 2, kind, unpack ? codes : NULL);
        if (t < a->n_tok)
            block_rows(a, b, t, 1, kind, unpack ? codes : NULL);
    }
}

/* DRAY_CPU_K6, rows 8h .. 8h+7 of one group at w for nt q rows: the int32
 * sums of q * code over inputs 0-15 (s0) and 16-31 (s1), the codes unsigned
 * (nibble | bits 4-5 from the high units). Pairs of 6-bit products reach
 * 16002, so the int16 sums are widened after every two units. */
static AI void k6_sums(const uint8_t *w, const int8_t *const *q, int h, int nt, __m256i *s0, __m256i *s1)
{
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F), b45 = _mm256_set1_epi8(0x30);
    const __m256i h0 = _mm256_loadu_si256((const void *)(w + 256 + 32 * h));
    const __m256i h1 = _mm256_loadu_si256((const void *)(w + 320 + 32 * h));
    for (int j = 0; j < nt; j++)
        s0[j] = s1[j] = _mm256_setzero_si256();
    for (int p = 0; p < 2; p++) {
        __m256i a0[2], a1[2];
        for (int j = 0; j < nt; j++)
            a0[j] = a1[j] = _mm256_setzero_si256();
        for (int u = 2 * p; u < 2 * p + 2; u++) {
            __m256i z = _mm256_loadu_si256((const void *)(w + 64 * u + 32 * h));
            __m256i e0 = u == 0 ? _mm256_slli_epi16(h0, 4) : u == 1 ? _mm256_slli_epi16(h0, 2)
                       : u == 2 ? h0 : _mm256_srli_epi16(h0, 2);
            __m256i e1 = u == 0 ? _mm256_slli_epi16(h1, 4) : u == 1 ? _mm256_slli_epi16(h1, 2)
                       : u == 2 ? h1 : _mm256_srli_epi16(h1, 2);
            __m256i l = _mm256_or_si256(_mm256_and_si256(z, lo4), _mm256_and_si256(e0, b45));
            __m256i m = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(z, 4), lo4), _mm256_and_si256(e1, b45));
            for (int j = 0; j < nt; j++) {
                a0[j] = _mm256_add_epi16(a0[j], _mm256_maddubs_epi16(l, bcast4(q[j], 4 * (uint32_t)u)));
                a1[j] = _mm256_add_epi16(a1[j], _mm256_maddubs_epi16(m, bcast4(q[j], 16 + 4 * (uint32_t)u)));
            }
        }
        for (int j = 0; j < nt; j++) {
            s0[j] = _mm256_add_epi32(s0[j], _mm256_madd_epi16(a0[j], ones));
            s1[j] = _mm256_add_epi32(s1[j], _mm256_madd_epi16(a1[j], ones));
        }
    }
}

/* Block b (16 rows) of DRAY_CPU_K6 for the nt (1 or 2) q rows from t: each
 * half-group's sum less 32 times its sum of q (glo), times its d = D * scale. */
static AI void k6_rows(const struct dray_cpu_matmul *a, uint32_t b, uint32_t t, int nt)
{
    const uint32_t G = a->k / 32, S = a->k / 256;
    const int8_t *qt[2];
    __m256 acc[2][2];
    for (int j = 0; j < nt; j++) {
        qt[j] = a->q + (size_t)(t + j) * a->q_stride;
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    }
    for (uint32_t g = 0; g < G; g++) {
        const size_t bg = (size_t)b * G + g;
        if (t == 0)
            prefetch_group(a, bg, 384, 36);
        const uint8_t *w = (const uint8_t *)a->w + bg * 384;
        const uint8_t *sb = (const uint8_t *)(const void *)a->wscale + ((size_t)b * S + g / 8) * 288;
        const int8_t *q[2] = {qt[0] + 32 * g, nt > 1 ? qt[1] + 32 * g : NULL};
        for (int h = 0; h < 2; h++) {
            __m256i s0[2], s1[2];
            k6_sums(w, q, h, nt, s0, s1);
            __m256 D = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(sb + 16 * h)));
            const uint8_t *hs = sb + 32 + 32 * (g % 8) + 8 * h;
            __m256 d0 = _mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)hs))));
            __m256 d1 = _mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)(hs + 16)))));
            for (int j = 0; j < nt; j++) {
                const size_t tg = (size_t)(t + j) * G + g;
                int32_t lo = a->glo[tg], hi = a->gsum[tg] - lo;
                __m256 f0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(s0[j], _mm256_set1_epi32(32 * lo)));
                __m256 f1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(s1[j], _mm256_set1_epi32(32 * hi)));
                __m256 v = _mm256_fmadd_ps(f1, d1, _mm256_mul_ps(f0, d0));
                acc[j][h] = _mm256_fmadd_ps(v, _mm256_set1_ps(a->gsx[tg]), acc[j][h]);
            }
        }
    }
    for (int j = 0; j < nt; j++) {
        float *out = dray_cpu_gout(a, t + j) + 16 * b;
        for (int h = 0; h < 2; h++) {
            __m256 v = acc[j][h];
            if (dray_cpu_gadds(a, t + j))
                v = _mm256_add_ps(_mm256_loadu_ps(out + 8 * h), v);
            _mm256_storeu_ps(out + 8 * h, v);
        }
    }
}

static void gmatmul_k6(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    for (uint32_t b = o0 / 16; b < o1 / 16; b++) {
        uint32_t t = 0;
        for (; t + 2 <= a->n_tok; t += 2)
            k6_rows(a, b, t, 2);
        if (t < a->n_tok)
            k6_rows(a, b, t, 1);
    }
}

/* o0 and o1 are multiples of 16 (the glue splits rows in 16s; n_out is one). */
void dray_cpu_avx2_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    switch (a->wdtype) {
    case DRAY_CPU_K4: gmatmul_kind(a, o0, o1, G_K4); break;
    case DRAY_CPU_K5: gmatmul_kind(a, o0, o1, G_K5); break;
    case DRAY_CPU_K6: gmatmul_k6(a, o0, o1); break;
    case DRAY_Q8G32: gmatmul_kind(a, o0, o1, G_Q8); break;
    case DRAY_Q5G32: gmatmul_kind(a, o0, o1, G_Q5); break;
    case DRAY_Q4G32H: gmatmul_kind(a, o0, o1, G_Q4H); break;
    default: gmatmul_kind(a, o0, o1, G_Q4); break;
    }
}
