/* The shared decoder-only transformer (see decoder.h): loading, activations, the
 * building blocks of a layer, the forward step, and outlier calibration. */
#include "decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "caps.h"
#include "dray/backend_util.h"
#include "error.h"
#include "hparams.h"
#include "log.h"

/* ------------------------------------------------------------ hyper-parameters */

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
    if (!rc) rc = dray_hparam_u32(g, A, "attention.head_count_kv", 1, DRAY_HP_MAX_HEADS, NULL,
                                  &in->n_kv_head, err, errlen);
    /* GQA: every kv head serves the same number of query heads */
    if (!rc) rc = dray_hparam_divides(g, A, "attention.head_count_kv", in->n_kv_head,
                                      "attention.head_count", in->n_head, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "context_length", 1, DRAY_HP_MAX_CONTEXT, NULL,
                                  &in->n_ctx_train, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, A, "attention.layer_norm_rms_epsilon", 1e-12f, 1.0f, NULL,
                                  &m->eps, err, errlen);
    if (rc)
        return rc;
    for (uint32_t il = 0; il < in->n_layer; il++)
        in->share_kv[il] = -1;
    struct dray_str name;
    if (!dray_gguf_get_str(g, "general.name", &name, NULL, 0))
        snprintf(in->name, sizeof(in->name), "%.*s", (int)(name.len > 127 ? 127 : name.len), name.ptr);
    return 0;
}

/* ------------------------------------------------------------------- weights */

static const struct dray_gguf_tensor *find_tensor(struct dray_gguf *g, int il, const char *what,
                                                  const char *suffix, bool required, char *err,
                                                  size_t errlen)
{
    char name[96];
    if (il < 0)
        snprintf(name, sizeof(name), "%s.%s", what, suffix);
    else
        snprintf(name, sizeof(name), "blk.%d.%s.%s", il, what, suffix);
    const struct dray_gguf_tensor *t = dray_gguf_find_tensor(g, name);
    if (!t && required)
        dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: tensor %s is missing", dray_gguf_name(g), name);
    return t;
}

static int check_shape(struct dray_gguf *g, const struct dray_gguf_tensor *t, uint64_t ne0,
                       uint64_t ne1, char *err, size_t errlen)
{
    if (t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1)
        return 0;
    return dray_fail(err, errlen, DRAY_EFORMAT, "%s: tensor %s has shape [%llu, %llu], expected [%llu, %llu]",
                     dray_gguf_name(g), t->name, (unsigned long long)t->ne[0],
                     (unsigned long long)t->ne[1], (unsigned long long)ne0, (unsigned long long)ne1);
}

static int load_vector(struct dray_model *m, int il, const char *what, uint32_t n,
                       struct dray_buf **out, char *err, size_t errlen)
{
    const struct dray_gguf_tensor *t = find_tensor(m->g, il, what, "weight", true, err, errlen);
    if (!t)
        return DRAY_ENOTFOUND;
    return dray_vector_prepare(m->dev, t, n, out, err, errlen);
}

/* The precision whose weights dtype stands for here: DRAY_F32, DRAY_I8, or the
 * grouped precisions' DRAY_Q8G32 (int8g) and DRAY_Q4G32 (w4a8). */
static enum dray_precision precision_of(uint32_t dtype)
{
    return dtype == DRAY_F32     ? DRAY_PRECISION_F32
           : dtype == DRAY_Q8G32 ? DRAY_PRECISION_INT8G
           : dtype == DRAY_Q4G32 ? DRAY_PRECISION_W4A8
                                 : DRAY_PRECISION_INT8;
}

/* Stack named weights of layer il along the output dimension into one matmul;
 * pair_hd as in dray_weight_prepare_pairs (NULL = none). */
static int load_matrix(struct dray_model *m, int il, const char *const *names, const uint32_t *rows,
                       const uint32_t *pair_hd, uint32_t n, uint32_t k, struct dray_weight *w,
                       uint32_t dtype, const int32_t *outliers, uint32_t n_outlier, char *err,
                       size_t errlen)
{
    const struct dray_gguf_tensor *parts[4];
    for (uint32_t i = 0; i < n; i++) {
        parts[i] = find_tensor(m->g, il, names[i], "weight", true, err, errlen);
        if (!parts[i])
            return DRAY_ENOTFOUND;
        int rc = check_shape(m->g, parts[i], k, rows[i], err, errlen);
        if (rc)
            return rc;
    }
    return dray_weight_prepare_pairs(m->dev, parts, n, pair_hd, precision_of(dtype), DRAY_WROLE_MATMUL,
                                     outliers, n_outlier, w, err, errlen);
}

static int load_layer_matrix(struct dray_model *m, uint32_t il, int which, uint32_t dtype,
                             const int32_t *outliers, uint32_t n_outlier, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    struct dec_layer *L = &m->layer[il];
    static const char *const qkv[] = {"attn_q", "attn_k", "attn_v"};
    static const char *const gate_up[] = {"ffn_gate", "ffn_up"};
    static const char *const o[] = {"attn_output"}, *const down[] = {"ffn_down"};
    const uint32_t qkv_rows[] = {m->q_dim, m->kv_dim, m->kv_dim};
    const uint32_t gu_rows[] = {in->n_ff, in->n_ff};
    const uint32_t hd = m->rope_unpermute ? in->head_dim : 0, pairs[] = {hd, hd, 0};
    switch (which) {
    case MM_QKV:
        return load_matrix(m, (int)il, qkv, qkv_rows, pairs, 3, in->n_embd, &L->wqkv, dtype, outliers, n_outlier, err, errlen);
    case MM_O:
        return load_matrix(m, (int)il, o, &in->n_embd, NULL, 1, m->q_dim, &L->wo, dtype, outliers, n_outlier, err, errlen);
    case MM_GU:
        return load_matrix(m, (int)il, gate_up, gu_rows, NULL, 2, in->n_embd, &L->wgu, dtype, outliers, n_outlier, err, errlen);
    default:
        return load_matrix(m, (int)il, down, &in->n_embd, NULL, 1, in->n_ff, &L->wdown, dtype, outliers, n_outlier, err, errlen);
    }
}

static struct dray_weight *layer_matrix(struct dec_layer *L, int which)
{
    struct dray_weight *w[MM_COUNT] = {&L->wqkv, &L->wo, &L->wgu, &L->wdown};
    return w[which];
}

/* Biases of Q|K|V stacked like the weight rows (Q and K reordered the same way),
 * or none: all three present or all absent. */
static int load_qkv_bias(struct dray_model *m, uint32_t il, char *err, size_t errlen)
{
    static const char *const names[] = {"attn_q", "attn_k", "attn_v"};
    const uint32_t n[] = {m->q_dim, m->kv_dim, m->kv_dim};
    const struct dray_gguf_tensor *t[3];
    int found = 0;
    for (int i = 0; i < 3; i++)
        found += (t[i] = find_tensor(m->g, (int)il, names[i], "bias", false, err, errlen)) != NULL;
    if (found == 0)
        return 0;
    if (found < 3)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: layer %u has only some of the q/k/v biases",
                         dray_gguf_name(m->g), il);
    float *v = malloc((size_t)m->qkv_dim * sizeof(float)), *row = malloc((size_t)m->q_dim * sizeof(float));
    int rc = v && row ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    for (uint32_t i = 0, off = 0; i < 3 && !rc; off += n[i++]) {
        if (dray_gguf_tensor_nelems(t[i]) != n[i]) {
            rc = dray_fail(err, errlen, DRAY_EFORMAT, "tensor %s: expected %u elements", t[i]->name, n[i]);
            break;
        }
        rc = dray_dequant_row(t[i]->type, t[i]->data, row, n[i]);
        uint32_t hd = m->rope_unpermute && i < 2 ? m->info.head_dim : 0;
        for (uint32_t r = 0; !rc && r < n[i]; r++)
            v[off + r] = row[dray_rope_pair_row(r, hd)];
        if (rc)
            dray_fail(err, errlen, rc, "tensor %s: type %u cannot be dequantized", t[i]->name, t[i]->type);
    }
    if (!rc)
        rc = m->dev->ops->alloc(m->dev->ctx, (size_t)m->qkv_dim * 4, &m->layer[il].bqkv);
    if (!rc)
        rc = m->dev->ops->upload(m->dev->ctx, (struct dray_view){m->layer[il].bqkv, 0}, v, (size_t)m->qkv_dim * 4);
    free(v);
    free(row);
    return rc;
}

/* ------------------------------------------------------------------- outlier picks */

/* Input width of each layer matmul, and the width of a calibration score row. */
static uint32_t mm_k(const struct dray_model *m, int which)
{
    const uint32_t ks[MM_COUNT] = {m->info.n_embd, m->q_dim, m->info.n_embd, m->info.n_ff};
    return ks[which];
}

static void set_calib_k(struct dray_model *m)
{
    m->calib_k = m->info.n_embd > m->q_dim ? m->info.n_embd : m->q_dim;
    m->calib_k = m->info.n_ff > m->calib_k ? m->info.n_ff : m->calib_k;
}

/* The outlier scores, then (models with head norms) the K maxima. */
static size_t matmul_scores(const struct dray_model *m)
{
    return ((size_t)m->info.n_layer * MM_COUNT + 1) * m->calib_k;
}

static size_t calib_count(const struct dray_model *m)
{
    return matmul_scores(m) + (m->head_norms ? (size_t)m->info.n_layer * m->info.head_dim : 0);
}

float *dec_calib_kmax(struct dray_model *m)
{
    return m->calib && m->head_norms ? m->calib + matmul_scores(m) : NULL;
}

/* The loudest n input channels of score row `slot` (k wide) into m->pick. */
static int pick_outliers(struct dray_model *m, size_t slot, uint32_t k, uint32_t n, char *err,
                         size_t errlen)
{
    int rc = dray_pick_outliers(m->calib + slot * m->calib_k, k, n, m->pick);
    return rc ? dray_fail(err, errlen, rc, "calibration: out of memory") : 0;
}

/* Layer matmul `which` of layer il, in int8 with its outlier channels when there
 * are scores to pick them from. */
static int load_layer_matrix_picked(struct dray_model *m, uint32_t il, int which, uint32_t dtype,
                                    char *err, size_t errlen)
{
    uint32_t k = mm_k(m, which), no = m->n_outlier < k / 8 ? m->n_outlier : k / 8;
    if (!m->calib || dtype != DRAY_I8 || !no)
        return load_layer_matrix(m, il, which, dtype, NULL, 0, err, errlen);
    int rc = pick_outliers(m, (size_t)il * MM_COUNT + (size_t)which, k, no, err, errlen);
    return rc ? rc : load_layer_matrix(m, il, which, dtype, m->pick, no, err, errlen);
}

static int load_layer(struct dray_model *m, uint32_t il, uint32_t dtype, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    struct dec_layer *L = &m->layer[il];
    int rc = load_vector(m, (int)il, "attn_norm", in->n_embd, &L->attn_norm, err, errlen);
    if (!rc) rc = load_vector(m, (int)il, "ffn_norm", in->n_embd, &L->ffn_norm, err, errlen);
    if (!rc && m->head_norms) rc = load_vector(m, (int)il, "attn_q_norm", in->head_dim, &L->q_norm, err, errlen);
    if (!rc && m->head_norms) rc = load_vector(m, (int)il, "attn_k_norm", in->head_dim, &L->k_norm, err, errlen);
    if (!rc && m->post_norms) rc = load_vector(m, (int)il, "post_attention_norm", in->n_embd, &L->post_attn_norm, err, errlen);
    if (!rc && m->post_norms) rc = load_vector(m, (int)il, "post_ffw_norm", in->n_embd, &L->post_ffw_norm, err, errlen);
    if (!rc && m->biases_allowed) rc = load_qkv_bias(m, il, err, errlen);
    if (!rc && m->biases_allowed) {
        const struct dray_gguf_tensor *bo = find_tensor(m->g, (int)il, "attn_output", "bias", false, err, errlen);
        if (bo)
            rc = dray_vector_prepare(m->dev, bo, in->n_embd, &L->bo, err, errlen);
    }
    for (int w = 0; w < MM_COUNT && !rc; w++)
        rc = load_layer_matrix_picked(m, il, w, dtype, err, errlen);
    return rc;
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
}

/* Activations for steps of up to m->max_batch tokens (any held before are freed). */
static int alloc_acts(struct dray_model *m, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    const struct dray_ops *ops = m->dev->ops;
    size_t T = m->max_batch;
    free_acts(m);
    struct { struct dray_buf **buf; size_t bytes; } want[] = {
        {&m->a.x, T * in->n_embd * 4},     {&m->a.h, T * in->n_embd * 4},
        {&m->a.qkv, T * m->qkv_dim * 4},   {&m->a.att, T * m->q_dim * 4},
        {&m->a.o, T * in->n_embd * 4},     {&m->a.gu, T * 2 * in->n_ff * 4},
        {&m->a.mid, T * in->n_ff * 4},     {&m->a.meta, T * 2 * 4},
        {&m->a.xl, DEC_LOGIT_SLAB * in->n_embd * 4},
        {&m->a.logits, (size_t)DEC_LOGIT_SLAB * in->n_vocab * 4},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        int rc = ops->alloc(m->dev->ctx, want[i].bytes, want[i].buf);
        if (rc)
            return dray_fail(err, errlen, rc, "device memory for activations (%zu bytes) on %s: %s",
                             want[i].bytes, ops->name, ops->last_error(m->dev->ctx));
    }
    m->meta_host = malloc(T * 2 * sizeof(int32_t));
    return m->meta_host ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
}

void dec_free(struct dray_model *m)
{
    if (!m)
        return;
    struct dray_device *dev = m->dev;
    free_acts(m);
    dec_rescore_free(m);
    for (uint32_t il = 0; m->layer && il < m->info.n_layer; il++) {
        struct dec_layer *L = &m->layer[il];
        struct dray_buf *v[] = {L->attn_norm, L->q_norm, L->k_norm, L->post_attn_norm,
                                L->ffn_norm, L->post_ffw_norm, L->bqkv, L->bo};
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
            if (v[i])
                dev->ops->free(dev->ctx, v[i]);
        for (int w = 0; w < MM_COUNT; w++)
            dray_weight_release(dev, layer_matrix(L, w));
    }
    dray_weight_release(dev, &m->embd);
    dray_weight_release(dev, &m->output);
    if (m->gids)
        dev->ops->free(dev->ctx, m->gids);
    free(m->gids_host);
    if (m->output_norm)
        dev->ops->free(dev->ctx, m->output_norm);
    free(m->layer);
    free(m->calib);
    free(m->calib_host);
    free(m->pick);
    free(m);
}

static uint64_t weight_bytes(const struct dray_weight *w)
{
    if (w->packed) /* what the device says it holds */
        return w->packed_bytes;
    return (uint64_t)w->n_out * dray_util_wrow_bytes(w->dtype, w->k) +
           (uint64_t)w->n_out * dray_util_wscale_floats(w->dtype, w->k) * 4 +
           (uint64_t)w->n_outlier * (w->n_out + 1) * 4;
}

/* Parameter count and device bytes of the prepared weights. */
static void account(struct dray_model *m)
{
    struct dray_model_info *in = &m->info;
    in->weight_bytes = weight_bytes(&m->embd) + weight_bytes(&m->output) + in->n_embd * 4ull;
    in->n_params = (uint64_t)in->n_vocab * in->n_embd * (m->output.n_out && !m->head_copy ? 2 : 1) + in->n_embd;
    uint64_t vec = 2ull * in->n_embd + (m->head_norms ? 2ull * in->head_dim : 0) +
                   (m->post_norms ? 2ull * in->n_embd : 0);
    for (uint32_t il = 0; il < in->n_layer; il++) {
        for (int w = 0; w < MM_COUNT; w++) {
            const struct dray_weight *mw = layer_matrix(&m->layer[il], w);
            in->weight_bytes += weight_bytes(mw);
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
    in->step_weight_bytes = in->weight_bytes - (m->output.n_out ? weight_bytes(&m->embd) : 0);
    const struct dray_weight *head = m->output.n_out ? &m->output : &m->embd;
    in->head = m->rescore.max                ? "4-bit rescored"
               : head->dtype == DRAY_Q4G32 || head->dtype == DRAY_Q4G32H ? "4-bit groups"
               : head->dtype == DRAY_Q8G32   ? "8-bit groups"
               : head->dtype == DRAY_I8      ? "int8"
                                             : "f32";
    if (m->rescore.max) /* its group rows (codes, scales, ids) and its f32 copy, written and read */
        in->rescore_bytes = in->n_embd + in->n_embd / 8 + m->embd_groups * 4ull + 2ull * in->n_embd * 4;
}

/* Two-pass activations in the output head too (model opts two_pass), unless the
 * head holds more weight bytes than all layers together: then it is most of a
 * decode step's reads, and its second pass is not free (Gemma 3 270M, a 189 MB
 * Q8G32 head against about 100 MB of layers: +12-19% CPU per decode step at 1
 * thread), while a smaller head pays for itself (SmolLM2-135M, 32 MB against
 * 80 MB: mean KL on GPL-3 0.0015 with two passes there, 0.0024 with one). */
static bool head_two_pass(const struct dray_model *m)
{
    uint64_t layers = 0;
    for (uint32_t il = 0; il < m->info.n_layer; il++)
        for (int w = 0; w < MM_COUNT; w++)
            layers += weight_bytes(layer_matrix(&m->layer[il], w));
    return m->two_pass && weight_bytes(m->output.n_out ? &m->output : &m->embd) <= layers;
}

/* Whether the device declares dtype for the op (ABI v2 caps, or v1's props). */
static bool dev_runs(const struct dray_model *m, int op, uint32_t dtype)
{
    return dray_caps_runs(&m->dev->caps, op, dtype);
}

/* The head's precision (config head_precision, head_rescore), for grouped
 * weights only. A head tied to an 8-bit embedding table (table8) can be 4-bit
 * and rescored: its own 4-bit copy is read in full each step, and the most likely
 * tokens of each row get their logits from the 8-bit table again
 * (head_rescore.c). w4a8 takes the 4-bit head, rescored where it can be (a
 * separate output.weight wider than 4 bits is rounded: lossy). auto takes it
 * where it costs no accuracy that matters: rescored, and with one-pass
 * activations, whose own error the rescored head's tail noise hardly adds to
 * (Gemma 3 270M, mean KL against f32 on GPL-3: 0.00298 rescored vs 0.00302 with
 * the 8-bit head); with two-pass activations the 8-bit head, since there the
 * tail noise adds 23-39% to a much smaller KL (issue 11 allows 10%). Sets
 * *rescore to the most candidates per row (0 = none). */
static enum dray_wrole head_role(const struct dray_model *m, uint32_t dtype, bool tied, bool table8,
                                  const struct dray_model_opts *o, uint32_t *rescore)
{
    *rescore = 0;
    if (!dray_util_grouped(dtype) || !dev_runs(m, DRAY_OP_MATMUL, DRAY_Q4G32))
        return DRAY_WROLE_MATMUL; /* plugins without the 4-bit matmul keep the 8-bit head */
    if (tied && table8 && dev_runs(m, DRAY_OP_MATMUL, DRAY_F32))
        *rescore = o->head_rescore;
    if (o->head_precision == DRAY_HEAD_W4A8 ||
        (o->head_precision == DRAY_HEAD_AUTO && *rescore && !m->two_pass))
        return DRAY_WROLE_HEAD4;
    *rescore = 0;
    return DRAY_WROLE_MATMUL;
}

/* Whether the weight policy makes token_embd an 8-bit grouped table under
 * dtype (dray_wformat_pick: whole groups of 32, 4-bit only where the file is). */
static bool table_is_q8g(const struct dray_gguf_tensor *te, uint32_t dtype)
{
    return dray_util_grouped(dtype) && te->ne[0] % 32 == 0 &&
           (dtype == DRAY_Q8G32 || !dray_ggml_is_4bit(te->type));
}

/* token_embd, and output.weight when the family uses a separate head. */
static int load_embeddings(struct dray_model *m, uint32_t dtype, const struct dray_model_opts *o,
                           char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    struct dray_gguf *g = m->g;
    const struct dray_gguf_tensor *te = find_tensor(g, -1, "token_embd", "weight", true, err, errlen);
    if (!te)
        return DRAY_ENOTFOUND;
    if (te->n_dims != 2 || te->ne[0] != in->n_embd || te->ne[1] == 0 || te->ne[1] > INT32_MAX) {
        int rc = check_shape(g, te, in->n_embd, te->ne[1], err, errlen);
        return rc ? rc : dray_fail(err, errlen, DRAY_EFORMAT, "%s: token_embd has a bad vocabulary size",
                                   dray_gguf_name(g));
    }
    in->n_vocab = (uint32_t)te->ne[1];
    const struct dray_gguf_tensor *out = find_tensor(g, -1, "output", "weight", false, err, errlen);
    if (out && !m->output_allowed) {
        dray_warn("%s: has output.weight; %s ties the output to token_embd, using token_embd",
                  dray_gguf_name(g), m->fam->arch);
        out = NULL;
    }
    /* a 4-bit head: the head is the bulk of a decode step's weight bytes (Gemma 3
     * 270M: 189 of 296 MB in 8-bit groups, 126 MB in 4-bit ones) */
    /* the EMBED op gathers 8- and 4-bit grouped tables, not 5-bit ones: a 5-bit
     * table (Q5_0, Q5_1) becomes 8-bit groups */
    uint32_t tdtype = dtype == DRAY_Q4G32 && dray_ggml_is_5bit(te->type) ? DRAY_Q8G32 : dtype;
    bool table8 = table_is_q8g(te, tdtype);
    uint32_t rescore = 0;
    enum dray_wrole hd = head_role(m, dtype, !out, table8, o, &rescore);
    enum dray_precision prec = precision_of(dtype);
    /* A tied head with its own 4-bit copy leaves the 8-bit table to gathers
     * only (the embedding, the rescored candidates): group rows, so a gathered
     * row reads its own bytes. Otherwise the table may be the head itself, and
     * calibration gives it outlier channels without changing it
     * (dray_weight_set_outliers). */
    m->head_copy = !out && hd == DRAY_WROLE_HEAD4 && table8;
    int rc = dray_weight_prepare(m->dev, &te, 1, prec, m->head_copy ? DRAY_WROLE_GROUP_ROWS : DRAY_WROLE_TABLE,
                                 NULL, 0, &m->embd, err, errlen);
    if (!rc && m->head_copy)
        m->embd_groups = in->n_embd / 32;
    if (!rc && out) {
        rc = check_shape(g, out, in->n_embd, in->n_vocab, err, errlen);
        if (!rc)
            rc = dray_weight_prepare(m->dev, &out, 1, prec, hd, NULL, 0, &m->output, err, errlen);
    }
    if (!rc && m->head_copy)
        rc = dray_weight_prepare(m->dev, &te, 1, prec, hd, NULL, 0, &m->output, err, errlen);
    if (!rc && m->head_copy && rescore)
        rc = dec_rescore_init(m, rescore, o->head_rescore_tail, err, errlen);
    if (!rc)
        rc = load_vector(m, -1, "output_norm", in->n_embd, &m->output_norm, err, errlen);
    return rc;
}

static int calib_head(struct dray_model *m, uint32_t n_outlier, char *err, size_t errlen);

/* Scores from the calibration cache: they must be the size this model's would be. */
static int adopt_scores(struct dray_model *m, const struct dray_model_opts *o, char *err,
                        size_t errlen)
{
    set_calib_k(m);
    if (o->n_calib_scores != calib_count(m))
        return dray_fail(err, errlen, DRAY_EFORMAT, /* engine.c: calibrate instead */
                         "calibration scores: %zu given, this model has %zu", o->n_calib_scores,
                         calib_count(m));
    m->calib = malloc(calib_count(m) * sizeof(float));
    m->pick = malloc(m->calib_k * sizeof(int32_t));
    if (!m->calib || !m->pick)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    memcpy(m->calib, o->calib_scores, calib_count(m) * sizeof(float));
    m->n_outlier = o->outlier_channels; /* 0 unless int8 weights: K smoothing alone */
    return 0;
}

int dec_load(const struct dec_family *fam, struct dray_gguf *g, struct dray_device *dev,
             const struct dray_model_opts *o, struct dray_model **out, char *err, size_t errlen)
{
    struct dray_model *m = calloc(1, sizeof(*m));
    *out = NULL;
    if (!m)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    m->fam = fam;
    m->dev = dev;
    m->g = g;
    m->info.arch = fam->arch;
    struct dray_model_info *in = &m->info;
    int rc = common_hparams(m, g, err, errlen);
    if (!rc) {
        m->layer = calloc(in->n_layer, sizeof(*m->layer));
        rc = m->layer ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    }
    if (!rc)
        rc = fam->hparams(m, g, err, errlen);
    if (rc)
        goto fail;
    m->q_dim = in->n_head * in->head_dim;
    m->kv_dim = in->n_kv_head * in->head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    m->attn_scale = 1.0f / sqrtf((float)in->head_dim);
    m->max_batch = o->max_batch ? o->max_batch : 512;
    m->two_pass = o->two_pass;
    /* grouped: W4A8 asks for 4-bit, which weight preparation turns into Q8G32 for
     * tensors that are not 4-bit in the file */
    uint32_t dtype = o->precision == DRAY_PRECISION_F32     ? DRAY_F32
                     : o->precision == DRAY_PRECISION_INT8G ? DRAY_Q8G32
                     : o->precision == DRAY_PRECISION_W4A8  ? DRAY_Q4G32
                                                            : DRAY_I8;
    rc = load_embeddings(m, dtype, o, err, errlen);
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
        rc = adopt_scores(m, o, err, errlen);
        if (!outliers)
            m->n_outlier = 0;
        layer_dtype = dtype;
    }
    for (uint32_t il = 0; !rc && il < in->n_layer; il++) {
        if (o->progress && isatty(2))
            fprintf(stderr, "\rdray: preparing weights (%s): layer %u/%u", dtype == DRAY_I8 ? "int8" : "f32",
                    il + 1, in->n_layer);
        rc = load_layer(m, il, layer_dtype, err, errlen);
    }
    if (o->progress && isatty(2))
        fprintf(stderr, "\n");
    if (!rc && m->calib && layer_dtype == DRAY_I8 && m->n_outlier)
        rc = calib_head(m, m->n_outlier, err, errlen);
    if (!rc && m->calib && o->smooth_k && m->head_norms)
        rc = dec_kv_smooth_apply(m, err, errlen);
    if (!rc)
        rc = alloc_acts(m, err, errlen);
    if (rc)
        goto fail;
    account(m);
    m->head_two_pass = head_two_pass(m);
    *out = m;
    return 0;
fail:
    dec_free(m);
    return rc;
}

const struct dray_model_info *dec_info(const struct dray_model *m)
{
    return &m->info;
}

/* ------------------------------------------------------------------- blocks */

struct dray_view dec_at(struct dray_buf *b, size_t floats)
{
    return (struct dray_view){b, floats * 4};
}

static int matmul(struct dray_model *m, struct dray_view x, uint32_t stride_x,
                  const struct dray_weight *w, struct dray_view out, uint32_t stride_out, uint32_t n_tok)
{
    struct dray_matmul_args a = {
        .x = x, .w = {w->w, 0}, .wscale = {w->scale, 0}, .out = out,
        .outlier_idx = {w->outlier_idx, 0}, .outlier_w = {w->outlier_w, 0}, .n_outlier = w->n_outlier,
        .n_tok = n_tok, .n_out = w->n_out, .k = w->k,
        .stride_x = stride_x, .stride_out = stride_out,
        /* grouped weights with two-pass activations when asked (backend.h); the
         * head only when it is not the bulk of a step (head_two_pass) */
        .wdtype = w->packed ? DRAY_PACKED : w->dtype, .packed = w->packed,
        .passes = (w == &m->embd || w == &m->output ? m->head_two_pass : m->two_pass) ? 2u : 1u,
    };
    return m->dev->ops->matmul(m->dev->ctx, &a);
}

/* While calibrating, remember the largest |x| of every input channel of a layer
 * matmul (x: [T] rows of stride floats, k used): the largest value is what sets a
 * token's int8 scale. Costs nothing otherwise. */
static int observe(struct dray_model *m, uint32_t il, int which, struct dray_buf *x, uint32_t stride,
                   uint32_t k, uint32_t T)
{
    if (!m->calib_host) /* only while calibrating: the scores outlive it */
        return 0;
    int rc = m->dev->ops->download(m->dev->ctx, m->calib_host, (struct dray_view){x, 0}, (size_t)T * stride * 4);
    float *amax = m->calib + ((size_t)il * MM_COUNT + (size_t)which) * m->calib_k;
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

static int rmsnorm(struct dray_model *m, struct dray_view x, uint32_t stride_x, struct dray_buf *w,
                   struct dray_view out, uint32_t stride_out, uint32_t n_tok, uint32_t n_head, uint32_t n)
{
    struct dray_rmsnorm_args a = {
        .x = x, .w = {w, 0}, .out = out, .n_tok = n_tok, .n_head = n_head, .n = n,
        .stride_x = stride_x, .stride_out = stride_out, .eps = m->eps,
    };
    return m->dev->ops->rmsnorm(m->dev->ctx, &a);
}

/* h = rmsnorm(x, w) over the hidden state */
static int norm_x(struct dray_model *m, struct dray_buf *w, uint32_t T)
{
    uint32_t d = m->info.n_embd;
    return rmsnorm(m, dec_at(m->a.x, 0), d, w, dec_at(m->a.h, 0), d, T, 1, d);
}

int dec_attn_input(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    uint32_t d = m->info.n_embd;
    int rc = norm_x(m, L->attn_norm, T);
    if (!rc) rc = observe(m, il, MM_QKV, m->a.h, d, d, T);
    if (!rc) rc = matmul(m, dec_at(m->a.h, 0), d, &L->wqkv, dec_at(m->a.qkv, 0), m->qkv_dim, T);
    if (!rc) rc = add_bias(m, m->a.qkv, m->qkv_dim, L->bqkv, m->qkv_dim, T);
    return rc;
}

int dec_qk_norms(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    const struct dray_model_info *in = &m->info;
    struct dray_view q = dec_at(m->a.qkv, 0), k = dec_at(m->a.qkv, m->q_dim);
    int rc = rmsnorm(m, q, m->qkv_dim, L->q_norm, q, m->qkv_dim, T, in->n_head, in->head_dim);
    if (!rc)
        rc = rmsnorm(m, k, m->qkv_dim, L->k_norm, k, m->qkv_dim, T, in->n_kv_head, in->head_dim);
    if (!rc)
        rc = dec_kv_smooth_observe(m, il, T);
    return rc;
}

static int rope(struct dray_model *m, struct dray_view x, uint32_t n_head, uint32_t n_tok, float base)
{
    struct dray_rope_args a = {
        .x = x, .pos = {m->a.meta, (size_t)m->max_batch * 4}, .n_tok = n_tok, .n_head = n_head,
        .head_dim = m->info.head_dim, .n_rot = m->info.head_dim, .stride = m->qkv_dim,
        .base = base, .freq_scale = 1.0f,
    };
    return m->dev->ops->rope(m->dev->ctx, &a);
}

int dec_rope_qk(struct dray_model *m, uint32_t il, uint32_t T)
{
    float base = m->layer[il].rope_base;
    int rc = rope(m, dec_at(m->a.qkv, 0), m->info.n_head, T, base);
    return rc ? rc : rope(m, dec_at(m->a.qkv, m->q_dim), m->info.n_kv_head, T, base);
}

int dec_attend(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    const struct dray_ops *ops = m->dev->ops;
    const struct dray_kv_layer_step *s = dray_kv_layer(kv, il);
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
        .n_tok = T, .n_seq = s->n_seq, .n_head = m->info.n_head, .max_kv_len = s->max_kv_len,
        .stride_q = m->qkv_dim, .stride_out = m->q_dim, .window = m->layer[il].window, .scale = m->attn_scale,
    };
    return ops->attention(m->dev->ctx, &a);
}

int dec_attn_output(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    uint32_t d = m->info.n_embd;
    int rc = observe(m, il, MM_O, m->a.att, m->q_dim, m->q_dim, T);
    if (!rc) rc = matmul(m, dec_at(m->a.att, 0), m->q_dim, &L->wo, dec_at(m->a.o, 0), d, T);
    if (!rc) rc = add_bias(m, m->a.o, d, L->bo, d, T);
    return rc;
}

int dec_ffn(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    uint32_t d = m->info.n_embd, ff = m->info.n_ff;
    int rc = norm_x(m, L->ffn_norm, T);
    if (!rc) rc = observe(m, il, MM_GU, m->a.h, d, d, T);
    if (!rc) rc = matmul(m, dec_at(m->a.h, 0), d, &L->wgu, dec_at(m->a.gu, 0), 2 * ff, T);
    struct dray_gated_act_args g = {
        .gate = dec_at(m->a.gu, 0), .up = dec_at(m->a.gu, ff), .out = dec_at(m->a.mid, 0), .n_tok = T,
        .n = ff, .stride_gate = 2 * ff, .stride_up = 2 * ff, .stride_out = ff, .act = m->act,
    };
    if (!rc) rc = m->dev->ops->gated_act(m->dev->ctx, &g);
    if (!rc) rc = observe(m, il, MM_DOWN, m->a.mid, ff, ff, T);
    if (!rc) rc = matmul(m, dec_at(m->a.mid, 0), ff, &L->wdown, dec_at(m->a.o, 0), d, T);
    return rc;
}

int dec_norm_o(struct dray_model *m, struct dray_buf *w, uint32_t T)
{
    uint32_t d = m->info.n_embd;
    return rmsnorm(m, dec_at(m->a.o, 0), d, w, dec_at(m->a.o, 0), d, T, 1, d);
}

int dec_residual(struct dray_model *m, uint32_t T)
{
    struct dray_add_args args = {.a = dec_at(m->a.x, 0), .b = dec_at(m->a.o, 0), .out = dec_at(m->a.x, 0),
                                 .n = (uint64_t)T * m->info.n_embd};
    return m->dev->ops->add(m->dev->ctx, &args);
}

/* ------------------------------------------------------------------- forward */

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
            rc = rmsnorm(m, dec_at(m->a.xl, 0), in->n_embd, m->output_norm, dec_at(m->a.xl, 0), in->n_embd, n, 1, in->n_embd);
        if (!rc)
            rc = observe(m, in->n_layer, 0, m->a.xl, in->n_embd, in->n_embd, n); /* the head's slot */
        if (!rc)
            rc = matmul(m, dec_at(m->a.xl, 0), in->n_embd, head, dec_at(m->a.logits, 0), in->n_vocab, n);
        if (!rc)
            rc = ops->download(ctx, b->logits + (size_t)r0 * in->n_vocab, dec_at(m->a.logits, 0),
                               (size_t)n * in->n_vocab * 4);
        if (!rc && m->rescore.max)
            rc = dec_rescore(m, n, b->logits + (size_t)r0 * in->n_vocab);
        if (rc)
            return rc;
    }
    return 0;
}

int dec_forward(struct dray_model *m, struct dray_kv *kv, const struct dray_batch *b, char *err,
                size_t errlen)
{
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const struct dray_model_info *in = &m->info;
    uint32_t T = b->n_tok;
    int rc;
    if (T == 0 || T > m->max_batch)
        return dray_fail(err, errlen, DRAY_EINVAL, "forward: %u tokens, this model was prepared for 1..%u",
                         T, m->max_batch);
    for (uint32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] >= T)
            return dray_fail(err, errlen, DRAY_EINVAL, "forward: logit row %u of %u tokens", b->logit_rows[i], T);
    memcpy(m->meta_host, b->ids, T * sizeof(int32_t));
    memcpy(m->meta_host + m->max_batch, b->pos, T * sizeof(int32_t));
    rc = ops->upload(ctx, dec_at(m->a.meta, 0), m->meta_host, (size_t)m->max_batch * 2 * 4);

    /* x = embed(ids) * embd_scale */
    if (!rc)
        rc = dec_embed(m, b->ids, dec_at(m->a.meta, 0), T, dec_at(m->a.x, 0), m->embd_scale);
    for (uint32_t il = 0; !rc && il < in->n_layer; il++)
        rc = m->fam->layer(m, kv, il, T);
    if (!rc && b->n_logits)
        rc = output_logits(m, b);
    if (rc)
        return dray_fail(err, errlen, rc, "forward on %s: %s", m->dev->plugin->name, ops->last_error(ctx));
    return 0;
}

/* ------------------------------------------------------------------- calibration */

/* The calibration forward pass: ids as one sequence (a fresh one in kv) in one
 * step, recording per-channel |x| maxima into m->calib. The activations are
 * resized to n tokens for the step when the model was prepared for fewer (a small
 * --chunk must not cut the text), then back to max_batch. */
static int calib_forward(struct dray_model *m, struct dray_kv *kv, const int32_t *ids, uint32_t n,
                         char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    /* the head sees the last rows only: their logits are computed and dropped */
    uint32_t n_head_rows = n < 16 ? n : 16, rows[16], seq = 0, max_batch = m->max_batch;
    float *logits = malloc((size_t)n_head_rows * in->n_vocab * sizeof(float));
    int32_t *pos = malloc(n * sizeof(int32_t));
    int rc = logits && pos ? dray_kv_seq_new(kv, &seq) : DRAY_ENOMEM;
    if (rc) {
        dray_fail(err, errlen, rc, "calibration: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        pos[i] = (int32_t)i;
    for (uint32_t i = 0; i < n_head_rows; i++)
        rows[i] = n - n_head_rows + i;
    if (n > max_batch) {
        m->max_batch = n;
        rc = alloc_acts(m, err, errlen);
    }
    if (!rc)
        rc = dray_kv_step_begin(kv, 1, &seq, &n, err, errlen);
    if (!rc) {
        struct dray_batch b = {.n_tok = n, .ids = ids, .pos = pos, .n_logits = n_head_rows,
                               .logit_rows = rows, .logits = logits};
        rc = dec_forward(m, kv, &b, err, errlen);
        if (rc)
            dray_kv_step_abort(kv);
        else
            dray_kv_step_end(kv);
    }
    dray_kv_seq_free(kv, seq);
    if (m->max_batch != max_batch) {
        m->max_batch = max_batch;
        int rc2 = alloc_acts(m, rc ? NULL : err, rc ? 0 : errlen);
        rc = rc ? rc : rc2;
    }
out:
    free(pos);
    free(logits);
    return rc;
}

static void log_outliers(uint32_t il, int which, const int32_t *pick, uint32_t no)
{
    if (dray_log_get_level() < DRAY_LOG_DEBUG)
        return;
    char list[512];
    size_t len = 0;
    for (uint32_t j = 0; j < no && len < sizeof(list) - 8; j++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, " %d", pick[j]);
    dray_debug("layer %u matmul %d outlier channels:%s", il, which, list);
}

/* The head gets half as many outlier channels as a layer matmul: its f32
 * columns are read for all n_vocab outputs on every step (32 channels would add
 * 12% to a decode step). A separate output matrix is re-prepared with them; a
 * tied one keeps the embedding table and gets f32 columns beside it. */
static int calib_head(struct dray_model *m, uint32_t n_outlier, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    uint32_t no = n_outlier / 2 < in->n_embd / 8 ? n_outlier / 2 : in->n_embd / 8;
    int rc = pick_outliers(m, (size_t)in->n_layer * MM_COUNT, in->n_embd, no, err, errlen);
    if (rc)
        return rc;
    if (m->output.n_out) {
        const struct dray_gguf_tensor *t = dray_gguf_find_tensor(m->g, "output.weight");
        dray_weight_release(m->dev, &m->output);
        return t ? dray_weight_prepare(m->dev, &t, 1, DRAY_PRECISION_INT8, DRAY_WROLE_MATMUL, m->pick, no,
                                       &m->output, err, errlen)
                 : DRAY_ENOTFOUND;
    }
    const struct dray_gguf_tensor *te = dray_gguf_find_tensor(m->g, "token_embd.weight");
    return te ? dray_weight_set_outliers(m->dev, te, m->pick, no, &m->embd, err, errlen)
              : DRAY_ENOTFOUND;
}

/* Re-prepare every layer matmul in int8 with the outlier channels picked from
 * m->calib, then the head. */
static int calib_apply(struct dray_model *m, char *err, size_t errlen)
{
    int rc = 0;
    for (uint32_t il = 0; !rc && il < m->info.n_layer; il++)
        for (int w = 0; !rc && w < MM_COUNT; w++) {
            dray_weight_release(m->dev, layer_matrix(&m->layer[il], w));
            rc = load_layer_matrix_picked(m, il, w, DRAY_I8, err, errlen);
            if (!rc)
                log_outliers(il, w, m->pick, m->n_outlier < mm_k(m, w) / 8 ? m->n_outlier : mm_k(m, w) / 8);
        }
    return rc ? rc : calib_head(m, m->n_outlier, err, errlen);
}

/* Mixed precision without scheduling overhead: a few input channels of each
 * matmul carry activations far larger than the rest (norm weights and massive
 * activations), and one of them sets the per-token int8 scale of all the others.
 * Calibration finds those channels once, on a short text; the matmul op then
 * keeps them in f32 inside the same kernel, so there is no second op. */
int dec_calibrate(struct dray_model *m, struct dray_kv *kv, const int32_t *ids, uint32_t n,
                  uint32_t n_outlier, bool smooth_k, char *err, size_t errlen)
{
    bool outliers = n_outlier && m->embd.dtype == DRAY_I8;
    smooth_k = smooth_k && m->head_norms; /* the factors live in the head norms */
    if ((!outliers && !smooth_k) || m->calib)
        return 0; /* nothing to do, or prepared from cached scores already */
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "calibration: no tokens");
    set_calib_k(m);
    m->calib = calloc(calib_count(m), sizeof(float));
    m->calib_host = malloc((size_t)n * (m->calib_k > m->qkv_dim ? m->calib_k : m->qkv_dim) * sizeof(float));
    m->pick = malloc(m->calib_k * sizeof(int32_t));
    m->n_outlier = outliers ? n_outlier : 0;
    int rc = m->calib && m->calib_host && m->pick ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "calibration: out of memory");
    if (!rc)
        rc = calib_forward(m, kv, ids, n, err, errlen);
    if (!rc && smooth_k)
        rc = dec_kv_smooth_apply(m, err, errlen);
    if (!rc && outliers)
        rc = calib_apply(m, err, errlen);
    account(m);
    free(m->calib_host);
    m->calib_host = NULL;
    if (rc) { /* K smoothing alone keeps its scores too: the cache hands them out */
        free(m->calib);
        m->calib = NULL;
    }
    return rc;
}

size_t dec_calib_scores(const struct dray_model *m, const float **scores)
{
    *scores = m->calib;
    return m->calib ? calib_count(m) : 0;
}
