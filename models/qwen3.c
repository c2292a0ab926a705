/*
 * Qwen3 dense models (general.architecture "qwen3"): the llama layer with an
 * RMS norm on every head of q and of k before RoPE (NEOX pairs, as stored), no
 * biases, and a head size of its own (attention.key_length: 128 for every size,
 * so q_dim may differ from n_embd). Per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k = rmsnorm_head(Wq h, q_norm), rmsnorm_head(Wk h, k_norm);  v = Wv h
 *   q, k = rope(q, pos), rope(k, pos)
 *   x = x + Wo attention(q, K, V)
 *   x = x + Wdown (silu(Wgate h2) * Wup h2),  h2 = rmsnorm(x, ffn_norm)
 */
#include "decoder.h"

static const struct dec_slot qwen3_slots[] = {
    DEC_SLOTS_HEAD,
    DEC_SLOTS_PRE_NORMS,
    DEC_SLOTS_ATTN,
    DEC_SLOTS_QK_NORMS,
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

static int qwen3_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    return dec_llama_attention(m, g, err, errlen);
}

static int qwen3_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    int rc = dec_attn_input(m, il, T);       /* qkv = Wqkv rmsnorm(x) */
    if (!rc) rc = dec_qk_norms(m, il, T);    /* q, k = rmsnorm_head(q), rmsnorm_head(k) */
    if (!rc) rc = dec_rope_qk(m, il, T);     /* q, k = rope(q), rope(k) */
    if (!rc) rc = dec_attend(m, kv, il, T);  /* a = attention(q, K, V) */
    if (!rc) rc = dec_attn_output(m, il, T); /* o = Wo a */
    if (!rc) rc = dec_residual(m, T);        /* x += o */
    if (!rc) rc = dec_ffn(m, il, T);         /* o = Wdown(silu(Wgate h) * Wup h) */
    if (!rc) rc = dec_residual(m, T);        /* x += o */
    return rc;
}

/* Two passes, as llama: its q/k norms tame attention, not the residual stream. */
DEC_FAMILY(qwen3, DRAY_ACTIVATIONS_INT8X2, qwen3_slots, qwen3_hparams, qwen3_layer);
