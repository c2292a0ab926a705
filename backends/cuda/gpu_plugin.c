/*
 * gpu_plugin.c — the CUDA / ROCm plugin: negotiation, devices, contexts,
 * memory, the queue (one stream per context), optional graph capture.
 *
 * One source, two plugins: built as-is with the CUDA runtime (linked
 * statically, so libdray-cuda.so needs only the driver, loaded lazily by
 * cudart) and with -DDRAY_GPU_HIP against libamdhip64. Without a driver or a
 * device, device_count() reports 0 and logs the reason; nothing aborts.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

const struct dray_host *dray_gpu_host;

/* ----------------------------------------------------------------- errors */

int dray_gpu_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
{
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
        va_end(ap);
    }
    return rc;
}

int dray_gpu_rt_fail(struct dray_ctx *ctx, int gpu_err, const char *what)
{
    gpuError_t e = (gpuError_t)gpu_err;
    return dray_gpu_fail(ctx, DRAY_EBACKEND, "%s: %s: %s (%s)", GPU_PLUGIN_NAME, what,
                         gpuGetErrorName(e), gpuGetErrorString(e));
}

static void host_log(int level, const char *msg)
{
    if (dray_gpu_host && dray_gpu_host->log)
        dray_gpu_host->log(level, GPU_PLUGIN_NAME, msg);
}

/* ---------------------------------------------------------------- devices */

/* The plain reason there is no device, for `dray devices`. */
static void describe_no_device(gpuError_t e, char *buf, size_t len)
{
#if defined(DRAY_GPU_HIP)
    if (e == hipErrorNoDevice || e == hipSuccess)
        snprintf(buf, len, "no ROCm device (hipErrorNoDevice)");
    else if (e == hipErrorInsufficientDriver)
        snprintf(buf, len, "no ROCm driver (hipErrorInsufficientDriver)");
#else
    if (e == cudaErrorInsufficientDriver)
        snprintf(buf, len, "no CUDA driver (cudaErrorInsufficientDriver)");
    else if (e == cudaErrorNoDevice || e == cudaSuccess)
        snprintf(buf, len, "no CUDA device (cudaErrorNoDevice)");
#endif
    else
        snprintf(buf, len, "%s runtime cannot list devices: %s (%s)", GPU_API_NAME,
                 gpuGetErrorName(e), gpuGetErrorString(e));
}

static int gpu_device_count(uint32_t *count)
{
    if (!count)
        return DRAY_EINVAL;
    int n = 0;
    gpuError_t e = gpuGetDeviceCount(&n);
    gpuGetLastError(); /* clear the sticky error the failed probe leaves */
    if (e != gpuSuccess || n <= 0) {
        char why[160];
        describe_no_device(e, why, sizeof(why));
        host_log(DRAY_LOG_INFO, why);
        n = 0;
    }
    *count = (uint32_t)n;
    return 0;
}

static int gpu_device_props(uint32_t index, struct dray_device_props *props)
{
    if (!props)
        return DRAY_EINVAL;
    int n = 0;
    if (gpuGetDeviceCount(&n) != gpuSuccess || index >= (uint32_t)n) {
        gpuGetLastError();
        return DRAY_ENODEV;
    }
    gpuDeviceProp dp;
    if (gpuGetDeviceProperties(&dp, (int)index) != gpuSuccess)
        return DRAY_EBACKEND;
    memset(props, 0, sizeof(*props));
    snprintf(props->name, sizeof(props->name), "%.127s", dp.name);
#if defined(DRAY_GPU_HIP)
    snprintf(props->vendor, sizeof(props->vendor), "AMD (%.48s)", dp.gcnArchName);
    props->flags = DRAY_DEV_INT8_DOT | DRAY_DEV_FP16;
#else
    snprintf(props->vendor, sizeof(props->vendor), "NVIDIA (sm_%d%d)", dp.major, dp.minor);
    props->flags = DRAY_DEV_FP16 | ((dp.major > 6 || (dp.major == 6 && dp.minor >= 1)) ? DRAY_DEV_INT8_DOT : 0);
#endif
    props->mem_total = dp.totalGlobalMem;
    props->mem_free = 0; /* asking would create a device context; unknown here */
    props->max_alloc = dp.totalGlobalMem;
    props->compute_units = (uint32_t)dp.multiProcessorCount;
    const uint32_t f32 = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_EMBED] = DRAY_DTYPE_BIT(DRAY_I8) | f32;
    props->op_dtypes[DRAY_OP_RMSNORM] = f32;
    props->op_dtypes[DRAY_OP_MATMUL] = DRAY_DTYPE_BIT(DRAY_I8) | f32;
    props->op_dtypes[DRAY_OP_ROPE] = f32;
    props->op_dtypes[DRAY_OP_KV_STORE] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_ATTENTION] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_GATED_ACT] = f32;
    props->op_dtypes[DRAY_OP_ADD] = f32;
    return 0;
}

/* --------------------------------------------------------------- contexts */

static int env_on(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0;
}

static void gpu_close(struct dray_ctx *ctx);

static int open_fail(struct dray_ctx *ctx, char *err, size_t errlen, int rc)
{
    if (err && errlen)
        snprintf(err, errlen, "%s", ctx->err);
    gpu_close(ctx);
    return rc;
}

static int gpu_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out, char *err,
                    size_t errlen)
{
    if (!out) {
        if (err && errlen)
            snprintf(err, errlen, "%s: open: out is NULL", GPU_PLUGIN_NAME);
        return DRAY_EINVAL;
    }
    *out = NULL;
    int n = 0;
    gpuError_t e = gpuGetDeviceCount(&n);
    if (e != gpuSuccess || n <= 0 || index >= (uint32_t)n) {
        gpuGetLastError();
        char why[160];
        if (e == gpuSuccess && n > 0)
            snprintf(why, sizeof(why), "there are %d devices (0..%d)", n, n - 1);
        else
            describe_no_device(e, why, sizeof(why));
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot open device %u: %s", GPU_PLUGIN_NAME, index, why);
        return DRAY_ENODEV;
    }
    struct dray_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory for the context", GPU_PLUGIN_NAME);
        return DRAY_ENOMEM;
    }
    ctx->dev = (int)index;
    ctx->reference = (DRAY_UTIL_OPT_HAS(opt, reference) && opt->reference) || env_on("DRAY_GPU_REFERENCE");
    ctx->graphs = env_on("DRAY_GPU_GRAPHS");
    gpuDeviceProp dp;
    if ((e = gpuSetDevice(ctx->dev)) != gpuSuccess || (e = gpuGetDeviceProperties(&dp, ctx->dev)) != gpuSuccess)
        return open_fail(ctx, err, errlen, dray_gpu_rt_fail(ctx, e, "select device"));
    ctx->n_sm = (uint32_t)dp.multiProcessorCount;
#if !defined(DRAY_GPU_HIP)
    ctx->use_mma = dp.major >= 8 && !ctx->reference;
#endif
    if ((e = gpuStreamCreateWithFlags(&ctx->stream, gpuStreamNonBlocking)) != gpuSuccess)
        return open_fail(ctx, err, errlen, dray_gpu_rt_fail(ctx, e, "create stream"));
    if ((e = gpuEventCreateWithFlags(&ctx->done, gpuEventBlockingSync | gpuEventDisableTiming)) != gpuSuccess)
        return open_fail(ctx, err, errlen, dray_gpu_rt_fail(ctx, e, "create event"));
    if ((e = gpuMalloc((void **)&ctx->flag, 256)) != gpuSuccess)
        return open_fail(ctx, err, errlen, dray_gpu_rt_fail(ctx, e, "allocate the flag word"));
    if ((e = gpuMemsetAsync(ctx->flag, 0, sizeof(uint32_t), ctx->stream)) != gpuSuccess ||
        (e = gpuStreamSynchronize(ctx->stream)) != gpuSuccess)
        return open_fail(ctx, err, errlen, dray_gpu_rt_fail(ctx, e, "clear the flag word"));
    *out = ctx;
    return 0;
}

static void graph_cache_clear(struct dray_ctx *ctx)
{
    for (int i = 0; i < GPU_GRAPH_CACHE; i++) {
        if (ctx->cache[i].exec)
            gpuGraphExecDestroy(ctx->cache[i].exec);
        ctx->cache[i].exec = NULL;
    }
}

static void gpu_close(struct dray_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->stream) {
        dray_gpu_flush(ctx);
        gpuStreamSynchronize(ctx->stream);
    }
    graph_cache_clear(ctx);
    if (ctx->scratch)
        gpuFree(ctx->scratch);
    if (ctx->flag)
        gpuFree(ctx->flag);
    if (ctx->done)
        gpuEventDestroy(ctx->done);
    if (ctx->stream)
        gpuStreamDestroy(ctx->stream);
    gpuGetLastError();
    free(ctx);
}

static const char *gpu_last_error(struct dray_ctx *ctx)
{
    return ctx ? ctx->err : GPU_PLUGIN_NAME ": NULL context";
}

/* ----------------------------------------------------------- graph capture */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int dray_gpu_op_begin(struct dray_ctx *ctx, const void *args, size_t len)
{
    if (!ctx->graphs)
        return 0;
    if (!ctx->capturing) {
        gpuError_t e = gpuStreamBeginCapture(ctx->stream, gpuStreamCaptureModeRelaxed);
        if (e != gpuSuccess) {
            ctx->graphs = 0; /* run eagerly from now on; say why once */
            host_log(DRAY_LOG_WARN, "graph capture unavailable; running ops eagerly");
            gpuGetLastError();
            return 0;
        }
        ctx->capturing = 1;
        ctx->cap_hash = 0xcbf29ce484222325ull;
    }
    ctx->cap_hash = fnv1a(ctx->cap_hash, args, len);
    return 0;
}

/* Replay the cached graph of an identical sequence, or instantiate this one
 * and keep it, evicting the least recently used. */
static int graph_launch(struct dray_ctx *ctx, gpuGraph_t g)
{
    struct gpu_graph_entry *hit = NULL, *lru = &ctx->cache[0];
    for (int i = 0; i < GPU_GRAPH_CACHE; i++) {
        struct gpu_graph_entry *c = &ctx->cache[i];
        if (c->exec && c->hash == ctx->cap_hash)
            hit = c;
        if (!c->exec || (lru->exec && c->last_use < lru->last_use))
            lru = c;
    }
    gpuError_t e = gpuSuccess;
    if (!hit) {
        if (lru->exec)
            gpuGraphExecDestroy(lru->exec);
        lru->exec = NULL;
        if ((e = gpu_graph_instantiate(&lru->exec, g)) != gpuSuccess) {
            lru->exec = NULL;
            return dray_gpu_rt_fail(ctx, e, "instantiate graph");
        }
        lru->hash = ctx->cap_hash;
        hit = lru;
    }
    hit->last_use = ++ctx->clock;
    if ((e = gpuGraphLaunch(hit->exec, ctx->stream)) != gpuSuccess)
        return dray_gpu_rt_fail(ctx, e, "launch graph");
    return 0;
}

int dray_gpu_flush(struct dray_ctx *ctx)
{
    if (!ctx->capturing)
        return 0;
    ctx->capturing = 0;
    gpuGraph_t g = NULL;
    gpuError_t e = gpuStreamEndCapture(ctx->stream, &g);
    if (e != gpuSuccess || !g) {
        gpuGetLastError();
        if (g)
            gpuGraphDestroy(g);
        return dray_gpu_rt_fail(ctx, e, "capture ops into a graph");
    }
    int rc = graph_launch(ctx, g);
    gpuGraphDestroy(g);
    return rc;
}

/* --------------------------------------------------------------- the queue */

static const char *flag_reason(uint32_t f)
{
    if (f & GK_FLAG_EMBED_ID)
        return "embed: a token id is outside [0, n_rows)";
    if (f & GK_FLAG_KV_SLOT)
        return "kv_store: a slot is >= pool n_slots";
    if (f & GK_FLAG_ATT_HOLE)
        return "attention: the mask reaches a block-table entry of -1";
    if (f & GK_FLAG_ATT_SLOT)
        return "attention: a block-table entry lies past the table or the pool";
    return "attention: a seqs row is inconsistent (need q_start+n_q <= n_tok, n_q <= kv_len, "
           "bt_start >= 0)";
}

int dray_gpu_wait(struct dray_ctx *ctx)
{
    int rc = dray_gpu_flush(ctx);
    if (rc)
        return rc;
    gpuError_t e;
    uint32_t f = 0;
    if ((e = gpuEventRecord(ctx->done, ctx->stream)) != gpuSuccess ||
        (e = gpuEventSynchronize(ctx->done)) != gpuSuccess)
        return dray_gpu_rt_fail(ctx, e, "wait for the queue");
    if ((e = gpuMemcpyAsync(&f, ctx->flag, sizeof(f), gpuMemcpyDeviceToHost, ctx->stream)) != gpuSuccess ||
        (e = gpuStreamSynchronize(ctx->stream)) != gpuSuccess)
        return dray_gpu_rt_fail(ctx, e, "read the error flag");
    if (!f)
        return 0;
    gpuMemsetAsync(ctx->flag, 0, sizeof(uint32_t), ctx->stream);
    return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: %s (found by the device; the op was skipped there)",
                         GPU_PLUGIN_NAME, flag_reason(f));
}

static int gpu_synchronize(struct dray_ctx *ctx)
{
    ctx->err[0] = '\0';
    return dray_gpu_wait(ctx);
}

/* ------------------------------------------------------------------ memory */

size_t dray_gpu_view_avail(struct dray_view v)
{
    return v.buf && v.offset <= v.buf->size ? v.buf->size - v.offset : 0;
}

int dray_gpu_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes, size_t align,
                  void **out)
{
    if (!v.buf)
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: %s: buffer is NULL", GPU_PLUGIN_NAME, what);
    if (align > 1 && v.offset % align)
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: %s: offset %zu is not a multiple of %zu",
                             GPU_PLUGIN_NAME, what, v.offset, align);
    if (v.offset > v.buf->size || nbytes > v.buf->size - v.offset)
        return dray_gpu_fail(ctx, DRAY_EINVAL,
                             "%s: %s: %zu bytes at offset %zu do not fit the buffer of %zu bytes",
                             GPU_PLUGIN_NAME, what, nbytes, v.offset, v.buf->size);
    *out = (char *)v.buf->p + v.offset;
    return 0;
}

int dray_gpu_scratch(struct dray_ctx *ctx, size_t nbytes, void **out)
{
    if (nbytes > ctx->scratch_size) {
        /* the old scratch may be named by queued or captured work: drain first */
        int rc = dray_gpu_wait(ctx);
        if (rc)
            return rc;
        if (ctx->scratch)
            gpuFree(ctx->scratch);
        ctx->scratch = NULL;
        ctx->scratch_size = 0;
        size_t sz = nbytes + nbytes / 4; /* headroom so slowly growing batches do not thrash */
        gpuError_t e = gpuMalloc(&ctx->scratch, sz);
        if (e != gpuSuccess) {
            ctx->scratch = NULL;
            gpuGetLastError();
            return dray_gpu_fail(ctx, DRAY_ENOMEM, "%s: cannot allocate %zu bytes of scratch: %s",
                                 GPU_PLUGIN_NAME, sz, gpuGetErrorName(e));
        }
        ctx->scratch_size = sz;
    }
    *out = ctx->scratch;
    return 0;
}

static int gpu_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    ctx->err[0] = '\0';
    if (!out)
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: alloc: out is NULL", GPU_PLUGIN_NAME);
    *out = NULL;
    struct dray_buf *b = malloc(sizeof(*b));
    if (!b)
        return dray_gpu_fail(ctx, DRAY_ENOMEM, "%s: alloc: out of host memory", GPU_PLUGIN_NAME);
    gpuError_t e = gpuMalloc(&b->p, nbytes ? nbytes : 64); /* 256-byte aligned */
    if (e != gpuSuccess) {
        gpuGetLastError();
        free(b);
        return dray_gpu_fail(ctx, DRAY_ENOMEM, "%s: alloc: cannot allocate %zu bytes of device memory: %s",
                             GPU_PLUGIN_NAME, nbytes, gpuGetErrorName(e));
    }
    b->size = nbytes;
    *out = b;
    return 0;
}

static void gpu_free(struct dray_ctx *ctx, struct dray_buf *buf)
{
    if (!buf)
        return;
    if (ctx)
        dray_gpu_flush(ctx); /* a pending capture may name the buffer */
    gpuFree(buf->p); /* waits for work still using it */
    free(buf);
}

static int gpu_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    ctx->err[0] = '\0';
    void *d = NULL;
    int rc = dray_gpu_view(ctx, "upload dst", dst, nbytes, 1, &d);
    if (rc)
        return rc;
    if (!src && nbytes)
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: upload: src is NULL", GPU_PLUGIN_NAME);
    if (!nbytes)
        return 0;
    if ((rc = dray_gpu_flush(ctx)))
        return rc;
    /* from pageable memory the runtime stages src before returning, so the
     * caller may reuse it at once; the copy itself is ordered on the stream */
    gpuError_t e = gpuMemcpyAsync(d, src, nbytes, gpuMemcpyHostToDevice, ctx->stream);
    return e == gpuSuccess ? 0 : dray_gpu_rt_fail(ctx, e, "upload");
}

static int gpu_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    ctx->err[0] = '\0';
    void *s = NULL;
    int rc = dray_gpu_view(ctx, "download src", src, nbytes, 1, &s);
    if (rc)
        return rc;
    if (!dst && nbytes)
        return dray_gpu_fail(ctx, DRAY_EINVAL, "%s: download: dst is NULL", GPU_PLUGIN_NAME);
    if ((rc = dray_gpu_flush(ctx)))
        return rc;
    if (nbytes) {
        gpuError_t e = gpuMemcpyAsync(dst, s, nbytes, gpuMemcpyDeviceToHost, ctx->stream);
        if (e != gpuSuccess)
            return dray_gpu_rt_fail(ctx, e, "download");
    }
    return dray_gpu_wait(ctx);
}

static int gpu_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    ctx->err[0] = '\0';
    void *d = NULL, *s = NULL;
    int rc = dray_gpu_view(ctx, "copy dst", dst, nbytes, 1, &d);
    if (!rc)
        rc = dray_gpu_view(ctx, "copy src", src, nbytes, 1, &s);
    if (rc || !nbytes)
        return rc;
    struct {
        uint64_t tag;
        void *d, *s;
        size_t n;
    } key = {0x636f7079u, d, s, nbytes};
    dray_gpu_op_begin(ctx, &key, sizeof(key));
    gpuError_t e = gpuMemcpyAsync(d, s, nbytes, gpuMemcpyDeviceToDevice, ctx->stream);
    return e == gpuSuccess ? 0 : dray_gpu_rt_fail(ctx, e, "copy");
}

/* -------------------------------------------------------------- the table */

/* The props' dtypes, attention's head_dim limit (the flash kernel's tile) and,
 * since version 3, the packed weight formats (all twelve, and version 4's three
 * two-level ones, for matmul and embed) and one or two activation passes. The retired version-2 grouped dtypes are
 * never declared. */
static int gpu_op_caps(uint32_t index, struct dray_op_caps *caps)
{
    static const struct dray_util_limits lim = {.max_head_dim = GK_ATT_MAX_HEAD_DIM,
                                                .max_k = 65536,
                                                .matmul_wformats = GPU_WFORMATS,
                                                .embed_wformats = GPU_WFORMATS,
                                                .matmul_passes = GPU_MATMUL_PASSES};
    return dray_util_op_caps(index, caps, gpu_device_props, &lim);
}

static const struct dray_ops gpu_ops = {
    .version = 4, /* the ABI this code implements, not the header's newest */
    .name = GPU_PLUGIN_NAME,
#if defined(DRAY_GPU_HIP)
    .describe = "AMD GPUs through ROCm/HIP (gfx90a, gfx940; int8 dot kernels, packed 4/5/8-bit and "
                "Q4_K/Q5_K/Q6_K weights, paged flash attention)",
#else
    .describe = "NVIDIA GPUs through CUDA (sm_80, sm_90 + PTX; int8 tensor-core MMA, dp4a decode, "
                "packed 4/5/8-bit and Q4_K/Q5_K/Q6_K weights, paged flash attention)",
#endif
    .device_count = gpu_device_count,
    .device_props = gpu_device_props,
    .open = gpu_open,
    .close = gpu_close,
    .last_error = gpu_last_error,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .upload = gpu_upload,
    .download = gpu_download,
    .copy = gpu_copy,
    .fill = dray_gpu_fill,
    .synchronize = gpu_synchronize,
    .embed = dray_gpu_embed,
    .rmsnorm = dray_gpu_rmsnorm,
    .matmul = dray_gpu_matmul,
    .rope = dray_gpu_rope,
    .kv_store = dray_gpu_kv_store,
    .attention = dray_gpu_attention,
    .gated_act = dray_gpu_gated_act,
    .add = dray_gpu_add,
    .op_caps = gpu_op_caps,
    .weight_create = dray_gpu_weight_create,
    .weight_free = dray_gpu_weight_free,
};

/* Cheap and silent: touches no runtime, no device. Answers with gpu_ops.version,
 * never the header's DRAY_ABI_VERSION (docs/PORTING.md). */
DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *host,
                                      const struct dray_ops **ops, char *err, size_t errlen)
{
    int rc = dray_util_negotiate(version, &gpu_ops, ops, err, errlen);
    if (rc == 0)
        dray_gpu_host = host;
    return rc;
}
