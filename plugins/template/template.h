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

/* The ABI version whose members the table fills (template_plugin.c). It is
 * pinned, not DRAY_ABI_VERSION: when backend.h grows a version 5, this plugin
 * still fills only the version-4 members until someone implements the new ones
 * and bumps it. dray's tests build it with -DTPL_ABI=1 (no op_caps),
 * -DTPL_ABI=2 (no packed weights) and -DTPL_ABI=3 (no rope frequency factors
 * or attention softcap) to prove a newer host still takes older plugins; the
 * code of a newer version is compiled only when TPL_ABI asks. */
#ifndef TPL_ABI
#define TPL_ABI 4u
#endif

#if TPL_ABI >= 3
/* Packed weights (version 3): the formats weight_create takes, as
 * DRAY_WFORMAT_BIT masks (DRAY_UTIL_WF_ALL = the twelve of one level;
 * DRAY_UTIL_WF_K = the three with two-level scales, version 4), and the activation
 * passes matmul runs on them (bit p-1 for p passes). Declare only what passes
 * `dray conformance`; the host runs int8 weights where a format is missing.
 * The template's scalar C takes every format, one pass and two. */
#if TPL_ABI >= 4
#define TPL_WF_EVERY (DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K)
#else
#define TPL_WF_EVERY DRAY_UTIL_WF_ALL
#endif
#ifndef TPL_MATMUL_WFORMATS
#define TPL_MATMUL_WFORMATS TPL_WF_EVERY
#endif
#ifndef TPL_EMBED_WFORMATS
#define TPL_EMBED_WFORMATS TPL_WF_EVERY
#endif
#ifndef TPL_MATMUL_PASSES
#define TPL_MATMUL_PASSES 3u /* one pass and two */
#endif
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

#if TPL_ABI >= 3
/* One packed weight matrix (backend.h, "Packed weights"): weight_create's
 * copy in device memory. Its layout is the plugin's choice. The template's
 * "device" is host memory and its kernels are plain loops, so it keeps the
 * arrays exactly as the host hands them (row-major groups: the layout
 * backend.h describes); a GPU would reorder them for coalesced loads, a CPU
 * would interleave rows for its vector registers. Only matmul and embed read
 * it. */
struct dray_packed {
    uint32_t magic;            /* TPL_PACKED_MAGIC while alive, 0 after free */
    struct dray_wformat format;
    uint32_t n_out, k;         /* rows and inputs (k a multiple of 32) */
    uint32_t uses;             /* enum dray_wuse: what it was created for */
    const uint8_t *codes;      /* n_out * (k/32) groups of B bytes (16, 20 or 32) */
    const void *d, *m;         /* n_out * (k/32) scales (and mins, else NULL),
                                * f32 or f16 as the format says; two levels:
                                * n_out * (k/256) f16 super-scales */
    const void *sub;           /* two levels: the sub-scales (backend.h), else NULL */
    void *mem;                 /* the one allocation codes, d and m live in */
    uint64_t bytes;            /* its size: weight_create's *device_bytes */
};
#define TPL_PACKED_MAGIC 0x74706c77u /* "tplw" */
#endif

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

#if TPL_ABI >= 3
/* Packed weights (template_packed.c). */
int dray_tpl_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                           struct dray_packed **out, uint64_t *device_bytes);
void dray_tpl_weight_free(struct dray_ctx *ctx, struct dray_packed *w);
/* The handle of a matmul or embed on packed weights, checked: a live handle of
 * this plugin created for `use` (DRAY_WUSE_MATMUL or DRAY_WUSE_EMBED);
 * DRAY_EINVAL otherwise. */
int dray_tpl_packed_of(struct dray_ctx *ctx, const char *op, struct dray_packed *w, uint32_t use);
int dray_tpl_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_tpl_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a);
#endif

#endif
