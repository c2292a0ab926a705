/* K smoothing for the int8 KV cache. The cache stores each token's k per head
 * with one scale, max|k|/127, so a few channels that are always loud (Gemma's k
 * norm weights make some) leave the others only a few int8 steps. Scaling k's
 * channel c by 1/s_c and q's by s_c leaves every score q.k unchanged; with
 * s_c = amax_c / max amax (calibrated) every channel spans the full int8 range
 * and the quantization error of channel c reaches the score multiplied by s_c <= 1.
 * The factors are folded into the per-head q and k norm weights, so decoding costs
 * nothing more. They are equal on the two channels of each NEOX RoPE pair (c and
 * c + head_dim/2), so they commute with the rotation that comes between the norm
 * and the cache. Models without head norms are left alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "decoder.h"
#include "error.h"
#include "log.h"

/* Channels quieter than this fraction of the loudest are not boosted further:
 * a channel silent on the calibration text must not be amplified without end. */
#define SMOOTH_FLOOR (1.0f / 16.0f)

int dec_kv_smooth_observe(struct dray_model *m, uint32_t il, uint32_t T)
{
    float *kmax = dec_calib_kmax(m);
    if (!m->calib_host || !kmax) /* only while calibrating */
        return 0;
    const struct dray_model_info *in = &m->info;
    int rc = m->dev->ops->download(m->dev->ctx, m->calib_host, (struct dray_view){m->a.qkv, 0},
                                   (size_t)T * m->qkv_dim * 4);
    float *amax = kmax + (size_t)il * in->head_dim;
    for (uint32_t t = 0; !rc && t < T; t++)
        for (uint32_t c = 0; c < m->kv_dim; c++) {
            float a = fabsf(m->calib_host[(size_t)t * m->qkv_dim + m->q_dim + c]);
            uint32_t ch = c % in->head_dim;
            amax[ch] = a > amax[ch] ? a : amax[ch];
        }
    return rc;
}

/* w[i] * s[i]^power into buf (the norm weight as the file has it, rescaled). */
static int upload_scaled(struct dray_model *m, uint32_t il, const char *what, const float *s, int power,
                         struct dray_buf *buf, char *err, size_t errlen)
{
    char name[64];
    uint32_t n = m->info.head_dim;
    snprintf(name, sizeof(name), "blk.%u.%s.weight", il, what);
    const struct dray_gguf_tensor *t = dray_gguf_find_tensor(m->g, name);
    float *w = malloc(n * sizeof(float));
    int rc = t && w ? dray_dequant_row(t->type, t->data, w, n) : DRAY_ENOTFOUND;
    for (uint32_t i = 0; !rc && i < n; i++)
        w[i] = power > 0 ? w[i] * s[i] : w[i] / s[i];
    if (rc) {
        free(w);
        return dray_fail(err, errlen, rc, "K smoothing: reading %s failed", name);
    }
    rc = m->dev->ops->upload(m->dev->ctx, (struct dray_view){buf, 0}, w, (size_t)n * 4);
    free(w);
    return rc ? dray_fail(err, errlen, rc, "K smoothing: re-uploading %s to %s: %s", name, m->dev->ops->name,
                          m->dev->ops->last_error(m->dev->ctx))
              : 0;
}

int dec_kv_smooth_apply(struct dray_model *m, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    uint32_t hd = in->head_dim, half = hd / 2;
    float *s = malloc(hd * sizeof(float));
    int rc = s ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "K smoothing: out of memory");
    const float *kmax = dec_calib_kmax(m);
    for (uint32_t il = m->l0; !rc && kmax && il < m->l1; il++) {
        const float *a = kmax + (size_t)il * hd;
        float top = 0;
        for (uint32_t c = 0; c < hd; c++)
            top = a[c] > top ? a[c] : top;
        if (top <= 0)
            continue;
        for (uint32_t c = 0; c < half; c++) {
            float p = (a[c] > a[c + half] ? a[c] : a[c + half]) / top;
            s[c] = s[c + half] = p > SMOOTH_FLOOR ? p : SMOOTH_FLOOR;
        }
        rc = upload_scaled(m, il, "attn_q_norm", s, 1, m->layer[il].vec[DEC_Q_NORM], err, errlen);
        if (!rc)
            rc = upload_scaled(m, il, "attn_k_norm", s, -1, m->layer[il].vec[DEC_K_NORM], err, errlen);
        /* a read of a few bytes maps a whole folio of the file: give it back */
        dray_gguf_release(m->g, dray_gguf_bytes(m->g), dray_gguf_file_size(m->g));
    }
    free(s);
    return rc;
}
