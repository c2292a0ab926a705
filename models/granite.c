/*
 * Granite 3.x dense models (general.architecture "granite"): the llama layer
 * with four multipliers from the file, as llama.cpp applies them:
 *
 *   x = embedding_scale * token_embd[ids]
 *   per layer:  x = x + residual_scale * Wo attention(...)    (scores times attention.scale)
 *               x = x + residual_scale * Wdown (silu(Wgate h) * Wup h)
 *   logits = (Wout rmsnorm(x, output_norm)) / logit_scale
 *
 * The residual scale costs nothing here: the decoder carries x' = x / r
 * instead of x, so each block adds its output unscaled; x' enters only RMS
 * norms, and rmsnorm(r x') with eps equals rmsnorm(x') with eps / r^2, so the
 * norms run with that eps, and the embedding is scaled by embedding_scale / r.
 * With rope.scaling.finetuned false llama.cpp turns RoPE off; so does dray.
 */
#include "decoder.h"
#include "error.h"
#include "hparams.h"

static const struct dec_slot granite_slots[] = {
    DEC_SLOTS_HEAD,
    DEC_SLOTS_PRE_NORMS,
    DEC_SLOTS_ATTN,
    DEC_SLOTS_QKV_BIAS(DEC_OPT),
    DEC_SLOT_O_BIAS,
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

static int granite_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    float logit = 0.0f, resid = 0.0f, embd = 0.0f, attn = 0.0f;
    int rc = dec_llama_attention(m, g, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "granite", "logit_scale", 1e-6f, 1e6f, NULL, &logit, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "granite", "residual_scale", 0.0f, 1e6f, &resid, &resid, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "granite", "embedding_scale", 0.0f, 1e6f, &embd, &embd, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "granite", "attention.scale", 0.0f, 1e6f, &attn, &attn, err, errlen);
    if (rc)
        return rc;
    bool finetuned = true;
    if (!dray_gguf_get_bool(g, "granite.rope.scaling.finetuned", &finetuned, NULL, 0) && !finetuned)
        for (uint32_t il = 0; il < m->info.n_layer; il++)
            m->layer[il].rope_on = false;
    float r = resid > 0.0f ? resid : 1.0f; /* 0: absent, no scaling */
    m->embd_scale = (embd > 0.0f ? embd : 1.0f) / r;
    m->eps /= r * r;
    m->attn_scale = attn; /* 0: the default 1/sqrt(head_dim) */
    m->logit_div = logit;
    return 0;
}

static const char *const granite_keys[] = {"logit_scale", "residual_scale", "embedding_scale", "attention.scale",
                                           NULL};

DEC_FAMILY(granite, DRAY_ACTIVATIONS_INT8X2, granite_slots, granite_hparams, dec_llama_layer, .rope_pairs = 1,
           .keys = granite_keys);
