/* Capability checks at open (core/caps.c): the configured dtypes against a
 * device's per-op dtypes, and a model's shapes against the declared limits;
 * each refusal names the op or the limit and both values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "caps.h"
#include "dray/backend_util.h"

static void full_caps(struct dray_op_caps *c)
{
    struct dray_device_props p;
    memset(&p, 0, sizeof(p));
    for (int op = 0; op < DRAY_OP_COUNT_V1; op++)
        p.op_dtypes[op] = DRAY_DTYPE_BIT(DRAY_F32) | DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    dray_util_caps_from_props(c, &p);
}

static void test_config_dtypes(void **state)
{
    (void)state;
    struct dray_config cfg;
    struct dray_op_caps c;
    char why[256];
    dray_config_defaults(&cfg);
    full_caps(&c);
    assert_int_equal(dray_caps_check_config(&c, &cfg, why, sizeof(why)), 0);
    c.op_dtypes[DRAY_OP_ATTENTION] = DRAY_DTYPE_BIT(DRAY_I8);
    cfg.kv_dtype = DRAY_F16;
    assert_int_equal(dray_caps_check_config(&c, &cfg, why, sizeof(why)), DRAY_ENOTSUP);
    assert_string_equal(why, "the device does not run attention in f16 (config kv_dtype)");
    cfg.kv_dtype = DRAY_I8;
    cfg.precision = DRAY_PRECISION_F32;
    c.op_dtypes[DRAY_OP_MATMUL] = DRAY_DTYPE_BIT(DRAY_I8);
    assert_int_equal(dray_caps_check_config(&c, &cfg, why, sizeof(why)), DRAY_ENOTSUP);
    assert_string_equal(why, "the device does not run matmul in f32 (config precision)");
    c.n_ops = 3; /* a table that stops before rope */
    cfg.precision = DRAY_PRECISION_INT8;
    assert_int_equal(dray_caps_check_config(&c, &cfg, why, sizeof(why)), DRAY_ENOTSUP);
    assert_string_equal(why, "the device does not run rope in f32");
}

#define WF(b, h, m) DRAY_UTIL_WF(b, h, m)

/* Grouped precisions run where matmul and embed declare the packed formats they
 * need (ABI v3: q8 for int8g, q8 and q4m for w4a8), and become int8 with one
 * line saying so where they do not (a version-1 or -2 plugin). */
static void test_grouped_precision_falls_back_to_int8(void **state)
{
    (void)state;
    struct dray_op_caps c;
    char why[256];
    full_caps(&c);
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_INT8G, why, sizeof(why)), DRAY_PRECISION_INT8);
    assert_string_equal(why, "precision int8g: the device does not declare the packed weights it needs "
                             "(q8 for matmul and embed); using int8");
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_INT8, why, sizeof(why)), DRAY_PRECISION_INT8);
    assert_string_equal(why, "");
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_F32, why, sizeof(why)), DRAY_PRECISION_F32);
    c.matmul_wformats |= WF(8, 0, 0);
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_INT8G, why, sizeof(why)), DRAY_PRECISION_INT8);
    c.embed_wformats |= WF(8, 0, 0);
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_INT8G, why, sizeof(why)), DRAY_PRECISION_INT8G);
    assert_string_equal(why, "");
    /* w4a8 needs both formats */
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_W4A8, why, sizeof(why)), DRAY_PRECISION_INT8);
    assert_string_equal(why, "precision w4a8: the device does not declare the packed weights it needs "
                             "(q8 and q4m for matmul and embed); using int8");
    c.matmul_wformats |= WF(4, 0, 1);
    c.embed_wformats |= WF(4, 0, 1);
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_W4A8, why, sizeof(why)), DRAY_PRECISION_W4A8);
    /* the retired v2 dtype bits are no declaration */
    full_caps(&c);
    c.op_dtypes[DRAY_OP_MATMUL] |= DRAY_DTYPE_BIT(DRAY_Q8G32) | DRAY_DTYPE_BIT(DRAY_Q4G32);
    c.op_dtypes[DRAY_OP_EMBED] |= DRAY_DTYPE_BIT(DRAY_Q8G32) | DRAY_DTYPE_BIT(DRAY_Q4G32);
    assert_int_equal(dray_caps_precision(&c, DRAY_PRECISION_W4A8, why, sizeof(why)), DRAY_PRECISION_INT8);
}

/* Two-pass activations: only for the grouped precisions, and only where the
 * device declares two passes for matmul on packed weights; otherwise one pass
 * and a reason. */
static void test_two_pass_activations_fall_back_to_one_pass(void **state)
{
    (void)state;
    struct dray_op_caps c;
    char why[256];
    full_caps(&c);
    c.matmul_wformats = c.embed_wformats = WF(8, 0, 0) | WF(4, 0, 1);
    c.matmul_passes = 1;
    enum dray_activations x2 = DRAY_ACTIVATIONS_INT8X2;
    assert_int_equal(dray_caps_activations(&c, DRAY_PRECISION_W4A8, x2, why, sizeof(why)), DRAY_ACTIVATIONS_INT8);
    assert_string_equal(why, "activations int8x2: the device does not declare two-pass activations for "
                             "matmul; using int8");
    /* int8 and f32 have no grouped matmuls: nothing to fall back from */
    assert_int_equal(dray_caps_activations(&c, DRAY_PRECISION_INT8, x2, why, sizeof(why)), x2);
    assert_string_equal(why, "");
    assert_int_equal(dray_caps_activations(&c, DRAY_PRECISION_F32, x2, why, sizeof(why)), x2);
    c.matmul_passes = 3;
    assert_int_equal(dray_caps_activations(&c, DRAY_PRECISION_INT8G, x2, why, sizeof(why)), x2);
    assert_int_equal(dray_caps_activations(&c, DRAY_PRECISION_W4A8, x2, why, sizeof(why)), x2);
    assert_string_equal(why, "");
    /* one pass asked for: never a warning */
    c.matmul_passes = 1;
    assert_int_equal(dray_caps_activations(&c, DRAY_PRECISION_W4A8, DRAY_ACTIVATIONS_INT8, why, sizeof(why)),
                     DRAY_ACTIVATIONS_INT8);
    assert_string_equal(why, "");
}

/* 5-bit file tensors load as q5hm only where the device declares it for
 * matmul; else they stay 8-bit groups (the engine warns once). 4-bit ones with
 * f16 d and m (Q4_0 / Q4_1, the rounded head) load as q4hm only where it is
 * declared; else as q4m (f32 d and m). An embed declaration is not enough. */
static void test_five_bit_and_half_scale_weights_need_their_formats(void **state)
{
    (void)state;
    struct dray_op_caps c;
    full_caps(&c);
    c.matmul_wformats = WF(8, 0, 0) | WF(4, 0, 1);
    c.embed_wformats = WF(5, 1, 1) | WF(4, 1, 1);
    assert_false(dray_caps_q5(&c));
    assert_false(dray_caps_q4h(&c));
    c.matmul_wformats |= WF(5, 1, 1);
    assert_true(dray_caps_q5(&c));
    assert_false(dray_caps_q4h(&c));
    c.matmul_wformats |= WF(4, 1, 1);
    assert_true(dray_caps_q4h(&c));
    assert_true(dray_caps_runs(&c, DRAY_OP_EMBED, DRAY_Q4G32H));
    assert_false(dray_caps_runs(&c, DRAY_OP_EMBED, DRAY_Q8G32));
    assert_true(dray_caps_runs(&c, DRAY_OP_MATMUL, DRAY_I8));
}

static void test_shape_limits(void **state)
{
    (void)state;
    struct dray_op_caps c;
    char why[256];
    full_caps(&c);
    struct dray_caps_shape s = {.head_dim = 256, .n_rot = 256, .n_head = 8, .max_k = 6912};
    assert_int_equal(dray_caps_check_shape(&c, &s, why, sizeof(why)), 0); /* no limits declared */
    c.max_head_dim = 128;
    assert_int_equal(dray_caps_check_shape(&c, &s, why, sizeof(why)), DRAY_ENOTSUP);
    assert_non_null(strstr(why, "head_dim 256 is above the device's limit 128"));
    c.max_head_dim = 256;
    c.max_n_rot = 128;
    assert_int_equal(dray_caps_check_shape(&c, &s, why, sizeof(why)), DRAY_ENOTSUP);
    assert_non_null(strstr(why, "at most 128"));
    c.max_n_rot = 0;
    s.n_rot = 64;
    c.rope_partial = 0;
    assert_int_equal(dray_caps_check_shape(&c, &s, why, sizeof(why)), DRAY_ENOTSUP);
    assert_non_null(strstr(why, "whole heads only"));
    c.rope_partial = 1;
    c.max_heads = 4;
    assert_int_equal(dray_caps_check_shape(&c, &s, why, sizeof(why)), DRAY_ENOTSUP);
    c.max_heads = 0;
    s.max_k = 70000; /* beyond the contract's 65536 even with no limit declared */
    assert_int_equal(dray_caps_check_shape(&c, &s, why, sizeof(why)), DRAY_ENOTSUP);
    assert_non_null(strstr(why, "k = 70000"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_dtypes),
        cmocka_unit_test(test_shape_limits),
        cmocka_unit_test(test_grouped_precision_falls_back_to_int8),
        cmocka_unit_test(test_two_pass_activations_fall_back_to_one_pass),
        cmocka_unit_test(test_five_bit_and_half_scale_weights_need_their_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
