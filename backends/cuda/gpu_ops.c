/*
 * gpu_ops.c — op dispatch: check every argument on the host (shapes, strides,
 * views inside their buffers, dtypes), resolve device addresses into the
 * kernels' parameter structs, and queue the launch on the context's stream.
 * Contracts: include/dray/backend.h. What only the device can see (ids, slots,
 * block-table entries) is checked there and reported at the next wait.
 */
#include <stdio.h>
#include <string.h>

#include "gpu_internal.h"

#define NAME GPU_PLUGIN_NAME

static int bad(struct dray_ctx *ctx, const char *op, const char *what)
{
    return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: %s: %s", NAME, op, what);
}

static int launched(struct dray_ctx *ctx, int gerr, const char *op)
{
    return gerr ? dray_gpu_rt_fail(ctx, gerr, op) : 0;
}

/* An op's argument checks: rc is what the shared validator (dray_util_check_<op>
 * in dray/backend_util.h, which wrote its reason into ctx->err) returned; when
 * 0, each view it listed is checked against its buffer and resolved to a device
 * address, p[i] (NULL for an empty view without a buffer). */
int dray_gpu_args_ok(struct dray_ctx *ctx, int rc, const struct dray_util_needs *nd, void **p)
{
    for (uint32_t i = 0; rc == 0 && i < nd->n; i++) {
        const struct dray_util_need *u = &nd->at[i];
        p[i] = NULL;
        if (u->nbytes || u->v.buf)
            rc = dray_gpu_view(ctx, u->what, u->v, u->nbytes, u->align, &p[i]);
    }
    return rc;
}

#define VALIDATE(op, a, nd, p) \
    dray_gpu_args_ok(ctx, dray_util_check_##op((a), (nd), ctx->err, sizeof(ctx->err)), (nd), (p))

int dray_gpu_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes)
{
    ctx->err[0] = '\0';
    if (nbytes % 4)
        return bad(ctx, "fill", "nbytes must be a multiple of 4");
    struct gk_fill p;
    memset(&p, 0, sizeof(p));
    void *d = NULL;
    int rc = dray_gpu_view(ctx, "fill dst", dst, nbytes, 4, &d);
    if (rc)
        return rc;
    p.dst = d;
    p.n_words = nbytes / 4;
    p.pattern = pattern;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_fill(&p, ctx->stream), "fill");
}

/* ------------------------------------------------------------------ embed */

/* Outside graph capture, read the ids back so a bad one fails this call, as
 * the contract says; in a capture the device flag reports it at the wait. */
int dray_gpu_embed_check_ids(struct dray_ctx *ctx, const int32_t *ids_dev, uint32_t n_tok, uint32_t n_rows)
{
    if (ctx->graphs)
        return 0;
    int32_t stackbuf[256];
    int32_t *h = n_tok <= 256 ? stackbuf : NULL;
    if (!h)
        return 0; /* long prompts: the device check alone */
    gpuError_t e = gpuMemcpyAsync(h, ids_dev, n_tok * sizeof(int32_t), gpuMemcpyDeviceToHost, ctx->stream);
    if (e == gpuSuccess)
        e = gpuStreamSynchronize(ctx->stream);
    if (e != gpuSuccess)
        return dray_gpu_rt_fail(ctx, e, "embed: read ids");
    for (uint32_t t = 0; t < n_tok; t++)
        if (h[t] < 0 || (uint32_t)h[t] >= n_rows)
            return dray_util_check_ids(h, n_tok, n_rows, ctx->err, sizeof(ctx->err));
    return 0;
}

int dray_gpu_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    ctx->err[0] = '\0';
    if (a->dtype == DRAY_PACKED)
        return dray_gpu_embed_packed(ctx, a);
    struct gk_embed p;
    memset(&p, 0, sizeof(p));
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(embed, a, &nd, v);
    void *ids = v[0], *tab = v[1], *rs = v[2], *out = v[3];
    if (!rc)
        rc = dray_gpu_embed_check_ids(ctx, ids, a->n_tok, a->n_rows);
    if (rc)
        return rc;
    p.ids = ids;
    p.table = tab;
    p.row_scale = rs;
    p.out = out;
    p.is_i8 = a->dtype == DRAY_I8;
    p.n_tok = a->n_tok;
    p.dim = a->dim;
    p.n_rows = a->n_rows;
    p.scale = a->scale;
    p.flag = ctx->flag;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_embed(&p, ctx->stream), "embed");
}

/* ---------------------------------------------------------------- rmsnorm */

int dray_gpu_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a)
{
    ctx->err[0] = '\0';
    struct gk_rmsnorm p;
    memset(&p, 0, sizeof(p));
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(rmsnorm, a, &nd, v);
    if (rc)
        return rc;
    void *x = v[0], *w = v[1], *out = v[2];
    p.x = x;
    p.w = w;
    p.out = out;
    p.n_tok = a->n_tok;
    p.n_head = a->n_head;
    p.n = a->n;
    p.stride_x = a->stride_x;
    p.stride_out = a->stride_out;
    p.eps = a->eps;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_rmsnorm(&p, ctx->stream), "rmsnorm");
}

/* ----------------------------------------------------------------- matmul */

static int matmul_views(struct dray_ctx *ctx, const struct dray_matmul_args *a, struct gk_matmul *p)
{
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(matmul, a, &nd, v);
    if (rc)
        return rc;
    p->x = v[0];
    p->w = v[1];
    p->wscale = v[2];
    p->out = v[3];
    p->outlier_idx = v[4];
    p->outlier_w = v[5];
    return 0;
}

int dray_gpu_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    ctx->err[0] = '\0';
    if (a->wdtype == DRAY_PACKED)
        return dray_gpu_matmul_packed(ctx, a);
    struct gk_matmul p;
    memset(&p, 0, sizeof(p));
    int rc = matmul_views(ctx, a, &p);
    if (rc)
        return rc;
    p.n_tok = a->n_tok;
    p.n_out = a->n_out;
    p.k = a->k;
    p.stride_x = a->stride_x;
    p.stride_out = a->stride_out;
    p.n_outlier = a->wdtype == DRAY_I8 ? a->n_outlier : 0;
    p.accumulate = a->accumulate ? 1 : 0;
    p.is_f32 = a->wdtype == DRAY_F32;
    p.use_mma = ctx->use_mma;
    if (!p.is_f32 && a->n_tok && a->n_out &&
        (rc = dray_gpu_scratch(ctx, dray_gk_matmul_scratch(a->n_tok, a->k), &p.scratch)))
        return rc;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_matmul(&p, ctx->stream), "matmul");
}

/* ------------------------------------------------------------------- rope */

int dray_gpu_rope(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    ctx->err[0] = '\0';
    struct gk_rope p;
    memset(&p, 0, sizeof(p));
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(rope, a, &nd, v);
    if (rc)
        return rc;
    void *x = v[0], *pos = v[1];
    p.x = x;
    p.pos = pos;
    p.n_tok = a->n_tok;
    p.n_head = a->n_head;
    p.head_dim = a->head_dim;
    p.n_rot = a->n_rot;
    p.stride = a->stride;
    p.base = a->base;
    p.freq_scale = a->freq_scale;
    p.ff = v[2]; /* v4; NULL when the host gives no factors */
    p.mscale = dray_util_rope_mscale(a);
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_rope(&p, ctx->stream), "rope");
}

/* --------------------------------------------------------------- KV pool */

/* The pool's four views, checked by the shared validator, are v[0..3]. */
static void pool_of(const struct dray_kv_pool *pl, void *const *v, struct gk_pool *g)
{
    g->k = v[0];
    g->v = v[1];
    g->k_scale = v[2];
    g->v_scale = v[3];
    g->is_i8 = pl->dtype == DRAY_I8;
    g->n_kv_head = pl->n_kv_head;
    g->head_dim = pl->head_dim;
    g->block_size = pl->block_size;
    g->n_slots = pl->n_slots;
}

int dray_gpu_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    ctx->err[0] = '\0';
    struct gk_kv_store p;
    memset(&p, 0, sizeof(p));
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(kv_store, a, &nd, v);
    if (rc)
        return rc;
    pool_of(a->pool, v, &p.pool);
    void *k = v[4], *vv = v[5], *slots = v[6];
    p.k = k;
    p.v = vv;
    p.slots = slots;
    p.n_tok = a->n_tok;
    p.stride_k = a->stride_k;
    p.stride_v = a->stride_v;
    p.flag = ctx->flag;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_kv_store(&p, ctx->stream), "kv_store");
}

/* -------------------------------------------------------------- attention */

/* Split-K for decode: enough blocks to fill the device about 4 times over,
 * at most 16 parts, none shorter than 256 keys. The reference setting and
 * prefill-heavy batches do not split. */
static uint32_t att_max_split(const struct dray_ctx *ctx, const struct dray_attention_args *a, uint32_t nkh)
{
    if (ctx->reference || a->n_tok > 4 * a->n_seq)
        return 1;
    uint64_t have = (uint64_t)a->n_seq * nkh, want = 4ull * (ctx->n_sm ? ctx->n_sm : 16);
    uint64_t s = (want + have - 1) / have, by_len = (a->max_kv_len + 255) / 256;
    s = s < by_len ? s : by_len;
    return s < 1 ? 1 : (s > 16 ? 16 : (uint32_t)s);
}

/* Views and pool of attention, checked by the shared validator. */
static int att_views(struct dray_ctx *ctx, const struct dray_attention_args *a, struct gk_attention *p)
{
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(attention, a, &nd, v);
    if (rc)
        return rc;
    pool_of(a->pool, v, &p->pool);
    /* the table's length is not an argument: its buffer's end bounds the reads */
    size_t n_bt = a->block_table.buf ? dray_gpu_view_avail(a->block_table) / 4 : 0;
    p->q = v[4];
    p->out = v[5];
    p->seqs = v[6];
    p->block_table = v[7];
    p->n_bt = n_bt > UINT32_MAX ? UINT32_MAX : (uint32_t)n_bt;
    return 0;
}

int dray_gpu_attention(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    ctx->err[0] = '\0';
    struct gk_attention p;
    memset(&p, 0, sizeof(p));
    int rc = att_views(ctx, a, &p);
    if (rc)
        return rc;
    const uint32_t nkh = p.pool.n_kv_head;
    if (p.pool.head_dim > GK_ATT_MAX_HEAD_DIM)
        return dray_gpu_fail(ctx, DRAY_ENOTSUP, "%s: attention: head_dim %u (this plugin supports 1..%u)",
                             NAME, p.pool.head_dim, GK_ATT_MAX_HEAD_DIM);
    p.n_tok = a->n_tok;
    p.n_seq = a->n_seq;
    p.n_head = a->n_head;
    p.max_kv_len = a->max_kv_len;
    p.stride_q = a->stride_q;
    p.stride_out = a->stride_out;
    p.window = a->window;
    p.scale = a->scale;
    p.softcap = a->softcap;
    p.max_split = att_max_split(ctx, a, nkh);
    p.flag = ctx->flag;
    if (a->n_seq && a->n_tok &&
        (rc = dray_gpu_scratch(ctx, dray_gk_attention_scratch(a->n_seq, nkh, p.pool.head_dim, p.max_split),
                               &p.scratch)))
        return rc;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_attention(&p, ctx->stream), "attention");
}

/* ---------------------------------------------------- gated act, add */

int dray_gpu_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a)
{
    ctx->err[0] = '\0';
    struct gk_gated_act p;
    memset(&p, 0, sizeof(p));
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(gated_act, a, &nd, v);
    if (rc)
        return rc;
    void *g = v[0], *u = v[1], *o = v[2];
    p.gate = g;
    p.up = u;
    p.out = o;
    p.n_tok = a->n_tok;
    p.n = a->n;
    p.stride_gate = a->stride_gate;
    p.stride_up = a->stride_up;
    p.stride_out = a->stride_out;
    p.act = a->act;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_gated_act(&p, ctx->stream), "gated_act");
}

int dray_gpu_add(struct dray_ctx *ctx, const struct dray_add_args *a)
{
    ctx->err[0] = '\0';
    struct gk_add p;
    memset(&p, 0, sizeof(p));
    struct dray_util_needs nd;
    void *v[DRAY_UTIL_MAX_NEEDS];
    int rc = VALIDATE(add, a, &nd, v);
    if (rc)
        return rc;
    void *x = v[0], *y = v[1], *o = v[2];
    p.a = x;
    p.b = y;
    p.out = o;
    p.n = a->n;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_add(&p, ctx->stream), "add");
}
