/* Private to the CPU plugin: the context, buffers, and the kernel set a context
 * dispatches to (reference or AVX2, chosen once at open). */
#ifndef DRAY_CPU_INTERNAL_H
#define DRAY_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "cpu_kernels.h"
#include "cpu_pool.h"

#define DRAY_CPU_HIDDEN __attribute__((visibility("hidden")))

/* Return from the calling op with expr's code when it fails. */
#define CHECK(expr) DRAY_UTIL_TRY(expr)

struct dray_buf {
    void *p;        /* 64-byte aligned host memory */
    size_t size;    /* bytes */
};

/* One implementation of each op; the glue calls these on slices. */
struct dray_cpu_kernels {
    void (*embed)(const struct dray_cpu_embed *, uint32_t, uint32_t);
    void (*rmsnorm)(const struct dray_cpu_rmsnorm *, uint32_t, uint32_t);
    void (*quantize)(const struct dray_cpu_matmul *, uint32_t, uint32_t);
    void (*matmul)(const struct dray_cpu_matmul *, uint32_t, uint32_t);
    void (*rope)(const struct dray_cpu_rope *, uint32_t, uint32_t);
    void (*kv_store)(const struct dray_cpu_kv_store *, uint32_t, uint32_t);
    void (*attention)(const struct dray_cpu_attention *, uint32_t, uint32_t, void *);
    void (*gated_act)(const struct dray_cpu_gated_act *, uint32_t, uint32_t);
    /* grouped weights (DRAY_Q8G32, DRAY_Q4G32, DRAY_Q5G32, DRAY_Q4G32H): a quantize/matmul pair */
    void (*gquantize)(const struct dray_cpu_matmul *, uint32_t, uint32_t);
    void (*gmatmul)(const struct dray_cpu_matmul *, uint32_t, uint32_t);
};

struct dray_ctx {
    struct dray_cpu_pool *pool;
    uint32_t n_threads;
    int reference;                 /* 1: scalar reference kernels */
    int isa;                       /* enum dray_cpu_isa the kernels were picked for */
    struct dray_cpu_kernels k;
    char err[512];                 /* last_error(); "" after a successful call */
    /* Scratch grown on demand, kept between calls (ops run one at a time on a ctx). */
    void *scratch;
    size_t scratch_size;
};

/* Kernel sets, in order: each one needs the CPU features of the one before. */
enum dray_cpu_isa {
    DRAY_CPU_ISA_REFERENCE,
    DRAY_CPU_ISA_AVX2,
    DRAY_CPU_ISA_AVXVNNI,
    DRAY_CPU_ISA_AVX512VNNI,
    DRAY_CPU_ISA_AMX,
};

/* The device, for props and open (cpu_device.c). */
DRAY_CPU_HIDDEN int dray_cpu_have_avx2(void);
DRAY_CPU_HIDDEN int dray_cpu_have_avxvnni(void);
/* AVX-512 F/BW/VL/VNNI with the zmm and mask state enabled by the OS (XCR0). */
DRAY_CPU_HIDDEN int dray_cpu_have_avx512vnni(void);
/* AMX-TILE and AMX-INT8, the tile state enabled in XCR0, and the kernel granted
 * this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once). */
DRAY_CPU_HIDDEN int dray_cpu_have_amx(void);
/* The default kernel set: the best this build and CPU have, AMX excepted
 * (opt-in, see cpu_device.c). */
DRAY_CPU_HIDDEN int dray_cpu_best_isa(void);
DRAY_CPU_HIDDEN int dray_cpu_env_reference(void);
/* The kernel set to use: the best this build and CPU have, lowered by
 * want_reference, DRAY_CPU_REFERENCE=1 or
 * DRAY_CPU_ISA=reference|avx2|avxvnni|avx512vnni|amx
 * (asking for more than the CPU has gives the best it has). Returns the
 * enum dray_cpu_isa value, or DRAY_EINVAL with a reason in err for an unknown
 * DRAY_CPU_ISA. */
DRAY_CPU_HIDDEN int dray_cpu_pick_isa(int want_reference, char *err, size_t errlen);
/* "scalar", "avx2+fma", "avx-vnni", "avx512-vnni", "amx-int8" (shown in the device name). */
DRAY_CPU_HIDDEN const char *dray_cpu_isa_name(int isa);
DRAY_CPU_HIDDEN int dray_cpu_device_props(uint32_t index, struct dray_device_props *props);

/* Record a reason on ctx and return rc. */
DRAY_CPU_HIDDEN int dray_cpu_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A 64-byte aligned scratch area of at least nbytes owned by ctx, or NULL. */
DRAY_CPU_HIDDEN void *dray_cpu_scratch(struct dray_ctx *ctx, size_t nbytes);

/* Ops (cpu_ops.c, cpu_attention_op.c). */
DRAY_CPU_HIDDEN int dray_cpu_embed(struct dray_ctx *ctx, const struct dray_embed_args *a);
DRAY_CPU_HIDDEN int dray_cpu_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a);
DRAY_CPU_HIDDEN int dray_cpu_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a);
DRAY_CPU_HIDDEN int dray_cpu_rope(struct dray_ctx *ctx, const struct dray_rope_args *a);
DRAY_CPU_HIDDEN int dray_cpu_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a);
DRAY_CPU_HIDDEN int dray_cpu_attention(struct dray_ctx *ctx, const struct dray_attention_args *a);
DRAY_CPU_HIDDEN int dray_cpu_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a);
DRAY_CPU_HIDDEN int dray_cpu_add(struct dray_ctx *ctx, const struct dray_add_args *a);

/* Argument checking shared by the ops (cpu_check.c). Each returns 0 or DRAY_EINVAL
 * with a reason on ctx naming the argument. */
/* Pointer to bytes [offset, offset+nbytes) of v->buf; offset must be a multiple of align. */
DRAY_CPU_HIDDEN int dray_cpu_view(struct dray_ctx *ctx, const char *what, struct dray_view v,
                                  size_t nbytes, size_t align, void **out);
/* An op's argument checks: rc is what the shared validator (dray_util_check_<op>
 * in dray/backend_util.h, which wrote its reason into ctx->err) returned; when 0,
 * each view it listed is checked against its buffer and p[i] gets view i's
 * pointer (NULL for an empty one). */
DRAY_CPU_HIDDEN int dray_cpu_args(struct dray_ctx *ctx, int rc, const struct dray_util_needs *nd,
                                  void **p);

/* Run body(arg, i0, i1) over [0, n) split in contiguous slices (multiples of grain)
 * across the pool; runs inline when the work is too small to share. */
typedef void (*dray_cpu_body_fn)(void *arg, uint32_t i0, uint32_t i1, uint32_t ith);
DRAY_CPU_HIDDEN void dray_cpu_parallel(struct dray_ctx *ctx, uint32_t n, uint32_t grain, double work,
                                       dray_cpu_body_fn body, void *arg);

#endif
