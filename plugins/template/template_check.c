/* Argument checking shared by every op of the template plugin: error messages
 * for last_error(), byte spans with overflow checks, view bounds, overlap, and
 * the f16 conversions the f16 KV cache needs.
 *
 * Why a plugin checks at all: the host is trusted but not infallible, and an
 * out-of-bounds write on a device corrupts memory far from the bug. Every view
 * an op reads or writes is checked against its buffer before the first byte is
 * touched, and a failing op leaves its outputs unchanged. */
#include <math.h>
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

int dray_tpl_span(struct dray_ctx *ctx, const char *what, uint64_t rows, uint64_t stride,
             uint64_t used, size_t elem, size_t *bytes)
{
    uint64_t n;
    *bytes = 0;
    if (rows == 0 || used == 0)
        return 0;
    if (__builtin_mul_overflow(rows - 1, stride, &n) || __builtin_add_overflow(n, used, &n) ||
        __builtin_mul_overflow(n, (uint64_t)elem, &n) || n > SIZE_MAX)
        return dray_tpl_fail(ctx, DRAY_ERANGE, "%s: %llu rows of stride %llu span more bytes than fit "
                        "in memory", what, (unsigned long long)rows, (unsigned long long)stride);
    *bytes = (size_t)n;
    return 0;
}

int dray_tpl_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
             size_t align, void **p)
{
    *p = NULL;
    if (nbytes == 0)
        return 0;
    if (!v.buf)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: no buffer given for %zu bytes", what, nbytes);
    if (v.buf->magic != TPL_BUF_MAGIC)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: not a live buffer of the %s plugin (freed, or "
                        "from another plugin)", what, TPL_NAME);
    if (align > 1 && v.offset % align)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: offset %zu is not a multiple of the element "
                        "size %zu", what, v.offset, align);
    if (v.offset > v.buf->size || nbytes > v.buf->size - v.offset)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "%s: needs %zu bytes at offset %zu but the buffer "
                        "holds %zu", what, nbytes, v.offset, v.buf->size);
    *p = v.buf->data + v.offset;
    return 0;
}

int dray_tpl_overlap(struct dray_view a, size_t na, struct dray_view b, size_t nb)
{
    if (!na || !nb || a.buf != b.buf)
        return 0;
    return a.offset < b.offset + nb && b.offset < a.offset + na;
}

/* ------------------------------------------------------------ f16 */

/* Round |f| to a multiple of the half-precision unit in the last place of its
 * binade (2^(e-10) for normal halves, 2^-24 below 2^-14). The division by a
 * power of two is exact, so nearbyintf alone does the round-to-nearest-even;
 * a result of 2^11 units carries into the exponent, which is the right answer
 * (and 65520 and above carries into the infinity encoding). */
uint16_t dray_tpl_f32_to_f16(float f)
{
    uint16_t sign = signbit(f) ? 0x8000u : 0;
    float a = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00u;
    if (isinf(f))
        return sign | 0x7c00u;
    if (a == 0.0f)
        return sign;
    int e2;
    frexpf(a, &e2); /* a = m * 2^e2, m in [0.5, 1): the binade's exponent is e2-1 */
    int e = e2 - 1;
    if (e > 15)
        return sign | 0x7c00u; /* infinity, or too big for any half */
    if (e < -14)
        e = -14; /* subnormal halves share the unit 2^-24 */
    uint32_t units = (uint32_t)nearbyintf(ldexpf(a, 10 - e)); /* 0 .. 2048 */
    if (e == -14 && units < 1024)
        return sign | (uint16_t)units; /* subnormal (or rounded up to 2^-14: 0x400) */
    return sign | (uint16_t)(((uint32_t)(e + 15) << 10) + units - 1024);
}

float dray_tpl_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in f32 */
        f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    if (exp == 0x1f) /* infinity or NaN (payload kept) */
        bits = sign | 0x7f800000u | man << 13;
    else /* normal: rebias the exponent from 15 to 127, widen the mantissa */
        bits = sign | (exp + 112u) << 23 | man << 13;
    memcpy(&f, &bits, sizeof(f));
    return f;
}
