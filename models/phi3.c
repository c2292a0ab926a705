/*
 * Phi-3 and Phi-3.5 (general.architecture "phi3"): the llama layer with Q|K|V
 * in one tensor (attn_qkv) and gate|up in one (ffn_up, 2 n_ff rows: SwiGLU
 * takes silu of the first half times the second), RoPE on NEOX pairs as
 * stored, and LongRoPE on the 128k files: per-pair divisors of the angle,
 * rope_factors_short within the original context and rope_factors_long past
 * it (chosen by the configured context, as llama.cpp chooses by its own),
 * with cos and sin scaled by rope.scaling.attn_factor (decoder_rope.c).
 * llama.cpp disables Phi-3's sliding window; so does dray, reading it only to
 * say so. The fused tensors are read as exact row views of their parts.
 */
#include "decoder.h"
#include "error.h"
#include "hparams.h"
#include "log.h"

static const struct dec_slot phi3_slots[] = {
    DEC_SLOTS_HEAD,
    {"rope_factors_long.weight", 0, DEC_S_ROPE_LONG, 0, 0, DEC_OPT, 0, NULL},
    {"rope_factors_short.weight", 0, DEC_S_ROPE_SHORT, 0, 0, DEC_OPT, 0, NULL},
    DEC_SLOTS_PRE_NORMS,
    {"attn_qkv.weight", 1, DEC_S_MAT_FUSED, MM_QKV, 0, DEC_OPT, 0, NULL},
    DEC_SLOTS_ATTN, /* a file has Q, K, V apart or in attn_qkv */
    {"ffn_up.weight", 1, DEC_S_MAT_FUSED, MM_GU, 0, DEC_REQ, 0, NULL},
    {"ffn_down.weight", 1, DEC_S_MAT, MM_DOWN, 0, DEC_REQ, 0, NULL},
    DEC_SLOTS_END,
};

static int phi3_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    uint32_t window = 0, none = 0;
    int rc = dec_llama_attention(m, g, err, errlen);
    if (!rc) rc = dec_get_u32(m, g, "attention.sliding_window", 0, DRAY_HP_MAX_CONTEXT, &none, &window, err, errlen);
    if (!rc && window)
        dray_debug("%s: phi3.attention.sliding_window %u is not used (as in llama.cpp)", dray_gguf_name(g), window);
    return rc;
}

static const char *const phi3_keys[] = {"attention.sliding_window", NULL};

DEC_FAMILY(phi3, DRAY_ACTIVATIONS_INT8X2, phi3_slots, phi3_hparams, dec_llama_layer, .keys = phi3_keys);
