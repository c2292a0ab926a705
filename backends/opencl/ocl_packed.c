/*
 * Packed weights (ABI version 3; two-level scales, version 4):
 * weight_create/weight_free, and matmul and embed on a handle. The device
 * layout is packed.cl's (see its head comment): row-major groups in planes,
 * codes | high bits | sub-scales | d | m, so that the lanes of a work-group
 * reading one row load neighbouring 16-byte chunks. One level, it holds
 * exactly the host's bytes (codes + d + m, d and m in their own type), so a
 * decode reads as many weight bytes as the CPU plugin does; two levels, GGUF's
 * bytes per 256 weights (Q4_K 144, Q5_K 176, Q6_K 210): the (s, n) pairs
 * packed to 6 bits as the file has them.
 */
#include <stdio.h>
#include <string.h>

#include "ocl.h"

/* Groups per staging round when splitting 5- and 6-bit groups (1.5 MiB of
 * host memory); super-blocks per round when packing sub-scales (1 MiB). */
#define SPLIT_CHUNK 65536u
#define SUB_CHUNK 65536u

static int write_at(struct dray_ctx *ctx, cl_mem mem, cl_ulong off, const void *src, size_t n)
{
    /* blocking: the caller may reuse the host arrays once weight_create returns */
    cl_int rc = clEnqueueWriteBuffer(ctx->queue, mem, CL_TRUE, off, n, src, 0, NULL, NULL);
    if (rc != CL_SUCCESS)
        return dray_ocl_fail_cl(ctx, rc, "weight_create: clEnqueueWriteBuffer");
    return 0;
}

/* 5 and 6 bits: each host group is 16 nibble bytes then hb = 4 or 8 bytes of
 * little-endian high bits; split them into the lo plane (byte 0) and the hi
 * plane (off_hi). The high bits go over as they are: every OpenCL device we
 * know is little-endian. */
static int upload_split(struct dray_ctx *ctx, const struct dray_packed *h, const uint8_t *codes,
                        uint64_t n, uint32_t hb)
{
    uint64_t chunk = n < SPLIT_CHUNK ? n : SPLIT_CHUNK;
    uint8_t *st = dray_ocl_alloc((size_t)chunk * (16 + hb));
    if (!st)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory for staging");
    int rc = 0;
    for (uint64_t g0 = 0; rc == 0 && g0 < n; g0 += chunk) {
        uint64_t m = n - g0 < chunk ? n - g0 : chunk;
        uint8_t *lo = st, *hi = st + m * 16;
        for (uint64_t i = 0; i < m; i++) {
            memcpy(lo + i * 16, codes + (g0 + i) * (16 + hb), 16);
            memcpy(hi + i * hb, codes + (g0 + i) * (16 + hb) + 16, hb);
        }
        rc = write_at(ctx, h->mem, g0 * 16, lo, (size_t)m * 16);
        if (rc == 0)
            rc = write_at(ctx, h->mem, h->off_hi + g0 * hb, hi, (size_t)m * hb);
    }
    dray_ocl_free(st);
    return rc;
}

/* One super-block's 8 (s, n) pairs of 6 bits into GGUF's 12 bytes (the
 * inverse of packed.cl's pk_sn): groups 0..3 in the low 6 bits of q[j] and
 * q[j+4], groups 4..7 as a nibble of q[j+8] each and their top 2 bits above
 * groups 0..3's. */
static void pack_sn(const uint8_t sn[16], uint8_t q[12])
{
    for (int j = 0; j < 4; j++) {
        uint8_t s4 = sn[2 * (j + 4)], n4 = sn[2 * (j + 4) + 1];
        q[j] = (uint8_t)(sn[2 * j] | (s4 >> 4) << 6);
        q[j + 4] = (uint8_t)(sn[2 * j + 1] | (n4 >> 4) << 6);
        q[j + 8] = (uint8_t)((s4 & 15) | (n4 & 15) << 4);
    }
}

/* Two levels, 4/5 bits: the host's [n_out][G][2] bytes of sub-scales packed
 * 16 to 12 per super-block into the sub plane, nsb super-blocks in all. */
static int upload_sn(struct dray_ctx *ctx, const struct dray_packed *h, const uint8_t *sub,
                     uint64_t nsb)
{
    uint64_t chunk = nsb < SUB_CHUNK ? nsb : SUB_CHUNK;
    uint8_t *st = dray_ocl_alloc((size_t)chunk * 12);
    if (!st)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory for staging");
    int rc = 0;
    for (uint64_t s0 = 0; rc == 0 && s0 < nsb; s0 += chunk) {
        uint64_t m = nsb - s0 < chunk ? nsb - s0 : chunk;
        for (uint64_t i = 0; i < m; i++)
            pack_sn(sub + (s0 + i) * 16, st + i * 12);
        rc = write_at(ctx, h->mem, h->off_sub + s0 * 12, st, (size_t)m * 12);
    }
    dray_ocl_free(st);
    return rc;
}

/* The planes' offsets and the total for format f of n_out x k (packed.cl). */
static void plan_handle(struct dray_packed *h, const struct dray_weight_desc *w)
{
    struct dray_wformat f = w->format;
    uint64_t n = (uint64_t)w->n_out * (w->k / 32), nsb = (uint64_t)w->n_out * (w->k / 256);
    uint64_t ns = (uint64_t)w->n_out * dray_util_wformat_scales_per_row(f, w->k) *
                  dray_util_wformat_scale_bytes(f);
    uint64_t lo = n * (f.bits == 8 ? 32u : 16u);
    uint64_t hi = n * (dray_util_wformat_group_bytes(f) - (f.bits == 8 ? 32u : 16u));
    uint64_t sub = f.super ? nsb * (f.bits == 6 ? 16u : 12u) : 0;
    h->off_hi = lo;
    h->off_sub = lo + hi;
    h->off_d = h->off_sub + sub;
    h->off_m = h->off_d + ns;
    h->bytes = h->off_m + (f.has_min ? ns : 0);
}

/* Copy the host's arrays into the planes: codes (split at 5 and 6 bits),
 * sub-scales (packed to 6 bits at 4 and 5), d, m. */
static int upload_handle(struct dray_ctx *ctx, const struct dray_packed *h,
                         const struct dray_weight_desc *w)
{
    struct dray_wformat f = w->format;
    uint64_t n = (uint64_t)w->n_out * (w->k / 32), nsb = (uint64_t)w->n_out * (w->k / 256);
    if (f.bits == 5 || f.bits == 6)
        CHECK(upload_split(ctx, h, w->codes, n, dray_util_wformat_group_bytes(f) - 16));
    else
        CHECK(write_at(ctx, h->mem, 0, w->codes, (size_t)h->off_hi));
    if (f.super && f.bits == 6)
        CHECK(write_at(ctx, h->mem, h->off_sub, w->sub, (size_t)(h->off_d - h->off_sub)));
    else if (f.super)
        CHECK(upload_sn(ctx, h, w->sub, nsb));
    CHECK(write_at(ctx, h->mem, h->off_d, w->d, (size_t)(h->off_m - h->off_d)));
    if (f.has_min)
        CHECK(write_at(ctx, h->mem, h->off_m, w->m, (size_t)(h->bytes - h->off_m)));
    return 0;
}

static int fill_handle(struct dray_ctx *ctx, struct dray_packed *h,
                       const struct dray_weight_desc *w)
{
    h->magic = DRAY_OCL_PACKED_MAGIC;
    h->owner = ctx;
    h->f = w->format;
    h->n_out = w->n_out;
    h->k = w->k;
    h->uses = w->uses;
    plan_handle(h, w);
    if (h->bytes > ctx->max_alloc)
        return dray_ocl_fail(ctx, DRAY_ENOMEM,
                             "weight_create: %u x %u needs %llu bytes, more than the device's "
                             "largest buffer of %zu (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                             w->n_out, w->k, (unsigned long long)h->bytes, ctx->max_alloc);
    cl_int rc;
    h->mem = clCreateBuffer(ctx->cl, CL_MEM_READ_ONLY, (size_t)h->bytes, NULL, &rc);
    if (rc != CL_SUCCESS) {
        h->mem = NULL;
        return dray_ocl_fail_cl(ctx, rc, "weight_create: clCreateBuffer");
    }
    return upload_handle(ctx, h, w);
}

int dray_ocl_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                           struct dray_packed **out, uint64_t *device_bytes)
{
    ctx->err[0] = '\0';
    if (!out)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "weight_create: NULL out");
    *out = NULL;
    /* the same formats for both uses: the ANDed mask is the same */
    CHECK(dray_util_check_weight_desc(desc, DRAY_OCL_WFORMATS, ctx->err, sizeof(ctx->err)));
    struct dray_packed *h = dray_ocl_alloc(sizeof(*h));
    if (!h)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory");
    memset(h, 0, sizeof(*h));
    int rc = fill_handle(ctx, h, desc);
    if (rc != 0) {
        dray_ocl_weight_free(ctx, h);
        return rc;
    }
    if (device_bytes)
        *device_bytes = h->bytes;
    *out = h;
    return 0;
}

void dray_ocl_weight_free(struct dray_ctx *ctx, struct dray_packed *w)
{
    (void)ctx;
    if (!w)
        return;
    if (w->mem) /* the runtime keeps it alive until queued kernels using it finish */
        clReleaseMemObject(w->mem);
    w->magic = 0;
    dray_ocl_free(w);
}

/* The handle of an op, checked to be one of this context's (best effort: a
 * freed one has magic 0 until its memory is reused). NULL passes: the shared
 * validators name that. */
static int live_handle(struct dray_ctx *ctx, const char *op, const struct dray_packed *h)
{
    if (h && (h->magic != DRAY_OCL_PACKED_MAGIC || h->owner != ctx))
        return dray_ocl_fail(ctx, DRAY_EINVAL, "%s: not a live packed handle of this context", op);
    return 0;
}

/* The handle as kernel arguments: its buffer and planes, then the format
 * (bits, f16, has_min, z, super). */
static void handle_args(struct dray_ocl_args *k, const struct dray_packed *h)
{
    cl_uint bits = h->f.bits, f16 = h->f.scale == DRAY_WSCALE_F16, has_min = h->f.has_min;
    cl_uint super = h->f.super;
    cl_int z = dray_util_wformat_z(h->f);
    dray_ocl_arg(k, sizeof(cl_mem), &h->mem);
    DRAY_OCL_ARG(k, h->off_hi);
    DRAY_OCL_ARG(k, h->off_sub);
    DRAY_OCL_ARG(k, h->off_d);
    DRAY_OCL_ARG(k, h->off_m);
    DRAY_OCL_ARG(k, bits);
    DRAY_OCL_ARG(k, f16);
    DRAY_OCL_ARG(k, has_min);
    DRAY_OCL_ARG(k, z);
    DRAY_OCL_ARG(k, super);
}

/* Matmul passes declared in op_caps: one and two. */
#define OCL_PASSES 3u

int dray_ocl_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    const struct dray_packed *h = a->packed;
    struct dray_util_needs nd;
    CHECK(live_handle(ctx, "matmul", h));
    CHECK(dray_util_check_matmul_packed(a, h ? h->n_out : 0, h ? h->k : 0, OCL_PASSES, &nd,
                                        ctx->err, sizeof(ctx->err)));
    CHECK(dray_util_check_views(&nd, dray_ocl_buf_size, ctx->err, sizeof(ctx->err)));
    if (!(h->uses & DRAY_WUSE_MATMUL))
        return dray_ocl_fail(ctx, DRAY_EINVAL,
                             "matmul: the handle was created without DRAY_WUSE_MATMUL");
    if (a->n_tok == 0)
        return 0;
    cl_uint passes = a->passes ? a->passes : 1u, G = a->k / 32;
    size_t rows = (size_t)a->n_tok * passes;
    CHECK(dray_ocl_scratch(ctx, &ctx->q8, &ctx->q8_size, rows * a->k,
                           "matmul: activation scratch"));
    CHECK(dray_ocl_scratch(ctx, &ctx->sx, &ctx->sx_size, rows * G * 8, "matmul: scale scratch"));

    struct dray_ocl_args q = {.k = ctx->k[OCL_K_pk_quantize]};
    dray_ocl_arg_view(&q, a->x, 4);
    DRAY_OCL_ARG(&q, a->stride_x);
    DRAY_OCL_ARG(&q, a->k);
    DRAY_OCL_ARG(&q, a->n_tok);
    DRAY_OCL_ARG(&q, passes);
    DRAY_OCL_ARG(&q, ctx->q8);
    DRAY_OCL_ARG(&q, ctx->sx);
    size_t gq[2] = {G, a->n_tok};
    CHECK(dray_ocl_launch(ctx, "matmul: quantize", &q, 2, gq, NULL));

    /* lanes per row: the smallest power of two >= G, at most a whole work-group,
     * so short rows (small k) share a work-group instead of idling its items */
    cl_uint lanes_log2 = 0;
    while (lanes_log2 < 6 && (1u << lanes_log2) < G)
        lanes_log2++;
    size_t per_wg = DRAY_OCL_WG >> lanes_log2;
    struct dray_ocl_args k = {.k = ctx->k[OCL_K_pk_matmul]};
    handle_args(&k, h);
    DRAY_OCL_ARG(&k, ctx->q8);
    DRAY_OCL_ARG(&k, ctx->sx);
    DRAY_OCL_ARG(&k, passes);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->stride_out);
    DRAY_OCL_ARG(&k, a->n_tok);
    DRAY_OCL_ARG(&k, a->n_out);
    DRAY_OCL_ARG(&k, a->k);
    DRAY_OCL_ARG(&k, lanes_log2);
    DRAY_OCL_ARG(&k, a->accumulate);
    size_t g = (a->n_out + per_wg - 1) / per_wg * DRAY_OCL_WG, l = DRAY_OCL_WG;
    return dray_ocl_launch(ctx, "matmul", &k, 1, &g, &l);
}

int dray_ocl_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    const struct dray_packed *h = a->packed;
    struct dray_util_needs nd;
    CHECK(live_handle(ctx, "embed", h));
    CHECK(dray_util_check_embed_packed(a, h ? h->n_out : 0, h ? h->k : 0,
                                       h ? (h->uses & DRAY_WUSE_EMBED) != 0 : 0, &nd, ctx->err,
                                       sizeof(ctx->err)));
    CHECK(dray_util_check_views(&nd, dray_ocl_buf_size, ctx->err, sizeof(ctx->err)));
    if (a->n_tok == 0)
        return 0;
    CHECK(dray_ocl_check_ids(ctx, a));

    struct dray_ocl_args k = {.k = ctx->k[OCL_K_pk_embed]};
    dray_ocl_arg_view(&k, a->ids, 4);
    handle_args(&k, h);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->dim);
    DRAY_OCL_ARG(&k, a->n_tok);
    DRAY_OCL_ARG(&k, a->scale);
    size_t g[2] = {a->dim, a->n_tok};
    return dray_ocl_launch(ctx, "embed", &k, 2, g, NULL);
}
