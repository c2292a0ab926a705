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
        snprintf(name, sizeof(name), "%s%s%s", what, suffix ? "." : "", suffix ? suffix : "");
    else
        snprintf(name, sizeof(name), "blk.%d.%s%s%s", il, what, suffix ? "." : "", suffix ? suffix : "");
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

/* The file's rows of each part of layer matmul `which` and its input width. */
uint32_t dec_matrix_shape(const struct dray_model *m, int which, uint32_t *rows, uint32_t *k)
{
    const struct dray_model_info *in = &m->info;
    const uint32_t q = in->n_head * in->head_dim, kv = in->n_kv_head * in->head_dim; /* the file's */
    switch (which) {
    case MM_QKV: rows[0] = q, rows[1] = rows[2] = kv, *k = in->n_embd; return 3;
    case MM_O: rows[0] = in->n_embd, *k = q; return 1;
    case MM_GU: rows[0] = rows[1] = in->n_ff, *k = in->n_embd; return 2;
    default: rows[0] = in->n_embd, *k = in->n_ff; return 1;
    }
}

/* Part i of layer matmul `which` as the file has it: its own tensor, or rows of
 * the family's fused tensor (whole rows of blocks, so a view is exact). */
static int matrix_part(struct dray_model *m, uint32_t il, int which, uint32_t i, const uint32_t *rows,
                       uint32_t k, struct dray_gguf_tensor *out, char *err, size_t errlen)
{
    const struct dec_slot *fu = dec_family_slot(m->fam, DEC_S_MAT_FUSED, which, 0);
    const struct dray_gguf_tensor *t = fu ? dec_find_tensor(m->g, (int)il, fu->name, NULL, false, err, errlen) : NULL;
    if (t) {
        uint32_t n = which == MM_QKV ? 3 : which == MM_GU ? 2 : 1, total = 0, r0 = 0;
        for (uint32_t j = 0; j < n; j++)
            total += rows[j], r0 += j < i ? rows[j] : 0;
        int rc = dec_check_shape(m->g, t, k, total, err, errlen);
        if (!rc)
            dec_cut_rows(t, r0, rows[i], out);
        return rc;
    }
    const struct dec_slot *sl = dec_family_slot(m->fam, DEC_S_MAT, which, (int)i);
    t = sl ? dec_find_tensor(m->g, (int)il, sl->name, NULL, true, err, errlen) : NULL;
    if (!sl)
        return dray_fail(err, errlen, DRAY_EINVAL, "%s: family %s has no part %u of matmul %d", dray_gguf_name(m->g),
                         m->fam->arch, i, which);
    int rc = !t ? DRAY_ENOTFOUND : dec_check_shape(m->g, t, k, rows[i], err, errlen);
    if (!rc)
        *out = *t;
    return rc;
}

/* Layer matmul `which`: its parts stacked along the output dimension (cut to
 * this rank's slice under tensor parallel), Q and K rows reordered for NEOX
 * RoPE when the family stores them in pairs. */
static int load_layer_matrix(struct dray_model *m, uint32_t il, int which, uint32_t dtype,
                             const int32_t *outliers, uint32_t n_outlier, char *err, size_t errlen)
{
    struct dray_gguf_tensor file[3], cut[3];
    const struct dray_gguf_tensor *parts[3];
    void *bufs[3] = {0};
    uint32_t rows[3], k;
    const uint32_t n = dec_matrix_shape(m, which, rows, &k);
    const uint32_t hd = m->rope_unpermute ? m->info.head_dim : 0, pairs[] = {hd, hd, 0};
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        rc = matrix_part(m, il, which, i, rows, k, &file[i], err, errlen);
        if (!rc)
            rc = dec_tp_cut(m, which, i, &file[i], &cut[i], &bufs[i], err, errlen);
        parts[i] = &cut[i];
    }
    if (!rc)
        rc = dray_weight_prepare_pairs(m->dev, parts, n, which == MM_QKV ? pairs : NULL, dec_precision_of(dtype),
                                       DRAY_WROLE_MATMUL, outliers, n_outlier, dec_layer_matrix(&m->layer[il], which),
                                       err, errlen);
    for (uint32_t i = 0; i < n; i++)
        free(bufs[i]);
    return rc;
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
    const uint32_t hd0 = m->info.head_dim, q = m->info.n_head * hd0, kv = m->info.n_kv_head * hd0;
    const uint32_t n[] = {q, kv, kv}, local[] = {m->q_dim, m->kv_dim, m->kv_dim};
    const uint32_t first[] = {m->tp.head0 * hd0, m->tp.kv0 * hd0, m->tp.kv0 * hd0};
    const struct dray_gguf_tensor *t[3];
    int found = 0;
    for (int i = 0; i < 3; i++) {
        const struct dec_slot *sl = dec_family_slot(m->fam, DEC_S_BIAS, MM_QKV, i);
        found += (t[i] = sl ? dec_find_tensor(m->g, (int)il, sl->name, NULL, false, err, errlen) : NULL) != NULL;
    }
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
    int rc = dec_pick_outliers(m, il, which, k, no, err, errlen);
    no = rc ? 0 : dec_tp_local_picks(m, which, no);
    return rc ? rc : load_layer_matrix(m, il, which, dtype, no ? m->pick : NULL, no, err, errlen);
}

uint32_t dec_vec_len(const struct dray_model *m, const struct dec_slot *s)
{
    const struct dray_model_info *in = &m->info;
    switch (s->dim) {
    case DEC_DIM_HEAD: return in->head_dim;
    case DEC_DIM_Q: return in->n_head * in->head_dim;
    case DEC_DIM_KV: return in->n_kv_head * in->head_dim;
    default: return in->n_embd;
    }
}

/* Every tensor of layer il its family's slots name: the vectors, the biases,
 * the four matmuls. */
int dec_load_layer(struct dray_model *m, uint32_t il, uint32_t dtype, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    struct dec_layer *L = &m->layer[il];
    int rc = 0;
    for (const struct dec_slot *s = m->fam->slots; s->name && !rc; s++) {
        if (s->kind != DEC_S_VEC)
            continue;
        const struct dray_gguf_tensor *t = dec_find_tensor(m->g, (int)il, s->name, NULL, s->required, err, errlen);
        if (t)
            rc = dray_vector_prepare(m->dev, t, dec_vec_len(m, s), &L->vec[s->role], err, errlen);
        else if (s->required)
            rc = DRAY_ENOTFOUND;
    }
    const struct dec_slot *bo = dec_family_slot(m->fam, DEC_S_BIAS, MM_O, 0);
    if (!rc && dec_family_slot(m->fam, DEC_S_BIAS, MM_QKV, 0))
        rc = load_qkv_bias(m, il, err, errlen);
    if (!rc && bo && m->tp_rank == 0) { /* a row split's bias: added once */
        const struct dray_gguf_tensor *t = dec_find_tensor(m->g, (int)il, bo->name, NULL, false, err, errlen);
        if (t)
            rc = dray_vector_prepare(m->dev, t, in->n_embd, &L->bo, err, errlen);
    }
    for (int w = 0; w < MM_COUNT && !rc; w++)
        rc = dec_load_layer_matrix_picked(m, il, w, dtype, err, errlen);
    return rc;
}

uint64_t dec_weight_bytes(const struct dray_weight *w)
{
    uint64_t parts = 0;
    for (uint32_t i = 0; i < w->n_split; i++)
        parts += dec_weight_bytes(&w->split[i]);
    if (w->n_split)
        return parts;
    if (w->packed) /* what the device says it holds */
        return w->packed_bytes;
    return (uint64_t)w->n_out * dray_util_wrow_bytes(w->dtype, w->k) +
           (uint64_t)w->n_out * dray_util_wscale_floats(w->dtype, w->k) * 4 +
           (uint64_t)w->n_outlier * (w->n_out + 1) * 4;
}

/* The shape a slot's tensor must have in this model: [ne0, ne1]. */
static void slot_shape(const struct dray_model *m, const struct dec_slot *s, uint64_t *ne0, uint64_t *ne1)
{
    const struct dray_model_info *in = &m->info;
    uint32_t rows[3], k, n;
    *ne1 = 1;
    switch (s->kind) {
    case DEC_S_VEC: *ne0 = dec_vec_len(m, s); return;
    case DEC_S_MAT:
    case DEC_S_MAT_FUSED:
        n = dec_matrix_shape(m, s->role, rows, &k);
        *ne0 = k;
        *ne1 = rows[s->kind == DEC_S_MAT ? s->part : 0];
        for (uint32_t i = 1; s->kind == DEC_S_MAT_FUSED && i < n; i++)
            *ne1 += rows[i];
        return;
    case DEC_S_BIAS:
        n = dec_matrix_shape(m, s->role, rows, &k);
        *ne0 = rows[s->role == MM_QKV ? s->part : 0];
        return;
    case DEC_S_EMBD: case DEC_S_OUTPUT: *ne0 = in->n_embd, *ne1 = 0; return; /* any vocabulary */
    case DEC_S_OUTPUT_NORM: *ne0 = in->n_embd; return;
    case DEC_S_ROPE_FREQS: case DEC_S_ROPE_LONG: case DEC_S_ROPE_SHORT: *ne0 = m->n_rot / 2; return;
    default: *ne0 = 0; return; /* unused: any shape */
    }
}

int dec_check_shapes(const struct dray_model *m, char *err, size_t errlen)
{
    const struct dray_gguf_tensor *embd = NULL;
    for (uint64_t i = 0; i < dray_gguf_n_tensors(m->g); i++) {
        const struct dray_gguf_tensor *t = dray_gguf_tensor_at(m->g, i);
        const struct dec_slot *s = dec_slot_of(m->fam, t->name, m->info.n_layer);
        uint64_t ne0, ne1;
        if (!s || s->kind == DEC_S_UNUSED)
            continue;
        slot_shape(m, s, &ne0, &ne1);
        embd = s->kind == DEC_S_EMBD ? t : embd;
        bool ok = t->ne[0] == ne0 && t->ne[2] == 1 && t->ne[3] == 1 && (ne1 ? t->ne[1] == ne1 : t->ne[1] > 0);
        if (s->kind == DEC_S_OUTPUT && ok && embd && t->ne[1] != embd->ne[1])
            ok = false, ne1 = embd->ne[1];
        if (!ok)
            return dray_fail(err, errlen, DRAY_EFORMAT, "%s: tensor %s has shape [%llu, %llu, %llu, %llu], "
                             "expected [%llu, %s%llu] for this %s model", dray_gguf_name(m->g), t->name,
                             (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                             (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                             (unsigned long long)ne0, ne1 ? "" : "vocabulary ", (unsigned long long)ne1,
                             m->fam->arch);
    }
    return 0;
}
