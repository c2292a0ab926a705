/* What one architecture family declares (models/<family>.c): the tensors it
 * reads as a table of slots, its hyper-parameters, and its layer written from
 * the shared decoder blocks (decoder.h). Everything else is generic over the
 * slots: the decoder finds, shape-checks, loads, frees and accounts them, and
 * refuses a file with a tensor no slot claims (family_check.c), so a tensor
 * dray would not read can never be dropped in silence.
 *
 * A slot names a tensor of every layer ("attn_q.weight" is blk.<il>.attn_q.weight)
 * or of the file ("token_embd.weight"), says what it is (its kind and role),
 * and whether a file must have it. A family writes its table from the DEC_SLOTS_*
 * rows below and adds its own; DEC_UNUSED rows list tensors a file may carry that
 * dray deliberately never reads, with the reason. */
#ifndef DRAY_MODELS_FAMILY_H
#define DRAY_MODELS_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"

struct dray_model;
struct dray_gguf;
struct dray_kv;

/* The vectors of a layer (F32 on the device), by role. */
enum dec_vec {
    DEC_ATTN_NORM,      /* [n_embd] before attention */
    DEC_FFN_NORM,       /* [n_embd] before the FFN */
    DEC_Q_NORM,         /* [head_dim] per head, or [q_dim] over all heads (dim DEC_DIM_Q) */
    DEC_K_NORM,         /* [head_dim] per head, or [kv_dim] */
    DEC_POST_ATTN_NORM, /* [n_embd] on the attention output */
    DEC_POST_FFW_NORM,  /* [n_embd] on the FFN output */
    DEC_VEC_COUNT
};

enum dec_slot_kind {
    DEC_S_VEC,       /* a layer vector: role is enum dec_vec */
    DEC_S_MAT,       /* one part of a layer matmul: role MM_*, part (Q=0, K=1, V=2; gate=0, up=1) */
    DEC_S_MAT_FUSED, /* every part of matmul `role` in one tensor, rows stacked in part order */
    DEC_S_BIAS,      /* bias of a q/k/v part (part 0..2) or of attn_output (role MM_O) */
    DEC_S_EMBD,      /* token_embd */
    DEC_S_OUTPUT,    /* the output head (tied to token_embd when the file has none) */
    DEC_S_OUTPUT_NORM,
    DEC_S_ROPE_FREQS, /* Llama 3 RoPE frequency divisors [n_rot/2] */
    DEC_S_ROPE_LONG,  /* LongRoPE divisors past the original context [n_rot/2] */
    DEC_S_ROPE_SHORT, /* LongRoPE divisors within it [n_rot/2] */
    DEC_S_UNUSED,     /* claimed and deliberately not read: why says why */
};

/* Lengths of vectors (the shape rule of a DEC_S_VEC slot). */
enum dec_dim { DEC_DIM_EMBD, DEC_DIM_HEAD, DEC_DIM_Q, DEC_DIM_KV };

struct dec_slot {
    const char *name;  /* "attn_norm.weight"; NULL ends a table */
    uint8_t layer;     /* 1: one per layer, blk.<il>.<name>; 0: one per file */
    uint8_t kind;      /* enum dec_slot_kind */
    uint8_t role;      /* enum dec_vec for vectors, MM_* for matmul parts and biases */
    uint8_t part;      /* matmul part or bias part */
    uint8_t required;  /* a file without it is refused */
    uint8_t dim;       /* DEC_S_VEC: enum dec_dim */
    const char *why;   /* DEC_S_UNUSED: why dray never reads it */
};

/* What a family adds to the shared decoder. */
struct dec_family {
    const char *arch;             /* general.architecture, also the metadata key prefix */
    const struct dec_slot *slots; /* its tensors, ended by DEC_SLOTS_END */
    /* family hyper-parameters after the common ones: head_dim, windows, RoPE per
     * layer (rope_base, rope_scale, rope_on), scales and caps */
    int (*hparams)(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen);
    /* one transformer layer over the T tokens in x */
    int (*layer)(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T);
    /* Q/K rows stored for llama.cpp's adjacent-pair RoPE: reordered at load into
     * the NEOX halves the rope op turns (llama.c says why this is exact) */
    uint8_t rope_pairs;
    /* what config `activations: auto` means for the family (core/weights/model.h) */
    enum dray_activations activations;
    /* "<arch>.<key>" keys its hparams hook reads beyond the ones every family
     * reads (family_check.c, DEC_COMMON_KEYS); NULL ends. A file with a key of
     * its prefix that no list names is refused: dray would not honour it. */
    const char *const *keys;
};

/* The slot of tensor `name` in f's table (layer slots match blk.<il>.<rest> with
 * il < n_layer), or NULL. */
const struct dec_slot *dec_slot_of(const struct dec_family *f, const char *name, uint32_t n_layer);
/* Whether f has a slot of this kind and role (and part, for matmul parts). */
const struct dec_slot *dec_family_slot(const struct dec_family *f, int kind, int role, int part);
/* Every "<arch>." key of g is read by the decoder or by f (f->keys); else an
 * error naming the first that is not. */
int dec_claim_keys(const struct dec_family *f, struct dray_gguf *g, char *err, size_t errlen);
/* Every tensor of g is claimed by a slot of f, and every required slot has its
 * tensor; else an error naming the first tensor that is not. */
int dec_claim_tensors(const struct dec_family *f, struct dray_gguf *g, uint32_t n_layer, char *err,
                      size_t errlen);

/* Rows of the slot tables most families share. */
#define DEC_REQ 1
#define DEC_OPT 0
#define DEC_SLOTS_END {NULL, 0, 0, 0, 0, 0, 0, NULL}
/* token_embd, output_norm, and a separate head when the file has one */
#define DEC_SLOTS_HEAD                                                       \
    {"token_embd.weight", 0, DEC_S_EMBD, 0, 0, DEC_REQ, 0, NULL},            \
    {"output_norm.weight", 0, DEC_S_OUTPUT_NORM, 0, 0, DEC_REQ, 0, NULL},    \
    {"output.weight", 0, DEC_S_OUTPUT, 0, 0, DEC_OPT, 0, NULL}
/* a norm before attention and before the FFN */
#define DEC_SLOTS_PRE_NORMS                                                  \
    {"attn_norm.weight", 1, DEC_S_VEC, DEC_ATTN_NORM, 0, DEC_REQ, DEC_DIM_EMBD, NULL}, \
    {"ffn_norm.weight", 1, DEC_S_VEC, DEC_FFN_NORM, 0, DEC_REQ, DEC_DIM_EMBD, NULL}
/* a norm on the output of attention and of the FFN */
#define DEC_SLOTS_POST_NORMS                                                 \
    {"post_attention_norm.weight", 1, DEC_S_VEC, DEC_POST_ATTN_NORM, 0, DEC_REQ, DEC_DIM_EMBD, NULL}, \
    {"post_ffw_norm.weight", 1, DEC_S_VEC, DEC_POST_FFW_NORM, 0, DEC_REQ, DEC_DIM_EMBD, NULL}
/* Q, K, V and the attention output as separate matrices */
#define DEC_SLOTS_ATTN                                                       \
    {"attn_q.weight", 1, DEC_S_MAT, MM_QKV, 0, DEC_REQ, 0, NULL},            \
    {"attn_k.weight", 1, DEC_S_MAT, MM_QKV, 1, DEC_REQ, 0, NULL},            \
    {"attn_v.weight", 1, DEC_S_MAT, MM_QKV, 2, DEC_REQ, 0, NULL},            \
    {"attn_output.weight", 1, DEC_S_MAT, MM_O, 0, DEC_REQ, 0, NULL}
/* biases of Q, K, V (all three or none) and of the attention output */
#define DEC_SLOTS_QKV_BIAS(need)                                             \
    {"attn_q.bias", 1, DEC_S_BIAS, MM_QKV, 0, need, 0, NULL},                \
    {"attn_k.bias", 1, DEC_S_BIAS, MM_QKV, 1, need, 0, NULL},                \
    {"attn_v.bias", 1, DEC_S_BIAS, MM_QKV, 2, need, 0, NULL}
#define DEC_SLOT_O_BIAS {"attn_output.bias", 1, DEC_S_BIAS, MM_O, 0, DEC_OPT, 0, NULL}
/* per-head RMS norms of q and k */
#define DEC_SLOTS_QK_NORMS                                                   \
    {"attn_q_norm.weight", 1, DEC_S_VEC, DEC_Q_NORM, 0, DEC_REQ, DEC_DIM_HEAD, NULL}, \
    {"attn_k_norm.weight", 1, DEC_S_VEC, DEC_K_NORM, 0, DEC_REQ, DEC_DIM_HEAD, NULL}
/* the gated FFN: gate, up, down */
#define DEC_SLOTS_FFN                                                        \
    {"ffn_gate.weight", 1, DEC_S_MAT, MM_GU, 0, DEC_REQ, 0, NULL},           \
    {"ffn_up.weight", 1, DEC_S_MAT, MM_GU, 1, DEC_REQ, 0, NULL},             \
    {"ffn_down.weight", 1, DEC_S_MAT, MM_DOWN, 0, DEC_REQ, 0, NULL}

/* The one declaration a family file ends with: DEC_FAMILY(name, activations,
 * slots, hparams, layer[, .rope_pairs = 1][, .keys = ...]) makes its dec_family
 * and the engine's handle on it (core/weights/model.h: name, table, activations;
 * the model interface is the decoder's, the same for every family). */
#define DEC_FAMILY(name_, activations_, ...)                                 \
    static const struct dec_family name_##_family = {                        \
        .activations = activations_, .arch = #name_, __VA_ARGS__};           \
    const struct dray_arch dray_arch_##name_ = {                             \
        .name = #name_, .family = &name_##_family, .activations = activations_}

#endif
