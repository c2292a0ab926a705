/* The Vulkan plugin against the CPU plugin's reference kernels: every op on a
 * few random shapes, under the tolerances of backend.h, with the Khronos
 * validation layer on (DRAY_VK_VALIDATION=1: any validation message fails the
 * op that caused it). Both plugins are dlopen'ed from $DRAY_PLUGIN_PATH.
 * Exits 77 (skipped) when the Vulkan plugin or a Vulkan device is absent.
 * Each op's Vulkan time (op + synchronize) is printed for the report. */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "testutil.h"

struct side {
    void *handle;
    const struct dray_ops *ops;
    struct dray_ctx *ctx;
};
static struct side cpu, vk;

/* A buffer on both sides with the same contents. */
struct pair {
    struct dray_buf *c, *v;
    size_t n;
};

/* ------------------------------------------------------------ plumbing */

/* dlopen libdray-<name>.so from DRAY_PLUGIN_PATH and negotiate its table. */
static int negotiate(struct side *s, const char *name, char *why, size_t whylen)
{
    const char *path = getenv("DRAY_PLUGIN_PATH");
    char buf[4096], err[512] = "";
    uint32_t v = DRAY_ABI_VERSION;
    snprintf(buf, sizeof(buf), "%s", path ? path : "");
    for (char *dir = strtok(buf, ":"); dir && !s->handle; dir = strtok(NULL, ":")) {
        char so[4200];
        snprintf(so, sizeof(so), "%s/libdray-%s.so", dir, name);
        s->handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    }
    if (!s->handle) {
        snprintf(why, whylen, "libdray-%s.so not found on DRAY_PLUGIN_PATH", name);
        return -1;
    }
    dray_plugin_negotiate_fn neg = (dray_plugin_negotiate_fn)dlsym(s->handle, DRAY_PLUGIN_SYMBOL);
    if (!neg || neg(&v, NULL, &s->ops, err, sizeof(err)) != 0) {
        snprintf(why, whylen, "%s: negotiate failed: %s", name, err);
        return -1;
    }
    return 0;
}

static int load(struct side *s, const char *name, uint32_t reference, char *why, size_t whylen)
{
    char err[512] = "";
    uint32_t n = 0;
    if (negotiate(s, name, why, whylen))
        return -1;
    if (s->ops->device_count(&n) != 0 || n == 0) {
        snprintf(why, whylen, "%s: no device", name);
        return -1;
    }
    struct dray_open_options o = {.size = sizeof(o), .n_threads = 2, .reference = reference};
    if (s->ops->open(0, &o, &s->ctx, err, sizeof(err)) != 0) {
        snprintf(why, whylen, "%s: open failed: %s", name, err);
        return -1;
    }
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void expect_ok(struct side *s, int rc)
{
    if (rc != 0)
        fail_msg("%s: rc %d: %s", s->ops->name, rc, s->ops->last_error(s->ctx));
}

static struct pair pair_up(const void *data, size_t n)
{
    struct pair p = {NULL, NULL, n};
    expect_ok(&cpu, cpu.ops->alloc(cpu.ctx, n, &p.c));
    expect_ok(&vk, vk.ops->alloc(vk.ctx, n, &p.v));
    expect_ok(&cpu, cpu.ops->upload(cpu.ctx, (struct dray_view){p.c, 0}, data, n));
    expect_ok(&vk, vk.ops->upload(vk.ctx, (struct dray_view){p.v, 0}, data, n));
    return p;
}

/* n random floats in [lo, hi) on both sides. */
static struct pair pair_rand(size_t n, float lo, float hi)
{
    float *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = dray_test_randf(lo, hi);
    struct pair p = pair_up(h, n * 4);
    free(h);
    return p;
}

static void pair_free(struct pair *p)
{
    cpu.ops->free(cpu.ctx, p->c);
    vk.ops->free(vk.ctx, p->v);
}

static struct dray_view VC(struct pair p, size_t off)
{
    return (struct dray_view){p.c, off};
}
static struct dray_view VV(struct pair p, size_t off)
{
    return (struct dray_view){p.v, off};
}

static void pair_down(struct pair p, void **c, void **v)
{
    *c = malloc(p.n);
    *v = malloc(p.n);
    expect_ok(&cpu, cpu.ops->download(cpu.ctx, *c, VC(p, 0), p.n));
    expect_ok(&vk, vk.ops->download(vk.ctx, *v, VV(p, 0), p.n));
}

/* Every float of p within atol + rtol*|ref|; returns max |ref|. */
static float compare_f32(struct pair p, double atol, double rtol, const char *what)
{
    float *c, *v;
    double worst = 0, amax = 0;
    size_t wi = 0;
    pair_down(p, (void **)&c, (void **)&v);
    for (size_t i = 0; i < p.n / 4; i++) {
        double d = fabs((double)c[i] - v[i]) - (atol + rtol * fabs(c[i]));
        amax = fmax(amax, fabs(c[i]));
        if (d > worst || isnan(v[i]) != isnan(c[i])) {
            worst = d > worst ? d : 1;
            wi = i;
        }
    }
    if (worst > 0)
        fail_msg("%s: element %zu: cpu %.9g vulkan %.9g (atol %g rtol %g)", what, wi, c[wi], v[wi],
                 atol, rtol);
    free(c);
    free(v);
    return (float)amax;
}

/* Runs an op on both sides; prints the Vulkan time. */
#define BOTH(op, what, ca, va)                                                                     \
    do {                                                                                           \
        expect_ok(&cpu, cpu.ops->op(cpu.ctx, &(ca)));                                              \
        expect_ok(&vk, vk.ops->synchronize(vk.ctx));                                               \
        double t0_ = now_ms();                                                                     \
        expect_ok(&vk, vk.ops->op(vk.ctx, &(va)));                                                 \
        expect_ok(&vk, vk.ops->synchronize(vk.ctx));                                               \
        printf("vulkan %-10s %-40s %9.2f ms\n", #op, what, now_ms() - t0_);                       \
    } while (0)

/* ------------------------------------------------------------- cases */

static void test_vulkan_add_matches_cpu_and_aliases(void **state)
{
    (void)state;
    size_t n = 100003;
    struct pair a = pair_rand(n, -10, 10), b = pair_rand(n, -10, 10), o = pair_rand(n, 0, 1);
    struct dray_add_args ca = {VC(a, 0), VC(b, 0), VC(o, 0), n};
    struct dray_add_args va = {VV(a, 0), VV(b, 0), VV(o, 0), n};
    BOTH(add, "n=100003", ca, va);
    compare_f32(o, 0, 0, "add");
    ca.out = ca.a, va.out = va.a; /* in place */
    BOTH(add, "n=100003 out=a", ca, va);
    compare_f32(a, 0, 0, "add in place");
    pair_free(&a), pair_free(&b), pair_free(&o);
}

static void test_vulkan_gated_act_matches_cpu(void **state)
{
    (void)state;
    uint32_t n_tok = 5, n = 1000;
    struct pair g = pair_rand(n_tok * 1003, -6, 6), u = pair_rand(n_tok * 1010, -3, 3);
    struct pair o = pair_rand(n_tok * 1001, 0, 1);
    for (uint32_t act = 0; act < 2; act++) {
        struct dray_gated_act_args ca = {VC(g, 0), VC(u, 0), VC(o, 0), n_tok, n, 1003, 1010, 1001, act};
        struct dray_gated_act_args va = {VV(g, 0), VV(u, 0), VV(o, 0), n_tok, n, 1003, 1010, 1001, act};
        BOTH(gated_act, act ? "silu 5x1000 strided" : "gelu_tanh 5x1000 strided", ca, va);
        compare_f32(o, 1e-6, 1e-5, "gated_act");
    }
    pair_free(&g), pair_free(&u), pair_free(&o);
}

static void test_vulkan_rmsnorm_matches_cpu_per_head_and_in_place(void **state)
{
    (void)state;
    struct pair x = pair_rand(3 * 300, -4, 4), w = pair_rand(1152, 0.5f, 1.5f);
    struct pair o = pair_rand(3 * 260, 0, 1);
    struct dray_rmsnorm_args ca = {VC(x, 0), VC(w, 0), VC(o, 0), 3, 4, 64, 300, 260, 1e-6f};
    struct dray_rmsnorm_args va = {VV(x, 0), VV(w, 0), VV(o, 0), 3, 4, 64, 300, 260, 1e-6f};
    BOTH(rmsnorm, "3 tok x 4 heads x 64", ca, va);
    compare_f32(o, 1e-7, 1e-5, "rmsnorm per head");
    struct pair y = pair_rand(2 * 1152, -100, 100);
    struct dray_rmsnorm_args cb = {VC(y, 0), VC(w, 0), VC(y, 0), 2, 1, 1152, 1152, 1152, 1e-6f};
    struct dray_rmsnorm_args vb = {VV(y, 0), VV(w, 0), VV(y, 0), 2, 1, 1152, 1152, 1152, 1e-6f};
    BOTH(rmsnorm, "2 x 1152 in place", cb, vb);
    compare_f32(y, 1e-7, 1e-5, "rmsnorm in place");
    pair_free(&x), pair_free(&w), pair_free(&o), pair_free(&y);
}

static void test_vulkan_rope_matches_cpu_at_long_positions(void **state)
{
    (void)state;
    int32_t pos[6] = {0, 1, 131071, 99999, 4097, 77};
    struct pair p = pair_up(pos, sizeof(pos));
    struct { uint32_t n_rot; float base, fs; } cfg[2] = {{32, 10000.0f, 1.0f}, {64, 1e6f, 0.125f}};
    for (int c = 0; c < 2; c++) {
        struct pair x = pair_rand(6 * 200, -2, 2);
        struct dray_rope_args ca = {VC(x, 0), VC(p, 0), 6, 3, 64, cfg[c].n_rot, 200, cfg[c].base, cfg[c].fs,
                                    {NULL, 0}, 0.0f};
        struct dray_rope_args va = {VV(x, 0), VV(p, 0), 6, 3, 64, cfg[c].n_rot, 200, cfg[c].base, cfg[c].fs,
                                    {NULL, 0}, 0.0f};
        BOTH(rope, c ? "6 tok x 3 x 64, n_rot 64" : "6 tok x 3 x 64, n_rot 32", ca, va);
        compare_f32(x, 1e-4, 0, "rope");
        pair_free(&x);
    }
    pair_free(&p);
}

/* v4: frequency factors (Llama 3-like, then the same buffer rewritten with
 * LongRoPE-like ones, by an upload and then by a kernel: the kept table must
 * follow the values; the same view unwritten reuses it) and attn_factor, full
 * and partial n_rot, against the CPU plugin, whose kernels test_cpu_ops holds
 * to the formula. */
static void test_vulkan_rope_freq_factors_and_attn_factor(void **state)
{
    (void)state;
    int32_t pos[6] = {0, 3, 131071, 30000, 4097, 77};
    float ff[32];
    for (int i = 0; i < 32; i++)
        ff[i] = i < 8 ? 1.0f : i > 20 ? 8.0f : 1.0f + 7.0f * (float)(i - 8) / 12.0f;
    struct pair p = pair_up(pos, sizeof(pos)), f = pair_up(ff, sizeof(ff));
    struct { uint32_t n_rot; float af; int rewrite, use_ff; } cfg[] = {
        {64, 1.2f, 0, 1}, {40, 0.0f, 0, 1}, {64, 1.2f, 1, 1}, {64, 1.37f, 0, 0}, {64, 1.2f, 0, 1},
        {64, 1.2f, 2, 1}, {64, 1.2f, 0, 1}};
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        if (cfg[c].rewrite == 2) { /* ff = ff + ff by a kernel on each side */
            struct dray_add_args cd = {VC(f, 0), VC(f, 0), VC(f, 0), 32}, vd = {VV(f, 0), VV(f, 0), VV(f, 0), 32};
            BOTH(add, "ff doubled", cd, vd);
        }
        if (cfg[c].rewrite == 1) {
            for (int i = 0; i < 32; i++)
                ff[i] = 1.0f + 0.04f * (float)(i * i);
            expect_ok(&cpu, cpu.ops->upload(cpu.ctx, (struct dray_view){f.c, 0}, ff, sizeof(ff)));
            expect_ok(&vk, vk.ops->upload(vk.ctx, (struct dray_view){f.v, 0}, ff, sizeof(ff)));
        }
        struct pair x = pair_rand(6 * 200, -2, 2);
        struct dray_view fc = cfg[c].use_ff ? VC(f, 0) : (struct dray_view){NULL, 0};
        struct dray_view fv = cfg[c].use_ff ? VV(f, 0) : (struct dray_view){NULL, 0};
        struct dray_rope_args ca = {VC(x, 0), VC(p, 0), 6, 3, 64, cfg[c].n_rot, 200, 500000.0f, 1.0f, fc, cfg[c].af};
        struct dray_rope_args va = {VV(x, 0), VV(p, 0), 6, 3, 64, cfg[c].n_rot, 200, 500000.0f, 1.0f, fv, cfg[c].af};
        BOTH(rope, "6 tok x 3 x 64, v4 factors", ca, va);
        compare_f32(x, 1e-4 * (cfg[c].af > 1.0f ? cfg[c].af : 1.0), 0, "rope v4");
        pair_free(&x);
    }
    pair_free(&p), pair_free(&f);
}

static void test_vulkan_embed_matches_cpu_i8_and_f32(void **state)
{
    (void)state;
    uint32_t rows = 50, dim = 300;
    int8_t *t8 = malloc(rows * dim);
    for (size_t i = 0; i < rows * dim; i++)
        t8[i] = (int8_t)(dray_test_rand() % 255 - 127);
    int32_t ids[7] = {3, 49, 0, 3, 17, 48, 1};
    struct pair tab8 = pair_up(t8, rows * dim), rs = pair_rand(rows, 0.001f, 0.1f);
    struct pair tabf = pair_rand(rows * dim, -1, 1), id = pair_up(ids, sizeof(ids));
    struct pair o = pair_rand(7 * dim, 0, 1);
    struct dray_embed_args ca = {VC(id, 0), VC(tab8, 0), VC(rs, 0), VC(o, 0), DRAY_I8, 7, dim, rows, sqrtf(300), NULL};
    struct dray_embed_args va = {VV(id, 0), VV(tab8, 0), VV(rs, 0), VV(o, 0), DRAY_I8, 7, dim, rows, sqrtf(300), NULL};
    BOTH(embed, "i8 7 tok x 300", ca, va);
    compare_f32(o, 0, 1e-6, "embed i8");
    ca.table = VC(tabf, 0), va.table = VV(tabf, 0), ca.dtype = va.dtype = DRAY_F32;
    BOTH(embed, "f32 7 tok x 300", ca, va);
    compare_f32(o, 0, 0, "embed f32");
    int32_t bad = 50;
    expect_ok(&vk, vk.ops->upload(vk.ctx, VV(id, 8), &bad, 4));
    assert_int_equal(vk.ops->embed(vk.ctx, &va), DRAY_EINVAL);
    assert_non_null(strstr(vk.ops->last_error(vk.ctx), "ids[2]"));
    free(t8);
    pair_free(&tab8), pair_free(&rs), pair_free(&tabf), pair_free(&id), pair_free(&o);
}

/* One int8 matmul case on both sides; outliers get zero weight columns. */
static void matmul_case(uint32_t n_tok, uint32_t n_out, uint32_t k, uint32_t n_outlier,
                        uint32_t accumulate, const char *what)
{
    int32_t idx[4] = {1, 7, 50, 99};
    int8_t *w = malloc((size_t)n_out * k);
    for (size_t i = 0; i < (size_t)n_out * k; i++)
        w[i] = (int8_t)(dray_test_rand() % 255 - 127);
    for (uint32_t o = 0; o < n_out; o++)
        for (uint32_t j = 0; j < n_outlier; j++)
            w[(size_t)o * k + idx[j]] = 0;
    struct pair x = pair_rand((size_t)n_tok * (k + 3), -1, 1), ws = pair_rand(n_out, 0.001f, 0.02f);
    struct pair wb = pair_up(w, (size_t)n_out * k), oi = pair_up(idx, sizeof(idx));
    struct pair ow = pair_rand((size_t)n_out * 4, -1, 1), o = pair_rand((size_t)n_tok * (n_out + 1), -1, 1);
    if (n_outlier) { /* make the outlier channels large, as they are in real models */
        float big = 40.0f;
        for (uint32_t t = 0; t < n_tok; t++) {
            expect_ok(&cpu, cpu.ops->upload(cpu.ctx, VC(x, ((size_t)t * (k + 3) + 7) * 4), &big, 4));
            expect_ok(&vk, vk.ops->upload(vk.ctx, VV(x, ((size_t)t * (k + 3) + 7) * 4), &big, 4));
        }
    }
    struct dray_matmul_args ca = {VC(x, 0), VC(wb, 0), VC(ws, 0), VC(o, 0), VC(oi, 0), VC(ow, 0),
                                  n_tok, n_out, k, k + 3, n_out + 1, n_outlier, accumulate, DRAY_I8, NULL, 0};
    struct dray_matmul_args va = {VV(x, 0), VV(wb, 0), VV(ws, 0), VV(o, 0), VV(oi, 0), VV(ow, 0),
                                  n_tok, n_out, k, k + 3, n_out + 1, n_outlier, accumulate, DRAY_I8, NULL, 0};
    BOTH(matmul, what, ca, va);
    float *c, *v;
    pair_down(o, (void **)&c, (void **)&v);
    float amax = 0;
    for (size_t i = 0; i < o.n / 4; i++)
        amax = fmaxf(amax, fabsf(c[i]));
    free(c), free(v);
    compare_f32(o, 1e-4 * amax, 0, what);
    free(w);
    pair_free(&x), pair_free(&ws), pair_free(&wb), pair_free(&oi), pair_free(&ow), pair_free(&o);
}

static void test_vulkan_matmul_i8_matches_cpu(void **state)
{
    (void)state;
    matmul_case(1, 37, 130, 0, 0, "i8 1x37x130 (k%4 != 0)");
    matmul_case(7, 65, 256, 0, 1, "i8 7x65x256 accumulate");
    matmul_case(5, 33, 640, 3, 0, "i8 5x33x640 3 outliers");
    matmul_case(64, 640, 640, 0, 0, "i8 64x640x640");
}

static void test_vulkan_matmul_f32_matches_cpu(void **state)
{
    (void)state;
    uint32_t n_tok = 3, n_out = 70, k = 333;
    struct pair x = pair_rand((size_t)n_tok * k, -1, 1), w = pair_rand((size_t)n_out * k, -1, 1);
    struct pair o = pair_rand((size_t)n_tok * n_out, -1, 1);
    struct dray_matmul_args ca = {.x = VC(x, 0), .w = VC(w, 0), .out = VC(o, 0), .n_tok = n_tok,
                                  .n_out = n_out, .k = k, .stride_x = k, .stride_out = n_out,
                                  .wdtype = DRAY_F32};
    struct dray_matmul_args va = ca;
    va.x = VV(x, 0), va.w = VV(w, 0), va.out = VV(o, 0);
    BOTH(matmul, "f32 3x70x333", ca, va);
    compare_f32(o, 1e-5 * k, 0, "matmul f32"); /* sum |x||w| <= k */
    pair_free(&x), pair_free(&w), pair_free(&o);
}

static void test_vulkan_kv_store_matches_cpu_i8_and_f16(void **state)
{
    (void)state;
    uint32_t nkv = 2, hd = 40, n_slots = 32, n_tok = 6;
    int32_t slots[6] = {5, 31, -1, 0, 17, 6};
    struct pair sl = pair_up(slots, sizeof(slots));
    struct pair k = pair_rand(n_tok * 90, -3, 3), v = pair_rand(n_tok * 85, -3, 3);
    for (uint32_t dt = 0; dt < 2; dt++) {
        uint32_t dtype = dt ? DRAY_F16 : DRAY_I8;
        size_t esz = dt ? 2 : 1, pb = (size_t)n_slots * nkv * hd * esz;
        struct pair pk = pair_rand(pb / 4, -1, 1), pv = pair_rand(pb / 4, -1, 1);
        struct pair ks = pair_rand(n_slots * nkv, 0, 1), vs = pair_rand(n_slots * nkv, 0, 1);
        struct dray_kv_pool cp = {VC(pk, 0), VC(pv, 0), VC(ks, 0), VC(vs, 0), dtype, nkv, hd, 4, n_slots};
        struct dray_kv_pool vp = {VV(pk, 0), VV(pv, 0), VV(ks, 0), VV(vs, 0), dtype, nkv, hd, 4, n_slots};
        struct dray_kv_store_args ca = {VC(k, 0), VC(v, 0), VC(sl, 0), &cp, n_tok, 90, 85};
        struct dray_kv_store_args va = {VV(k, 0), VV(v, 0), VV(sl, 0), &vp, n_tok, 90, 85};
        BOTH(kv_store, dt ? "f16 6 tok x 2 x 40" : "i8 6 tok x 2 x 40", ca, va);
        struct pair pools[2] = {pk, pv};
        for (int i = 0; i < 2; i++) {
            uint8_t *c, *g;
            pair_down(pools[i], (void **)&c, (void **)&g);
            size_t diff = 0;
            for (size_t b = 0; b < pb; b++)
                diff += c[b] != g[b];
            /* f16 exact; int8 may differ by one on ties only: none expected here */
            assert_int_equal(diff, 0);
            free(c), free(g);
        }
        if (!dt) {
            compare_f32(ks, 0, 1e-6, "k_scale");
            compare_f32(vs, 0, 1e-6, "v_scale");
        }
        pair_free(&pk), pair_free(&pv), pair_free(&ks), pair_free(&vs);
    }
    pair_free(&sl), pair_free(&k), pair_free(&v);
}

/* Random binary16 bits with magnitudes in [2^-5, 2^2). */
static uint16_t rand_half(void)
{
    return (uint16_t)((dray_test_rand() & 0x8000u) | ((10u + dray_test_rand() % 7u) << 10) |
                      (dray_test_rand() & 0x3ffu));
}

/* Three sequences (prefill, decode, chunked prefill) plus a padding row, GQA
 * 8/2; v4: soft-capped scores when softcap > 0 (louder queries then). */
static void attention_case_capped(uint32_t dtype, uint32_t window, float softcap)
{
    uint32_t nh = 8, nkv = 2, hd = 64, bs = 4, nblk = 40, n_slots = nblk * bs, n_tok = 10;
    int32_t seqs[12] = {0, 5, 5, 0, 5, 1, 37, 2, 6, 3, 20, 12};
    int32_t bt[17];
    for (int i = 0; i < 17; i++)
        bt[i] = (i * 7 + 3) % nblk; /* a permutation of physical blocks */
    if (window) { /* blocks the window never reaches may be holes */
        for (int b = 0; b < (37 - (int)window) / (int)bs; b++)
            bt[2 + b] = -1;
    }
    size_t esz = dtype == DRAY_I8 ? 1 : 2, pe = (size_t)n_slots * nkv * hd;
    void *kh = malloc(pe * esz), *vh = malloc(pe * esz);
    for (size_t i = 0; i < pe; i++) {
        if (dtype == DRAY_I8) {
            ((int8_t *)kh)[i] = (int8_t)(dray_test_rand() % 255 - 127);
            ((int8_t *)vh)[i] = (int8_t)(dray_test_rand() % 255 - 127);
        } else {
            ((uint16_t *)kh)[i] = rand_half();
            ((uint16_t *)vh)[i] = rand_half();
        }
    }
    struct pair pk = pair_up(kh, pe * esz), pv = pair_up(vh, pe * esz);
    struct pair ks = pair_rand(n_slots * nkv, 0.001f, 0.03f), vs = pair_rand(n_slots * nkv, 0.001f, 0.03f);
    struct pair sq = pair_up(seqs, sizeof(seqs)), bp = pair_up(bt, sizeof(bt));
    float q_amp = softcap > 0.0f ? 20.0f : 1.0f;
    struct pair q = pair_rand(n_tok * 520, -q_amp, q_amp), o = pair_rand(n_tok * 530, -1, 1);
    struct dray_kv_pool cp = {VC(pk, 0), VC(pv, 0), VC(ks, 0), VC(vs, 0), dtype, nkv, hd, bs, n_slots};
    struct dray_kv_pool vp = {VV(pk, 0), VV(pv, 0), VV(ks, 0), VV(vs, 0), dtype, nkv, hd, bs, n_slots};
    struct dray_attention_args ca = {VC(q, 0), VC(o, 0), VC(sq, 0), VC(bp, 0), &cp, n_tok, 3, nh, 37,
                                     520, 530, window, 0.125f, softcap};
    struct dray_attention_args va = {VV(q, 0), VV(o, 0), VV(sq, 0), VV(bp, 0), &vp, n_tok, 3, nh, 37,
                                     520, 530, window, 0.125f, softcap};
    char what[80];
    snprintf(what, sizeof(what), "%s 10 tok 8/2 heads x 64 window %u softcap %g",
             dtype == DRAY_I8 ? "i8" : "f16", window, (double)softcap);
    BOTH(attention, what, ca, va);
    /* max|v|: int8 127 * 0.03; f16 below 4 */
    compare_f32(o, dtype == DRAY_I8 ? 2e-3 * 127 * 0.03 : 1e-4 * 4, 0, what);
    free(kh), free(vh);
    pair_free(&pk), pair_free(&pv), pair_free(&ks), pair_free(&vs), pair_free(&sq), pair_free(&bp);
    pair_free(&q), pair_free(&o);
}

static void attention_case(uint32_t dtype, uint32_t window)
{
    attention_case_capped(dtype, window, 0.0f);
}

/* v4: Gemma 2's soft-capping, prefill and decode, GQA, with and without a window. */
static void test_vulkan_attention_softcap_matches_cpu(void **state)
{
    (void)state;
    attention_case_capped(DRAY_I8, 0, 1.5f);
    attention_case_capped(DRAY_F16, 0, 3.0f);
    attention_case_capped(DRAY_I8, 8, 2.0f);
    attention_case_capped(DRAY_F16, 8, 50.0f);
}

static void test_vulkan_attention_matches_cpu_mixed_batch_gqa_window(void **state)
{
    (void)state;
    attention_case(DRAY_I8, 0);
    attention_case(DRAY_F16, 0);
    attention_case(DRAY_I8, 8);
    attention_case(DRAY_F16, 8);
}

/* Gemma 3's int8 embedding/output table [262144][640] is 168 MB, more than
 * lavapipe's 128 MiB maxStorageBufferRange: embed and the logits matmul must
 * split it into windows. */
static void test_vulkan_table_larger_than_a_binding_embeds_and_multiplies(void **state)
{
    (void)state;
    uint32_t rows = 262144, dim = 640, n_tok = 2;
    size_t nb = (size_t)rows * dim;
    int8_t *t = malloc(nb);
    for (size_t i = 0; i < nb; i += 4) {
        uint32_t r = dray_test_rand();
        memcpy(t + i, &r, 4);
        for (int j = 0; j < 4; j++)
            if (t[i + j] == -128)
                t[i + j] = -127;
    }
    struct pair tab = pair_up(t, nb);
    free(t);
    struct pair rs = pair_rand(rows, 0.001f, 0.01f);
    int32_t ids[4] = {262143, 0, 209715, 131072};
    struct pair id = pair_up(ids, sizeof(ids)), e = pair_rand(4 * dim, 0, 1);
    struct dray_embed_args ca = {VC(id, 0), VC(tab, 0), VC(rs, 0), VC(e, 0), DRAY_I8, 4, dim, rows, 25.3f, NULL};
    struct dray_embed_args va = {VV(id, 0), VV(tab, 0), VV(rs, 0), VV(e, 0), DRAY_I8, 4, dim, rows, 25.3f, NULL};
    BOTH(embed, "i8 4 tok from [262144][640]", ca, va);
    compare_f32(e, 0, 1e-6, "embed big table");
    struct pair o = pair_rand((size_t)n_tok * rows, 0, 1);
    struct dray_matmul_args cm = {.x = VC(e, 0), .w = VC(tab, 0), .wscale = VC(rs, 0), .out = VC(o, 0),
                                  .n_tok = n_tok, .n_out = rows, .k = dim, .stride_x = dim,
                                  .stride_out = rows, .wdtype = DRAY_I8};
    struct dray_matmul_args vm = cm;
    vm.x = VV(e, 0), vm.w = VV(tab, 0), vm.wscale = VV(rs, 0), vm.out = VV(o, 0);
    BOTH(matmul, "i8 logits 2x262144x640", cm, vm);
    float *c, *v;
    pair_down(o, (void **)&c, (void **)&v);
    float amax = 0;
    for (size_t i = 0; i < o.n / 4; i++)
        amax = fmaxf(amax, fabsf(c[i]));
    free(c), free(v);
    compare_f32(o, 1e-4 * amax, 0, "logits");
    pair_free(&tab), pair_free(&rs), pair_free(&id), pair_free(&e), pair_free(&o);
}

static void test_vulkan_copy_overlapping_and_fill(void **state)
{
    (void)state;
    uint32_t h[1000], want[1000], got[1000];
    for (int i = 0; i < 1000; i++)
        h[i] = want[i] = dray_test_rand();
    struct dray_buf *b;
    expect_ok(&vk, vk.ops->alloc(vk.ctx, sizeof(h), &b));
    expect_ok(&vk, vk.ops->upload(vk.ctx, (struct dray_view){b, 0}, h, sizeof(h)));
    expect_ok(&vk, vk.ops->copy(vk.ctx, (struct dray_view){b, 40}, (struct dray_view){b, 0}, 2000));
    memmove((uint8_t *)want + 40, want, 2000);
    expect_ok(&vk, vk.ops->fill(vk.ctx, (struct dray_view){b, 3000}, 0xdeadbeefu, 400));
    for (int i = 750; i < 850; i++)
        want[i] = 0xdeadbeefu;
    expect_ok(&vk, vk.ops->download(vk.ctx, got, (struct dray_view){b, 0}, sizeof(got)));
    assert_memory_equal(got, want, sizeof(got));
    vk.ops->free(vk.ctx, b);
}

static void test_vulkan_rejects_views_outside_buffers_and_unknown_dtypes(void **state)
{
    (void)state;
    struct dray_buf *b;
    expect_ok(&vk, vk.ops->alloc(vk.ctx, 400, &b));
    struct dray_view v = {b, 0};
    struct dray_add_args a = {v, v, v, 101};
    assert_int_equal(vk.ops->add(vk.ctx, &a), DRAY_EINVAL);
    assert_non_null(strstr(vk.ops->last_error(vk.ctx), "the buffer holds 400"));
    struct dray_matmul_args m = {.x = v, .w = v, .wscale = v, .out = v, .n_tok = 1, .n_out = 1,
                                 .k = 4, .stride_x = 4, .stride_out = 1, .wdtype = 7};
    assert_int_equal(vk.ops->matmul(vk.ctx, &m), DRAY_ENOTSUP);
    char tiny[8];
    assert_int_equal(vk.ops->download(vk.ctx, tiny, (struct dray_view){b, 396}, 8), DRAY_EINVAL);
    vk.ops->free(vk.ctx, b);
    assert_string_equal(vk.ops->last_error(vk.ctx), "");
}

/* ------------------------------------------------------ packed weights */
/* Version 3: weight_create on every format, matmul and embed on the handle,
 * against backend.h's arithmetic computed here with backend_util.h's helpers. */

#define VK_CHECK(ctx, rc)                                                                          \
    do {                                                                                           \
        int rc_ = (rc);                                                                            \
        if (rc_ != 0)                                                                              \
            fail_msg("vulkan: rc %d: %s", rc_, vk.ops->last_error(ctx));                          \
    } while (0)

/* One weight matrix as the host hands it to weight_create. */
struct hweight {
    struct dray_wformat f;
    uint32_t n_out, k;
    uint8_t *codes;
    void *d, *m;   /* m NULL without a min */
    uint8_t *sub;  /* two-level formats only, else NULL */
    size_t nc, ns; /* bytes of codes, of d (and of m) */
};

static void put_scale(struct dray_wformat f, void *arr, size_t i, float v)
{
    if (f.scale == DRAY_WSCALE_F16)
        ((uint16_t *)arr)[i] = dray_util_f32_to_f16(v);
    else
        ((float *)arr)[i] = v;
}

/* Random codes (every bit pattern is a valid code), d of either sign, m; two
 * levels: D of either sign and M scaled down by the sub-scales under them
 * (6-bit (s, n) pairs 0..63, or any int8). */
static struct hweight hweight_make(struct dray_wformat f, uint32_t n_out, uint32_t k)
{
    struct hweight w = {f, n_out, k, NULL, NULL, NULL, NULL, 0, 0};
    size_t ng = (size_t)n_out * (k / 32);
    size_t nsc = (size_t)n_out * dray_util_wformat_scales_per_row(f, k);
    size_t nsub = (size_t)n_out * dray_util_wformat_sub_bytes(f, k);
    float dlo = f.super ? 0.00005f : 0.002f, dhi = f.super ? 0.0005f : 0.02f;
    w.nc = ng * dray_util_wformat_group_bytes(f);
    w.ns = nsc * dray_util_wformat_scale_bytes(f);
    w.codes = malloc(w.nc);
    w.d = malloc(w.ns);
    w.m = f.has_min ? malloc(w.ns) : NULL;
    w.sub = nsub ? malloc(nsub) : NULL;
    for (size_t i = 0; i < w.nc; i++)
        w.codes[i] = (uint8_t)dray_test_rand();
    for (size_t i = 0; i < nsc; i++) {
        put_scale(f, w.d, i, dray_test_randf(dlo, dhi) * (dray_test_rand() % 2 ? 1.0f : -1.0f));
        if (w.m)
            put_scale(f, w.m, i, dray_test_randf(f.super ? 0.0f : -0.1f, f.super ? 0.002f : 0.1f));
    }
    for (size_t i = 0; i < nsub; i++)
        w.sub[i] = (uint8_t)(dray_test_rand() % (f.bits == 6 ? 256u : 64u));
    return w;
}

static void hweight_free(struct hweight *w)
{
    free(w->codes), free(w->d), free(w->m), free(w->sub);
}

static int hweight_create(struct dray_ctx *ctx, const struct hweight *w, uint32_t uses,
                          struct dray_packed **out, uint64_t *bytes)
{
    struct dray_weight_desc d = {sizeof(d), w->f, w->n_out, w->k, uses, w->codes, w->d, w->m,
                                 w->sub};
    return vk.ops->weight_create(ctx, &d, out, bytes);
}

/* What the device may hold: one level, exactly the host's codes + d + m; two
 * levels, the GGUF file's bytes (Q4_K 144, Q5_K 176, Q6_K 210 per 256). */
static uint64_t hweight_device_bytes(const struct hweight *w)
{
    if (w->f.super)
        return (uint64_t)w->n_out * (w->k / 256) *
               (w->f.bits == 4 ? 144u : w->f.bits == 5 ? 176u : 210u);
    return w->nc + w->ns * (w->f.has_min ? 2 : 1);
}

/* The reference of one token row x: ref[o] for every output row o (passes 1
 * or 2: the residual r = x - q*sx quantized again) and mag[o] = sum_k |x||W|. */
static void packed_ref(const struct hweight *w, const float *x, uint32_t passes, float *ref,
                       double *mag)
{
    uint32_t k = w->k, G = k / 32;
    int8_t *q = malloc(k), *q2 = malloc(k);
    float *sx = malloc(G * 4), *sx2 = malloc(G * 4), *r = malloc(k * 4), *row = malloc(k * 4);
    for (uint32_t g = 0; g < G; g++)
        sx[g] = dray_util_quant_group(x + 32 * g, q + 32 * g);
    for (uint32_t c = 0; c < k; c++)
        r[c] = x[c] - (float)q[c] * sx[c / 32];
    for (uint32_t g = 0; g < G; g++)
        sx2[g] = dray_util_quant_group(r + 32 * g, q2 + 32 * g);
    for (uint32_t o = 0; o < w->n_out; o++) {
        ref[o] = dray_util_packed_dot(w->f, k, w->codes, w->d, w->m, w->sub, o, q, sx);
        if (passes == 2)
            ref[o] += dray_util_packed_dot(w->f, k, w->codes, w->d, w->m, w->sub, o, q2, sx2);
        dray_util_packed_row(w->f, k, w->codes, w->d, w->m, w->sub, o, row);
        mag[o] = 0;
        for (uint32_t c = 0; c < k; c++)
            mag[o] += fabs((double)x[c] * row[c]);
    }
    free(q), free(q2), free(sx), free(sx2), free(r), free(row);
}

/* One matmul on handle h of w, strides padded; a zero group (token 1) and a
 * large channel (token 0) among random activations. Padding stays untouched. */
static void packed_matmul_case(struct dray_ctx *ctx, const struct hweight *w, struct dray_packed *h,
                               uint32_t n_tok, uint32_t passes, uint32_t accumulate)
{
    uint32_t k = w->k, n_out = w->n_out, sx = k + 5, so = n_out + 3;
    size_t nx = (size_t)n_tok * sx, no = (size_t)n_tok * so;
    float *x = malloc(nx * 4), *o0 = malloc(no * 4), *got = malloc(no * 4);
    float *ref = malloc(n_out * 4);
    double *mag = malloc(n_out * sizeof(double));
    for (size_t i = 0; i < nx; i++)
        x[i] = dray_test_randf(-1, 1);
    for (size_t i = 0; i < no; i++)
        o0[i] = dray_test_randf(-1, 1);
    x[5] = 30.0f;
    if (n_tok > 1)
        memset(x + sx, 0, 32 * 4);
    struct dray_buf *xb, *ob;
    VK_CHECK(ctx, vk.ops->alloc(ctx, nx * 4, &xb));
    VK_CHECK(ctx, vk.ops->alloc(ctx, no * 4, &ob));
    VK_CHECK(ctx, vk.ops->upload(ctx, (struct dray_view){xb, 0}, x, nx * 4));
    VK_CHECK(ctx, vk.ops->upload(ctx, (struct dray_view){ob, 0}, o0, no * 4));
    struct dray_matmul_args a = {.x = {xb, 0}, .out = {ob, 0}, .n_tok = n_tok, .n_out = n_out,
                                 .k = k, .stride_x = sx, .stride_out = so, .accumulate = accumulate,
                                 .wdtype = DRAY_PACKED, .packed = h, .passes = passes};
    VK_CHECK(ctx, vk.ops->matmul(ctx, &a));
    VK_CHECK(ctx, vk.ops->download(ctx, got, (struct dray_view){ob, 0}, no * 4));
    char name[32];
    dray_util_wformat_name(w->f, name, sizeof(name));
    for (uint32_t t = 0; t < n_tok; t++) {
        packed_ref(w, x + (size_t)t * sx, passes, ref, mag);
        for (uint32_t o = 0; o < so; o++) {
            size_t i = (size_t)t * so + o;
            if (o >= n_out) {
                if (got[i] != o0[i])
                    fail_msg("%s: stride padding out[%u][%u] written", name, t, o);
                continue;
            }
            double want = ref[o] + (accumulate ? o0[i] : 0.0f);
            double tol = 1e-4 * (mag[o] + (accumulate ? fabs(o0[i]) : 0.0));
            if (!(fabs(got[i] - want) <= tol))
                fail_msg("%s %ux%ux%u passes %u acc %u: out[%u][%u] = %.9g, want %.9g (tol %g)",
                         name, n_tok, n_out, k, passes, accumulate, t, o, got[i], want, tol);
        }
    }
    vk.ops->free(ctx, xb);
    vk.ops->free(ctx, ob);
    free(x), free(o0), free(got), free(ref), free(mag);
}

/* Every combination of passes, accumulate and n_tok 1/5 on one new handle. */
static void packed_matmul_all(struct dray_ctx *ctx, struct dray_wformat f, uint32_t n_out,
                              uint32_t k, int full)
{
    struct hweight w = hweight_make(f, n_out, k);
    struct dray_packed *h = NULL;
    uint64_t bytes = 0;
    VK_CHECK(ctx, hweight_create(ctx, &w, DRAY_WUSE_MATMUL | DRAY_WUSE_EMBED, &h, &bytes));
    assert_non_null(h);
    assert_int_equal(bytes, hweight_device_bytes(&w));
    for (uint32_t p = 1; p <= 2; p++)
        for (uint32_t acc = 0; acc < 2; acc++)
            for (uint32_t nt = 1; nt <= 5; nt += 4)
                if (full || (acc == p - 1 && nt == 4 * p - 3))
                    packed_matmul_case(ctx, &w, h, nt, p, acc);
    vk.ops->weight_free(ctx, h);
    hweight_free(&w);
}

static void test_vulkan_packed_matmul_every_format(void **state)
{
    (void)state;
    static const uint32_t shapes[][2] = {{16, 32}, {257, 96}, {40, 640}, {16, 2048}};
    for (uint32_t b = 0; b < 12; b++) {
        struct dray_wformat f = dray_util_wformat_of_bit(b);
        char name[32];
        double t0 = now_ms();
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
            packed_matmul_all(vk.ctx, f, shapes[s][0], shapes[s][1], 1);
        printf("vulkan matmul     packed %-12s 4 shapes x 8 cases       %9.2f ms\n",
               dray_util_wformat_name(f, name, sizeof(name)), now_ms() - t0);
    }
}

/* The two-level formats (Q4_K, Q5_K, Q6_K shapes) at k 256, 512 and 2304 with
 * n_out leaving workgroups part-filled: n_tok 1, 3 and 17 (more than a
 * workgroup's tokens), passes 1 and 2, accumulate 0 and 1, on one handle each. */
static void test_vulkan_packed_matmul_two_level(void **state)
{
    (void)state;
    static const uint32_t shapes[][2] = {{40, 256}, {257, 512}, {70, 2304}}, n_toks[] = {1, 3, 17};
    for (uint32_t b = 12; b < 15; b++) {
        struct dray_wformat f = dray_util_wformat_of_bit(b);
        char name[32];
        double t0 = now_ms();
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            struct hweight w = hweight_make(f, shapes[s][0], shapes[s][1]);
            struct dray_packed *h = NULL;
            uint64_t bytes = 0;
            VK_CHECK(vk.ctx, hweight_create(vk.ctx, &w, DRAY_WUSE_MATMUL, &h, &bytes));
            assert_int_equal(bytes, hweight_device_bytes(&w));
            for (uint32_t c = 0; c < 12; c++)
                packed_matmul_case(vk.ctx, &w, h, n_toks[c / 4], 1 + (c & 1), (c >> 1) & 1);
            vk.ops->weight_free(vk.ctx, h);
            hweight_free(&w);
        }
        printf("vulkan matmul     packed %-18s 3 shapes x 12 cases %9.2f ms\n",
               dray_util_wformat_name(f, name, sizeof(name)), now_ms() - t0);
    }
}

/* The kernels without the packed int8 dot product (DRAY_VK_NO_DOT at open). */
static void test_vulkan_packed_matmul_without_dot_product(void **state)
{
    (void)state;
    struct dray_ctx *ctx = NULL;
    char err[512] = "";
    struct dray_open_options o = {.size = sizeof(o)};
    setenv("DRAY_VK_NO_DOT", "1", 1);
    int rc = vk.ops->open(0, &o, &ctx, err, sizeof(err));
    unsetenv("DRAY_VK_NO_DOT");
    if (rc != 0)
        fail_msg("vulkan: open: %s", err);
    for (uint32_t b = 0; b < 15; b++) {
        packed_matmul_all(ctx, dray_util_wformat_of_bit(b), 40, b < 12 ? 96 : 256, 0);
        packed_matmul_all(ctx, dray_util_wformat_of_bit(b), 257, b < 12 ? 640 : 2304, 0);
    }
    vk.ops->close(ctx);
}

/* Six ids (first, last, repeated) gathered from handle h of w, times scale. */
static void packed_embed_case(const struct hweight *w, struct dray_packed *h, float scale)
{
    uint32_t k = w->k, n = 6;
    int32_t ids[6] = {0, (int32_t)w->n_out - 1, 3, 3, (int32_t)w->n_out / 2, 1};
    float *got = malloc((size_t)n * k * 4), *row = malloc(k * 4);
    struct dray_buf *ib, *ob;
    VK_CHECK(vk.ctx, vk.ops->alloc(vk.ctx, sizeof(ids), &ib));
    VK_CHECK(vk.ctx, vk.ops->alloc(vk.ctx, (size_t)n * k * 4, &ob));
    VK_CHECK(vk.ctx, vk.ops->upload(vk.ctx, (struct dray_view){ib, 0}, ids, sizeof(ids)));
    struct dray_embed_args a = {.ids = {ib, 0}, .out = {ob, 0}, .dtype = DRAY_PACKED, .n_tok = n,
                                .dim = k, .n_rows = w->n_out, .scale = scale, .packed = h};
    VK_CHECK(vk.ctx, vk.ops->embed(vk.ctx, &a));
    VK_CHECK(vk.ctx, vk.ops->download(vk.ctx, got, (struct dray_view){ob, 0}, (size_t)n * k * 4));
    char name[32];
    dray_util_wformat_name(w->f, name, sizeof(name));
    for (uint32_t t = 0; t < n; t++) {
        dray_util_packed_row(w->f, k, w->codes, w->d, w->m, w->sub, (uint64_t)ids[t], row);
        for (uint32_t i = 0; i < k; i++) {
            float want = row[i] * scale, g = got[(size_t)t * k + i];
            if (!(fabsf(g - want) <= 1e-6f * fabsf(want)))
                fail_msg("embed %s: out[%u][%u] = %.9g, want %.9g", name, t, i, g, want);
        }
    }
    vk.ops->free(vk.ctx, ib);
    vk.ops->free(vk.ctx, ob);
    free(got), free(row);
}

/* Every format; the two-level ones at k 256, 512 and 2304. */
static void test_vulkan_packed_embed_every_format(void **state)
{
    (void)state;
    static const uint32_t k2[] = {256, 512, 2304};
    for (uint32_t b = 0; b < 15; b++)
        for (uint32_t i = 0; i < (b < 12 ? 1u : 3u); i++) {
            struct hweight w =
                hweight_make(dray_util_wformat_of_bit(b), 50, b >= 12 ? k2[i] : b % 2 ? 96 : 640);
            struct dray_packed *h = NULL;
            uint32_t uses = (b + i) % 3 ? DRAY_WUSE_EMBED : DRAY_WUSE_EMBED | DRAY_WUSE_MATMUL;
            uint64_t bytes = 0;
            VK_CHECK(vk.ctx, hweight_create(vk.ctx, &w, uses, &h, &bytes));
            assert_int_equal(bytes, hweight_device_bytes(&w));
            packed_embed_case(&w, h, (b + i) % 2 ? 1.0f : 25.3f);
            vk.ops->weight_free(vk.ctx, h);
            hweight_free(&w);
        }
}

static void test_vulkan_packed_rejects_bad_formats_and_shapes(void **state)
{
    (void)state;
    struct dray_wformat q4 = {4, DRAY_WSCALE_F16, 0, 0};
    struct hweight w = hweight_make(q4, 40, 96);
    struct dray_packed *h = (struct dray_packed *)&w, *e = NULL;
    w.f.bits = 6;
    assert_int_equal(hweight_create(vk.ctx, &w, DRAY_WUSE_MATMUL, &h, NULL), DRAY_EINVAL);
    assert_null(h);
    assert_non_null(strstr(vk.ops->last_error(vk.ctx), "format"));
    w.f.bits = 4;
    VK_CHECK(vk.ctx, hweight_create(vk.ctx, &w, DRAY_WUSE_MATMUL, &h, NULL));
    VK_CHECK(vk.ctx, hweight_create(vk.ctx, &w, DRAY_WUSE_EMBED, &e, NULL));
    struct dray_buf *b;
    VK_CHECK(vk.ctx, vk.ops->alloc(vk.ctx, 4096, &b));
    struct dray_view x = {b, 0}, out = {b, 2048};
    struct dray_matmul_args a = {.x = x, .out = out, .n_tok = 1, .n_out = 41, .k = 96,
                                 .stride_x = 96, .stride_out = 41, .wdtype = DRAY_PACKED,
                                 .packed = h, .passes = 1};
    assert_int_equal(vk.ops->matmul(vk.ctx, &a), DRAY_EINVAL); /* n_out is not the handle's */
    assert_non_null(strstr(vk.ops->last_error(vk.ctx), "n_out 41"));
    a.n_out = a.stride_out = 40, a.packed = e;
    assert_int_equal(vk.ops->matmul(vk.ctx, &a), DRAY_EINVAL); /* created for embed only */
    a.packed = h, a.passes = 3;
    assert_int_equal(vk.ops->matmul(vk.ctx, &a), DRAY_EINVAL);
    struct dray_embed_args ea = {.ids = x, .out = out, .dtype = DRAY_PACKED, .n_tok = 1, .dim = 96,
                                 .n_rows = 40, .scale = 1, .packed = h};
    assert_int_equal(vk.ops->embed(vk.ctx, &ea), DRAY_EINVAL); /* created for matmul only */
    vk.ops->free(vk.ctx, b);
    vk.ops->weight_free(vk.ctx, e);
    packed_matmul_case(vk.ctx, &w, h, 5, 2, 1); /* and the plugin still works */
    vk.ops->weight_free(vk.ctx, h);
    vk.ops->weight_free(vk.ctx, NULL);
    assert_string_equal(vk.ops->last_error(vk.ctx), "");
    hweight_free(&w);
    /* two levels: k a multiple of 256, sub given, 4/5-bit sub-scales of 6 bits */
    struct hweight kw = hweight_make(dray_util_wformat_of_bit(12), 4, 256);
    kw.k = 224;
    assert_int_equal(hweight_create(vk.ctx, &kw, DRAY_WUSE_MATMUL, &h, NULL), DRAY_EINVAL);
    kw.k = 256, kw.sub[9] = 64;
    assert_int_equal(hweight_create(vk.ctx, &kw, DRAY_WUSE_MATMUL, &h, NULL), DRAY_EINVAL);
    assert_null(h);
    hweight_free(&kw);
}

/* Version 3 caps: every format for matmul and embed, one and two passes, and
 * none of version 2's grouped dtypes. */
static void test_vulkan_caps_declare_packed_weights(void **state)
{
    (void)state;
    struct dray_op_caps c = {.size = sizeof(c)};
    assert_int_equal(vk.ops->version, 4);
    assert_int_equal(vk.ops->op_caps(0, &c), 0);
    assert_int_equal(c.matmul_wformats, DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K);
    assert_int_equal(c.embed_wformats, DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K);
    assert_int_equal(c.matmul_passes, 3);
    uint32_t v2 = 0;
    for (uint32_t t = DRAY_Q8G32; t <= DRAY_Q4G32H_X2; t++)
        v2 |= DRAY_DTYPE_BIT(t);
    for (uint32_t op = 0; op < DRAY_OP_SLOTS; op++)
        assert_int_equal(c.op_dtypes[op] & v2, 0);
}

/* A packed table whose codes (167 MB) exceed lavapipe's 128 MiB binding: embed
 * and matmul split it into row windows. Checked on a sample of rows, the two
 * either side of the window boundary among them. */
/* Row o of w as a matrix of its own: views into w's arrays. */
static struct hweight hweight_row(const struct hweight *w, uint32_t o)
{
    struct hweight one = *w;
    size_t sc = (size_t)dray_util_wformat_scales_per_row(w->f, w->k) *
                dray_util_wformat_scale_bytes(w->f);
    one.n_out = 1;
    one.codes = w->codes + (size_t)o * (w->k / 32) * dray_util_wformat_group_bytes(w->f);
    one.d = (uint8_t *)w->d + o * sc;
    one.m = w->m ? (uint8_t *)w->m + o * sc : NULL;
    one.sub = w->sub ? w->sub + (size_t)o * dray_util_wformat_sub_bytes(w->f, w->k) : NULL;
    return one;
}

static void packed_table_case(struct dray_wformat f)
{
    uint32_t rows = 262144, k = 1280, n_tok = 2;
    struct hweight w = hweight_make(f, rows, k);
    struct dray_packed *h = NULL;
    VK_CHECK(vk.ctx, hweight_create(vk.ctx, &w, DRAY_WUSE_MATMUL | DRAY_WUSE_EMBED, &h, NULL));
    float *x = malloc((size_t)n_tok * k * 4), *got = malloc((size_t)n_tok * rows * 4);
    for (size_t i = 0; i < (size_t)n_tok * k; i++)
        x[i] = dray_test_randf(-1, 1);
    struct dray_buf *xb, *ob;
    VK_CHECK(vk.ctx, vk.ops->alloc(vk.ctx, (size_t)n_tok * k * 4, &xb));
    VK_CHECK(vk.ctx, vk.ops->alloc(vk.ctx, (size_t)n_tok * rows * 4, &ob));
    VK_CHECK(vk.ctx, vk.ops->upload(vk.ctx, (struct dray_view){xb, 0}, x, (size_t)n_tok * k * 4));
    struct dray_matmul_args a = {.x = {xb, 0}, .out = {ob, 0}, .n_tok = n_tok, .n_out = rows,
                                 .k = k, .stride_x = k, .stride_out = rows, .wdtype = DRAY_PACKED,
                                 .packed = h, .passes = 1};
    double t0 = now_ms();
    VK_CHECK(vk.ctx, vk.ops->matmul(vk.ctx, &a));
    VK_CHECK(vk.ctx, vk.ops->synchronize(vk.ctx));
    char name[32];
    printf("vulkan matmul     packed %-18s logits 2x262144x1280 %9.2f ms\n",
           dray_util_wformat_name(f, name, sizeof(name)), now_ms() - t0);
    VK_CHECK(vk.ctx, vk.ops->download(vk.ctx, got, (struct dray_view){ob, 0},
                                      (size_t)n_tok * rows * 4));
    uint32_t sample[] = {0, 1, 77777, 209714, 209715, 209716, 262143};
    for (size_t s = 0; s < sizeof(sample) / sizeof(sample[0]); s++) {
        uint32_t o = sample[s];
        float ref;
        double mag;
        struct hweight one = hweight_row(&w, o);
        for (uint32_t t = 0; t < n_tok; t++) {
            packed_ref(&one, x + (size_t)t * k, 1, &ref, &mag);
            float g = got[(size_t)t * rows + o];
            if (!(fabs(g - ref) <= 1e-4 * mag))
                fail_msg("logits out[%u][%u] = %.9g, want %.9g", t, o, g, ref);
        }
    }
    vk.ops->free(vk.ctx, xb);
    vk.ops->free(vk.ctx, ob);
    free(x), free(got);
    packed_embed_case(&w, h, 25.3f); /* ids 0, last, 3, 3, middle, 1: both windows */
    vk.ops->weight_free(vk.ctx, h);
    hweight_free(&w);
}

/* One level and two (the sub-scales' window follows the codes'). */
static void test_vulkan_packed_table_larger_than_a_binding(void **state)
{
    (void)state;
    packed_table_case((struct dray_wformat){4, DRAY_WSCALE_F16, 1, 0});
    packed_table_case(dray_util_wformat_of_bit(12));
}

/* The child's side of the test below: a fresh process, no driver. */
static int count_without_driver(void)
{
    struct side s = {0};
    char why[600];
    if (negotiate(&s, "vulkan", why, sizeof(why)))
        return 2;
    uint32_t n = 99;
    int rc = s.ops->device_count(&n);
    struct dray_device_props p;
    int rp = s.ops->device_props(0, &p);
    return rc == 0 && n == 0 && rp == DRAY_ENODEV ? 0 : 1;
}

/* Without a Vulkan driver the plugin lists no device (and does not fail). Run in
 * a new process (this binary again), since the plugin asks the loader once and
 * keeps the answer for as long as it is loaded. */
static void test_vulkan_without_driver_counts_zero_devices(void **state)
{
    (void)state;
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json", 1);
        setenv("VK_DRIVER_FILES", "/nonexistent/icd.json", 1);
        setenv("DRAY_TEST_VK_NO_DRIVER", "1", 1);
        execl("/proc/self/exe", "test_vulkan", (char *)NULL);
        _exit(3);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    if (getenv("DRAY_TEST_VK_NO_DRIVER"))
        return count_without_driver();
    char why[600];
    setenv("DRAY_VK_VALIDATION", "1", 0);
    int lrc = load(&vk, "vulkan", 0, why, sizeof(why));
    if (lrc != 0 && strstr(why, "VK_LAYER_KHRONOS_validation")) {
        /* numerics are still worth checking on a machine without the layer */
        printf("NOTE: %s; running without validation\n", why);
        unsetenv("DRAY_VK_VALIDATION");
        lrc = load(&vk, "vulkan", 0, why, sizeof(why));
    }
    if (lrc != 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    if (load(&cpu, "cpu", 1, why, sizeof(why)) != 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    struct dray_device_props p;
    if (vk.ops->device_props(0, &p) == 0)
        printf("vulkan device: %s / %s, validation %s\n", p.name, p.vendor,
               getenv("DRAY_VK_VALIDATION") ? "on" : "off");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vulkan_add_matches_cpu_and_aliases),
        cmocka_unit_test(test_vulkan_gated_act_matches_cpu),
        cmocka_unit_test(test_vulkan_rmsnorm_matches_cpu_per_head_and_in_place),
        cmocka_unit_test(test_vulkan_rope_matches_cpu_at_long_positions),
        cmocka_unit_test(test_vulkan_rope_freq_factors_and_attn_factor),
        cmocka_unit_test(test_vulkan_embed_matches_cpu_i8_and_f32),
        cmocka_unit_test(test_vulkan_matmul_i8_matches_cpu),
        cmocka_unit_test(test_vulkan_matmul_f32_matches_cpu),
        cmocka_unit_test(test_vulkan_kv_store_matches_cpu_i8_and_f16),
        cmocka_unit_test(test_vulkan_attention_matches_cpu_mixed_batch_gqa_window),
        cmocka_unit_test(test_vulkan_attention_softcap_matches_cpu),
        cmocka_unit_test(test_vulkan_table_larger_than_a_binding_embeds_and_multiplies),
        cmocka_unit_test(test_vulkan_copy_overlapping_and_fill),
        cmocka_unit_test(test_vulkan_rejects_views_outside_buffers_and_unknown_dtypes),
        cmocka_unit_test(test_vulkan_caps_declare_packed_weights),
        cmocka_unit_test(test_vulkan_packed_matmul_every_format),
        cmocka_unit_test(test_vulkan_packed_matmul_two_level),
        cmocka_unit_test(test_vulkan_packed_matmul_without_dot_product),
        cmocka_unit_test(test_vulkan_packed_embed_every_format),
        cmocka_unit_test(test_vulkan_packed_rejects_bad_formats_and_shapes),
        cmocka_unit_test(test_vulkan_packed_table_larger_than_a_binding),
        cmocka_unit_test(test_vulkan_without_driver_counts_zero_devices),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    vk.ops->close(vk.ctx);
    cpu.ops->close(cpu.ctx);
    dlclose(vk.handle);
    dlclose(cpu.handle);
    return rc;
}
