/* The AMX-INT8 matmul kernel (kernels/cpu/amx_matmul.c) run on a software model
 * of the tile instructions (amx_emul.h), against the AVX-512 VNNI kernel it
 * must match bit for bit: the packed activation layout, the tile loop, the row
 * corrections, the 16-row vector finish and the edges left to AVX-512 VNNI are
 * all checked on machines that have AVX-512 VNNI but no AMX (the development
 * VM; test_cpu_ops runs the real instructions where the CPU grants them). The
 * model follows the SDM: an unconfigured or released tile state faults, so a
 * kernel that forgets ldtilecfg fails here too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amx_emul.h"
#include "cpu_kernels.h"
#include "testutil.h"

/* ------------------------------------------------------------ the model */

static _Thread_local struct {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t data[8][16][64];
} ts;

void dray_emul_tile_loadconfig(const void *cfg)
{
    const uint8_t *c = cfg;
    assert_int_equal(c[0], 1); /* palette 1 */
    memset(&ts, 0, sizeof(ts));
    for (int i = 0; i < 8; i++) {
        memcpy(&ts.colsb[i], c + 16 + 2 * i, 2);
        ts.rows[i] = c[48 + i];
        assert_true(ts.rows[i] <= 16 && ts.colsb[i] <= 64);
    }
    ts.configured = 1;
}

void dray_emul_tile_release(void)
{
    memset(&ts, 0, sizeof(ts));
}

static void check_tile(int t)
{
    assert_true(ts.configured);
    assert_true(t >= 0 && t < 8);
}

void dray_emul_tile_zero(int t)
{
    check_tile(t);
    memset(ts.data[t], 0, sizeof(ts.data[t]));
}

void dray_emul_tile_loadd(int t, const void *base, size_t stride)
{
    check_tile(t);
    memset(ts.data[t], 0, sizeof(ts.data[t]));
    for (int r = 0; r < ts.rows[t]; r++)
        memcpy(ts.data[t][r], (const uint8_t *)base + r * stride, ts.colsb[t]);
}

void dray_emul_tile_stored(int t, void *base, size_t stride)
{
    check_tile(t);
    for (int r = 0; r < ts.rows[t]; r++)
        memcpy((uint8_t *)base + r * stride, ts.data[t][r], ts.colsb[t]);
}

void dray_emul_tile_dpbsud(int d, int a, int b)
{
    check_tile(d), check_tile(a), check_tile(b);
    /* shapes: dst M x N int32, a M x K bytes, b K/4 x N*4 bytes */
    int M = ts.rows[d], N = ts.colsb[d] / 4, K4 = ts.colsb[a] / 4;
    assert_int_equal(ts.rows[a], M);
    assert_int_equal(ts.rows[b], K4);
    assert_int_equal(ts.colsb[b], ts.colsb[d]);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            uint32_t acc;
            memcpy(&acc, &ts.data[d][m][4 * n], 4);
            for (int k = 0; k < K4; k++)
                for (int i = 0; i < 4; i++)
                    acc += (uint32_t)((int32_t)(int8_t)ts.data[a][m][4 * k + i] * (int32_t)ts.data[b][k][4 * n + i]);
            memcpy(&ts.data[d][m][4 * n], &acc, 4);
        }
}

/* ------------------------------------------------------------ the check */

struct mm {
    uint32_t n_tok, n_out, k, n_outlier, accumulate;
};

/* Run one matmul with the AMX pair (qt set) and with the AVX-512 VNNI pair,
 * on the same inputs; the outputs must be the same bits. */
static void run_case(const struct mm *c)
{
    uint32_t sx = c->k + 3, so = c->n_out + 1;
    size_t qs = ((size_t)c->k + 63) & ~(size_t)63;
    uint32_t xos = (c->n_outlier + 7) & ~7u;
    float *x = malloc((size_t)c->n_tok * sx * 4), *ws = malloc(c->n_out * 4);
    int8_t *w = malloc((size_t)c->n_out * c->k);
    int32_t *idx = malloc((c->n_outlier + 1) * 4);
    float *ow = malloc(((size_t)c->n_out * c->n_outlier + 1) * 4);
    float *out[2];
    for (size_t i = 0; i < (size_t)c->n_tok * sx; i++)
        x[i] = dray_test_randf(-2, 2);
    for (size_t i = 0; i < (size_t)c->n_out * c->k; i++)
        w[i] = (int8_t)(dray_test_rand() & 0xff);
    for (uint32_t i = 0; i < c->n_out; i++)
        ws[i] = dray_test_randf(0.001f, 0.02f);
    for (uint32_t j = 0; j < c->n_outlier; j++)
        idx[j] = (int32_t)(j * (c->k / c->n_outlier)); /* increasing, < k */
    for (size_t i = 0; i < (size_t)c->n_out * c->n_outlier; i++)
        ow[i] = dray_test_randf(-0.1f, 0.1f);
    for (int p = 0; p < 2; p++) {
        out[p] = malloc((size_t)c->n_tok * so * 4);
        for (size_t i = 0; i < (size_t)c->n_tok * so; i++)
            out[p][i] = (float)(i % 7) - 3.0f;
        int8_t *q = aligned_alloc(64, qs * c->n_tok), *qt = aligned_alloc(64, qs * c->n_tok + 64);
        float *sxv = malloc(c->n_tok * 4), *xo = malloc(((size_t)c->n_tok * xos + 1) * 4);
        struct dray_cpu_matmul a = {.x = x, .w = w, .wscale = ws, .out = out[p], .outlier_idx = idx,
                                    .outlier_w = ow, .n_tok = c->n_tok, .n_out = c->n_out, .k = c->k,
                                    .stride_x = sx, .stride_out = so, .n_outlier = c->n_outlier,
                                    .accumulate = c->accumulate, .is_i8 = 1, .q = q, .sx = sxv,
                                    .q_stride = qs, .xo = c->n_outlier ? xo : NULL, .xo_stride = xos,
                                    .qt = p == 0 && c->k % 64 == 0 ? qt : NULL};
        if (p == 0) {
            dray_cpu_amx_quantize(&a, 0, c->n_tok);
            dray_cpu_amx_matmul(&a, 0, c->n_out);
        } else {
            dray_cpu_avx512vnni_quantize(&a, 0, c->n_tok);
            dray_cpu_avx512vnni_matmul(&a, 0, c->n_out);
        }
        assert_false(ts.configured); /* the kernel released the tiles */
        free(q), free(qt), free(sxv), free(xo);
    }
    for (size_t i = 0; i < (size_t)c->n_tok * so; i++)
        if (memcmp(&out[0][i], &out[1][i], 4))
            fail_msg("amx vs avx512-vnni: n_tok %u n_out %u k %u outliers %u: element %zu %.9g vs %.9g", c->n_tok,
                     c->n_out, c->k, c->n_outlier, i, out[0][i], out[1][i]);
    free(x), free(ws), free(w), free(idx), free(ow), free(out[0]), free(out[1]);
}

static void test_amx_kernel_matches_avx512vnni_on_the_tile_model(void **state)
{
    (void)state;
    dray_test_seed(21);
    static const struct mm cs[] = {
        {16, 16, 64, 0, 0},  {32, 32, 640, 16, 1}, {47, 80, 128, 3, 0},  {100, 53, 256, 13, 1},
        {64, 48, 2048, 32, 0}, {20, 40, 192, 70, 1}, {130, 24, 64, 8, 0}, {24, 96, 100, 5, 0},
        {15, 64, 128, 2, 0}, {33, 15, 64, 0, 1},
    };
    for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++)
        run_case(&cs[i]);
}

int main(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl")) {
        printf("SKIP: this CPU has no AVX-512 VNNI, which the AMX kernel's edges and finish use\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amx_kernel_matches_avx512vnni_on_the_tile_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
