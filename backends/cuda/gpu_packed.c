/*
 * gpu_packed.c — packed weights (ABI version 3, two-level formats version 4):
 * weight_create / weight_free and the matmul and embed ops on a handle. The
 * device layout (the host's arrays back to back, two-level sub-scales in
 * GGUF's 12-byte packing) is described in gpu_layout.h; the kernels are
 * kernels/cuda/packed.cu. Contracts: include/dray/backend.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "gpu_layout.h"

#define NAME GPU_PLUGIN_NAME
#define PACKED_MAGIC 0x70636b64u /* "dkcp": a live handle of this plugin */

struct dray_packed {
    uint32_t magic;
    struct dray_wformat format;
    uint32_t n_out, k, uses;
    struct gpu_wlayout lay;
    unsigned char *mem; /* device: codes | sub | d | m (gpu_layout.h) */
};

static void weights_of(const struct dray_packed *w, struct gk_pweights *g)
{
    g->codes = w->mem;
    g->d = w->mem + w->lay.d_off;
    g->m = w->lay.m_bytes ? w->mem + w->lay.m_off : NULL;
    g->sub = w->lay.sub_bytes ? w->mem + w->lay.sub_off : NULL;
    g->bits = w->format.bits;
    g->f16 = w->format.scale == DRAY_WSCALE_F16;
    g->has_min = w->format.has_min;
    g->super = w->format.super;
}

/* Upload the sub section (two levels): packed on the host into a staging copy,
 * freed only once the stream has read it. 0 or a reason on ctx. */
static int upload_sub(struct dray_ctx *ctx, const struct dray_weight_desc *desc, const struct gpu_wlayout *lay,
                      unsigned char *mem)
{
    uint8_t *host = malloc((size_t)lay->sub_bytes);
    if (!host)
        return dray_gpu_fail(ctx, DRAY_ENOMEM, "%s: weight_create: out of host memory", NAME);
    gpu_wlayout_sub(desc, lay, host);
    gpuError_t e = gpuMemcpyAsync(mem + lay->sub_off, host, (size_t)lay->sub_bytes, gpuMemcpyHostToDevice,
                                  ctx->stream);
    gpuError_t s = gpuStreamSynchronize(ctx->stream);
    free(host);
    e = e != gpuSuccess ? e : s;
    return e == gpuSuccess ? 0 : dray_gpu_rt_fail(ctx, e, "weight_create: upload");
}

/* A handle the caller passed: NULL or not one of ours (freed, foreign) is refused. */
static int live_handle(struct dray_ctx *ctx, const struct dray_packed *w, const char *op)
{
    if (!w || w->magic != PACKED_MAGIC)
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: %s: packed is not a live weight handle of this plugin",
                             NAME, op);
    return 0;
}

int dray_gpu_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc, struct dray_packed **out,
                           uint64_t *device_bytes)
{
    ctx->err[0] = '\0';
    if (!out)
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: weight_create: out is NULL", NAME);
    *out = NULL;
    if (device_bytes)
        *device_bytes = 0;
    struct gpu_wlayout lay;
    int rc = gpu_wlayout_plan(desc, GPU_WFORMATS, &lay, ctx->err, sizeof(ctx->err));
    if (rc || (rc = dray_gpu_flush(ctx))) /* a pending capture must not swallow the copies */
        return rc;
    struct dray_packed *w = calloc(1, sizeof(*w));
    if (!w)
        return dray_gpu_fail(ctx, DRAY_ENOMEM, "%s: weight_create: out of host memory", NAME);
    gpuError_t e = gpuMalloc((void **)&w->mem, (size_t)lay.total);
    if (e != gpuSuccess) {
        gpuGetLastError();
        free(w);
        return dray_gpu_fail(ctx, DRAY_ENOMEM, "%s: weight_create: cannot allocate %llu bytes of device memory: %s",
                             NAME, (unsigned long long)lay.total, gpuGetErrorName(e));
    }
    /* pageable sources are staged before each call returns: the host may reuse them */
    e = gpuMemcpyAsync(w->mem, desc->codes, (size_t)lay.codes_bytes, gpuMemcpyHostToDevice, ctx->stream);
    if (e == gpuSuccess)
        e = gpuMemcpyAsync(w->mem + lay.d_off, desc->d, (size_t)lay.d_bytes, gpuMemcpyHostToDevice, ctx->stream);
    if (e == gpuSuccess && lay.m_bytes)
        e = gpuMemcpyAsync(w->mem + lay.m_off, desc->m, (size_t)lay.m_bytes, gpuMemcpyHostToDevice, ctx->stream);
    rc = e != gpuSuccess ? dray_gpu_rt_fail(ctx, e, "weight_create: upload")
         : lay.sub_bytes  ? upload_sub(ctx, desc, &lay, w->mem)
                          : 0;
    if (rc) {
        gpuFree(w->mem);
        free(w);
        return rc;
    }
    w->magic = PACKED_MAGIC;
    w->format = desc->format;
    w->n_out = desc->n_out;
    w->k = desc->k;
    w->uses = desc->uses;
    w->lay = lay;
    *out = w;
    if (device_bytes)
        *device_bytes = lay.total;
    return 0;
}

void dray_gpu_weight_free(struct dray_ctx *ctx, struct dray_packed *w)
{
    if (!w)
        return;
    if (ctx)
        dray_gpu_flush(ctx); /* a pending capture may name the weights */
    w->magic = 0;
    gpuFree(w->mem); /* waits for work still reading it */
    free(w);
}

int dray_gpu_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    struct dray_packed *w = a->packed;
    int rc = live_handle(ctx, w, "matmul");
    if (rc)
        return rc;
    if (!(w->uses & DRAY_WUSE_MATMUL))
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: matmul: the handle was not created for matmul", NAME);
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    rc = dray_gpu_args_ok(ctx,
                          dray_util_check_matmul_packed(a, w->n_out, w->k, GPU_MATMUL_PASSES, &nd, ctx->err,
                                                        sizeof(ctx->err)),
                          &nd, v);
    if (rc)
        return rc;
    struct gk_pmatmul p;
    memset(&p, 0, sizeof(p));
    p.x = v[0];
    p.out = v[1];
    weights_of(w, &p.w);
    p.n_tok = a->n_tok;
    p.n_out = a->n_out;
    p.k = a->k;
    p.stride_x = a->stride_x;
    p.stride_out = a->stride_out;
    p.accumulate = a->accumulate ? 1 : 0;
    p.passes = a->passes == 2 ? 2 : 1;
    if (a->n_tok && (rc = dray_gpu_scratch(ctx, dray_gk_pmatmul_scratch(a->n_tok, a->k, p.passes), &p.scratch)))
        return rc;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    rc = dray_gk_pmatmul(&p, ctx->stream);
    return rc ? dray_gpu_rt_fail(ctx, rc, "matmul (packed)") : 0;
}

int dray_gpu_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    struct dray_packed *w = a->packed;
    int rc = live_handle(ctx, w, "embed");
    if (rc)
        return rc;
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    rc = dray_gpu_args_ok(ctx,
                          dray_util_check_embed_packed(a, w->n_out, w->k, (w->uses & DRAY_WUSE_EMBED) != 0, &nd,
                                                       ctx->err, sizeof(ctx->err)),
                          &nd, v);
    if (!rc)
        rc = dray_gpu_embed_check_ids(ctx, v[0], a->n_tok, a->n_rows);
    if (rc)
        return rc;
    struct gk_pembed p;
    memset(&p, 0, sizeof(p));
    p.ids = v[0];
    p.out = v[1];
    weights_of(w, &p.w);
    p.n_tok = a->n_tok;
    p.dim = a->dim;
    p.n_rows = a->n_rows;
    p.scale = a->scale;
    p.flag = ctx->flag;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    rc = dray_gk_pembed(&p, ctx->stream);
    return rc ? dray_gpu_rt_fail(ctx, rc, "embed (packed)") : 0;
}
