/*
 * Gemma 2 (general.architecture "gemma2"): Gemma 3's sandwich of norms
 * without its q/k norms, sliding-window layers alternating with global ones
 * (even layers local: attention.sliding_window_pattern, default 2), and soft
 * caps on the attention scores and the final logits. Per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k, v = Wq h, Wk h, Wv h;  q, k = rope(q, pos), rope(k, pos)  # NEOX
 *   s = attn_cap tanh(scale q.k / attn_cap)                          # cap 50
 *   x = x + rmsnorm(Wo softmax(s) V, post_attention_norm)
 *   x = x + rmsnorm(Wdown (gelu_tanh(Wgate h2) * Wup h2), post_ffw_norm)
 *
 * x starts as sqrt(n_embd) token_embd[ids]; logits = final_cap
 * tanh(Wembd rmsnorm(x, output_norm) / final_cap) (cap 30, tied head).
 * scale is 1/sqrt(head_dim), and 1/sqrt(n_embd / n_head) for 27B (46 layers),
 * as llama.cpp and Google's reference do. Soft-capping needs ABI v4.
 */
#include "decoder.h"
#include "error.h"
#include "hparams.h"

#define GEMMA2_27B_LAYERS 46

static const struct dec_slot gemma2_slots[] = {
    {"token_embd.weight", 0, DEC_S_EMBD, 0, 0, DEC_REQ, 0, NULL},
    {"output_norm.weight", 0, DEC_S_OUTPUT_NORM, 0, 0, DEC_REQ, 0, NULL},
    DEC_SLOTS_PRE_NORMS,
    DEC_SLOTS_POST_NORMS,
    DEC_SLOTS_ATTN,
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

static int gemma2_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    struct dec_gemma_rope r = {.pattern = 2, .base = 10000.0f}; /* both layer kinds keep the file's scaling */
    float attn_cap = 50.0f, final_cap = 30.0f; /* llama.cpp's defaults */
    int rc = dray_hparam_f32(g, "gemma2", "rope.freq_base", 1.0f, 1e10f, &r.base, &r.base, err, errlen);
    r.base_local = r.base;
    if (!rc) rc = dray_hparam_f32(g, "gemma2", "rope.freq_base_swa", 1.0f, 1e10f, &r.base_local, &r.base_local, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "gemma2", "attn_logit_softcapping", 0.0f, 1e6f, &attn_cap, &attn_cap, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "gemma2", "final_logit_softcapping", 0.0f, 1e6f, &final_cap, &final_cap, err, errlen);
    if (!rc) rc = dec_gemma_attention(m, g, &r, GEMMA2_27B_LAYERS, err, errlen);
    m->attn_softcap = attn_cap;
    m->final_softcap = final_cap;
    return rc;
}

static int gemma2_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    int rc = dec_attn_input(m, il, T);                             /* qkv = Wqkv rmsnorm(x) */
    if (!rc) rc = dec_rope_qk(m, il, T);                           /* q, k = rope(q), rope(k) */
    if (!rc) rc = dec_attend(m, kv, il, T);                        /* a = attention(q, K, V), capped */
    if (!rc) rc = dec_attn_output(m, il, T);                       /* o = Wo a */
    if (!rc) rc = dec_norm_residual(m, il, DEC_POST_ATTN_NORM, T); /* x += rmsnorm(o) */
    if (!rc) rc = dec_ffn(m, il, T);                               /* o = Wdown(gelu(Wgate h) * Wup h) */
    if (!rc) rc = dec_norm_residual(m, il, DEC_POST_FFW_NORM, T);  /* x += rmsnorm(o) */
    return rc;
}

/* One pass, as Gemma 3: every block's output is normalized. */
static const char *const gemma2_keys[] = {"attention.sliding_window", "attention.sliding_window_pattern",
                                          "rope.freq_base_swa", "attn_logit_softcapping",
                                          "final_logit_softcapping", NULL};

DEC_FAMILY(gemma2, DRAY_ACTIVATIONS_INT8, gemma2_slots, gemma2_hparams, gemma2_layer, .keys = gemma2_keys);
