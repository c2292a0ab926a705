/*
 * dray/backend.h — the plugin ABI: devices, memory, queue, and the operator table.
 *
 * This is the only header a chip vendor needs. A plugin is a shared object
 * (libdray-<name>.so) that exports exactly one symbol, dray_plugin_negotiate().
 * The host offers the newest ABI version it speaks and a table of services;
 * the plugin answers with the version it will use and its operator table, or
 * refuses with a reason. Everything else is reached through the table.
 *
 * Rules of the table (see docs/plugin-abi.md for the per-version requirements):
 *  - The first member is the version. Members are only ever appended, behind a
 *    fence comment; never reordered or removed.
 *  - A member the plugin does not implement is NULL; the host checks version and
 *    NULL with DRAY_HAS() before calling anything optional or newer.
 *  - Every call returns 0 or a negative DRAY_E* code. A plugin never aborts the
 *    process and never prints; it reports through host->log and last_error().
 *  - Argument structs are passed by const pointer and read only during the call;
 *    buffers they name must stay alive until the queue has executed the op.
 *
 * Numbers: all shapes are element counts, all offsets and sizes are bytes,
 * "row" means the innermost contiguous dimension. Strides are in elements.
 *
 * Depends on libc only.
 */
#ifndef DRAY_BACKEND_H
#define DRAY_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions */

#define DRAY_ABI_VERSION     5u /* newest ABI this header describes */
#define DRAY_ABI_VERSION_MIN 1u /* oldest ABI a host built from this header accepts */

/* True when table tab, of its own version, carries member m (added in version
 * v) and the plugin set it. The host calls op_caps only after DRAY_HAS. */
#define DRAY_HAS(tab, member, v) ((tab)->version >= (v) && (tab)->member != NULL)

#if defined(__GNUC__)
#define DRAY_EXPORT __attribute__((visibility("default")))
#else
#define DRAY_EXPORT
#endif

/* ------------------------------------------------------------------ errors */

enum dray_status {
    DRAY_OK = 0,
    DRAY_EINVAL = -1,     /* bad argument: shape, offset, dtype, NULL */
    DRAY_ENOMEM = -2,     /* host or device allocation failed / budget exceeded */
    DRAY_EIO = -3,        /* file or OS error */
    DRAY_ENOTSUP = -4,    /* valid request the plugin/device does not support */
    DRAY_EINCOMPAT = -5,  /* ABI or format version mismatch */
    DRAY_ENODEV = -6,     /* no usable device / driver */
    DRAY_EFORMAT = -7,    /* malformed input file or text */
    DRAY_ERANGE = -8,     /* value out of the allowed range (too long, too big) */
    DRAY_EBACKEND = -9,   /* the device runtime reported a failure */
    DRAY_ENOTFOUND = -10, /* named thing (key, tensor, plugin, file) absent */
};

/* ------------------------------------------------------------------ dtypes */

enum dray_dtype {
    DRAY_F32 = 0,
    DRAY_F16 = 1, /* IEEE binary16, storage only: ops compute in f32 */
    DRAY_I8 = 2,  /* signed, symmetric, with an f32 scale stated per op */
    DRAY_I32 = 3,
    /* Version 2 only (retired in version 3): the CPU plugin's interleaved
     * grouped layouts, one dtype per combination of bits, scale type and
     * activation passes. A host of version 3 never sends them; their
     * specification is kept in docs/plugin-abi.md for version-2 plugins. */
    DRAY_Q8G32 = 4,
    DRAY_Q4G32 = 5,
    DRAY_Q8G32_X2 = 6,
    DRAY_Q4G32_X2 = 7,
    DRAY_Q5G32 = 8,
    DRAY_Q5G32_X2 = 9,
    DRAY_Q4G32H = 10,
    DRAY_Q4G32H_X2 = 11,
    /* since version 3: the weights are a packed handle (struct dray_packed),
     * matmul wdtype and embed dtype only; see "Packed weights" below */
    DRAY_PACKED = 12,
    DRAY_DTYPE_COUNT
};
#define DRAY_DTYPE_BIT(t) (1u << (t))

/* -------------------------------------------------------- host services */

enum dray_log_level { DRAY_LOG_ERROR = 0, DRAY_LOG_WARN = 1, DRAY_LOG_INFO = 2, DRAY_LOG_DEBUG = 3 };

/* Services the host hands a plugin. Read members only as far as version allows. */
struct dray_host {
    uint32_t version; /* DRAY_ABI_VERSION of the host */
    /* host memory the plugin keeps for itself (tables, staging); may fail (NULL) */
    void *(*alloc)(size_t nbytes);
    void (*free)(void *p);
    /* one line, no trailing newline; plugin is the plugin's name */
    void (*log)(int level, const char *plugin, const char *msg);
    /* members above: version 1. Append only. */
};

/* ----------------------------------------------------------- devices */

/* Capabilities are data. For each op, the dtypes it accepts in the role the op
 * names ("cap dtype" in the op's comment); 0 means the op is not implemented. */
enum dray_op {
    DRAY_OP_EMBED = 0,   /* cap dtype: the table's dtype (I8, F32; v3 packed weights:
                          * op_caps.embed_wformats) */
    DRAY_OP_RMSNORM,     /* cap dtype: F32 */
    DRAY_OP_MATMUL,      /* cap dtype: the weights' dtype (I8, F32; v3 packed weights:
                          * op_caps.matmul_wformats and matmul_passes) */
    DRAY_OP_ROPE,        /* cap dtype: F32 */
    DRAY_OP_KV_STORE,    /* cap dtype: the cache dtype (I8, F16) */
    DRAY_OP_ATTENTION,   /* cap dtype: the cache dtype (I8, F16) */
    DRAY_OP_GATED_ACT,   /* cap dtype: F32 */
    DRAY_OP_ADD,         /* cap dtype: F32 */
    /* ops added after version 1 go here; their dtypes are in dray_op_caps only */
    DRAY_OP_COUNT
};
/* The ops of version 1: the length of dray_device_props.op_dtypes, frozen so
 * that adding an op never changes that struct's layout. */
#define DRAY_OP_COUNT_V1 8
/* Entries of dray_op_caps.op_dtypes: room for DRAY_OP_COUNT to grow without
 * moving the members after it. Version 2 had DRAY_OP_COUNT (8) entries there,
 * and so the same offsets for every member it knew. */
#define DRAY_OP_SLOTS 16

enum dray_dev_flags {
    DRAY_DEV_INT8_DOT = 1u << 0,  /* hardware int8 dot products (dp4a, VNNI, MMA, ...) */
    DRAY_DEV_FP16 = 1u << 1,      /* fp16 arithmetic, not just storage */
    DRAY_DEV_UNIFIED = 1u << 2,   /* device memory is host memory (CPU, APU) */
    DRAY_DEV_REFERENCE = 1u << 3, /* this context runs the scalar reference kernels */
};

struct dray_device_props {
    char name[128];        /* "AMD EPYC 7B13 (avx2+fma)", "NVIDIA H200" */
    char vendor[64];
    uint64_t mem_total;    /* bytes the device can hold */
    uint64_t mem_free;     /* bytes free now, 0 if unknown */
    uint64_t max_alloc;    /* largest single buffer, bytes */
    uint32_t compute_units;
    uint32_t flags;        /* enum dray_dev_flags */
    uint32_t op_dtypes[DRAY_OP_COUNT_V1]; /* DRAY_DTYPE_BIT mask per version-1 op */
};

/* Version 2: what each op accepts, as a struct that grows by size. The host
 * zeroes it and sets size = sizeof of its struct; the plugin writes only the
 * members that lie below that size (dray_util_caps_answer in backend_util.h), so
 * a member the plugin does not know stays 0, which means "no limit declared".
 * A limit is the largest value an op accepts; beyond it the op returns
 * DRAY_ENOTSUP, and the host checks the model against the limits at open
 * instead of failing mid-generation. */
struct dray_op_caps {
    uint32_t size;          /* in: sizeof(struct dray_op_caps) of the caller */
    uint32_t max_head_dim;  /* attention, kv_store, rope: largest head_dim; 0 = none */
    uint32_t max_n_rot;     /* rope: largest n_rot (always even, <= head_dim); 0 = none */
    uint32_t rope_partial;  /* rope: 1 if n_rot < head_dim is supported, 0 if n_rot must
                             * equal head_dim */
    uint32_t max_k;         /* matmul: largest k (<= 65536 by the contract); 0 = 65536 */
    uint32_t max_heads;     /* attention: largest n_head; rmsnorm: largest n_head; 0 = none */
    uint32_t n_ops;         /* out: entries of op_dtypes the plugin filled (its DRAY_OP_COUNT) */
    uint32_t op_dtypes[DRAY_OP_SLOTS]; /* DRAY_DTYPE_BIT mask per op, every op */
    /* members above: version 2. Version 3 (packed weights, below): */
    uint32_t matmul_wformats; /* DRAY_WFORMAT_BIT of every format weight_create takes
                               * for matmul */
    uint32_t embed_wformats;  /* ... and for embed (a table the gather reads) */
    uint32_t matmul_passes;   /* bit p-1: matmul on packed weights runs p activation
                               * passes (bit 0: one, bit 1: two); 0 with formats
                               * declared means one pass */
};

/* Options for opening a device. size lets the struct grow: a plugin reads only
 * members that lie below size. Zero-initialise and set what you need. */
struct dray_open_options {
    uint32_t size;       /* sizeof(struct dray_open_options) of the caller */
    uint32_t n_threads;  /* host threads the plugin may use; 0 = plugin decides */
    uint32_t reference;  /* 1: use the portable scalar kernels (for comparison) */
};

/* Opaque to the host. */
struct dray_ctx;
struct dray_buf;

/* A place in a buffer: every op argument that is data is a view. */
struct dray_view {
    struct dray_buf *buf;
    size_t offset; /* bytes from the start of buf; aligned to the element size */
};

/* ------------------------------------------------- packed weights (version 3) */

/* Layout-neutral grouped weights. W [n_out][k] (k a multiple of 32) is cut into
 * groups of 32 inputs of one row: group g of row o holds inputs 32g .. 32g+31,
 * G = k/32 groups per row. A group has 32 integer codes, a scale d and, where
 * the format has one, a min m, and
 *   W[o][c] = code(o, c) * d(o, g) + m(o, g)          (has_min = 1)
 *   W[o][c] = (code(o, c) - z) * d(o, g)              (has_min = 0)
 * in f32, after widening an f16 d or m exactly; z = 8 for 4 bits, 16 for 5 bits,
 * 0 for 8 bits. Codes are unsigned 0..15 (4 bits), 0..31 (5 bits), or signed
 * -128..127 (8 bits). What the host hands weight_create, row-major:
 *   codes  group g of row o at byte (o*G + g) * B:
 *          4 bits, B = 16: byte j holds input 32g+j in bits 0..3 and input
 *                  32g+16+j in bits 4..7;
 *          5 bits, B = 20: those 16 bytes hold the low four bits, then a
 *                  little-endian uint32 has bit 4 of input 32g+j at bit j;
 *          8 bits, B = 32: byte j is input 32g+j (two's complement).
 *   d      [n_out][G], f32 or f16 (IEEE binary16) as the format says
 *   m      [n_out][G], the same type; has_min only (else NULL)
 * GGUF's Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 blocks are these groups exactly (with
 * f16 d and m).
 *
 * Two-level scales (version 4, super = 1; scale f16, k a multiple of 256): a
 * super-block of 256 inputs (S = k/256 per row) has f16 super-scales and each
 * group (or half-group) a small integer scale under them, so that GGUF's K
 * quants cross at their own size and value:
 *   bits 4 or 5, has_min 1 (Q4_K, Q5_K): sub [n_out][G][2] uint8 holds group
 *          g's (s, n), each 0..63 (6 bits, as GGUF packs them: weight_create
 *          refuses larger ones); d and m are [n_out][S] f16 super-scales D and M, and
 *            d(o, g) = D(o, g/8) * s,   m(o, g) = -(M(o, g/8) * n)   (f32).
 *   bits 6, has_min 0 (Q6_K): codes are 6 bits unsigned 0..63, B = 24: the
 *          16 bytes of 4 bits above hold the low four bits, then a
 *          little-endian uint64 has bits 4-5 of input 32g+j at bits 2j, 2j+1;
 *          sub [n_out][k/16] int8 is the scale of each half-group of 16
 *          inputs, d is [n_out][S] f16 D, and every half h (inputs 16h ..
 *          16h+15) is a group of its own for the formulas below:
 *            d(o, h) = D(o, h/16) * sub(o, h) (f32),  z = 32.
 * The f32 products are the ones GGUF's dequantization forms, so the weights
 * are the file's exactly. A plugin reads sub only for these formats (desc size
 * covering it).
 * The plugin lays them out however its kernels want (interleaved for vector
 * registers, coalesced rows, tensor-core fragments, a vendor's packing) and
 * keeps them in device memory until weight_free; only matmul and embed read the
 * handle. A plugin declares the formats it takes in op_caps (matmul_wformats,
 * embed_wformats: DRAY_WFORMAT_BIT) and certifies them with the conformance kit;
 * weight_create refuses others with DRAY_ENOTSUP. */
enum dray_wscale { DRAY_WSCALE_F32 = 0, DRAY_WSCALE_F16 = 1 };

struct dray_wformat {
    uint8_t bits;    /* 4, 5 or 8; 6 with two-level scales */
    uint8_t scale;   /* enum dray_wscale: the type of d and m */
    uint8_t has_min; /* 0 or 1 */
    uint8_t super;   /* 0: a d (and m) per group; 1 (v4): two-level scales */
};

/* The format's bit in matmul_wformats / embed_wformats: 12 formats of one
 * level, bits 0..11, and (v4) three of two levels, bits 12..14 (Q4_K, Q5_K,
 * Q6_K's shapes; valid formats only: dray_util_wformat_valid). DRAY_PACKED
 * itself is never a bit of op_dtypes: the formats declare it. */
#define DRAY_WFORMAT_BIT(f)                                                                   \
    ((f).super ? 1u << (12u + ((f).bits == 4 ? 0u : (f).bits == 5 ? 1u : 2u))                \
               : 1u << (((f).bits == 4 ? 0u : (f).bits == 5 ? 1u : 2u) * 4u +                 \
                        ((f).scale ? 2u : 0u) + ((f).has_min ? 1u : 0u)))

enum dray_wuse {
    DRAY_WUSE_MATMUL = 1u << 0, /* matmul reads it */
    DRAY_WUSE_EMBED = 1u << 1,  /* embed gathers rows of it (a tied embedding and head) */
};

/* What weight_create packs. size lets it grow: a plugin reads only members
 * below size. Arrays are host memory, read during the call only. */
struct dray_weight_desc {
    uint32_t size;       /* sizeof(struct dray_weight_desc) of the caller */
    struct dray_wformat format;
    uint32_t n_out, k;   /* rows and inputs; k a multiple of 32, both > 0 */
    uint32_t uses;       /* enum dray_wuse, at least one */
    const void *codes;   /* as above, n_out * (k/32) * B bytes */
    const void *d;       /* n_out * (k/32) values */
    const void *m;       /* n_out * (k/32) values, or NULL without a min; two-level:
                          * n_out * (k/256) super-scales each */
    const void *sub;     /* v4, two-level formats only: the sub-scales, else NULL */
};

/* Opaque to the host: the plugin's packed copy of one weight matrix. */
struct dray_packed;

/* ----------------------------------------------------------- op arguments */

/* Embedding gather: out[t][i] = table[ids[t]][i] * row_scale[ids[t]] * scale
 *   ids        I32  [n_tok]                 every id < n_rows, else DRAY_EINVAL
 *   table      I8   [n_rows][dim] with row_scale F32 [n_rows]   (dtype I8), or
 *              F32  [n_rows][dim], row_scale ignored              (dtype F32)
 *   out        F32  [n_tok][dim]
 * Since version 3 the table may be packed weights (dtype DRAY_PACKED, packed a
 * handle created with DRAY_WUSE_EMBED; table and row_scale are ignored, n_rows
 * and dim must be its n_out and k): out[t][i] = W[ids[t]][i] * scale with W
 * as "Packed weights" defines it, then times scale.
 * Tolerance: exact for F32; one f32 multiply order for I8 (rel 1e-6); packed:
 * rel 1e-6 of (|code*d| + |m'|) * |scale| per element (the order of code*d + m'
 * against (code - z)*d). */
struct dray_embed_args {
    struct dray_view ids, table, row_scale, out;
    uint32_t dtype;  /* of table: DRAY_I8, DRAY_F32 or (v3) DRAY_PACKED */
    uint32_t n_tok, dim, n_rows;
    float scale;     /* extra factor, e.g. sqrt(n_embd) for Gemma */
    struct dray_packed *packed; /* v3, dtype DRAY_PACKED only */
};

/* RMSNorm over rows: for token t, head h (n_head rows per token):
 *   x_r  = x + (t*stride_x + h*n) elements, F32 [n]
 *   y_r  = out + (t*stride_out + h*n)
 *   y_r[i] = x_r[i] / sqrt(sum_i(x_r[i]^2)/n + eps) * w[i]      (w F32 [n])
 * The sum of squares is accumulated in at least f32 with pairwise or wider
 * partial sums. out may alias x exactly (in place). n_head = 1 for a plain
 * norm over the hidden state; n_head = heads for per-head Q/K norm.
 * Tolerance: rel 1e-5. */
struct dray_rmsnorm_args {
    struct dray_view x, w, out;
    uint32_t n_tok, n_head, n;
    uint32_t stride_x, stride_out; /* elements between tokens; >= n_head*n */
    float eps;
};

/* Matmul: out[t][o] = sum_k x[t][k] * W[o][k]. Two weight dtypes (wdtype):
 *   DRAY_I8  (the fast path, W8A8) as specified below;
 *   DRAY_F32 (the checking path): w is F32 [n_out][k], wscale and outliers are
 *            ignored, x is not quantized, sums in f32 (tolerance rel 1e-5 of the
 *            sum of |x||w|). Declared in op_dtypes[DRAY_OP_MATMUL] like I8.
 * A plugin returns DRAY_ENOTSUP for a wdtype it does not declare.
 * int8 (W8A8) details:
 *   x      F32 [n_tok] rows of stride_x elements, k used
 *   w      I8  [n_out][k] row-major, wscale F32 [n_out]: W[o][k] = w[o][k]*wscale[o]
 *   out    F32 [n_tok] rows of stride_out elements, n_out written
 * Inside the op each row of x is quantized per token, symmetric:
 *   sx[t] = max_k |x[t][k]| / 127 (over non-outlier channels); q = x/sx rounded to
 *   nearest, ties to even, clamped to [-127, 127]; a zero row gives q = 0, sx = 0.
 *   Then out = (sum_k q[t][k]*w[o][k]) * sx[t] * wscale[o] with an exact int32 sum.
 * Outlier channels (n_outlier > 0, else ignored): outlier_idx I32 [n_outlier],
 *   strictly increasing input channels; outlier_w F32 [n_out][n_outlier]. Those
 *   channels take no part in the int8 path (they are excluded from sx and get
 *   q = 0, so whatever w holds there is ignored: a table shared with the embedding
 *   keeps its values) and are added in f32:
 *   out[t][o] += sum_j x[t][idx[j]] * outlier_w[o][j].
 * If accumulate is 1, the result is added to out instead of overwriting it.
 * out must not overlap x. k <= 65536 so the int32 sum cannot overflow.
 * Tolerance: abs 1e-4 * (max|out|), from f32 rounding of the scale product only.
 *
 * Packed weights (version 3: wdtype DRAY_PACKED, packed a handle created with
 * DRAY_WUSE_MATMUL; w, wscale and the outlier views are ignored, n_outlier must
 * be 0, n_out and k must be the handle's). W is as "Packed weights" defines it.
 * Activations are quantized per token and per group of 32 inputs, symmetric:
 *   sx[t][g] = max_{c in g} |x[t][c]| / 127, q = x/sx rounded to nearest even,
 *   clamped to [-127, 127] (a zero group: q = 0, sx = 0), and
 *   out[t][o] = sum over g, accumulated in f32, of
 *     sx[t][g] * (d(o,g) * (float)(sum_{c in g} q*code) + m'(o,g) * (float)(sum_{c in g} q))
 *   with exact int32 group sums, m' = m (with a min) or -z*d (without one).
 *   With 6-bit two-level weights each half of a group is its own term: the
 *   bracket is the sum over h of d(o,h) * (sum_{c in h} q*code) + m'(o,h) *
 *   (sum_{c in h} q), under the group's one sx.
 * A group's scale only sees its own 32 channels, so an outlier channel costs
 * precision only to the 31 beside it.
 * passes = 2 (two-pass activations, declared by bit 1 of matmul_passes): one
 * int8 pass leaves each input off by up to sx/2; over 30 layers that is most of
 * the int8 path's distance from f32 (docs/performance.md). So x is quantized as
 * above into (q, sx), then its residual
 *   r[t][c] = x[t][c] - q[t][c] * sx[t][g]   (in f32; fused or not)
 * by the same rule into (q', sx') (|r| <= sx/2, so sx' <= sx/254), and
 *   out = (out if accumulating) + [the sum over (q, sx)] + [the same over (q', sx')].
 * A kernel may run the two passes as two token rows against the same weight
 * bytes: decoding (memory-bound) costs about the same. passes 0 means 1.
 * accumulate as for I8.
 * Tolerance: abs 1e-4 * sum_k |x[t][k]| |W[o][k]| (+ |out| when accumulating) per
 *   output, for the f32 order of the group terms (a fast kernel may sum them in
 *   another order, or in a wider type). */
struct dray_matmul_args {
    struct dray_view x, w, wscale, out;
    struct dray_view outlier_idx, outlier_w;
    uint32_t n_tok, n_out, k;
    uint32_t stride_x, stride_out;
    uint32_t n_outlier;
    uint32_t accumulate;
    uint32_t wdtype; /* DRAY_I8, DRAY_F32 or (v3) DRAY_PACKED; set it explicitly
                      * (DRAY_F32 is 0) */
    struct dray_packed *packed; /* v3, wdtype DRAY_PACKED only */
    uint32_t passes;            /* v3, DRAY_PACKED only: activation passes, 1 or 2 */
};

/* Rotary embedding, NEOX layout, in place, on n_head heads of each token:
 *   v = x + t*stride + h*head_dim, p = pos[t] (I32 [n_tok]),
 *   for i < n_rot/2: theta = p * freq_scale * base^(-2i/n_rot) / ff[i]
 *     c = cos(theta) * mscale, s = sin(theta) * mscale
 *     (v[i], v[i+n_rot/2]) <- (v[i]c - v[i+n_rot/2]s, v[i]s + v[i+n_rot/2]c)
 *   elements n_rot..head_dim-1 are left alone. n_rot is even, <= head_dim.
 *   ff = freq_factors, F32 [n_rot/2] (v4; a NULL buffer means every ff[i] = 1),
 *   mscale = attn_factor (v4; 0 means 1). Llama 3's rope_freqs, LongRoPE's
 *   factor tables and YaRN's per-pair blend are all per-pair divisors of the
 *   angle (the host turns YaRN into ff), and YaRN/LongRoPE scale the magnitude.
 *   A host never sets either for a plugin of version < 4.
 * Tolerance: abs 1e-4 * max(1, mscale) for |p| < 2^17 (angles are reduced in
 * double or with an exact cache; a plain f32 pow chain is not enough for long
 * contexts). */
struct dray_rope_args {
    struct dray_view x, pos;
    uint32_t n_tok, n_head, head_dim, n_rot;
    uint32_t stride; /* elements between tokens */
    float base, freq_scale;
    struct dray_view freq_factors; /* v4 */
    float attn_factor;             /* v4 */
};

/* The paged KV pool one layer group writes and reads. A slot is one token of one
 * sequence; slot s lives in block s / block_size. Layout, slot-major:
 *   k, v     dtype [n_slots][n_kv_head][head_dim]   (dtype I8 or F16)
 *   k_scale, v_scale  F32 [n_slots][n_kv_head]     (I8 only; dequant = q * scale)
 * int8 quantization per token per head: scale = max|x|/127, q = round-to-nearest-
 * even(x/scale) clamped to [-127,127]; an all-zero vector stores scale 0. */
struct dray_kv_pool {
    struct dray_view k, v, k_scale, v_scale;
    uint32_t dtype;      /* DRAY_I8 or DRAY_F16 */
    uint32_t n_kv_head, head_dim;
    uint32_t block_size; /* tokens per block */
    uint32_t n_slots;    /* = n_blocks * block_size */
};

/* KV store: for each token t, write k/v of all kv heads into slot slots[t].
 *   k, v   F32 rows of stride_k / stride_v elements, [n_kv_head][head_dim] used
 *   slots  I32 [n_tok]; a slot < 0 means "do not store" (padding)
 * Tolerance: I8 bit-exact with the rule above except ties (|q| off by one in at
 * most 1e-3 of elements); F16 round-to-nearest-even exact. */
struct dray_kv_store_args {
    struct dray_view k, v, slots;
    const struct dray_kv_pool *pool;
    uint32_t n_tok, stride_k, stride_v;
};

/* Paged attention over a mixed batch of prefill and decode sequences.
 *   seqs   I32 [n_seq][4] = { q_start, n_q, kv_len, bt_start } per sequence:
 *          its queries are rows q_start .. q_start+n_q-1 of q, at positions
 *          kv_len-n_q .. kv_len-1; its cache holds positions 0 .. kv_len-1
 *          (the new tokens' K/V must already be stored).
 *   block_table I32: position p of a sequence is in slot
 *          block_table[bt_start + p/block_size]*block_size + p%block_size.
 *          Entries for blocks the mask never reaches may be -1.
 *   q      F32 [n_tok] rows of stride_q: [n_head][head_dim]
 *   out    F32 [n_tok] rows of stride_out: [n_head][head_dim]; must not overlap q
 * Query head h reads kv head h / (n_head / n_kv_head) (MQA/GQA).
 * Mask: query at position p attends j with j <= p and, when window > 0, p - j < window.
 * o = sum_j softmax_j(s_j) v_j with s_j = scale * q.k_j, softmax in f32 with max
 * subtraction; with softcap > 0 (v4: Gemma 2's attention logit soft-capping)
 * s_j = softcap * tanh(scale * q.k_j / softcap) instead. A host never sets
 * softcap for a plugin of version < 4.
 * max_kv_len is the largest kv_len in seqs (for sizing grids).
 * Tolerance: abs 2e-3 relative to max|v| for I8 (dequantized k/v are the truth),
 * 1e-4 for F16. */
struct dray_attention_args {
    struct dray_view q, out, seqs, block_table;
    const struct dray_kv_pool *pool;
    uint32_t n_tok, n_seq, n_head, max_kv_len;
    uint32_t stride_q, stride_out;
    uint32_t window; /* 0 = full causal attention */
    float scale;     /* usually 1/sqrt(head_dim) */
    float softcap;   /* v4; 0 = none */
};

enum dray_act { DRAY_ACT_GELU_TANH = 0, DRAY_ACT_SILU = 1 };

/* Gated activation: out[t][i] = act(gate[t][i]) * up[t][i], i < n.
 *   gate, up, out  F32 rows of their strides (elements between tokens).
 *   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));  silu(x) = x/(1+e^-x)
 * out may alias gate or up exactly. Tolerance: rel 1e-5 + abs 1e-6. */
struct dray_gated_act_args {
    struct dray_view gate, up, out;
    uint32_t n_tok, n;
    uint32_t stride_gate, stride_up, stride_out;
    uint32_t act; /* enum dray_act */
};

/* Residual add: out[i] = a[i] + b[i], F32 [n]. out may alias a or b exactly. Exact. */
struct dray_add_args {
    struct dray_view a, b, out;
    uint64_t n;
};

/* ----------------------------------------------------------- the table */

struct dray_ops {
    uint32_t version;     /* DRAY_ABI_VERSION the plugin implements */
    const char *name;     /* "cpu", "opencl", ...: short, unique */
    const char *describe; /* one line: what it runs on, how it was built */

    /* Devices. props may be asked without opening. */
    int (*device_count)(uint32_t *count);
    int (*device_props)(uint32_t index, struct dray_device_props *props);
    /* Open device index. On failure *out is NULL and err holds a reason. */
    int (*open)(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out,
                char *err, size_t errlen);
    void (*close)(struct dray_ctx *ctx);
    /* Why the last call on ctx failed; "" if it did not. Valid until the next call. */
    const char *(*last_error)(struct dray_ctx *ctx);

    /* Memory. Buffers are at least 64-byte aligned. Transfers are ordered on the
     * context's queue like ops; download returns once the data is on the host. */
    int (*alloc)(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out);
    void (*free)(struct dray_ctx *ctx, struct dray_buf *buf);
    int (*upload)(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes);
    int (*download)(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes);
    int (*copy)(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes);
    /* Fill nbytes (a multiple of 4) with a repeated 32-bit pattern. */
    int (*fill)(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes);
    /* Wait until every op queued on ctx has finished. */
    int (*synchronize)(struct dray_ctx *ctx);

    /* Operators, queued in order on ctx. Contracts are on the argument structs. */
    int (*embed)(struct dray_ctx *ctx, const struct dray_embed_args *a);
    int (*rmsnorm)(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a);
    int (*matmul)(struct dray_ctx *ctx, const struct dray_matmul_args *a);
    int (*rope)(struct dray_ctx *ctx, const struct dray_rope_args *a);
    int (*kv_store)(struct dray_ctx *ctx, const struct dray_kv_store_args *a);
    int (*attention)(struct dray_ctx *ctx, const struct dray_attention_args *a);
    int (*gated_act)(struct dray_ctx *ctx, const struct dray_gated_act_args *a);
    int (*add)(struct dray_ctx *ctx, const struct dray_add_args *a);

    /* Version 1 had host_ptr here (the host address of a buffer on a unified
     * device). No host ever called it; since version 2 the slot is reserved:
     * set it NULL. It stays so that the members after it keep their offsets. */
    void *(*reserved_v1)(struct dray_ctx *ctx, struct dray_buf *buf);
    /* members above: version 1. Append only; never reorder. */

    /* Per-op dtypes and limits of device index, without opening it (see struct
     * dray_op_caps). Mandatory in version 2. */
    int (*op_caps)(uint32_t index, struct dray_op_caps *caps);
    /* members above: version 2. */

    /* Pack one weight matrix (see "Packed weights") into the plugin's own
     * layout in device memory. *device_bytes = the bytes it holds there. On
     * failure *out is NULL and last_error says why; DRAY_ENOTSUP for a format
     * or shape the plugin does not take. Queued like an upload: the host
     * arrays may be reused once it returns; DRAY_EINVAL for a malformed
     * descriptor. weight_create and weight_free are both mandatory in version 3
     * for a plugin that declares any wformat. */
    int (*weight_create)(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                         struct dray_packed **out, uint64_t *device_bytes);
    /* Release it; NULL is a no-op. The host frees every handle before close. */
    void (*weight_free)(struct dray_ctx *ctx, struct dray_packed *w);
    /* members above: version 3. Version 4 adds no member: it widens two ops'
     * arguments (rope freq_factors and attn_factor, attention softcap), which a
     * host sets only for a plugin of version 4 or newer, and adds the
     * two-level weight formats (declared by their bits). */

    /* Version 5: prepared layouts. A packed handle's bytes out and back in, so
     * that a host can keep what weight_create made in a file and map it at
     * later starts instead of packing again (docs/plugin-abi.md, "Prepared
     * layouts"). Optional: all three or none.
     * weight_export: the bytes of w into dst, *nbytes its room (exactly the
     *   size a call with dst NULL put in *nbytes). The bytes are the plugin's
     *   own: a host stores them as they are, under layout_id, and gives them
     *   back only to weight_import of a plugin with the same layout_id.
     * weight_import: a handle from those bytes for the shape in desc (format,
     *   n_out, k and uses as weight_create had them; the arrays NULL). src is
     *   64-byte aligned and stays readable and unchanged until weight_free, so
     *   a plugin whose kernels read host memory may use it in place. Check
     *   what can be checked cheaply (a header, the sizes): DRAY_EINVAL for
     *   bytes that are not an export of this shape. */
    int (*weight_export)(struct dray_ctx *ctx, const struct dray_packed *w, void *dst, uint64_t *nbytes);
    int (*weight_import)(struct dray_ctx *ctx, const struct dray_weight_desc *desc, const void *src,
                         uint64_t nbytes, struct dray_packed **out, uint64_t *device_bytes);
    /* Names the layout export writes ("cpu-1"): change it whenever the bytes
     * change meaning, and a host's stored copies are made again. */
    const char *layout_id;
    /* members above: version 5. */
};

/*
 * The one exported symbol.
 *   In:  *version = newest ABI the host speaks; host = its services.
 *   Out: *version = the ABI the plugin will use (<= the host's), *ops = its table.
 * Return 0, or DRAY_EINCOMPAT when the plugin cannot speak any version the host
 * offers; write a reason into err. A missing runtime (no driver, no device) is
 * not a refusal: negotiate succeeds and device_count reports 0 devices and logs
 * why through host->log (docs/plugin-abi.md, "A missing runtime").
 * Must be cheap and side-effect free: no runtime or device is touched before
 * device_count/open().
 */
typedef int (*dray_plugin_negotiate_fn)(uint32_t *version, const struct dray_host *host,
                                        const struct dray_ops **ops, char *err, size_t errlen);
#define DRAY_PLUGIN_SYMBOL "dray_plugin_negotiate"

DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *host,
                                      const struct dray_ops **ops, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* DRAY_BACKEND_H */
