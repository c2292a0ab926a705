/* Dequantization of the supported ggml block formats to f32 (the type table is
 * ggml_types.c). Block layouts: docs/reference/gemma3-gguf.md §4.
 * All multi-byte fields are little-endian and blocks are packed, so fields are read
 * through memcpy (a Q8_0 block is 34 bytes: its halves are not 2-aligned in a row). */
#include <math.h>
#include <string.h>

#include "dray/backend_util.h"
#include "error.h"
#include "gguf.h"

/* ------------------------------------------------------------ half floats */

/* One implementation of f16 in the tree: the plugin helper's (dray/backend_util.h),
 * which the plugins and the conformance kit use too. */
float dray_f16_to_f32(uint16_t h)
{
    return dray_util_f16_to_f32(h);
}

uint16_t dray_f32_to_f16(float f)
{
    return dray_util_f32_to_f16(f);
}

/* ------------------------------------------------------------ block readers */

static float rd_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return dray_f16_to_f32(h);
}

/* 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K/Q5_K:
 * bytes 0-3 low 6 bits = scales 0-3, bytes 4-7 low 6 bits = mins 0-3; scales/mins
 * 4-7 take their low nibble from bytes 8-11 and top 2 bits from bytes 0-3 / 4-7. */
static void k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q8_0: half d, int8 qs[32]; y = q * d. */
static void deq_q8_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    for (int e = 0; e < 32; e++)
        y[e] = (float)(int8_t)b[2 + e] * d;
}

/* Q4_0: half d, qs[16]; low nibbles = elements 0-15, high = 16-31; y = (q - 8) * d. */
static void deq_q4_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

/* Q4_1: half d, half m, qs[16]; y = q * d + m. */
static void deq_q4_1(const uint8_t *b, float *y)
{
    float d = rd_half(b), m = rd_half(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b[4 + j] & 0xF) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

/* 5-bit codes of a Q5_0/Q5_1 block: low nibbles from qs, bit 4 from the uint32 qh
 * (bit j for element j, bit j+16 for element j+16). */
static void q5_codes(const uint8_t *qh4, const uint8_t *qs, int *q)
{
    uint32_t h;
    memcpy(&h, qh4, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) | (int)(((h >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
    }
}

/* Q5_0: half d, qh[4], qs[16]; y = (q - 16) * d. */
static void deq_q5_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    int q[32];
    q5_codes(b + 2, b + 6, q);
    for (int e = 0; e < 32; e++)
        y[e] = (float)(q[e] - 16) * d;
}

/* Q5_1: half d, half m, qh[4], qs[16]; y = q * d + m. */
static void deq_q5_1(const uint8_t *b, float *y)
{
    float d = rd_half(b), m = rd_half(b + 2);
    int q[32];
    q5_codes(b + 4, b + 8, q);
    for (int e = 0; e < 32; e++)
        y[e] = (float)q[e] * d + m;
}

/* Q4_K: half d, half dmin, scales[12], qs[128]. Chunk c (64 elements) uses bytes
 * qs[32c..32c+31]: low nibbles -> sub-block 2c, high nibbles -> sub-block 2c+1;
 * y = d * sc * q - dmin * m. */
static void deq_q4_k(const uint8_t *b, float *y)
{
    float d = rd_half(b), dmin = rd_half(b + 2);
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        uint8_t s0, m0, s1, m1;
        k_scale_min(sc, 2 * c, &s0, &m0);
        k_scale_min(sc, 2 * c + 1, &s1, &m1);
        float d0 = d * s0, o0 = dmin * m0, d1 = d * s1, o1 = dmin * m1;
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d0 * (float)(qs[32 * c + l] & 0xF) - o0;
            y[64 * c + 32 + l] = d1 * (float)(qs[32 * c + l] >> 4) - o1;
        }
    }
}

/* Q5_K: half d, half dmin, scales[12], qh[32], qs[128]. As Q4_K, plus bit 4 of
 * each code from qh[l]: bit 2c for the low nibble, bit 2c+1 for the high one. */
static void deq_q5_k(const uint8_t *b, float *y)
{
    float d = rd_half(b), dmin = rd_half(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++) {
        uint8_t s0, m0, s1, m1;
        k_scale_min(sc, 2 * c, &s0, &m0);
        k_scale_min(sc, 2 * c + 1, &s1, &m1);
        float d0 = d * s0, o0 = dmin * m0, d1 = d * s1, o1 = dmin * m1;
        for (int l = 0; l < 32; l++) {
            int lo = (qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
            int hi = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            y[64 * c + l] = d0 * (float)lo - o0;
            y[64 * c + 32 + l] = d1 * (float)hi - o1;
        }
    }
}

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], half d.
 * Half n (128 elements) uses ql + 64n, qh + 32n; for l in 0..31 the four codes
 * land at elements l, 32+l, 64+l, 96+l of the half; y = d * scales[e/16] * (q - 32). */
static void deq_q6_k(const uint8_t *b, float *y)
{
    float d = rd_half(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        float *yh = y + 128 * n;
        for (int l = 0; l < 32; l++) {
            int q[4] = {
                (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            };
            for (int k = 0; k < 4; k++) {
                int e = 32 * k + l; /* element within the half */
                yh[e] = d * (float)sc[(128 * n + e) / 16] * (float)(q[k] - 32);
            }
        }
    }
}

/* ------------------------------------------------------------ rows */

static void deq_scalar(uint32_t type, const uint8_t *src, float *dst, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (type == DRAY_GGML_F32) {
            memcpy(&dst[i], src + 4 * i, 4);
        } else if (type == DRAY_GGML_F16) {
            dst[i] = rd_half(src + 2 * i);
        } else { /* BF16: the top half of an f32 */
            uint16_t h;
            uint32_t bits;
            memcpy(&h, src + 2 * i, 2);
            bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
    }
}

int dray_dequant_row(uint32_t type, const void *src, float *dst, uint64_t n)
{
    void (*fn)(const uint8_t *, float *) = NULL;
    if (!dray_ggml_type_supported(type))
        return DRAY_ENOTSUP;
    if (n % dray_ggml_block_elems(type))
        return DRAY_EINVAL;
    switch (type) {
    case DRAY_GGML_F32: case DRAY_GGML_F16: case DRAY_GGML_BF16:
        deq_scalar(type, src, dst, n);
        return 0;
    case DRAY_GGML_Q8_0: fn = deq_q8_0; break;
    case DRAY_GGML_Q4_0: fn = deq_q4_0; break;
    case DRAY_GGML_Q4_1: fn = deq_q4_1; break;
    case DRAY_GGML_Q5_0: fn = deq_q5_0; break;
    case DRAY_GGML_Q5_1: fn = deq_q5_1; break;
    case DRAY_GGML_Q4_K: fn = deq_q4_k; break;
    case DRAY_GGML_Q5_K: fn = deq_q5_k; break;
    case DRAY_GGML_Q6_K: fn = deq_q6_k; break;
    default: return DRAY_ENOTSUP;
    }
    const uint8_t *b = src;
    uint32_t be = dray_ggml_block_elems(type), bb = dray_ggml_block_bytes(type);
    for (uint64_t i = 0; i < n / be; i++)
        fn(b + i * bb, dst + i * be);
    return 0;
}

int dray_gguf_tensor_row_f32(const struct dray_gguf_tensor *t, uint64_t r, float *dst)
{
    uint32_t be = dray_ggml_block_elems(t->type);
    if (!dray_ggml_type_supported(t->type))
        return DRAY_ENOTSUP;
    if (t->ne[0] == 0 || r >= dray_gguf_tensor_nelems(t) / t->ne[0])
        return DRAY_EINVAL;
    /* Row stride = blocks per row * block bytes; the reader checked the whole
     * tensor (rows * stride) lies inside the file. */
    uint64_t stride = t->ne[0] / be * dray_ggml_block_bytes(t->type);
    return dray_dequant_row(t->type, (const uint8_t *)t->data + r * stride, dst, t->ne[0]);
}

/* ------------------------------------------------------------ 8-bit groups */

int dray_gguf_tensor_row_q8g(const struct dray_gguf_tensor *t, uint64_t r, int8_t *q, float *scale)
{
    if (t->type != DRAY_GGML_Q8_0 || t->ne[0] == 0 || t->ne[0] % 32 || r >= dray_gguf_tensor_nelems(t) / t->ne[0])
        return DRAY_ENOTSUP;
    const uint8_t *b = (const uint8_t *)t->data + r * (t->ne[0] / 32) * 34;
    for (uint64_t g = 0; g < t->ne[0] / 32; g++, b += 34) {
        float d = rd_half(b);
        int8_t hi = 0, lo = 0; /* branch-free, so that the compiler vectorizes it */
        for (int e = 0; e < 32; e++) {
            int8_t v = (int8_t)b[2 + e];
            hi = v > hi ? v : hi;
            lo = v < lo ? v : lo;
        }
        int amax = -lo > hi ? -lo : hi;
        if (amax == 0 || d == 0.0f) { /* max|w| = 0: scale 0, codes 0 */
            scale[g] = 0.0f;
            memset(q + g * 32, 0, 32);
            continue;
        }
        /* 127 |d| and q d are exact in f32 (11 + 7 bits), so the rule's scale
         * is |d| and its codes are +-q; any other block takes the f32 road */
        if (amax != 127 || !(fabsf(d) < INFINITY))
            return DRAY_ENOTSUP;
        scale[g] = fabsf(d);
        if (d < 0) /* codes -127..127: negating stays in range */
            for (int e = 0; e < 32; e++)
                q[g * 32 + e] = (int8_t)-(int8_t)b[2 + e];
        else
            memcpy(q + g * 32, b + 2, 32);
    }
    return 0;
}

/* ------------------------------------------------------------ 4-bit groups */

/* Pack 32 codes (0..15) the way backend.h's Q4G32 holds a group: byte i has
 * element i in its low nibble and element i+16 in its high one. */
static void pack_group(const uint8_t *code, uint8_t *out)
{
    for (int i = 0; i < 16; i++)
        out[i] = (uint8_t)(code[i] | code[i + 16] << 4);
}

int dray_gguf_tensor_row_q5g(const struct dray_gguf_tensor *t, uint64_t r, uint8_t *q, float *dm)
{
    if (!dray_ggml_is_5bit(t->type))
        return DRAY_ENOTSUP;
    if (t->ne[0] == 0 || r >= dray_gguf_tensor_nelems(t) / t->ne[0])
        return DRAY_EINVAL;
    uint32_t bb = dray_ggml_block_bytes(t->type);
    const uint8_t *row = (const uint8_t *)t->data + r * (t->ne[0] / 32 * bb);
    for (uint64_t i = 0; i < t->ne[0] / 32; i++) {
        /* Q5_0: d, qh[4], qs[16]; Q5_1: d, m, qh[4], qs[16]. qs already has Q4G32's
         * nibble order and qh's bit i is input i's bit 4 (q5_codes) */
        const uint8_t *b = row + i * bb, *qh = b + (t->type == DRAY_GGML_Q5_0 ? 2 : 4);
        float d = rd_half(b);
        if (t->type == DRAY_GGML_Q5_0 && !(fabsf(d) < 4096.0f)) /* -16 d would leave f16 */
            return DRAY_ERANGE;
        memcpy(q + i * 20, qh + 4, 16);
        memcpy(q + i * 20 + 16, qh, 4);
        dm[2 * i] = d;
        dm[2 * i + 1] = t->type == DRAY_GGML_Q5_0 ? -16.0f * d : rd_half(b + 2);
    }
    return 0;
}

bool dray_gguf_tensor_q4_half(const struct dray_gguf_tensor *t)
{
    if (t->type == DRAY_GGML_Q4_1)
        return true; /* d and m are f16 in the file */
    if (t->type != DRAY_GGML_Q4_0 || t->ne[0] % 32)
        return false;
    /* Q4_0's m = -8 d leaves f16 for |d| > 8188 */
    uint64_t blocks = dray_gguf_tensor_nelems(t) / 32;
    for (uint64_t i = 0; i < blocks; i++) {
        float m = -8.0f * rd_half((const uint8_t *)t->data + i * 18);
        if (m == m && dray_f16_to_f32(dray_f32_to_f16(m)) != m)
            return false;
    }
    return true;
}

int dray_gguf_tensor_row_q4g(const struct dray_gguf_tensor *t, uint64_t r, uint8_t *q, float *dm)
{
    uint32_t be = dray_ggml_block_elems(t->type), bb = dray_ggml_block_bytes(t->type);
    if (!dray_ggml_is_4bit(t->type))
        return DRAY_ENOTSUP;
    if (t->ne[0] == 0 || r >= dray_gguf_tensor_nelems(t) / t->ne[0])
        return DRAY_EINVAL;
    const uint8_t *row = (const uint8_t *)t->data + r * (t->ne[0] / be * bb);
    uint8_t code[32];
    for (uint64_t i = 0; i < t->ne[0] / be; i++) {
        const uint8_t *b = row + i * bb;
        if (t->type == DRAY_GGML_Q4_0 || t->type == DRAY_GGML_Q4_1) {
            /* the same nibble order as Q4G32: y = q*d - 8d, or q*d + m */
            float d = rd_half(b);
            memcpy(q + i * 16, b + (t->type == DRAY_GGML_Q4_0 ? 2 : 4), 16);
            dm[2 * i] = d;
            dm[2 * i + 1] = t->type == DRAY_GGML_Q4_0 ? -8.0f * d : rd_half(b + 2);
            continue;
        }
        /* Q4_K: sub-block 2c = low nibbles of qs[32c..], 2c+1 = high nibbles; the
         * f32 products d*sc and dmin*m are the ones deq_q4_k forms */
        float d = rd_half(b), dmin = rd_half(b + 2);
        const uint8_t *sc = b + 4, *qs = b + 16;
        for (int j = 0; j < 8; j++) {
            uint8_t s, m;
            k_scale_min(sc, j, &s, &m);
            int c = j / 2, hi = j % 2;
            for (int l = 0; l < 32; l++)
                code[l] = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
            uint64_t g = i * 8 + (uint64_t)j;
            pack_group(code, q + g * 16);
            dm[2 * g] = d * (float)s;
            dm[2 * g + 1] = -(dmin * (float)m);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ two-level groups */

/* Q4_K / Q5_K block b into 8 groups (codes of B bytes each) and their (s, n):
 * chunk c's low nibbles are group 2c, its high nibbles group 2c+1. */
static void k45_block(const uint8_t *b, bool five, uint8_t *codes, uint8_t *sub)
{
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    uint32_t B = five ? 20 : 16;
    uint8_t code[32];
    for (int j = 0; j < 8; j++) {
        int c = j / 2, hi = j % 2;
        k_scale_min(sc, j, &sub[2 * j], &sub[2 * j + 1]);
        for (int l = 0; l < 32; l++)
            code[l] = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
        pack_group(code, codes + j * B);
        if (five) { /* bit 4 of input l is qh[l] bit j */
            uint32_t h = 0;
            for (int l = 0; l < 32; l++)
                h |= (uint32_t)((qh[l] >> j) & 1) << l;
            memcpy(codes + j * B + 16, &h, 4);
        }
    }
}

/* Q6_K block into 8 groups of 24 bytes and its 16 int8 scales, in input order
 * (deq_q6_k's element map). */
static void k6_block(const uint8_t *b, uint8_t *codes, uint8_t *sub)
{
    uint8_t code[256];
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        for (int l = 0; l < 32; l++) {
            code[128 * n + l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            code[128 * n + 32 + l] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            code[128 * n + 64 + l] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            code[128 * n + 96 + l] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
    for (int g = 0; g < 8; g++) {
        uint8_t *out = codes + g * 24, lo[32];
        uint64_t h = 0;
        for (int l = 0; l < 32; l++) {
            lo[l] = code[32 * g + l] & 0xF;
            h |= (uint64_t)(code[32 * g + l] >> 4) << (2 * l);
        }
        pack_group(lo, out);
        memcpy(out + 16, &h, 8);
    }
    memcpy(sub, b + 192, 16);
}

int dray_gguf_tensor_row_k(const struct dray_gguf_tensor *t, uint64_t r, uint8_t *codes, uint8_t *sub,
                           uint16_t *D, uint16_t *M)
{
    if (t->type != DRAY_GGML_Q4_K && t->type != DRAY_GGML_Q5_K && t->type != DRAY_GGML_Q6_K)
        return DRAY_ENOTSUP;
    if (t->ne[0] == 0 || r >= dray_gguf_tensor_nelems(t) / t->ne[0])
        return DRAY_EINVAL;
    uint32_t bb = dray_ggml_block_bytes(t->type);
    const uint8_t *row = (const uint8_t *)t->data + r * (t->ne[0] / 256 * bb);
    bool six = t->type == DRAY_GGML_Q6_K, five = t->type == DRAY_GGML_Q5_K;
    uint32_t B = six ? 24 : five ? 20 : 16;
    for (uint64_t i = 0; i < t->ne[0] / 256; i++) {
        const uint8_t *b = row + i * bb;
        if (six) {
            k6_block(b, codes + i * 8 * B, sub + i * 16);
            memcpy(&D[i], b + 208, 2);
        } else {
            k45_block(b, five, codes + i * 8 * B, sub + i * 16);
            memcpy(&D[i], b, 2);
            memcpy(&M[i], b + 2, 2);
        }
    }
    return 0;
}
