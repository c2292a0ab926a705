/* Vulkan instance, device enumeration, properties, open/close.
 *
 * No device is touched before open(); device_count/device_props share one
 * instance made at the first question (vk_probe_instance). DRAY_VK_VALIDATION=1 turns on VK_LAYER_KHRONOS_validation
 * (with synchronization validation) and a debug-utils messenger that records the
 * first message; the call during which it arrives then fails with DRAY_EBACKEND. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static const char *vk_layer = "VK_LAYER_KHRONOS_validation";

static bool vk_validation_wanted(void)
{
    const char *v = getenv("DRAY_VK_VALIDATION");
    return v && v[0] && strcmp(v, "0") != 0;
}

static VKAPI_ATTR VkBool32 VKAPI_CALL vk_on_message(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                                    VkDebugUtilsMessageTypeFlagsEXT type,
                                                    const VkDebugUtilsMessengerCallbackDataEXT *d,
                                                    void *user)
{
    struct dray_ctx *ctx = user;
    (void)sev;
    (void)type;
    if (!ctx->vk_flag) {
        snprintf(ctx->vk_msg, sizeof(ctx->vk_msg), "%s",
                 d && d->pMessage ? d->pMessage : "(no message)");
        ctx->vk_flag = true;
    }
    dray_vk_log(DRAY_LOG_ERROR, "validation: %s", d && d->pMessage ? d->pMessage : "");
    return VK_FALSE;
}

/* An instance; with ctx != NULL and validation wanted, also layer + messenger. */
static VkResult vk_make_instance(struct dray_ctx *ctx, VkInstance *out)
{
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "dray",
        .pEngineName = "dray",
        .apiVersion = VK_API_VERSION_1_3,
    };
    const char *ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkDebugUtilsMessengerCreateInfoEXT mci = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT,
        .pfnUserCallback = vk_on_message,
        .pUserData = ctx,
    };
    VkValidationFeatureEnableEXT en[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    VkValidationFeaturesEXT vf = {
        .sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
        .pNext = &mci,
        .enabledValidationFeatureCount = 1,
        .pEnabledValidationFeatures = en,
    };
    VkInstanceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .pApplicationInfo = &app,
    };
    if (ctx && ctx->validation) {
        ci.enabledLayerCount = 1;
        ci.ppEnabledLayerNames = &vk_layer;
        ci.enabledExtensionCount = 1;
        ci.ppEnabledExtensionNames = &ext;
        ci.pNext = &vf;
    }
    VkResult r = vkCreateInstance(&ci, NULL, out);
    if (r != VK_SUCCESS || !ctx || !ctx->validation)
        return r;
    PFN_vkCreateDebugUtilsMessengerEXT mk = (PFN_vkCreateDebugUtilsMessengerEXT)
        vkGetInstanceProcAddr(*out, "vkCreateDebugUtilsMessengerEXT");
    if (!mk) {
        vkDestroyInstance(*out, NULL);
        return VK_ERROR_EXTENSION_NOT_PRESENT;
    }
    r = mk(*out, &mci, NULL, &ctx->msgr);
    if (r != VK_SUCCESS)
        vkDestroyInstance(*out, NULL);
    return r;
}

static bool vk_compute_family(VkPhysicalDevice pd, uint32_t *fam)
{
    VkQueueFamilyProperties qf[16];
    uint32_t n = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, qf);
    for (uint32_t i = 0; i < n; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *fam = i;
            return true;
        }
    return false;
}

/* The usable devices (Vulkan >= 1.2 with a compute queue), in driver order. */
static uint32_t vk_list(VkInstance inst, VkPhysicalDevice *out, uint32_t cap)
{
    VkPhysicalDevice all[16];
    uint32_t n = 16, k = 0, fam;
    if (vkEnumeratePhysicalDevices(inst, &n, all) < 0)
        return 0;
    for (uint32_t i = 0; i < n && k < cap; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(all[i], &p);
        if (p.apiVersion >= VK_API_VERSION_1_2 && vk_compute_family(all[i], &fam))
            out[k++] = all[i];
    }
    return k;
}

/* The instance device_count and device_props ask, made once and kept while the
 * plugin is loaded. An instance per question made the loader load and unload
 * the driver at every registry open (and Mesa's lavapipe leaks 136 bytes each
 * time it is unloaded). It is destroyed by an atexit handler registered once
 * the driver is loaded: such a handler runs when this plugin is dlclosed, and
 * at exit before the driver's own static destructors (registered earlier). */
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static VkInstance probe_inst = VK_NULL_HANDLE;
static VkResult probe_rc = VK_ERROR_INITIALIZATION_FAILED;

static void probe_drop(void)
{
    /* DRAY_NO_DLCLOSE (the sanitizer runs): plugins stay mapped to the end so that
     * leak reports keep their library names; the driver stays loaded with them,
     * else its unload would leave lavapipe's block behind as a nameless leak */
    const char *keep = getenv("DRAY_NO_DLCLOSE");
    if (keep && keep[0] && strcmp(keep, "0"))
        return;
    if (probe_inst != VK_NULL_HANDLE)
        vkDestroyInstance(probe_inst, NULL);
    probe_inst = VK_NULL_HANDLE;
}

static void probe_make(void)
{
    probe_rc = vk_make_instance(NULL, &probe_inst);
    if (probe_rc != VK_SUCCESS)
        probe_inst = VK_NULL_HANDLE;
    else if (atexit(probe_drop))
        probe_drop(); /* no handler: do not keep what nothing would free */
}

static VkResult vk_probe_instance(VkInstance *out)
{
    pthread_once(&probe_once, probe_make);
    *out = probe_inst;
    return probe_inst != VK_NULL_HANDLE ? VK_SUCCESS
           : probe_rc != VK_SUCCESS     ? probe_rc
                                        : VK_ERROR_INITIALIZATION_FAILED;
}

int dray_vk_device_count(uint32_t *count)
{
    VkInstance inst;
    VkPhysicalDevice pd[16];

    if (!count)
        return DRAY_EINVAL;
    *count = 0;
    VkResult r = vk_probe_instance(&inst);
    if (r != VK_SUCCESS) {
        dray_vk_log(DRAY_LOG_INFO, "no Vulkan driver: vkCreateInstance: %s",
                    dray_vk_result_str(r));
        return 0;
    }
    *count = vk_list(inst, pd, 16);
    if (*count == 0)
        dray_vk_log(DRAY_LOG_INFO, "no Vulkan 1.2 device with a compute queue");
    return 0;
}

/* What the device offers, as the plugin uses it. */
struct vk_caps {
    VkPhysicalDeviceFeatures2 f;
    VkPhysicalDeviceVulkan11Features f11;
    VkPhysicalDeviceVulkan12Features f12;
    VkPhysicalDeviceVulkan13Features f13;
    VkPhysicalDeviceProperties2 p;
    VkPhysicalDeviceVulkan11Properties p11;
    VkPhysicalDeviceVulkan12Properties p12;
    VkPhysicalDeviceShaderIntegerDotProductProperties pdot;
    bool i8, f16, dp4a;
};

static void vk_query(VkPhysicalDevice pd, struct vk_caps *c)
{
    memset(c, 0, sizeof(*c));
    VkPhysicalDeviceProperties base;
    vkGetPhysicalDeviceProperties(pd, &base);
    bool v13 = base.apiVersion >= VK_API_VERSION_1_3;
    c->f13.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES;
    c->f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    c->f12.pNext = v13 ? &c->f13 : NULL;
    c->f11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
    c->f11.pNext = &c->f12;
    c->f.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    c->f.pNext = &c->f11;
    vkGetPhysicalDeviceFeatures2(pd, &c->f);
    c->pdot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES;
    c->p12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES;
    c->p12.pNext = v13 ? &c->pdot : NULL;
    c->p11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES;
    c->p11.pNext = &c->p12;
    c->p.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    c->p.pNext = &c->p11;
    vkGetPhysicalDeviceProperties2(pd, &c->p);
    c->i8 = c->f12.storageBuffer8BitAccess;
    c->f16 = c->f11.storageBuffer16BitAccess;
    c->dp4a = c->i8 && v13 && c->f13.shaderIntegerDotProduct;
}

/* PCI vendor ids (and Khronos ids for non-PCI vendors) to names. */
static const char *vk_vendor_name(uint32_t id)
{
    switch (id) {
    case 0x10de: return "NVIDIA";
    case 0x1002: return "AMD";
    case 0x8086: return "Intel";
    case 0x13b5: return "ARM";
    case 0x5143: return "Qualcomm";
    case 0x106b: return "Apple";
    case 0x10005: return "Mesa";
    default: return "unknown vendor";
    }
}

static void vk_fill_props(VkPhysicalDevice pd, const struct vk_caps *c,
                          struct dray_device_props *p)
{
    VkPhysicalDeviceMemoryProperties mp;
    uint32_t i8 = c->i8 ? DRAY_DTYPE_BIT(DRAY_I8) : 0;
    uint32_t f16 = c->f16 ? DRAY_DTYPE_BIT(DRAY_F16) : 0;

    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%.127s", c->p.properties.deviceName);
    snprintf(p->vendor, sizeof(p->vendor), "%s, driver %.40s",
             vk_vendor_name(c->p.properties.vendorID), c->p12.driverName);
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
        if (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            p->mem_total += mp.memoryHeaps[h].size;
    p->max_alloc = c->p11.maxMemoryAllocationSize;
    p->compute_units = 1; /* Vulkan does not report it */
    if (c->dp4a && c->pdot.integerDotProduct4x8BitPackedSignedAccelerated)
        p->flags |= DRAY_DEV_INT8_DOT;
    if (c->f12.shaderFloat16)
        p->flags |= DRAY_DEV_FP16;
    p->op_dtypes[DRAY_OP_EMBED] = DRAY_DTYPE_BIT(DRAY_F32) | i8;
    p->op_dtypes[DRAY_OP_RMSNORM] = DRAY_DTYPE_BIT(DRAY_F32);
    p->op_dtypes[DRAY_OP_MATMUL] = DRAY_DTYPE_BIT(DRAY_F32) | i8;
    p->op_dtypes[DRAY_OP_ROPE] = DRAY_DTYPE_BIT(DRAY_F32);
    p->op_dtypes[DRAY_OP_KV_STORE] = i8 | f16;
    p->op_dtypes[DRAY_OP_ATTENTION] = i8 | f16;
    p->op_dtypes[DRAY_OP_GATED_ACT] = DRAY_DTYPE_BIT(DRAY_F32);
    p->op_dtypes[DRAY_OP_ADD] = DRAY_DTYPE_BIT(DRAY_F32);
}

int dray_vk_device_props(uint32_t index, struct dray_device_props *props)
{
    VkInstance inst;
    VkPhysicalDevice pd[16];
    struct vk_caps c;

    if (!props)
        return DRAY_EINVAL;
    if (vk_probe_instance(&inst) != VK_SUCCESS)
        return DRAY_ENODEV;
    uint32_t n = vk_list(inst, pd, 16);
    int rc = DRAY_ENODEV;
    if (index < n) {
        vk_query(pd[index], &c);
        vk_fill_props(pd[index], &c, props);
        rc = 0;
    }
    return rc;
}

/* Memory types: device-local for buffers, host-visible+coherent for staging. */
static int vk_pick_memory(struct dray_ctx *ctx)
{
    VkPhysicalDeviceMemoryProperties mp;
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                       VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int dev = -1, hst = -1, hst_cached = -1;

    vkGetPhysicalDeviceMemoryProperties(ctx->pdev, &mp);
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
        if (dev < 0 && (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT))
            dev = (int)i;
        if (hst < 0 && (f & host) == host)
            hst = (int)i;
        if (hst_cached < 0 && (f & host) == host && (f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT))
            hst_cached = (int)i;
    }
    if (hst_cached >= 0) /* downloads read it back: cached is much faster */
        hst = hst_cached;
    if (dev < 0)
        dev = hst;
    if (dev < 0 || hst < 0)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "no device-local or host-visible memory type");
    ctx->mem_dev = (uint32_t)dev;
    ctx->mem_host = (uint32_t)hst;
    return 0;
}

static int vk_make_device(struct dray_ctx *ctx, const struct vk_caps *c)
{
    float prio = 1.0f;
    VkPhysicalDeviceVulkan13Features f13 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES,
        .shaderIntegerDotProduct = c->dp4a,
    };
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
        .pNext = c->dp4a ? &f13 : NULL,
        .storageBuffer8BitAccess = c->i8,
    };
    VkPhysicalDeviceVulkan11Features f11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
        .pNext = &f12,
        .storageBuffer16BitAccess = c->f16,
    };
    VkPhysicalDeviceFeatures2 f = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
        .pNext = &f11,
    };
    VkDeviceQueueCreateInfo q = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = ctx->qfam,
        .queueCount = 1,
        .pQueuePriorities = &prio,
    };
    VkDeviceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .pNext = &f,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &q,
    };
    int rc = dray_vk_check(ctx, vkCreateDevice(ctx->pdev, &ci, NULL, &ctx->dev), "vkCreateDevice");
    if (rc)
        return rc;
    vkGetDeviceQueue(ctx->dev, ctx->qfam, 0, &ctx->queue);
    return 0;
}

int dray_vk_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out,
                 char *err, size_t errlen)
{
    VkPhysicalDevice pd[16];
    struct vk_caps c;
    struct dray_ctx *ctx;
    int rc;

    (void)opt; /* n_threads: lavapipe reads LP_NUM_THREADS; reference: no scalar mode here */
    if (!out)
        return DRAY_EINVAL;
    *out = NULL;
    ctx = dray_vk_alloc(sizeof(*ctx));
    if (!ctx) {
        snprintf(err, errlen, "vulkan: out of host memory");
        return DRAY_ENOMEM;
    }
    memset(ctx, 0, sizeof(*ctx));
    ctx->validation = vk_validation_wanted();
    VkResult r = vk_make_instance(ctx, &ctx->inst);
    if (r != VK_SUCCESS) {
        snprintf(err, errlen, "vulkan: vkCreateInstance failed: %s%s", dray_vk_result_str(r),
                 ctx->validation ? " (DRAY_VK_VALIDATION is set: is "
                                   "VK_LAYER_KHRONOS_validation installed?)"
                                 : "");
        dray_vk_free(ctx);
        return r == VK_ERROR_INCOMPATIBLE_DRIVER ? DRAY_ENODEV : DRAY_EBACKEND;
    }
    if (index >= vk_list(ctx->inst, pd, 16)) {
        snprintf(err, errlen, "vulkan: no device %u", index);
        rc = DRAY_ENODEV;
        goto fail;
    }
    ctx->pdev = pd[index];
    vk_compute_family(ctx->pdev, &ctx->qfam);
    vk_query(ctx->pdev, &c);
    ctx->has_i8 = c.i8;
    ctx->has_f16 = c.f16;
    ctx->has_dp4a = c.dp4a && !getenv("DRAY_VK_NO_DOT");
    ctx->max_range = c.p.properties.limits.maxStorageBufferRange;
    ctx->off_align = c.p.properties.limits.minStorageBufferOffsetAlignment;
    if (ctx->off_align < 4)
        ctx->off_align = 4;
    rc = vk_pick_memory(ctx);
    if (!rc)
        rc = vk_make_device(ctx, &c);
    if (!rc)
        rc = dray_vk_exec_init(ctx);
    if (!rc && ctx->vk_flag)
        rc = DRAY_EBACKEND, snprintf(ctx->err, sizeof(ctx->err), "validation: %.480s", ctx->vk_msg);
    if (rc) {
        snprintf(err, errlen, "vulkan: open %.100s: %.380s", c.p.properties.deviceName, ctx->err);
        goto fail;
    }
    *out = ctx;
    return 0;
fail:
    dray_vk_close(ctx);
    return rc;
}

void dray_vk_close(struct dray_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->dev) {
        dray_vk_log(DRAY_LOG_DEBUG, "descriptor set cache: %llu hits, %llu misses",
                    (unsigned long long)ctx->dcache_hits, (unsigned long long)ctx->dcache_misses);
        vkDeviceWaitIdle(ctx->dev);
        dray_vk_mem_release(ctx);
        dray_vk_exec_release(ctx);
        vkDestroyDevice(ctx->dev, NULL);
    }
    if (ctx->msgr) {
        PFN_vkDestroyDebugUtilsMessengerEXT rm = (PFN_vkDestroyDebugUtilsMessengerEXT)
            vkGetInstanceProcAddr(ctx->inst, "vkDestroyDebugUtilsMessengerEXT");
        if (rm)
            rm(ctx->inst, ctx->msgr, NULL);
    }
    if (ctx->inst)
        vkDestroyInstance(ctx->inst, NULL);
    dray_vk_free(ctx);
}
