/*
 * Llama-architecture models (general.architecture "llama": Llama 2/3, SmolLM2,
 * Mistral without sliding window, ...): hyper-parameters from GGUF metadata and
 * the layer written with the shared decoder blocks (decoder.h). Per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)
 *   q, k = rope(q, pos), rope(k, pos)       # base rope.freq_base, all head_dim dims
 *   a = attention(q, K, V)                  # GQA: n_head / n_kv_head q heads per kv head
 *   x = x + Wo a (+bo)
 *   h = rmsnorm(x, ffn_norm)
 *   x = x + Wdown (silu(Wgate h) * Wup h)
 *
 * then logits = Wout rmsnorm(x, output_norm), Wout = output.weight when the file
 * has one, else the token embedding (tied). No embedding scale.
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
#include <string.h>

#include "decoder.h"
#include "error.h"
#include "hparams.h"

static int llama_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    uint32_t head_dim = 0, n_rot = 0;
    float base = 10000.0f; /* llama.cpp's default when rope.freq_base is absent */
    struct dray_str scaling;
    uint32_t none = 0;
    int rc = dec_get_u32(m, g, "attention.key_length", 0, DRAY_HP_MAX_HEAD_DIM, &none, &head_dim, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "rope.dimension_count", 0, DRAY_HP_MAX_HEAD_DIM, &none, &n_rot, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, "llama", "rope.freq_base", 1.0f, 1e10f, &base, &base, err, errlen);
    if (rc)
        return rc;
    if (head_dim == 0) { /* absent: the embedding split evenly over the heads */
        if (in->n_embd % in->n_head)
            return dray_fail(err, errlen, DRAY_EFORMAT,
                             "%s: llama.embedding_length %u is not a multiple of llama.attention.head_count %u",
                             dray_gguf_name(g), in->n_embd, in->n_head);
        head_dim = in->n_embd / in->n_head;
    }
    if (head_dim == 0 || head_dim % 2)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: head size %u (must be even)", dray_gguf_name(g),
                         head_dim);
    if (n_rot && n_rot != head_dim)
        return dray_fail(err, errlen, DRAY_ENOTSUP,
                         "%s: llama.rope.dimension_count %u: partial rotary embeddings are not "
                         "supported (head size %u)", dray_gguf_name(g), n_rot, head_dim);
    if (!dray_gguf_get_str(g, "llama.rope.scaling.type", &scaling, NULL, 0) && !dray_str_eq(scaling, "none"))
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: llama.rope.scaling.type \"%.*s\" is not supported",
                         dray_gguf_name(g), (int)(scaling.len > 32 ? 32 : scaling.len), scaling.ptr);
    in->head_dim = head_dim;
    for (uint32_t il = 0; il < in->n_layer; il++) {
        in->window[il] = m->layer[il].window = 0;
        m->layer[il].rope_base = base;
    }
    m->embd_scale = 1.0f;
    m->act = DRAY_ACT_SILU;
    m->biases_allowed = m->output_allowed = m->rope_unpermute = true;
    return 0;
}

static int llama_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
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

static const struct dec_family llama = {"llama", llama_hparams, llama_layer};

static int llama_load(struct dray_gguf *g, struct dray_device *dev, const struct dray_model_opts *o,
                      struct dray_model **out, char *err, size_t errlen)
{
    return dec_load(&llama, g, dev, o, out, err, errlen);
}

const struct dray_arch dray_arch_llama = {
    .name = "llama",
    .load = llama_load,
    .forward = dec_forward,
    .free = dec_free,
    .info = dec_info,
    .calibrate = dec_calibrate,
    .calib_scores = dec_calib_scores,
    .calib_begin = dec_calib_begin,
    .calib_end = dec_calib_end,
    /* Two passes: Llama-family activations carry loud channels into every matmul,
     * which one int8 pass per group of 32 rounds too coarsely (docs/performance.md,
     * "Two-pass activations"; tests/reference). */
    .activations = DRAY_ACTIVATIONS_INT8X2,
};
