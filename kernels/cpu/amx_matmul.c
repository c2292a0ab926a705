/* AMX-INT8 int8 matmul for prefill-shaped work (built with -mamx-tile
 * -mamx-int8 plus the AVX-512 flags for this file only, called only when
 * CPUID, XCR0 and the kernel's tile permission say so: dray_cpu_features(1)).
 *
 * One tdpbsud multiplies a 16 x 64 tile of s8 (A) by a 64 x 16 tile of u8 held
 * as 16 rows of 16 x 4 bytes (B) and adds the 16 x 16 int32 products to C, with
 * no intermediate rounding or saturation. Here
 *   A = 16 weight rows x 64 bytes of k, loaded straight from the row-major
 *       weights (stride k; the ABI layout, no repacking);
 *   B = 16 tokens' biased activations (q + 128, the AVX-512 VNNI quantize) for
 *       the same 64 bytes of k, in the packed copy a->qt the quantize step
 *       writes (cpu_kernels.h);
 *   C[row][token] = sum (q + 128) w, and sum q w = C - 128 sum w, the row
 *       correction computed once per 16-row block by the AVX-512 kernel's
 *       dray_cpu_avx512vnni_row_corr.
 * Integer sums are exact, so they equal the reference sums. The finish runs 16
 * output rows at once in AVX-512 (scales, outlier channels, accumulate) with
 * the roundings of dray_avx2_mm_finish in the same order, so the results are
 * the AVX2 kernels' bits, whichever path an output takes.
 *
 * Where the tiles do not fit (k not a multiple of 64, the last n_tok % 16
 * tokens, the last n_out % 16 rows) the AVX-512 VNNI kernel does the work; its
 * results are the AVX2 bits. Tiles: tmm0..3 = C for 2 row blocks x 2 token
 * groups, tmm4/5 = A, tmm6/7 = B, all 16 rows x 64 bytes. */
#include <string.h>

#include "avx512_finish.h"

/* The 64-byte operand of ldtilecfg (palette 1). */
struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* ---------------------------------------------------------------- quantize */

void dray_cpu_amx_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    dray_cpu_avx512vnni_quantize(a, t0, t1);
    if (!a->qt)
        return;
    size_t qs = a->q_stride;
    uint32_t n16 = a->n_tok & ~15u;
    for (uint32_t t = t0; t < t1 && t < n16; t++) {
        /* token t is column t % 16 of its group's B tiles: 4 bytes per row */
        const int8_t *q = a->q + (size_t)t * qs;
        int8_t *g = a->qt + (size_t)(t & ~15u) * qs + (t & 15u) * 4;
        for (size_t c = 0; c < qs; c += 64)
            for (uint32_t r = 0; r < 16; r++)
                memcpy(g + c * 16 + r * 64, q + c + r * 4, 4);
    }
}

/* ---------------------------------------------------------------- finish */

struct rowblk {
    int32_t corr[16];
    float owt[DRAY_AVX512_MAX_OUTL][16]; /* outlier weights transposed: [channel][row] */
    uint32_t vec;                        /* the vector finish applies */
};

static void rowblk_init(const struct dray_cpu_matmul *a, uint32_t o, struct rowblk *rb)
{
    dray_cpu_avx512vnni_row_corr((const int8_t *)a->w + (size_t)o * a->k, a->k, 16, rb->corr);
    rb->vec = a->n_outlier <= DRAY_AVX512_MAX_OUTL;
    if (rb->vec)
        dray_avx512_transpose_outliers(a, o, 16, &rb->owt[0][0], 16);
}

/* Outputs of 16 rows (from o) x 16 tokens (from t) given C[row][token]. */
static void finish_tile(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o, const struct rowblk *rb,
                        const int32_t c[16][16])
{
    const __m512i corr = _mm512_loadu_si512((const void *)rb->corr);
    /* column j of C: elements j, j + 16, ... */
    const __m512i col = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(16));
    for (uint32_t j = 0; j < 16; j++) {
        uint32_t tt = t + j;
        __m512i isum = _mm512_sub_epi32(_mm512_i32gather_epi32(col, &c[0][j], 4), corr);
        if (rb->vec) {
            dray_avx512_finish16(a, tt, o, 16, isum, &rb->owt[0][0], 16);
            continue;
        }
        int32_t s[16];
        float *y = a->out + (size_t)tt * a->stride_out + o;
        _mm512_storeu_si512((void *)s, isum);
        for (uint32_t i = 0; i < 16; i++) {
            float v = dray_avx2_mm_finish(a, tt, o + i, s[i]);
            y[i] = a->accumulate ? y[i] + v : v;
        }
    }
}

/* ---------------------------------------------------------------- tiles */

DRAY_AI void zero_c(void)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

/* Rows o, o+16 (two = 1: both) x tokens t, t+16 (both = 1): C into c[2][2]. */
static void amx_block(const struct dray_cpu_matmul *a, uint32_t o, int two_rows, uint32_t t, int two_toks,
                      int32_t c[2][2][16][16])
{
    const int8_t *w0 = (const int8_t *)a->w + (size_t)o * a->k, *w1 = w0 + 16 * (size_t)a->k;
    size_t qs = a->q_stride, gstride = 16 * qs;
    const int8_t *b0 = a->qt + (size_t)t * qs, *b1 = b0 + gstride;
    zero_c();
    for (uint32_t kc = 0; kc < a->k; kc += 64) {
        _tile_loadd(4, w0 + kc, a->k);
        _tile_loadd(6, b0 + kc * 16, 64);
        _tile_dpbsud(0, 4, 6);
        if (two_toks) {
            _tile_loadd(7, b1 + kc * 16, 64);
            _tile_dpbsud(1, 4, 7);
        }
        if (two_rows) {
            _tile_loadd(5, w1 + kc, a->k);
            _tile_dpbsud(2, 5, 6);
            if (two_toks)
                _tile_dpbsud(3, 5, 7);
        }
    }
    _tile_stored(0, c[0][0], 64);
    _tile_stored(1, c[0][1], 64);
    _tile_stored(2, c[1][0], 64);
    _tile_stored(3, c[1][1], 64);
}

/* Rows [o, o + 16 * nrb) for tokens [0, n16), nrb = 1 or 2. */
static void amx_rows(const struct dray_cpu_matmul *a, uint32_t o, uint32_t nrb, uint32_t n16,
                     struct rowblk rb[2])
{
    int32_t c[2][2][16][16] __attribute__((aligned(64)));
    for (uint32_t i = 0; i < nrb; i++)
        rowblk_init(a, o + 16 * i, &rb[i]);
    for (uint32_t t = 0; t < n16; t += 32) {
        int two_toks = t + 32 <= n16;
        amx_block(a, o, nrb == 2, t, two_toks, c);
        for (uint32_t i = 0; i < nrb; i++)
            for (uint32_t g = 0; g < (two_toks ? 2u : 1u); g++)
                finish_tile(a, t + 16 * g, o + 16 * i, &rb[i], (const int32_t(*)[16])c[i][g]);
    }
}

/* The AVX-512 VNNI kernel on tokens [t0, n_tok) and rows [o0, o1). */
static void vnni_part(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t o0, uint32_t o1)
{
    if (t0 >= a->n_tok || o0 >= o1)
        return;
    struct dray_cpu_matmul sub = *a;
    sub.n_tok = a->n_tok - t0;
    sub.x = a->x + (size_t)t0 * a->stride_x;
    sub.out = a->out + (size_t)t0 * a->stride_out;
    sub.q = a->q + (size_t)t0 * a->q_stride;
    sub.sx = a->sx + t0;
    if (a->xo)
        sub.xo = a->xo + (size_t)t0 * a->xo_stride;
    sub.qt = NULL;
    dray_cpu_avx512vnni_matmul(&sub, o0, o1);
}

void dray_cpu_amx_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    uint32_t n16 = a->n_tok & ~15u;
    if (!a->is_i8 || !a->qt || a->k % 64 || n16 == 0 || o1 - o0 < 16) {
        dray_cpu_avx512vnni_matmul(a, o0, o1);
        return;
    }
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    struct rowblk rb[2];
    uint32_t o = o0;
    for (; o + 32 <= o1; o += 32)
        amx_rows(a, o, 2, n16, rb);
    if (o + 16 <= o1) {
        amx_rows(a, o, 1, n16, rb);
        o += 16;
    }
    /* release the tile state before other code runs on this thread */
    _tile_release();
    vnni_part(a, 0, o, o1);      /* last rows, every token */
    vnni_part(a, n16, o0, o);    /* last tokens, the tile rows */
}
