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

/* bytes of a strided row set: n rows of `used` elements, `stride` apart */
static size_t rows_bytes(uint32_t n, uint32_t stride, uint64_t used, size_t esz)
{
    return n ? ((size_t)(n - 1) * stride + used) * esz : 0;
}

static int bad(struct dray_ctx *ctx, const char *op, const char *what)
{
    return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: %s: %s", NAME, op, what);
}

static int launched(struct dray_ctx *ctx, int gerr, const char *op)
{
    return gerr ? dray_gpu_rt_fail(ctx, gerr, op) : 0;
}

static int overlap(struct dray_view a, size_t na, struct dray_view b, size_t nb)
{
    return a.buf && a.buf == b.buf && a.offset < b.offset + nb && b.offset < a.offset + na;
}

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
static int embed_check_ids(struct dray_ctx *ctx, const int32_t *ids_dev, uint32_t n_tok, uint32_t n_rows)
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
            return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: embed: ids[%u] = %d is outside [0, %u)", NAME, t,
                                 h[t], n_rows);
    return 0;
}

int dray_gpu_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    ctx->err[0] = '\0';
    if (a->dtype != DRAY_I8 && a->dtype != DRAY_F32)
        return dray_gpu_fail(ctx, DRAY_ENOTSUP, "%s: embed: table dtype %u (want I8 or F32)", NAME, a->dtype);
    const size_t esz = a->dtype == DRAY_I8 ? 1 : 4;
    struct gk_embed p;
    memset(&p, 0, sizeof(p));
    void *ids, *tab, *rs = NULL, *out;
    int rc = dray_gpu_view(ctx, "embed ids", a->ids, (size_t)a->n_tok * 4, 4, &ids);
    if (!rc)
        rc = dray_gpu_view(ctx, "embed table", a->table, (size_t)a->n_rows * a->dim * esz, esz, &tab);
    if (!rc && a->dtype == DRAY_I8)
        rc = dray_gpu_view(ctx, "embed row_scale", a->row_scale, (size_t)a->n_rows * 4, 4, &rs);
    if (!rc)
        rc = dray_gpu_view(ctx, "embed out", a->out, (size_t)a->n_tok * a->dim * 4, 4, &out);
    if (!rc)
        rc = embed_check_ids(ctx, ids, a->n_tok, a->n_rows);
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
    const uint64_t row = (uint64_t)a->n_head * a->n;
    if (a->stride_x < row || a->stride_out < row)
        return bad(ctx, "rmsnorm", "stride_x and stride_out must be >= n_head*n");
    struct gk_rmsnorm p;
    memset(&p, 0, sizeof(p));
    void *x, *w, *out;
    int rc = dray_gpu_view(ctx, "rmsnorm x", a->x, rows_bytes(a->n_tok, a->stride_x, row, 4), 4, &x);
    if (!rc)
        rc = dray_gpu_view(ctx, "rmsnorm w", a->w, (size_t)a->n * 4, 4, &w);
    if (!rc)
        rc = dray_gpu_view(ctx, "rmsnorm out", a->out, rows_bytes(a->n_tok, a->stride_out, row, 4), 4, &out);
    if (rc)
        return rc;
    if (out != x && overlap(a->x, rows_bytes(a->n_tok, a->stride_x, row, 4), a->out,
                            rows_bytes(a->n_tok, a->stride_out, row, 4)))
        return bad(ctx, "rmsnorm", "out overlaps x without aliasing it exactly");
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
    const int i8 = a->wdtype == DRAY_I8;
    const size_t xb = rows_bytes(a->n_tok, a->stride_x, a->k, 4);
    const size_t ob = rows_bytes(a->n_tok, a->stride_out, a->n_out, 4);
    void *x, *w, *ws = NULL, *out, *oi = NULL, *ow = NULL;
    int rc = dray_gpu_view(ctx, "matmul x", a->x, xb, 4, &x);
    if (!rc)
        rc = dray_gpu_view(ctx, "matmul w", a->w, (size_t)a->n_out * a->k * (i8 ? 1 : 4), i8 ? 1 : 4, &w);
    if (!rc && i8)
        rc = dray_gpu_view(ctx, "matmul wscale", a->wscale, (size_t)a->n_out * 4, 4, &ws);
    if (!rc)
        rc = dray_gpu_view(ctx, "matmul out", a->out, ob, 4, &out);
    if (!rc && i8 && a->n_outlier) {
        rc = dray_gpu_view(ctx, "matmul outlier_idx", a->outlier_idx, (size_t)a->n_outlier * 4, 4, &oi);
        if (!rc)
            rc = dray_gpu_view(ctx, "matmul outlier_w", a->outlier_w, (size_t)a->n_out * a->n_outlier * 4, 4,
                               &ow);
    }
    if (rc)
        return rc;
    if (overlap(a->x, xb, a->out, ob))
        return bad(ctx, "matmul", "out overlaps x");
    p->x = x;
    p->w = w;
    p->wscale = ws;
    p->out = out;
    p->outlier_idx = oi;
    p->outlier_w = ow;
    return 0;
}

int dray_gpu_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    ctx->err[0] = '\0';
    if (a->wdtype != DRAY_I8 && a->wdtype != DRAY_F32)
        return dray_gpu_fail(ctx, DRAY_ENOTSUP, "%s: matmul: weight dtype %u (want I8 or F32)", NAME,
                             a->wdtype);
    if (a->k > 65536)
        return bad(ctx, "matmul", "k > 65536 (the int32 sum could overflow)");
    if (a->stride_x < a->k || a->stride_out < a->n_out)
        return bad(ctx, "matmul", "stride_x must be >= k and stride_out >= n_out");
    if (a->wdtype == DRAY_I8 && a->n_outlier > a->k)
        return bad(ctx, "matmul", "n_outlier > k");
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
    if (a->n_rot % 2 || a->n_rot > a->head_dim)
        return bad(ctx, "rope", "n_rot must be even and <= head_dim");
    const uint64_t row = (uint64_t)a->n_head * a->head_dim;
    if (a->stride < row)
        return bad(ctx, "rope", "stride must be >= n_head*head_dim");
    struct gk_rope p;
    memset(&p, 0, sizeof(p));
    void *x, *pos;
    int rc = dray_gpu_view(ctx, "rope x", a->x, rows_bytes(a->n_tok, a->stride, row, 4), 4, &x);
    if (!rc)
        rc = dray_gpu_view(ctx, "rope pos", a->pos, (size_t)a->n_tok * 4, 4, &pos);
    if (rc)
        return rc;
    p.x = x;
    p.pos = pos;
    p.n_tok = a->n_tok;
    p.n_head = a->n_head;
    p.head_dim = a->head_dim;
    p.n_rot = a->n_rot;
    p.stride = a->stride;
    p.base = a->base;
    p.freq_scale = a->freq_scale;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_rope(&p, ctx->stream), "rope");
}

/* --------------------------------------------------------------- KV pool */

static int pool_views(struct dray_ctx *ctx, const char *op, const struct dray_kv_pool *pl, struct gk_pool *g)
{
    if (!pl)
        return bad(ctx, op, "pool is NULL");
    if (pl->dtype != DRAY_I8 && pl->dtype != DRAY_F16)
        return dray_gpu_fail(ctx, DRAY_ENOTSUP, "%s: %s: cache dtype %u (want I8 or F16)", NAME, op, pl->dtype);
    if (pl->block_size == 0 || pl->n_slots % pl->block_size)
        return bad(ctx, op, "pool block_size must be > 0 and divide n_slots");
    const int i8 = pl->dtype == DRAY_I8;
    const size_t n = (size_t)pl->n_slots * pl->n_kv_head * pl->head_dim * (i8 ? 1 : 2);
    void *k, *v, *ks = NULL, *vs = NULL;
    int rc = dray_gpu_view(ctx, "pool k", pl->k, n, i8 ? 1 : 2, &k);
    if (!rc)
        rc = dray_gpu_view(ctx, "pool v", pl->v, n, i8 ? 1 : 2, &v);
    if (!rc && i8)
        rc = dray_gpu_view(ctx, "pool k_scale", pl->k_scale, (size_t)pl->n_slots * pl->n_kv_head * 4, 4, &ks);
    if (!rc && i8)
        rc = dray_gpu_view(ctx, "pool v_scale", pl->v_scale, (size_t)pl->n_slots * pl->n_kv_head * 4, 4, &vs);
    if (rc)
        return rc;
    g->k = k;
    g->v = v;
    g->k_scale = ks;
    g->v_scale = vs;
    g->is_i8 = i8;
    g->n_kv_head = pl->n_kv_head;
    g->head_dim = pl->head_dim;
    g->block_size = pl->block_size;
    g->n_slots = pl->n_slots;
    return 0;
}

int dray_gpu_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    ctx->err[0] = '\0';
    struct gk_kv_store p;
    memset(&p, 0, sizeof(p));
    int rc = pool_views(ctx, "kv_store", a->pool, &p.pool);
    if (rc)
        return rc;
    const uint64_t row = (uint64_t)p.pool.n_kv_head * p.pool.head_dim;
    if (a->stride_k < row || a->stride_v < row)
        return bad(ctx, "kv_store", "stride_k and stride_v must be >= n_kv_head*head_dim");
    void *k, *v, *slots;
    rc = dray_gpu_view(ctx, "kv_store k", a->k, rows_bytes(a->n_tok, a->stride_k, row, 4), 4, &k);
    if (!rc)
        rc = dray_gpu_view(ctx, "kv_store v", a->v, rows_bytes(a->n_tok, a->stride_v, row, 4), 4, &v);
    if (!rc)
        rc = dray_gpu_view(ctx, "kv_store slots", a->slots, (size_t)a->n_tok * 4, 4, &slots);
    if (rc)
        return rc;
    p.k = k;
    p.v = v;
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

static int att_views(struct dray_ctx *ctx, const struct dray_attention_args *a, struct gk_attention *p)
{
    const uint64_t row = (uint64_t)a->n_head * p->pool.head_dim;
    if (a->stride_q < row || a->stride_out < row)
        return bad(ctx, "attention", "stride_q and stride_out must be >= n_head*head_dim");
    const size_t qb = rows_bytes(a->n_tok, a->stride_q, row, 4), ob = rows_bytes(a->n_tok, a->stride_out, row, 4);
    void *q, *out, *seqs, *bt;
    int rc = dray_gpu_view(ctx, "attention q", a->q, qb, 4, &q);
    if (!rc)
        rc = dray_gpu_view(ctx, "attention out", a->out, ob, 4, &out);
    if (!rc)
        rc = dray_gpu_view(ctx, "attention seqs", a->seqs, (size_t)a->n_seq * 16, 4, &seqs);
    if (!rc)
        rc = dray_gpu_view(ctx, "attention block_table", a->block_table, 0, 4, &bt);
    if (rc)
        return rc;
    if (overlap(a->q, qb, a->out, ob))
        return bad(ctx, "attention", "out overlaps q");
    size_t n_bt = dray_gpu_view_avail(a->block_table) / 4;
    p->q = q;
    p->out = out;
    p->seqs = seqs;
    p->block_table = bt;
    p->n_bt = n_bt > UINT32_MAX ? UINT32_MAX : (uint32_t)n_bt;
    return 0;
}

int dray_gpu_attention(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    ctx->err[0] = '\0';
    struct gk_attention p;
    memset(&p, 0, sizeof(p));
    int rc = pool_views(ctx, "attention", a->pool, &p.pool);
    if (rc)
        return rc;
    const uint32_t nkh = p.pool.n_kv_head;
    if (nkh == 0 || a->n_head < nkh || a->n_head % nkh)
        return bad(ctx, "attention", "n_head must be a positive multiple of the pool's n_kv_head");
    if (p.pool.head_dim == 0 || p.pool.head_dim > GK_ATT_MAX_HEAD_DIM)
        return dray_gpu_fail(ctx, DRAY_ENOTSUP, "%s: attention: head_dim %u (this plugin supports 1..%u)",
                             NAME, p.pool.head_dim, GK_ATT_MAX_HEAD_DIM);
    if ((rc = att_views(ctx, a, &p)))
        return rc;
    p.n_tok = a->n_tok;
    p.n_seq = a->n_seq;
    p.n_head = a->n_head;
    p.max_kv_len = a->max_kv_len;
    p.stride_q = a->stride_q;
    p.stride_out = a->stride_out;
    p.window = a->window;
    p.scale = a->scale;
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
    if (a->act != DRAY_ACT_GELU_TANH && a->act != DRAY_ACT_SILU)
        return dray_gpu_fail(ctx, DRAY_ENOTSUP, "%s: gated_act: act %u (want GELU_TANH or SILU)", NAME, a->act);
    if (a->stride_gate < a->n || a->stride_up < a->n || a->stride_out < a->n)
        return bad(ctx, "gated_act", "strides must be >= n");
    struct gk_gated_act p;
    memset(&p, 0, sizeof(p));
    void *g, *u, *o;
    int rc = dray_gpu_view(ctx, "gated_act gate", a->gate, rows_bytes(a->n_tok, a->stride_gate, a->n, 4), 4, &g);
    if (!rc)
        rc = dray_gpu_view(ctx, "gated_act up", a->up, rows_bytes(a->n_tok, a->stride_up, a->n, 4), 4, &u);
    if (!rc)
        rc = dray_gpu_view(ctx, "gated_act out", a->out, rows_bytes(a->n_tok, a->stride_out, a->n, 4), 4, &o);
    if (rc)
        return rc;
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
    if (a->n > SIZE_MAX / 4)
        return bad(ctx, "add", "n is too large");
    struct gk_add p;
    memset(&p, 0, sizeof(p));
    void *x, *y, *o;
    int rc = dray_gpu_view(ctx, "add a", a->a, a->n * 4, 4, &x);
    if (!rc)
        rc = dray_gpu_view(ctx, "add b", a->b, a->n * 4, 4, &y);
    if (!rc)
        rc = dray_gpu_view(ctx, "add out", a->out, a->n * 4, 4, &o);
    if (rc)
        return rc;
    p.a = x;
    p.b = y;
    p.out = o;
    p.n = a->n;
    dray_gpu_op_begin(ctx, &p, sizeof(p));
    return launched(ctx, dray_gk_add(&p, ctx->stream), "add");
}
