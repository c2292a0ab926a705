/* dray_quantize_rows_i8: per-row symmetric int8, scale = max|w| / 127,
 * q = round-half-to-even(w / scale) in [-127, 127], zero rows get scale 0.
 * dray_quantize_rows_q4g: 4-bit codes with scale and min per group of 32 (lossy). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf.h"
#include "quant.h"
#include "testutil.h"

static void test_quant_row_with_max_127_rounds_half_to_even(void **state)
{
    (void)state;
    /* max |w| = 127 -> scale exactly 1, so q = rne(w) */
    float w[10] = {127.0f, -127.0f, 2.5f, 3.5f, -2.5f, 0.5f, 1.5f, -0.5f, 2.4999998f, 100.6f};
    int8_t want[10] = {127, -127, 2, 4, -2, 0, 2, 0, 2, 101};
    int8_t q[10];
    float scale;
    dray_quantize_rows_i8(w, 1, 10, q, &scale);
    assert_true(scale == 1.0f);
    assert_memory_equal(q, want, sizeof(want));
}

static void test_quant_zero_row_gets_zero_scale(void **state)
{
    (void)state;
    float w[2][4] = {{0, -0.0f, 0, 0}, {0, 0.254f, 0, -0.127f}};
    int8_t q[2][4];
    float scale[2];
    memset(q, 0x55, sizeof(q));
    dray_quantize_rows_i8(&w[0][0], 2, 4, &q[0][0], scale);
    assert_true(scale[0] == 0.0f);
    for (int c = 0; c < 4; c++)
        assert_int_equal(q[0][c], 0);
    /* second row: scale = 0.254 / 127 = 0.002; codes 127 and -63.5 -> -64 (even) */
    assert_true(scale[1] == 0.254f / 127.0f);
    assert_int_equal(q[1][1], 127);
    assert_int_equal(q[1][3], (int8_t)rintf(-0.127f / scale[1]));
    assert_true(q[1][3] == -63 || q[1][3] == -64); /* -63.5 up to f32 rounding */
}

static void test_quant_rows_are_independent(void **state)
{
    (void)state;
    float w[3][2] = {{1.0f, -0.5f}, {-254.0f, 127.0f}, {15.875f, -31.75f}};
    int8_t q[3][2];
    float scale[3];
    dray_quantize_rows_i8(&w[0][0], 3, 2, &q[0][0], scale);
    assert_true(scale[0] == 1.0f / 127.0f);
    assert_int_equal(q[0][0], 127);
    assert_int_equal(q[0][1], (int8_t)rintf(-0.5f / (1.0f / 127.0f))); /* -63.5 -> -64 */
    assert_true(scale[1] == 2.0f);
    assert_int_equal(q[1][0], -127);
    assert_int_equal(q[1][1], 64); /* 63.5 -> 64 (even) */
    assert_int_equal(q[2][1], -127);
    assert_true(scale[2] == 0.25f);
    assert_int_equal(q[2][0], 64); /* 15.875 / 0.25 = 63.5 -> 64 (even) */
}

static void test_quant_random_rows_reconstruct_within_half_a_step(void **state)
{
    (void)state;
    enum { R = 37, C = 301 };
    float *w = malloc(sizeof(float) * R * C), scale[R];
    int8_t *q = malloc(R * C);
    dray_test_seed(99);
    for (int i = 0; i < R * C; i++)
        w[i] = dray_test_randf(-3.0f, 3.0f) * (float)(1 + i / C);
    dray_quantize_rows_i8(w, R, C, q, scale);
    for (int r = 0; r < R; r++) {
        float amax = 0;
        int qmax = 0;
        for (int c = 0; c < C; c++)
            amax = fmaxf(amax, fabsf(w[r * C + c]));
        assert_true(scale[r] == amax / 127.0f);
        for (int c = 0; c < C; c++) {
            int v = q[r * C + c];
            assert_true(v >= -127 && v <= 127);
            qmax = abs(v) > qmax ? abs(v) : qmax;
            /* |w - q*scale| <= scale/2 (plus f32 slack) */
            assert_true(fabsf(w[r * C + c] - (float)v * scale[r]) <= scale[r] * 0.5001f);
        }
        assert_int_equal(qmax, 127); /* the largest element maps to +-127 */
    }
    free(w);
    free(q);
}

/* Q4G32 of one group: y = code*d + m, codes 0..15 packed i low / i+16 high. */
static float q4_at(const uint8_t *q, const float *dm, int i)
{
    int code = i < 16 ? q[i] & 0xF : q[i - 16] >> 4;
    return (float)code * dm[0] + dm[1];
}

static void test_q4g_group_on_a_16_level_grid_comes_back(void **state)
{
    (void)state;
    /* a Q4_1-like group: codes c(i) = (7i) mod 16, d 0.25, m -1.5 -> the min/max grid
     * is this grid, and least squares cannot lower a zero error */
    float w[32];
    uint8_t q[16];
    float dm[2];
    for (int i = 0; i < 32; i++)
        w[i] = (float)((7 * i) % 16) * 0.25f - 1.5f;
    dray_quantize_rows_q4g(w, 1, 32, q, dm);
    assert_true(dm[0] == 0.25f && dm[1] == -1.5f);
    for (int i = 0; i < 32; i++)
        assert_true(q4_at(q, dm, i) == w[i]);
}

static void test_q4g_known_row_stays_under_the_min_max_error(void **state)
{
    (void)state;
    /* a Q8_0-like row of 2 groups: int8 codes times one scale, the case of Gemma's head.
     * Per group the squared error is at most the min/max grid's, 32 * ((max-min)/30)^2,
     * and every element is within one min/max step (max-min)/15. */
    enum { K = 64 };
    float w[K], dm[4];
    uint8_t q[K / 2];
    for (int i = 0; i < K; i++)
        w[i] = (float)(((i * 37) % 255) - 127) * 0.0123f * (i < 32 ? 1.0f : 0.1f);
    dray_quantize_rows_q4g(w, 1, K, q, dm);
    for (int g = 0; g < K / 32; g++) {
        float lo = w[g * 32], hi = w[g * 32];
        for (int i = 0; i < 32; i++) {
            lo = fminf(lo, w[g * 32 + i]);
            hi = fmaxf(hi, w[g * 32 + i]);
        }
        double sse = 0, step = (hi - lo) / 15.0;
        for (int i = 0; i < 32; i++) {
            double e = w[g * 32 + i] - q4_at(q + g * 16, dm + g * 2, i);
            assert_true(fabs(e) <= step * 1.0001);
            sse += e * e;
        }
        assert_true(sse <= 32 * (step / 2) * (step / 2) * 1.0001);
        assert_true(dm[g * 2] > 0.0f);
    }
    /* the second group is the first scaled by 0.1 where their inputs agree: the
     * groups are quantized independently, so its scale is about a tenth */
    assert_true(dm[2] < dm[0] * 0.2f);
}

static void test_q4g_constant_group_is_exact(void **state)
{
    (void)state;
    float w[32];
    uint8_t q[16];
    float dm[2];
    for (int i = 0; i < 32; i++)
        w[i] = -0.75f;
    dray_quantize_rows_q4g(w, 1, 32, q, dm);
    for (int i = 0; i < 32; i++)
        assert_true(q4_at(q, dm, i) == -0.75f);
}

/* DRAY_Q4G32H's fit (dray_quantize_rows_q4gh): d and m are f16 values, so
 * storing them as f16 changes nothing, and the codes were picked against them:
 * per group its squared error is at most that of the f32 fit with d and m
 * rounded to f16 afterwards, and over Q8_0-like rows (Gemma's head) within 0.1%
 * of the f32 fit's own. A group already on an f16 16-level grid comes back. */
static void test_q4gh_fits_codes_to_f16_scales(void **state)
{
    (void)state;
    enum { ROWS = 16, K = 640, NG = ROWS * K / 32 };
    static float w[ROWS * K], dm[NG * 2], dmh[NG * 2];
    static uint8_t q[ROWS * K / 2], qh[ROWS * K / 2];
    dray_test_seed(5);
    for (int r = 0; r < ROWS; r++) {
        float s = 0.0005f + 0.0002f * (float)r; /* int8 codes times one scale per 32 */
        for (int i = 0; i < K; i++)
            w[r * K + i] = (float)((int)(dray_test_rand() % 255) - 127) * s * (i % 97 == 0 ? 1.0f : 0.3f);
    }
    dray_quantize_rows_q4g(w, ROWS, K, q, dm);
    dray_quantize_rows_q4gh(w, ROWS, K, qh, dmh);
    double sse = 0, sse_h = 0, sse_naive = 0;
    for (int g = 0; g < NG; g++) {
        double gh = 0, gn = 0;
        for (int j = 0; j < 2; j++) /* exactly f16 */
            assert_true(dray_f16_to_f32(dray_f32_to_f16(dmh[2 * g + j])) == dmh[2 * g + j]);
        float naive[2] = {dray_f16_to_f32(dray_f32_to_f16(dm[2 * g])),
                          dray_f16_to_f32(dray_f32_to_f16(dm[2 * g + 1]))};
        for (int i = 0; i < 32; i++) {
            double x = w[g * 32 + i];
            double e = x - q4_at(q + g * 16, dm + 2 * g, i), eh = x - q4_at(qh + g * 16, dmh + 2 * g, i);
            double en = x - q4_at(q + g * 16, naive, i);
            sse += e * e, sse_h += eh * eh, sse_naive += en * en;
            gh += eh * eh, gn += en * en;
        }
        assert_true(gh <= gn);
    }
    if (!(sse_h <= sse_naive && sse_h < sse * 1.001))
        fail_msg("squared error: f16-aware %.6g, f32 fit %.6g, f32 fit rounded to f16 %.6g", sse_h, sse, sse_naive);
    float g16[32], d1[2];
    uint8_t q1[16];
    for (int i = 0; i < 32; i++)
        g16[i] = (float)((7 * i) % 16) * 0.25f - 1.5f;
    dray_quantize_rows_q4gh(g16, 1, 32, q1, d1);
    assert_true(d1[0] == 0.25f && d1[1] == -1.5f);
    for (int i = 0; i < 32; i++)
        assert_true(q4_at(q1, d1, i) == g16[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_row_with_max_127_rounds_half_to_even),
        cmocka_unit_test(test_quant_zero_row_gets_zero_scale),
        cmocka_unit_test(test_quant_rows_are_independent),
        cmocka_unit_test(test_quant_random_rows_reconstruct_within_half_a_step),
        cmocka_unit_test(test_q4g_group_on_a_16_level_grid_comes_back),
        cmocka_unit_test(test_q4g_known_row_stays_under_the_min_max_error),
        cmocka_unit_test(test_q4g_constant_group_is_exact),
        cmocka_unit_test(test_q4gh_fits_codes_to_f16_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
