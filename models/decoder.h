/* The decoder-only transformer every family is made of: the model state, the
 * loading of the tensors a family's table names (family.h), and the building
 * blocks of a layer (norms, projections, RoPE, attention, the gated FFN,
 * residual adds), each one call into the operator table. A family file
 * (llama.c, qwen2.c, gemma3.c, ...) reads its hyper-parameters, lists its
 * tensors, and writes its layer as a short sequence of these blocks, so its
 * forward pass reads like its math.
 *
 * Activations are rows of tokens, F32, in device buffers sized for max_batch:
 *   x    [T][n_embd]        residual stream
 *   h    [T][n_embd]        normed input of a block
 *   qkv  [T][q_dim + 2 kv_dim]   Q | K | V of each token
 *   att  [T][q_dim]         attention output
 *   o    [T][n_embd]        block output before the residual add
 *   gu   [T][2 n_ff]        gate | up
 *   mid  [T][n_ff]          act(gate) * up
 * (under tensor parallel: the rank's heads and FFN columns only, decoder_tp.c) */
#ifndef DRAY_MODELS_DECODER_H
#define DRAY_MODELS_DECODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* Logits are produced in slabs of this many rows (1 MiB of f32 each at 262144 vocab). */
#define DEC_LOGIT_SLAB 32u

/* The four matmuls of a layer, in the order calibration records their inputs. */
enum { MM_QKV, MM_O, MM_GU, MM_DOWN, MM_COUNT };

#include "family.h"

struct dec_layer {
    struct dray_buf *vec[DEC_VEC_COUNT];               /* F32 norms by enum dec_vec, or NULL */
    struct dray_buf *bqkv, *bo;                        /* F32 biases [qkv_dim], [n_embd], or NULL */
    struct dray_weight wqkv;  /* [(n_head + 2 n_kv_head) head_dim][n_embd]: Q rows, K rows, V rows */
    struct dray_weight wo;    /* [n_embd][n_head head_dim] */
    struct dray_weight wgu;   /* [2 n_ff][n_embd]: gate rows then up rows */
    struct dray_weight wdown; /* [n_embd][n_ff] */
    float rope_base;
    float rope_scale;         /* linear RoPE scaling: angles times this (1 = none) */
    bool rope_on;             /* false: the layer's q and k are not rotated (SmolLM3) */
    bool rope_plain;          /* the model's RoPE factors and mscale skip this layer (OLMo 3 SWA) */
    uint32_t window;          /* 0 = global */
};

struct dec_acts {
    struct dray_buf *x, *h, *qkv, *att, *o, *gu, *mid;
    struct dray_buf *meta;   /* I32 [2][T]  token ids, positions */
    struct dray_buf *xl;     /* F32 [DEC_LOGIT_SLAB][n_embd] rows whose logits are wanted */
    struct dray_buf *logits; /* F32 [DEC_LOGIT_SLAB][n_vocab] */
};

/* The rescored head (head_rescore.c): the 4-bit head's most likely tokens of
 * each row, until at most `tail` of its probability is left (at least
 * DEC_RESCORE_MIN, at most max), computed again from the 8-bit table embd (group
 * rows) and put in their place. One row of logits at a time. */
#define DEC_RESCORE_MIN 16u
struct dec_rescore {
    uint32_t max;             /* most candidates per row; 0 = off (the head is read as is) */
    float tail;               /* 4-bit probability a row may leave unrescored */
    struct dray_buf *rows;    /* F32 [max][n_embd] their rows of embd */
    struct dray_buf *out;     /* F32 [max] their logits */
    int32_t *ids_host;        /* [max] candidate token ids */
    float *out_host;          /* [max] */
    uint8_t *bucket;          /* [n_vocab] scratch of the selection */
};


struct dray_model {
    struct dray_model_info info;
    const struct dec_family *fam;
    struct dray_device *dev;
    float eps, embd_scale, attn_scale, rope_base;
    uint32_t q_dim, kv_dim, qkv_dim;
    uint32_t max_batch;
    uint32_t act;              /* DRAY_ACT_GELU_TANH or DRAY_ACT_SILU */
    bool head_norms;           /* per-head q/k norms (attn_q_norm, attn_k_norm of head_dim) */
    bool two_pass;             /* grouped layer matmuls with two-pass activations (model opts) */
    bool head_two_pass;        /* ... and the head's too (not the bulk of a step: decoder_head.c) */
    bool head_copy;            /* output is a 4-bit copy of the tied embd (model opts head_precision) */
    bool rope_unpermute;       /* Q/K rows are stored for adjacent-pair RoPE (see llama.c) */
    /* RoPE scaling of the whole model (decoder_rope.c): per-pair divisors of the
     * angle (Llama 3, LongRoPE, YaRN; NULL = none) and the magnitude factor */
    struct dray_buf *rope_ff;
    float rope_mscale;
    uint32_t n_rot;            /* rotated dims of a head (= head_dim unless partial) */
    /* soft caps (Gemma 2): attention scores and final logits, 0 = none; the
     * logits are also divided by logit_div (Granite's logit_scale; 1 = none) */
    float attn_softcap, final_softcap, logit_div;
    struct dray_weight embd;   /* [n_vocab][n_embd]: embedding table (and tied output head) */
    struct dray_weight output; /* [n_vocab][n_embd] separate head; n_out 0 = tied to embd */
    struct dray_buf *output_norm;
    struct dec_acts a;
    struct dec_rescore rescore;
    /* embd as a gather table of group rows (DRAY_WROLE_GROUP_ROWS) when the head is a
     * 4-bit copy: embd_groups = n_embd/32 rows of it per token, else 0; gids
     * holds the group-row ids of a gather (dec_embed) */
    uint32_t embd_groups, gids_cap;
    struct dray_buf *gids;     /* I32 [gids_cap] */
    int32_t *gids_host;        /* [gids_cap] */
    int32_t *meta_host;        /* [2][max_batch] staging for ids and positions */
    struct dec_layer *layer;   /* [n_layer]; only [l0, l1) are loaded */
    uint32_t l0, l1;           /* the layers this part holds (all of them unless split) */
    bool has_head;             /* this part holds the embedding, output norm and head */
    uint32_t wdtype;           /* the precision's weight dtype (DRAY_I8, DRAY_F32, grouped) */
    bool calib_on, calib_outliers, calib_smooth; /* between dray_model_calib_begin and _end */
    uint32_t calib_max_batch;  /* max_batch before calibration resized the activations */
    uint32_t mb;               /* micro-batch of the KV step the running forward pass is on */
    struct dray_gguf *g;       /* the file, for re-preparing weights after calibration */
    /* calibration scores: largest |x| per input channel of each layer matmul,
     * a row of its own width per (layer, matmul slot) (dec_calib_row), then the
     * head's row, then (head norms only) the K maxima of dec_calib_kmax (kept
     * after calibrating, or given at load from the cache), and while
     * calibrating a host copy of one input or of qkv (calib_k: the widest row) */
    float *calib, *calib_host;
    uint32_t calib_k;
    uint32_t n_outlier;        /* outlier channels per layer matmul picked from calib */
    int32_t *pick;             /* [calib_k] scratch for the picks */
    /* tensor parallel (model opts tp_size > 1, decoder_tp.c): this rank's slice
     * of every layer; q_dim, kv_dim, qkv_dim and ff_dim are the slice's widths
     * (the whole model's without tensor parallel), and the attention output and
     * FFN down projections give partial sums that allreduce adds up */
    uint32_t tp_rank, tp_size;
    struct dray_tp_slice tp;
    uint32_t ff_dim;
    int (*allreduce)(void *user, float *buf, size_t n, char *err, size_t errlen);
    void *allreduce_user;
    float *tp_host;            /* [max_batch][n_embd] the all-reduce's host copy */
};

/* ---------------------------------------------------------------- the model interface */

/* The decoder implements the engine's model interface for every family:
 * dray_model_forward, _free, _info, _calibrate, _calib_* (core/weights/model.h),
 * and the load and file check of one family (dray_model_load_family, _check_family). */

/* K smoothing of the int8 KV cache (kv_smooth.c). Models with head norms keep
 * max |k| per head channel after the k norm, [n_layer][head_dim], at the end of
 * the calibration scores (dec_calib_kmax: NULL when there is none); observe
 * records it while calibrating, apply folds the factors into the q/k norms. */
float *dec_calib_kmax(struct dray_model *m);
int dec_kv_smooth_observe(struct dray_model *m, uint32_t il, uint32_t T);
int dec_kv_smooth_apply(struct dray_model *m, char *err, size_t errlen);

/* "<arch>.<key>" as u32 in [lo, hi] (dray_hparam_u32: dflt NULL = required). */
int dec_get_u32(struct dray_model *m, struct dray_gguf *g, const char *key, uint32_t lo, uint32_t hi,
                const uint32_t *dflt, uint32_t *v, char *err, size_t errlen);

/* The rescored head (head_rescore.c): buffers for up to max candidates per
 * row (freed by dec_rescore_free); dec_rescore rescores each of the n host rows
 * of logits (n <= DEC_LOGIT_SLAB, xl holding their normed hidden states) and
 * counts rows and candidates in m->info. */
/* out = rows ids[0..n) of the embedding table as F32 [n][n_embd], times scale;
 * ids_dev is a device copy of ids (read unless embd is a table of group rows,
 * whose ids dec_embed uploads itself). */
int dec_embed(struct dray_model *m, const int32_t *ids, struct dray_view ids_dev, uint32_t n,
              struct dray_view out, float scale);
int dec_rescore_init(struct dray_model *m, uint32_t max, float tail, char *err, size_t errlen);
int dec_rescore(struct dray_model *m, uint32_t n, float *logits);
void dec_rescore_free(struct dray_model *m);

/* ---------------------------------------------------------------- shared by families */

/* llama.c: head size and one RoPE base from the llama keys (also granite, smollm3) */
int dec_llama_attention(struct dray_model *m, struct dray_gguf *g, char *err, size_t errlen);
/* llama.c: the pre-norm layer of llama, qwen2, qwen3 (with its q/k norms), ... */
int dec_llama_layer(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T);
/* gemma3.c: what Gemma 2 and 3 share: the head size (attention.key_length),
 * sliding windows on layers il % pattern < pattern - 1 (the pattern key or
 * r->pattern), RoPE bases per layer kind (local layers unscaled where
 * local_unscaled), sqrt(n_embd) embedding scale, GELU, and the attention scale
 * 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) at the 27B depth. */
struct dec_gemma_rope {
    uint32_t pattern;
    float base, base_local;
    bool local_unscaled;
};
int dec_gemma_attention(struct dray_model *m, struct dray_gguf *g, const struct dec_gemma_rope *r,
                        uint32_t depth_27b, char *err, size_t errlen);

/* ---------------------------------------------------------------- building blocks */

struct dray_view dec_at(struct dray_buf *b, size_t floats);

/* h = rmsnorm(x, attn_norm) (h = x without one: OLMo 2); qkv = Wqkv h (+ bias) */
int dec_attn_input(struct dray_model *m, uint32_t il, uint32_t T);
/* q, k = rmsnorm_head(q, q_norm), rmsnorm_head(k, k_norm), in place */
int dec_qk_norms(struct dray_model *m, uint32_t il, uint32_t T);
/* q, k = rmsnorm(q, q_norm), rmsnorm(k, k_norm) each over all its heads (OLMo 2) */
int dec_qk_norms_full(struct dray_model *m, uint32_t il, uint32_t T);
/* q, k = rope(q, pos), rope(k, pos) with the layer's base and scaling (NEOX
 * pairs); nothing on a layer without RoPE */
int dec_rope_qk(struct dray_model *m, uint32_t il, uint32_t T);
/* K, V += k, v (this layer's cache); att = softmax(q K^T scale, causal [+ window]) V */
int dec_attend(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T);
/* o = Wo att (+ bias) */
int dec_attn_output(struct dray_model *m, uint32_t il, uint32_t T);
/* o = Wdown (act(Wgate h) * Wup h) with h = rmsnorm(x, ffn_norm) (h = x without one) */
int dec_ffn(struct dray_model *m, uint32_t il, uint32_t T);
/* o = rmsnorm(o, vec[which] of layer il), in place */
int dec_norm_o(struct dray_model *m, uint32_t il, int which, uint32_t T);
/* x = x + o, the same with o = rmsnorm(o, ...) first: the common pair */
int dec_norm_residual(struct dray_model *m, uint32_t il, int which, uint32_t T);
/* x = x + o */
int dec_residual(struct dray_model *m, uint32_t T);

#endif
