/* What every op of the template plugin shares: host memory through the host's
 * services, error messages for last_error(), and the buffer size the shared
 * argument checks (dray/backend_util.h) compare views against.
 *
 * Why a plugin checks at all: the host is trusted but not infallible, and an
 * out-of-bounds write on a device corrupts memory far from the bug. Every view
 * an op reads or writes is checked against its buffer before the first byte is
 * touched, and a failing op leaves its outputs unchanged. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template.h"

const struct dray_host *dray_tpl_host;

void *dray_tpl_alloc(size_t nbytes)
{
    if (dray_tpl_host && dray_tpl_host->alloc)
        return dray_tpl_host->alloc(nbytes);
    return malloc(nbytes ? nbytes : 1);
}

void dray_tpl_free(void *p)
{
    if (!p)
        return;
    if (dray_tpl_host && dray_tpl_host->free)
        dray_tpl_host->free(p);
    else
        free(p);
}

void dray_tpl_begin(struct dray_ctx *ctx)
{
    ctx->err[0] = '\0';
}

int dray_tpl_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
    va_end(ap);
    return rc;
}

size_t dray_tpl_buf_size(const struct dray_buf *buf, int *live)
{
    *live = buf->magic == TPL_BUF_MAGIC;
    return *live ? buf->size : 0;
}

int dray_tpl_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
                  size_t align, void **p)
{
    struct dray_util_needs nd = {.n = 1, .at = {{what, v, nbytes, align}}};
    *p = NULL;
    TRY(dray_util_check_views(&nd, dray_tpl_buf_size, ctx->err, sizeof(ctx->err)));
    *p = nbytes ? dray_tpl_at(v) : NULL;
    return 0;
}
