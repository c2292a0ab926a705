/* Buffers of the OpenCL plugin: one cl_mem each; views are (buffer, byte offset)
 * and reach kernels as base buffer + element offset, so no sub-buffers (whose
 * offsets must be CL_DEVICE_MEM_BASE_ADDR_ALIGN-aligned) are ever made. */
#include <stdio.h>
#include <string.h>

#include "ocl.h"

int dray_ocl_alloc_buf(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    *out = NULL;
    ctx->err[0] = '\0';
    if (nbytes > ctx->max_alloc)
        return dray_ocl_fail(ctx, DRAY_ENOMEM,
                             "alloc: %zu bytes exceed the device's largest buffer of %zu bytes "
                             "(CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                             nbytes, ctx->max_alloc);
    struct dray_buf *b = dray_ocl_alloc(sizeof(*b));
    if (!b)
        return dray_ocl_fail(ctx, DRAY_ENOMEM, "alloc: out of host memory");
    cl_int rc;
    /* OpenCL refuses size 0; a 0-byte buffer still gets a valid handle. Sizes are
     * padded to 64 bytes so vector loads at the tail stay inside. */
    size_t real = (nbytes + 63) / 64 * 64;
    b->mem = clCreateBuffer(ctx->cl, CL_MEM_READ_WRITE, real ? real : 64, NULL, &rc);
    if (rc != CL_SUCCESS) {
        dray_ocl_free(b);
        char what[96];
        snprintf(what, sizeof(what), "alloc: clCreateBuffer(%zu bytes)", nbytes);
        return dray_ocl_fail_cl(ctx, rc, what);
    }
    b->size = nbytes;
    *out = b;
    return 0;
}

void dray_ocl_free_buf(struct dray_ctx *ctx, struct dray_buf *buf)
{
    (void)ctx;
    if (!buf)
        return;
    /* the runtime keeps the memory alive until queued commands using it finish */
    clReleaseMemObject(buf->mem);
    dray_ocl_free(buf);
}

int dray_ocl_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    ctx->err[0] = '\0';
    int rc = dray_ocl_check_view(ctx, "upload", "dst", dst, nbytes, 1);
    if (rc != 0 || nbytes == 0)
        return rc;
    if (!src)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "upload: NULL source");
    /* blocking: the caller may reuse src as soon as we return */
    cl_int cr = clEnqueueWriteBuffer(ctx->queue, dst.buf->mem, CL_TRUE, dst.offset, nbytes, src,
                                     0, NULL, NULL);
    return cr == CL_SUCCESS ? 0 : dray_ocl_fail_cl(ctx, cr, "upload: clEnqueueWriteBuffer");
}

int dray_ocl_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    ctx->err[0] = '\0';
    int rc = dray_ocl_check_view(ctx, "download", "src", src, nbytes, 1);
    if (rc != 0 || nbytes == 0)
        return rc;
    if (!dst)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "download: NULL destination");
    cl_int cr = clEnqueueReadBuffer(ctx->queue, src.buf->mem, CL_TRUE, src.offset, nbytes, dst, 0,
                                    NULL, NULL);
    return cr == CL_SUCCESS ? 0 : dray_ocl_fail_cl(ctx, cr, "download: clEnqueueReadBuffer");
}

int dray_ocl_scratch(struct dray_ctx *ctx, cl_mem *mem, size_t *size, size_t nbytes, const char *what)
{
    if (*mem && *size >= nbytes)
        return 0;
    if (*mem)
        clReleaseMemObject(*mem); /* freed once queued users finish */
    *mem = NULL;
    *size = 0;
    size_t want = nbytes < 4096 ? 4096 : nbytes + nbytes / 4; /* some room to grow */
    if (want > ctx->max_alloc)
        want = nbytes;
    cl_int rc;
    *mem = clCreateBuffer(ctx->cl, CL_MEM_READ_WRITE, want, NULL, &rc);
    if (rc != CL_SUCCESS) {
        *mem = NULL;
        return dray_ocl_fail_cl(ctx, rc, what);
    }
    *size = want;
    return 0;
}

int dray_ocl_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    ctx->err[0] = '\0';
    int rc = dray_ocl_check_view(ctx, "copy", "src", src, nbytes, 1);
    if (rc == 0)
        rc = dray_ocl_check_view(ctx, "copy", "dst", dst, nbytes, 1);
    if (rc != 0 || nbytes == 0)
        return rc;
    cl_int cr;
    int overlap = src.buf == dst.buf && src.offset < dst.offset + nbytes &&
                  dst.offset < src.offset + nbytes;
    if (!overlap) {
        cr = clEnqueueCopyBuffer(ctx->queue, src.buf->mem, dst.buf->mem, src.offset, dst.offset,
                                 nbytes, 0, NULL, NULL);
        return cr == CL_SUCCESS ? 0 : dray_ocl_fail_cl(ctx, cr, "copy: clEnqueueCopyBuffer");
    }
    if (src.offset == dst.offset)
        return 0;
    /* OpenCL forbids overlapping copies: go through a temporary (memmove semantics) */
    cl_mem tmp = clCreateBuffer(ctx->cl, CL_MEM_READ_WRITE, nbytes, NULL, &cr);
    if (cr != CL_SUCCESS)
        return dray_ocl_fail_cl(ctx, cr, "copy: temporary for an overlapping copy");
    cr = clEnqueueCopyBuffer(ctx->queue, src.buf->mem, tmp, src.offset, 0, nbytes, 0, NULL, NULL);
    if (cr == CL_SUCCESS)
        cr = clEnqueueCopyBuffer(ctx->queue, tmp, dst.buf->mem, 0, dst.offset, nbytes, 0, NULL,
                                 NULL);
    clReleaseMemObject(tmp);
    return cr == CL_SUCCESS ? 0 : dray_ocl_fail_cl(ctx, cr, "copy: clEnqueueCopyBuffer");
}

int dray_ocl_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes)
{
    ctx->err[0] = '\0';
    if (nbytes % 4 != 0)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "fill: %zu bytes is not a multiple of 4", nbytes);
    int rc = dray_ocl_check_view(ctx, "fill", "dst", dst, nbytes, 1);
    if (rc != 0 || nbytes == 0)
        return rc;
    if (dst.offset % 4 == 0) {
        cl_int cr = clEnqueueFillBuffer(ctx->queue, dst.buf->mem, &pattern, sizeof(pattern),
                                        dst.offset, nbytes, 0, NULL, NULL);
        return cr == CL_SUCCESS ? 0 : dray_ocl_fail_cl(ctx, cr, "fill: clEnqueueFillBuffer");
    }
    struct dray_ocl_args a = {.k = ctx->k[OCL_K_fill_bytes]};
    cl_ulong off = dst.offset, n = nbytes;
    dray_ocl_arg(&a, sizeof(cl_mem), &dst.buf->mem);
    DRAY_OCL_ARG(&a, off);
    DRAY_OCL_ARG(&a, n);
    DRAY_OCL_ARG(&a, pattern);
    size_t g = nbytes < 65536 ? nbytes : 65536;
    return dray_ocl_launch(ctx, "fill", &a, 1, &g, NULL);
}

int dray_ocl_synchronize(struct dray_ctx *ctx)
{
    ctx->err[0] = '\0';
    cl_int cr = clFinish(ctx->queue);
    return cr == CL_SUCCESS ? 0 : dray_ocl_fail_cl(ctx, cr, "synchronize: clFinish");
}
