/* The template's paged-KV operators: kv_store (quantize and scatter new K/V into
 * slots) and attention (a mixed batch of prefill and decode sequences reading
 * the pool through block tables). The pool layout is backend.h's struct
 * dray_kv_pool: slot-major, [n_slots][n_kv_head][head_dim], with one f32 scale
 * per slot and head for int8. */
#include <math.h>
#include <string.h>

#include "template.h"

/* ------------------------------------------------------------ the pool */

/* Host pointers of a checked pool. */
struct pool_ptrs {
    void *k, *v;
    float *k_scale, *v_scale; /* NULL for F16 */
    size_t n_blocks;
};

/* Check the pool's shape and that its four arrays fit their buffers. */
static int pool_check(struct dray_ctx *ctx, const char *op, const struct dray_kv_pool *p,
                      struct pool_ptrs *pp)
{
    memset(pp, 0, sizeof(*pp));
    if (!p)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: no KV pool given", op);
    if (p->dtype != DRAY_I8 && p->dtype != DRAY_F16)
        return dray_tpl_fail(ctx, DRAY_ENOTSUP, "%s: KV dtype %u is not I8 or F16", op, p->dtype);
    if (!p->n_kv_head || !p->head_dim || !p->block_size || p->n_slots % p->block_size)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: pool n_kv_head %u, head_dim %u, block_size %u must "
                        "be > 0 and n_slots %u a multiple of block_size", op, p->n_kv_head,
                        p->head_dim, p->block_size, p->n_slots);
    int i8 = p->dtype == DRAY_I8;
    uint64_t rows = (uint64_t)p->n_slots * p->n_kv_head; /* one scale per row */
    size_t ncell, nscale;
    TRY(dray_tpl_span(ctx, "KV pool k/v", rows, p->head_dim, p->head_dim, i8 ? 1 : 2, &ncell));
    TRY(dray_tpl_span(ctx, "KV pool scales", 1, 0, i8 ? rows : 0, 4, &nscale));
    VIEW(ctx, "KV pool k", p->k, ncell, i8 ? 1 : 2, pp->k);
    VIEW(ctx, "KV pool v", p->v, ncell, i8 ? 1 : 2, pp->v);
    VIEW(ctx, "KV pool k_scale", p->k_scale, nscale, 4, pp->k_scale);
    VIEW(ctx, "KV pool v_scale", p->v_scale, nscale, 4, pp->v_scale);
    pp->n_blocks = p->n_slots / p->block_size;
    return 0;
}

/* ------------------------------------------------------------ kv_store */

/* int8: scale = max|x|/127, q = round-to-nearest-even(x/scale) clamped to
 * [-127, 127]; an all-zero vector stores scale 0 and q = 0. */
static float quant_head(const float *x, uint32_t n, int8_t *q)
{
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float scale = amax / 127.0f;
    for (uint32_t i = 0; i < n; i++) {
        float v = scale == 0.0f ? 0.0f : nearbyintf(x[i] / scale);
        q[i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
    return scale;
}

/* Write one head vector x[head_dim] into row `row` of a pool array. */
static void store_head(const struct dray_kv_pool *p, void *base, float *scales, size_t row,
                       const float *x)
{
    if (p->dtype == DRAY_I8) {
        scales[row] = quant_head(x, p->head_dim, (int8_t *)base + row * p->head_dim);
    } else {
        uint16_t *d = (uint16_t *)base + row * p->head_dim;
        for (uint32_t i = 0; i < p->head_dim; i++)
            d[i] = dray_tpl_f32_to_f16(x[i]);
    }
}

/* For each token t with slots[t] >= 0: K and V of all kv heads (F32 rows of
 * stride_k / stride_v elements, [n_kv_head][head_dim] used) go into slot
 * slots[t], quantized per token per head (I8) or rounded to f16. Every slot is
 * checked against n_slots before anything is written. */
int dray_tpl_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    OP_BEGIN(ctx, a, "kv_store");
    struct pool_ptrs pp;
    TRY(pool_check(ctx, "kv_store", a->pool, &pp));
    const struct dray_kv_pool *p = a->pool;
    uint64_t row = (uint64_t)p->n_kv_head * p->head_dim;
    if (a->stride_k < row || a->stride_v < row)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "kv_store: strides %u/%u are below n_kv_head*head_dim = "
                        "%llu", a->stride_k, a->stride_v, (unsigned long long)row);
    size_t nk, nv, ns;
    const float *k, *v;
    const int32_t *slots;
    TRY(dray_tpl_span(ctx, "kv_store k", a->n_tok, a->stride_k, row, 4, &nk));
    TRY(dray_tpl_span(ctx, "kv_store v", a->n_tok, a->stride_v, row, 4, &nv));
    TRY(dray_tpl_span(ctx, "kv_store slots", 1, 0, a->n_tok, 4, &ns));
    VIEW(ctx, "kv_store k", a->k, nk, 4, k);
    VIEW(ctx, "kv_store v", a->v, nv, 4, v);
    VIEW(ctx, "kv_store slots", a->slots, ns, 4, slots);
    for (uint32_t t = 0; t < a->n_tok; t++)
        if (slots[t] >= 0 && (uint32_t)slots[t] >= p->n_slots)
            return dray_tpl_fail(ctx, DRAY_EINVAL, "kv_store: slots[%u] = %d but the pool has %u slots",
                            t, slots[t], p->n_slots);

    for (uint32_t t = 0; t < a->n_tok; t++) {
        if (slots[t] < 0) /* padding: not stored */
            continue;
        for (uint32_t h = 0; h < p->n_kv_head; h++) {
            size_t prow = (size_t)slots[t] * p->n_kv_head + h;
            size_t off = (size_t)h * p->head_dim;
            store_head(p, pp.k, pp.k_scale, prow, k + (size_t)t * a->stride_k + off);
            store_head(p, pp.v, pp.v_scale, prow, v + (size_t)t * a->stride_v + off);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ attention */

/* One sequence of the batch, from seqs[s][4]. */
struct seq {
    uint32_t q_start, n_q, kv_len;
    const int32_t *bt; /* its block table */
};

/* First position a query at position pos may attend: the window's start. */
static uint32_t window_start(uint32_t window, uint32_t pos)
{
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

/* Check sequence s and every block-table entry its queries can reach (from the
 * first query's window start to kv_len-1); the other entries may be -1. */
static int seq_check(struct dray_ctx *ctx, const struct dray_attention_args *a,
                     const struct pool_ptrs *pp, const int32_t *e, uint32_t s,
                     struct dray_view btv, const int32_t *bt_base, struct seq *out)
{
    const struct dray_kv_pool *p = a->pool;
    if (e[0] < 0 || e[1] < 0 || e[2] < 0 || e[3] < 0 || (uint64_t)e[0] + (uint32_t)e[1] > a->n_tok ||
        e[1] > e[2] || (uint32_t)e[2] > a->max_kv_len)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "attention: seqs[%u] = {q_start %d, n_q %d, kv_len %d, "
                        "bt_start %d}: need q_start+n_q <= n_tok %u and n_q <= kv_len <= max_kv_len %u",
                        s, e[0], e[1], e[2], e[3], a->n_tok, a->max_kv_len);
    out->q_start = (uint32_t)e[0];
    out->n_q = (uint32_t)e[1];
    out->kv_len = (uint32_t)e[2];
    out->bt = NULL;
    if (out->n_q == 0)
        return 0;
    uint32_t first = window_start(a->window, out->kv_len - out->n_q) / p->block_size;
    uint32_t last = (out->kv_len - 1) / p->block_size;
    /* the block table's length is not an argument: its buffer's end bounds it */
    size_t have = btv.offset <= btv.buf->size ? (btv.buf->size - btv.offset) / 4 : 0;
    if ((uint64_t)e[3] + last >= have)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "attention: seqs[%u] reads block_table[%llu] but the "
                        "buffer holds %zu entries", s, (unsigned long long)e[3] + last, have);
    out->bt = bt_base + e[3];
    for (uint32_t b = first; b <= last; b++)
        if (out->bt[b] < 0 || (size_t)out->bt[b] >= pp->n_blocks)
            return dray_tpl_fail(ctx, DRAY_EINVAL, "attention: seqs[%u] block %u -> %d, outside the "
                            "pool's %zu blocks", s, b, out->bt[b], pp->n_blocks);
    return 0;
}

/* Dequantize head g of the K (is_v = 0) or V row at `slot` into dst[head_dim]. */
static void load_head(const struct dray_kv_pool *p, const struct pool_ptrs *pp, int is_v,
                      size_t slot, uint32_t g, float *dst)
{
    size_t row = slot * p->n_kv_head + g;
    if (p->dtype == DRAY_I8) {
        const int8_t *q = (const int8_t *)(is_v ? pp->v : pp->k) + row * p->head_dim;
        float s = (is_v ? pp->v_scale : pp->k_scale)[row];
        for (uint32_t i = 0; i < p->head_dim; i++)
            dst[i] = (float)q[i] * s;
    } else {
        const uint16_t *h = (const uint16_t *)(is_v ? pp->v : pp->k) + row * p->head_dim;
        for (uint32_t i = 0; i < p->head_dim; i++)
            dst[i] = dray_tpl_f16_to_f32(h[i]);
    }
}

/* One query vector q (head h, kv head g) at position pos of sequence sq:
 * out = sum_j softmax_j(scale * q.k_j) v_j over lo <= j <= pos, in f32 with the
 * maximum subtracted. scores holds pos+1 floats, row head_dim floats. */
static void one_query(const struct dray_attention_args *a, const struct pool_ptrs *pp,
                      const struct seq *sq, uint32_t pos, uint32_t g, const float *q,
                      float *out, float *scores, float *row)
{
    const struct dray_kv_pool *p = a->pool;
    uint32_t lo = window_start(a->window, pos), d = p->head_dim;
    float m = -INFINITY, sum = 0.0f;
    for (uint32_t j = lo; j <= pos; j++) {
        size_t slot = (size_t)sq->bt[j / p->block_size] * p->block_size + j % p->block_size;
        load_head(p, pp, 0, slot, g, row);
        float s = 0.0f;
        for (uint32_t i = 0; i < d; i++)
            s += q[i] * row[i];
        scores[j - lo] = s * a->scale;
        m = scores[j - lo] > m ? scores[j - lo] : m;
    }
    for (uint32_t j = lo; j <= pos; j++) {
        scores[j - lo] = expf(scores[j - lo] - m);
        sum += scores[j - lo];
    }
    for (uint32_t i = 0; i < d; i++)
        out[i] = 0.0f;
    for (uint32_t j = lo; j <= pos; j++) {
        size_t slot = (size_t)sq->bt[j / p->block_size] * p->block_size + j % p->block_size;
        load_head(p, pp, 1, slot, g, row);
        float w = scores[j - lo] / sum;
        for (uint32_t i = 0; i < d; i++)
            out[i] += w * row[i];
    }
}

/* Scratch for one query: scores [max_kv_len] and a dequantized row [head_dim]. */
static int scratch_reserve(struct dray_ctx *ctx, size_t floats)
{
    if (floats <= ctx->scratch_len)
        return 0;
    float *s = dray_tpl_alloc(floats * sizeof(float));
    if (!s)
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "attention: no host memory for %zu scores", floats);
    dray_tpl_free(ctx->scratch);
    ctx->scratch = s;
    ctx->scratch_len = floats;
    return 0;
}

/* Check everything attention reads and writes; fills pp and the views. */
static int attention_check(struct dray_ctx *ctx, const struct dray_attention_args *a,
                           struct pool_ptrs *pp, const float **q, float **out,
                           const int32_t **seqs, const int32_t **bt)
{
    TRY(pool_check(ctx, "attention", a->pool, pp));
    const struct dray_kv_pool *p = a->pool;
    if (!a->n_head || a->n_head % p->n_kv_head)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "attention: n_head %u is not a positive multiple of "
                        "n_kv_head %u", a->n_head, p->n_kv_head);
    uint64_t row = (uint64_t)a->n_head * p->head_dim;
    if (a->stride_q < row || a->stride_out < row)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "attention: strides %u/%u are below n_head*head_dim = "
                        "%llu", a->stride_q, a->stride_out, (unsigned long long)row);
    size_t nq, no, ns;
    TRY(dray_tpl_span(ctx, "attention q", a->n_tok, a->stride_q, row, 4, &nq));
    TRY(dray_tpl_span(ctx, "attention out", a->n_tok, a->stride_out, row, 4, &no));
    TRY(dray_tpl_span(ctx, "attention seqs", 1, 0, (uint64_t)a->n_seq * 4, 4, &ns));
    VIEW(ctx, "attention q", a->q, nq, 4, *q);
    VIEW(ctx, "attention out", a->out, no, 4, *out);
    VIEW(ctx, "attention seqs", a->seqs, ns, 4, *seqs);
    if (dray_tpl_overlap(a->out, no, a->q, nq))
        return dray_tpl_fail(ctx, DRAY_EINVAL, "attention: out overlaps q");
    /* at least one entry must exist if any sequence has a query; seq_check
     * bounds each sequence's reads by the buffer's end */
    VIEW(ctx, "attention block_table", a->block_table, a->n_seq ? 4 : 0, 4, *bt);
    struct seq sq;
    for (uint32_t s = 0; s < a->n_seq; s++)
        TRY(seq_check(ctx, a, pp, *seqs + 4 * (size_t)s, s, a->block_table, *bt, &sq));
    return scratch_reserve(ctx, (size_t)a->max_kv_len + p->head_dim);
}

/* Paged attention over a mixed batch; see struct dray_attention_args. Rows of q
 * not covered by any sequence are left alone in out. Query head h reads kv head
 * h / (n_head / n_kv_head). */
int dray_tpl_attention(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    OP_BEGIN(ctx, a, "attention");
    struct pool_ptrs pp;
    const float *q = NULL;
    float *out = NULL;
    const int32_t *seqs = NULL, *bt = NULL;
    TRY(attention_check(ctx, a, &pp, &q, &out, &seqs, &bt));
    const struct dray_kv_pool *p = a->pool;
    uint32_t group = a->n_head / p->n_kv_head; /* query heads per kv head */
    float *row = ctx->scratch, *scores = ctx->scratch + p->head_dim;

    for (uint32_t s = 0; s < a->n_seq; s++) {
        struct seq sq;
        const int32_t *e = seqs + 4 * (size_t)s;
        sq.q_start = (uint32_t)e[0];
        sq.n_q = (uint32_t)e[1];
        sq.kv_len = (uint32_t)e[2];
        sq.bt = bt + e[3];
        for (uint32_t r = 0; r < sq.n_q; r++) {
            uint32_t pos = sq.kv_len - sq.n_q + r; /* the new tokens are the last n_q */
            size_t t = (size_t)sq.q_start + r;
            for (uint32_t h = 0; h < a->n_head; h++)
                one_query(a, &pp, &sq, pos, h / group,
                          q + t * a->stride_q + (size_t)h * p->head_dim,
                          out + t * a->stride_out + (size_t)h * p->head_dim, scores, row);
        }
    }
    return 0;
}
