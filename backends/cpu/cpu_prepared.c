/* Prepared layouts (ABI v5): a packed weight's bytes out, and a handle back
 * from them. The bytes are a 64-byte header, then the layout's w and scale
 * arrays each at a 64-byte boundary, exactly as weight_create laid them out;
 * an import points into the host's copy (a mapped file) instead of copying. */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_layout.h"
#include "cpu_mem.h"

#define BLOB_MAGIC "DRAYCPW1"
#define HEAD 64u

struct blob_head {
    char magic[8];
    uint32_t layout, n_out, rows, k, uses, zero;
    uint64_t wbytes, sbytes;
    uint8_t pad[16];
};
_Static_assert(sizeof(struct blob_head) == HEAD, "the header is 64 bytes");

static uint64_t up64(uint64_t n)
{
    return (n + 63) & ~(uint64_t)63;
}

int dray_cpu_weight_export(struct dray_ctx *ctx, const struct dray_packed *p, void *dst, uint64_t *nbytes)
{
    ctx->err[0] = '\0';
    if (!p || !nbytes)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "weight_export: NULL handle or size");
    uint64_t need = HEAD + up64(p->wbytes) + up64(p->sbytes);
    if (!dst) {
        *nbytes = need;
        return 0;
    }
    if (*nbytes != need)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "weight_export: room for %llu bytes, the handle has %llu",
                             (unsigned long long)*nbytes, (unsigned long long)need);
    struct blob_head h = {.layout = p->layout, .n_out = p->n_out, .rows = p->rows, .k = p->k, .uses = p->uses,
                          .wbytes = p->wbytes, .sbytes = p->sbytes};
    memcpy(h.magic, BLOB_MAGIC, 8);
    uint8_t *d = dst;
    memset(d, 0, need);
    memcpy(d, &h, HEAD);
    memcpy(d + HEAD, p->w, p->wbytes);
    memcpy(d + HEAD + up64(p->wbytes), p->scale, p->sbytes);
    return 0;
}

/* Whether weight_create could have given layout for desc's format and uses. */
static int layout_fits(uint32_t layout, const struct dray_weight_desc *d)
{
    struct dray_wformat f = d->format;
    if (f.super)
        return layout == (f.bits == 4 ? DRAY_CPU_K4 : f.bits == 5 ? (uint32_t)DRAY_CPU_K5 : (uint32_t)DRAY_CPU_K6);
    if (f.bits == 8)
        return layout == DRAY_Q8G32;
    if (f.bits == 5)
        return layout == DRAY_Q5G32;
    return layout == DRAY_Q4G32 || (layout == DRAY_Q4G32H && !(d->uses & DRAY_WUSE_EMBED));
}

int dray_cpu_weight_import(struct dray_ctx *ctx, const struct dray_weight_desc *d, const void *src,
                           uint64_t nbytes, struct dray_packed **out, uint64_t *device_bytes)
{
    ctx->err[0] = '\0';
    if (!out || !d || !src)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "weight_import: NULL descriptor, bytes or out");
    *out = NULL;
    struct blob_head h;
    if (nbytes < HEAD || ((uintptr_t)src & 63))
        return dray_cpu_fail(ctx, DRAY_EINVAL, "weight_import: %llu bytes (or not 64-byte aligned): no header",
                             (unsigned long long)nbytes);
    memcpy(&h, src, HEAD);
    uint32_t rows = (d->n_out + 15u) & ~15u;
    if (memcmp(h.magic, BLOB_MAGIC, 8) || h.n_out != d->n_out || h.k != d->k || h.uses != d->uses ||
        h.rows != rows || !layout_fits(h.layout, d) ||
        nbytes != HEAD + up64(h.wbytes) + up64(h.sbytes))
        return dray_cpu_fail(ctx, DRAY_EINVAL, "weight_import: the bytes are not this plugin's export of a "
                             "%u x %u weight", d->n_out, d->k);
    struct dray_packed *p = calloc(1, sizeof(*p));
    if (!p)
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "weight_import: out of host memory");
    *p = (struct dray_packed){.layout = h.layout, .n_out = h.n_out, .k = h.k, .uses = h.uses, .rows = h.rows,
                              .w = (uint8_t *)(uintptr_t)src + HEAD,
                              .scale = (uint8_t *)(uintptr_t)src + HEAD + up64(h.wbytes),
                              .wbytes = h.wbytes, .sbytes = h.sbytes, .borrowed = 1};
    if (device_bytes)
        *device_bytes = h.wbytes + h.sbytes;
    *out = p;
    return 0;
}
