/*
 * Llama-architecture models (general.architecture "llama": Llama 2/3.x,
 * SmolLM2, Mistral 7B without sliding window, ...): hyper-parameters from GGUF
 * metadata and the layer written with the shared decoder blocks (decoder.h).
 * Per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)
 *   q, k = rope(q, pos), rope(k, pos)       # base rope.freq_base; Llama 3.x
 *                                           # scales the angles (rope_freqs)
 *   a = attention(q, K, V)                  # GQA: n_head / n_kv_head q heads per kv head
 *   x = x + Wo a (+bo)
 *   h = rmsnorm(x, ffn_norm)
 *   x = x + Wdown (silu(Wgate h) * Wup h)
 *
 * then logits = Wout rmsnorm(x, output_norm), Wout = output.weight when the file
 * has one, else the token embedding (tied). No embedding scale. RoPE scaling
 * (linear, Llama 3's rope_freqs, YaRN) is read for every family by
 * decoder_rope.c.
 *
 * RoPE layout. llama.cpp rotates adjacent pairs (x0,x1), (x2,x3), ... for this
 * architecture, and its GGUF converter permutes the rows of Wq and Wk (per head,
 * row j*d/2 + i of the Hugging Face weight becomes row 2i + j) so that rotating
 * adjacent pairs computes what Hugging Face's rotate-half (NEOX) rotation does on
 * the original rows. dray's rope op is NEOX (pairs (x_i, x_{i+d/2})), so the load
 * applies the inverse permutation to the rows of Wq and Wk (and of bq, bk): each
 * head's q and k then come out in the original order, where pair i of the NEOX
 * rotation is exactly the pair the adjacent rotation would turn by the same angle
 * theta_i = pos * base^(-2i/d). Attention only uses dot products q.k over a head,
 * and q and k are permuted the same way, so every score, and with V untouched
 * every output, is unchanged; no ABI change is needed.
 */
#include "decoder.h"
#include "error.h"
#include "hparams.h"

static const struct dec_slot llama_slots[] = {
    DEC_SLOTS_HEAD,
    {"rope_freqs.weight", 0, DEC_S_ROPE_FREQS, 0, 0, DEC_OPT, 0, NULL},
    DEC_SLOTS_PRE_NORMS,
    DEC_SLOTS_ATTN,
    DEC_SLOTS_QKV_BIAS(DEC_OPT),
    DEC_SLOT_O_BIAS,
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

/* Head size and RoPE base of the llama-shaped families (llama, qwen2, qwen3,
 * phi3, olmo2, granite, smollm3): head_dim from key_length or n_embd / n_head,
 * one base (the rotary part and the scaling are read by the decoder). */
int dec_llama_attention(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    const char *A = m->fam->arch;
    uint32_t head_dim = 0, none = 0;
    float base = 10000.0f; /* llama.cpp's default when rope.freq_base is absent */
    int rc = dec_get_u32(m, g, "attention.key_length", 0, DRAY_HP_MAX_HEAD_DIM, &none, &head_dim, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, A, "rope.freq_base", 1.0f, 1e10f, &base, &base, err, errlen);
    if (rc)
        return rc;
    if (head_dim == 0) { /* absent: the embedding split evenly over the heads */
        if (in->n_embd % in->n_head)
            return dray_fail(err, errlen, DRAY_EFORMAT,
                             "%s: %s.embedding_length %u is not a multiple of %s.attention.head_count %u",
                             dray_gguf_name(g), A, in->n_embd, A, in->n_head);
        head_dim = in->n_embd / in->n_head;
    }
    if (head_dim == 0 || head_dim % 2)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: head size %u (must be even)", dray_gguf_name(g),
                         head_dim);
    in->head_dim = head_dim;
    for (uint32_t il = 0; il < in->n_layer; il++) {
        in->window[il] = m->layer[il].window = 0;
        m->layer[il].rope_base = base;
    }
    m->act = DRAY_ACT_SILU;
    return 0;
}

static int llama_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    return dec_llama_attention(m, g, err, errlen);
}

int dec_llama_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    int rc = dec_attn_input(m, il, T);       /* qkv = Wqkv rmsnorm(x) (+ b) */
    if (!rc) rc = dec_rope_qk(m, il, T);     /* q, k = rope(q), rope(k) */
    if (!rc) rc = dec_attend(m, kv, il, T);  /* a = attention(q, K, V) */
    if (!rc) rc = dec_attn_output(m, il, T); /* o = Wo a (+ b) */
    if (!rc) rc = dec_residual(m, T);        /* x += o */
    if (!rc) rc = dec_ffn(m, il, T);         /* o = Wdown(silu(Wgate h) * Wup h) */
    if (!rc) rc = dec_residual(m, T);        /* x += o */
    return rc;
}

/* Two passes: Llama-family activations carry loud channels into every matmul,
 * which one int8 pass per group of 32 rounds too coarsely (docs/performance.md,
 * "Two-pass activations"; tests/reference). */
DEC_FAMILY(llama, DRAY_ACTIVATIONS_INT8X2, llama_slots, llama_hparams, dec_llama_layer, .rope_pairs = 1);
