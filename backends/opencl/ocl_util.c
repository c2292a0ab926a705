/* Shared helpers of the OpenCL plugin: host services, error text, view checks,
 * kernel arguments and launches. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl.h"

/* ---------------------------------------------------------------- host services */

static const struct dray_host *g_host;

void dray_ocl_set_host(const struct dray_host *host)
{
    g_host = host;
}

void *dray_ocl_alloc(size_t n)
{
    if (g_host && g_host->alloc)
        return g_host->alloc(n);
    return malloc(n);
}

void dray_ocl_free(void *p)
{
    if (!p)
        return;
    if (g_host && g_host->free)
        g_host->free(p);
    else
        free(p);
}

void dray_ocl_log(int level, const char *fmt, ...)
{
    if (!g_host || !g_host->log)
        return; /* a plugin never prints on its own */
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    g_host->log(level, "opencl", msg);
}

/* ---------------------------------------------------------------- errors */

const char *dray_ocl_strerror(cl_int rc, char *buf, size_t len)
{
    const char *name;
    switch (rc) {
#define CASE(c) \
    case c:     \
        name = #c; \
        break;
        CASE(CL_SUCCESS)
        CASE(CL_DEVICE_NOT_FOUND)
        CASE(CL_DEVICE_NOT_AVAILABLE)
        CASE(CL_COMPILER_NOT_AVAILABLE)
        CASE(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        CASE(CL_OUT_OF_RESOURCES)
        CASE(CL_OUT_OF_HOST_MEMORY)
        CASE(CL_BUILD_PROGRAM_FAILURE)
        CASE(CL_MEM_COPY_OVERLAP)
        CASE(CL_MISALIGNED_SUB_BUFFER_OFFSET)
        CASE(CL_INVALID_VALUE)
        CASE(CL_INVALID_DEVICE)
        CASE(CL_INVALID_CONTEXT)
        CASE(CL_INVALID_COMMAND_QUEUE)
        CASE(CL_INVALID_MEM_OBJECT)
        CASE(CL_INVALID_BUILD_OPTIONS)
        CASE(CL_INVALID_PROGRAM)
        CASE(CL_INVALID_PROGRAM_EXECUTABLE)
        CASE(CL_INVALID_KERNEL_NAME)
        CASE(CL_INVALID_KERNEL)
        CASE(CL_INVALID_ARG_INDEX)
        CASE(CL_INVALID_ARG_VALUE)
        CASE(CL_INVALID_ARG_SIZE)
        CASE(CL_INVALID_KERNEL_ARGS)
        CASE(CL_INVALID_WORK_DIMENSION)
        CASE(CL_INVALID_WORK_GROUP_SIZE)
        CASE(CL_INVALID_WORK_ITEM_SIZE)
        CASE(CL_INVALID_GLOBAL_OFFSET)
        CASE(CL_INVALID_OPERATION)
        CASE(CL_INVALID_BUFFER_SIZE)
        CASE(CL_INVALID_GLOBAL_WORK_SIZE)
        CASE(CL_INVALID_PLATFORM)
#undef CASE
    case -1001:
        name = "CL_PLATFORM_NOT_FOUND_KHR";
        break;
    default:
        name = "CL error";
        break;
    }
    snprintf(buf, len, "%s (%d)", name, (int)rc);
    return buf;
}

int dray_ocl_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
    va_end(ap);
    return rc;
}

int dray_ocl_fail_cl(struct dray_ctx *ctx, cl_int rc, const char *what)
{
    char name[64];
    int code = (rc == CL_OUT_OF_HOST_MEMORY || rc == CL_MEM_OBJECT_ALLOCATION_FAILURE)
                   ? DRAY_ENOMEM
                   : DRAY_EBACKEND;
    return dray_ocl_fail(ctx, code, "%s: %s", what, dray_ocl_strerror(rc, name, sizeof(name)));
}

int dray_ocl_check_view(struct dray_ctx *ctx, const char *op, const char *name,
                        struct dray_view v, size_t nbytes, size_t elem)
{
    if (!v.buf)
        return dray_ocl_fail(ctx, DRAY_EINVAL, "%s: %s: NULL buffer", op, name);
    if (elem > 1 && v.offset % elem != 0)
        return dray_ocl_fail(ctx, DRAY_EINVAL,
                             "%s: %s: offset %zu is not a multiple of the element size %zu", op,
                             name, v.offset, elem);
    if (v.offset > v.buf->size || nbytes > v.buf->size - v.offset)
        return dray_ocl_fail(ctx, DRAY_EINVAL,
                             "%s: %s: %zu bytes at offset %zu overrun the buffer of %zu bytes",
                             op, name, nbytes, v.offset, v.buf->size);
    return 0;
}

/* OpenCL buffers carry no liveness mark: a handle is taken as live. */
size_t dray_ocl_buf_size(const struct dray_buf *buf, int *live)
{
    *live = 1;
    return buf->size;
}

/* ---------------------------------------------------------------- launches */

void dray_ocl_arg(struct dray_ocl_args *a, size_t size, const void *value)
{
    if (a->rc == CL_SUCCESS)
        a->rc = clSetKernelArg(a->k, a->next, size, value);
    a->next++;
}

void dray_ocl_arg_view(struct dray_ocl_args *a, struct dray_view v, size_t elem)
{
    cl_ulong off = (cl_ulong)(v.offset / elem);
    dray_ocl_arg(a, sizeof(cl_mem), &v.buf->mem);
    dray_ocl_arg(a, sizeof(off), &off);
}

int dray_ocl_launch(struct dray_ctx *ctx, const char *op, const struct dray_ocl_args *a,
                    cl_uint dims, const size_t *global, const size_t *local)
{
    size_t g[3], l[3];
    char what[96];
    if (a->rc != CL_SUCCESS) {
        snprintf(what, sizeof(what), "%s: clSetKernelArg(%u)", op, a->next - 1);
        return dray_ocl_fail_cl(ctx, a->rc, what);
    }
    for (cl_uint d = 0; d < dims; d++) {
        l[d] = local ? local[d] : (d == 0 ? DRAY_OCL_WG : 1);
        if (global[d] == 0)
            return 0; /* nothing to do */
        g[d] = (global[d] + l[d] - 1) / l[d] * l[d];
    }
    cl_int rc = clEnqueueNDRangeKernel(ctx->queue, a->k, dims, NULL, g, l, 0, NULL, NULL);
    if (rc != CL_SUCCESS) {
        snprintf(what, sizeof(what), "%s: clEnqueueNDRangeKernel", op);
        return dray_ocl_fail_cl(ctx, rc, what);
    }
    return 0;
}
