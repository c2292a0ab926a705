/*
 * Gemma 3 (text): hyper-parameters from GGUF metadata and the layer written with
 * the shared decoder blocks (decoder.h). Facts: docs/reference/gemma3-gguf.md
 * §5. In PyTorch terms, per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k, v = Wq h, Wk h, Wv h;  q = rmsnorm_head(q, q_norm); k = rmsnorm_head(k, k_norm)
 *   q, k = rope(q, pos), rope(k, pos)       # NEOX; local: base 10k (or
 *                                           # rope.freq_base_swa), unscaled;
 *                                           # global: freq_base, the file's
 *                                           # linear scaling (4B and up: 8x)
 *   a = attention(q, K, V, window if local) # MQA/GQA
 *   x = x + rmsnorm(Wo a, post_attention_norm)
 *   h = rmsnorm(x, ffn_norm)
 *   x = x + rmsnorm(Wdown (gelu_tanh(Wgate h) * Wup h), post_ffw_norm)
 *
 * then logits = Wembd rmsnorm(x, output_norm) (tied unless the file has
 * output.weight; soft-capped when final_logit_softcapping is set), with the
 * token embedding scaled by sqrt(n_embd) on the way in. Attention scores are
 * scaled by 1/sqrt(head_dim), except 27B's 1/sqrt(n_embd / n_head), as
 * llama.cpp and Google's reference do.
 */
#include <math.h>

#include "decoder.h"
#include "error.h"
#include "hparams.h"

/* The one hyper-parameter the file may not state: llama.cpp and HF both use a
 * RoPE base of 10000 on sliding-window layers (HF rope_local_base_freq). */
#define GEMMA3_ROPE_BASE_LOCAL 10000.0f
/* Gemma 3 alternates 5 sliding-window layers with 1 global layer (unless
 * attention.sliding_window_pattern says otherwise). */
#define GEMMA3_SWA_PATTERN 6
/* 27B is told apart by its depth, as llama.cpp does */
#define GEMMA3_27B_LAYERS 62

static const struct dec_slot gemma3_slots[] = {
    DEC_SLOTS_HEAD,
    DEC_SLOTS_PRE_NORMS,
    DEC_SLOTS_POST_NORMS,
    DEC_SLOTS_ATTN,
    DEC_SLOTS_QK_NORMS,
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

int dec_gemma_attention(struct dray_model *m, struct dray_gguf *g, const struct dec_gemma_rope *r,
                        uint32_t depth_27b, char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    uint32_t key_len, window, pattern = r->pattern;
    int rc = dec_get_u32(m, g, "attention.key_length", 2, DRAY_HP_MAX_HEAD_DIM, NULL, &key_len, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window", 1, DRAY_HP_MAX_CONTEXT, NULL, &window, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window_pattern", 1, DRAY_MAX_LAYERS, &pattern, &pattern, err, errlen);
    if (rc)
        return rc;
    if (key_len % 2) /* RoPE rotates pairs (value_length is checked by the decoder) */
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: %s.attention.key_length = %u, expected an even number",
                         dray_gguf_name(g), m->fam->arch, key_len);
    in->head_dim = key_len;
    for (uint32_t il = 0; il < in->n_layer; il++) {
        bool local = il % pattern < pattern - 1;
        in->window[il] = m->layer[il].window = local ? window : 0;
        m->layer[il].rope_base = local ? r->base_local : r->base;
        m->layer[il].rope_scale = local && r->local_unscaled ? 1.0f : 0.0f; /* 0: the file's (decoder_rope.c) */
    }
    m->embd_scale = sqrtf((float)in->n_embd);
    m->attn_scale = in->n_layer == depth_27b ? 1.0f / sqrtf((float)in->n_embd / (float)in->n_head)
                                             : 1.0f / sqrtf((float)key_len);
    m->act = DRAY_ACT_GELU_TANH;
    return 0;
}

static int gemma3_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    struct dec_gemma_rope r = {.pattern = GEMMA3_SWA_PATTERN, .base_local = GEMMA3_ROPE_BASE_LOCAL,
                               .local_unscaled = true};
    float cap = 0.0f;
    int rc = dray_hparam_f32(g, "gemma3", "rope.freq_base", 1.0f, 1e10f, NULL, &r.base, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "gemma3", "rope.freq_base_swa", 1.0f, 1e10f, &r.base_local, &r.base_local, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "gemma3", "final_logit_softcapping", 0.0f, 1e6f, &cap, &cap, err, errlen);
    if (!rc) rc = dec_gemma_attention(m, g, &r, GEMMA3_27B_LAYERS, err, errlen);
    m->final_softcap = cap;
    return rc;
}

static int gemma3_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    int rc = dec_attn_input(m, il, T);                                /* qkv = Wqkv rmsnorm(x) */
    if (!rc) rc = dec_qk_norms(m, il, T);                             /* q, k = rmsnorm_head(q), rmsnorm_head(k) */
    if (!rc) rc = dec_rope_qk(m, il, T);                              /* q, k = rope(q), rope(k) */
    if (!rc) rc = dec_attend(m, kv, il, T);                           /* a = attention(q, K, V) */
    if (!rc) rc = dec_attn_output(m, il, T);                          /* o = Wo a */
    if (!rc) rc = dec_norm_residual(m, il, DEC_POST_ATTN_NORM, T);    /* x += rmsnorm(o) */
    if (!rc) rc = dec_ffn(m, il, T);                                  /* o = Wdown(gelu(Wgate h) * Wup h) */
    if (!rc) rc = dec_norm_residual(m, il, DEC_POST_FFW_NORM, T);     /* x += rmsnorm(o) */
    return rc;
}

/* One pass: Gemma 3 normalizes every block's output as well as its input, so
 * one int8 pass per group of 32 is close enough, and a second costs more speed
 * than its accuracy is worth (docs/performance.md, "Two-pass activations"). */
static const char *const gemma3_keys[] = {"attention.sliding_window", "attention.sliding_window_pattern",
                                          "rope.freq_base_swa", "final_logit_softcapping", NULL};

DEC_FAMILY(gemma3, DRAY_ACTIVATIONS_INT8, gemma3_slots, gemma3_hparams, gemma3_layer, .keys = gemma3_keys);
