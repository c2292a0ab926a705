/*
 * The OpenCL plugin: negotiation, devices, contexts and the operator table.
 *
 * Devices are every device of every platform the ICD loader reports, flattened
 * in platform order (index 0 is the first platform's first device). A context
 * owns one cl_context, one in-order queue and the program built from the
 * embedded kernels/opencl sources, with options chosen from the device's
 * extensions (integer dot products, fp64).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl.h"
#include "ocl_sources.h"

/* ---------------------------------------------------------------- devices */

static pthread_once_t g_enum_once = PTHREAD_ONCE_INIT;
static cl_device_id *g_devs;
static uint32_t g_n_devs;
static char g_enum_why[512]; /* why there are no devices, "" if there are */

static void enumerate(void)
{
    cl_uint n_plat = 0;
    char name[64];
    cl_int rc = clGetPlatformIDs(0, NULL, &n_plat);
    if (rc != CL_SUCCESS || n_plat == 0) {
        snprintf(g_enum_why, sizeof(g_enum_why),
                 "no OpenCL platform: clGetPlatformIDs gave %s and %u platforms; install an ICD "
                 "(pocl-opencl-icd for CPUs, or the accelerator vendor's OpenCL driver) and check "
                 "/etc/OpenCL/vendors",
                 dray_ocl_strerror(rc, name, sizeof(name)), (unsigned)n_plat);
        return;
    }
    cl_platform_id *plats = calloc(n_plat, sizeof(*plats));
    if (!plats || clGetPlatformIDs(n_plat, plats, NULL) != CL_SUCCESS) {
        snprintf(g_enum_why, sizeof(g_enum_why), "cannot list the %u OpenCL platforms",
                 (unsigned)n_plat);
        free(plats);
        return;
    }
    uint32_t total = 0;
    for (cl_uint p = 0; p < n_plat; p++) {
        cl_uint n = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &n) == CL_SUCCESS)
            total += n;
    }
    g_devs = total ? calloc(total, sizeof(*g_devs)) : NULL;
    for (cl_uint p = 0; g_devs && p < n_plat; p++) {
        cl_uint n = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, total - g_n_devs, g_devs + g_n_devs, &n) ==
            CL_SUCCESS)
            g_n_devs += n;
    }
    if (g_n_devs == 0)
        snprintf(g_enum_why, sizeof(g_enum_why),
                 "%u OpenCL platform(s) but no device: the driver sees no hardware",
                 (unsigned)n_plat);
    free(plats);
}

int dray_ocl_devices(cl_device_id **devs, uint32_t *n, const char **why)
{
    pthread_once(&g_enum_once, enumerate);
    *devs = g_devs;
    *n = g_n_devs;
    *why = g_enum_why;
    return 0;
}

/* Is ext one of the space-separated names in list? */
static int has_word(const char *list, const char *ext)
{
    size_t n = strlen(ext);
    for (const char *p = list; (p = strstr(p, ext)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return 1;
    return 0;
}

void dray_ocl_read_caps(cl_device_id dev, struct dray_ocl_caps *caps)
{
    memset(caps, 0, sizeof(*caps));
    size_t len = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, 0, NULL, &len) == CL_SUCCESS && len > 0) {
        char *ext = malloc(len + 1);
        if (ext && clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, len, ext, NULL) == CL_SUCCESS) {
            ext[len] = '\0';
            caps->fp16 = has_word(ext, "cl_khr_fp16");
            caps->fp64 = has_word(ext, "cl_khr_fp64");
            caps->int_dot = has_word(ext, "cl_khr_integer_dot_product");
        }
        free(ext);
    }
    cl_device_fp_config fp = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof(fp), &fp, NULL) == CL_SUCCESS)
        caps->cr_divide = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
}

static int ocl_device_count(uint32_t *count)
{
    cl_device_id *devs;
    const char *why;
    dray_ocl_devices(&devs, count, &why);
    if (*count == 0) /* the registry keeps this line as the reason */
        dray_ocl_log(DRAY_LOG_INFO, "%s", why);
    return 0;
}

static int ocl_device_props(uint32_t index, struct dray_device_props *props)
{
    cl_device_id *devs;
    uint32_t n;
    const char *why;
    dray_ocl_devices(&devs, &n, &why);
    if (index >= n)
        return DRAY_EINVAL;
    cl_device_id d = devs[index];
    memset(props, 0, sizeof(*props));
    cl_ulong mem = 0, max_alloc = 0;
    cl_uint cu = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof(props->name) - 1, props->name, NULL) != CL_SUCCESS ||
        clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(mem), &mem, NULL) != CL_SUCCESS)
        return DRAY_EBACKEND;
    clGetDeviceInfo(d, CL_DEVICE_VENDOR, sizeof(props->vendor) - 1, props->vendor, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(max_alloc), &max_alloc, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cu), &cu, NULL);
    props->mem_total = mem;
    props->max_alloc = max_alloc;
    props->compute_units = cu;

    struct dray_ocl_caps caps;
    dray_ocl_read_caps(d, &caps);
    /* Not DRAY_DEV_UNIFIED even on CPU devices: buffers are cl_mem objects
     * without a stable host pointer, so host_ptr is not offered. */
    props->flags = (caps.int_dot ? DRAY_DEV_INT8_DOT : 0) | (caps.fp16 ? DRAY_DEV_FP16 : 0);
    /* Everything below runs on any OpenCL 1.2 device: f16 is storage only
     * (vload_half/vstore_half), rope has an fp64-free path. */
    props->op_dtypes[DRAY_OP_EMBED] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_RMSNORM] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_MATMUL] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ROPE] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_KV_STORE] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_ATTENTION] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_GATED_ACT] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ADD] = DRAY_DTYPE_BIT(DRAY_F32);
    return 0;
}

/* ---------------------------------------------------------------- contexts */

static void ocl_close(struct dray_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->queue)
        clFinish(ctx->queue);
    for (int i = 0; i < OCL_K_COUNT; i++)
        if (ctx->k[i])
            clReleaseKernel(ctx->k[i]);
    if (ctx->q8)
        clReleaseMemObject(ctx->q8);
    if (ctx->sx)
        clReleaseMemObject(ctx->sx);
    if (ctx->rope_tab)
        clReleaseMemObject(ctx->rope_tab);
    if (ctx->prog)
        clReleaseProgram(ctx->prog);
    if (ctx->queue)
        clReleaseCommandQueue(ctx->queue);
    if (ctx->cl)
        clReleaseContext(ctx->cl);
    dray_ocl_free(ctx);
}

/* Build the program; on failure ctx->err holds the build log (as much as fits)
 * and the whole log goes to the host log. */
static int build_program(struct dray_ctx *ctx)
{
    cl_int rc;
    ctx->prog = clCreateProgramWithSource(ctx->cl, dray_ocl_source_count,
                                          (const char **)dray_ocl_sources, NULL, &rc);
    if (rc != CL_SUCCESS)
        return dray_ocl_fail_cl(ctx, rc, "clCreateProgramWithSource");
    /* DRAY_OCL_NO_FP64 (debug/test knob) takes the path of devices without fp64 */
    ctx->fp64 = ctx->caps.fp64 && !getenv("DRAY_OCL_NO_FP64");
    char opts[256];
    snprintf(opts, sizeof(opts), "-cl-std=CL1.2%s%s%s",
             ctx->caps.int_dot && !ctx->reference ? " -DDRAY_OCL_INT_DOT=1" : "",
             ctx->fp64 ? " -DDRAY_OCL_FP64=1" : "",
             ctx->caps.cr_divide ? " -cl-fp32-correctly-rounded-divide-sqrt" : "");
    rc = clBuildProgram(ctx->prog, 1, &ctx->dev, opts, NULL, NULL);
    if (rc == CL_SUCCESS)
        return 0;

    size_t len = 0;
    char *log = NULL;
    if (clGetProgramBuildInfo(ctx->prog, ctx->dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) ==
            CL_SUCCESS &&
        (log = malloc(len + 1)) != NULL &&
        clGetProgramBuildInfo(ctx->prog, ctx->dev, CL_PROGRAM_BUILD_LOG, len, log, NULL) ==
            CL_SUCCESS)
        log[len] = '\0';
    else if (log)
        log[0] = '\0';
    char name[64];
    dray_ocl_log(DRAY_LOG_ERROR, "clBuildProgram(%s) failed: %s; build log:\n%s", opts,
                 dray_ocl_strerror(rc, name, sizeof(name)), log ? log : "(none)");
    dray_ocl_fail(ctx, DRAY_EBACKEND, "clBuildProgram(%s) failed: %s; build log: %s", opts,
                  name, log ? log : "(none)");
    free(log);
    return DRAY_EBACKEND;
}

static int create_kernels(struct dray_ctx *ctx)
{
    static const char *const names[OCL_K_COUNT] = {
#define DRAY_OCL_NAME(n) #n,
        DRAY_OCL_KERNELS(DRAY_OCL_NAME)
#undef DRAY_OCL_NAME
    };
    for (int i = 0; i < OCL_K_COUNT; i++) {
        cl_int rc;
        ctx->k[i] = clCreateKernel(ctx->prog, names[i], &rc);
        if (rc != CL_SUCCESS) {
            char what[96];
            snprintf(what, sizeof(what), "clCreateKernel(%s)", names[i]);
            return dray_ocl_fail_cl(ctx, rc, what);
        }
    }
    return 0;
}

static int setup(struct dray_ctx *ctx, cl_device_id dev)
{
    cl_int rc;
    size_t max_wg = 0;
    ctx->dev = dev;
    dray_ocl_read_caps(dev, &ctx->caps);
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(max_alloc), &max_alloc, NULL);
    ctx->max_alloc = (size_t)max_alloc;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(max_wg), &max_wg, NULL);
    if (max_wg < DRAY_OCL_WG)
        return dray_ocl_fail(ctx, DRAY_ENOTSUP,
                             "work-groups of at most %zu items; the kernels need %u", max_wg,
                             DRAY_OCL_WG);
    ctx->cl = clCreateContext(NULL, 1, &dev, NULL, NULL, &rc);
    if (rc != CL_SUCCESS)
        return dray_ocl_fail_cl(ctx, rc, "clCreateContext");
    ctx->queue = clCreateCommandQueueWithProperties(ctx->cl, dev, NULL, &rc);
    if (rc != CL_SUCCESS)
        return dray_ocl_fail_cl(ctx, rc, "clCreateCommandQueueWithProperties");
    rc = build_program(ctx);
    if (rc != 0)
        return rc;
    return create_kernels(ctx);
}

static int ocl_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out,
                    char *err, size_t errlen)
{
    cl_device_id *devs;
    uint32_t n;
    const char *why;
    *out = NULL;
    dray_ocl_devices(&devs, &n, &why);
    if (n == 0) {
        snprintf(err, errlen, "%s", why);
        return DRAY_ENODEV;
    }
    if (index >= n) {
        snprintf(err, errlen, "no OpenCL device %u: there are %u (indexes 0..%u)", index, n, n - 1);
        return DRAY_EINVAL;
    }
    struct dray_ctx *ctx = dray_ocl_alloc(sizeof(*ctx));
    if (!ctx) {
        snprintf(err, errlen, "out of host memory for the context");
        return DRAY_ENOMEM;
    }
    memset(ctx, 0, sizeof(*ctx));
    /* read only the members the caller's struct has */
    if (DRAY_UTIL_OPT_HAS(opt, reference))
        ctx->reference = opt->reference != 0;
    int rc = setup(ctx, devs[index]);
    if (rc != 0) {
        snprintf(err, errlen, "%s", ctx->err);
        ocl_close(ctx);
        return rc;
    }
    ctx->err[0] = '\0';
    *out = ctx;
    return 0;
}

static const char *ocl_last_error(struct dray_ctx *ctx)
{
    return ctx ? ctx->err : "";
}

/* ---------------------------------------------------------------- the table */

/* Version 2: the props' dtypes, and attention's head_dim limit (one
 * work-group holds a head). Version 3: packed weights of every format for
 * matmul and embed, with one or two activation passes (ocl_packed.c);
 * version 4: the two-level formats too. */
static int ocl_op_caps(uint32_t index, struct dray_op_caps *caps)
{
    static const struct dray_util_limits lim = {.max_head_dim = DRAY_OCL_HD_MAX,
                                                .max_k = 65536,
                                                .matmul_wformats = DRAY_OCL_WFORMATS,
                                                .embed_wformats = DRAY_OCL_WFORMATS,
                                                .matmul_passes = 3};
    return dray_util_op_caps(index, caps, ocl_device_props, &lim);
}

static const struct dray_ops ocl_ops = {
    .version = 4, /* the ABI this code implements, not the header's newest */
    .name = "opencl",
    .describe = "OpenCL 1.2+ devices through the ICD loader (kernels built from embedded "
                "OpenCL C at open; int8 dots by hand or cl_khr_integer_dot_product; "
                "packed 4/5/8-bit weights and two-level Q4_K/Q5_K/Q6_K shapes)",
    .device_count = ocl_device_count,
    .device_props = ocl_device_props,
    .open = ocl_open,
    .close = ocl_close,
    .last_error = ocl_last_error,
    .alloc = dray_ocl_alloc_buf,
    .free = dray_ocl_free_buf,
    .upload = dray_ocl_upload,
    .download = dray_ocl_download,
    .copy = dray_ocl_copy,
    .fill = dray_ocl_fill,
    .synchronize = dray_ocl_synchronize,
    .embed = dray_ocl_embed,
    .rmsnorm = dray_ocl_rmsnorm,
    .matmul = dray_ocl_matmul,
    .rope = dray_ocl_rope,
    .kv_store = dray_ocl_kv_store,
    .attention = dray_ocl_attention,
    .gated_act = dray_ocl_gated_act,
    .add = dray_ocl_add,
    .op_caps = ocl_op_caps,
    .weight_create = dray_ocl_weight_create,
    .weight_free = dray_ocl_weight_free,
};

/* Answers with ocl_ops.version (what this plugin implements), never the
 * header's DRAY_ABI_VERSION: a newer header must not make an old table claim
 * members it does not have (docs/PORTING.md). */
DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *host,
                                      const struct dray_ops **ops, char *err, size_t errlen)
{
    int rc = dray_util_negotiate(version, &ocl_ops, ops, err, errlen);
    if (rc == 0)
        dray_ocl_set_host(host);
    return rc;
}
