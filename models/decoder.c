/* The shared decoder-only transformer (see decoder.h): hyper-parameters, the
 * load, activations, freeing and the weight accounting. The rest of the decoder
 * is in decoder_*.c (decoder_internal.h). */
#include "decoder_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "caps.h"
#include "error.h"
#include "hparams.h"

int dec_get_u32(struct dray_model *m, struct dray_gguf *g, const char *key, uint32_t lo, uint32_t hi,
                const uint32_t *dflt, uint32_t *v, char *err, size_t errlen)
{
    return dray_hparam_u32(g, m->fam->arch, key, lo, hi, dflt, v, err, errlen);
}

/* The keys every family has, each range-checked (core/gguf/hparams.c): they size
 * buffers and loops. The family's hook adds the rest. */
static int common_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    const char *A = m->fam->arch;
    int rc = dray_hparam_u32(g, A, "block_count", 1, DRAY_MAX_LAYERS, NULL, &in->n_layer, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "embedding_length", 1, DRAY_HP_MAX_EMBD, NULL, &in->n_embd, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "feed_forward_length", 1, DRAY_HP_MAX_FF, NULL, &in->n_ff, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "attention.head_count", 1, DRAY_HP_MAX_HEADS, NULL, &in->n_head, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "attention.head_count_kv", 1, DRAY_HP_MAX_HEADS, &in->n_head,
                                  &in->n_kv_head, err, errlen); /* absent: one per head, as llama.cpp */
    /* GQA: every kv head serves the same number of query heads */
    if (!rc) rc = dray_hparam_divides(g, A, "attention.head_count_kv", in->n_kv_head,
                                      "attention.head_count", in->n_head, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "context_length", 1, DRAY_HP_MAX_CONTEXT, NULL,
                                  &in->n_ctx_train, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, A, "attention.layer_norm_rms_epsilon", 1e-12f, 1.0f, NULL,
                                  &m->eps, err, errlen);
    if (rc)
        return rc;
    /* a Mixture of Experts file is refused as one, not by its first missing tensor */
    uint32_t experts = 0, none = 0;
    if (!dray_hparam_u32(g, A, "expert_count", 0, UINT32_MAX, &none, &experts, err, errlen) && experts > 0)
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: a Mixture of Experts (%s.expert_count = %u) is not "
                         "supported yet", dray_gguf_name(g), A, experts);
    for (uint32_t il = 0; il < in->n_layer; il++) {
        in->share_kv[il] = -1;
        m->layer[il].rope_on = true;
    }
    struct dray_str name;
    if (!dray_gguf_get_str(g, "general.name", &name, NULL, 0))
        snprintf(in->name, sizeof(in->name), "%.*s", (int)(name.len > 127 ? 127 : name.len), name.ptr);
    return 0;
}

static void free_acts(struct dray_model *m)
{
    struct dray_device *dev = m->dev;
    struct dray_buf **bufs = (struct dray_buf **)&m->a;
    for (size_t i = 0; i < sizeof(m->a) / sizeof(*bufs); i++)
        if (bufs[i])
            dev->ops->free(dev->ctx, bufs[i]);
    memset(&m->a, 0, sizeof(m->a));
    free(m->meta_host);
    m->meta_host = NULL;
    free(m->tp_host);
    m->tp_host = NULL;
}

/* Activations for steps of up to m->max_batch tokens (any held before are freed). */
int dec_alloc_acts(struct dray_model *m, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    const struct dray_ops *ops = m->dev->ops;
    size_t T = m->max_batch;
    free_acts(m);
    struct { struct dray_buf **buf; size_t bytes; } want[] = {
        {&m->a.x, T * in->n_embd * 4},     {&m->a.h, T * in->n_embd * 4},
        {&m->a.qkv, T * m->qkv_dim * 4},   {&m->a.att, T * m->q_dim * 4},
        {&m->a.o, T * in->n_embd * 4},     {&m->a.gu, T * 2 * m->ff_dim * 4},
        {&m->a.mid, T * m->ff_dim * 4},    {&m->a.meta, T * 2 * 4},
        {&m->a.xl, m->has_head ? DEC_LOGIT_SLAB * in->n_embd * 4 : 0}, /* the head's only */
        {&m->a.logits, m->has_head ? (size_t)DEC_LOGIT_SLAB * in->n_vocab * 4 : 0},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        if (!want[i].bytes)
            continue;
        int rc = ops->alloc(m->dev->ctx, want[i].bytes, want[i].buf);
        if (rc)
            return dray_fail(err, errlen, rc, "device memory for activations (%zu bytes) on %s: %s",
                             want[i].bytes, ops->name, ops->last_error(m->dev->ctx));
    }
    m->meta_host = malloc(T * 2 * sizeof(int32_t));
    m->tp_host = m->tp_size > 1 ? malloc(T * in->n_embd * sizeof(float)) : NULL;
    return m->meta_host && (m->tp_size < 2 || m->tp_host) ? 0
                                                           : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
}

void dray_model_free(struct dray_model *m)
{
    if (!m)
        return;
    struct dray_device *dev = m->dev;
    free_acts(m);
    dec_rescore_free(m);
    for (uint32_t il = m->l0; m->layer && il < m->l1; il++) {
        struct dec_layer *L = &m->layer[il];
        for (int i = 0; i < DEC_VEC_COUNT; i++)
            if (L->vec[i])
                dev->ops->free(dev->ctx, L->vec[i]);
        if (L->bqkv)
            dev->ops->free(dev->ctx, L->bqkv);
        if (L->bo)
            dev->ops->free(dev->ctx, L->bo);
        for (int w = 0; w < MM_COUNT; w++)
            dray_weight_release(dev, dec_layer_matrix(L, w));
    }
    dray_weight_release(dev, &m->embd);
    dray_weight_release(dev, &m->output);
    if (m->gids)
        dev->ops->free(dev->ctx, m->gids);
    free(m->gids_host);
    if (m->output_norm)
        dev->ops->free(dev->ctx, m->output_norm);
    if (m->rope_ff)
        dev->ops->free(dev->ctx, m->rope_ff);
    free(m->layer);
    free(m->calib);
    free(m->calib_host);
    free(m->pick);
    free(m);
}

/* Parameter count and device bytes of the prepared weights. */
void dec_account(struct dray_model *m)
{
    struct dray_model_info *in = &m->info;
    in->weight_bytes = in->n_params = 0;
    if (m->has_head) {
        in->weight_bytes = dec_weight_bytes(&m->embd) + dec_weight_bytes(&m->output) + in->n_embd * 4ull;
        in->n_params = (uint64_t)in->n_vocab * in->n_embd * (m->output.n_out && !m->head_copy ? 2 : 1) +
                       in->n_embd;
    }
    for (uint32_t il = m->l0; il < m->l1; il++) {
        uint64_t vec = 0; /* the norms' lengths, from their slots */
        for (int i = 0; i < DEC_VEC_COUNT; i++)
            vec += m->layer[il].vec[i] ? dec_vec_len(m, dec_family_slot(m->fam, DEC_S_VEC, i, 0)) : 0;
        for (int w = 0; w < MM_COUNT; w++) {
            const struct dray_weight *mw = dec_layer_matrix(&m->layer[il], w);
            in->weight_bytes += dec_weight_bytes(mw);
            in->n_params += (uint64_t)mw->n_out * mw->k;
        }
        uint64_t bias = (m->layer[il].bqkv ? m->qkv_dim : 0) + (m->layer[il].bo ? in->n_embd : 0);
        in->n_params += vec + bias;
        in->weight_bytes += (vec + bias) * 4;
    }
    /* a step gathers one embedding row per token, so a table the head does not
     * share is not read in bulk (a rescored head reads some rows of it per row of
     * logits, on top of its own 4-bit copy: rescore_bytes per candidate, the
     * cache lines of its 8-bit row and its f32 copy written and read back) */
    in->step_weight_bytes = in->weight_bytes - (m->output.n_out ? dec_weight_bytes(&m->embd) : 0);
    const struct dray_weight *head = m->output.n_out ? &m->output : &m->embd;
    in->head = m->rescore.max                ? "4-bit rescored"
               : head->dtype == DRAY_Q4G32 || head->dtype == DRAY_Q4G32H ? "4-bit groups"
               : head->dtype == DRAY_Q8G32   ? "8-bit groups"
               : head->dtype == DRAY_Q4K     ? "Q4_K two-level"
               : head->dtype == DRAY_Q5K     ? "Q5_K two-level"
               : head->dtype == DRAY_Q6K     ? "Q6_K two-level"
               : head->dtype == DRAY_I8      ? "int8"
                                             : "f32";
    if (m->rescore.max) /* its group rows (codes, scales, ids) and its f32 copy, written and read */
        in->rescore_bytes = in->n_embd + in->n_embd / 8 + m->embd_groups * 4ull + 2ull * in->n_embd * 4;
}

/* Every hyper-parameter, the tensors claimed, RoPE scaling: all a load knows
 * before it reads a weight (m->dev NULL: only checking the file). */
static int dec_read_hparams(struct dray_model *m, uint32_t n_ctx, char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    const struct dec_family *fam = m->fam;
    uint32_t n_layer = 0;
    int rc = dray_hparam_u32(m->g, fam->arch, "block_count", 1, DRAY_MAX_LAYERS, NULL, &n_layer, err, errlen);
    if (!rc) {
        m->layer = calloc(n_layer, sizeof(*m->layer));
        rc = m->layer ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    }
    if (!rc) rc = common_hparams(m, m->g, err, errlen);
    m->logit_div = m->embd_scale = 1.0f;
    if (!rc) rc = fam->hparams(m, m->g, err, errlen);
    if (rc)
        return rc;
    /* V heads as wide as K heads (one attention kernel), and a rotary part of
     * the head on NEOX families (adjacent pairs are reordered by whole heads) */
    uint32_t v_len = in->head_dim, n_rot = in->head_dim;
    rc = dec_get_u32(m, m->g, "attention.value_length", 1, DRAY_HP_MAX_HEAD_DIM, &v_len, &v_len, err, errlen);
    if (!rc) rc = dec_get_u32(m, m->g, "rope.dimension_count", 2, DRAY_HP_MAX_HEAD_DIM, &n_rot, &n_rot, err, errlen);
    if (rc)
        return rc;
    if (v_len != in->head_dim)
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: %s.attention.value_length %u differs from the key "
                         "length %u: not supported", dray_gguf_name(m->g), fam->arch, v_len, in->head_dim);
    if (n_rot > in->head_dim || n_rot % 2 || (n_rot != in->head_dim && fam->rope_pairs))
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: %s.rope.dimension_count %u: %s (head size %u)",
                         dray_gguf_name(m->g), fam->arch, n_rot,
                         n_rot > in->head_dim || n_rot % 2 ? "not an even part of the head"
                                                           : "partial rotary embeddings are not supported here",
                         in->head_dim);
    m->n_rot = in->n_rot = n_rot;
    m->rope_unpermute = fam->rope_pairs;
    const struct dec_slot *qn = dec_family_slot(fam, DEC_S_VEC, DEC_Q_NORM, 0);
    m->head_norms = qn && qn->dim == DEC_DIM_HEAD;
    rc = dec_claim_keys(fam, m->g, err, errlen);
    if (!rc)
        rc = dec_claim_tensors(fam, m->g, in->n_layer, err, errlen);
    if (!rc)
        rc = dec_check_shapes(m, err, errlen);
    if (!rc)
        rc = dec_rope_scaling(m, n_ctx ? n_ctx : in->n_ctx_train, err, errlen);
    if (!rc && m->dev && (m->attn_softcap > 0.0f) && m->dev->ops->version < 4)
        rc = dray_fail(err, errlen, DRAY_ENOTSUP, "%s: attention soft-capping needs a plugin of ABI version 4; "
                       "plugin %s speaks version %u", dray_gguf_name(m->g), m->dev->ops->name, m->dev->ops->version);
    return rc;
}

int dray_model_check_family(const struct dray_arch *self, struct dray_gguf *g, char *err, size_t errlen)
{
    struct dray_model *m = calloc(1, sizeof(*m));
    if (!m)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    m->fam = self->family;
    m->g = g;
    m->info.arch = m->fam->arch;
    int rc = dec_read_hparams(m, 0, err, errlen);
    free(m->layer);
    free(m);
    return rc;
}

int dray_model_load_family(const struct dray_arch *self, struct dray_gguf *g, struct dray_device *dev,
                           const struct dray_model_opts *o, struct dray_model **out, char *err, size_t errlen)
{
    const struct dec_family *fam = self->family;
    struct dray_model *m = calloc(1, sizeof(*m));
    *out = NULL;
    if (!m)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    m->fam = fam;
    m->dev = dev;
    m->g = g;
    m->info.arch = fam->arch;
    struct dray_model_info *in = &m->info;
    int rc = dec_read_hparams(m, o->n_ctx, err, errlen);
    if (rc)
        goto fail;
    m->l0 = o->part ? o->layer_begin : 0;
    m->l1 = o->part ? o->layer_end : in->n_layer;
    if (m->l0 > m->l1 || m->l1 > in->n_layer) {
        rc = dray_fail(err, errlen, DRAY_EINVAL, "layers %u..%u of a model of %u layers", m->l0, m->l1,
                       in->n_layer);
        goto fail;
    }
    if ((rc = dec_tp_setup(m, o, err, errlen)))
        goto fail;
    const struct dec_slot *qn = dec_family_slot(fam, DEC_S_VEC, DEC_Q_NORM, 0);
    if (m->tp_size > 1 && qn && qn->dim != DEC_DIM_HEAD) { /* a norm over every head needs them all */
        rc = dray_fail(err, errlen, DRAY_ENOTSUP, "%s: tensor parallel cannot cut %s's q/k norms, which span "
                       "every head", dray_gguf_name(g), fam->arch);
        goto fail;
    }
    m->q_dim = m->tp.n_head * in->head_dim; /* this rank's slice under tensor parallel */
    m->kv_dim = m->tp.n_kv * in->head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    if (m->attn_scale == 0.0f) /* the family did not set its own */
        m->attn_scale = 1.0f / sqrtf((float)in->head_dim);
    m->max_batch = o->max_batch ? o->max_batch : 512;
    m->two_pass = o->two_pass;
    /* grouped: W4A8 asks for 4-bit, which weight preparation turns into Q8G32 for
     * tensors that are not 4-bit in the file */
    uint32_t dtype = o->precision == DRAY_PRECISION_F32     ? DRAY_F32
                     : o->precision == DRAY_PRECISION_INT8G ? DRAY_Q8G32
                     : o->precision == DRAY_PRECISION_W4A8  ? DRAY_Q4G32
                                                            : DRAY_I8;
    m->has_head = !o->part || !o->no_head;
    m->wdtype = dtype;
    rc = m->has_head ? dec_load_embeddings(m, dtype, o, err, errlen) : dec_read_vocab(m, err, errlen);
    /* With outlier channels to find, the layers start in f32: calibration then sees
     * the exact activations, so every plugin picks the same channels (an int8
     * calibration pass would carry each plugin's rounding into the choice), and
     * re-prepares them in int8. */
    uint32_t layer_dtype = dtype == DRAY_I8 && o->outlier_channels ? DRAY_F32 : dtype;
    /* ... unless the scores of an earlier calibration are given: then the layers
     * are prepared in int8 with their outlier channels right away, and the K
     * smoothing of an int8 KV is folded in below, whatever the weights */
    bool outliers = dtype == DRAY_I8 && o->outlier_channels;
    if (!rc && o->calib_scores && (outliers || (o->smooth_k && m->head_norms))) {
        rc = dec_adopt_scores(m, o, err, errlen);
        if (!outliers)
            m->n_outlier = 0;
        layer_dtype = dtype;
    }
    for (uint32_t il = m->l0; !rc && il < m->l1; il++) {
        if (o->progress && isatty(2))
            fprintf(stderr, "\rdray: preparing weights (%s): layer %u/%u", dtype == DRAY_I8 ? "int8" : "f32",
                    il + 1, in->n_layer);
        rc = dec_load_layer(m, il, layer_dtype, err, errlen);
        /* its norms' small reads mapped whole folios of the file back in */
        dray_gguf_release(m->g, dray_gguf_bytes(m->g), dray_gguf_file_size(m->g));
    }
    if (o->progress && isatty(2))
        fprintf(stderr, "\n");
    if (!rc && m->has_head && m->calib && layer_dtype == DRAY_I8 && m->n_outlier)
        rc = dec_calib_head(m, m->n_outlier, err, errlen);
    if (!rc && m->calib && o->smooth_k && m->head_norms)
        rc = dec_kv_smooth_apply(m, err, errlen);
    dray_weight_scratch_free(); /* every weight is prepared */
    if (!rc)
        rc = dec_alloc_acts(m, err, errlen);
    if (rc)
        goto fail;
    dec_account(m);
    m->head_two_pass = dec_head_two_pass(m);
    /* the file has been read into the weights: its pages that small reads (norms,
     * biases, K smoothing) mapped back in leave the resident set */
    dray_gguf_release(m->g, dray_gguf_bytes(m->g), dray_gguf_file_size(m->g));
    *out = m;
    return 0;
fail:
    dray_model_free(m);
    return rc;
}

const struct dray_model_info *dray_model_info(const struct dray_model *m)
{
    return &m->info;
}
