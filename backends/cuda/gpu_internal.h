/*
 * gpu_internal.h — state shared by the GPU plugin's host files. The same C
 * sources build the CUDA plugin (libdray-cuda.so) and, with -DDRAY_GPU_HIP,
 * the ROCm plugin (libdray-hip.so); kernels/cuda/gpu_port.h maps the names.
 */
#ifndef DRAY_GPU_INTERNAL_H
#define DRAY_GPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "gpu_kernels.h"
#include "gpu_port.h"

#if defined(DRAY_GPU_HIP)
#define GPU_PLUGIN_NAME "hip"
#else
#define GPU_PLUGIN_NAME "cuda"
#endif

#define GPU_GRAPH_CACHE 8 /* captured op sequences kept for replay */

/* Packed weights (version 3): every format for matmul and embed, the twelve of
 * one level and (version 4) GGUF's Q4_K, Q5_K and Q6_K shapes, one or two
 * activation passes (op_caps.matmul_wformats, embed_wformats, matmul_passes). */
#define GPU_WFORMATS (DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K)
#define GPU_MATMUL_PASSES 3u

struct dray_buf {
    void *p;     /* device memory from gpuMalloc (never managed memory) */
    size_t size; /* bytes asked for */
};

struct gpu_graph_entry {
    uint64_t hash;      /* FNV-1a over every captured op's kernel arguments */
    uint64_t last_use;  /* LRU clock */
    gpuGraphExec_t exec;
};

struct dray_ctx {
    int dev;
    gpuStream_t stream;   /* the context's queue: every op and transfer */
    gpuEvent_t done;      /* recorded by synchronize; waited on with blocking sync */
    uint32_t *flag;       /* device word: gk_flag_bits raised by kernels */
    void *scratch;        /* device scratch for matmul / attention, grows */
    size_t scratch_size;
    uint32_t use_mma;     /* tensor-core int8 path (CUDA, sm_80+, not reference) */
    uint32_t n_sm;        /* multiprocessors (split-K sizing) */
    uint32_t reference;   /* simplest kernel paths only (no MMA, no split-K) */
    /* optional graph capture (DRAY_GPU_GRAPHS=1): ops between two host waits
     * are captured; an identical sequence replays its cached executable graph */
    uint32_t graphs, capturing;
    uint64_t cap_hash, clock;
    struct gpu_graph_entry cache[GPU_GRAPH_CACHE];
    char err[512];
};

extern const struct dray_host *dray_gpu_host;

/* Record a reason on ctx (and return rc). */
int dray_gpu_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Map a runtime error to DRAY_EBACKEND with its name and text. */
int dray_gpu_rt_fail(struct dray_ctx *ctx, int gpu_err, const char *what);
/* Device address of a view with nbytes in bounds and offset aligned to align. */
int dray_gpu_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
                  size_t align, void **out);
/* Bytes a view holds from its offset to the end of its buffer. */
size_t dray_gpu_view_avail(struct dray_view v);
/* Grow the scratch buffer to at least nbytes. */
int dray_gpu_scratch(struct dray_ctx *ctx, size_t nbytes, void **out);
/* Before queueing an op: start a capture in graph mode and fold the op's
 * arguments (a fully initialised struct) into the sequence hash. */
int dray_gpu_op_begin(struct dray_ctx *ctx, const void *args, size_t len);
/* End a capture, if any, and launch (or replay) its graph. */
int dray_gpu_flush(struct dray_ctx *ctx);
/* Wait for the queue and report device-side contract violations. */
int dray_gpu_wait(struct dray_ctx *ctx);
/* After a shared validator returned rc: check each view it listed against its
 * buffer and resolve it to a device address p[i] (gpu_ops.c). */
int dray_gpu_args_ok(struct dray_ctx *ctx, int rc, const struct dray_util_needs *nd, void **p);
/* Outside graph capture, read embed's ids back so a bad one fails the call. */
int dray_gpu_embed_check_ids(struct dray_ctx *ctx, const int32_t *ids_dev, uint32_t n_tok, uint32_t n_rows);

int dray_gpu_embed(struct dray_ctx *ctx, const struct dray_embed_args *a);
int dray_gpu_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a);
int dray_gpu_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_gpu_rope(struct dray_ctx *ctx, const struct dray_rope_args *a);
int dray_gpu_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a);
int dray_gpu_attention(struct dray_ctx *ctx, const struct dray_attention_args *a);
int dray_gpu_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a);
int dray_gpu_add(struct dray_ctx *ctx, const struct dray_add_args *a);
int dray_gpu_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes);

/* gpu_packed.c: weight handles and the ops on them (wdtype / dtype DRAY_PACKED) */
int dray_gpu_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc, struct dray_packed **out,
                           uint64_t *device_bytes);
void dray_gpu_weight_free(struct dray_ctx *ctx, struct dray_packed *w);
int dray_gpu_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_gpu_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a);

#endif
