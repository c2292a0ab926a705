/*
 * gpu_kernels.h — the launchers the host glue calls, one per op family.
 *
 * Plain C (the glue is C11); implemented in the kernels/cuda .cu files, compiled by nvcc
 * for CUDA and by hipcc for HIP. Pointers are device addresses already checked
 * by the glue against their buffers; shapes follow include/dray/backend.h.
 * Every launcher queues work on `stream` and returns 0 or the runtime's error
 * code (a cudaError_t / hipError_t value). Device-side contract violations that
 * the host cannot see without waiting (token id out of range, a slot past the
 * pool, a -1 block the mask reaches) set a bit in *flag instead of reading or
 * writing out of bounds; the glue reports them at the next synchronize.
 * The symbols are hidden (visibility and the plugin's version script).
 */
#ifndef DRAY_GPU_KERNELS_H
#define DRAY_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum gk_flag_bits {
    GK_FLAG_EMBED_ID = 1u << 0,    /* embed: ids[t] >= n_rows (or < 0) */
    GK_FLAG_KV_SLOT = 1u << 1,     /* kv_store: slot >= n_slots */
    GK_FLAG_ATT_HOLE = 1u << 2,    /* attention: mask reached a -1 block entry */
    GK_FLAG_ATT_SLOT = 1u << 3,    /* attention: block entry past the pool or the table */
    GK_FLAG_ATT_SEQ = 1u << 4,     /* attention: a seqs row is inconsistent (skipped) */
};

struct gk_fill {
    uint32_t *dst;
    uint64_t n_words; /* 32-bit words */
    uint32_t pattern;
};

struct gk_embed {
    const int32_t *ids;   /* [n_tok] */
    const void *table;    /* int8 or f32 [n_rows][dim] */
    const float *row_scale; /* [n_rows], int8 only */
    float *out;           /* [n_tok][dim] */
    uint32_t is_i8, n_tok, dim, n_rows;
    float scale;
    uint32_t *flag;
};

struct gk_rmsnorm {
    const float *x, *w;
    float *out;
    uint32_t n_tok, n_head, n, stride_x, stride_out;
    float eps;
};

struct gk_rope {
    float *x;
    const int32_t *pos;
    uint32_t n_tok, n_head, head_dim, n_rot, stride;
    float base, freq_scale;
    const float *ff; /* v4 freq_factors [n_rot/2], the angles' divisors; NULL: all 1 */
    float mscale;    /* v4 attn_factor, 0 turned into 1: cos and sin are scaled by it */
};

struct gk_gated_act {
    const float *gate, *up;
    float *out;
    uint32_t n_tok, n, stride_gate, stride_up, stride_out, act; /* act: 0 gelu-tanh, 1 silu */
};

struct gk_add {
    const float *a, *b;
    float *out;
    uint64_t n;
};

/* The paged pool, as device pointers. Layout: [n_slots][n_kv_head][head_dim]. */
struct gk_pool {
    void *k, *v;          /* int8 or f16 (bits in uint16) */
    float *k_scale, *v_scale; /* [n_slots][n_kv_head], int8 only */
    uint32_t is_i8, n_kv_head, head_dim, block_size, n_slots;
};

struct gk_kv_store {
    const float *k, *v;
    const int32_t *slots; /* [n_tok]; < 0 skips the token */
    struct gk_pool pool;
    uint32_t n_tok, stride_k, stride_v;
    uint32_t *flag;
};

struct gk_matmul {
    const float *x;
    const void *w;            /* int8 [n_out][k], or f32 when is_f32 */
    const float *wscale;      /* [n_out] */
    float *out;
    const int32_t *outlier_idx; /* [n_outlier] */
    const float *outlier_w;   /* [n_out][n_outlier] */
    uint32_t n_tok, n_out, k, stride_x, stride_out, n_outlier, accumulate, is_f32;
    uint32_t use_mma;         /* 1: tensor-core path allowed (sm_80+, CUDA) */
    void *scratch;            /* dray_gk_matmul_scratch() bytes, 256-aligned */
};
size_t dray_gk_matmul_scratch(uint32_t n_tok, uint32_t k);

struct gk_attention {
    const float *q;
    float *out;
    const int32_t *seqs;      /* [n_seq][4] */
    const int32_t *block_table;
    uint32_t n_bt;            /* entries in block_table (bounds check) */
    struct gk_pool pool;
    uint32_t n_tok, n_seq, n_head, max_kv_len, stride_q, stride_out, window;
    float scale;
    float softcap;            /* v4: scores become softcap * tanh(s / softcap); 0 = none */
    uint32_t max_split;       /* decode split-K factor cap, >= 1 */
    void *scratch;            /* dray_gk_attention_scratch() bytes */
    uint32_t *flag;
};
#define GK_ATT_MAX_HEAD_DIM 256u
/* Bytes of scratch for one call; max_split = 1 needs only the small plan. */
size_t dray_gk_attention_scratch(uint32_t n_seq, uint32_t n_kv_head, uint32_t head_dim,
                                 uint32_t max_split);

/* Packed weights (backend.h "Packed weights"; layout: backends/cuda/gpu_layout.h):
 * the handle's device sections and its format. Two levels (super = 1): d and
 * m are f16 super-scales per 256 inputs and sub holds the sub-scales: 12 bytes
 * per super-block (4, 5 bits: gpu_kscales.h) or int8 per 16 inputs (6 bits). */
struct gk_pweights {
    const unsigned char *codes; /* [n_out][k/32][B] */
    const void *d, *m;          /* [n_out][k/32] (two levels: [n_out][k/256]), f32 or f16
                                 * bits; m NULL without a min */
    const unsigned char *sub;   /* two levels only, else NULL */
    uint32_t bits, f16, has_min, super;
};

/* matmul on packed weights: activations quantized per token and group of 32
 * (passes 1 or 2) into scratch, then the grouped int8 dot. */
struct gk_pmatmul {
    const float *x;
    float *out;
    struct gk_pweights w;
    uint32_t n_tok, n_out, k, stride_x, stride_out, accumulate, passes;
    void *scratch;            /* dray_gk_pmatmul_scratch() bytes, 256-aligned */
};
size_t dray_gk_pmatmul_scratch(uint32_t n_tok, uint32_t k, uint32_t passes);

/* embed from packed weights: out[t][i] = W[ids[t]][i] * scale. */
struct gk_pembed {
    const int32_t *ids;
    float *out;
    struct gk_pweights w;
    uint32_t n_tok, dim, n_rows;
    float scale;
    uint32_t *flag;
};

int dray_gk_fill(const struct gk_fill *p, void *stream);
int dray_gk_embed(const struct gk_embed *p, void *stream);
int dray_gk_rmsnorm(const struct gk_rmsnorm *p, void *stream);
int dray_gk_rope(const struct gk_rope *p, void *stream);
int dray_gk_gated_act(const struct gk_gated_act *p, void *stream);
int dray_gk_add(const struct gk_add *p, void *stream);
int dray_gk_kv_store(const struct gk_kv_store *p, void *stream);
int dray_gk_matmul(const struct gk_matmul *p, void *stream);
int dray_gk_attention(const struct gk_attention *p, void *stream);
int dray_gk_pmatmul(const struct gk_pmatmul *p, void *stream);
int dray_gk_pembed(const struct gk_pembed *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif
