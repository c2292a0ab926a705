/* Packed weights (ABI version 3) in the CPU plugin's own layout: backend.h's
 * layout-neutral groups become the 16-row interleave the SIMD kernels read, so
 * that one 32-bit lane of a vector register is one row (cpu_layout.h). */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_layout.h"
#include "cpu_mem.h"

/* The formats the kernels run. 4 bits: f32 or f16 d and m (Q4G32, Q4G32H); 5
 * bits: f16 (Q5G32); 8 bits: one scale (Q8G32, f16 widened exactly); the
 * three two-level ones at their own size (DRAY_CPU_K4/K5/K6). Without a
 * min, m = -z*d (exact in f32; in f16 checked per group, else f32). The embed
 * gather reads Q8G32 and Q4G32 only: a 4-bit table keeps f32 d and m. */
#define CPU_WF_MATMUL                                                                        \
    (DRAY_UTIL_WF(4, 0, 0) | DRAY_UTIL_WF(4, 0, 1) | DRAY_UTIL_WF(4, 1, 0) | DRAY_UTIL_WF(4, 1, 1) | \
     DRAY_UTIL_WF(5, 1, 0) | DRAY_UTIL_WF(5, 1, 1) | DRAY_UTIL_WF(8, 0, 0) | DRAY_UTIL_WF(8, 1, 0) | \
     DRAY_UTIL_WF_K)
#define CPU_WF_EMBED                                                                         \
    (DRAY_UTIL_WF(4, 0, 0) | DRAY_UTIL_WF(4, 0, 1) | DRAY_UTIL_WF(4, 1, 0) | DRAY_UTIL_WF(4, 1, 1) | \
     DRAY_UTIL_WF(8, 0, 0) | DRAY_UTIL_WF(8, 1, 0))

uint32_t dray_cpu_wformats(int embed)
{
    return embed ? CPU_WF_EMBED : CPU_WF_MATMUL;
}

/* The kernel layout for a format and its uses. */
static uint32_t layout_of(struct dray_wformat f, uint32_t uses, int half_ok)
{
    if (f.super)
        return f.bits == 4 ? DRAY_CPU_K4 : f.bits == 5 ? DRAY_CPU_K5 : DRAY_CPU_K6;
    if (f.bits == 8)
        return DRAY_Q8G32;
    if (f.bits == 5)
        return DRAY_Q5G32;
    return f.scale == DRAY_WSCALE_F16 && half_ok && !(uses & DRAY_WUSE_EMBED) ? DRAY_Q4G32H : DRAY_Q4G32;
}

/* Whether every m' = -z*d (or m) of the weight is an f16 value, so that the
 * 4-bit kernels may read f16 pairs. */
static int half_ok_of(const struct dray_weight_desc *w, uint64_t groups)
{
    for (uint64_t i = 0; w->format.bits != 8 && !w->format.super && i < groups; i++) {
        float d, m;
        dray_util_packed_dm(w->format, w->d, w->m, i, &d, &m);
        if (dray_util_f16_to_f32(dray_util_f32_to_f16(m)) != m)
            return 0;
    }
    return 1;
}

/* The 16 rows of block b: their codes (row-major, zero past n_out) into codes
 * and d and m' of their groups as the interleave's float pairs ({d} for 8 bits). */
static void block_of(const struct dray_weight_desc *w, uint64_t b, uint8_t *codes, float *sc)
{
    uint64_t G = w->k / 32, B = dray_util_wformat_group_bytes(w->format);
    uint64_t per = w->format.bits == 8 ? 1 : 2, r0 = b * 16, n = w->n_out - r0 < 16 ? w->n_out - r0 : 16;
    memcpy(codes, (const uint8_t *)w->codes + r0 * G * B, n * G * B);
    memset(codes + n * G * B, 0, (16 - n) * G * B);
    memset(sc, 0, 16 * G * per * sizeof(float));
    for (uint64_t i = 0; i < n * G; i++) {
        float d, m;
        dray_util_packed_dm(w->format, w->d, w->m, r0 * G + i, &d, &m);
        sc[i * per] = d;
        if (per == 2)
            sc[i * per + 1] = m;
    }
}

/* The blocks of one weight, split over the context's threads. */
struct pack_task {
    const struct dray_weight_desc *w;
    struct dray_packed *p;
    size_t wblock, sblock;
    int failed; /* a thread without scratch memory */
};

static void pack_blocks(void *arg, uint32_t ith, uint32_t nth)
{
    struct pack_task *t = arg;
    const struct dray_weight_desc *w = t->w;
    uint64_t G = w->k / 32, B = dray_util_wformat_group_bytes(w->format), n = t->p->rows / 16;
    uint64_t per = w->format.bits == 8 ? 1 : 2, b0 = n * ith / nth, b1 = n * (ith + 1) / nth;
    if (dray_cpu_is_k(t->p->layout)) {
        dray_cpu_kpack(w, t->p, b0, b1);
        return;
    }
    float *sc = malloc(16 * G * per * sizeof(float));
    uint8_t *codes = malloc(16 * G * B);
    if (!sc || !codes)
        __atomic_store_n(&t->failed, 1, __ATOMIC_RELAXED);
    for (uint64_t b = b0; sc && codes && b < b1; b++) {
        block_of(w, b, codes, sc);
        dray_cpu_interleave(t->p->layout, 16, w->k, codes, sc, (uint8_t *)t->p->w + b * t->wblock,
                            (uint8_t *)t->p->scale + b * t->sblock);
    }
    free(sc);
    free(codes);
}

int dray_cpu_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *w,
                           struct dray_packed **out, uint64_t *device_bytes)
{
    ctx->err[0] = '\0';
    if (!out)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "weight_create: NULL out");
    *out = NULL;
    uint32_t formats = (w && (w->uses & DRAY_WUSE_EMBED) ? CPU_WF_EMBED : CPU_WF_MATMUL) &
                       (w && (w->uses & DRAY_WUSE_MATMUL) ? CPU_WF_MATMUL : CPU_WF_EMBED);
    CHECK(dray_util_check_weight_desc(w, formats, ctx->err, sizeof(ctx->err)));
    /* whole 16-row blocks: the rows past n_out are zero codes, d and m */
    uint32_t rows = (w->n_out + 15u) & ~15u;
    int half_ok = half_ok_of(w, (uint64_t)w->n_out * (w->k / 32));
    uint32_t layout = layout_of(w->format, w->uses, half_ok);
    if (layout == DRAY_Q5G32 && !half_ok)
        return dray_cpu_fail(ctx, DRAY_ENOTSUP, "weight_create: 5-bit groups whose -16*d is not an "
                                                "f16 value (a scale of 4096 or more)");
    struct dray_packed *p = calloc(1, sizeof(*p));
    if (!p)
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory");
    p->layout = layout;
    p->n_out = w->n_out;
    p->rows = rows;
    p->k = w->k;
    p->uses = w->uses;
    size_t wblock = 16 * dray_util_wrow_bytes(p->layout, w->k), sblock = 16 * dray_util_wscale_floats(p->layout, w->k) * 4;
    if (dray_cpu_is_k(layout)) /* per 16 rows: G units of codes, S of scales */
        wblock = w->k / 32 * dray_cpu_k_wbytes(layout), sblock = w->k / 256 * dray_cpu_k_sbytes(layout);
    p->wbytes = (size_t)rows / 16 * wblock;
    p->sbytes = (size_t)rows / 16 * sblock;
    p->w = dray_cpu_big_alloc(p->wbytes);
    p->scale = dray_cpu_big_alloc(p->sbytes);
    if (!p->w || !p->scale) {
        size_t want = p->wbytes + p->sbytes;
        dray_cpu_weight_free(ctx, p);
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "weight_create: out of memory for %zu bytes", want);
    }
    /* block by block (no whole-matrix copy beside the packed one), on every thread */
    struct pack_task task = {.w = w, .p = p, .wblock = wblock, .sblock = sblock};
    dray_cpu_pool_run(ctx->pool, pack_blocks, &task);
    if (task.failed) {
        dray_cpu_weight_free(ctx, p);
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory");
    }
    if (device_bytes)
        *device_bytes = p->wbytes + p->sbytes;
    *out = p;
    return 0;
}

void dray_cpu_weight_free(struct dray_ctx *ctx, struct dray_packed *p)
{
    (void)ctx;
    if (!p)
        return;
    if (!p->borrowed) {
        dray_cpu_big_free(p->w, p->wbytes);
        dray_cpu_big_free(p->scale, p->sbytes);
    }
    free(p);
}

/* Q5G32: the Q4G32 nibble units, then bit 4 of input 4j + e of row r at bit
 * 4r + e of the high unit's 64-bit word j; d and m as f16. */
static void interleave_q5g(uint64_t rows, uint64_t k, const uint8_t *in, const float *sc, uint8_t *out,
                           uint16_t *so)
{
    const uint64_t G = k / 32;
    for (uint64_t b = 0; b < rows / 16; b++)
        for (uint64_t g = 0; g < G; g++) {
            uint8_t *unit = out + (b * G + g) * 5 * 64, *hi = unit + 4 * 64;
            memset(hi, 0, 64);
            for (uint64_t r = 0; r < 16; r++) {
                const uint8_t *src = in + ((b * 16 + r) * G + g) * 20;
                uint32_t h;
                memcpy(&h, src + 16, 4);
                for (uint64_t i = 0; i < 4; i++)
                    memcpy(unit + i * 64 + r * 4, src + 4 * i, 4);
                for (uint32_t c = 0; c < 32; c++) {
                    uint32_t bit = (uint32_t)r * 4 + c % 4;
                    hi[(c / 4) * 8 + bit / 8] |= (uint8_t)(((h >> c) & 1u) << (bit % 8));
                }
                for (uint64_t j = 0; j < 2; j++)
                    so[((b * G + g) * 2 + j) * 16 + r] = dray_util_f32_to_f16(sc[((b * 16 + r) * G + g) * 2 + j]);
            }
        }
}

void dray_cpu_interleave(uint32_t layout, uint64_t rows, uint64_t k, const void *q, const float *sc,
                         void *qo, void *so)
{
    if (layout == DRAY_Q5G32) {
        interleave_q5g(rows, k, q, sc, qo, so);
        return;
    }
    const int q4 = layout == DRAY_Q4G32 || layout == DRAY_Q4G32H, half = layout == DRAY_Q4G32H;
    const uint64_t G = k / 32, per = q4 ? 2 : 1;
    const uint64_t gbytes = q4 ? 16 : 32; /* bytes of one group of one row */
    const uint8_t *in = q;
    uint8_t *out = qo;
    for (uint64_t b = 0; b < rows / 16; b++)
        for (uint64_t g = 0; g < G; g++) {
            /* the 16 rows' groups g become gbytes/4 units of 16 rows x 4 bytes: in
             * both layouts, unit i byte 4r+e is byte 4i+e of row r's group */
            uint8_t *unit = out + (b * G + g) * 16 * gbytes;
            for (uint64_t r = 0; r < 16; r++) {
                const uint8_t *src = in + ((b * 16 + r) * G + g) * gbytes;
                for (uint64_t i = 0; i < gbytes / 4; i++)
                    memcpy(unit + i * 64 + r * 4, src + 4 * i, 4);
                for (uint64_t j = 0; j < per; j++) {
                    uint64_t at = ((b * G + g) * per + j) * 16 + r;
                    float v = sc[((b * 16 + r) * G + g) * per + j];
                    if (half) /* Q4G32H: f16 pairs, as Q5G32's */
                        ((uint16_t *)so)[at] = dray_util_f32_to_f16(v);
                    else
                        ((float *)so)[at] = v;
                }
            }
        }
}
