/* The plugin helper (include/dray/backend_util.h): f16 conversions against the
 * binary16 definition (every half, a million random floats) and bf16 ties; each
 * op validator
 * returns the code backend.h documents for a rule it breaks; view checks catch
 * out-of-bounds, misaligned and dead buffers; negotiation answers with the
 * table's own version. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dray/backend_util.h"
#include "testutil.h"

static float bits_f32(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
}

/* binary16 by its definition, in double: (-1)^s 2^(e-15) 1.m, or 2^-14 0.m. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

/* h is the correctly rounded half of f: no finite neighbour of the same sign is
 * nearer, a tie went to the even code, and only |f| >= 65520 gave infinity. */
static void assert_nearest(float f, uint16_t h)
{
    double x = fabs((double)f), d = fabs(x - fabs(half_value(h)));
    uint16_t mag = h & 0x7fff;
    if ((h & 0x8000) != (signbit(f) ? 0x8000 : 0))
        fail_msg("f32 %a: half 0x%04x has the wrong sign", (double)f, h);
    if (mag == 0x7c00) {
        if (x < 65520.0)
            fail_msg("f32 %a rounded to infinity", (double)f);
        return;
    }
    for (int step = -1; step <= 1; step += 2) {
        int n = (int)mag + step;
        if (n < 0 || n >= 0x7c00)
            continue;
        double dn = fabs(x - half_value((uint16_t)n));
        if (dn < d || (dn == d && (mag & 1)))
            fail_msg("f32 %a: half 0x%04x, but 0x%04x is nearer or the even tie", (double)f, h, n);
    }
}

static void test_f16_is_correctly_rounded_and_round_trips(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = dray_util_f16_to_f32((uint16_t)h);
        double want = half_value((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(f));
            continue;
        }
        assert_true((double)f == want && !!signbit(f) == !!(h & 0x8000));
        assert_int_equal(dray_util_f32_to_f16(f), h);
    }
    dray_test_seed(11);
    for (int i = 0; i < 1000000; i++) {
        float f = bits_f32(dray_test_rand());
        if (!isnan(f))
            assert_nearest(f, dray_util_f32_to_f16(f));
    }
    /* the edges: the largest half, the first value that rounds to infinity, the
     * tie at half the smallest subnormal (rounds to even: zero) */
    assert_int_equal(dray_util_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(dray_util_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(dray_util_f32_to_f16(0x1p-25f), 0x0000);
    assert_int_equal(dray_util_f32_to_f16(-0x1.000002p-25f), 0x8001);
    assert_int_equal(dray_util_f32_to_f16(NAN) & 0x7e00, 0x7e00);
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(dray_util_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(dray_util_f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80); /* tie -> even */
    assert_int_equal(dray_util_f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82); /* tie -> even */
    assert_int_equal(dray_util_f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
    assert_true(isnan(dray_util_bf16_to_f32(dray_util_f32_to_bf16(NAN))));
    assert_true(dray_util_bf16_to_f32(0xc040) == -3.0f);
}

/* A fake buffer: the helper sees it only through buf_size. */
struct dray_buf {
    size_t size;
    int live;
};

static size_t fake_size(const struct dray_buf *b, int *live)
{
    *live = b->live;
    return b->size;
}

static void test_validators_return_documented_codes(void **state)
{
    (void)state;
    char why[256];
    struct dray_util_needs nd;
    struct dray_buf big = {1 << 20, 1};
    struct dray_view v = {&big, 0};

    struct dray_rope_args r = {.x = v, .pos = v, .n_tok = 2, .n_head = 2, .head_dim = 8,
                               .n_rot = 7, .stride = 16};
    assert_int_equal(dray_util_check_rope(&r, &nd, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "n_rot = 7"));
    r.n_rot = 8;
    assert_int_equal(dray_util_check_rope(&r, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(nd.n, 3);
    assert_int_equal(nd.at[0].nbytes, (size_t)(1 * 16 + 16) * 4);
    assert_int_equal(nd.at[2].nbytes, 0); /* v4: no freq_factors buffer, nothing to check */
    /* v4: freq_factors spans n_rot/2 floats; attn_factor finite and >= 0 */
    struct dray_buf small = {8, 1};
    r.freq_factors = (struct dray_view){&big, 0};
    assert_int_equal(dray_util_check_rope(&r, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(nd.at[2].nbytes, 4 * 4);
    r.freq_factors = (struct dray_view){&small, 0};
    assert_int_equal(dray_util_check_rope(&r, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(dray_util_check_views(&nd, fake_size, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "rope freq_factors"));
    r.freq_factors = (struct dray_view){NULL, 0};
    r.attn_factor = -1.0f;
    assert_int_equal(dray_util_check_rope(&r, &nd, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "attn_factor"));
    r.attn_factor = NAN;
    assert_int_equal(dray_util_check_rope(&r, &nd, why, sizeof(why)), DRAY_EINVAL);
    r.attn_factor = 0.0f;
    assert_true(dray_util_rope_mscale(&r) == 1.0f);
    r.attn_factor = 1.25f;
    assert_true(dray_util_rope_mscale(&r) == 1.25f);

    struct dray_matmul_args m = {.x = v, .w = v, .wscale = v, .out = {&big, 4096}, .n_tok = 1,
                                 .n_out = 4, .k = 8, .stride_x = 8, .stride_out = 4,
                                 .wdtype = 7};
    assert_int_equal(dray_util_check_matmul(&m, &nd, why, sizeof(why)), DRAY_ENOTSUP);
    m.wdtype = DRAY_I8;
    assert_int_equal(dray_util_check_matmul(&m, &nd, why, sizeof(why)), DRAY_OK);
    m.k = m.stride_x = 65537;
    assert_int_equal(dray_util_check_matmul(&m, &nd, why, sizeof(why)), DRAY_EINVAL);
    m.k = m.stride_x = 8;
    m.out = v; /* out on top of x */
    assert_int_equal(dray_util_check_matmul(&m, &nd, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "overlaps"));
    m.out = (struct dray_view){&big, 4096};
    /* grouped weights: refused by the version-1 check (a plugin that does not run
     * them must not read them as something else), sized by the grouped one */
    m.wdtype = DRAY_Q4G32;
    m.k = m.stride_x = 64;
    assert_int_equal(dray_util_check_matmul(&m, &nd, why, sizeof(why)), DRAY_ENOTSUP);
    assert_int_equal(dray_util_check_matmul_g(&m, 1, &nd, why, sizeof(why)), DRAY_EINVAL); /* 4 rows */
    m.n_out = m.stride_out = 16;
    assert_int_equal(dray_util_check_matmul_g(&m, 1, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(nd.at[1].nbytes, 16 * 32); /* 16 rows of 64 nibbles */
    assert_int_equal(nd.at[2].nbytes, 16 * 4 * 4); /* 16 rows of 2 groups of {d, m} */
    m.wdtype = DRAY_Q8G32;
    assert_int_equal(dray_util_check_matmul_g(&m, 1, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(nd.at[1].nbytes, 16 * 64);
    assert_int_equal(nd.at[2].nbytes, 16 * 2 * 4);
    m.k = m.stride_x = 48; /* not whole groups */
    assert_int_equal(dray_util_check_matmul_g(&m, 1, &nd, why, sizeof(why)), DRAY_EINVAL);
    m.k = m.stride_x = 64;
    m.n_outlier = 1; /* no outlier channels on the grouped path */
    assert_int_equal(dray_util_check_matmul_g(&m, 1, &nd, why, sizeof(why)), DRAY_EINVAL);
    m.n_outlier = 0;
    /* two-pass activations: only a plugin that runs them (grouped 2) takes them,
     * sized as the weights of their layout */
    m.wdtype = DRAY_Q4G32_X2;
    assert_int_equal(dray_util_check_matmul_g(&m, 1, &nd, why, sizeof(why)), DRAY_ENOTSUP);
    assert_int_equal(dray_util_check_matmul_g(&m, 2, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(nd.at[1].nbytes, 16 * 32);
    assert_int_equal(nd.at[2].nbytes, 16 * 4 * 4);
    m.wdtype = DRAY_Q8G32_X2;
    assert_int_equal(dray_util_check_matmul_g(&m, 2, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(nd.at[1].nbytes, 16 * 64);
    assert_int_equal(dray_util_check_matmul(&m, &nd, why, sizeof(why)), DRAY_ENOTSUP);
    /* 5-bit groups (appended): only a plugin that runs them (grouped 3) takes
     * them or their two-pass form; 20 bytes of codes and one f32-sized slot of
     * f16 {d, m} per row and group */
    for (int x2 = 0; x2 < 2; x2++) {
        m.wdtype = x2 ? DRAY_Q5G32_X2 : DRAY_Q5G32;
        assert_int_equal(dray_util_check_matmul_g(&m, 2, &nd, why, sizeof(why)), DRAY_ENOTSUP);
        assert_non_null(strstr(why, "Q4G32_X2")); /* names what it does take */
        assert_int_equal(dray_util_check_matmul_g(&m, 3, &nd, why, sizeof(why)), DRAY_OK);
        assert_int_equal(nd.at[1].nbytes, 16 * 2 * 20);
        assert_int_equal(nd.at[2].nbytes, 16 * 2 * 4);
    }
    /* 4-bit groups with f16 d and m (appended): only grouped 4 takes them; Q4G32's
     * 16 bytes of codes and Q5G32's one f32-sized slot of f16 {d, m} per row and group */
    for (int x2 = 0; x2 < 2; x2++) {
        m.wdtype = x2 ? DRAY_Q4G32H_X2 : DRAY_Q4G32H;
        assert_int_equal(dray_util_check_matmul_g(&m, 3, &nd, why, sizeof(why)), DRAY_ENOTSUP);
        assert_non_null(strstr(why, "Q5G32")); /* names what it does take */
        assert_int_equal(dray_util_check_matmul_g(&m, 4, &nd, why, sizeof(why)), DRAY_OK);
        assert_int_equal(nd.at[1].nbytes, 16 * 2 * 16);
        assert_int_equal(nd.at[2].nbytes, 16 * 2 * 4);
    }
    m.wdtype = DRAY_Q5G32;
    assert_int_equal(dray_util_check_matmul_g(&m, 4, &nd, why, sizeof(why)), DRAY_OK);
    m.wdtype = DRAY_Q5G32;
    m.k = m.stride_x = 48; /* not whole groups */
    assert_int_equal(dray_util_check_matmul_g(&m, 3, &nd, why, sizeof(why)), DRAY_EINVAL);
    m.k = m.stride_x = 64;
    /* never an embedding table, whatever the plugin runs */
    struct dray_embed_args ea = {.ids = v, .table = v, .row_scale = v, .out = {&big, 4096}, .dtype = DRAY_Q5G32,
                                 .n_tok = 1, .dim = 64, .n_rows = 16, .scale = 1.0f};
    assert_int_equal(dray_util_check_embed_g(&ea, 1, &nd, why, sizeof(why)), DRAY_ENOTSUP);
    ea.dtype = DRAY_Q4G32H;
    assert_int_equal(dray_util_check_embed_g(&ea, 1, &nd, why, sizeof(why)), DRAY_ENOTSUP);
    ea.dtype = DRAY_Q4G32;
    assert_int_equal(dray_util_check_embed_g(&ea, 1, &nd, why, sizeof(why)), DRAY_OK);

    struct dray_kv_pool pool = {.k = v, .v = v, .k_scale = v, .v_scale = v, .dtype = DRAY_F32,
                                .n_kv_head = 1, .head_dim = 4, .block_size = 4, .n_slots = 8};
    struct dray_kv_store_args ks = {.k = v, .v = v, .slots = v, .pool = &pool, .n_tok = 1,
                                    .stride_k = 4, .stride_v = 4};
    assert_int_equal(dray_util_check_kv_store(&ks, &nd, why, sizeof(why)), DRAY_ENOTSUP);
    pool.dtype = DRAY_I8;
    pool.n_slots = 6; /* not a multiple of block_size */
    assert_int_equal(dray_util_check_kv_store(&ks, &nd, why, sizeof(why)), DRAY_EINVAL);
    /* v4: attention softcap is finite and >= 0 (0 = none) */
    pool.n_slots = 8;
    struct dray_attention_args at = {.q = v, .out = {&big, 4096}, .seqs = v, .block_table = v,
                                     .pool = &pool, .n_tok = 1, .n_seq = 1, .n_head = 1,
                                     .stride_q = 4, .stride_out = 4, .scale = 0.5f};
    assert_int_equal(dray_util_check_attention(&at, &nd, why, sizeof(why)), DRAY_OK);
    at.softcap = 30.0f;
    assert_int_equal(dray_util_check_attention(&at, &nd, why, sizeof(why)), DRAY_OK);
    at.softcap = -1.0f;
    assert_int_equal(dray_util_check_attention(&at, &nd, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "softcap"));
    at.softcap = INFINITY;
    assert_int_equal(dray_util_check_attention(&at, &nd, why, sizeof(why)), DRAY_EINVAL);

    struct dray_gated_act_args g = {.gate = v, .up = v, .out = v, .n_tok = 1, .n = 4,
                                    .stride_gate = 4, .stride_up = 4, .stride_out = 4, .act = 9};
    assert_int_equal(dray_util_check_gated_act(&g, &nd, why, sizeof(why)), DRAY_EINVAL);

    struct dray_rmsnorm_args rn = {.x = v, .w = v, .out = {&big, 4}, .n_tok = 2, .n_head = 1,
                                   .n = 4, .stride_x = 4, .stride_out = 4};
    assert_int_equal(dray_util_check_rmsnorm(&rn, &nd, why, sizeof(why)), DRAY_EINVAL);
    rn.out = v; /* exactly in place is allowed */
    assert_int_equal(dray_util_check_rmsnorm(&rn, &nd, why, sizeof(why)), DRAY_OK);

    /* a table of (2^32-1)^2 f32 elements spans more than 2^64 bytes */
    struct dray_embed_args e = {.ids = v, .table = v, .row_scale = v, .out = v,
                                .dtype = DRAY_F32, .n_tok = 3, .dim = UINT32_MAX,
                                .n_rows = UINT32_MAX};
    assert_int_equal(dray_util_check_embed(&e, &nd, why, sizeof(why)), DRAY_ERANGE);
    e.dtype = DRAY_F16; /* no F16 tables in the contract */
    assert_int_equal(dray_util_check_embed(&e, &nd, why, sizeof(why)), DRAY_ENOTSUP);
}

static void test_views(void **state)
{
    (void)state;
    char why[256];
    struct dray_buf b = {100, 1}, dead = {100, 0};
    struct dray_add_args a = {.a = {&b, 0}, .b = {&b, 40}, .out = {&b, 40}, .n = 10};
    struct dray_util_needs nd;
    assert_int_equal(dray_util_check_add(&a, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(dray_util_check_views(&nd, fake_size, why, sizeof(why)), DRAY_OK);
    a.n = 16; /* b and out at 40 need 64 bytes of 100 */
    assert_int_equal(dray_util_check_add(&a, &nd, why, sizeof(why)), DRAY_EINVAL); /* out vs a */
    a.out = a.b;
    a.a = (struct dray_view){&b, 0};
    a.n = 15;
    assert_int_equal(dray_util_check_add(&a, &nd, why, sizeof(why)), DRAY_EINVAL);
    a.a = (struct dray_view){&dead, 0};
    assert_int_equal(dray_util_check_add(&a, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(dray_util_check_views(&nd, fake_size, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "not a live buffer"));
    a.a = (struct dray_view){&b, 0};
    a.b = a.out = (struct dray_view){&b, 42}; /* misaligned */
    a.n = 1;
    assert_int_equal(dray_util_check_add(&a, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(dray_util_check_views(&nd, fake_size, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "multiple"));
    a.b = a.out = (struct dray_view){&b, 100}; /* past the end */
    assert_int_equal(dray_util_check_add(&a, &nd, why, sizeof(why)), DRAY_OK);
    assert_int_equal(dray_util_check_views(&nd, fake_size, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "buffer holds 100"));
}

static void test_negotiate_answers_own_version(void **state)
{
    (void)state;
    struct dray_ops table = {.version = 1, .name = "x"};
    const struct dray_ops *ops = NULL;
    char err[128] = "";
    uint32_t v = 7; /* a newer host */
    assert_int_equal(dray_util_negotiate(&v, &table, &ops, err, sizeof(err)), DRAY_OK);
    assert_int_equal(v, 1);
    assert_ptr_equal(ops, &table);
    table.version = 3;
    v = 2; /* an older host */
    assert_int_equal(dray_util_negotiate(&v, &table, &ops, err, sizeof(err)), DRAY_EINCOMPAT);
    assert_non_null(strstr(err, "implements ABI 3"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_is_correctly_rounded_and_round_trips),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_validators_return_documented_codes),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_negotiate_answers_own_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
