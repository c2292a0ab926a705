/* The template plugin: negotiation, the operator table, the device, contexts and
 * memory. The ops themselves are in template_ops.c and template_kv.c, and the
 * packed weights (ABI 3) in template_packed.c.
 *
 * This file is what a vendor replaces first: device_count/device_props with the
 * runtime's device enumeration, open/close with context and queue creation,
 * alloc/free/upload/download/copy/fill with the runtime's memory calls, and
 * (version 3) tpl_op_caps's packed-weight formats with the ones your kernels
 * take (template_packed.c has weight_create and the ops on packed weights). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "template.h"

/* TPL_ABI, the version this table fills, is set in template.h. */

/* ------------------------------------------------------------ devices */

/* How many devices. May be called without opening anything. The rule for a
 * missing runtime (docs/plugin-abi.md): when your runtime finds no driver or no
 * device, return 0 with *count = 0 and log one sentence through host->log saying
 * what is missing and how to install it; `dray devices` then lists the plugin
 * with "no device: <that sentence>". Never refuse negotiation for it. */
static int tpl_device_count(uint32_t *count)
{
    if (!count)
        return DRAY_EINVAL;
    *count = 1; /* host memory: there is always exactly one */
    return 0;
}

static uint64_t host_bytes(int which)
{
    long pages = sysconf(which), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* Properties of device index, without opening it. Capabilities are data:
 * op_dtypes[op] has a DRAY_DTYPE_BIT for each dtype the op accepts in the role
 * enum dray_op names; the host and the conformance runner use exactly what is
 * declared here, so declare only what passes conformance. */
static int tpl_device_props(uint32_t index, struct dray_device_props *props)
{
    if (!props || index != 0)
        return DRAY_EINVAL;
    memset(props, 0, sizeof(*props));
    snprintf(props->name, sizeof(props->name), "template (host memory, scalar C)");
    /* the vendor line `dray devices` shows: put your company here */
    snprintf(props->vendor, sizeof(props->vendor), "template");
    props->mem_total = host_bytes(_SC_PHYS_PAGES);
    props->mem_free = host_bytes(_SC_AVPHYS_PAGES); /* 0 = unknown is allowed too */
    props->max_alloc = props->mem_total;
    props->compute_units = 1; /* every op runs on the calling thread */
    /* Unified: buffers are host memory. No int8 dot
     * product hardware and no fp16 arithmetic are used: plain C loops. */
    props->flags = DRAY_DEV_UNIFIED;
    props->op_dtypes[DRAY_OP_EMBED] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_RMSNORM] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_MATMUL] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ROPE] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_KV_STORE] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_ATTENTION] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_GATED_ACT] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ADD] = DRAY_DTYPE_BIT(DRAY_F32);
    return 0;
}

/* Open device index. On failure *out is NULL and err says why. */
static int tpl_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out,
                    char *err, size_t errlen)
{
    if (!out) {
        if (err && errlen)
            snprintf(err, errlen, TPL_NAME ": open: out is NULL");
        return DRAY_EINVAL;
    }
    *out = NULL;
    if (index != 0) {
        if (err && errlen)
            snprintf(err, errlen, TPL_NAME ": no device %u (there is one device, 0)", index);
        return DRAY_EINVAL;
    }
    struct dray_ctx *ctx = dray_tpl_alloc(sizeof(*ctx));
    if (!ctx) {
        if (err && errlen)
            snprintf(err, errlen, TPL_NAME ": out of host memory for a context");
        return DRAY_ENOMEM;
    }
    memset(ctx, 0, sizeof(*ctx));
    /* The template always runs plain C, so `reference` changes nothing here; a
     * plugin with fast and portable kernels picks the portable ones when it is 1. */
    ctx->n_threads = DRAY_UTIL_OPT_HAS(opt, n_threads) && opt->n_threads ? opt->n_threads : 1;
    *out = ctx;
    return 0;
}

static void tpl_close(struct dray_ctx *ctx)
{
    if (!ctx)
        return;
    dray_tpl_free(ctx->scratch);
    dray_tpl_free(ctx);
}

/* Why the last call on ctx failed, "" if it did not; valid until the next call. */
static const char *tpl_last_error(struct dray_ctx *ctx)
{
    return ctx ? ctx->err : TPL_NAME ": no context";
}

/* ------------------------------------------------------------ memory */

/* Allocate nbytes of device memory, at least 64-byte aligned. Zero bytes is a
 * valid request (a buffer nothing can be read from). */
static int tpl_buf_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    if (!ctx || !out)
        return DRAY_EINVAL;
    dray_tpl_begin(ctx);
    *out = NULL;
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded < nbytes)
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "alloc: %zu bytes is more than memory can hold", nbytes);
    struct dray_buf *b = dray_tpl_alloc(sizeof(*b));
    if (!b)
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "alloc: out of host memory for a buffer record");
    void *data = NULL;
    if (posix_memalign(&data, 64, rounded ? rounded : 64) != 0) {
        dray_tpl_free(b);
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "alloc: no memory for %zu bytes", nbytes);
    }
    b->magic = TPL_BUF_MAGIC;
    b->size = nbytes;
    b->data = data;
    *out = b;
    return 0;
}

/* Free a buffer. The host frees a buffer only once no queued op uses it (it
 * synchronizes first); a device with an asynchronous queue may still defer. */
static void tpl_buf_free(struct dray_ctx *ctx, struct dray_buf *buf)
{
    (void)ctx;
    if (!buf || buf->magic != TPL_BUF_MAGIC)
        return;
    buf->magic = 0;
    free(buf->data);
    dray_tpl_free(buf);
}

/* Host -> device, nbytes at dst. Ordered on the queue like an op. */
static int tpl_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    void *d;
    if (!ctx)
        return DRAY_EINVAL;
    dray_tpl_begin(ctx);
    if (nbytes && !src)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "upload: source is NULL");
    int rc = dray_tpl_view(ctx, "upload dst", dst, nbytes, 1, &d);
    if (rc == 0 && nbytes)
        memcpy(d, src, nbytes);
    return rc;
}

/* Device -> host; returns once the bytes are on the host (waits for the queue). */
static int tpl_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    void *s;
    if (!ctx)
        return DRAY_EINVAL;
    dray_tpl_begin(ctx);
    if (nbytes && !dst)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "download: destination is NULL");
    int rc = dray_tpl_view(ctx, "download src", src, nbytes, 1, &s);
    if (rc == 0 && nbytes)
        memcpy(dst, s, nbytes);
    return rc;
}

/* Device -> device. The ranges may overlap (memmove semantics). */
static int tpl_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    void *d, *s;
    if (!ctx)
        return DRAY_EINVAL;
    dray_tpl_begin(ctx);
    int rc = dray_tpl_view(ctx, "copy dst", dst, nbytes, 1, &d);
    if (rc == 0)
        rc = dray_tpl_view(ctx, "copy src", src, nbytes, 1, &s);
    if (rc == 0 && nbytes)
        memmove(d, s, nbytes);
    return rc;
}

/* nbytes (a multiple of 4) of dst <- the 32-bit pattern repeated (host byte order). */
static int tpl_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes)
{
    unsigned char *d;
    if (!ctx)
        return DRAY_EINVAL;
    dray_tpl_begin(ctx);
    if (nbytes % 4)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "fill: %zu bytes is not a multiple of 4", nbytes);
    int rc = dray_tpl_view(ctx, "fill dst", dst, nbytes, 1, (void **)&d);
    for (size_t i = 0; rc == 0 && i < nbytes; i += 4)
        memcpy(d + i, &pattern, 4);
    return rc;
}

/* Wait for everything queued on ctx. Every op here has finished when it returns;
 * a device with a queue waits on its stream/fence and reports a failed kernel. */
static int tpl_synchronize(struct dray_ctx *ctx)
{
    if (!ctx)
        return DRAY_EINVAL;
    dray_tpl_begin(ctx);
    return 0;
}

#if TPL_ABI >= 2
/* Version 2: each op's dtypes (the same as device_props) and its limits. The
 * template has none beyond the contract's k <= 65536; a device whose attention
 * keeps a head in on-chip memory declares max_head_dim here, and so on.
 * Version 3 adds the packed-weight formats weight_create takes, for matmul and
 * for embed (DRAY_WFORMAT_BIT masks, template.h), and the activation passes
 * matmul runs on them: the host packs a model's weights only in a declared
 * format, and runs int8 where the file's format is not declared. */
static int tpl_op_caps(uint32_t index, struct dray_op_caps *caps)
{
    static const struct dray_util_limits lim = {
        .max_k = 65536,
#if TPL_ABI >= 3
        .matmul_wformats = TPL_MATMUL_WFORMATS,
        .embed_wformats = TPL_EMBED_WFORMATS,
        .matmul_passes = TPL_MATMUL_PASSES,
#endif
    };
    return dray_util_op_caps(index, caps, tpl_device_props, &lim);
}
#endif

/* ------------------------------------------------------------ the table */

/* Every mandatory member of its version is set; the registry refuses a table
 * that leaves one NULL (docs/plugin-abi.md lists them). */
static const struct dray_ops tpl_ops = {
    .version = TPL_ABI,
    .name = TPL_NAME,
    .describe = "template: every op in plain C on host memory, the example for vendors",
    .device_count = tpl_device_count,
    .device_props = tpl_device_props,
    .open = tpl_open,
    .close = tpl_close,
    .last_error = tpl_last_error,
    .alloc = tpl_buf_alloc,
    .free = tpl_buf_free,
    .upload = tpl_upload,
    .download = tpl_download,
    .copy = tpl_copy,
    .fill = tpl_fill,
    .synchronize = tpl_synchronize,
    .embed = dray_tpl_embed,
    .rmsnorm = dray_tpl_rmsnorm,
    .matmul = dray_tpl_matmul,
    .rope = dray_tpl_rope,
    .kv_store = dray_tpl_kv_store,
    .attention = dray_tpl_attention,
    .gated_act = dray_tpl_gated_act,
    .add = dray_tpl_add,
    /* members above: version 1 (the slot after add, reserved_v1, stays NULL) */
#if TPL_ABI >= 2
    .op_caps = tpl_op_caps,
    /* members above: version 2 */
#endif
#if TPL_ABI >= 3
    .weight_create = dray_tpl_weight_create,
    .weight_free = dray_tpl_weight_free,
    /* members above: version 3 */
#endif
};

/* The one exported symbol. The host offers the newest ABI it speaks in
 * *version; dray_util_negotiate answers with the version our table implements
 * (TPL_ABI, never the header's newest) or refuses a host that is too old.
 * Cheap and without side effects beyond remembering the host's services: no
 * device is touched before open(). */
DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *host,
                                      const struct dray_ops **ops, char *err, size_t errlen)
{
    int rc = dray_util_negotiate(version, &tpl_ops, ops, err, errlen);
    /* Read host members only as far as its version allows: all of them are v1. */
    if (rc == 0)
        dray_tpl_host = host && host->version >= 1 ? host : NULL;
    return rc;
}
