/* The template plugin's private header: its context and buffer objects, and the
 * helpers every op uses to check its arguments before touching memory.
 *
 * The template is a complete dray plugin for a "device" whose memory is plain
 * host memory and whose kernels are plain scalar C. It exists to be read and
 * copied: replace the bodies in template_ops.c / template_kv.c with launches of
 * your kernels and the buffer code in template_plugin.c with your allocator, and
 * keep the checks. Only dray's installed headers are included (backend.h and the
 * header-only helper backend_util.h): a plugin never links against dray. */
#ifndef DRAY_TEMPLATE_H
#define DRAY_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <dray/backend.h>
#include <dray/backend_util.h>

/* The plugin's name; dray's tests build the template under other names. */
#ifndef TPL_NAME
#define TPL_NAME "template"
#endif

/* A buffer. On a real device `data` would be a device address or a runtime
 * handle; here it is host memory from posix_memalign (64-byte aligned, as
 * backend.h asks). `magic` catches NULL-ish and foreign pointers early. */
struct dray_buf {
    uint32_t magic; /* TPL_BUF_MAGIC while alive, 0 after free */
    size_t size;    /* bytes the caller asked for */
    unsigned char *data;
};
#define TPL_BUF_MAGIC 0x74706c62u /* "tplb" */

/* A context: one queue on one device. The template runs every op to completion
 * on the caller's thread, so the queue order backend.h promises holds trivially
 * and synchronize() has nothing to wait for. A device with an asynchronous
 * queue keeps its stream/command list here. */
struct dray_ctx {
    char err[256];       /* last_error(): "" after a call that succeeded */
    uint32_t n_threads;  /* from the open options; the template uses one */
    float *scratch;      /* attention scores; grown on demand, host->alloc'd */
    size_t scratch_len;  /* floats in scratch */
};

/* The host's services, saved by dray_plugin_negotiate (template_plugin.c). */
extern const struct dray_host *dray_tpl_host;

/* Allocation of the plugin's own host memory (contexts, scratch) through the
 * host's services, so a host that accounts for memory sees it; NULL on failure. */
void *dray_tpl_alloc(size_t nbytes);
void dray_tpl_free(void *p);

/* Start of every call on ctx: last_error() must say "" unless this call fails. */
void dray_tpl_begin(struct dray_ctx *ctx);
/* Record why a call failed (for last_error) and return rc, a negative DRAY_E*. */
int dray_tpl_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Size of a buffer for dray_util_check_views (dray/backend_util.h); *live = 0
 * for a handle that is not a live buffer of this plugin. */
size_t dray_tpl_buf_size(const struct dray_buf *buf, int *live);

/* Host address of a view (after its checks passed); NULL for an empty view. */
static inline void *dray_tpl_at(struct dray_view v)
{
    return v.buf ? v.buf->data + v.offset : NULL;
}

/* Check that view v names a live buffer of this plugin, that its offset is a
 * multiple of align, and that nbytes from offset lie inside the buffer (the
 * memory calls use it; ops use CHECK_ARGS below). On success *p points at the
 * first byte. nbytes = 0 needs no buffer (*p = NULL). */
int dray_tpl_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
                  size_t align, void **p);

/* Run a check; return its code from the calling op when it fails. */
#define TRY(expr)         \
    do {                  \
        int rc_ = (expr); \
        if (rc_)          \
            return rc_;   \
    } while (0)

/* An op's argument checks, all from the shared helper: validator (one of
 * dray_util_check_<op>) applies the rules of the op's contract in backend.h and
 * lists the views the op touches; each view is then checked against this
 * plugin's buffers. The reason goes to last_error(). */
#define CHECK_ARGS(ctx, validator, a, nd)                                               \
    do {                                                                                \
        TRY(validator((a), (nd), (ctx)->err, sizeof((ctx)->err)));                      \
        TRY(dray_util_check_views((nd), dray_tpl_buf_size, (ctx)->err, sizeof((ctx)->err))); \
    } while (0)

/* First lines of every op: a context and an argument struct are required, and
 * last_error() is cleared. */
#define OP_BEGIN(ctx, a, name)                                                 \
    do {                                                                       \
        if (!(ctx))                                                            \
            return DRAY_EINVAL;                                                \
        dray_tpl_begin(ctx);                                                        \
        if (!(a))                                                              \
            return dray_tpl_fail((ctx), DRAY_EINVAL, name ": no arguments given"); \
    } while (0)

/* Operators (template_ops.c, template_kv.c); contracts are in backend.h. */
int dray_tpl_embed(struct dray_ctx *ctx, const struct dray_embed_args *a);
int dray_tpl_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a);
int dray_tpl_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_tpl_rope(struct dray_ctx *ctx, const struct dray_rope_args *a);
int dray_tpl_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a);
int dray_tpl_attention(struct dray_ctx *ctx, const struct dray_attention_args *a);
int dray_tpl_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a);
int dray_tpl_add(struct dray_ctx *ctx, const struct dray_add_args *a);

#endif
