/*
 * Host-side tests of the GPU plugins (libdray-cuda.so, libdray-hip.so) that
 * run on a machine without a GPU: negotiation is quiet and cheap, a missing
 * driver/device reads as 0 devices with a plain reason, open() fails cleanly
 * with DRAY_ENODEV, the plugins load side by side with the CPU plugin in one
 * process, and each exports exactly one dynamic symbol. A plugin that was not
 * built (no nvcc / hipcc) is skipped; on a machine that has a device the
 * no-device cases are skipped (tests/test_gpu_device.c covers that case).
 * Packed weights' host half runs here too: weight_create's argument checks and
 * device layout (backends/cuda/gpu_layout.h, plain C) for every format, the
 * two-level ones' bytes (GGUF's per 256 weights) and sub-scale packing
 * (kernels/cuda/gpu_kscales.h, the decoder the kernels use) included.
 */
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "gpu_layout.h"
#include "testutil.h"

/* ------------------------------------------------------------- helpers */

static char last_log[512];
static int n_logs;

static void capture_log(int level, const char *plugin, const char *msg)
{
    (void)level;
    (void)plugin;
    snprintf(last_log, sizeof(last_log), "%s", msg ? msg : "");
    n_logs++;
}

static const struct dray_host test_host = {
    .version = DRAY_ABI_VERSION, .alloc = malloc, .free = free, .log = capture_log};

static const char *plugin_file(const char *name)
{
    static char path[4][1024];
    static int next;
    const char *root = getenv("DRAY_BUILD_ROOT");
    char *p = path[next++ % 4];
    snprintf(p, sizeof(path[0]), "%s/backends/%s/libdray-%s.so", root ? root : ".", name, name);
    return p;
}

struct loaded {
    void *handle;
    const struct dray_ops *ops;
};

/* dlopen + negotiate; skips the calling test when the plugin was not built. */
static struct loaded load(const char *name)
{
    struct loaded l = {NULL, NULL};
    const char *path = plugin_file(name);
    if (access(path, R_OK) != 0) {
        print_message("skip: %s not built (%s)\n", name, path);
        return l;
    }
    l.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l.handle) {
        /* a missing runtime library is a clean skip for the registry too */
        print_message("skip: dlopen %s: %s\n", path, dlerror());
        return l;
    }
    dray_plugin_negotiate_fn neg = (dray_plugin_negotiate_fn)dlsym(l.handle, DRAY_PLUGIN_SYMBOL);
    assert_non_null(neg);
    uint32_t v = DRAY_ABI_VERSION;
    char err[256] = "";
    n_logs = 0;
    assert_int_equal(neg(&v, &test_host, &l.ops, err, sizeof(err)), 0);
    assert_int_equal(n_logs, 0); /* negotiation is silent */
    /* the version each implements: the CPU's prepared layouts are version 5 */
    assert_int_equal(v, strcmp(name, "cpu") ? 4u : 5u);
    assert_non_null(l.ops);
    assert_string_equal(l.ops->name, name);
    return l;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* -------------------------------------------------------------- cases */

static void check_negotiates_quickly(const char *name)
{
    double t0 = now_s();
    struct loaded l = load(name);
    if (!l.handle)
        skip();
    printf("# %s: negotiated in %.3f s (touches no device, starts no runtime)\n", name, now_s() - t0);
    assert_int_equal(l.ops->version, 4); /* the version its table implements */
    /* every mandatory member of the v3 table is set; the reserved slot is NULL */
    assert_non_null(l.ops->weight_create);
    assert_non_null(l.ops->weight_free);
    l.ops->weight_free(NULL, NULL); /* NULL is a no-op, even without a context */
    assert_null(l.ops->reserved_v1);
    assert_non_null(l.ops->op_caps);
    assert_non_null(l.ops->describe);
    assert_non_null(l.ops->device_count);
    assert_non_null(l.ops->open);
    assert_non_null(l.ops->alloc);
    assert_non_null(l.ops->synchronize);
    assert_non_null(l.ops->embed);
    assert_non_null(l.ops->rmsnorm);
    assert_non_null(l.ops->matmul);
    assert_non_null(l.ops->rope);
    assert_non_null(l.ops->kv_store);
    assert_non_null(l.ops->attention);
    assert_non_null(l.ops->gated_act);
    assert_non_null(l.ops->add);
    dlclose(l.handle);
}

static void test_gpu_cuda_negotiates_quickly_and_silently(void **state)
{
    (void)state;
    check_negotiates_quickly("cuda");
}

static void test_gpu_hip_negotiates_quickly_and_silently(void **state)
{
    (void)state;
    check_negotiates_quickly("hip");
}

static void test_gpu_negotiate_refuses_an_older_host(void **state)
{
    (void)state;
    const char *names[] = {"cuda", "hip"};
    int tried = 0;
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(plugin_file(names[i]), RTLD_NOW | RTLD_LOCAL);
        if (!h)
            continue;
        dray_plugin_negotiate_fn neg = (dray_plugin_negotiate_fn)dlsym(h, DRAY_PLUGIN_SYMBOL);
        const struct dray_ops *ops = NULL;
        uint32_t v = 0; /* below DRAY_ABI_VERSION_MIN */
        char err[256] = "";
        assert_int_equal(neg(&v, &test_host, &ops, err, sizeof(err)), DRAY_EINCOMPAT);
        assert_non_null(strstr(err, "ABI"));
        v = DRAY_ABI_VERSION + 7; /* a newer host: the plugin answers with its own */
        assert_int_equal(neg(&v, &test_host, &ops, err, sizeof(err)), 0);
        assert_int_equal(v, 4u); /* the version the GPU plugins implement (no prepared layouts) */
        dlclose(h);
        tried++;
    }
    if (!tried)
        skip();
}

/* No device: 0 devices, rc 0, the reason logged (the registry keeps it). */
static void check_reports_no_device(const char *name, const char *reason)
{
    struct loaded l = load(name);
    if (!l.handle)
        skip();
    uint32_t n = 99;
    n_logs = 0;
    last_log[0] = '\0';
    assert_int_equal(l.ops->device_count(&n), 0);
    if (n > 0) {
        print_message("skip: %s has %u devices here\n", name, n);
        dlclose(l.handle);
        skip();
    }
    assert_int_equal(n, 0);
    assert_int_equal(n_logs, 1);
    assert_string_equal(last_log, reason);

    struct dray_device_props props;
    assert_int_equal(l.ops->device_props(0, &props), DRAY_ENODEV);

    struct dray_ctx *ctx = (struct dray_ctx *)&n; /* must be reset to NULL */
    struct dray_open_options opt = {.size = sizeof(opt), .reference = 1};
    char err[256] = "";
    assert_int_equal(l.ops->open(0, &opt, &ctx, err, sizeof(err)), DRAY_ENODEV);
    assert_null(ctx);
    assert_non_null(strstr(err, reason));
    assert_int_equal(l.ops->open(0, NULL, NULL, err, sizeof(err)), DRAY_EINVAL);
    assert_int_equal(l.ops->device_count(NULL), DRAY_EINVAL);
    dlclose(l.handle);
}

static void test_gpu_cuda_reports_no_driver_plainly(void **state)
{
    (void)state;
    check_reports_no_device("cuda", "no CUDA driver (cudaErrorInsufficientDriver)");
}

static void test_gpu_hip_reports_no_device_plainly(void **state)
{
    (void)state;
    check_reports_no_device("hip", "no ROCm device (hipErrorNoDevice)");
}

/* cpu, cuda and hip in one process: each negotiates and keeps its own table
 * (a clash of any global symbol would bind one plugin's calls to another). */
static void test_gpu_plugins_load_side_by_side_with_cpu(void **state)
{
    (void)state;
    const char *names[] = {"cpu", "cuda", "hip"};
    struct loaded l[3];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        l[i] = load(names[i]);
        n += l[i].handle != NULL;
    }
    if (n < 2)
        skip();
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (l[i].ops && l[j].ops) {
                assert_ptr_not_equal(l[i].ops, l[j].ops);
                assert_ptr_not_equal(l[i].ops->matmul, l[j].ops->matmul);
                assert_string_not_equal(l[i].ops->name, l[j].ops->name);
            }
    /* after all are loaded, each still answers as itself */
    for (int i = 0; i < 3; i++) {
        if (!l[i].ops)
            continue;
        uint32_t c = 0;
        assert_int_equal(l[i].ops->device_count(&c), 0);
        if (i == 0)
            assert_true(c >= 1); /* the CPU is always there */
    }
    for (int i = 2; i >= 0; i--)
        if (l[i].handle)
            dlclose(l[i].handle);
}

/* ------------------------------------------------ packed weight layout */

/* Every format: codes, d and m back to back, device bytes = host bytes. */
static void test_gpu_packed_layout_is_the_host_arrays_back_to_back(void **state)
{
    (void)state;
    static const unsigned char codes[1];
    static const float dm[1];
    for (uint32_t bit = 0; bit < 12; bit++) {
        struct dray_wformat f = dray_util_wformat_of_bit(bit);
        const uint32_t n_out = 70, k = 640, G = k / 32;
        struct dray_weight_desc d = {.size = sizeof(d), .format = f, .n_out = n_out, .k = k,
                                     .uses = DRAY_WUSE_MATMUL | DRAY_WUSE_EMBED, .codes = codes, .d = dm,
                                     .m = f.has_min ? dm : NULL};
        struct gpu_wlayout l;
        char why[256] = "";
        assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), 0);
        const uint64_t B = f.bits == 4 ? 16 : f.bits == 5 ? 20 : 32, S = f.scale == DRAY_WSCALE_F16 ? 2 : 4;
        assert_int_equal(l.group_bytes, B);
        assert_int_equal(l.scale_bytes, S);
        assert_int_equal(l.n_groups, (uint64_t)n_out * G);
        assert_int_equal(l.n_scales, (uint64_t)n_out * G);
        assert_int_equal(l.codes_bytes, (uint64_t)n_out * k * f.bits / 8); /* 16, 20, 32 bytes a group */
        assert_int_equal(l.sub_bytes, 0);
        assert_int_equal(l.d_off, l.codes_bytes);
        assert_int_equal(l.d_bytes, (uint64_t)n_out * G * S);
        assert_int_equal(l.m_off, l.d_off + l.d_bytes);
        assert_int_equal(l.m_bytes, f.has_min ? l.d_bytes : 0);
        assert_int_equal(l.total, (uint64_t)n_out * G * (B + S * (f.has_min ? 2 : 1)));
        /* every section starts aligned for the kernels' loads */
        assert_int_equal(l.d_off % 4, 0);
        assert_int_equal(l.m_off % S, 0);
    }
}

/* Random valid sub-scales of a two-level format, n_out x k: (s, n) 0..63, or
 * any int8 (6 bits). */
static uint8_t *k_subs(struct dray_wformat f, uint32_t n_out, uint32_t k)
{
    const size_t n = (size_t)n_out * dray_util_wformat_sub_bytes(f, k);
    uint8_t *sub = malloc(n);
    for (size_t i = 0; i < n; i++)
        sub[i] = (uint8_t)(f.bits == 6 ? dray_test_rand() : dray_test_rand() % 64);
    return sub;
}

/* The two-level formats hold GGUF's bytes per 256 weights on the device: Q4_K
 * 144, Q5_K 176, Q6_K 210 (codes | 12 or 16 sub bytes | D | M), sections
 * aligned for the kernels' loads. */
static void test_gpu_packed_two_level_layout_is_ggufs_size(void **state)
{
    (void)state;
    static const unsigned char codes[1];
    static const uint16_t dm[1];
    static const uint64_t gguf[3] = {144, 176, 210};
    for (uint32_t bit = 12; bit < 15; bit++) {
        const struct dray_wformat f = dray_util_wformat_of_bit(bit);
        const uint32_t n_out = 70, k = 768, S = k / 256;
        uint8_t *sub = k_subs(f, n_out, k);
        struct dray_weight_desc d = {.size = sizeof(d), .format = f, .n_out = n_out, .k = k,
                                     .uses = DRAY_WUSE_MATMUL | DRAY_WUSE_EMBED, .codes = codes, .d = dm,
                                     .m = f.has_min ? dm : NULL, .sub = sub};
        struct gpu_wlayout l;
        char why[256] = "";
        if (gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K, &l, why, sizeof(why)))
            fail_msg("bit %u: %s", bit, why);
        const uint64_t B = f.bits == 4 ? 16 : f.bits == 5 ? 20 : 24, subrow = f.bits == 6 ? 16 : 12;
        assert_int_equal(l.group_bytes, B);
        assert_int_equal(l.scale_bytes, 2);
        assert_int_equal(l.n_groups, (uint64_t)n_out * k / 32);
        assert_int_equal(l.n_scales, (uint64_t)n_out * S);
        assert_int_equal(l.codes_bytes, (uint64_t)n_out * k * f.bits / 8);
        assert_int_equal(l.sub_off, l.codes_bytes);
        assert_int_equal(l.sub_bytes, (uint64_t)n_out * S * subrow);
        assert_int_equal(l.d_off, l.sub_off + l.sub_bytes);
        assert_int_equal(l.d_bytes, (uint64_t)n_out * S * 2);
        assert_int_equal(l.m_off, l.d_off + l.d_bytes);
        assert_int_equal(l.m_bytes, f.has_min ? l.d_bytes : 0);
        assert_int_equal(l.total, (uint64_t)n_out * S * gguf[bit - 12]);
        assert_int_equal(l.sub_off % 4, 0); /* 6-bit groups load as 8-byte words */
        assert_int_equal(l.codes_bytes % 8, 0);
        assert_int_equal(l.d_off % 4, 0);
        assert_int_equal(l.m_off % 2, 0);
        free(sub);
    }
}

/* The device's sub section decodes (gk_kscale_get, the kernels' decoder) to
 * the host's sub exactly: every 6-bit (s, n) of 4 and 5 bits through GGUF's
 * 12-byte packing, the 6-bit format's int8 as given. */
static void test_gpu_packed_sub_scales_round_trip(void **state)
{
    (void)state;
    static const unsigned char codes[1];
    static const uint16_t dm[1];
    for (uint32_t bit = 12; bit < 15; bit++) {
        const struct dray_wformat f = dray_util_wformat_of_bit(bit);
        const uint32_t n_out = 9, k = 1024, G = k / 32;
        uint8_t *sub = k_subs(f, n_out, k);
        sub[0] = f.bits == 6 ? 0x80 : 63, sub[1] = 0; /* the extremes */
        struct dray_weight_desc d = {.size = sizeof(d), .format = f, .n_out = n_out, .k = k,
                                     .uses = DRAY_WUSE_MATMUL, .codes = codes, .d = dm,
                                     .m = f.has_min ? dm : NULL, .sub = sub};
        struct gpu_wlayout l;
        char why[256] = "";
        assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_K, &l, why, sizeof(why)), 0);
        uint8_t *dev = malloc((size_t)l.sub_bytes);
        gpu_wlayout_sub(&d, &l, dev);
        if (f.bits == 6) {
            assert_memory_equal(dev, sub, (size_t)n_out * k / 16);
        } else {
            for (uint64_t gi = 0; gi < (uint64_t)n_out * G; gi++) { /* group gi = o*G + g */
                uint32_t s, n;
                gk_kscale_get(dev + gi / 8 * GK_KSCALE_BYTES, (uint32_t)(gi % 8), &s, &n);
                if (s != sub[2 * gi] || n != sub[2 * gi + 1])
                    fail_msg("bit %u group %llu: (%u, %u) for (%u, %u)", bit, (unsigned long long)gi, s, n,
                             sub[2 * gi], sub[2 * gi + 1]);
            }
        }
        free(dev);
        free(sub);
    }
}

/* A worked super-block in GGUF's packing (llama.cpp's get_scale_min_k4): the
 * low six bits of bytes 0..7 are s0..s3, n0..n3; bytes 8..11 hold the low
 * nibbles of s4..s7 and n4..n7, the top two bits of bytes 0..7 their high bits. */
static void test_gpu_packed_sub_scales_are_ggufs_packing(void **state)
{
    (void)state;
    const uint8_t sn[16] = {1, 2, 3, 4, 5, 6, 7, 8, 0x3f, 0x10, 0x21, 0x32, 0x03, 0x2c, 0x15, 0x00};
    const uint8_t want[12] = {0xc1, 0x83, 0x05, 0x47, 0x42, 0xc4, 0x86, 0x08, 0x0f, 0x21, 0xc3, 0x05};
    uint8_t q[12];
    gk_kscale_pack(sn, q);
    assert_memory_equal(q, want, 12);
}

/* weight_create's argument rules, checked before any device is touched. */
static void test_gpu_packed_plan_refuses_bad_descriptors(void **state)
{
    (void)state;
    static const unsigned char codes[1];
    static const float dm[1];
    const struct dray_weight_desc ok = {.size = sizeof(ok), .format = {4, DRAY_WSCALE_F16, 1, 0}, .n_out = 3,
                                        .k = 64, .uses = DRAY_WUSE_MATMUL, .codes = codes, .d = dm, .m = dm};
    struct gpu_wlayout l;
    char why[256];
    struct dray_weight_desc d = ok;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), 0);
    assert_int_equal(l.total, 3 * 2 * (16 + 2 + 2));
    assert_int_equal(gpu_wlayout_plan(NULL, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.size = 8; /* older than the struct's m */
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.format.bits = 6;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.format.super = 2;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok; /* a format not declared: ENOTSUP, naming it */
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL & ~DRAY_UTIL_WF(4, DRAY_WSCALE_F16, 1), &l, why,
                                      sizeof(why)), DRAY_ENOTSUP);
    assert_non_null(strstr(why, "q4 f16 +min"));
    d = ok, d.k = 48;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.k = 65536 + 32;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.n_out = 0;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.uses = 0;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.uses = 4;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.m = NULL; /* the format has a min */
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.format.has_min = 0; /* m given without one */
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.codes = NULL;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_EINVAL);
    /* the largest shape the contract allows still fits */
    d = ok, d.format = (struct dray_wformat){8, DRAY_WSCALE_F32, 1, 0}, d.n_out = UINT32_MAX, d.k = 65536;
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), 0);
    assert_int_equal(l.total, (uint64_t)UINT32_MAX * 2048 * (32 + 8));
}

/* The two-level formats' own rules: k a multiple of 256, sub given (and the
 * descriptor long enough to hold it), 4- and 5-bit sub-scales 0..63, f16
 * scales, the three shapes only, and declared (version 4). */
static void test_gpu_packed_plan_refuses_bad_two_level_descriptors(void **state)
{
    (void)state;
    static const unsigned char codes[1];
    static const uint16_t dm[1];
    const uint32_t n_out = 3, k = 512;
    uint8_t *sub = k_subs(dray_util_wformat_of_bit(12), n_out, k + 256); /* room for a longer k */
    const uint32_t all = DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K;
    const struct dray_weight_desc ok = {.size = sizeof(ok), .format = {4, DRAY_WSCALE_F16, 1, 1}, .n_out = n_out,
                                        .k = k, .uses = DRAY_WUSE_MATMUL, .codes = codes, .d = dm, .m = dm,
                                        .sub = sub};
    struct gpu_wlayout l;
    char why[256];
    struct dray_weight_desc d = ok;
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), 0);
    assert_int_equal(l.total, n_out * 2 * 144);
    sub[n_out * k / 16 - 1] = 64; /* the last sub-scale of the last row: 7 bits */
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    assert_non_null(strstr(why, "is 64"));
    d.format.bits = 5;
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d.format = (struct dray_wformat){6, DRAY_WSCALE_F16, 0, 1}, d.m = NULL; /* int8: any value */
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), 0);
    assert_int_equal(l.total, n_out * 2 * 210);
    sub[n_out * k / 16 - 1] = 0;
    d = ok, d.k = 288; /* a multiple of 32, not of 256 */
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.sub = NULL;
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.size = (uint32_t)offsetof(struct dray_weight_desc, sub); /* a version-3 descriptor */
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.format.scale = DRAY_WSCALE_F32;
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.format.bits = 8;
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.format.has_min = 0, d.m = NULL; /* 4 bits two-level need a min */
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok, d.format = (struct dray_wformat){6, DRAY_WSCALE_F16, 1, 1}; /* 6 bits have none */
    assert_int_equal(gpu_wlayout_plan(&d, all, &l, why, sizeof(why)), DRAY_EINVAL);
    d = ok; /* a plugin of version 3's formats only: ENOTSUP, naming it */
    assert_int_equal(gpu_wlayout_plan(&d, DRAY_UTIL_WF_ALL, &l, why, sizeof(why)), DRAY_ENOTSUP);
    assert_non_null(strstr(why, "q4 two-level +min"));
    free(sub);
}

/* ------------------------------------------------ exported symbol check */

/* Defined global/weak symbols in the .dynsym of an ELF64 file, as `nm -D
 * --defined-only` lists them. Returns the count; the first name goes to first. */
static int dynsym_defined(const char *path, char *first, size_t firstlen)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    const unsigned char *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(m != MAP_FAILED);
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m;
    assert_memory_equal(eh->e_ident, ELFMAG, SELFMAG);
    assert_int_equal(eh->e_ident[EI_CLASS], ELFCLASS64);
    assert_true(eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) <= (uint64_t)st.st_size);
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(m + eh->e_shoff);
    int count = -1;
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM)
            continue;
        assert_true(sh[i].sh_link < eh->e_shnum);
        const Elf64_Shdr *strs = &sh[sh[i].sh_link];
        const Elf64_Sym *sym = (const Elf64_Sym *)(m + sh[i].sh_offset);
        const char *names = (const char *)(m + strs->sh_offset);
        size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        count = 0;
        for (size_t k = 0; k < n; k++) {
            int bind = ELF64_ST_BIND(sym[k].st_info);
            if (sym[k].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK))
                continue;
            if (count++ == 0)
                snprintf(first, firstlen, "%s", names + sym[k].st_name);
            else
                print_message("extra exported symbol: %s\n", names + sym[k].st_name);
        }
    }
    munmap((void *)m, (size_t)st.st_size);
    close(fd);
    return count;
}

static void check_exports_one_symbol(const char *name)
{
    const char *path = plugin_file(name);
    if (access(path, R_OK) != 0)
        skip();
    char first[256] = "";
    assert_int_equal(dynsym_defined(path, first, sizeof(first)), 1);
    assert_string_equal(first, DRAY_PLUGIN_SYMBOL);
    /* and the dynamic linker agrees: internal names do not resolve */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        skip();
    const char *hidden[] = {"dray_gk_matmul", "dray_gk_attention", "dray_gpu_embed", "dray_gpu_host",
                            "dray_gpu_fail", "dray_gk_matmul_scratch", "dray_gk_pmatmul",
                            "dray_gpu_weight_create"};
    for (size_t i = 0; i < sizeof(hidden) / sizeof(hidden[0]); i++) {
        if (dlsym(h, hidden[i]))
            fail_msg("%s exports %s", path, hidden[i]);
    }
    /* the statically linked CUDA runtime stays inside the CUDA plugin */
    if (strcmp(name, "cuda") == 0 && (dlsym(h, "cudaMalloc") || dlsym(h, "cudaGetDeviceCount")))
        fail_msg("%s exports CUDA runtime symbols", path);
    dlclose(h);
}

static void test_gpu_cuda_exports_only_negotiate(void **state)
{
    (void)state;
    check_exports_one_symbol("cuda");
}

static void test_gpu_hip_exports_only_negotiate(void **state)
{
    (void)state;
    check_exports_one_symbol("hip");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_cuda_negotiates_quickly_and_silently),
        cmocka_unit_test(test_gpu_hip_negotiates_quickly_and_silently),
        cmocka_unit_test(test_gpu_negotiate_refuses_an_older_host),
        cmocka_unit_test(test_gpu_cuda_reports_no_driver_plainly),
        cmocka_unit_test(test_gpu_hip_reports_no_device_plainly),
        cmocka_unit_test(test_gpu_plugins_load_side_by_side_with_cpu),
        cmocka_unit_test(test_gpu_packed_layout_is_the_host_arrays_back_to_back),
        cmocka_unit_test(test_gpu_packed_plan_refuses_bad_descriptors),
        cmocka_unit_test(test_gpu_packed_two_level_layout_is_ggufs_size),
        cmocka_unit_test(test_gpu_packed_sub_scales_round_trip),
        cmocka_unit_test(test_gpu_packed_sub_scales_are_ggufs_packing),
        cmocka_unit_test(test_gpu_packed_plan_refuses_bad_two_level_descriptors),
        cmocka_unit_test(test_gpu_cuda_exports_only_negotiate),
        cmocka_unit_test(test_gpu_hip_exports_only_negotiate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
