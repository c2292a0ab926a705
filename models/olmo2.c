/*
 * OLMo 2 (general.architecture "olmo2"; OLMo 3 adds sliding windows): norms
 * on the outputs of blocks only, and RMS norms over all of q and all of k
 * (not per head). Per layer:
 *
 *   q, k, v = Wq x, Wk x, Wv x                  # no input norm
 *   q, k = rmsnorm(q, q_norm), rmsnorm(k, k_norm)  # over q_dim, kv_dim
 *   q, k = rope(q, pos), rope(k, pos)           # NEOX
 *   x = x + rmsnorm(Wo attention(q, K, V), post_attention_norm)
 *   x = x + rmsnorm(Wdown (silu(Wgate x) * Wup x), post_ffw_norm)
 *
 * logits = output rmsnorm(x, output_norm) (a separate head). With
 * attention.sliding_window (OLMo 3) layers il % pattern < pattern - 1
 * (pattern 4 unless the file says) are local, with plain RoPE (base
 * rope.freq_base_swa, no scaling), as llama.cpp does. A norm over every head
 * cannot be cut by heads, so tensor parallel is refused.
 */
#include "decoder.h"
#include "error.h"
#include "hparams.h"

static const struct dec_slot olmo2_slots[] = {
    {"token_embd.weight", 0, DEC_S_EMBD, 0, 0, DEC_REQ, 0, NULL},
    {"output_norm.weight", 0, DEC_S_OUTPUT_NORM, 0, 0, DEC_REQ, 0, NULL},
    {"output.weight", 0, DEC_S_OUTPUT, 0, 0, DEC_REQ, 0, NULL},
    DEC_SLOTS_POST_NORMS,
    DEC_SLOTS_ATTN,
    {"attn_q_norm.weight", 1, DEC_S_VEC, DEC_Q_NORM, 0, DEC_REQ, DEC_DIM_Q, NULL},
    {"attn_k_norm.weight", 1, DEC_S_VEC, DEC_K_NORM, 0, DEC_REQ, DEC_DIM_KV, NULL},
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

static int olmo2_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    uint32_t window = 0, pattern = 4, none = 0;
    int rc = dec_llama_attention(m, g, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window", 0, DRAY_HP_MAX_CONTEXT, &none, &window, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window_pattern", 1, DRAY_MAX_LAYERS, &pattern, &pattern, err, errlen);
    float base_local = m->layer[0].rope_base;
    if (!rc) rc = dray_hparam_f32(g, "olmo2", "rope.freq_base_swa", 1.0f, 1e10f, &base_local, &base_local, err, errlen);
    if (rc)
        return rc;
    for (uint32_t il = 0; window && il < m->info.n_layer; il++)
        if (il % pattern < pattern - 1) {
            m->info.window[il] = m->layer[il].window = window;
            m->layer[il].rope_base = base_local;
            m->layer[il].rope_scale = 1.0f;
            m->layer[il].rope_plain = true;
        }
    return 0;
}

static int olmo2_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    int rc = dec_attn_input(m, il, T);                             /* qkv = Wqkv x */
    if (!rc) rc = dec_qk_norms_full(m, il, T);                     /* q, k = rmsnorm(q), rmsnorm(k) */
    if (!rc) rc = dec_rope_qk(m, il, T);                           /* q, k = rope(q), rope(k) */
    if (!rc) rc = dec_attend(m, kv, il, T);                        /* a = attention(q, K, V) */
    if (!rc) rc = dec_attn_output(m, il, T);                       /* o = Wo a */
    if (!rc) rc = dec_norm_residual(m, il, DEC_POST_ATTN_NORM, T); /* x += rmsnorm(o) */
    if (!rc) rc = dec_ffn(m, il, T);                               /* o = Wdown(silu(Wgate x) * Wup x) */
    if (!rc) rc = dec_norm_residual(m, il, DEC_POST_FFW_NORM, T);  /* x += rmsnorm(o) */
    return rc;
}

static const char *const olmo2_keys[] = {"attention.sliding_window", "attention.sliding_window_pattern",
                                         "rope.freq_base_swa", NULL};

DEC_FAMILY(olmo2, DRAY_ACTIVATIONS_INT8X2, olmo2_slots, olmo2_hparams, olmo2_layer, .keys = olmo2_keys);
