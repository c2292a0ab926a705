/* Dequantization of every supported ggml block format, and the half-float helpers.
 * Each test picks the integer codes and scales first, packs them into bytes by
 * following the layout in docs/reference/gemma3-gguf.md §4 (the inverse of what
 * dequant.c does), and expects code * scale (+ min) computed here. Scales are
 * powers of two or small integers, so every expected value is exact in f32 and the
 * comparison is bit-exact whatever the evaluation order. A few literal values,
 * worked out by hand, pin the layouts down independently of the packers. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "gguf.h"
#include "quant.h"
#include "testutil.h"

/* half bits of a few exact values */
#define H_1 0x3C00     /* 1.0 */
#define H_2 0x4000     /* 2.0 */
#define H_HALF 0x3800  /* 0.5 */
#define H_QUART 0x3400 /* 0.25 */
#define H_EIGHTH 0x3000 /* 0.125 */
#define H_M1 0xBC00    /* -1.0 */

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static void expect_floats(const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], 4)) /* bit-exact, so -0 vs 0 would show */
            print_error("element %d: got %.9g, want %.9g\n", i, got[i], want[i]);
        assert_memory_equal(&got[i], &want[i], 4);
    }
}

/* ------------------------------------------------------------ plain floats */

static void test_dequant_f32_f16_bf16_rows(void **state)
{
    (void)state;
    float f[3] = {1.5f, -0.0f, 3e38f}, out[4];
    assert_int_equal(dray_dequant_row(DRAY_GGML_F32, f, out, 3), 0);
    expect_floats(out, f, 3);

    uint16_t h[4] = {H_1, 0xC500 /* -5 */, 0x7C00, 0x0001};
    float hw[4] = {1.0f, -5.0f, INFINITY, 0x1p-24f};
    assert_int_equal(dray_dequant_row(DRAY_GGML_F16, h, out, 4), 0);
    expect_floats(out, hw, 4);

    /* bf16 = top 16 bits of an f32: 0x3F80 = 1.0, 0xC0A0 = -5.0, 0x4049 = 3.140625 */
    uint16_t b[4] = {0x3F80, 0xC0A0, 0x4049, 0xFF80};
    float bw[4] = {1.0f, -5.0f, 3.140625f, -INFINITY};
    assert_int_equal(dray_dequant_row(DRAY_GGML_BF16, b, out, 4), 0);
    expect_floats(out, bw, 4);
}

/* ------------------------------------------------------------ 32-element blocks */

static void test_dequant_q8_0_block(void **state)
{
    (void)state;
    uint8_t blk[34];
    float out[32], want[32];
    put16(blk, H_HALF);
    for (int e = 0; e < 32; e++) {
        int8_t q = (int8_t)(e * 9 - 128); /* -128, -119, ..., 151 wraps -> -105 */
        blk[2 + e] = (uint8_t)q;
        want[e] = q * 0.5f;
    }
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q8_0, blk, out, 32), 0);
    expect_floats(out, want, 32);
    assert_true(out[0] == -64.0f); /* -128 * 0.5 */
    assert_true(out[1] == -59.5f); /* -119 * 0.5 */
}

static void test_dequant_q4_0_block(void **state)
{
    (void)state;
    uint8_t blk[18];
    float out[32];
    put16(blk, H_2);
    for (int j = 0; j < 16; j++) /* low nibble j (element j), high 15-j (element j+16) */
        blk[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q4_0, blk, out, 32), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == (float)(j - 8) * 2.0f);
        assert_true(out[j + 16] == (float)(7 - j) * 2.0f);
    }
    /* by hand: q=0 -> (0-8)*2 = -16; q=15 -> 14; element 16 has q = 15 */
    assert_true(out[0] == -16.0f && out[15] == 14.0f && out[16] == 14.0f && out[31] == -16.0f);
}

static void test_dequant_q4_1_block(void **state)
{
    (void)state;
    uint8_t blk[20];
    float out[32];
    put16(blk, H_QUART);
    put16(blk + 2, H_M1);
    for (int j = 0; j < 16; j++)
        blk[4 + j] = (uint8_t)(((j * 3) & 15) | (((j * 5 + 1) & 15) << 4));
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q4_1, blk, out, 32), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == (float)((j * 3) & 15) * 0.25f - 1.0f);
        assert_true(out[j + 16] == (float)((j * 5 + 1) & 15) * 0.25f - 1.0f);
    }
    assert_true(out[0] == -1.0f);  /* q 0 */
    assert_true(out[16] == -0.75f); /* q 1 */
    assert_true(out[5] == 2.75f);  /* q 15 */
}

/* Pack 32 five-bit codes as Q5_0/Q5_1 do: qs low nibble = code j & 15 (elements
 * 0-15) and high nibble = code j+16 & 15; qh bit e = bit 4 of code e. */
static void pack_q5(const int *q, uint8_t *qh4, uint8_t *qs)
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
    for (int e = 0; e < 32; e++)
        h |= (uint32_t)(q[e] >> 4) << e;
    memcpy(qh4, &h, 4);
}

static void test_dequant_q5_0_block(void **state)
{
    (void)state;
    uint8_t blk[22];
    float out[32];
    /* codes = element index: qs[j] = j | j << 4, qh = 0xFFFF0000 (elements 16..31 >= 16) */
    put16(blk, H_1);
    uint32_t h = 0xFFFF0000u;
    memcpy(blk + 2, &h, 4);
    for (int j = 0; j < 16; j++)
        blk[6 + j] = (uint8_t)(j | (j << 4));
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q5_0, blk, out, 32), 0);
    for (int e = 0; e < 32; e++)
        assert_true(out[e] == (float)(e - 16));

    /* random codes through the packer, d = 0.125 */
    dray_test_seed(5);
    for (int rep = 0; rep < 50; rep++) {
        int q[32];
        for (int e = 0; e < 32; e++)
            q[e] = (int)(dray_test_rand() % 32);
        put16(blk, H_EIGHTH);
        pack_q5(q, blk + 2, blk + 6);
        assert_int_equal(dray_dequant_row(DRAY_GGML_Q5_0, blk, out, 32), 0);
        for (int e = 0; e < 32; e++)
            assert_true(out[e] == (float)(q[e] - 16) * 0.125f);
    }
}

static void test_dequant_q5_1_block(void **state)
{
    (void)state;
    uint8_t blk[24];
    float out[32];
    int q[32];
    for (int e = 0; e < 32; e++)
        q[e] = 31 - e;
    put16(blk, H_HALF);
    put16(blk + 2, H_1);
    pack_q5(q, blk + 4, blk + 8);
    /* by hand: element 0 has code 31 -> low nibble 15 in qs[0], bit 0 of qh set */
    assert_int_equal(blk[8] & 15, 15);
    assert_int_equal(blk[4] & 1, 1);
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q5_1, blk, out, 32), 0);
    for (int e = 0; e < 32; e++)
        assert_true(out[e] == (float)(31 - e) * 0.5f + 1.0f);
    assert_true(out[0] == 16.5f && out[31] == 1.0f);
}

/* ------------------------------------------------------------ k-quants */

/* 8 six-bit scales and mins into the 12 bytes of Q4_K/Q5_K:
 * bytes 0-3: sc[0..3] | (sc[4..7] >> 4) << 6; bytes 4-7: m[0..3] | (m[4..7] >> 4) << 6;
 * bytes 8-11: (sc[4..7] & 15) | (m[4..7] & 15) << 4. */
static void pack_k_scales(const int *sc, const int *m, uint8_t *s)
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

struct kblock {
    int sc[8], m[8]; /* 0..63 */
    int q[256];      /* 0..15 (Q4_K) or 0..31 (Q5_K) */
};

static void random_kblock(struct kblock *k, int qmax)
{
    for (int j = 0; j < 8; j++) {
        k->sc[j] = (int)(dray_test_rand() % 64);
        k->m[j] = (int)(dray_test_rand() % 64);
    }
    for (int e = 0; e < 256; e++)
        k->q[e] = (int)(dray_test_rand() % (uint32_t)(qmax + 1));
}

/* Q4_K: d, dmin, scales[12], qs[128]; chunk c: qs[32c+l] = q[64c+l] | q[64c+32+l] << 4 */
static void pack_q4_k(const struct kblock *k, uint16_t d, uint16_t dmin, uint8_t *b)
{
    put16(b, d);
    put16(b + 2, dmin);
    pack_k_scales(k->sc, k->m, b + 4);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b[16 + 32 * c + l] = (uint8_t)(k->q[64 * c + l] | (k->q[64 * c + 32 + l] << 4));
}

static void test_dequant_q4_k_block(void **state)
{
    (void)state;
    uint8_t blk[2 * 144];
    float out[512];
    struct kblock k[2];
    dray_test_seed(44);
    for (int rep = 0; rep < 50; rep++) {
        for (int b = 0; b < 2; b++) {
            random_kblock(&k[b], 15);
            pack_q4_k(&k[b], b ? H_QUART : H_HALF, b ? H_HALF : H_QUART, blk + 144 * b);
        }
        /* by hand, in block 0: sub-block 5 scale 45 = 0b10'1101, min 50 = 0b11'0010,
         * element 5*32+3 code 7 -> 0.5*45*7 - 0.25*50 = 145 */
        if (rep == 0) {
            k[0].sc[5] = 45;
            k[0].m[5] = 50;
            k[0].q[163] = 7;
            pack_q4_k(&k[0], H_HALF, H_QUART, blk);
        }
        assert_int_equal(dray_dequant_row(DRAY_GGML_Q4_K, blk, out, 512), 0);
        for (int b = 0; b < 2; b++) {
            float d = b ? 0.25f : 0.5f, dmin = b ? 0.5f : 0.25f;
            for (int e = 0; e < 256; e++) {
                float want = d * (float)k[b].sc[e / 32] * (float)k[b].q[e] -
                             dmin * (float)k[b].m[e / 32];
                if (out[256 * b + e] != want)
                    print_error("rep %d block %d element %d\n", rep, b, e);
                assert_true(out[256 * b + e] == want);
            }
        }
        if (rep == 0) {
            assert_true(out[163] == 145.0f);
            /* the packed bytes themselves: scale 45 -> byte 9 low nibble 13, byte 1 top bits 2 */
            assert_int_equal(blk[4 + 9] & 15, 13);
            assert_int_equal(blk[4 + 1] >> 6, 2);
        }
    }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]; bit 4 of code 64c+l is bit 2c of qh[l],
 * of code 64c+32+l bit 2c+1. */
static void pack_q5_k(const struct kblock *k, uint16_t d, uint16_t dmin, uint8_t *b)
{
    put16(b, d);
    put16(b + 2, dmin);
    pack_k_scales(k->sc, k->m, b + 4);
    memset(b + 16, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = k->q[64 * c + l], hi = k->q[64 * c + 32 + l];
            b[48 + 32 * c + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            b[16 + l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
}

static void test_dequant_q5_k_block(void **state)
{
    (void)state;
    uint8_t blk[176];
    float out[256];
    struct kblock k;
    dray_test_seed(55);
    for (int rep = 0; rep < 50; rep++) {
        random_kblock(&k, 31);
        if (rep == 0) { /* by hand: element 200 (chunk 3, high half, l = 8) code 31, sc 63, m 1 */
            k.q[200] = 31;
            k.sc[6] = 63;
            k.m[6] = 1;
        }
        pack_q5_k(&k, H_QUART, H_2, blk);
        assert_int_equal(dray_dequant_row(DRAY_GGML_Q5_K, blk, out, 256), 0);
        for (int e = 0; e < 256; e++) {
            float want = 0.25f * (float)k.sc[e / 32] * (float)k.q[e] - 2.0f * (float)k.m[e / 32];
            assert_true(out[e] == want);
        }
        if (rep == 0) {
            assert_true(out[200] == 0.25f * 63 * 31 - 2.0f); /* 486.25 */
            assert_true(out[200] == 486.25f);
            assert_int_equal((blk[16 + 8] >> 7) & 1, 1); /* bit 2*3+1 of qh[8] */
        }
    }
}

/* Q6_K: ql[128], qh[64], int8 scales[16], half d. In half n, for l = 0..31:
 * ql[64n+l] = q[128n+l] & 15 | (q[128n+64+l] & 15) << 4,
 * ql[64n+32+l] = q[128n+32+l] & 15 | (q[128n+96+l] & 15) << 4,
 * qh[32n+l] = the top 2 bits of q[128n+l], +32+l, +64+l, +96+l at bits 0, 2, 4, 6. */
static void pack_q6_k(const int *q, const int *sc, uint16_t d, uint8_t *b)
{
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const int *h = q + 128 * n;
            b[64 * n + l] = (uint8_t)((h[l] & 15) | ((h[64 + l] & 15) << 4));
            b[64 * n + 32 + l] = (uint8_t)((h[32 + l] & 15) | ((h[96 + l] & 15) << 4));
            b[128 + 32 * n + l] = (uint8_t)((h[l] >> 4) | ((h[32 + l] >> 4) << 2) |
                                            ((h[64 + l] >> 4) << 4) | ((h[96 + l] >> 4) << 6));
        }
    for (int s = 0; s < 16; s++)
        b[192 + s] = (uint8_t)(int8_t)sc[s];
    put16(b + 208, d);
}

static void test_dequant_q6_k_block(void **state)
{
    (void)state;
    uint8_t blk[210];
    float out[256];
    int q[256], sc[16];
    dray_test_seed(66);
    for (int rep = 0; rep < 50; rep++) {
        for (int e = 0; e < 256; e++)
            q[e] = (int)(dray_test_rand() % 64);
        for (int s = 0; s < 16; s++)
            sc[s] = (int)(dray_test_rand() % 256) - 128;
        if (rep == 0) { /* by hand: element 200, code 63, scale[12] = -3, d = 0.125 */
            q[200] = 63;
            sc[12] = -3;
        }
        pack_q6_k(q, sc, H_EIGHTH, blk);
        assert_int_equal(dray_dequant_row(DRAY_GGML_Q6_K, blk, out, 256), 0);
        for (int e = 0; e < 256; e++)
            assert_true(out[e] == 0.125f * (float)sc[e / 16] * (float)(q[e] - 32));
        if (rep == 0) {
            assert_true(out[200] == -11.625f); /* 0.125 * -3 * (63 - 32) */
            /* element 200 = half 1, position 72 = third code of l = 8:
             * high nibble of ql[64+8], bits 4-5 of qh[32+8] */
            assert_int_equal(blk[72] >> 4, 15);
            assert_int_equal((blk[128 + 40] >> 4) & 3, 3);
        }
    }
}

/* ------------------------------------------------------------ rows and errors */

static void test_dequant_rejects_partial_blocks_and_unsupported_types(void **state)
{
    (void)state;
    uint8_t blk[256] = {0};
    float out[256];
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q4_0, blk, out, 31), DRAY_EINVAL);
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q6_K, blk, out, 128), DRAY_EINVAL);
    assert_int_equal(dray_dequant_row(10 /* Q2_K */, blk, out, 256), DRAY_ENOTSUP);
    assert_int_equal(dray_dequant_row(4 /* removed id */, blk, out, 32), DRAY_ENOTSUP);
    assert_int_equal(dray_dequant_row(1000, blk, out, 32), DRAY_ENOTSUP);
    assert_int_equal(dray_dequant_row(DRAY_GGML_Q8_0, blk, out, 0), 0);
    uint32_t sup[] = {0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30};
    for (size_t i = 0; i < sizeof(sup) / sizeof(sup[0]); i++)
        assert_true(dray_ggml_type_supported(sup[i]));
    assert_false(dray_ggml_type_supported(9));
    assert_false(dray_ggml_type_supported(24));
    assert_int_equal(dray_ggml_block_bytes(DRAY_GGML_Q6_K), 210);
    assert_int_equal(dray_ggml_block_elems(DRAY_GGML_Q4_K), 256);
    assert_string_equal(dray_ggml_type_name(DRAY_GGML_BF16), "BF16");
}

static void test_dequant_tensor_row_picks_the_right_blocks(void **state)
{
    (void)state;
    /* 3 rows of 64 Q8_0 values (2 blocks per row); block i has d = 1 and all codes i */
    uint8_t data[6 * 34];
    for (int i = 0; i < 6; i++) {
        put16(data + 34 * i, H_1);
        memset(data + 34 * i + 2, i, 32);
    }
    struct dray_gguf_tensor t = {.name = "t", .type = DRAY_GGML_Q8_0, .n_dims = 2,
                                 .ne = {64, 3, 1, 1}, .nbytes = sizeof(data), .data = data};
    float row[64];
    assert_int_equal(dray_gguf_tensor_row_f32(&t, 2, row), 0);
    assert_true(row[0] == 4.0f && row[31] == 4.0f && row[32] == 5.0f && row[63] == 5.0f);
    assert_int_equal(dray_gguf_tensor_row_f32(&t, 3, row), DRAY_EINVAL);
}

/* The lossless 4-bit path (W4A8): for Q4_0, Q4_1 and Q4_K rows with random codes
 * and non-trivial half scales, nib*d + m from the Q4G32 layout (byte i of a group
 * = element i low, element i+16 high) equals the f32 dequantization bit for bit;
 * other types are refused. */
static void test_q4g_rows_equal_the_dequantized_rows(void **state)
{
    (void)state;
    static const uint32_t types[] = {DRAY_GGML_Q4_0, DRAY_GGML_Q4_1, DRAY_GGML_Q4_K};
    uint8_t data[2 * 16 * 20]; /* 2 rows of 512: the largest is Q4_1 (16 blocks of 20 bytes a row) */
    float f[512], dm[2 * 16];
    uint8_t q[256];
    dray_test_seed(7);
    for (int ti = 0; ti < 3; ti++) {
        uint32_t type = types[ti];
        uint32_t be = dray_ggml_block_elems(type), bb = dray_ggml_block_bytes(type);
        uint64_t ne0 = 512, nrow = 2;
        assert_true(nrow * ne0 / be * bb <= sizeof(data));
        for (size_t i = 0; i < sizeof(data); i++)
            data[i] = (uint8_t)dray_test_rand();
        for (uint64_t b = 0; b < nrow * ne0 / be; b++) { /* finite halves: 0x2e00..0x39ff (~0.1..0.7) */
            uint8_t *blk = data + b * bb;
            put16(blk, (uint16_t)(0x2E00 + dray_test_rand() % 0x0C00));
            if (type != DRAY_GGML_Q4_0)
                put16(blk + 2, (uint16_t)(0x2E00 + dray_test_rand() % 0x0C00 + (dray_test_rand() & 1) * 0x8000));
        }
        struct dray_gguf_tensor t = {.name = "t", .type = type, .n_dims = 2, .ne = {ne0, nrow, 1, 1},
                                     .nbytes = nrow * ne0 / be * bb, .data = data};
        for (uint64_t r = 0; r < nrow; r++) {
            assert_int_equal(dray_gguf_tensor_row_f32(&t, r, f), 0);
            assert_int_equal(dray_gguf_tensor_row_q4g(&t, r, q, dm), 0);
            for (uint32_t e = 0; e < ne0; e++) {
                uint32_t g = e / 32, c = e % 32;
                uint8_t b = q[g * 16 + (c & 15)];
                float nib = (float)(c < 16 ? b & 15 : b >> 4);
                float v = nib * dm[2 * g] + dm[2 * g + 1];
                if (v != f[e])
                    print_error("type %u row %llu element %u: %g vs %g\n", type, (unsigned long long)r, e,
                                (double)v, (double)f[e]);
                assert_true(v == f[e]);
            }
        }
    }
    struct dray_gguf_tensor t8 = {.name = "t", .type = DRAY_GGML_Q8_0, .n_dims = 2, .ne = {32, 1, 1, 1},
                                  .nbytes = 34, .data = data};
    assert_int_equal(dray_gguf_tensor_row_q4g(&t8, 0, q, dm), DRAY_ENOTSUP);
}

/* Q8_0 rows read straight as 8-bit groups equal the quantizer's result on their
 * f32 values, bit for bit, for blocks whose largest |code| is 127 (any d sign,
 * subnormal halves, zero blocks); another block is refused, never approximated. */
static void test_q8g_rows_equal_the_quantized_dequantized_rows(void **state)
{
    (void)state;
    enum { NE0 = 256, NROW = 8, G = NE0 / 32 };
    static uint8_t data[NROW * G * 34];
    float f[NE0], want_s[G], s[G];
    int8_t want_q[NE0], q[NE0];
    dray_test_seed(13);
    for (int b = 0; b < NROW * G; b++) {
        uint8_t *blk = data + b * 34;
        uint16_t h = (uint16_t)(dray_test_rand() % 0x7C00) | (uint16_t)((dray_test_rand() & 1) << 15);
        put16(blk, b % 11 == 3 ? 0x0000 : b % 13 == 5 ? (uint16_t)(1 + dray_test_rand() % 0x3FF) : h);
        for (int e = 0; e < 32; e++)
            blk[2 + e] = (uint8_t)(int8_t)((int)(dray_test_rand() % 255) - 127);
        if (b % 7 == 2)
            memset(blk + 2, 0, 32); /* a zero block */
        else
            blk[2 + dray_test_rand() % 32] = (uint8_t)(int8_t)(dray_test_rand() & 1 ? 127 : -127);
    }
    struct dray_gguf_tensor t = {.name = "t", .type = DRAY_GGML_Q8_0, .n_dims = 2, .ne = {NE0, NROW, 1, 1},
                                 .nbytes = sizeof(data), .data = data};
    for (uint64_t r = 0; r < NROW; r++) {
        assert_int_equal(dray_gguf_tensor_row_f32(&t, r, f), 0);
        dray_quantize_rows_q8g(f, 1, NE0, want_q, want_s);
        assert_int_equal(dray_gguf_tensor_row_q8g(&t, r, q, s), 0);
        assert_memory_equal(q, want_q, sizeof(q));
        assert_memory_equal(s, want_s, sizeof(s));
    }
    /* a block whose codes stop at 100: its grid is not the quantizer's */
    for (int e = 0; e < 32; e++)
        data[2 + e] = (uint8_t)(int8_t)(e % 2 ? 100 : -60);
    assert_int_equal(dray_gguf_tensor_row_q8g(&t, 0, q, s), DRAY_ENOTSUP);
    data[2] = (uint8_t)(int8_t)-128; /* -128 is past the symmetric range */
    assert_int_equal(dray_gguf_tensor_row_q8g(&t, 0, q, s), DRAY_ENOTSUP);
    t.type = DRAY_GGML_Q4_0;
    assert_int_equal(dray_gguf_tensor_row_q8g(&t, 0, q, s), DRAY_ENOTSUP);
}

/* Rows of codes and {d, m} pairs as dray_gguf_tensor_row_q4g/_q5g give them,
 * with d and m stored as f16 (format f), read back through backend.h's
 * layout-neutral definition (dray_util_packed_row): the f32 dequantization
 * f [rows][k], bit for bit. */
static void expect_neutral_rows(struct dray_wformat f, uint32_t type, uint32_t rows, uint32_t k,
                                const uint8_t *q, const float *dm, const float *want)
{
    uint32_t G = k / 32;
    uint16_t *d = malloc(rows * G * 2), *m = malloc(rows * G * 2);
    float *row = malloc(k * sizeof(float));
    assert_non_null(d);
    assert_non_null(m);
    assert_non_null(row);
    for (uint32_t i = 0; i < rows * G; i++) {
        d[i] = dray_f32_to_f16(dm[2 * i]);
        m[i] = dray_f32_to_f16(dm[2 * i + 1]);
    }
    for (uint32_t o = 0; o < rows; o++) {
        dray_util_packed_row(f, k, q, d, m, NULL, o, row);
        for (uint32_t c = 0; c < k; c++) {
            if (memcmp(&row[c], &want[o * k + c], 4))
                print_error("type %u row %u element %u: %g vs %g\n", type, o, c, (double)row[c],
                            (double)want[o * k + c]);
            assert_memory_equal(&row[c], &want[o * k + c], 4);
        }
    }
    free(d);
    free(m);
    free(row);
}

/* The f16-scale 4-bit path (W4A8, packed q4 f16 +min): Q4_0 and Q4_1 rows with
 * random codes and half scales (normal and subnormal, Q4_1 mins of either sign)
 * go through dray_gguf_tensor_row_q4g into backend.h's layout-neutral groups,
 * whose code*d + m equals the f32 dequantization bit for bit. Only
 * tensors whose d and m fit f16 qualify: Q4_1, Q4_0 while -8 d does, never Q4_K. */
static void test_q4gh_blocks_equal_the_dequantized_rows(void **state)
{
    (void)state;
    enum { K = 96, ROWS = 32, G = K / 32 };
    static uint8_t data[ROWS * G * 20], q[ROWS * G * 16];
    static float f[ROWS][K], dm[ROWS * G * 2];
    dray_test_seed(12);
    for (int ti = 0; ti < 2; ti++) {
        uint32_t type = ti ? DRAY_GGML_Q4_1 : DRAY_GGML_Q4_0, bb = dray_ggml_block_bytes(type);
        for (size_t i = 0; i < sizeof(data); i++)
            data[i] = (uint8_t)dray_test_rand();
        for (uint32_t b = 0; b < ROWS * G; b++) { /* halves 0x0001..0x59ff: subnormal up to ~190 */
            uint8_t *blk = data + b * bb;
            put16(blk, (uint16_t)(b % 7 == 0 ? 1 + dray_test_rand() % 0x3ff : 0x0400 + dray_test_rand() % 0x5600));
            if (type == DRAY_GGML_Q4_1)
                put16(blk + 2, (uint16_t)(dray_test_rand() % 0x5a00 + (dray_test_rand() & 1) * 0x8000));
        }
        struct dray_gguf_tensor t = {.name = "t", .type = type, .n_dims = 2, .ne = {K, ROWS, 1, 1},
                                     .nbytes = (uint64_t)ROWS * G * bb, .data = data};
        assert_true(dray_gguf_tensor_q4_half(&t));
        for (uint64_t r = 0; r < ROWS; r++) {
            assert_int_equal(dray_gguf_tensor_row_f32(&t, r, f[r]), 0);
            assert_int_equal(dray_gguf_tensor_row_q4g(&t, r, q + r * G * 16, dm + r * G * 2), 0);
        }
        expect_neutral_rows((struct dray_wformat){4, DRAY_WSCALE_F16, 1, 0}, type, ROWS, K, q, dm, f[0]);
    }
    struct dray_gguf_tensor t = {.name = "t", .type = DRAY_GGML_Q4_0, .n_dims = 2, .ne = {64, 1, 1, 1},
                                 .nbytes = 36, .data = data};
    put16(data, 0x3C00);
    put16(data + 18, 0x6FFF); /* 8188: -8 d = -65504, the largest half */
    assert_true(dray_gguf_tensor_q4_half(&t));
    put16(data + 18, 0x7000); /* 8192: -65536 is beyond f16 (in the second block) */
    assert_false(dray_gguf_tensor_q4_half(&t));
    t.type = DRAY_GGML_Q4_K; /* f32 d * scale products */
    assert_false(dray_gguf_tensor_q4_half(&t));
}

/* The lossless 5-bit path (W4A8): Q5_0 and Q5_1 rows with random codes and
 * half scales (normal and subnormal, and Q5_1 mins of either sign) go through
 * dray_gguf_tensor_row_q5g into backend.h's layout-neutral 5-bit groups (the
 * low nibbles, then a word of bit 4s), whose code*d + m equals the f32
 * dequantization bit for bit. Other types are refused, and so is a Q5_0
 * scale whose -16 d leaves f16. */
static void test_q5g_blocks_equal_the_dequantized_rows(void **state)
{
    (void)state;
    enum { K = 96, ROWS = 32, G = K / 32 };
    static uint8_t data[ROWS * G * 24], q[ROWS * G * 20];
    static float f[ROWS][K], dm[ROWS * G * 2];
    dray_test_seed(11);
    for (int ti = 0; ti < 2; ti++) {
        uint32_t type = ti ? DRAY_GGML_Q5_1 : DRAY_GGML_Q5_0, bb = dray_ggml_block_bytes(type);
        for (size_t i = 0; i < sizeof(data); i++)
            data[i] = (uint8_t)dray_test_rand();
        for (uint32_t b = 0; b < ROWS * G; b++) { /* halves 0x0001..0x59ff: subnormal up to ~190 */
            uint8_t *blk = data + b * bb;
            put16(blk, (uint16_t)(b % 7 == 0 ? 1 + dray_test_rand() % 0x3ff : 0x0400 + dray_test_rand() % 0x5600));
            if (type == DRAY_GGML_Q5_1)
                put16(blk + 2, (uint16_t)(dray_test_rand() % 0x5a00 + (dray_test_rand() & 1) * 0x8000));
        }
        struct dray_gguf_tensor t = {.name = "t", .type = type, .n_dims = 2, .ne = {K, ROWS, 1, 1},
                                     .nbytes = (uint64_t)ROWS * G * bb, .data = data};
        for (uint64_t r = 0; r < ROWS; r++) {
            assert_int_equal(dray_gguf_tensor_row_f32(&t, r, f[r]), 0);
            assert_int_equal(dray_gguf_tensor_row_q5g(&t, r, q + r * G * 20, dm + r * G * 2), 0);
        }
        expect_neutral_rows((struct dray_wformat){5, DRAY_WSCALE_F16, 1, 0}, type, ROWS, K, q, dm, f[0]);
    }
    struct dray_gguf_tensor t = {.name = "t", .type = DRAY_GGML_Q5_0, .n_dims = 2, .ne = {32, 1, 1, 1},
                                 .nbytes = 22, .data = data};
    put16(data, 0x6C00); /* 4096: -16 d = -65536 is beyond f16 */
    assert_int_equal(dray_gguf_tensor_row_q5g(&t, 0, q, dm), DRAY_ERANGE);
    put16(data, 0x6BFF); /* 4094: -65504, the largest half */
    assert_int_equal(dray_gguf_tensor_row_q5g(&t, 0, q, dm), 0);
    t.type = DRAY_GGML_Q8_0;
    assert_int_equal(dray_gguf_tensor_row_q5g(&t, 0, q, dm), DRAY_ENOTSUP);
}

/* ------------------------------------------------------------ halves */

static void test_f16_to_f32_matches_the_ieee_formula(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
        float got = dray_f16_to_f32((uint16_t)h);
        if (exp == 31) {
            assert_true(man ? isnan(got) : isinf(got));
            assert_int_equal(!!signbit(got), sign);
            continue;
        }
        double v = exp ? ldexp(1.0 + man / 1024.0, exp - 15) : ldexp(man, -24);
        if (sign)
            v = -v;
        assert_true(got == (float)v);
        assert_int_equal(!!signbit(got), sign); /* -0 stays -0 */
    }
    assert_true(dray_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(dray_f16_to_f32(0x0400) == 0x1p-14f);
    assert_true(dray_f16_to_f32(0x3555) == 0.333251953125f);
}

static uint16_t f2h(float f) { return dray_f32_to_f16(f); }

static void test_f32_to_f16_rounds_to_nearest_even(void **state)
{
    (void)state;
    /* every finite half converts back to itself */
    for (uint32_t h = 0; h < 0x10000; h++)
        if (((h >> 10) & 31) != 31)
            assert_int_equal(f2h(dray_f16_to_f32((uint16_t)h)), h);
    assert_int_equal(f2h(1.0f + 0x1p-11f), 0x3C00);            /* tie -> even (down) */
    assert_int_equal(f2h(1.0f + 3 * 0x1p-11f), 0x3C02);        /* tie -> even (up) */
    assert_int_equal(f2h(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01); /* above the tie */
    assert_int_equal(f2h(65519.0f), 0x7BFF);
    assert_int_equal(f2h(65520.0f), 0x7C00); /* tie between 65504 and 2^16 -> inf */
    assert_int_equal(f2h(-1e6f), 0xFC00);
    assert_int_equal(f2h(INFINITY), 0x7C00);
    assert_int_equal(f2h(0x1p-25f), 0x0000);                   /* tie with 0 -> 0 */
    assert_int_equal(f2h(0x1p-25f + 0x1p-40f), 0x0001);
    assert_int_equal(f2h(3 * 0x1p-25f), 0x0002);               /* 1.5 ulp -> even 2 */
    assert_int_equal(f2h(0x1p-14f - 0x1p-25f), 0x0400);        /* rounds up into normal */
    assert_int_equal(f2h(-0.0f), 0x8000);
    assert_int_equal(f2h(1e-30f), 0x0000);
    uint16_t n = f2h(NAN);
    assert_int_equal(n & 0x7C00, 0x7C00);
    assert_true((n & 0x3FF) != 0);
#ifdef __FLT16_MAX__
    /* the compiler's own conversion as a second opinion over many f32 patterns */
    dray_test_seed(16);
    for (int i = 0; i < 2000000; i++) {
        uint32_t bits = dray_test_rand() ^ (dray_test_rand() << 16);
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f))
            continue;
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        if (f2h(f) != rb)
            print_error("f32 bits 0x%08x: got 0x%04x want 0x%04x\n", bits, f2h(f), rb);
        assert_int_equal(f2h(f), rb);
    }
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_f32_f16_bf16_rows),
        cmocka_unit_test(test_dequant_q8_0_block),
        cmocka_unit_test(test_q4g_rows_equal_the_dequantized_rows),
        cmocka_unit_test(test_q8g_rows_equal_the_quantized_dequantized_rows),
        cmocka_unit_test(test_q4gh_blocks_equal_the_dequantized_rows),
        cmocka_unit_test(test_dequant_q4_0_block),
        cmocka_unit_test(test_dequant_q4_1_block),
        cmocka_unit_test(test_dequant_q5_0_block),
        cmocka_unit_test(test_dequant_q5_1_block),
        cmocka_unit_test(test_dequant_q4_k_block),
        cmocka_unit_test(test_dequant_q5_k_block),
        cmocka_unit_test(test_dequant_q6_k_block),
        cmocka_unit_test(test_dequant_rejects_partial_blocks_and_unsupported_types),
        cmocka_unit_test(test_dequant_tensor_row_picks_the_right_blocks),
        cmocka_unit_test(test_q5g_blocks_equal_the_dequantized_rows),
        cmocka_unit_test(test_f16_to_f32_matches_the_ieee_formula),
        cmocka_unit_test(test_f32_to_f16_rounds_to_nearest_even),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
