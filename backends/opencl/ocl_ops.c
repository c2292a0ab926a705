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

/* Bytes spanned by n rows of `used` elements, `stride` elements apart. */
static size_t rows_bytes(uint32_t n, uint32_t stride, size_t used, size_t elem)
{
    return n ? (((size_t)n - 1) * stride + used) * elem : 0;
}

/* Do two byte ranges of views overlap? */
static int overlaps(struct dray_view a, size_t na, struct dray_view b, size_t nb)
{
    return a.buf == b.buf && na && nb && a.offset < b.offset + nb && b.offset < a.offset + na;
}

#define CHECK(call)             \
    do {                        \
        int rc_ = (call);       \
        if (rc_ != 0)           \
            return rc_;         \
    } while (0)

/* ---------------------------------------------------------------- embed */

/* Ids are read back (n_tok ints, a small blocking read) so an id >= n_rows is an
 * error (DRAY_EINVAL) as the contract says, not an out-of-bounds read. */
static int check_ids(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    int32_t stack[256];
    int32_t *ids = a->n_tok <= 256 ? stack : malloc((size_t)a->n_tok * sizeof(*ids));
    if (!ids)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "embed: out of host memory for %u ids", a->n_tok);
    int rc = dray_ocl_download(ctx, ids, a->ids, (size_t)a->n_tok * 4);
    for (uint32_t t = 0; rc == 0 && t < a->n_tok; t++)
        if (ids[t] < 0 || (uint32_t)ids[t] >= a->n_rows)
            rc = dray_ocl_fail(ctx, DRAY_EINVAL, "embed: ids[%u] = %d is outside [0, %u)", t,
                               ids[t], a->n_rows);
    if (ids != stack)
        free(ids);
    return rc;
}

int dray_ocl_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    ctx->err[0] = '\0';
    if (a->dtype != DRAY_I8 && a->dtype != DRAY_F32)
        return dray_ocl_fail(ctx, DRAY_ENOTSUP, "embed: table dtype %u (I8 or F32 expected)",
                             a->dtype);
    int i8 = a->dtype == DRAY_I8;
    size_t es = i8 ? 1 : 4;
    CHECK(dray_ocl_check_view(ctx, "embed", "ids", a->ids, (size_t)a->n_tok * 4, 4));
    CHECK(dray_ocl_check_view(ctx, "embed", "table", a->table, (size_t)a->n_rows * a->dim * es, es));
    if (i8)
        CHECK(dray_ocl_check_view(ctx, "embed", "row_scale", a->row_scale, (size_t)a->n_rows * 4, 4));
    CHECK(dray_ocl_check_view(ctx, "embed", "out", a->out, (size_t)a->n_tok * a->dim * 4, 4));
    if (a->n_tok == 0 || a->dim == 0)
        return 0;
    CHECK(check_ids(ctx, a));

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
    size_t row = (size_t)a->n_head * a->n;
    if (a->stride_x < row || a->stride_out < row)
        return dray_ocl_fail(ctx, DRAY_EINVAL,
                             "rmsnorm: strides %u/%u are below n_head*n = %zu", a->stride_x,
                             a->stride_out, row);
    CHECK(dray_ocl_check_view(ctx, "rmsnorm", "x", a->x, rows_bytes(a->n_tok, a->stride_x, row, 4), 4));
    CHECK(dray_ocl_check_view(ctx, "rmsnorm", "w", a->w, (size_t)a->n * 4, 4));
    CHECK(dray_ocl_check_view(ctx, "rmsnorm", "out", a->out,
                              rows_bytes(a->n_tok, a->stride_out, row, 4), 4));
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
    for (uint32_t j = 0; rc == 0 && j < a->n_outlier; j++)
        if (idx[j] < 0 || (uint32_t)idx[j] >= a->k || (j > 0 && idx[j] <= idx[j - 1]))
            rc = dray_ocl_fail(ctx, DRAY_EINVAL,
                               "matmul: outlier_idx[%u] = %d: channels must be strictly "
                               "increasing and below k = %u",
                               j, idx[j], a->k);
    free(idx);
    return rc;
}

static int matmul_check(struct dray_ctx *ctx, const struct dray_matmul_args *a, int i8)
{
    size_t es = i8 ? 1 : 4;
    size_t xb = rows_bytes(a->n_tok, a->stride_x, a->k, 4);
    size_t ob = rows_bytes(a->n_tok, a->stride_out, a->n_out, 4);
    if (a->stride_x < a->k || a->stride_out < a->n_out)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "matmul: stride_x %u < k %u or stride_out %u < n_out %u",
                             a->stride_x, a->k, a->stride_out, a->n_out);
    if (i8 && a->k > 65536)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "matmul: k = %u exceeds 65536 (int32 sums)", a->k);
    CHECK(dray_ocl_check_view(ctx, "matmul", "x", a->x, xb, 4));
    CHECK(dray_ocl_check_view(ctx, "matmul", "w", a->w, (size_t)a->n_out * a->k * es, es));
    CHECK(dray_ocl_check_view(ctx, "matmul", "out", a->out, ob, 4));
    if (overlaps(a->x, xb, a->out, ob))
        return dray_ocl_fail(ctx, DRAY_EINVAL, "matmul: out overlaps x");
    if (!i8)
        return 0;
    CHECK(dray_ocl_check_view(ctx, "matmul", "wscale", a->wscale, (size_t)a->n_out * 4, 4));
    if (a->n_outlier == 0)
        return 0;
    CHECK(dray_ocl_check_view(ctx, "matmul", "outlier_idx", a->outlier_idx, (size_t)a->n_outlier * 4, 4));
    CHECK(dray_ocl_check_view(ctx, "matmul", "outlier_w", a->outlier_w,
                              (size_t)a->n_out * a->n_outlier * 4, 4));
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
    if (a->wdtype != DRAY_I8 && a->wdtype != DRAY_F32)
        return dray_ocl_fail(ctx, DRAY_ENOTSUP, "matmul: weight dtype %u (I8 or F32 expected)",
                             a->wdtype);
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
    size_t row = (size_t)a->n_head * a->head_dim;
    if (a->n_rot % 2 != 0 || a->n_rot > a->head_dim)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "rope: n_rot %u must be even and <= head_dim %u",
                             a->n_rot, a->head_dim);
    if (a->stride < row)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "rope: stride %u < n_head*head_dim %zu", a->stride, row);
    CHECK(dray_ocl_check_view(ctx, "rope", "x", a->x, rows_bytes(a->n_tok, a->stride, row, 4), 4));
    CHECK(dray_ocl_check_view(ctx, "rope", "pos", a->pos, (size_t)a->n_tok * 4, 4));
    if (a->n_tok == 0 || a->n_rot == 0 || a->n_head == 0)
        return 0;
    int fp64 = ctx->fp64;
    if (!fp64)
        CHECK(rope_table(ctx, a));
    cl_mem tab = fp64 ? a->pos.buf->mem : ctx->rope_tab; /* unused with fp64 */

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
    size_t g[3] = {a->n_rot / 2, a->n_head, a->n_tok};
    return dray_ocl_launch(ctx, "rope", &k, 3, g, NULL);
}

/* ---------------------------------------------------------------- KV pool */

static int check_pool(struct dray_ctx *ctx, const char *op, const struct dray_kv_pool *p)
{
    if (!p)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "%s: NULL pool", op);
    if (p->dtype != DRAY_I8 && p->dtype != DRAY_F16)
        return dray_ocl_fail(ctx, DRAY_ENOTSUP, "%s: cache dtype %u (I8 or F16 expected)", op,
                             p->dtype);
    if (p->n_kv_head == 0 || p->head_dim == 0 || p->block_size == 0)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "%s: pool with n_kv_head %u, head_dim %u, block_size %u",
                             op, p->n_kv_head, p->head_dim, p->block_size);
    if (p->n_slots % p->block_size != 0)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "%s: n_slots %u is not a multiple of block_size %u",
                             op, p->n_slots, p->block_size);
    if (p->n_slots > INT32_MAX / p->n_kv_head)
        return dray_ocl_fail(ctx, DRAY_ERANGE, "%s: %u slots is too many", op, p->n_slots);
    size_t es = p->dtype == DRAY_I8 ? 1 : 2;
    size_t rows = (size_t)p->n_slots * p->n_kv_head;
    CHECK(dray_ocl_check_view(ctx, op, "pool.k", p->k, rows * p->head_dim * es, es));
    CHECK(dray_ocl_check_view(ctx, op, "pool.v", p->v, rows * p->head_dim * es, es));
    if (p->dtype == DRAY_I8) {
        CHECK(dray_ocl_check_view(ctx, op, "pool.k_scale", p->k_scale, rows * 4, 4));
        CHECK(dray_ocl_check_view(ctx, op, "pool.v_scale", p->v_scale, rows * 4, 4));
    }
    return 0;
}

int dray_ocl_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    ctx->err[0] = '\0';
    const struct dray_kv_pool *p = a->pool;
    CHECK(check_pool(ctx, "kv_store", p));
    size_t row = (size_t)p->n_kv_head * p->head_dim;
    if (a->stride_k < row || a->stride_v < row)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "kv_store: strides %u/%u < n_kv_head*head_dim %zu",
                             a->stride_k, a->stride_v, row);
    CHECK(dray_ocl_check_view(ctx, "kv_store", "k", a->k, rows_bytes(a->n_tok, a->stride_k, row, 4), 4));
    CHECK(dray_ocl_check_view(ctx, "kv_store", "v", a->v, rows_bytes(a->n_tok, a->stride_v, row, 4), 4));
    CHECK(dray_ocl_check_view(ctx, "kv_store", "slots", a->slots, (size_t)a->n_tok * 4, 4));
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
    const struct dray_kv_pool *p = a->pool;
    CHECK(check_pool(ctx, "attention", p));
    if (a->n_head == 0 || a->n_head % p->n_kv_head != 0)
        return dray_ocl_fail(ctx, DRAY_EINVAL,
                             "attention: n_head %u is not a positive multiple of n_kv_head %u",
                             a->n_head, p->n_kv_head);
    if (p->head_dim > DRAY_OCL_HD_MAX)
        return dray_ocl_fail(ctx, DRAY_ENOTSUP, "attention: head_dim %u > %u", p->head_dim,
                             DRAY_OCL_HD_MAX);
    size_t row = (size_t)a->n_head * p->head_dim;
    if (a->stride_q < row || a->stride_out < row)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "attention: strides %u/%u < n_head*head_dim %zu",
                             a->stride_q, a->stride_out, row);
    size_t qb = rows_bytes(a->n_tok, a->stride_q, row, 4);
    size_t ob = rows_bytes(a->n_tok, a->stride_out, row, 4);
    CHECK(dray_ocl_check_view(ctx, "attention", "q", a->q, qb, 4));
    CHECK(dray_ocl_check_view(ctx, "attention", "out", a->out, ob, 4));
    if (overlaps(a->q, qb, a->out, ob))
        return dray_ocl_fail(ctx, DRAY_EINVAL, "attention: out overlaps q");
    CHECK(dray_ocl_check_view(ctx, "attention", "seqs", a->seqs, (size_t)a->n_seq * 16, 4));
    /* the table's length is not passed: the kernel bounds its reads by the buffer */
    return dray_ocl_check_view(ctx, "attention", "block_table", a->block_table, 0, 4);
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
    size_t g[3] = {DRAY_OCL_WG, a->n_tok, a->n_head}, l[3] = {DRAY_OCL_WG, 1, 1};
    return dray_ocl_launch(ctx, "attention", &k, 3, g, l);
}

/* ---------------------------------------------------------------- eltwise */

int dray_ocl_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a)
{
    ctx->err[0] = '\0';
    if (a->act != DRAY_ACT_GELU_TANH && a->act != DRAY_ACT_SILU)
        return dray_ocl_fail(ctx, DRAY_ENOTSUP, "gated_act: activation %u (0 gelu_tanh, 1 silu)",
                             a->act);
    if (a->stride_gate < a->n || a->stride_up < a->n || a->stride_out < a->n)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "gated_act: a stride is below n = %u", a->n);
    CHECK(dray_ocl_check_view(ctx, "gated_act", "gate", a->gate, rows_bytes(a->n_tok, a->stride_gate, a->n, 4), 4));
    CHECK(dray_ocl_check_view(ctx, "gated_act", "up", a->up, rows_bytes(a->n_tok, a->stride_up, a->n, 4), 4));
    CHECK(dray_ocl_check_view(ctx, "gated_act", "out", a->out, rows_bytes(a->n_tok, a->stride_out, a->n, 4), 4));
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
    if (a->n > SIZE_MAX / 4)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "add: n = %llu is too large", (unsigned long long)a->n);
    size_t nb = (size_t)a->n * 4;
    CHECK(dray_ocl_check_view(ctx, "add", "a", a->a, nb, 4));
    CHECK(dray_ocl_check_view(ctx, "add", "b", a->b, nb, 4));
    CHECK(dray_ocl_check_view(ctx, "add", "out", a->out, nb, 4));
    struct dray_ocl_args k = {.k = ctx->k[OCL_K_add_f32]};
    cl_ulong n = a->n;
    dray_ocl_arg_view(&k, a->a, 4);
    dray_ocl_arg_view(&k, a->b, 4);
    dray_ocl_arg_view(&k, a->out, 4);
    DRAY_OCL_ARG(&k, n);
    size_t g = a->n < (1u << 22) ? (size_t)a->n : (1u << 22);
    return dray_ocl_launch(ctx, "add", &k, 1, &g, NULL);
}
