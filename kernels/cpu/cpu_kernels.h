/*
 * CPU kernels: plain pointers in, plain pointers out. The plugin glue
 * (backends/cpu) checks every argument, resolves views to pointers and splits
 * the work over its thread pool; a kernel only computes its slice, given as a
 * half-open range [r0, r1) of the unit the op is parallel over.
 *
 * Two sets with the same signatures: dray_cpu_ref_* (portable scalar C, the
 * specification of each op in code) and dray_cpu_avx2_* (AVX2+FMA+F16C, built
 * with those flags only for their own files and called only when the CPU has
 * them); the int8 matmul also has AVX-VNNI, AVX-512 VNNI and AMX-INT8 pairs
 * below, each in a library of its own with its own flags. Layouts and rounding
 * rules are the ones in include/dray/backend.h.
 */
#ifndef DRAY_CPU_KERNELS_H
#define DRAY_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* f16 <-> f32 (round to nearest even, bit-exact, portable C so the reference
 * and any CPU give the same bits): dray_util_f16_to_f32 / dray_util_f32_to_f16
 * from the plugin helper every plugin shares. */
#include "dray/backend_util.h"

/* ---------------------------------------------------------------- embed */

struct dray_cpu_embed {
    const int32_t *ids;      /* [n_tok], already checked < n_rows */
    const void *table;       /* I8 or F32 [n_rows][dim] */
    const float *row_scale;  /* [n_rows] (I8 only) */
    float *out;              /* [n_tok][dim] */
    uint32_t is_i8, dim;
    float scale;
    uint32_t gdtype;         /* DRAY_Q8G32 / DRAY_Q4G32 (row_scale = that layout's
                              * wscale), or 0: not grouped */
};
/* tokens [t0, t1) */
void dray_cpu_ref_embed(const struct dray_cpu_embed *a, uint32_t t0, uint32_t t1);
void dray_cpu_avx2_embed(const struct dray_cpu_embed *a, uint32_t t0, uint32_t t1);

/* ---------------------------------------------------------------- rmsnorm */

struct dray_cpu_rmsnorm {
    const float *x, *w;
    float *out;
    uint32_t n_head, n, stride_x, stride_out;
    float eps;
};
/* rows [r0, r1) where row = t * n_head + h */
void dray_cpu_ref_rmsnorm(const struct dray_cpu_rmsnorm *a, uint32_t r0, uint32_t r1);
void dray_cpu_avx2_rmsnorm(const struct dray_cpu_rmsnorm *a, uint32_t r0, uint32_t r1);

/* ---------------------------------------------------------------- matmul */

/* The CPU layouts of backend.h's two-level formats (ABI v4), beside the grouped
 * ones of cpu_layout.h; rows in blocks of 16, S = k/256 super-blocks per row,
 * each (b, g) of codes after the one before:
 *   DRAY_CPU_K4: codes as DRAY_Q4G32's (4 units of 64 bytes per (b, g)).
 *   DRAY_CPU_K5: codes as DRAY_Q5G32's (5 units).
 *     Scales of both, 256 bytes per (b, s), 16 per row as the file's 12 + 4:
 *       +0 D f16 [16 rows], +32 M f16 [16], +64 uint32 [16]: bits 4j, 4j+1 of
 *       row r's word are bits 4-5 of group j's s, bits 4j+2, 4j+3 those of its
 *       n; +128 + 16j: byte r = the low four bits of s | those of n << 4.
 *   DRAY_CPU_K6: 6 units of 64 bytes per (b, g): units 0-3 the low four bits
 *     as DRAY_Q4G32's nibbles; unit 4 byte 4r+e holds bits 4-5 of input
 *     4u+e at bits 2u, 2u+1 (u = 0..3), unit 5 those of input 16+4u+e.
 *     Scales 288 bytes per (b, s), 18 per row as the file's: +0 D f16 [16],
 *     +32 + 16h: int8 scale of half-group h (0..15) of the 16 rows.
 * W is backend.h's: d = D*s, m = -(M*n); 6 bits: d = D*sc, m' = -32 d. */
enum { DRAY_CPU_K4 = 0x40, DRAY_CPU_K5 = 0x41, DRAY_CPU_K6 = 0x42 };
static inline int dray_cpu_is_k(uint32_t layout)
{
    return layout >= DRAY_CPU_K4 && layout <= DRAY_CPU_K6;
}
/* Bytes of codes per (b, g) and of scales per (b, s). */
static inline size_t dray_cpu_k_wbytes(uint32_t layout)
{
    return layout == DRAY_CPU_K4 ? 256 : layout == DRAY_CPU_K5 ? 320 : 384;
}
static inline size_t dray_cpu_k_sbytes(uint32_t layout)
{
    return layout == DRAY_CPU_K6 ? 288 : 256;
}

struct dray_cpu_matmul {
    const float *x;           /* [n_tok] rows of stride_x */
    const void *w;            /* I8 or F32 [n_out][k] */
    const float *wscale;      /* [n_out] (I8) */
    float *out;               /* [n_tok] rows of stride_out */
    const int32_t *outlier_idx; /* [n_outlier] (I8) */
    const float *outlier_w;   /* [n_out][n_outlier] (I8) */
    uint32_t n_tok, n_out, k, stride_x, stride_out, n_outlier, accumulate;
    uint32_t is_i8;
    /* Filled by the quantize step (I8): q [n_tok] rows of q_stride bytes, the
     * k used bytes followed by zeros up to q_stride (a multiple of 64); sx [n_tok]. */
    int8_t *q;
    float *sx;
    size_t q_stride;
    /* Fast paths only: the outlier channels of each token gathered by the quantize
     * step, xo [n_tok] rows of xo_stride floats (n_outlier used, then zeros), so
     * the epilogue reads them contiguously; NULL when n_outlier is 0. */
    float *xo;
    uint32_t xo_stride;
    /* AMX only (NULL otherwise): the biased activations of the first
     * n_tok & ~15 tokens again, packed for the tile B operand: 16-token groups
     * of q_stride / 64 blocks of 1 KiB, block c of group g holding, at row r
     * and bytes 4t..4t+3, bytes 64c+4r .. 64c+4r+3 of token 16g+t. */
    int8_t *qt;
    /* Grouped weights (wdtype DRAY_Q8G32 / DRAY_Q4G32 / DRAY_Q5G32 / DRAY_Q4G32H,
     * else 0; is_i8 is 0 then; Q5G32's and Q4G32H's wscale holds f16 pairs, read
     * through a cast).
     * The grouped quantize step fills q as above (unbiased, per-group scales),
     * gsx [n_tok][k/32] (each group's scale) and gsum [n_tok][k/32] (each group's
     * sum of q); every kernel set shares that step. It also fills gmin (when
     * not NULL) [n_tok][k/32] with gsx * gsum, the factor of each group's min
     * term, so a kernel pays one multiply-add for it. */
    uint32_t wdtype;
    float *gsx;
    int32_t *gsum;
    float *gmin;
    /* DRAY_CPU_K6 only (else NULL): [n_tok][k/32] each group's sum of q over
     * its first 16 inputs (the second half's is gsum minus it), filled after
     * the quantize step (dray_cpu_glo_fill). */
    int32_t *glo;
    /* Two-pass activations (backend.h: DRAY_Q8G32_X2 / DRAY_Q4G32_X2 /
     * DRAY_Q5G32_X2 / DRAY_Q4G32H_X2; wdtype is then the layout): 1 when q, gsx and gsum hold two rows per
     * token of x, row 2t its first pass and row 2t+1 its residual's. gquantize
     * takes tokens of x; gmatmul takes n_tok rows of q and writes row r to output
     * token r >> pairs, the odd rows adding to what the even row left
     * (dray_cpu_gout / dray_cpu_gadds), so a kernel that runs several rows
     * against one load of the weights reads them once for both passes. */
    uint32_t pairs;
};
/* Grouped kernels: the output row that q row r goes to, and whether r adds to it. */
static inline float *dray_cpu_gout(const struct dray_cpu_matmul *a, uint32_t r)
{
    return a->out + (size_t)(r >> a->pairs) * a->stride_out;
}
static inline int dray_cpu_gadds(const struct dray_cpu_matmul *a, uint32_t r)
{
    return a->accumulate || (r & a->pairs);
}
/* The quantize step's last part for token t (its q row, or both rows with
 * pairs): gmin = gsx * gsum per group, when gmin is set. */
static inline void dray_cpu_gmin_fill(const struct dray_cpu_matmul *a, uint32_t t)
{
    size_t G = a->k / 32, row = (size_t)t << a->pairs;
    if (a->gmin)
        for (size_t i = row * G; i < (row + 1 + a->pairs) * G; i++)
            a->gmin[i] = a->gsx[i] * (float)a->gsum[i];
}
/* glo of q rows [r0, r1) (cpu_kernels.h: DRAY_CPU_K6's half-group sums). */
static inline void dray_cpu_glo_fill(const struct dray_cpu_matmul *a, size_t r0, size_t r1)
{
    const size_t G = a->k / 32;
    for (size_t r = r0; a->glo && r < r1; r++)
        for (size_t g = 0; g < G; g++) {
            const int8_t *q = a->q + r * a->q_stride + 32 * g;
            int32_t s = 0;
            for (int c = 0; c < 16; c++)
                s += q[c];
            a->glo[r * G + g] = s;
        }
}
/* Step 1 (I8 only): quantize tokens [t0, t1) of x into a->q / a->sx. */
void dray_cpu_ref_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1);
void dray_cpu_avx2_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1);
/* Step 2: output channels [o0, o1) for every token. */
void dray_cpu_ref_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
void dray_cpu_avx2_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
/* AVX-VNNI pair (avxvnni_matmul.c): its quantize stores q + 128 as u8 (the AVX2
 * quantize, then every byte xor 0x80), which only its matmul reads. */
void dray_cpu_avxvnni_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1);
void dray_cpu_avxvnni_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
/* AVX-512 VNNI pair (avx512vnni_matmul.c): the same biased q as AVX-VNNI, and
 * results bit-identical to the AVX2 kernels. */
void dray_cpu_avx512vnni_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1);
void dray_cpu_avx512vnni_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
/* 128 * sum of w[0 .. k) for n rows k bytes apart into corr[n] (the bias
 * correction of the u8 x s8 products). */
void dray_cpu_avx512vnni_row_corr(const int8_t *w, uint32_t k, uint32_t n, int32_t *corr);
/* AMX-INT8 pair (amx_matmul.c): the AVX-512 VNNI quantize plus the packed
 * copy in a->qt; tdpbsud on 16-row x 16-token tiles where k is a multiple of 64
 * and qt is set, the AVX-512 VNNI kernel for the rest. The calling thread must
 * be allowed the tile state (dray_cpu_features(1) asked the kernel). */
void dray_cpu_amx_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1);
void dray_cpu_amx_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
/* Grouped weights (ref_gmatmul.c, the specification; avx512vnni_gmatmul.c).
 * gquantize (shared): tokens [t0, t1) of x (rows 2t and 2t+1 of q when pairs);
 * gmatmul: output channels [o0, o1), every q row (the AVX2 and AVX-512 ones
 * need o0 and o1 multiples of 16). */
void dray_cpu_ref_gquantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1);
void dray_cpu_ref_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
void dray_cpu_avx512vnni_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
void dray_cpu_avx2_gmatmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1);
/* The grouped quantize step with AVX2 (avx2_gmatmul.c): the reference's results. */
void dray_cpu_avx2_gquantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1);
/* Row r of a grouped table (dtype DRAY_Q8G32, DRAY_Q4G32, or DRAY_Q5G32 / DRAY_Q4G32H (the
 * tests' dequantizer: not an embedding table), dim a multiple of 32, rs = its
 * scales) times scale into y[dim]. */
void dray_cpu_ref_grow(uint32_t dtype, const void *table, const float *rs, size_t r, uint32_t dim,
                       float scale, float *y);
/* The shared last step of one I8 output: scale, outliers, accumulate. */
static inline float dray_cpu_mm_finish(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o,
                                       int32_t isum)
{
    float v = (float)isum * a->sx[t] * a->wscale[o];
    if (!a->n_outlier)
        return v;
    /* four partial sums: a single chain of dependent adds made this the slowest
     * part of a prefill matmul with 16 outlier channels */
    const float *xr = a->x + (size_t)t * a->stride_x;
    const float *ow = a->outlier_w + (size_t)o * a->n_outlier;
    const int32_t *idx = a->outlier_idx;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    uint32_t j = 0;
    for (; j + 4 <= a->n_outlier; j += 4) {
        s0 += xr[idx[j]] * ow[j];
        s1 += xr[idx[j + 1]] * ow[j + 1];
        s2 += xr[idx[j + 2]] * ow[j + 2];
        s3 += xr[idx[j + 3]] * ow[j + 3];
    }
    for (; j < a->n_outlier; j++)
        s0 += xr[idx[j]] * ow[j];
    return v + ((s0 + s1) + (s2 + s3));
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* The AVX2, AVX-VNNI, AVX-512 VNNI and AMX kernels' epilogue (one function, and
 * the AMX kernel's 16-row vector copy of it, so their results stay identical;
 * these files are built with -ffp-contract=off, so no fma is fused in unseen): the outlier channels' f32 dot product runs 8 lanes at a time over
 * the row the quantize step gathered (a->xo), instead of a scalar chain with a
 * scattered load per channel, which dominated prefill with 32 outlier channels. */
static inline float dray_avx2_mm_finish(const struct dray_cpu_matmul *a, uint32_t t, uint32_t o,
                                        int32_t isum)
{
    float v = (float)isum * a->sx[t] * a->wscale[o];
    if (!a->n_outlier)
        return v;
    const float *xo = a->xo + (size_t)t * a->xo_stride;
    const float *ow = a->outlier_w + (size_t)o * a->n_outlier;
    __m256 acc = _mm256_setzero_ps();
    uint32_t j = 0;
    for (; j + 8 <= a->n_outlier; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(ow + j), _mm256_loadu_ps(xo + j), acc);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    float s = _mm_cvtss_f32(s4);
    for (; j < a->n_outlier; j++)
        s += ow[j] * xo[j];
    return v + s;
}
#endif

/* ---------------------------------------------------------------- rope */

struct dray_cpu_rope {
    float *x;
    const int32_t *pos;
    uint32_t n_head, head_dim, n_rot, stride;
    float base, freq_scale;
    const float *ff; /* v4 freq_factors [n_rot/2], the angles' divisors; NULL: all 1 */
    float mscale;    /* v4 attn_factor resolved: cos and sin are scaled by it (1 = none) */
    /* AVX2: the angles' cosines and sines, [token][n_rot] (n_rot/2 of each),
     * kept by the glue across the layers of a step; fill: compute them into it
     * first (NULL: compute them on the stack). The reference ignores it. */
    float *table;
    int fill;
};
/* tokens [t0, t1) */
void dray_cpu_ref_rope(const struct dray_cpu_rope *a, uint32_t t0, uint32_t t1);
void dray_cpu_avx2_rope(const struct dray_cpu_rope *a, uint32_t t0, uint32_t t1);
/* Angle of pair i per unit of position: freq_scale * base^(-2i/n_rot) / ff[i],
 * in double (shared by every kernel set, so the frequencies agree bit for bit). */
static inline double dray_cpu_rope_freq(const struct dray_cpu_rope *a, uint32_t i)
{
    double f = (double)a->freq_scale * pow(a->base, -2.0 * i / a->n_rot);
    return a->ff ? f / a->ff[i] : f;
}

/* ---------------------------------------------------------------- KV */

/* The pool resolved to pointers; k/v are int8_t or uint16_t (f16) arrays. */
struct dray_cpu_kv {
    void *k, *v;
    float *k_scale, *v_scale; /* I8 only */
    uint32_t is_i8, n_kv_head, head_dim, block_size, n_slots;
};

struct dray_cpu_kv_store {
    const float *k, *v;
    const int32_t *slots;
    const struct dray_cpu_kv *pool;
    uint32_t stride_k, stride_v;
};
/* tokens [t0, t1) */
void dray_cpu_ref_kv_store(const struct dray_cpu_kv_store *a, uint32_t t0, uint32_t t1);
/* Quantize n floats to int8 with the KV rule; returns the scale. */
float dray_cpu_ref_quant_row(const float *x, uint32_t n, int8_t *q);

struct dray_cpu_attention {
    const float *q;
    float *out;
    const int32_t *seqs;        /* [n_seq][4] */
    const int32_t *block_table;
    const struct dray_cpu_kv *pool;
    uint32_t n_seq, n_head, stride_q, stride_out, window;
    float scale;
    float softcap; /* v4: scores become softcap * tanh(s / softcap); 0 = none */
    /* Work items for the parallel split: item i covers sequence item[i][0],
     * query rows item[i][1] .. item[i][2]-1 (relative to the sequence), kv head
     * item[i][3] (its query-head group), and key chunk item[i][4] of
     * item[i][5] (dray_cpu_att_chunk). Built by the glue. A whole item (one
     * chunk) writes out; a chunk of several (one query row only) writes its
     * partial sums to part + i * part_stride: acc [rows][head_dim] (the
     * probability-weighted V, not divided), then the running max m [rows] and
     * the sum of probabilities l [rows], rows = its query heads; the glue merges
     * the chunks (flash decoding: one decode query otherwise runs on one thread
     * per kv head, and MQA has one). */
    const uint32_t (*item)[6];
    uint32_t n_item;
    float *part;
    size_t part_stride;
};
/* The first key the query at position pos sees (window 0: no window). */
static inline uint32_t dray_cpu_att_lo(uint32_t pos, uint32_t window)
{
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}
/* Keys of each chunk when len keys are cut into n: whole 32-key tiles. */
static inline uint32_t dray_cpu_att_chunk_len(uint32_t len, uint32_t n)
{
    return ((len + n - 1) / n + 31) / 32 * 32;
}
/* Keys [*k0, *k1) of chunk c of n over the visible keys [lo, hi] of one query
 * row: chunks of whole 32-key tiles, the last one shorter. */
static inline void dray_cpu_att_chunk(uint32_t lo, uint32_t hi, uint32_t c, uint32_t n, uint32_t *k0,
                                      uint32_t *k1)
{
    uint32_t cs = dray_cpu_att_chunk_len(hi + 1 - lo, n);
    *k0 = lo + c * cs < hi + 1 ? lo + c * cs : hi + 1;
    *k1 = *k0 + cs < hi + 1 ? *k0 + cs : hi + 1;
}
/* Gemma 2's logit soft-capping of one scaled score (softcap > 0), in double so
 * the reference stays the truth the vector kernels are measured against. */
static inline float dray_cpu_softcap(float s, float softcap)
{
    return (float)(softcap * tanh((double)s / softcap));
}
/* Work items [i0, i1). scratch: per-thread, at least dray_cpu_attention_scratch() bytes. */
void dray_cpu_ref_attention(const struct dray_cpu_attention *a, uint32_t i0, uint32_t i1,
                            void *scratch);
void dray_cpu_avx2_attention(const struct dray_cpu_attention *a, uint32_t i0, uint32_t i1,
                             void *scratch);
/* The same with AVX-512 dot products (avx512_attention.c); AVX-512 VNNI and AMX sets. */
void dray_cpu_avx512_attention(const struct dray_cpu_attention *a, uint32_t i0, uint32_t i1,
                               void *scratch);
/* Bytes of scratch one thread needs: max_kv_len scores + a head_dim vector for
 * the reference; tiles of the query block for AVX2 (max_rows query rows). */
size_t dray_cpu_attention_scratch(uint32_t max_kv_len, uint32_t head_dim, uint32_t max_rows);
/* Query rows per attention work item (the glue splits sequences into such blocks). */
#define DRAY_CPU_ATT_QBLOCK 16u

/* ---------------------------------------------------------------- eltwise */

struct dray_cpu_gated_act {
    const float *gate, *up;
    float *out;
    uint32_t n, stride_gate, stride_up, stride_out, act;
};
/* tokens [t0, t1) */
void dray_cpu_ref_gated_act(const struct dray_cpu_gated_act *a, uint32_t t0, uint32_t t1);
void dray_cpu_avx2_gated_act(const struct dray_cpu_gated_act *a, uint32_t t0, uint32_t t1);

/* elements [i0, i1) */
void dray_cpu_ref_add(const float *a, const float *b, float *out, size_t i0, size_t i1);

#endif
