/* The decoder's forward step: embedding, the family's layers, the logits of
 * the wanted rows. */
#include "decoder_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

int dec_embed(struct dray_model *m, const int32_t *ids, struct dray_view ids_dev, uint32_t n,
              struct dray_view out, float scale)
{
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    struct dray_embed_args e = {
        .ids = ids_dev, .table = {m->embd.w, 0}, .row_scale = {m->embd.scale, 0}, .out = out,
        .dtype = m->embd.packed ? DRAY_PACKED : m->embd.dtype, .n_tok = n, .dim = m->info.n_embd,
        .n_rows = m->info.n_vocab, .scale = scale, .packed = m->embd.packed,
    };
    const uint32_t G = m->embd_groups;
    if (G) { /* token id i is group rows i*G .. i*G+G-1, each 32 wide */
        if ((uint64_t)n * G > m->gids_cap) {
            if (m->gids)
                ops->free(ctx, m->gids);
            free(m->gids_host);
            m->gids = NULL;
            m->gids_cap = 0;
            m->gids_host = malloc((size_t)n * G * sizeof(int32_t));
            if (!m->gids_host)
                return DRAY_ENOMEM;
            int rc = ops->alloc(ctx, (size_t)n * G * sizeof(int32_t), &m->gids);
            if (rc)
                return rc;
            m->gids_cap = n * G;
        }
        for (uint32_t j = 0; j < n; j++)
            for (uint32_t g = 0; g < G; g++) /* an id outside the vocabulary stays one: the op refuses it */
                m->gids_host[(size_t)j * G + g] =
                    ids[j] >= 0 && (uint32_t)ids[j] < m->info.n_vocab ? ids[j] * (int32_t)G + (int32_t)g : -1;
        int rc = ops->upload(ctx, (struct dray_view){m->gids, 0}, m->gids_host, (size_t)n * G * sizeof(int32_t));
        if (rc)
            return rc;
        e.ids = (struct dray_view){m->gids, 0};
        e.n_tok = n * G;
        e.dim = 32;
        e.n_rows = m->embd.n_out;
    }
    return ops->embed(ctx, &e);
}

/* The family's last touch on the logits, on the host (a row is read there
 * anyway): divided by logit_div (Granite), then soft-capped (Gemma 2). */
static void shape_logits(const struct dray_model *m, float *l, size_t n)
{
    if (m->logit_div != 1.0f)
        for (size_t i = 0; i < n; i++)
            l[i] /= m->logit_div;
    if (m->final_softcap > 0.0f)
        for (size_t i = 0; i < n; i++)
            l[i] = m->final_softcap * tanhf(l[i] / m->final_softcap);
}

/* logits of the wanted rows, DEC_LOGIT_SLAB rows at a time: gather, norm, head. */
static int output_logits(struct dray_model *m, const struct dray_batch *b)
{
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const struct dray_model_info *in = &m->info;
    const struct dray_weight *head = m->output.n_out ? &m->output : &m->embd;
    for (uint32_t r0 = 0; r0 < b->n_logits; r0 += DEC_LOGIT_SLAB) {
        uint32_t n = b->n_logits - r0 < DEC_LOGIT_SLAB ? b->n_logits - r0 : DEC_LOGIT_SLAB;
        int rc = 0;
        for (uint32_t i = 0; i < n && !rc; i++)
            rc = ops->copy(ctx, dec_at(m->a.xl, (size_t)i * in->n_embd),
                           dec_at(m->a.x, (size_t)b->logit_rows[r0 + i] * in->n_embd), in->n_embd * 4u);
        if (!rc)
            rc = dec_rmsnorm(m, dec_at(m->a.xl, 0), in->n_embd, m->output_norm, dec_at(m->a.xl, 0), in->n_embd, n, 1, in->n_embd);
        if (!rc)
            rc = dec_observe(m, in->n_layer, 0, m->a.xl, in->n_embd, in->n_embd, n); /* the head's slot */
        if (!rc)
            rc = dec_matmul(m, dec_at(m->a.xl, 0), in->n_embd, head, dec_at(m->a.logits, 0), in->n_vocab, n);
        if (!rc)
            rc = ops->download(ctx, b->logits + (size_t)r0 * in->n_vocab, dec_at(m->a.logits, 0),
                               (size_t)n * in->n_vocab * 4);
        if (!rc && m->rescore.max)
            rc = dec_rescore(m, n, b->logits + (size_t)r0 * in->n_vocab);
        if (rc)
            return rc;
        shape_logits(m, b->logits + (size_t)r0 * in->n_vocab, (size_t)n * in->n_vocab);
    }
    return 0;
}

/* Where a part's hidden states come from: the embedding of the ids (the whole
 * step, or a split's first part) or the previous device's x_in. */
static int enter(struct dray_model *m, const struct dray_batch *b)
{
    const struct dray_batch_part *p = b->part;
    if (p && p->x_in)
        return m->dev->ops->upload(m->dev->ctx, dec_at(m->a.x, 0), p->x_in,
                                   (size_t)b->n_tok * m->info.n_embd * 4);
    /* x = embed(ids) * embd_scale */
    return dec_embed(m, b->ids, dec_at(m->a.meta, 0), b->n_tok, dec_at(m->a.x, 0), m->embd_scale);
}

int dray_model_forward(struct dray_model *m, struct dray_kv *kv, const struct dray_batch *b, char *err,
                size_t errlen)
{
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const struct dray_batch_part *p = b->part;
    uint32_t T = b->n_tok, l0 = p ? p->layer_begin : 0, l1 = p ? p->layer_end : m->info.n_layer;
    int rc;
    if (T == 0 || T > m->max_batch)
        return dray_fail(err, errlen, DRAY_EINVAL, "forward: %u tokens, this model was prepared for 1..%u",
                         T, m->max_batch);
    if (l0 > l1 || (l1 > l0 && (l0 < m->l0 || l1 > m->l1)))
        return dray_fail(err, errlen, DRAY_EINVAL, "forward: layers %u..%u, this part holds %u..%u", l0, l1,
                         m->l0, m->l1);
    if (!m->has_head && (!p || !p->x_in || (!p->x_out && b->n_logits)))
        return dray_fail(err, errlen, DRAY_EINVAL, "forward: a part without the head takes x_in and "
                         "gives x_out (the embedding and the logits live with the head)");
    for (uint32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] >= T)
            return dray_fail(err, errlen, DRAY_EINVAL, "forward: logit row %u of %u tokens", b->logit_rows[i], T);
    m->mb = p ? p->mb : 0;
    if (b->ids) /* a part entered from x_in needs no ids (another rank sends none) */
        memcpy(m->meta_host, b->ids, T * sizeof(int32_t));
    else
        memset(m->meta_host, 0, T * sizeof(int32_t));
    memcpy(m->meta_host + m->max_batch, b->pos, T * sizeof(int32_t));
    rc = ops->upload(ctx, dec_at(m->a.meta, 0), m->meta_host, (size_t)m->max_batch * 2 * 4);
    if (!rc)
        rc = enter(m, b);
    for (uint32_t il = l0; !rc && il < l1; il++)
        rc = m->fam->layer(m, kv, il, T);
    if (!rc && p && p->x_out)
        rc = ops->download(ctx, p->x_out, dec_at(m->a.x, 0), (size_t)T * m->info.n_embd * 4);
    else if (!rc && b->n_logits)
        rc = output_logits(m, b);
    if (rc)
        return dray_fail(err, errlen, rc, "forward on %s: %s", m->dev->plugin->name, ops->last_error(ctx));
    return 0;
}
