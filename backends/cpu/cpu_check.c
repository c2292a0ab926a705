/* Argument checks and the parallel split shared by the ops. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

int dray_cpu_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
    va_end(ap);
    return rc;
}

void *dray_cpu_scratch(struct dray_ctx *ctx, size_t nbytes)
{
    if (nbytes <= ctx->scratch_size)
        return ctx->scratch;
    void *p = NULL;
    size_t want = nbytes + nbytes / 4; /* some headroom: shapes grow a little at a time */
    if (posix_memalign(&p, 64, want) != 0)
        return NULL;
    free(ctx->scratch);
    ctx->scratch = p;
    ctx->scratch_size = want;
    return p;
}

int dray_cpu_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
                  size_t align, void **out)
{
    *out = NULL;
    if (!v.buf)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "%s: NULL buffer", what);
    if (align > 1 && v.offset % align)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "%s: offset %zu is not a multiple of %zu", what,
                             v.offset, align);
    if (v.offset > v.buf->size || nbytes > v.buf->size - v.offset)
        return dray_cpu_fail(ctx, DRAY_EINVAL,
                             "%s: view of %zu bytes at offset %zu exceeds the buffer of %zu bytes",
                             what, nbytes, v.offset, v.buf->size);
    *out = (char *)v.buf->p + v.offset;
    return 0;
}

int dray_cpu_args(struct dray_ctx *ctx, int rc, const struct dray_util_needs *nd, void **p)
{
    if (rc)
        return rc;
    for (uint32_t i = 0; i < nd->n; i++) {
        const struct dray_util_need *u = &nd->at[i];
        p[i] = NULL;
        if (u->nbytes && (rc = dray_cpu_view(ctx, u->what, u->v, u->nbytes, u->align, &p[i])))
            return rc;
    }
    return 0;
}

struct split {
    dray_cpu_body_fn body;
    void *arg;
    uint32_t n, grain;
};

static void split_task(void *p, uint32_t ith, uint32_t nth)
{
    const struct split *s = p;
    uint32_t chunks = (s->n + s->grain - 1) / s->grain;
    uint32_t per = (chunks + nth - 1) / nth; /* chunks per thread */
    uint64_t i0 = (uint64_t)ith * per * s->grain, i1 = i0 + (uint64_t)per * s->grain;
    if (i1 > s->n)
        i1 = s->n;
    if (i0 < i1)
        s->body(s->arg, (uint32_t)i0, (uint32_t)i1, ith);
}

void dray_cpu_parallel(struct dray_ctx *ctx, uint32_t n, uint32_t grain, double work,
                       dray_cpu_body_fn body, void *arg)
{
    if (n == 0)
        return;
    if (grain == 0)
        grain = 1;
    /* Below ~20k elementary steps the hand-off costs more than it saves. */
    if (ctx->n_threads == 1 || n <= grain || work < 20000.0) {
        body(arg, 0, n, 0);
        return;
    }
    struct split s = {body, arg, n, grain};
    dray_cpu_pool_run(ctx->pool, split_task, &s);
}
