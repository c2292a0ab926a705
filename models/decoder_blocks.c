/* The building blocks of a decoder layer, one call into the operator table
 * each (decoder.h). */
#include "decoder_internal.h"

#include <math.h>

struct dray_view dec_at(struct dray_buf *b, size_t floats)
{
    return (struct dray_view){b, floats * 4};
}

int dec_matmul(struct dray_model *m, struct dray_view x, uint32_t stride_x,
               const struct dray_weight *w, struct dray_view out, uint32_t stride_out, uint32_t n_tok)
{
    struct dray_matmul_args a = {
        .x = x, .out = out, .n_tok = n_tok, .stride_x = stride_x, .stride_out = stride_out,
        /* grouped weights with two-pass activations when asked (backend.h); the
         * head only when it is not the bulk of a step (head_two_pass) */
        .passes = (w == &m->embd || w == &m->output ? m->head_two_pass : m->two_pass) ? 2u : 1u,
    };
    return dray_weight_matmul(m->dev, w, a);
}

/* While calibrating, remember the largest |x| of every input channel of a layer
 * matmul (x: [T] rows of stride floats, k used): the largest value is what sets a
 * token's int8 scale. Costs nothing otherwise. */
int dec_observe(struct dray_model *m, uint32_t il, int which, struct dray_buf *x, uint32_t stride,
                uint32_t k, uint32_t T)
{
    if (!m->calib_host) /* only while calibrating: the scores outlive it */
        return 0;
    int rc = m->dev->ops->download(m->dev->ctx, m->calib_host, (struct dray_view){x, 0}, (size_t)T * stride * 4);
    /* a slice's channels at their place in the whole model's row */
    float *amax = m->calib + dec_calib_row(m, il, which) + dec_tp_k0(m, which);
    for (uint32_t t = 0; !rc && t < T; t++)
        for (uint32_t c = 0; c < k; c++) {
            float a = fabsf(m->calib_host[(size_t)t * stride + c]);
            amax[c] = a > amax[c] ? a : amax[c];
        }
    return rc;
}

/* out[t][0..n) += bias, row by row (only models with biases pay for it). */
static int add_bias(struct dray_model *m, struct dray_buf *out, uint32_t stride, struct dray_buf *bias,
                    uint32_t n, uint32_t T)
{
    int rc = 0;
    for (uint32_t t = 0; bias && t < T && !rc; t++) {
        struct dray_add_args a = {.a = dec_at(out, (size_t)t * stride), .b = {bias, 0},
                                  .out = dec_at(out, (size_t)t * stride), .n = n};
        rc = m->dev->ops->add(m->dev->ctx, &a);
    }
    return rc;
}

int dec_rmsnorm(struct dray_model *m, struct dray_view x, uint32_t stride_x, struct dray_buf *w,
                struct dray_view out, uint32_t stride_out, uint32_t n_tok, uint32_t n_head, uint32_t n)
{
    struct dray_rmsnorm_args a = {
        .x = x, .w = {w, 0}, .out = out, .n_tok = n_tok, .n_head = n_head, .n = n,
        .stride_x = stride_x, .stride_out = stride_out, .eps = m->eps,
    };
    return m->dev->ops->rmsnorm(m->dev->ctx, &a);
}

/* h = dec_rmsnorm(x, w) over the hidden state; *in = h, or x itself when the
 * family has no norm there (OLMo 2 normalizes outputs only) */
static int norm_x(struct dray_model *m, struct dray_buf *w, uint32_t T, struct dray_buf **in)
{
    uint32_t d = m->info.n_embd;
    *in = w ? m->a.h : m->a.x;
    return w ? dec_rmsnorm(m, dec_at(m->a.x, 0), d, w, dec_at(m->a.h, 0), d, T, 1, d) : 0;
}

int dec_attn_input(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    uint32_t d = m->info.n_embd;
    struct dray_buf *h;
    int rc = norm_x(m, L->vec[DEC_ATTN_NORM], T, &h);
    if (!rc) rc = dec_observe(m, il, MM_QKV, h, d, d, T);
    if (!rc) rc = dec_matmul(m, dec_at(h, 0), d, &L->wqkv, dec_at(m->a.qkv, 0), m->qkv_dim, T);
    if (!rc) rc = add_bias(m, m->a.qkv, m->qkv_dim, L->bqkv, m->qkv_dim, T);
    return rc;
}

int dec_qk_norms(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    const struct dray_model_info *in = &m->info;
    struct dray_view q = dec_at(m->a.qkv, 0), k = dec_at(m->a.qkv, m->q_dim);
    int rc = dec_rmsnorm(m, q, m->qkv_dim, L->vec[DEC_Q_NORM], q, m->qkv_dim, T, m->tp.n_head, in->head_dim);
    if (!rc)
        rc = dec_rmsnorm(m, k, m->qkv_dim, L->vec[DEC_K_NORM], k, m->qkv_dim, T, m->tp.n_kv, in->head_dim);
    if (!rc)
        rc = dec_kv_smooth_observe(m, il, T);
    return rc;
}

int dec_qk_norms_full(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    struct dray_view q = dec_at(m->a.qkv, 0), k = dec_at(m->a.qkv, m->q_dim);
    int rc = dec_rmsnorm(m, q, m->qkv_dim, L->vec[DEC_Q_NORM], q, m->qkv_dim, T, 1, m->q_dim);
    return rc ? rc : dec_rmsnorm(m, k, m->qkv_dim, L->vec[DEC_K_NORM], k, m->qkv_dim, T, 1, m->kv_dim);
}

static int rope(struct dray_model *m, struct dray_view x, uint32_t n_head, uint32_t n_tok, const struct dec_layer *L)
{
    struct dray_rope_args a = {
        .x = x, .pos = {m->a.meta, (size_t)m->max_batch * 4}, .n_tok = n_tok, .n_head = n_head,
        .head_dim = m->info.head_dim, .n_rot = m->n_rot, .stride = m->qkv_dim,
        .base = L->rope_base, .freq_scale = L->rope_scale,
        /* ABI v4 only (decoder_rope.c refused an older plugin that would need them) */
        .freq_factors = {L->rope_plain ? NULL : m->rope_ff, 0},
        .attn_factor = L->rope_plain || m->rope_mscale == 1.0f ? 0.0f : m->rope_mscale,
    };
    return m->dev->ops->rope(m->dev->ctx, &a);
}

int dec_rope_qk(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    if (!L->rope_on)
        return 0;
    int rc = rope(m, dec_at(m->a.qkv, 0), m->tp.n_head, T, L);
    return rc ? rc : rope(m, dec_at(m->a.qkv, m->q_dim), m->tp.n_kv, T, L);
}

int dec_attend(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    const struct dray_ops *ops = m->dev->ops;
    const struct dray_kv_layer_step *s = dray_kv_layer_mb(kv, il, m->mb);
    struct dray_view q = dec_at(m->a.qkv, 0), k = dec_at(m->a.qkv, m->q_dim),
                     v = dec_at(m->a.qkv, m->q_dim + m->kv_dim);
    int rc;
    /* append k, v to this layer's cache (layers that share KV read an earlier layer's) */
    if (s->store) {
        struct dray_kv_store_args st = {.k = k, .v = v, .slots = s->slots, .pool = s->pool,
                                        .n_tok = T, .stride_k = m->qkv_dim, .stride_v = m->qkv_dim};
        if ((rc = ops->kv_store(m->dev->ctx, &st)))
            return rc;
    }
    /* GQA: the attention op maps query head h to kv head h / (n_head / n_kv_head) */
    struct dray_attention_args a = {
        .q = q, .out = dec_at(m->a.att, 0), .seqs = s->seqs, .block_table = s->block_table, .pool = s->pool,
        .n_tok = T, .n_seq = s->n_seq, .n_head = m->tp.n_head, .max_kv_len = s->max_kv_len,
        .stride_q = m->qkv_dim, .stride_out = m->q_dim, .window = m->layer[il].window, .scale = m->attn_scale,
        .softcap = m->attn_softcap, /* ABI v4; 0 unless the family caps (then checked at load) */
    };
    return ops->attention(m->dev->ctx, &a);
}

int dec_attn_output(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    uint32_t d = m->info.n_embd;
    int rc = dec_observe(m, il, MM_O, m->a.att, m->q_dim, m->q_dim, T);
    if (!rc) rc = dec_matmul(m, dec_at(m->a.att, 0), m->q_dim, &L->wo, dec_at(m->a.o, 0), d, T);
    if (!rc) rc = add_bias(m, m->a.o, d, L->bo, d, T); /* tensor parallel: rank 0's only */
    if (!rc) rc = dec_tp_reduce(m, T);
    return rc;
}

int dec_ffn(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    uint32_t d = m->info.n_embd, ff = m->ff_dim;
    struct dray_buf *h;
    int rc = norm_x(m, L->vec[DEC_FFN_NORM], T, &h);
    if (!rc) rc = dec_observe(m, il, MM_GU, h, d, d, T);
    if (!rc) rc = dec_matmul(m, dec_at(h, 0), d, &L->wgu, dec_at(m->a.gu, 0), 2 * ff, T);
    struct dray_gated_act_args g = {
        .gate = dec_at(m->a.gu, 0), .up = dec_at(m->a.gu, ff), .out = dec_at(m->a.mid, 0), .n_tok = T,
        .n = ff, .stride_gate = 2 * ff, .stride_up = 2 * ff, .stride_out = ff, .act = m->act,
    };
    if (!rc) rc = m->dev->ops->gated_act(m->dev->ctx, &g);
    if (!rc) rc = dec_observe(m, il, MM_DOWN, m->a.mid, ff, ff, T);
    if (!rc) rc = dec_matmul(m, dec_at(m->a.mid, 0), ff, &L->wdown, dec_at(m->a.o, 0), d, T);
    if (!rc) rc = dec_tp_reduce(m, T);
    return rc;
}

int dec_norm_o(struct dray_model *m, uint32_t il, int which, uint32_t T)
{
    uint32_t d = m->info.n_embd;
    return dec_rmsnorm(m, dec_at(m->a.o, 0), d, m->layer[il].vec[which], dec_at(m->a.o, 0), d, T, 1, d);
}

int dec_norm_residual(struct dray_model *m, uint32_t il, int which, uint32_t T)
{
    int rc = dec_norm_o(m, il, which, T);
    return rc ? rc : dec_residual(m, T);
}

int dec_residual(struct dray_model *m, uint32_t T)
{
    struct dray_add_args args = {.a = dec_at(m->a.x, 0), .b = dec_at(m->a.o, 0), .out = dec_at(m->a.x, 0),
                                 .n = (uint64_t)T * m->info.n_embd};
    return m->dev->ops->add(m->dev->ctx, &args);
}
