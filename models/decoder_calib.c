/* Outlier calibration of the decoder: the score layout, the picks, the
 * calibration pass and re-preparing the weights with their outlier channels. */
#include "decoder_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

/* Input width of each layer matmul in the whole model (a tensor parallel
 * slice's scores sit inside it), and the width of a calibration score row. */
uint32_t dec_mm_k(const struct dray_model *m, int which)
{
    const uint32_t ks[MM_COUNT] = {m->info.n_embd, m->info.n_head * m->info.head_dim, m->info.n_embd,
                                   m->info.n_ff};
    return ks[which];
}

/* The widest score row (sizes the host copy of an input and the picks). */
static void set_calib_k(struct dray_model *m)
{
    m->calib_k = 0;
    for (int w = 0; w < MM_COUNT; w++)
        m->calib_k = dec_mm_k(m, w) > m->calib_k ? dec_mm_k(m, w) : m->calib_k;
}

/* Scores are keyed by (layer, matmul slot): the row of layer il's matmul
 * `which` holds the largest |x| of each of its own k input channels, rows of
 * a layer in MM_* order, layer after layer, then the head's row (il =
 * n_layer: n_embd wide), then (head norms only) the K maxima. */
size_t dec_calib_row(const struct dray_model *m, uint32_t il, int which)
{
    size_t layer = 0, before = 0;
    for (int w = 0; w < MM_COUNT; w++) {
        before += w < which ? dec_mm_k(m, w) : 0;
        layer += dec_mm_k(m, w);
    }
    return (size_t)il * layer + (il < m->info.n_layer ? before : 0);
}

/* The outlier scores (every row, the head's last), then the K maxima. */
static size_t matmul_scores(const struct dray_model *m)
{
    return dec_calib_row(m, m->info.n_layer, 0) + m->info.n_embd;
}

static size_t calib_count(const struct dray_model *m)
{
    return matmul_scores(m) + (m->head_norms ? (size_t)m->info.n_layer * m->info.head_dim : 0);
}

float *dec_calib_kmax(struct dray_model *m)
{
    return m->calib && m->head_norms ? m->calib + matmul_scores(m) : NULL;
}

/* The loudest n input channels of the score row of (il, which), k wide, into m->pick. */
int dec_pick_outliers(struct dray_model *m, uint32_t il, int which, uint32_t k, uint32_t n, char *err,
                      size_t errlen)
{
    int rc = dray_pick_outliers(m->calib + dec_calib_row(m, il, which), k, n, m->pick);
    return rc ? dray_fail(err, errlen, rc, "calibration: out of memory") : 0;
}

/* Scores from the calibration cache: they must be the size this model's would be. */
int dec_adopt_scores(struct dray_model *m, const struct dray_model_opts *o, char *err,
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

/* The calibration forward pass: ids as one sequence (a fresh one in kv) in one
 * step, recording per-channel |x| maxima into m->calib (dray_model_calib_begin sized
 * the activations for n tokens). */
static int calib_forward(struct dray_model *m, struct dray_kv *kv, const int32_t *ids, uint32_t n,
                         char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    /* the head sees the last rows only: their logits are computed and dropped */
    uint32_t n_head_rows = n < 16 ? n : 16, rows[16], seq = 0;
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
    rc = dray_kv_step_begin(kv, 1, &seq, &n, err, errlen);
    if (!rc) {
        struct dray_batch b = {.n_tok = n, .ids = ids, .pos = pos, .n_logits = n_head_rows,
                               .logit_rows = rows, .logits = logits};
        rc = dray_model_forward(m, kv, &b, err, errlen);
        if (rc)
            dray_kv_step_abort(kv);
        else
            dray_kv_step_end(kv);
    }
    dray_kv_seq_free(kv, seq);
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
 * columns are read for all n_vocab outputs on every step (docs/performance.md).
 * A separate output matrix is re-prepared with them; a
 * tied one keeps the embedding table and gets f32 columns beside it. */
int dec_calib_head(struct dray_model *m, uint32_t n_outlier, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    uint32_t no = n_outlier / 2 < in->n_embd / 8 ? n_outlier / 2 : in->n_embd / 8;
    int rc = dec_pick_outliers(m, in->n_layer, 0, in->n_embd, no, err, errlen);
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

/* Re-prepare every layer matmul of this part in int8 with the outlier channels
 * picked from m->calib, then the head. */
static int calib_apply(struct dray_model *m, char *err, size_t errlen)
{
    int rc = 0;
    for (uint32_t il = m->l0; !rc && il < m->l1; il++)
        for (int w = 0; !rc && w < MM_COUNT; w++) {
            dray_weight_release(m->dev, dec_layer_matrix(&m->layer[il], w));
            rc = dec_load_layer_matrix_picked(m, il, w, DRAY_I8, err, errlen);
            if (!rc) /* as many as the weight took (a tensor parallel slice: its share) */
                log_outliers(il, w, m->pick, dec_layer_matrix(&m->layer[il], w)->n_outlier);
        }
    return rc || !m->has_head ? rc : dec_calib_head(m, m->n_outlier, err, errlen);
}

/* Mixed precision without scheduling overhead: a few input channels of each
 * matmul carry activations far larger than the rest (norm weights and massive
 * activations), and one of them sets the per-token int8 scale of all the others.
 * Calibration finds those channels once, on a short text; the matmul op then
 * keeps them in f32 inside the same kernel, so there is no second op.
 *
 * Begin: the score buffers, and activations for n tokens when the model was
 * prepared for fewer (a small --chunk must not cut the text). */
int dray_model_calib_begin(struct dray_model *m, uint32_t n, uint32_t n_outlier, bool smooth_k, char *err,
                    size_t errlen)
{
    m->calib_outliers = n_outlier && m->wdtype == DRAY_I8;
    m->calib_smooth = smooth_k && m->head_norms; /* the factors live in the head norms */
    m->calib_on = (m->calib_outliers || m->calib_smooth) && !m->calib;
    if (!m->calib_on)
        return 0; /* nothing to do, or prepared from cached scores already */
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "calibration: no tokens");
    m->calib_max_batch = m->max_batch;
    set_calib_k(m);
    m->calib = calloc(calib_count(m), sizeof(float));
    m->calib_host = malloc((size_t)n * (m->calib_k > m->qkv_dim ? m->calib_k : m->qkv_dim) * sizeof(float));
    m->pick = malloc(m->calib_k * sizeof(int32_t));
    m->n_outlier = m->calib_outliers ? n_outlier : 0;
    if (!m->calib || !m->calib_host || !m->pick)
        return dray_fail(err, errlen, DRAY_ENOMEM, "calibration: out of memory");
    if (n > m->max_batch) {
        m->max_batch = n;
        return dec_alloc_acts(m, err, errlen);
    }
    return 0;
}

/* End: when the pass went well, the K smoothing and the weights with their
 * outlier channels; the activations back to max_batch either way. */
int dray_model_calib_end(struct dray_model *m, bool ok, char *err, size_t errlen)
{
    if (!m->calib_on)
        return 0;
    m->calib_on = false;
    int rc = ok ? 0 : DRAY_EINVAL;
    if (!rc && m->calib_smooth)
        rc = dec_kv_smooth_apply(m, err, errlen);
    if (!rc && m->calib_outliers)
        rc = calib_apply(m, err, errlen);
    dec_account(m);
    free(m->calib_host);
    m->calib_host = NULL;
    if (m->max_batch != m->calib_max_batch) {
        m->max_batch = m->calib_max_batch;
        int rc2 = dec_alloc_acts(m, rc ? NULL : err, rc ? 0 : errlen);
        rc = rc ? rc : rc2;
    }
    if (rc) { /* K smoothing alone keeps its scores too: the cache hands them out */
        free(m->calib);
        m->calib = NULL;
    }
    dray_weight_scratch_free(); /* the layers are prepared again */
    return ok ? rc : DRAY_EINVAL;
}

int dray_model_calibrate(struct dray_model *m, struct dray_kv *kv, const int32_t *ids, uint32_t n,
                  uint32_t n_outlier, bool smooth_k, char *err, size_t errlen)
{
    int rc = dray_model_calib_begin(m, n, n_outlier, smooth_k, err, errlen);
    if (rc || !m->calib_on) {
        if (rc)
            dray_model_calib_end(m, false, NULL, 0);
        return rc;
    }
    rc = calib_forward(m, kv, ids, n, err, errlen);
    int rc2 = dray_model_calib_end(m, rc == 0, rc ? NULL : err, rc ? 0 : errlen);
    return rc ? rc : rc2;
}

size_t dray_model_calib_scores(const struct dray_model *m, const float **scores)
{
    *scores = m->calib;
    return m->calib ? calib_count(m) : 0;
}
