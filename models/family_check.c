/* A family's tensor table against a file (family.h): which slot claims a
 * tensor, and the check that every tensor is claimed and every required slot
 * filled, so that a file is either run whole or refused by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_internal.h"
#include "error.h"

/* The keys the decoder reads for every family (decoder.c, decoder_rope.c),
 * and the few a converter writes that change nothing dray computes. */
static const char *const common_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "attention.key_length",
    "attention.value_length", "rope.dimension_count", "rope.freq_base", "rope.scaling.type",
    "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
    "rope.scaling.original_context_length", "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier",
    "expert_count",
    /* written, never changing the math: the vocabulary's size is token_embd's;
     * llama.cpp itself only stores "finetuned" (Granite reads it: granite.c) */
    "vocab_size", "rope.scaling.finetuned", "expert_used_count",
    NULL,
};

static bool listed(const char *const *keys, const char *k, size_t n)
{
    for (; keys && *keys; keys++)
        if (strlen(*keys) == n && !memcmp(*keys, k, n))
            return true;
    return false;
}

int dec_claim_keys(const struct dec_family *f, struct dray_gguf *g, char *err, size_t errlen)
{
    size_t pre = strlen(f->arch);
    for (uint64_t i = 0; i < dray_gguf_n_kv(g); i++) {
        const struct dray_str *k = &dray_gguf_kv_at(g, i)->key;
        if (k->len <= pre || memcmp(k->ptr, f->arch, pre) || k->ptr[pre] != '.')
            continue;
        const char *rest = k->ptr + pre + 1;
        size_t n = k->len - pre - 1;
        if (!listed(common_keys, rest, n) && !listed(f->keys, rest, n))
            return dray_fail(err, errlen, DRAY_ENOTSUP,
                             "%s: metadata key %.*s is not one dray reads for %s (it would be ignored, so "
                             "the file is refused)", dray_gguf_name(g), (int)(k->len > 96 ? 96 : k->len), k->ptr,
                             f->arch);
    }
    return 0;
}

const struct dec_slot *dec_slot_of(const struct dec_family *f, const char *name, uint32_t n_layer)
{
    const char *rest = NULL;
    if (!strncmp(name, "blk.", 4)) { /* blk.<il>.<rest> */
        char *end;
        unsigned long il = strtoul(name + 4, &end, 10);
        if (end == name + 4 || *end != '.' || il >= n_layer)
            return NULL;
        rest = end + 1;
    }
    for (const struct dec_slot *s = f->slots; s->name; s++)
        if ((s->layer != 0) == (rest != NULL) && !strcmp(s->name, rest ? rest : name))
            return s;
    return NULL;
}

const struct dec_slot *dec_family_slot(const struct dec_family *f, int kind, int role, int part)
{
    for (const struct dec_slot *s = f->slots; s->name; s++)
        if (s->kind == kind && s->role == role && ((kind != DEC_S_MAT && kind != DEC_S_BIAS) || s->part == part))
            return s;
    return NULL;
}

/* Whether a fused slot stands in for this split one in the file: then the
 * split part is not required (a file carries one form or the other). */
static bool fused_in_file(const struct dec_family *f, struct dray_gguf *g, const struct dec_slot *s, uint32_t il)
{
    const struct dec_slot *fu = s->kind == DEC_S_MAT ? dec_family_slot(f, DEC_S_MAT_FUSED, s->role, 0) : NULL;
    char name[96];
    if (!fu)
        return false;
    snprintf(name, sizeof(name), "blk.%u.%s", il, fu->name);
    return dray_gguf_find_tensor(g, name) != NULL;
}

int dec_claim_tensors(const struct dec_family *f, struct dray_gguf *g, uint32_t n_layer, char *err,
                      size_t errlen)
{
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++) {
        const struct dray_gguf_tensor *t = dray_gguf_tensor_at(g, i);
        if (!dec_slot_of(f, t->name, n_layer))
            return dray_fail(err, errlen, DRAY_ENOTSUP,
                             "%s: tensor %s is not one a %s model has (dray would ignore it, so it "
                             "refuses the file)", dray_gguf_name(g), t->name, f->arch);
    }
    char name[96];
    for (const struct dec_slot *s = f->slots; s->name; s++) {
        if (!s->required)
            continue;
        for (uint32_t il = 0; il < (s->layer ? n_layer : 1); il++) {
            if (s->layer)
                snprintf(name, sizeof(name), "blk.%u.%s", il, s->name);
            else
                snprintf(name, sizeof(name), "%s", s->name);
            if (dray_gguf_find_tensor(g, name) || fused_in_file(f, g, s, il))
                continue;
            const struct dec_slot *fu = s->kind == DEC_S_MAT ? dec_family_slot(f, DEC_S_MAT_FUSED, s->role, 0) : NULL;
            if (fu) /* either form would do: name both */
                return dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: tensor blk.%u.%s is missing (and so is %s, "
                                 "which the fused one would replace)", dray_gguf_name(g), il, fu->name, name);
            return dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: tensor %s is missing", dray_gguf_name(g), name);
        }
    }
    return 0;
}
