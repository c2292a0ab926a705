/* Private to the CPU plugin: the context, buffers, and the kernel set a context
 * dispatches to (reference or AVX2, chosen once at open). */
#ifndef DRAY_CPU_INTERNAL_H
#define DRAY_CPU_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "cpu_isa.h"
#include "cpu_kernels.h"
#include "cpu_pool.h"

/* Return from the calling op with expr's code when it fails. */
#define CHECK(expr) DRAY_UTIL_TRY(expr)

struct dray_buf {
    void *p;        /* 64-byte aligned host memory */
    size_t size;    /* bytes */
    size_t mapped;  /* bytes mmap'd for a large buffer (pages zero until touched); 0: heap */
    size_t advised; /* bytes from the start advised for huge pages (cpu_upload) */
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

/* The angle table of one rope configuration (cpu_ops.c): the cosines and sines
 * for the positions pos[0..n_tok) at (base, freq_scale, n_rot, frequency
 * factors, mscale). */
struct dray_cpu_rope_table {
    float *cs;         /* [n_tok][n_rot]: n_rot/2 cosines, then the sines */
    int32_t *pos;
    float *ff;         /* a copy of the v4 freq_factors [n_rot/2] it was made with */
    size_t cap_cs, cap_pos, cap_ff; /* floats, positions and factors they hold */
    uint32_t n_tok, n_rot;
    float base, freq_scale, mscale;
    int has_ff;        /* 0: made without factors (all 1) */
};
#define DRAY_CPU_ROPE_TABLES 2 /* Gemma 3's local and global bases */

/* One entry of the next-weights table: after the packed matmul whose w is
 * key came the one at w / scale. Values, not pointers to the weight: a stale
 * entry only fetches memory nobody reads (a prefetch never faults). */
#define DRAY_CPU_NEXT_SLOTS 256u
struct dray_cpu_next {
    const void *key;
    const char *w, *scale;
    size_t wbytes, sbytes;
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
    /* Rope angles kept across the layers of a step, the oldest replaced first. */
    struct dray_cpu_rope_table rope[DRAY_CPU_ROPE_TABLES];
    uint32_t rope_next;
    /* Which packed weights followed which in the last step (cpu_ops.c,
     * "the next weights"): the idle worker fetches them ahead. */
    struct dray_cpu_next next[DRAY_CPU_NEXT_SLOTS];
    const void *last_w; /* the last packed matmul's w */
    struct {            /* what an idle worker fetches now (fields may mix: harmless) */
        _Atomic(const char *) w, scale;
        _Atomic size_t wbytes, sbytes;
    } ahead;
};

/* The device, for props and open (cpu_device.c). */
DRAY_CPU_HIDDEN int dray_cpu_env_reference(void);
/* The kernel set to use (enum dray_cpu_isa): the reference for want_reference
 * or DRAY_CPU_REFERENCE=1, else dray_cpu_isa_choose over this CPU and
 * DRAY_CPU_ISA=reference|avx2|avxvnni|avx512vnni|amx (a set the CPU lacks gives
 * the default and one warning naming what it lacks). DRAY_EINVAL with a reason
 * in err for an unknown DRAY_CPU_ISA. */
DRAY_CPU_HIDDEN int dray_cpu_pick_isa(int want_reference, char *err, size_t errlen);
/* A message through the host's log (negotiate keeps the host), if it has one. */
DRAY_CPU_HIDDEN void dray_cpu_log(int level, const char *msg);
DRAY_CPU_HIDDEN int dray_cpu_device_props(uint32_t index, struct dray_device_props *props);

/* Record a reason on ctx and return rc. */
DRAY_CPU_HIDDEN int dray_cpu_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A 64-byte aligned scratch area of at least nbytes owned by ctx, or NULL. */
DRAY_CPU_HIDDEN void *dray_cpu_scratch(struct dray_ctx *ctx, size_t nbytes);

/* The pool's idle hook (cpu_ops.c): a worker fetches ctx->ahead. */
DRAY_CPU_HIDDEN void dray_cpu_fetch_ahead(void *ctx, const struct dray_cpu_pool *pool, unsigned gen);

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
