/* RoPE scaling read from the file, for every family: the keys
 * <arch>.rope.scaling.{type,factor,attn_factor,original_context_length,
 * yarn_*} and the tensors rope_freqs (Llama 3) and rope_factors_long/short
 * (LongRoPE), as llama.cpp reads them (llama-model.cpp, llama-context.cpp).
 *
 * All of them fit the rope op's one form (backend.h, ABI v4):
 *   theta_i = pos * scale * base^(-2i/n_rot) / ff[i],  cos and sin times mscale
 * - linear: scale = 1/factor;
 * - Llama 3: ff = rope_freqs;
 * - LongRoPE: ff = the long factors when the context exceeds the original
 *   one, else the short ones; mscale = attn_factor;
 * - YaRN: ggml blends the interpolated angle (scale theta) with the original
 *   one by a ramp over the pairs, theta (scale (1 - mix_i) + mix_i), which is
 *   ff[i] = scale / (scale (1 - mix_i) + mix_i); mscale = (1 + 0.1 ln factor)
 *   times attn_factor. */
#include "decoder_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hparams.h"

/* "<arch>.<key>" as f32 when present (else *v stays). */
static int opt_f32(struct dray_model *m, const char *key, float lo, float hi, float *v, char *err, size_t errlen)
{
    return dray_hparam_f32(m->g, m->fam->arch, key, lo, hi, v, v, err, errlen);
}

/* ggml_rope_yarn_corr_dim: the pair whose wavelength fits n_rot_turns times into n_ctx. */
static float yarn_corr_dim(uint32_t n_dims, uint32_t n_ctx, float turns, float base)
{
    return (float)n_dims * logf((float)n_ctx / (turns * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

static void yarn_factors(float *ff, uint32_t n_rot, uint32_t n_ctx_orig, float base, float scale,
                         float beta_fast, float beta_slow, float ext_factor)
{
    float lo = floorf(yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, base));
    float hi = ceilf(yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, base));
    lo = lo > 0 ? lo : 0;
    hi = hi < (float)(n_rot - 1) ? hi : (float)(n_rot - 1);
    for (uint32_t i = 0; i < n_rot / 2; i++) {
        float y = ((float)i - lo) / fmaxf(0.001f, hi - lo);
        float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext_factor;
        ff[i] = scale / (scale * (1.0f - mix) + mix);
    }
}

/* A [n_rot/2] tensor of divisors into ff. */
static int read_factors(struct dray_model *m, const struct dray_gguf_tensor *t, float *ff, char *err,
                        size_t errlen)
{
    uint32_t n = m->n_rot / 2;
    if (dray_gguf_tensor_nelems(t) != n || t->ne[0] != n)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: tensor %s has %llu elements, expected %u (rotated dims / 2)",
                         dray_gguf_name(m->g), t->name, (unsigned long long)dray_gguf_tensor_nelems(t), n);
    int rc = dray_dequant_row(t->type, t->data, ff, n);
    if (rc)
        return dray_fail(err, errlen, rc, "%s: tensor %s: type %u cannot be read", dray_gguf_name(m->g), t->name,
                         t->type);
    for (uint32_t i = 0; i < n; i++)
        if (!(ff[i] > 0.0f) || !isfinite(ff[i]))
            return dray_fail(err, errlen, DRAY_EFORMAT, "%s: tensor %s element %u is %g, expected a positive factor",
                             dray_gguf_name(m->g), t->name, i, (double)ff[i]);
    return 0;
}

int dec_rope_scaling(struct dray_model *m, uint32_t n_ctx, char *err, size_t errlen)
{
    const char *A = m->fam->arch;
    struct dray_gguf *g = m->g;
    char key[96];
    struct dray_str type = {"none", 4};
    snprintf(key, sizeof(key), "%s.rope.scaling.type", A);
    bool typed = dray_gguf_get_str(g, key, &type, NULL, 0) == 0;
    float factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f, ext = 1.0f, log_mul = 0.0f;
    uint32_t orig = m->info.n_ctx_train;
    int rc = opt_f32(m, "rope.scaling.factor", 0.0f, 1e6f, &factor, err, errlen);
    if (!rc && factor == 0.0f) /* the old key */
        rc = opt_f32(m, "rope.scale_linear", 0.0f, 1e6f, &factor, err, errlen);
    if (!rc) rc = opt_f32(m, "rope.scaling.attn_factor", 0.0f, 100.0f, &attn_factor, err, errlen);
    if (!rc) rc = opt_f32(m, "rope.scaling.yarn_beta_fast", 0.0f, 1e4f, &beta_fast, err, errlen);
    if (!rc) rc = opt_f32(m, "rope.scaling.yarn_beta_slow", 0.0f, 1e4f, &beta_slow, err, errlen);
    if (!rc) rc = opt_f32(m, "rope.scaling.yarn_ext_factor", 0.0f, 1.0f, &ext, err, errlen);
    if (!rc) rc = opt_f32(m, "rope.scaling.yarn_log_multiplier", -100.0f, 100.0f, &log_mul, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "rope.scaling.original_context_length", 1, DRAY_HP_MAX_CONTEXT, &orig, &orig, err, errlen);
    if (rc)
        return rc;
    /* as llama.cpp: the factor scales every type's angles (0 means none), and
     * no type key means linear */
    float scale = factor > 0.0f ? 1.0f / factor : 1.0f;
    bool linear = !typed || dray_str_eq(type, "linear"), yarn = dray_str_eq(type, "yarn");
    bool longrope = dray_str_eq(type, "longrope");
    if (!linear && !yarn && !longrope && !dray_str_eq(type, "none"))
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: %s = \"%.*s\" is not supported (none, linear, yarn, longrope)",
                         dray_gguf_name(g), key, (int)(type.len > 32 ? 32 : type.len), type.ptr);
    if (yarn && log_mul != 0.0f)
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: %s.rope.scaling.yarn_log_multiplier (DeepSeek's YaRN) is not supported",
                         dray_gguf_name(g), A);
    for (uint32_t il = 0; il < m->info.n_layer; il++)
        if (m->layer[il].rope_scale == 0.0f) /* not set by the family (its SWA layers may keep 1) */
            m->layer[il].rope_scale = scale;

    float *ff = calloc(m->n_rot / 2 + 1, sizeof(float));
    if (!ff)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    bool have_ff = false;
    const struct dray_gguf_tensor *freqs = dray_gguf_find_tensor(g, "rope_freqs.weight");
    const struct dray_gguf_tensor *lng = dray_gguf_find_tensor(g, "rope_factors_long.weight");
    const struct dray_gguf_tensor *sht = dray_gguf_find_tensor(g, "rope_factors_short.weight");
    m->rope_mscale = 1.0f;
    if (freqs) { /* Llama 3: divisors given, on top of any linear scale */
        rc = read_factors(m, freqs, ff, err, errlen);
        have_ff = true;
        m->rope_mscale = attn_factor;
    } else if (longrope || lng || sht) {
        const struct dray_gguf_tensor *t = n_ctx > orig ? lng : sht;
        if (!t)
            rc = dray_fail(err, errlen, DRAY_EFORMAT, "%s: LongRoPE needs tensor %s", dray_gguf_name(g),
                           n_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight");
        else
            rc = read_factors(m, t, ff, err, errlen);
        have_ff = true;
        m->rope_mscale = attn_factor;
    } else if (yarn && scale != 1.0f) {
        float base = m->layer[0].rope_base;
        for (uint32_t il = 1; il < m->info.n_layer; il++)
            if (m->layer[il].rope_base != base) {
                rc = dray_fail(err, errlen, DRAY_ENOTSUP, "%s: YaRN with a RoPE base per layer is not supported",
                               dray_gguf_name(g));
                break;
            }
        if (!rc)
            yarn_factors(ff, m->n_rot, orig, base, scale, beta_fast, beta_slow, ext);
        for (uint32_t il = 0; il < m->info.n_layer; il++)
            m->layer[il].rope_scale = scale; /* ff undoes it where the ramp keeps the original angle */
        have_ff = true;
        m->rope_mscale = (1.0f + 0.1f * logf(1.0f / scale)) * attn_factor;
    } else {
        m->rope_mscale = attn_factor;
    }
    if (!rc && have_ff && m->dev) {
        size_t bytes = (size_t)m->n_rot / 2 * sizeof(float);
        rc = m->dev->ops->alloc(m->dev->ctx, bytes, &m->rope_ff);
        if (!rc)
            rc = m->dev->ops->upload(m->dev->ctx, (struct dray_view){m->rope_ff, 0}, ff, bytes);
        if (rc)
            dray_fail(err, errlen, rc, "device memory for the RoPE factors: %s", m->dev->ops->last_error(m->dev->ctx));
    }
    free(ff);
    /* the op's v4 arguments: an older plugin would drop them in silence */
    if (!rc && m->dev && (have_ff || m->rope_mscale != 1.0f) && m->dev->ops->version < 4)
        rc = dray_fail(err, errlen, DRAY_ENOTSUP,
                       "%s: its RoPE scaling needs a plugin of ABI version 4; plugin %s speaks version %u",
                       dray_gguf_name(g), m->dev->ops->name, m->dev->ops->version);
    return rc;
}
