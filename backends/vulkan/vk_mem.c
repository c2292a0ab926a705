/* Device memory: buffers carved from large allocations, transfers via staging.
 *
 * Buffers up to VK_CHUNK_BYTES/2 share VK_CHUNK_BYTES allocations (first fit,
 * coalescing free list); bigger ones get an allocation of their own. A chunk is
 * returned to the driver when its last buffer goes. Uploads copy into the
 * host-visible staging buffer and record a vkCmdCopyBuffer, so they are ordered
 * with the ops; downloads record the reverse copy, submit and wait. */
#include <string.h>

#include "vk_internal.h"

#define VK_BUF_ALIGN 64u

static VkDeviceSize vk_round(VkDeviceSize n, VkDeviceSize a)
{
    return (n + a - 1) / a * a;
}

static int vk_chunk_new(struct dray_ctx *ctx, VkDeviceSize size, struct vk_chunk **out)
{
    struct vk_chunk *c = dray_vk_alloc(sizeof(*c));
    struct vk_span *s = dray_vk_alloc(sizeof(*s));
    if (!c || !s) {
        dray_vk_free(c);
        dray_vk_free(s);
        return dray_vk_fail(ctx, DRAY_ENOMEM, "out of host memory");
    }
    VkMemoryAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = size,
        .memoryTypeIndex = ctx->mem_dev,
    };
    VkResult r = vkAllocateMemory(ctx->dev, &ai, NULL, &c->mem);
    if (r != VK_SUCCESS) {
        dray_vk_free(c);
        dray_vk_free(s);
        return dray_vk_fail(ctx, DRAY_ENOMEM, "vkAllocateMemory(%llu bytes): %s",
                            (unsigned long long)size, dray_vk_result_str(r));
    }
    *s = (struct vk_span){0, size, NULL};
    c->size = size;
    c->free_list = s;
    c->n_live = 0;
    c->next = ctx->chunks;
    ctx->chunks = c;
    *out = c;
    return 0;
}

/* First fit of size bytes at alignment align; 0 and *off, or -1. */
static int vk_chunk_take(struct vk_chunk *c, VkDeviceSize size, VkDeviceSize align,
                         VkDeviceSize *off)
{
    for (struct vk_span **pp = &c->free_list; *pp; pp = &(*pp)->next) {
        struct vk_span *s = *pp;
        VkDeviceSize o = vk_round(s->off, align);
        if (o + size > s->off + s->size)
            continue;
        /* Alignment padding before o is kept as a free span only if the
         * remainder can be split off; otherwise it is wasted until coalesced. */
        VkDeviceSize end = s->off + s->size;
        if (o == s->off) {
            s->off += size;
            s->size -= size;
        } else if (o + size == end) {
            s->size = o - s->off;
        } else {
            struct vk_span *t = dray_vk_alloc(sizeof(*t));
            if (!t)
                return -1;
            *t = (struct vk_span){o + size, end - o - size, s->next};
            s->size = o - s->off;
            s->next = t;
        }
        if (s->size == 0) {
            *pp = s->next;
            dray_vk_free(s);
        }
        *off = o;
        return 0;
    }
    return -1;
}

static void vk_chunk_give(struct vk_chunk *c, VkDeviceSize off, VkDeviceSize size)
{
    struct vk_span **pp = &c->free_list;
    while (*pp && (*pp)->off < off)
        pp = &(*pp)->next;
    struct vk_span *s = dray_vk_alloc(sizeof(*s));
    if (!s)
        return; /* the bytes are lost until the chunk goes; no crash */
    *s = (struct vk_span){off, size, *pp};
    *pp = s;
    /* coalesce with the next, then with the previous span */
    if (s->next && s->off + s->size == s->next->off) {
        struct vk_span *n = s->next;
        s->size += n->size;
        s->next = n->next;
        dray_vk_free(n);
    }
    for (struct vk_span *p = c->free_list; p && p != s; p = p->next)
        if (p->next == s && p->off + p->size == s->off) {
            p->size += s->size;
            p->next = s->next;
            dray_vk_free(s);
            break;
        }
}

static void vk_chunk_drop(struct dray_ctx *ctx, struct vk_chunk *c)
{
    for (struct vk_chunk **pp = &ctx->chunks; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    while (c->free_list) {
        struct vk_span *s = c->free_list;
        c->free_list = s->next;
        dray_vk_free(s);
    }
    vkFreeMemory(ctx->dev, c->mem, NULL);
    dray_vk_free(c);
}

int dray_vk_buf_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    struct dray_buf *b;
    VkMemoryRequirements req;
    struct vk_chunk *c;
    int rc;

    *out = NULL;
    if (nbytes == 0)
        return dray_vk_fail(ctx, DRAY_EINVAL, "alloc of 0 bytes");
    b = dray_vk_alloc(sizeof(*b));
    if (!b)
        return dray_vk_fail(ctx, DRAY_ENOMEM, "out of host memory");
    memset(b, 0, sizeof(*b));
    b->nbytes = nbytes;
    b->span = vk_round(nbytes, VK_BUF_ALIGN);
    VkBufferCreateInfo bi = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = b->span,
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT,
    };
    rc = dray_vk_check(ctx, vkCreateBuffer(ctx->dev, &bi, NULL, &b->buf), "vkCreateBuffer");
    if (rc)
        goto out_free;
    vkGetBufferMemoryRequirements(ctx->dev, b->buf, &req);
    VkDeviceSize align = req.alignment > VK_BUF_ALIGN ? req.alignment : VK_BUF_ALIGN;
    if (!(req.memoryTypeBits & (1u << ctx->mem_dev))) {
        rc = dray_vk_fail(ctx, DRAY_EBACKEND, "buffer cannot live in memory type %u",
                          ctx->mem_dev);
        goto out_buf;
    }
    for (c = ctx->chunks; c; c = c->next)
        if (req.size <= VK_CHUNK_BYTES / 2 && vk_chunk_take(c, req.size, align, &b->off) == 0)
            break;
    if (!c) {
        VkDeviceSize sz = req.size <= VK_CHUNK_BYTES / 2 ? VK_CHUNK_BYTES : req.size;
        rc = vk_chunk_new(ctx, sz, &c);
        if (rc)
            goto out_buf;
        if (vk_chunk_take(c, req.size, align, &b->off) != 0) {
            vk_chunk_drop(ctx, c);
            rc = dray_vk_fail(ctx, DRAY_ENOMEM, "out of host memory");
            goto out_buf;
        }
    }
    b->chunk = c;
    c->n_live++;
    rc = dray_vk_check(ctx, vkBindBufferMemory(ctx->dev, b->buf, c->mem, b->off),
                       "vkBindBufferMemory");
    if (rc) {
        dray_vk_buf_free(ctx, b);
        return rc;
    }
    *out = b;
    return 0;
out_buf:
    vkDestroyBuffer(ctx->dev, b->buf, NULL);
out_free:
    dray_vk_free(b);
    return rc;
}

void dray_vk_buf_free(struct dray_ctx *ctx, struct dray_buf *b)
{
    VkMemoryRequirements req;

    if (!b)
        return;
    /* queued commands may still name b: let them finish first */
    dray_vk_flush(ctx);
    dray_vk_dset_forget(ctx, b->buf);
    for (uint32_t s = 0; s < VK_ROPE_SLOTS; s++) /* a new buffer at b's address is another one */
        if (ctx->rope_key[s].ff_buf == b)
            ctx->rope_key[s].ff_buf = NULL;
    vkGetBufferMemoryRequirements(ctx->dev, b->buf, &req);
    vkDestroyBuffer(ctx->dev, b->buf, NULL);
    if (b->chunk) {
        vk_chunk_give(b->chunk, b->off, req.size);
        if (--b->chunk->n_live == 0)
            vk_chunk_drop(ctx, b->chunk);
    }
    dray_vk_free(b);
}

void dray_vk_mem_release(struct dray_ctx *ctx)
{
    dray_vk_buf_free(ctx, ctx->scratch);
    dray_vk_buf_free(ctx, ctx->rope_tab);
    ctx->scratch = ctx->rope_tab = NULL;
    while (ctx->chunks) /* buffers the host forgot to free */
        vk_chunk_drop(ctx, ctx->chunks);
}

/* At least nbytes of ctx->scratch (device memory the plugin owns). */
int dray_vk_scratch(struct dray_ctx *ctx, size_t nbytes)
{
    if (ctx->scratch && ctx->scratch->nbytes >= nbytes)
        return 0;
    size_t want = nbytes < (1u << 20) ? (1u << 20) : nbytes + nbytes / 4;
    dray_vk_buf_free(ctx, ctx->scratch); /* flushes: queued ops may use it */
    ctx->scratch = NULL;
    return dray_vk_buf_alloc(ctx, want, &ctx->scratch);
}

/* A view of nbytes inside its buffer, aligned to align bytes. */
int dray_vk_check_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
                       size_t align)
{
    if (!v.buf)
        return dray_vk_fail(ctx, DRAY_EINVAL, "%s: NULL buffer", what);
    if (align > 1 && v.offset % align)
        return dray_vk_fail(ctx, DRAY_EINVAL, "%s: offset %zu is not a multiple of %zu", what,
                            v.offset, align);
    if (v.offset > v.buf->nbytes || nbytes > v.buf->nbytes - v.offset)
        return dray_vk_fail(ctx, DRAY_EINVAL,
                            "%s: %zu bytes at offset %zu overrun a buffer of %zu bytes", what,
                            nbytes, v.offset, v.buf->nbytes);
    return 0;
}

static size_t vk_buf_size(const struct dray_buf *b, int *live)
{
    *live = 1;
    return b->nbytes;
}

int dray_vk_check_args(struct dray_ctx *ctx, int rc, const struct dray_util_needs *nd)
{
    return rc ? rc : dray_util_check_views(nd, vk_buf_size, ctx->err, sizeof(ctx->err));
}

static void vk_copy_cmd(struct dray_ctx *ctx, VkBuffer src, VkDeviceSize so, VkBuffer dst,
                        VkDeviceSize dof, VkDeviceSize n)
{
    VkBufferCopy r = {so, dof, n};
    vkCmdCopyBuffer(ctx->cmd, src, dst, 1, &r);
    dray_vk_barrier(ctx);
}

int dray_vk_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    const uint8_t *p = src;
    int rc = dray_vk_check_view(ctx, "upload", dst, nbytes, 1);
    if (rc)
        return rc;
    if (nbytes && !src)
        return dray_vk_fail(ctx, DRAY_EINVAL, "upload: NULL source");
    if (nbytes)
        dst.buf->writes++;
    while (nbytes) {
        if (ctx->sused >= VK_STAGING_BYTES && (rc = dray_vk_flush(ctx)))
            return rc;
        size_t n = VK_STAGING_BYTES - ctx->sused;
        n = n < nbytes ? n : nbytes;
        if ((rc = dray_vk_begin(ctx)))
            return rc;
        memcpy(ctx->smap + ctx->sused, p, n);
        vk_copy_cmd(ctx, ctx->sbuf, ctx->sused, dst.buf->buf, dst.offset, n);
        ctx->sused = vk_round(ctx->sused + n, 16);
        p += n;
        dst.offset += n;
        nbytes -= n;
    }
    return 0;
}

int dray_vk_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    uint8_t *p = dst;
    int rc = dray_vk_check_view(ctx, "download", src, nbytes, 1);
    if (rc)
        return rc;
    if (nbytes && !dst)
        return dray_vk_fail(ctx, DRAY_EINVAL, "download: NULL destination");
    if ((rc = dray_vk_flush(ctx))) /* staging starts empty */
        return rc;
    while (nbytes) {
        size_t n = nbytes < VK_STAGING_BYTES ? nbytes : VK_STAGING_BYTES;
        if ((rc = dray_vk_begin(ctx)))
            return rc;
        vk_copy_cmd(ctx, src.buf->buf, src.offset, ctx->sbuf, 0, n);
        if ((rc = dray_vk_flush(ctx)))
            return rc;
        memcpy(p, ctx->smap, n);
        p += n;
        src.offset += n;
        nbytes -= n;
    }
    return 0;
}

int dray_vk_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    int rc = dray_vk_check_view(ctx, "copy dst", dst, nbytes, 1);
    if (!rc)
        rc = dray_vk_check_view(ctx, "copy src", src, nbytes, 1);
    if (rc || nbytes == 0)
        return rc;
    dst.buf->writes++;
    bool overlap = dst.buf == src.buf && dst.offset < src.offset + nbytes &&
                   src.offset < dst.offset + nbytes;
    if (overlap) { /* vkCmdCopyBuffer forbids overlap: bounce through scratch */
        if ((rc = dray_vk_scratch(ctx, nbytes)) || (rc = dray_vk_begin(ctx)))
            return rc;
        vk_copy_cmd(ctx, src.buf->buf, src.offset, ctx->scratch->buf, 0, nbytes);
        vk_copy_cmd(ctx, ctx->scratch->buf, 0, dst.buf->buf, dst.offset, nbytes);
        return 0;
    }
    if ((rc = dray_vk_begin(ctx)))
        return rc;
    vk_copy_cmd(ctx, src.buf->buf, src.offset, dst.buf->buf, dst.offset, nbytes);
    return 0;
}

int dray_vk_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes)
{
    int rc = dray_vk_check_view(ctx, "fill", dst, nbytes, 4);
    if (rc)
        return rc;
    if (nbytes % 4)
        return dray_vk_fail(ctx, DRAY_EINVAL, "fill: %zu bytes is not a multiple of 4", nbytes);
    if (nbytes == 0)
        return 0;
    dst.buf->writes++;
    if ((rc = dray_vk_begin(ctx)))
        return rc;
    vkCmdFillBuffer(ctx->cmd, dst.buf->buf, dst.offset, nbytes, pattern);
    dray_vk_barrier(ctx);
    return 0;
}
