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
#include <math.h>

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
    struct dray_model_info *in = &m->info;
    uint32_t key_len, val_len, window, pattern = 2;
    float base, base_local, attn_cap = 50.0f, final_cap = 30.0f; /* llama.cpp's defaults */
    int rc = dec_get_u32(m, g, "attention.key_length", 2, DRAY_HP_MAX_HEAD_DIM, NULL, &key_len, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.value_length", 2, DRAY_HP_MAX_HEAD_DIM, NULL, &val_len, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window", 1, DRAY_HP_MAX_CONTEXT, NULL, &window, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window_pattern", 1, DRAY_MAX_LAYERS, &pattern, &pattern, err, errlen);
    base = 10000.0f;
    if (!rc) rc = dray_hparam_f32(g, "gemma2", "rope.freq_base", 1.0f, 1e10f, &base, &base, err, errlen);
    base_local = base;
    if (!rc) rc = dray_hparam_f32(g, "gemma2", "rope.freq_base_swa", 1.0f, 1e10f, &base_local, &base_local, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "gemma2", "attn_logit_softcapping", 0.0f, 1e6f, &attn_cap, &attn_cap, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "gemma2", "final_logit_softcapping", 0.0f, 1e6f, &final_cap, &final_cap, err, errlen);
    if (rc)
        return rc;
    if (key_len != val_len || key_len % 2)
        return dray_fail(err, errlen, DRAY_EFORMAT,
                         "%s: metadata keys gemma2.attention.key_length = %u and value_length = "
                         "%u, expected equal even numbers", dray_gguf_name(g), key_len, val_len);
    in->head_dim = key_len;
    for (uint32_t il = 0; il < in->n_layer; il++) {
        bool local = il % pattern < pattern - 1;
        in->window[il] = m->layer[il].window = local ? window : 0;
        m->layer[il].rope_base = local ? base_local : base; /* both keep the file's scaling */
    }
    m->embd_scale = sqrtf((float)in->n_embd);
    m->attn_scale = in->n_layer == GEMMA2_27B_LAYERS ? 1.0f / sqrtf((float)in->n_embd / (float)in->n_head)
                                                     : 1.0f / sqrtf((float)key_len);
    m->attn_softcap = attn_cap;
    m->final_softcap = final_cap;
    m->act = DRAY_ACT_GELU_TANH;
    return 0;
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
