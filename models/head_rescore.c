/* The rescored output head (see decoder.h, struct dec_rescore): a 4-bit head
 * (DRAY_Q4G32, 2.5 bits/weight cheaper to read than the 8-bit table) computes
 * every logit of a row, then the K largest of them are computed again from the
 * 8-bit table the embedding gather keeps anyway, and replace the 4-bit values.
 *
 * Why this is enough: the 4-bit head's error is noise of a few percent of the
 * logit spread. It matters where the probability is (the top of the row: greedy
 * picks, top-k/top-p sampling, most of a KL divergence), and the true top tokens
 * are among the 4-bit top K unless the noise moves one down by K places. The
 * tail keeps its 4-bit logits: tokens of tiny probability either way.
 *
 * All device work is two ops of the operator table per slab, so every plugin
 * that runs the 4-bit head runs this too: EMBED gathers the K candidate rows of
 * the 8-bit table as F32 (scale 1: the table itself, not Gemma's sqrt(d) input
 * scaling), and one F32 MATMUL per row multiplies the row's normed hidden state
 * by its own K candidate rows. The top-K selection runs on the host over the
 * downloaded logits, which the caller reads there anyway. */
#include "decoder.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

int dec_rescore_init(struct dray_model *m, uint32_t k, char *err, size_t errlen)
{
    struct dec_rescore *r = &m->rescore;
    const struct dray_ops *ops = m->dev->ops;
    const struct dray_model_info *in = &m->info;
    size_t n = (size_t)DEC_LOGIT_SLAB * k;
    r->k = k;
    struct { struct dray_buf **buf; size_t bytes; } want[] = {
        {&r->ids, n * 4}, {&r->rows, n * in->n_embd * 4}, {&r->out, n * 4}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        int rc = ops->alloc(m->dev->ctx, want[i].bytes, want[i].buf);
        if (rc)
            return dray_fail(err, errlen, rc, "device memory for the rescored head (%zu bytes) on %s: %s",
                             want[i].bytes, ops->name, ops->last_error(m->dev->ctx));
    }
    r->ids_host = malloc(n * sizeof(int32_t));
    r->out_host = malloc(n * sizeof(float));
    r->top = malloc(k * sizeof(float));
    if (!r->ids_host || !r->out_host || !r->top)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    return 0;
}

void dec_rescore_free(struct dray_model *m)
{
    struct dec_rescore *r = &m->rescore;
    struct dray_buf *bufs[] = {r->ids, r->rows, r->out};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            m->dev->ops->free(m->dev->ctx, bufs[i]);
    free(r->ids_host);
    free(r->out_host);
    free(r->top);
    memset(r, 0, sizeof(*r));
}

/* The k largest of x[0..n) (k <= n) into idx, largest first (ties: the lower
 * index first; NaN never enters). val is k floats of scratch. Insertion into a
 * sorted list: after the first few thousand values almost every x fails the
 * one compare against the k-th best, so this is one pass at memory speed. */
static void top_k(const float *x, uint32_t n, uint32_t k, int32_t *idx, float *val)
{
    uint32_t have = 0;
    for (uint32_t i = 0; i < n; i++) {
        float v = x[i];
        if (have == k && !(v > val[k - 1]))
            continue;
        if (have < k && v != v)
            continue;
        uint32_t j = have < k ? have++ : k - 1;
        for (; j > 0 && val[j - 1] < v; j--) {
            val[j] = val[j - 1];
            idx[j] = idx[j - 1];
        }
        val[j] = v;
        idx[j] = (int32_t)i;
    }
    for (; have < k; have++) /* only with NaN logits: pad with token 0, harmless */
        idx[have] = 0;
}

int dec_rescore(struct dray_model *m, uint32_t n, float *logits)
{
    struct dec_rescore *r = &m->rescore;
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const uint32_t V = m->info.n_vocab, d = m->info.n_embd, k = r->k;
    for (uint32_t i = 0; i < n; i++)
        top_k(logits + (size_t)i * V, V, k, r->ids_host + (size_t)i * k, r->top);
    int rc = ops->upload(ctx, dec_at(r->ids, 0), r->ids_host, (size_t)n * k * 4);
    /* rows[i*k + j] = table[ids[i*k + j]] as f32, exactly the 8-bit head's weights */
    struct dray_embed_args e = {
        .ids = {r->ids, 0}, .table = {m->embd.w, 0}, .row_scale = {m->embd.scale, 0},
        .out = dec_at(r->rows, 0), .dtype = m->embd.dtype, .n_tok = n * k, .dim = d,
        .n_rows = V, .scale = 1.0f,
    };
    if (!rc)
        rc = ops->embed(ctx, &e);
    for (uint32_t i = 0; i < n && !rc; i++) {
        /* out[i*k .. +k) = rows[i*k .. +k) . xl[i], in f32 (the activations unquantized) */
        struct dray_matmul_args a = {
            .x = dec_at(m->a.xl, (size_t)i * d), .w = dec_at(r->rows, (size_t)i * k * d),
            .out = dec_at(r->out, (size_t)i * k), .n_tok = 1, .n_out = k, .k = d,
            .stride_x = d, .stride_out = k, .wdtype = DRAY_F32,
        };
        rc = ops->matmul(ctx, &a);
    }
    if (!rc)
        rc = ops->download(ctx, r->out_host, dec_at(r->out, 0), (size_t)n * k * 4);
    for (uint32_t i = 0; i < n && !rc; i++)
        for (uint32_t j = 0; j < k; j++)
            logits[(size_t)i * V + (uint32_t)r->ids_host[(size_t)i * k + j]] = r->out_host[(size_t)i * k + j];
    return rc;
}
