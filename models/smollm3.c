/*
 * SmolLM3 (general.architecture "smollm3"): the llama layer (Q/K rows stored
 * for adjacent-pair RoPE, reordered at load as llama.c explains), except that
 * every fourth layer (il + 1 divisible by 4) has no RoPE at all ("NoPE"), as
 * llama.cpp hard-codes (n_no_rope_layer_step = 4; the GGUF has no key for it).
 */
#include "decoder.h"

#define SMOLLM3_NO_ROPE_STEP 4

static const struct dec_slot smollm3_slots[] = {
    DEC_SLOTS_HEAD,
    DEC_SLOTS_PRE_NORMS,
    DEC_SLOTS_ATTN,
    DEC_SLOTS_QKV_BIAS(DEC_OPT),
    DEC_SLOTS_FFN,
    DEC_SLOTS_END,
};

static int smollm3_hparams(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen)
{
    int rc = dec_llama_attention(m, g, err, errlen);
    for (uint32_t il = 0; !rc && il < m->info.n_layer; il++)
        m->layer[il].rope_on = (il + 1) % SMOLLM3_NO_ROPE_STEP != 0;
    return rc;
}

DEC_FAMILY(smollm3, DRAY_ACTIVATIONS_INT8X2, smollm3_slots, smollm3_hparams, dec_llama_layer, .rope_pairs = 1);
