/*
 * Gemma 3 (text): hyper-parameters from GGUF metadata and the layer written with
 * the shared decoder blocks (decoder.h). Facts: docs/reference/gemma3-gguf.md
 * §5. In PyTorch terms, per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k, v = Wq h, Wk h, Wv h;  q = rmsnorm_head(q, q_norm); k = rmsnorm_head(k, k_norm)
 *   q, k = rope(q, pos), rope(k, pos)       # NEOX; base 10k local, freq_base global
 *   a = attention(q, K, V, window if local) # MQA: every q head reads the one kv head
 *   x = x + rmsnorm(Wo a, post_attention_norm)
 *   h = rmsnorm(x, ffn_norm)
 *   x = x + rmsnorm(Wdown (gelu_tanh(Wgate h) * Wup h), post_ffw_norm)
 *
 * then logits = Wembd rmsnorm(x, output_norm) (tied embeddings), with the token
 * embedding scaled by sqrt(n_embd) on the way in.
 */
#include <math.h>

#include "decoder.h"
#include "error.h"
#include "hparams.h"

/* The one hyper-parameter the file does not state: llama.cpp and HF both use a
 * RoPE base of 10000 on sliding-window layers (HF rope_local_base_freq). */
#define GEMMA3_ROPE_BASE_LOCAL 10000.0f
/* Gemma 3 alternates 5 sliding-window layers with 1 global layer. */
#define GEMMA3_SWA_PATTERN 6

static int gemma3_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    uint32_t key_len, val_len, window;
    float rope_base;
    int rc = dec_get_u32(m, g, "attention.key_length", 2, DRAY_HP_MAX_HEAD_DIM, NULL, &key_len, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.value_length", 2, DRAY_HP_MAX_HEAD_DIM, NULL, &val_len, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window", 1, DRAY_HP_MAX_CONTEXT, NULL, &window, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "gemma3", "rope.freq_base", 1.0f, 1e10f, NULL, &rope_base, err, errlen);
    if (rc)
        return rc;
    /* RoPE rotates pairs; one attention kernel serves K and V of one width */
    if (key_len != val_len || key_len % 2)
        return dray_fail(err, errlen, DRAY_EFORMAT,
                         "%s: metadata keys gemma3.attention.key_length = %u and value_length = "
                         "%u, expected equal even numbers", dray_gguf_name(g), key_len, val_len);
    in->head_dim = key_len;
    for (uint32_t il = 0; il < in->n_layer; il++) {
        bool local = il % GEMMA3_SWA_PATTERN < GEMMA3_SWA_PATTERN - 1;
        in->window[il] = m->layer[il].window = local ? window : 0;
        m->layer[il].rope_base = local ? GEMMA3_ROPE_BASE_LOCAL : rope_base;
    }
    m->embd_scale = sqrtf((float)in->n_embd);
    m->act = DRAY_ACT_GELU_TANH;
    m->head_norms = m->post_norms = true;
    return 0;
}

static int gemma3_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    const struct dec_layer *L = &m->layer[il];
    int rc = dec_attn_input(m, il, T);                 /* qkv = Wqkv rmsnorm(x) */
    if (!rc) rc = dec_qk_norms(m, il, T);              /* q, k = rmsnorm_head(q), rmsnorm_head(k) */
    if (!rc) rc = dec_rope_qk(m, il, T);               /* q, k = rope(q), rope(k) */
    if (!rc) rc = dec_attend(m, kv, il, T);            /* a = attention(q, K, V) */
    if (!rc) rc = dec_attn_output(m, il, T);           /* o = Wo a */
    if (!rc) rc = dec_norm_o(m, L->post_attn_norm, T); /* o = rmsnorm(o) */
    if (!rc) rc = dec_residual(m, T);                  /* x += o */
    if (!rc) rc = dec_ffn(m, il, T);                   /* o = Wdown(gelu(Wgate h) * Wup h) */
    if (!rc) rc = dec_norm_o(m, L->post_ffw_norm, T);  /* o = rmsnorm(o) */
    if (!rc) rc = dec_residual(m, T);                  /* x += o */
    return rc;
}

static const struct dec_family gemma3 = {"gemma3", gemma3_hparams, gemma3_layer};

static int gemma3_load(struct dray_gguf *g, struct dray_device *dev, const struct dray_model_opts *o,
                       struct dray_model **out, char *err, size_t errlen)
{
    return dec_load(&gemma3, g, dev, o, out, err, errlen);
}

const struct dray_arch dray_arch_gemma3 = {
    .name = "gemma3",
    .load = gemma3_load,
    .forward = dec_forward,
    .free = dec_free,
    .info = dec_info,
    .calibrate = dec_calibrate,
    .calib_scores = dec_calib_scores,
    .calib_begin = dec_calib_begin,
    .calib_end = dec_calib_end,
    /* One pass: Gemma 3 normalizes every block's output as well as its input, so
     * one int8 pass per group of 32 is close enough, and a second costs more speed
     * than its accuracy is worth (docs/performance.md, "Two-pass activations"). */
    .activations = DRAY_ACTIVATIONS_INT8,
};
