/* The template plugin's private header: its context and buffer objects, and the
 * helpers every op uses to check its arguments before touching memory.
 *
 * The template is a complete dray plugin for a "device" whose memory is plain
 * host memory and whose kernels are plain scalar C. It exists to be read and
 * copied: replace the bodies in template_ops.c / template_kv.c with launches of
 * your kernels and the buffer code in template_plugin.c with your allocator, and
 * keep the checks. Only backend.h is included: a plugin never links against dray. */
#ifndef DRAY_TEMPLATE_H
#define DRAY_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <dray/backend.h>

#define TPL_NAME "template"

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
 * host, so it counts against dray's budget; NULL on failure. */
void *dray_tpl_alloc(size_t nbytes);
void dray_tpl_free(void *p);

/* Start of every call on ctx: last_error() must say "" unless this call fails. */
void dray_tpl_begin(struct dray_ctx *ctx);
/* Record why a call failed (for last_error) and return rc, a negative DRAY_E*. */
int dray_tpl_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Bytes spanned by `rows` rows of `used` elements, `stride` elements apart, of
 * `elem` bytes each: ((rows-1)*stride + used) * elem, 0 when rows or used is 0.
 * Returns DRAY_ERANGE (and says so in ctx) when that does not fit in size_t. */
int dray_tpl_span(struct dray_ctx *ctx, const char *what, uint64_t rows, uint64_t stride,
             uint64_t used, size_t elem, size_t *bytes);

/* Check that view v names a live buffer of this plugin, that its offset is a
 * multiple of align, and that nbytes from offset lie inside the buffer. On
 * success *p points at the first byte. nbytes = 0 needs no buffer (*p = NULL).
 * `what` names the argument in the error ("matmul x"). */
int dray_tpl_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
             size_t align, void **p);

/* Run a check; return its code from the calling op when it fails. */
#define TRY(expr)         \
    do {                  \
        int rc_ = (expr); \
        if (rc_)          \
            return rc_;   \
    } while (0)

/* Check view v for nbytes (see dray_tpl_view) and set ptr to its first byte. */
#define VIEW(ctx, what, v, nbytes, align, ptr)                     \
    do {                                                           \
        void *p_;                                                  \
        TRY(dray_tpl_view((ctx), (what), (v), (nbytes), (align), &p_)); \
        (ptr) = p_;                                                \
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

/* True when byte ranges [a, a+na) and [b, b+nb) of two views share memory. */
int dray_tpl_overlap(struct dray_view a, size_t na, struct dray_view b, size_t nb);

/* IEEE binary16 <-> binary32, round to nearest even (template_check.c). */
uint16_t dray_tpl_f32_to_f16(float f);
float dray_tpl_f16_to_f32(uint16_t h);

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
