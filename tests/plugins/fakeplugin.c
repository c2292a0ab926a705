/* A tiny fake backend plugin for the registry and conformance tests. One source,
 * built several times with -DFAKE_NAME="..." and -DFAKE_MODE=FAKE_<mode>, each
 * build misbehaving in one way the host must notice (see tests/plugins/meson.build).
 * Buffers are malloc'd host memory; the only op that computes is `add` (right in
 * every mode but FAKE_WRONG_ADD, which adds 1e-3 to every element); the others
 * return DRAY_ENOTSUP and are reported as unsupported in op_dtypes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dray/backend.h"

#define FAKE_GOOD 0
#define FAKE_ABI_NEW 1          /* answers ABI 7 */
#define FAKE_ABI_OLD 2          /* answers ABI 0 */
#define FAKE_NO_SYMBOL 3        /* exports the wrong symbol name */
#define FAKE_NULL_MEMBER 4      /* leaves ops->attention NULL */
#define FAKE_REFUSE 5           /* negotiate returns DRAY_EINCOMPAT with a reason */
#define FAKE_OPEN_FAILS 6       /* one device, open() fails with a reason */
#define FAKE_VERSION_MISMATCH 7 /* negotiates 1, table says 2 */
#define FAKE_NO_DEVICE 8        /* device_count = 0, logs why */
#define FAKE_WRONG_ADD 9        /* add is off by 1e-3 */

#ifndef FAKE_MODE
#error "build with -DFAKE_MODE=..."
#endif

static const struct dray_host *host;

struct dray_ctx {
    char last_error[128];
};
struct dray_buf {
    size_t size;
    unsigned char *p;
};

static int fake_device_count(uint32_t *count)
{
    if (FAKE_MODE == FAKE_NO_DEVICE) {
        host->log(DRAY_LOG_WARN, FAKE_NAME, "no FAKE driver");
        *count = 0;
        return 0;
    }
    *count = 1;
    return 0;
}

static int fake_device_props(uint32_t index, struct dray_device_props *props)
{
    if (index != 0)
        return DRAY_EINVAL;
    memset(props, 0, sizeof(*props));
    snprintf(props->name, sizeof(props->name), "Fake Device (%s)", FAKE_NAME);
    snprintf(props->vendor, sizeof(props->vendor), "dray tests");
    props->mem_total = 1u << 20;
    props->max_alloc = 1u << 20;
    props->compute_units = 1;
    props->flags = DRAY_DEV_UNIFIED;
    props->op_dtypes[DRAY_OP_ADD] = DRAY_DTYPE_BIT(DRAY_F32);
    return 0;
}

static int fake_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out,
                     char *err, size_t errlen)
{
    (void)opt;
    *out = NULL;
    if (FAKE_MODE == FAKE_OPEN_FAILS || index != 0) {
        snprintf(err, errlen, "fake device %u is on fire", index);
        return DRAY_EBACKEND;
    }
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : DRAY_ENOMEM;
}

static void fake_close(struct dray_ctx *ctx)
{
    free(ctx);
}

static const char *fake_last_error(struct dray_ctx *ctx)
{
    return ctx->last_error;
}

static int fake_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    (void)ctx;
    struct dray_buf *b = calloc(1, sizeof(*b));
    if (!b || !(b->p = aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64))) {
        free(b);
        return DRAY_ENOMEM;
    }
    b->size = nbytes;
    *out = b;
    return 0;
}

static void fake_free(struct dray_ctx *ctx, struct dray_buf *buf)
{
    (void)ctx;
    if (buf)
        free(buf->p);
    free(buf);
}

static unsigned char *at(struct dray_ctx *ctx, struct dray_view v, size_t nbytes)
{
    if (!v.buf || v.offset > v.buf->size || nbytes > v.buf->size - v.offset) {
        snprintf(ctx->last_error, sizeof(ctx->last_error), "view out of range");
        return NULL;
    }
    return v.buf->p + v.offset;
}

static int fake_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t n)
{
    unsigned char *d = at(ctx, dst, n);
    if (!d)
        return DRAY_EINVAL;
    memcpy(d, src, n);
    return 0;
}

static int fake_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t n)
{
    unsigned char *s = at(ctx, src, n);
    if (!s)
        return DRAY_EINVAL;
    memcpy(dst, s, n);
    return 0;
}

static int fake_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t n)
{
    unsigned char *d = at(ctx, dst, n), *s = at(ctx, src, n);
    if (!d || !s)
        return DRAY_EINVAL;
    memmove(d, s, n);
    return 0;
}

static int fake_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t n)
{
    unsigned char *d = at(ctx, dst, n);
    if (!d || n % 4)
        return DRAY_EINVAL;
    for (size_t i = 0; i < n; i += 4)
        memcpy(d + i, &pattern, 4);
    return 0;
}

static int fake_sync(struct dray_ctx *ctx)
{
    (void)ctx;
    return 0;
}

#define UNSUPPORTED(op, T)                                                                          \
    static int fake_##op(struct dray_ctx *ctx, const T *a)                                          \
    {                                                                                               \
        (void)a;                                                                                    \
        snprintf(ctx->last_error, sizeof(ctx->last_error), #op " is not implemented");              \
        return DRAY_ENOTSUP;                                                                        \
    }
UNSUPPORTED(embed, struct dray_embed_args)
UNSUPPORTED(rmsnorm, struct dray_rmsnorm_args)
UNSUPPORTED(matmul, struct dray_matmul_args)
UNSUPPORTED(rope, struct dray_rope_args)
UNSUPPORTED(kv_store, struct dray_kv_store_args)
UNSUPPORTED(attention, struct dray_attention_args)
UNSUPPORTED(gated_act, struct dray_gated_act_args)

static int fake_add(struct dray_ctx *ctx, const struct dray_add_args *a)
{
    size_t nb = a->n * sizeof(float);
    float *x = (float *)at(ctx, a->a, nb), *y = (float *)at(ctx, a->b, nb);
    float *o = (float *)at(ctx, a->out, nb);
    if (!x || !y || !o)
        return DRAY_EINVAL;
    for (uint64_t i = 0; i < a->n; i++)
        o[i] = x[i] + y[i] + (FAKE_MODE == FAKE_WRONG_ADD ? 1e-3f : 0.0f);
    return 0;
}

static const struct dray_ops fake_ops = {
    .version = FAKE_MODE == FAKE_VERSION_MISMATCH ? 2 : 1,
    .name = FAKE_NAME,
    .describe = "fake plugin for tests (" FAKE_NAME ")",
    .device_count = fake_device_count,
    .device_props = fake_device_props,
    .open = fake_open,
    .close = fake_close,
    .last_error = fake_last_error,
    .alloc = fake_alloc,
    .free = fake_free,
    .upload = fake_upload,
    .download = fake_download,
    .copy = fake_copy,
    .fill = fake_fill,
    .synchronize = fake_sync,
    .embed = fake_embed,
    .rmsnorm = fake_rmsnorm,
    .matmul = fake_matmul,
    .rope = fake_rope,
    .kv_store = fake_kv_store,
    .attention = FAKE_MODE == FAKE_NULL_MEMBER ? NULL : fake_attention,
    .gated_act = fake_gated_act,
    .add = fake_add,
};

#if FAKE_MODE == FAKE_NO_SYMBOL
DRAY_EXPORT int dray_plugin_negotiate_typo(uint32_t *version, const struct dray_host *h,
                                           const struct dray_ops **ops, char *err, size_t errlen)
#else
DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *h,
                                      const struct dray_ops **ops, char *err, size_t errlen)
#endif
{
    host = h;
    *ops = &fake_ops;
    switch (FAKE_MODE) {
    case FAKE_ABI_NEW: *version = 7; break;
    case FAKE_ABI_OLD: *version = 0; break;
    case FAKE_REFUSE:
        *ops = NULL;
        snprintf(err, errlen, "needs ABI 9 features (matrix cores)");
        return DRAY_EINCOMPAT;
    default: *version = 1; break;
    }
    return 0;
}
