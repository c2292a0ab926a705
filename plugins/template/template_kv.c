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

/* Pointers of a pool whose shape and views the shared helper checked. */
static void pool_ptrs_of(const struct dray_kv_pool *p, struct pool_ptrs *pp)
{
    pp->k = dray_tpl_at(p->k);
    pp->v = dray_tpl_at(p->v);
    pp->k_scale = dray_tpl_at(p->k_scale);
    pp->v_scale = dray_tpl_at(p->v_scale);
    pp->n_blocks = p->n_slots / p->block_size;
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
            d[i] = dray_util_f32_to_f16(x[i]);
    }
}

/* For each token t with slots[t] >= 0: K and V of all kv heads (F32 rows of
 * stride_k / stride_v elements, [n_kv_head][head_dim] used) go into slot
 * slots[t], quantized per token per head (I8) or rounded to f16. Every slot is
 * checked against n_slots before anything is written. */
int dray_tpl_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    OP_BEGIN(ctx, a, "kv_store");
    struct dray_util_needs nd;
    struct pool_ptrs pp;
    CHECK_ARGS(ctx, dray_util_check_kv_store, a, &nd);
    pool_ptrs_of(a->pool, &pp);
    const struct dray_kv_pool *p = a->pool;
    const float *k = dray_tpl_at(a->k), *v = dray_tpl_at(a->v);
    const int32_t *slots = dray_tpl_at(a->slots);
    TRY(dray_util_check_slots(slots, a->n_tok, p->n_slots, ctx->err, sizeof(ctx->err)));

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
    TRY(dray_util_check_seq(a, e, s, ctx->err, sizeof(ctx->err)));
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
            dst[i] = dray_util_f16_to_f32(h[i]);
    }
}

/* The score of one key: scale * q.k, soft-capped to cap * tanh(s / cap) when
 * the softcap argument (version 4, Gemma 2) is > 0. */
static float score_of(const struct dray_attention_args *a, float dot)
{
    float s = dot * a->scale;
#if TPL_ABI >= 4
    if (a->softcap > 0.0f)
        s = (float)(a->softcap * tanh((double)s / a->softcap));
#endif
    return s;
}

/* One query vector q (head h, kv head g) at position pos of sequence sq:
 * out = sum_j softmax_j(s_j) v_j over lo <= j <= pos (s_j = score_of q.k_j),
 * in f32 with the maximum subtracted. scores holds pos+1 floats, row head_dim
 * floats. */
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
        scores[j - lo] = score_of(a, s);
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
    struct dray_util_needs nd;
    CHECK_ARGS(ctx, dray_util_check_attention, a, &nd);
    pool_ptrs_of(a->pool, pp);
    const struct dray_kv_pool *p = a->pool;
    *q = dray_tpl_at(a->q);
    *out = dray_tpl_at(a->out);
    *seqs = dray_tpl_at(a->seqs);
    /* seq_check bounds each sequence's block-table reads by the buffer's end */
    *bt = dray_tpl_at(a->block_table);
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
