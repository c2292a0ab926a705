/*
 * The OpenCL plugin's private header: the context and buffer behind the opaque
 * handles of backend.h, the kernel list, and small helpers shared by the files
 * of backends/opencl (plugin: devices and the table; mem: buffers; ops: the
 * operators; util: errors, view checks, launches).
 */
#ifndef DRAY_OCL_H
#define DRAY_OCL_H

#include <stddef.h>
#include <stdint.h>

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>

#include "dray/backend.h"
#include "dray/backend_util.h"

/* Every kernel of kernels/opencl, by function name; one cl_kernel each per context. */
#define DRAY_OCL_KERNELS(X)                                                                   \
    X(embed_i8) X(embed_f32) X(gated_act) X(add_f32) X(fill_bytes) X(rmsnorm) X(mm_quantize) \
    X(mm_i8) X(mm_f32) X(rope) X(kv_store_i8) X(kv_store_f16) X(attention) X(pk_quantize)  \
    X(pk_matmul) X(pk_embed)

enum dray_ocl_kernel {
#define DRAY_OCL_ENUM(name) OCL_K_##name,
    DRAY_OCL_KERNELS(DRAY_OCL_ENUM)
#undef DRAY_OCL_ENUM
    OCL_K_COUNT
};

/* Work-group size of the row kernels; must equal DRAY_WG in common.cl. */
#define DRAY_OCL_WG 64u
/* Largest head_dim the attention kernel handles (DRAY_HD_MAX in common.cl). */
#define DRAY_OCL_HD_MAX 512u
/* Tokens per work-item of mm_i8 (MM_TT in matmul.cl). */
#define DRAY_OCL_MM_TT 4u
/* Packed formats taken for matmul and embed: every one of one level, and the
 * two-level (GGUF K-quant) shapes. */
#define DRAY_OCL_WFORMATS (DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K)

/* What a device can do, read once per device. */
struct dray_ocl_caps {
    int fp16;      /* cl_khr_fp16: fp16 arithmetic (we only store f16 anyway) */
    int int_dot;   /* cl_khr_integer_dot_product: packed 4x8 dot products */
    int fp64;      /* cl_khr_fp64: rope/rmsnorm/activation in double */
    int cr_divide; /* CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT for single precision */
};

struct dray_buf {
    cl_mem mem;
    size_t size; /* bytes the caller asked for (the cl_mem may be larger) */
};

struct dray_ctx {
    cl_context cl;
    cl_device_id dev;
    cl_command_queue queue; /* in order: ops and transfers run in call order */
    cl_program prog;        /* built once at open, kept for the context's life */
    cl_kernel k[OCL_K_COUNT];
    struct dray_ocl_caps caps;
    int reference;          /* open option: no integer-dot extension path */
    int fp64;               /* the program was built with DRAY_OCL_FP64 */
    size_t max_alloc;

    /* matmul activation scratch: q int8 [n_tok][k] and sx f32 [n_tok] (packed
     * weights: q [n_tok*passes][k] and (sx, sum q) float2 [n_tok*passes][k/32]),
     * grown on demand; safe to reuse because the queue is in order. */
    cl_mem q8;
    size_t q8_size;
    cl_mem sx;
    size_t sx_size;

    /* rope frequencies as (hi, lo) float pairs for devices without fp64, rebuilt
     * when base / freq_scale / n_rot change. */
    cl_mem rope_tab;
    float rope_base, rope_freq_scale;
    uint32_t rope_n_rot;

    char err[1024]; /* last_error */
};

/* One packed weight matrix (weight_create): the planes of packed.cl's layout
 * in one buffer, lo at byte 0. */
#define DRAY_OCL_PACKED_MAGIC 0x6f636c70u /* "oclp": a live handle of this plugin */
struct dray_packed {
    uint32_t magic;
    const struct dray_ctx *owner; /* its cl_mem belongs to this context's cl_context */
    struct dray_wformat f;
    uint32_t n_out, k, uses;
    cl_mem mem;
    /* bytes; a plane a format lacks is empty (its offset = the next one's) */
    cl_ulong off_hi, off_sub, off_d, off_m;
    uint64_t bytes; /* one level: the host's codes + d + m; two: the file's size */
};

/* ---- util ---- */

/* Host services from negotiate (never NULL after it; defaults to malloc/free). */
void *dray_ocl_alloc(size_t n);
void dray_ocl_free(void *p);
void dray_ocl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dray_ocl_set_host(const struct dray_host *host);

/* "CL_OUT_OF_RESOURCES (-5)": the name of an OpenCL error code, for messages. */
const char *dray_ocl_strerror(cl_int rc, char *buf, size_t len);
/* Format into ctx->err (and clear it with fmt = ""); returns rc. */
int dray_ocl_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Same, for a failed OpenCL call: "<what>: CL_... (-n)"; returns DRAY_EBACKEND
 * (DRAY_ENOMEM for the out-of-memory codes). */
int dray_ocl_fail_cl(struct dray_ctx *ctx, cl_int rc, const char *what);

/* Check that v names nbytes inside its buffer at an offset aligned to elem bytes.
 * On failure writes "<op>: <name>: ..." into ctx->err and returns DRAY_EINVAL. */
int dray_ocl_check_view(struct dray_ctx *ctx, const char *op, const char *name,
                        struct dray_view v, size_t nbytes, size_t elem);

/* An op's argument checks, from the shared helper (dray/backend_util.h):
 * validator is dray_util_check_<op>; it applies the contract's rules and lists
 * the views the op touches, which are then checked against their buffers. The
 * reason goes to ctx->err. */
size_t dray_ocl_buf_size(const struct dray_buf *buf, int *live);
/* Return from the calling function with call's code when it fails. */
#define CHECK(call) DRAY_UTIL_TRY(call)

#define DRAY_OCL_CHECK_ARGS(ctx, validator, a, nd)                                            \
    do {                                                                                      \
        int rc_ = validator((a), (nd), (ctx)->err, sizeof((ctx)->err));                      \
        if (rc_ == 0)                                                                         \
            rc_ = dray_util_check_views((nd), dray_ocl_buf_size, (ctx)->err, sizeof((ctx)->err)); \
        if (rc_)                                                                              \
            return rc_;                                                                       \
    } while (0)

/* Kernel argument builder: each add sets the next argument; the first failure
 * sticks and is reported by dray_ocl_launch. */
struct dray_ocl_args {
    cl_kernel k;
    cl_uint next;
    cl_int rc;
};
void dray_ocl_arg(struct dray_ocl_args *a, size_t size, const void *value);
/* A view as two arguments: its cl_mem and its offset in elements (ulong). */
void dray_ocl_arg_view(struct dray_ocl_args *a, struct dray_view v, size_t elem);
#define DRAY_OCL_ARG(a, v) dray_ocl_arg((a), sizeof(v), &(v))

/* Enqueue a kernel over global[dims]; global sizes are rounded up to local
 * (local NULL: 64 along dim 0, 1 elsewhere). Empty grids do nothing. */
int dray_ocl_launch(struct dray_ctx *ctx, const char *op, const struct dray_ocl_args *a,
                    cl_uint dims, const size_t *global, const size_t *local);

/* ---- devices (plugin.c) ---- */

/* The flattened list of every platform's devices (enumerated once). */
int dray_ocl_devices(cl_device_id **devs, uint32_t *n, const char **why);
void dray_ocl_read_caps(cl_device_id dev, struct dray_ocl_caps *caps);

/* ---- memory (mem.c) and ops (ops.c): the table's members ---- */

int dray_ocl_alloc_buf(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out);
void dray_ocl_free_buf(struct dray_ctx *ctx, struct dray_buf *buf);
int dray_ocl_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes);
int dray_ocl_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes);
int dray_ocl_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes);
int dray_ocl_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes);
int dray_ocl_synchronize(struct dray_ctx *ctx);
/* Grow a scratch cl_mem to at least nbytes. */
int dray_ocl_scratch(struct dray_ctx *ctx, cl_mem *mem, size_t *size, size_t nbytes, const char *what);

int dray_ocl_embed(struct dray_ctx *ctx, const struct dray_embed_args *a);
int dray_ocl_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a);
int dray_ocl_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_ocl_rope(struct dray_ctx *ctx, const struct dray_rope_args *a);
int dray_ocl_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a);
int dray_ocl_attention(struct dray_ctx *ctx, const struct dray_attention_args *a);
int dray_ocl_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a);
int dray_ocl_add(struct dray_ctx *ctx, const struct dray_add_args *a);

/* ---- packed weights (ocl_packed.c), version 3 ---- */

int dray_ocl_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                           struct dray_packed **out, uint64_t *device_bytes);
void dray_ocl_weight_free(struct dray_ctx *ctx, struct dray_packed *w);
/* matmul with wdtype DRAY_PACKED and embed with dtype DRAY_PACKED */
int dray_ocl_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_ocl_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a);
/* embed: every id below n_rows (read back on the host) */
int dray_ocl_check_ids(struct dray_ctx *ctx, const struct dray_embed_args *a);

#endif
