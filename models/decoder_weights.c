/* The decoder's tensors into device weights: vectors, stacked layer matmuls
 * (with their outlier channels), the Q|K|V biases. */
#include "decoder_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "dray/backend_util.h"
#include "error.h"

const struct dray_gguf_tensor *dec_find_tensor(struct dray_gguf *g, int il, const char *what,
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

int dec_check_shape(struct dray_gguf *g, const struct dray_gguf_tensor *t, uint64_t ne0,
                    uint64_t ne1, char *err, size_t errlen)
{
    if (t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1)
        return 0;
    return dray_fail(err, errlen, DRAY_EFORMAT, "%s: tensor %s has shape [%llu, %llu], expected [%llu, %llu]",
                     dray_gguf_name(g), t->name, (unsigned long long)t->ne[0],
                     (unsigned long long)t->ne[1], (unsigned long long)ne0, (unsigned long long)ne1);
}

int dec_load_vector(struct dray_model *m, int il, const char *what, uint32_t n,
                    struct dray_buf **out, char *err, size_t errlen)
{
    const struct dray_gguf_tensor *t = dec_find_tensor(m->g, il, what, "weight", true, err, errlen);
    if (!t)
        return DRAY_ENOTFOUND;
    return dray_vector_prepare(m->dev, t, n, out, err, errlen);
}

/* The precision whose weights dtype stands for here: DRAY_F32, DRAY_I8, or the
 * grouped precisions' DRAY_Q8G32 (int8g) and DRAY_Q4G32 (w4a8). */
enum dray_precision dec_precision_of(uint32_t dtype)
{
    return dtype == DRAY_F32     ? DRAY_PRECISION_F32
           : dtype == DRAY_Q8G32 ? DRAY_PRECISION_INT8G
           : dtype == DRAY_Q4G32 ? DRAY_PRECISION_W4A8
                                 : DRAY_PRECISION_INT8;
}

/* Stack named weights of layer il along the output dimension into one matmul
 * (matmul `which`, cut to this rank's slice under tensor parallel); rows and k
 * are the file's shapes, pair_hd as in dray_weight_prepare_pairs (NULL = none). */
static int load_matrix(struct dray_model *m, int il, int which, const char *const *names, const uint32_t *rows,
                       const uint32_t *pair_hd, uint32_t n, uint32_t k, struct dray_weight *w,
                       uint32_t dtype, const int32_t *outliers, uint32_t n_outlier, char *err,
                       size_t errlen)
{
    struct dray_gguf_tensor cut[4];
    const struct dray_gguf_tensor *parts[4];
    void *bufs[4] = {0};
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        const struct dray_gguf_tensor *t = dec_find_tensor(m->g, il, names[i], "weight", true, err, errlen);
        rc = !t ? DRAY_ENOTFOUND : dec_check_shape(m->g, t, k, rows[i], err, errlen);
        if (!rc)
            rc = dec_tp_cut(m, which, i, t, &cut[i], &bufs[i], err, errlen);
        parts[i] = &cut[i];
    }
    if (!rc)
        rc = dray_weight_prepare_pairs(m->dev, parts, n, pair_hd, dec_precision_of(dtype), DRAY_WROLE_MATMUL,
                                       outliers, n_outlier, w, err, errlen);
    for (uint32_t i = 0; i < n; i++)
        free(bufs[i]);
    return rc;
}

static int load_layer_matrix(struct dray_model *m, uint32_t il, int which, uint32_t dtype,
                             const int32_t *outliers, uint32_t n_outlier, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    struct dec_layer *L = &m->layer[il];
    static const char *const qkv[] = {"attn_q", "attn_k", "attn_v"};
    static const char *const gate_up[] = {"ffn_gate", "ffn_up"};
    static const char *const o[] = {"attn_output"}, *const down[] = {"ffn_down"};
    const uint32_t q = in->n_head * in->head_dim, kv = in->n_kv_head * in->head_dim; /* the file's */
    const uint32_t qkv_rows[] = {q, kv, kv};
    const uint32_t gu_rows[] = {in->n_ff, in->n_ff};
    const uint32_t hd = m->rope_unpermute ? in->head_dim : 0, pairs[] = {hd, hd, 0};
    switch (which) {
    case MM_QKV:
        return load_matrix(m, (int)il, which, qkv, qkv_rows, pairs, 3, in->n_embd, &L->wqkv, dtype, outliers, n_outlier, err, errlen);
    case MM_O:
        return load_matrix(m, (int)il, which, o, &in->n_embd, NULL, 1, q, &L->wo, dtype, outliers, n_outlier, err, errlen);
    case MM_GU:
        return load_matrix(m, (int)il, which, gate_up, gu_rows, NULL, 2, in->n_embd, &L->wgu, dtype, outliers, n_outlier, err, errlen);
    default:
        return load_matrix(m, (int)il, which, down, &in->n_embd, NULL, 1, in->n_ff, &L->wdown, dtype, outliers, n_outlier, err, errlen);
    }
}

struct dray_weight *dec_layer_matrix(struct dec_layer *L, int which)
{
    struct dray_weight *w[MM_COUNT] = {&L->wqkv, &L->wo, &L->wgu, &L->wdown};
    return w[which];
}

/* Biases of Q|K|V stacked like the weight rows (Q and K reordered the same way;
 * this rank's heads under tensor parallel), or none: all three present or all
 * absent. */
static int load_qkv_bias(struct dray_model *m, uint32_t il, char *err, size_t errlen)
{
    static const char *const names[] = {"attn_q", "attn_k", "attn_v"};
    const uint32_t hd0 = m->info.head_dim, q = m->info.n_head * hd0, kv = m->info.n_kv_head * hd0;
    const uint32_t n[] = {q, kv, kv}, local[] = {m->q_dim, m->kv_dim, m->kv_dim};
    const uint32_t first[] = {m->tp.head0 * hd0, m->tp.kv0 * hd0, m->tp.kv0 * hd0};
    const struct dray_gguf_tensor *t[3];
    int found = 0;
    for (int i = 0; i < 3; i++)
        found += (t[i] = dec_find_tensor(m->g, (int)il, names[i], "bias", false, err, errlen)) != NULL;
    if (found == 0)
        return 0;
    if (found < 3)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: layer %u has only some of the q/k/v biases",
                         dray_gguf_name(m->g), il);
    float *v = malloc((size_t)m->qkv_dim * sizeof(float)), *row = malloc((size_t)q * sizeof(float));
    int rc = v && row ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    for (uint32_t i = 0, off = 0; i < 3 && !rc; off += local[i++]) {
        if (dray_gguf_tensor_nelems(t[i]) != n[i]) {
            rc = dray_fail(err, errlen, DRAY_EFORMAT, "tensor %s: expected %u elements", t[i]->name, n[i]);
            break;
        }
        rc = dray_dequant_row(t[i]->type, t[i]->data, row, n[i]);
        uint32_t hd = m->rope_unpermute && i < 2 ? m->info.head_dim : 0;
        for (uint32_t r = 0; !rc && r < local[i]; r++) /* pairs stay inside a head: whole heads cut */
            v[off + r] = row[first[i] + dray_rope_pair_row(r, hd)];
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

/* Layer matmul `which` of layer il, in int8 with its outlier channels when there
 * are scores to pick them from. */
int dec_load_layer_matrix_picked(struct dray_model *m, uint32_t il, int which, uint32_t dtype,
                                 char *err, size_t errlen)
{
    uint32_t k = dec_mm_k(m, which), no = m->n_outlier < k / 8 ? m->n_outlier : k / 8;
    if (!m->calib || dtype != DRAY_I8 || !no)
        return load_layer_matrix(m, il, which, dtype, NULL, 0, err, errlen);
    /* picked over the whole row (the one-process choice), then this slice's share */
    int rc = dec_pick_outliers(m, (size_t)il * MM_COUNT + (size_t)which, k, no, err, errlen);
    no = rc ? 0 : dec_tp_local_picks(m, which, no);
    return rc ? rc : load_layer_matrix(m, il, which, dtype, no ? m->pick : NULL, no, err, errlen);
}

int dec_load_layer(struct dray_model *m, uint32_t il, uint32_t dtype, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    struct dec_layer *L = &m->layer[il];
    int rc = dec_load_vector(m, (int)il, "attn_norm", in->n_embd, &L->attn_norm, err, errlen);
    if (!rc) rc = dec_load_vector(m, (int)il, "ffn_norm", in->n_embd, &L->ffn_norm, err, errlen);
    if (!rc && m->head_norms) rc = dec_load_vector(m, (int)il, "attn_q_norm", in->head_dim, &L->q_norm, err, errlen);
    if (!rc && m->head_norms) rc = dec_load_vector(m, (int)il, "attn_k_norm", in->head_dim, &L->k_norm, err, errlen);
    if (!rc && m->post_norms) rc = dec_load_vector(m, (int)il, "post_attention_norm", in->n_embd, &L->post_attn_norm, err, errlen);
    if (!rc && m->post_norms) rc = dec_load_vector(m, (int)il, "post_ffw_norm", in->n_embd, &L->post_ffw_norm, err, errlen);
    if (!rc && m->biases_allowed) rc = load_qkv_bias(m, il, err, errlen);
    if (!rc && m->biases_allowed && m->tp_rank == 0) { /* a row split's bias: added once */
        const struct dray_gguf_tensor *bo = dec_find_tensor(m->g, (int)il, "attn_output", "bias", false, err, errlen);
        if (bo)
            rc = dray_vector_prepare(m->dev, bo, in->n_embd, &L->bo, err, errlen);
    }
    for (int w = 0; w < MM_COUNT && !rc; w++)
        rc = dec_load_layer_matrix_picked(m, il, w, dtype, err, errlen);
    return rc;
}

uint64_t dec_weight_bytes(const struct dray_weight *w)
{
    if (w->packed) /* what the device says it holds */
        return w->packed_bytes;
    return (uint64_t)w->n_out * dray_util_wrow_bytes(w->dtype, w->k) +
           (uint64_t)w->n_out * dray_util_wscale_floats(w->dtype, w->k) * 4 +
           (uint64_t)w->n_outlier * (w->n_out + 1) * 4;
}
