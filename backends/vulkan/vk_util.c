/* The Vulkan plugin's leaf services, used by every other file of the plugin:
 * host memory and logging (through the host's services once negotiated),
 * error text into the context, and VkResult names. Calls nothing else of the
 * plugin, so the plugin's files depend on it and not on each other for these. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "vk_internal.h"

static const struct dray_host *vk_host;

void *dray_vk_alloc(size_t n)
{
    if (vk_host && vk_host->alloc)
        return vk_host->alloc(n);
    return malloc(n);
}

void dray_vk_free(void *p)
{
    if (!p)
        return;
    if (vk_host && vk_host->free)
        vk_host->free(p);
    else
        free(p);
}

void dray_vk_log(int level, const char *fmt, ...)
{
    char msg[VK_ERRLEN];
    va_list ap;

    if (!vk_host || !vk_host->log)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    vk_host->log(level, "vulkan", msg);
}

int dray_vk_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
    va_end(ap);
    return rc;
}

const char *dray_vk_result_str(VkResult r)
{
    switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    default: return "VkResult error";
    }
}

/* 0 for success, else an error naming the failed call. */
int dray_vk_check(struct dray_ctx *ctx, VkResult r, const char *what)
{
    if (r == VK_SUCCESS)
        return 0;
    int rc = (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY)
                 ? DRAY_ENOMEM
                 : DRAY_EBACKEND;
    return dray_vk_fail(ctx, rc, "%s failed: %s (%d)", what, dray_vk_result_str(r), (int)r);
}

void dray_vk_set_host(const struct dray_host *host)
{
    vk_host = host;
}
