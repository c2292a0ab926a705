/*
 * Qwen2 and Qwen2.5 (general.architecture "qwen2"): the llama layer with
 * biases on Q, K and V, and RoPE on rotate-half (NEOX) pairs as stored, so no
 * row reordering. Per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k, v = Wq h + bq, Wk h + bk, Wv h + bv
 *   q, k = rope(q, pos), rope(k, pos)       # NEOX, base rope.freq_base
 *   x = x + Wo attention(q, K, V)           # GQA
 *   x = x + Wdown (silu(Wgate h2) * Wup h2),  h2 = rmsnorm(x, ffn_norm)
 *
 * logits = (output or token_embd) rmsnorm(x, output_norm). YaRN (the 128k
 * files) is read by decoder_rope.c.
 */
#include "decoder.h"

static const struct dec_slot qwen2_slots[] = {
    DEC_SLOTS_HEAD,
    DEC_SLOTS_PRE_NORMS,
    DEC_SLOTS_ATTN,
    DEC_SLOTS_QKV_BIAS(DEC_OPT),
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

static int qwen2_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    return dec_llama_attention(m, g, err, errlen);
}

/* Two passes, as llama: the same pre-norm residual stream with loud channels. */
DEC_FAMILY(qwen2, DRAY_ACTIVATIONS_INT8X2, qwen2_slots, qwen2_hparams, dec_llama_layer);
