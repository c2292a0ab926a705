/* The template's packed weights (ABI version 3, backend.h "Packed weights"):
 * weight_create / weight_free, and matmul and embed on a handle.
 *
 * The host hands weight_create a matrix of 32-input groups (4-, 5-, 6- or
 * 8-bit codes, a scale d and maybe a min m per group, or per 256 inputs with
 * sub-scales under them, row-major). A plugin copies it
 * into whatever layout its kernels read fastest; the template's "device" is
 * host memory and its kernels are the scalar loops below, so it keeps the
 * arrays as given. Replace weight_create with your packing (and a device
 * allocation and upload), and the two loops with kernel launches; keep the
 * checks. The arithmetic is backend.h's to the letter, through the reference
 * helpers of backend_util.h: activations quantized per group of 32
 * (dray_util_quant_group), exact int32 group sums (dray_util_packed_dot), a
 * row of W in f32 for embed (dray_util_packed_row). */
#include <stdlib.h>
#include <string.h>

#include "template.h"

#if TPL_ABI >= 3

/* ------------------------------------------------------------ weight_create */

/* The formats declared for the uses asked: both masks when a table serves
 * matmul and embed (a tied embedding and output head). */
static uint32_t formats_for(uint32_t uses)
{
    uint32_t f = TPL_WF_EVERY;
    if (uses & DRAY_WUSE_MATMUL)
        f &= TPL_MATMUL_WFORMATS;
    if (uses & DRAY_WUSE_EMBED)
        f &= TPL_EMBED_WFORMATS;
    return f;
}

/* Pack one weight matrix: check the descriptor (backend_util.h: a valid,
 * declared format, k a multiple of 32, the arrays the format needs), then copy
 * codes, d and m into one block of "device" memory. *out is NULL on failure,
 * and last_error says why. */
int dray_tpl_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                           struct dray_packed **out, uint64_t *device_bytes)
{
    if (!ctx)
        return DRAY_EINVAL;
    dray_tpl_begin(ctx);
    if (!out)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "weight_create: out is NULL");
    *out = NULL;
    if (device_bytes)
        *device_bytes = 0;
    /* read uses only if the caller's struct has it; the helper reports a short one */
    int has_uses = desc && desc->size >= offsetof(struct dray_weight_desc, uses) + sizeof(desc->uses);
    TRY(dray_util_check_weight_desc(desc, formats_for(has_uses ? desc->uses : 0), ctx->err,
                                    sizeof(ctx->err)));

    const struct dray_wformat f = desc->format;
    uint64_t groups = (uint64_t)desc->n_out * (desc->k / 32u);
    uint64_t ncodes = groups * dray_util_wformat_group_bytes(f);
    /* d (and m): one per group, or one per 256 inputs with two-level scales,
     * whose sub-scales follow */
    uint64_t nscale = (uint64_t)desc->n_out * dray_util_wformat_scales_per_row(f, desc->k) *
                      dray_util_wformat_scale_bytes(f);
    uint64_t nsub = (uint64_t)desc->n_out * dray_util_wformat_sub_bytes(f, desc->k);
    uint64_t total = ncodes + nscale * (f.has_min ? 2u : 1u) + nsub;
    if (total > SIZE_MAX - 63)
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "weight_create: %u x %u is more than memory can hold",
                             desc->n_out, desc->k);
    struct dray_packed *w = dray_tpl_alloc(sizeof(*w));
    if (!w)
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory for a handle");
    memset(w, 0, sizeof(*w));
    /* On a device: one allocation in device memory and an upload (queued: the
     * host may reuse its arrays once weight_create returns, so copy or stage
     * them before returning). Here: 64-byte aligned host memory, as a buffer. */
    if (posix_memalign(&w->mem, 64, (size_t)total) != 0) {
        dray_tpl_free(w);
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "weight_create: no memory for %llu bytes",
                             (unsigned long long)total);
    }
    unsigned char *p = w->mem;
    memcpy(p, desc->codes, (size_t)ncodes);
    memcpy(p + ncodes, desc->d, (size_t)nscale);
    if (f.has_min)
        memcpy(p + ncodes + nscale, desc->m, (size_t)nscale);
    if (nsub)
        memcpy(p + total - nsub, desc->sub, (size_t)nsub);
    w->magic = TPL_PACKED_MAGIC;
    w->format = f;
    w->n_out = desc->n_out;
    w->k = desc->k;
    w->uses = desc->uses;
    w->codes = p;
    w->d = p + ncodes;
    w->m = f.has_min ? p + ncodes + nscale : NULL;
    w->sub = nsub ? p + total - nsub : NULL;
    w->bytes = total;
    if (device_bytes)
        *device_bytes = total;
    *out = w;
    return 0;
}

/* Release a handle. The host frees it only once no queued op reads it; a
 * device with an asynchronous queue may still defer. NULL is a no-op. */
void dray_tpl_weight_free(struct dray_ctx *ctx, struct dray_packed *w)
{
    (void)ctx;
    if (!w || w->magic != TPL_PACKED_MAGIC)
        return;
    w->magic = 0;
    free(w->mem);
    dray_tpl_free(w);
}

int dray_tpl_packed_of(struct dray_ctx *ctx, const char *op, struct dray_packed *w, uint32_t use)
{
    if (w && w->magic != TPL_PACKED_MAGIC)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: not a live packed weight of this plugin (freed, "
                             "or from another plugin)", op);
    if (w && !(w->uses & use))
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: the packed weight was not created for %s", op, op);
    return 0; /* a NULL handle: the shared checks below say so */
}

/* ------------------------------------------------------------ matmul */

/* out[t][o] (+)= sum over groups g of sx[t][g] * (d * sum(q*code) + m' * sum(q)),
 * x quantized per token and group of 32 (backend.h, matmul, "Packed weights").
 * passes = 2: the residual x - q*sx is quantized the same way and its sum is
 * added too, in that order. */
int dray_tpl_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    struct dray_packed *w = a->packed;
    struct dray_util_needs nd;
    TRY(dray_tpl_packed_of(ctx, "matmul", w, DRAY_WUSE_MATMUL));
    TRY(dray_util_check_matmul_packed(a, w ? w->n_out : 0, w ? w->k : 0, TPL_MATMUL_PASSES, &nd,
                                      ctx->err, sizeof(ctx->err)));
    TRY(dray_util_check_views(&nd, dray_tpl_buf_size, ctx->err, sizeof(ctx->err)));
    const float *x = dray_tpl_at(a->x);
    float *out = dray_tpl_at(a->out);
    uint32_t k = w->k, G = k / 32u, passes = a->passes ? a->passes : 1u;

    /* per token: the codes and scales of each pass (q2, sx2, r for the second) */
    int8_t *q = dray_tpl_alloc((size_t)k * 2);
    float *sx = dray_tpl_alloc((size_t)G * 2 * sizeof(float));
    float *r = passes == 2 ? dray_tpl_alloc((size_t)k * sizeof(float)) : NULL;
    if (!q || !sx || (passes == 2 && !r)) {
        dray_tpl_free(q);
        dray_tpl_free(sx);
        dray_tpl_free(r);
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "matmul: no host memory for %u quantized inputs", k);
    }
    int8_t *q2 = q + k;
    float *sx2 = sx + G;

    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *xr = x + (size_t)t * a->stride_x;
        float *yr = out + (size_t)t * a->stride_out;
        for (uint32_t g = 0; g < G; g++)
            sx[g] = dray_util_quant_group(xr + 32 * g, q + 32 * g);
        if (passes == 2) { /* the residual, quantized by the same rule */
            for (uint32_t c = 0; c < k; c++)
                r[c] = xr[c] - (float)q[c] * sx[c / 32];
            for (uint32_t g = 0; g < G; g++)
                sx2[g] = dray_util_quant_group(r + 32 * g, q2 + 32 * g);
        }
        for (uint32_t o = 0; o < w->n_out; o++) {
            float v = a->accumulate ? yr[o] : 0.0f;
            v += dray_util_packed_dot(w->format, k, w->codes, w->d, w->m, w->sub, o, q, sx);
            if (passes == 2)
                v += dray_util_packed_dot(w->format, k, w->codes, w->d, w->m, w->sub, o, q2, sx2);
            yr[o] = v;
        }
    }
    dray_tpl_free(q);
    dray_tpl_free(sx);
    dray_tpl_free(r);
    return 0;
}

/* ------------------------------------------------------------ embed */

/* out[t][i] = W[ids[t]][i] * scale, W decoded in f32 (code * d + m'). */
int dray_tpl_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    struct dray_packed *w = a->packed;
    struct dray_util_needs nd;
    TRY(dray_tpl_packed_of(ctx, "embed", w, DRAY_WUSE_EMBED));
    TRY(dray_util_check_embed_packed(a, w ? w->n_out : 0, w ? w->k : 0,
                                     w && (w->uses & DRAY_WUSE_EMBED), &nd, ctx->err,
                                     sizeof(ctx->err)));
    TRY(dray_util_check_views(&nd, dray_tpl_buf_size, ctx->err, sizeof(ctx->err)));
    const int32_t *ids = dray_tpl_at(a->ids);
    float *out = dray_tpl_at(a->out);
    TRY(dray_util_check_ids(ids, a->n_tok, a->n_rows, ctx->err, sizeof(ctx->err)));

    for (uint32_t t = 0; t < a->n_tok; t++) {
        float *y = out + (size_t)t * a->dim;
        dray_util_packed_row(w->format, w->k, w->codes, w->d, w->m, w->sub, (uint64_t)ids[t], y);
        for (uint32_t i = 0; i < a->dim; i++)
            y[i] *= a->scale;
    }
    return 0;
}

#endif /* TPL_ABI >= 3 */
