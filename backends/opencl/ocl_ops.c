/*
 * The operators of the OpenCL plugin: check every argument against the contract
 * in backend.h (shapes, strides, dtypes, views inside their buffers), then set
 * the kernel's arguments and enqueue it. Kernels live in kernels/opencl; each
 * op's comment there gives its grid.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl.h"

/* ---------------------------------------------------------------- embed */

/* Ids are read back (n_tok ints, a small blocking read) so an id >= n_rows is an
 * error (DRAY_EINVAL) as the contract says, not an out-of-bounds read. */
int dray_ocl_check_ids(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    int32_t stack[256];
    int32_t *ids = a->n_tok <= 256 ? stack : malloc((size_t)a->n_tok * sizeof(*ids));
    if (!ids)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "embed: out of host memory for %u ids", a->n_tok);
    int rc = dray_ocl_download(ctx, ids, a->ids, (size_t)a->n_tok * 4);
    if (rc == 0)
        rc = dray_util_check_ids(ids, a->n_tok, a->n_rows, ctx->err, sizeof(ctx->err));
    if (ids != stack)
        free(ids);
    return rc;
}

int dray_ocl_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    ctx->err[0] = '\0';
    if (a->dtype == DRAY_PACKED)
        return dray_ocl_embed_packed(ctx, a);
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_embed, a, &nd);
    int i8 = a->dtype == DRAY_I8;
    size_t es = i8 ? 1 : 4;
    if (a->n_tok == 0 || a->dim == 0)
        return 0;
    CHECK(dray_ocl_check_ids(ctx, a));

    struct dray_ocl_args k = {.k = ctx->k[i8 ? OCL_K_embed_i8 : OCL_K_embed_f32]};
    dray_ocl_arg_view(&k, a->ids, 4);
    dray_ocl_arg_view(&k, a->table, es);
    if (i8)
        dray_ocl_arg_view(&k, a->row_scale, 4);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->dim);
    DRAY_OCL_ARG(&k, a->n_tok);
    DRAY_OCL_ARG(&k, a->scale);
    size_t g[2] = {a->dim, a->n_tok};
    return dray_ocl_launch(ctx, "embed", &k, 2, g, NULL);
}

/* ---------------------------------------------------------------- rmsnorm */

int dray_ocl_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a)
{
    ctx->err[0] = '\0';
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_rmsnorm, a, &nd);
    struct dray_ocl_args k = {.k = ctx->k[OCL_K_rmsnorm]};
    dray_ocl_arg_view(&k, a->x, 4);
    dray_ocl_arg_view(&k, a->w, 4);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->n_head);
    DRAY_OCL_ARG(&k, a->n);
    DRAY_OCL_ARG(&k, a->stride_x);
    DRAY_OCL_ARG(&k, a->stride_out);
    DRAY_OCL_ARG(&k, a->eps);
    size_t g[2] = {DRAY_OCL_WG, (size_t)a->n_tok * a->n_head};
    size_t l[2] = {DRAY_OCL_WG, 1};
    if (a->n == 0)
        return 0;
    return dray_ocl_launch(ctx, "rmsnorm", &k, 2, g, l);
}

/* ---------------------------------------------------------------- matmul */

/* Outlier channels index x on the device, so check them here: strictly
 * increasing and below k (n_outlier ints, a small blocking read). */
static int check_outliers(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    int32_t *idx = malloc((size_t)a->n_outlier * sizeof(*idx));
    if (!idx)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "matmul: out of host memory");
    int rc = dray_ocl_download(ctx, idx, a->outlier_idx, (size_t)a->n_outlier * 4);
    if (rc == 0)
        rc = dray_util_check_outliers(idx, a->n_outlier, a->k, ctx->err, sizeof(ctx->err));
    free(idx);
    return rc;
}

static int matmul_check(struct dray_ctx *ctx, const struct dray_matmul_args *a, int i8)
{
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_matmul, a, &nd);
    if (!i8 || a->n_outlier == 0)
        return 0;
    return check_outliers(ctx, a);
}

static int matmul_f32(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    struct dray_ocl_args k = {.k = ctx->k[OCL_K_mm_f32]};
    dray_ocl_arg_view(&k, a->x, 4);
    DRAY_OCL_ARG(&k, a->stride_x);
    dray_ocl_arg_view(&k, a->w, 4);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->stride_out);
    DRAY_OCL_ARG(&k, a->n_tok);
    DRAY_OCL_ARG(&k, a->n_out);
    DRAY_OCL_ARG(&k, a->k);
    DRAY_OCL_ARG(&k, a->accumulate);
    size_t g[2] = {a->n_out, a->n_tok};
    return dray_ocl_launch(ctx, "matmul", &k, 2, g, NULL);
}

static int matmul_i8(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    CHECK(dray_ocl_scratch(ctx, &ctx->q8, &ctx->q8_size, (size_t)a->n_tok * a->k,
                           "matmul: activation scratch"));
    CHECK(dray_ocl_scratch(ctx, &ctx->sx, &ctx->sx_size, (size_t)a->n_tok * 4,
                           "matmul: scale scratch"));
    /* without outliers the idx/ow arguments still need valid buffers */
    struct dray_view idx = a->n_outlier ? a->outlier_idx : a->x;
    struct dray_view ow = a->n_outlier ? a->outlier_w : a->x;
    if (!a->n_outlier)
        idx.offset = ow.offset = 0;

    struct dray_ocl_args q = {.k = ctx->k[OCL_K_mm_quantize]};
    dray_ocl_arg_view(&q, a->x, 4);
    DRAY_OCL_ARG(&q, a->stride_x);
    DRAY_OCL_ARG(&q, a->k);
    dray_ocl_arg_view(&q, idx, 4);
    DRAY_OCL_ARG(&q, a->n_outlier);
    DRAY_OCL_ARG(&q, ctx->q8);
    DRAY_OCL_ARG(&q, ctx->sx);
    size_t gq[2] = {DRAY_OCL_WG, a->n_tok}, lq[2] = {DRAY_OCL_WG, 1};
    CHECK(dray_ocl_launch(ctx, "matmul: quantize", &q, 2, gq, lq));

    struct dray_ocl_args k = {.k = ctx->k[OCL_K_mm_i8]};
    DRAY_OCL_ARG(&k, ctx->q8);
    DRAY_OCL_ARG(&k, ctx->sx);
    dray_ocl_arg_view(&k, a->w, 1);
    dray_ocl_arg_view(&k, a->wscale, 4);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->stride_out);
    dray_ocl_arg_view(&k, a->x, 4);
    DRAY_OCL_ARG(&k, a->stride_x);
    dray_ocl_arg_view(&k, idx, 4);
    dray_ocl_arg_view(&k, ow, 4);
    DRAY_OCL_ARG(&k, a->n_outlier);
    DRAY_OCL_ARG(&k, a->n_tok);
    DRAY_OCL_ARG(&k, a->n_out);
    DRAY_OCL_ARG(&k, a->k);
    DRAY_OCL_ARG(&k, a->accumulate);
    size_t g[2] = {a->n_out, (a->n_tok + DRAY_OCL_MM_TT - 1) / DRAY_OCL_MM_TT};
    return dray_ocl_launch(ctx, "matmul", &k, 2, g, NULL);
}

int dray_ocl_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    ctx->err[0] = '\0';
    if (a->wdtype == DRAY_PACKED)
        return dray_ocl_matmul_packed(ctx, a);
    int i8 = a->wdtype == DRAY_I8;
    CHECK(matmul_check(ctx, a, i8));
    if (a->n_tok == 0 || a->n_out == 0)
        return 0;
    return i8 ? matmul_i8(ctx, a) : matmul_f32(ctx, a);
}

/* ---------------------------------------------------------------- rope */

/* Devices without fp64: frequencies as (hi, lo) float pairs, made in double here. */
static int rope_table(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    if (ctx->rope_tab && ctx->rope_n_rot == a->n_rot && ctx->rope_base == a->base &&
        ctx->rope_freq_scale == a->freq_scale)
        return 0;
    uint32_t half = a->n_rot / 2;
    float *tab = malloc((size_t)(half ? half : 1) * 2 * sizeof(float));
    if (!tab)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "rope: out of host memory");
    for (uint32_t i = 0; i < half; i++) {
        double f = (double)a->freq_scale * pow((double)a->base, -2.0 * i / a->n_rot);
        tab[2 * i] = (float)f;
        tab[2 * i + 1] = (float)(f - (double)tab[2 * i]);
    }
    if (ctx->rope_tab)
        clReleaseMemObject(ctx->rope_tab);
    cl_int rc;
    ctx->rope_tab = clCreateBuffer(ctx->cl, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                   (size_t)(half ? half : 1) * 2 * sizeof(float), tab, &rc);
    free(tab);
    if (rc != CL_SUCCESS) {
        ctx->rope_tab = NULL;
        return dray_ocl_fail_cl(ctx, rc, "rope: frequency table");
    }
    ctx->rope_n_rot = a->n_rot;
    ctx->rope_base = a->base;
    ctx->rope_freq_scale = a->freq_scale;
    return 0;
}

int dray_ocl_rope(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    ctx->err[0] = '\0';
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_rope, a, &nd);
    if (a->n_tok == 0 || a->n_rot == 0 || a->n_head == 0)
        return 0;
    int fp64 = ctx->fp64;
    if (!fp64)
        CHECK(rope_table(ctx, a));
    cl_mem tab = fp64 ? a->pos.buf->mem : ctx->rope_tab; /* unused with fp64 */
    /* v4: the factors' view, or any valid buffer (never read) with has_ff 0 */
    cl_uint has_ff = a->freq_factors.buf != NULL;
    struct dray_view ff = has_ff ? a->freq_factors : (struct dray_view){a->pos.buf, 0};
    float mscale = dray_util_rope_mscale(a);

    struct dray_ocl_args k = {.k = ctx->k[OCL_K_rope]};
    dray_ocl_arg_view(&k, a->x, 4);
    dray_ocl_arg_view(&k, a->pos, 4);
    DRAY_OCL_ARG(&k, tab);
    DRAY_OCL_ARG(&k, a->n_head);
    DRAY_OCL_ARG(&k, a->head_dim);
    DRAY_OCL_ARG(&k, a->n_rot);
    DRAY_OCL_ARG(&k, a->stride);
    DRAY_OCL_ARG(&k, a->n_tok);
    DRAY_OCL_ARG(&k, a->base);
    DRAY_OCL_ARG(&k, a->freq_scale);
    dray_ocl_arg_view(&k, ff, 4);
    DRAY_OCL_ARG(&k, has_ff);
    DRAY_OCL_ARG(&k, mscale);
    size_t g[3] = {a->n_rot / 2, a->n_head, a->n_tok};
    return dray_ocl_launch(ctx, "rope", &k, 3, g, NULL);
}

/* ---------------------------------------------------------------- KV pool */

/* Beyond the contract: the kernels index rows of the pool in 32-bit ints. */
static int check_pool(struct dray_ctx *ctx, const char *op, const struct dray_kv_pool *p)
{
    if (p->n_slots > INT32_MAX / p->n_kv_head)
        return dray_ocl_fail(ctx, DRAY_ERANGE, "%s: %u slots is too many", op, p->n_slots);
    return 0;
}

int dray_ocl_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    ctx->err[0] = '\0';
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_kv_store, a, &nd);
    const struct dray_kv_pool *p = a->pool;
    CHECK(check_pool(ctx, "kv_store", p));
    int i8 = p->dtype == DRAY_I8;
    size_t es = i8 ? 1 : 2;

    struct dray_ocl_args k = {.k = ctx->k[i8 ? OCL_K_kv_store_i8 : OCL_K_kv_store_f16]};
    dray_ocl_arg_view(&k, a->k, 4);
    DRAY_OCL_ARG(&k, a->stride_k);
    dray_ocl_arg_view(&k, a->v, 4);
    DRAY_OCL_ARG(&k, a->stride_v);
    dray_ocl_arg_view(&k, a->slots, 4);
    dray_ocl_arg_view(&k, p->k, es);
    dray_ocl_arg_view(&k, p->v, es);
    if (i8) {
        dray_ocl_arg_view(&k, p->k_scale, 4);
        dray_ocl_arg_view(&k, p->v_scale, 4);
    }
    DRAY_OCL_ARG(&k, p->n_kv_head);
    DRAY_OCL_ARG(&k, p->head_dim);
    DRAY_OCL_ARG(&k, p->n_slots);
    if (i8) { /* one work-item per row, see kv.cl */
        DRAY_OCL_ARG(&k, a->n_tok);
        size_t g[2] = {(size_t)p->n_kv_head * 2, a->n_tok}, l[2] = {1, 1};
        return dray_ocl_launch(ctx, "kv_store", &k, 2, g, l);
    }
    size_t g[3] = {DRAY_OCL_WG, p->n_kv_head, a->n_tok}, l[3] = {DRAY_OCL_WG, 1, 1};
    return dray_ocl_launch(ctx, "kv_store", &k, 3, g, l);
}

/* ---------------------------------------------------------------- attention */

static int attention_check(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_attention, a, &nd);
    const struct dray_kv_pool *p = a->pool;
    CHECK(check_pool(ctx, "attention", p));
    /* the table's length is not passed: the kernel bounds its reads by the buffer */
    if (p->head_dim > DRAY_OCL_HD_MAX)
        return dray_ocl_fail(ctx, DRAY_ENOTSUP, "attention: head_dim %u > %u", p->head_dim,
                             DRAY_OCL_HD_MAX);
    return 0;
}

int dray_ocl_attention(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    ctx->err[0] = '\0';
    CHECK(attention_check(ctx, a));
    const struct dray_kv_pool *p = a->pool;
    if (a->n_tok == 0 || a->n_seq == 0)
        return 0;
    int i8 = p->dtype == DRAY_I8;
    size_t es = i8 ? 1 : 2;
    cl_ulong bt_len = (a->block_table.buf->size - a->block_table.offset) / 4;
    cl_uint is_i8 = (cl_uint)i8;
    /* F16 pools have no scales; pass any valid buffer (never read) */
    struct dray_view ks = i8 ? p->k_scale : p->k, vs = i8 ? p->v_scale : p->v;
    if (!i8)
        ks.offset = vs.offset = 0;

    struct dray_ocl_args k = {.k = ctx->k[OCL_K_attention]};
    dray_ocl_arg_view(&k, a->q, 4);
    DRAY_OCL_ARG(&k, a->stride_q);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->stride_out);
    dray_ocl_arg_view(&k, a->seqs, 4);
    DRAY_OCL_ARG(&k, a->n_seq);
    dray_ocl_arg_view(&k, a->block_table, 4);
    DRAY_OCL_ARG(&k, bt_len);
    dray_ocl_arg_view(&k, p->k, es);
    dray_ocl_arg_view(&k, p->v, es);
    dray_ocl_arg_view(&k, ks, 4);
    dray_ocl_arg_view(&k, vs, 4);
    DRAY_OCL_ARG(&k, is_i8);
    DRAY_OCL_ARG(&k, a->n_head);
    DRAY_OCL_ARG(&k, p->n_kv_head);
    DRAY_OCL_ARG(&k, p->head_dim);
    DRAY_OCL_ARG(&k, p->block_size);
    DRAY_OCL_ARG(&k, p->n_slots);
    DRAY_OCL_ARG(&k, a->window);
    DRAY_OCL_ARG(&k, a->scale);
    DRAY_OCL_ARG(&k, a->softcap); /* v4; 0 = none */
    size_t g[3] = {DRAY_OCL_WG, a->n_tok, a->n_head}, l[3] = {DRAY_OCL_WG, 1, 1};
    return dray_ocl_launch(ctx, "attention", &k, 3, g, l);
}

/* ---------------------------------------------------------------- eltwise */

int dray_ocl_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a)
{
    ctx->err[0] = '\0';
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_gated_act, a, &nd);
    struct dray_ocl_args k = {.k = ctx->k[OCL_K_gated_act]};
    dray_ocl_arg_view(&k, a->gate, 4);
    dray_ocl_arg_view(&k, a->up, 4);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, a->n);
    DRAY_OCL_ARG(&k, a->n_tok);
    DRAY_OCL_ARG(&k, a->stride_gate);
    DRAY_OCL_ARG(&k, a->stride_up);
    DRAY_OCL_ARG(&k, a->stride_out);
    DRAY_OCL_ARG(&k, a->act);
    size_t g[2] = {a->n, a->n_tok};
    return dray_ocl_launch(ctx, "gated_act", &k, 2, g, NULL);
}

int dray_ocl_add(struct dray_ctx *ctx, const struct dray_add_args *a)
{
    ctx->err[0] = '\0';
    struct dray_util_needs nd;
    DRAY_OCL_CHECK_ARGS(ctx, dray_util_check_add, a, &nd);
    struct dray_ocl_args k = {.k = ctx->k[OCL_K_add_f32]};
    cl_ulong n = a->n;
    dray_ocl_arg_view(&k, a->a, 4);
    dray_ocl_arg_view(&k, a->b, 4);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, n);
    size_t g = a->n < (1u << 22) ? (size_t)a->n : (1u << 22);
    return dray_ocl_launch(ctx, "add", &k, 1, &g, NULL);
}
