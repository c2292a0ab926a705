/* The CPU plugin's ops: the reference kernels against straightforward double
 * precision math written here, the AVX2 kernels against the reference under the
 * tolerances of backend.h, argument checking, aliasing, and thread-count
 * independence. The plugin is loaded with dlopen from $DRAY_PLUGIN_PATH, as the
 * engine loads it. */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "testutil.h"

static void *handle;
static const struct dray_ops *ops;
static struct dray_ctx *cref;  /* reference kernels, 2 threads */
static struct dray_ctx *cfast; /* AVX2 kernels (DRAY_CPU_ISA=avx2; the reference if the CPU lacks AVX2), 2 threads */
static struct dray_ctx *cone;  /* the same, 1 thread */
/* The int8 matmul kernel sets past AVX2, each at 2 and 1 threads (NULL where
 * this CPU or build lacks them). All share the AVX2 integer sums and finish, so
 * each must give the AVX2 kernels' bits. */
struct isa_ctx {
    const char *env, *tag;
    struct dray_ctx *c2, *c1;
};
static struct isa_ctx isas[] = {
    {"avxvnni", "(avx-vnni)", NULL, NULL},
    {"avx512vnni", "(avx512-vnni)", NULL, NULL},
    {"amx", "(amx-int8)", NULL, NULL},
};
#define N_ISA (sizeof(isas) / sizeof(isas[0]))
static int have_avx2;          /* cfast really runs the AVX2 kernels */

/* ------------------------------------------------------------ plumbing */

/* Open a context with DRAY_CPU_ISA=isa; *got (if given) says whether the
 * device name then carries tag, i.e. whether that kernel set is in use. */
static int open_isa(const char *isa, uint32_t n_threads, struct dray_ctx **c, const char *tag, int *got)
{
    char err[256] = "";
    struct dray_open_options o = {.size = sizeof(o), .n_threads = n_threads};
    struct dray_device_props p;
    setenv("DRAY_CPU_ISA", isa, 1);
    int rc = ops->device_props(0, &p);
    if (!rc)
        rc = ops->open(0, &o, c, err, sizeof(err));
    unsetenv("DRAY_CPU_ISA");
    if (rc)
        fprintf(stderr, "open with DRAY_CPU_ISA=%s: %d %s\n", isa, rc, err);
    if (got)
        *got = !rc && strstr(p.name, tag) != NULL;
    return rc;
}

static int setup(void **state)
{
    (void)state;
    const char *path = getenv("DRAY_PLUGIN_PATH");
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path ? path : "");
    for (char *dir = strtok(buf, ":"); dir && !handle; dir = strtok(NULL, ":")) {
        char so[4200];
        snprintf(so, sizeof(so), "%s/libdray-cpu.so", dir);
        handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    }
    if (!handle) {
        fprintf(stderr, "libdray-cpu.so not found on DRAY_PLUGIN_PATH=%s\n", path ? path : "");
        return -1;
    }
    dray_plugin_negotiate_fn neg = (dray_plugin_negotiate_fn)dlsym(handle, DRAY_PLUGIN_SYMBOL);
    uint32_t v = DRAY_ABI_VERSION;
    char err[256] = "";
    if (!neg || neg(&v, NULL, &ops, err, sizeof(err)) != 0)
        return -1;
    struct dray_open_options o = {.size = sizeof(o), .n_threads = 2, .reference = 1};
    if (ops->open(0, &o, &cref, err, sizeof(err)))
        return -1;
    /* The device name says which kernel set DRAY_CPU_ISA got on this CPU. */
    if (open_isa("avx2", 2, &cfast, "(avx2+fma)", &have_avx2) || open_isa("avx2", 1, &cone, NULL, NULL))
        return -1;
    printf("# cpu kernel paths checked: reference yes, avx2 %s", have_avx2 ? "yes" : "SKIPPED (CPU or build lacks AVX2+FMA+F16C)");
    for (size_t i = 0; i < N_ISA; i++) {
        int have = 0;
        if (open_isa(isas[i].env, 2, &isas[i].c2, isas[i].tag, &have) ||
            open_isa(isas[i].env, 1, &isas[i].c1, NULL, NULL))
            return -1;
        if (!have) {
            ops->close(isas[i].c2), ops->close(isas[i].c1);
            isas[i].c2 = isas[i].c1 = NULL;
        }
        printf(", %s matmul %s", isas[i].env, have ? "yes" : "SKIPPED (CPU, OS or build lacks it)");
    }
    printf("\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ops->close(cref);
    ops->close(cfast);
    ops->close(cone);
    for (size_t i = 0; i < N_ISA; i++)
        if (isas[i].c2)
            ops->close(isas[i].c2), ops->close(isas[i].c1);
    dlclose(handle);
    return 0;
}

static struct dray_buf *up(struct dray_ctx *c, const void *data, size_t n)
{
    struct dray_buf *b = NULL;
    assert_int_equal(ops->alloc(c, n ? n : 4, &b), 0);
    if (data && n)
        assert_int_equal(ops->upload(c, (struct dray_view){b, 0}, data, n), 0);
    return b;
}

static void down(struct dray_ctx *c, struct dray_buf *b, void *dst, size_t n)
{
    assert_int_equal(ops->download(c, dst, (struct dray_view){b, 0}, n), 0);
}

static struct dray_view V(struct dray_buf *b)
{
    return (struct dray_view){b, 0};
}

static float *randv(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = dray_test_randf(lo, hi);
    return p;
}

static int8_t *randq(size_t n)
{
    int8_t *p = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        p[i] = (int8_t)(dray_test_rand() % 255) - 127;
    return p;
}

static double maxabs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

/* Fail with the first index where |a - b| > abs_tol + rel_tol*|b|. */
static void near(const char *what, const float *a, const float *b, size_t n, double abs_tol, double rel_tol)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= abs_tol + rel_tol * fabs(b[i]))) {
            fail_msg("%s: element %zu: %.9g vs %.9g (diff %.3g, tol %.3g)", what, i, a[i], b[i], d,
                     abs_tol + rel_tol * fabs(b[i]));
        }
    }
}

/* ------------------------------------------------------------ plugin glue */

static void test_cpu_plugin_describes_one_unified_device(void **state)
{
    (void)state;
    uint32_t n = 0;
    assert_int_equal(ops->version, 5);
    assert_string_equal(ops->name, "cpu");
    assert_int_equal(ops->device_count(&n), 0);
    assert_int_equal(n, 1);
    struct dray_device_props p;
    assert_int_equal(ops->device_props(0, &p), 0);
    assert_true(p.flags & DRAY_DEV_UNIFIED);
    assert_true(p.mem_total > 0);
    assert_true(strlen(p.name) > 0);
    assert_true(p.op_dtypes[DRAY_OP_MATMUL] & DRAY_DTYPE_BIT(DRAY_I8));
    assert_true(p.op_dtypes[DRAY_OP_MATMUL] & DRAY_DTYPE_BIT(DRAY_F32));
    assert_true(p.op_dtypes[DRAY_OP_ATTENTION] & DRAY_DTYPE_BIT(DRAY_F16));
    for (int op = 0; op < DRAY_OP_COUNT_V1; op++)
        assert_true(p.op_dtypes[op] != 0);
    assert_int_equal(ops->device_props(1, &p), DRAY_EINVAL);
    /* version 2: the same dtypes through op_caps, written only below the caller's size */
    struct dray_op_caps c = {.size = sizeof(c)};
    assert_int_equal(ops->op_caps(0, &c), 0);
    assert_int_equal(c.size, sizeof(c));
    assert_int_equal(c.n_ops, DRAY_OP_COUNT);
    /* the same dtypes: the retired v2 grouped ones are not declared */
    assert_int_equal(c.op_dtypes[DRAY_OP_MATMUL], p.op_dtypes[DRAY_OP_MATMUL]);
    assert_int_equal(c.op_dtypes[DRAY_OP_EMBED], p.op_dtypes[DRAY_OP_EMBED]);
    /* version 3: packed formats, 4 bits (f32 or f16), 5 bits (f16), 8 bits, with
     * one and two passes, and (v4) the three two-level ones; a gather table of
     * 4 or 8 bits */
    assert_int_equal(c.matmul_wformats, DRAY_UTIL_WF(4, 0, 0) | DRAY_UTIL_WF(4, 0, 1) | DRAY_UTIL_WF(4, 1, 0) |
                                            DRAY_UTIL_WF(4, 1, 1) | DRAY_UTIL_WF(5, 1, 0) | DRAY_UTIL_WF(5, 1, 1) |
                                            DRAY_UTIL_WF(8, 0, 0) | DRAY_UTIL_WF(8, 1, 0) | DRAY_UTIL_WF_K);
    assert_int_equal(c.embed_wformats, DRAY_UTIL_WF(4, 0, 0) | DRAY_UTIL_WF(4, 0, 1) | DRAY_UTIL_WF(4, 1, 0) |
                                           DRAY_UTIL_WF(4, 1, 1) | DRAY_UTIL_WF(8, 0, 0) | DRAY_UTIL_WF(8, 1, 0));
    assert_int_equal(c.matmul_passes, 3);
    assert_int_equal(c.max_k, 65536);
    struct {
        struct dray_op_caps c;
        uint32_t canary;
    } old = {.c = {.size = (uint32_t)offsetof(struct dray_op_caps, max_n_rot)}, .canary = 77};
    old.c.max_k = 5; /* beyond the caller's size: must stay untouched */
    assert_int_equal(ops->op_caps(0, &old.c), 0);
    assert_int_equal(old.c.max_k, 5);
    assert_int_equal(old.canary, 77);
    /* only the negotiate symbol is exported */
    assert_null(dlsym(handle, "dray_cpu_fail"));
    assert_null(dlsym(handle, "dray_cpu_ref_matmul"));
    /* negotiation refuses ABI 0 */
    dray_plugin_negotiate_fn neg = (dray_plugin_negotiate_fn)dlsym(handle, DRAY_PLUGIN_SYMBOL);
    uint32_t v = 0;
    const struct dray_ops *o = NULL;
    char err[128];
    assert_int_equal(neg(&v, NULL, &o, err, sizeof(err)), DRAY_EINCOMPAT);
    v = 4; /* a version-4 host (no prepared layouts): the version-5 table is refused, naming both */
    assert_int_equal(neg(&v, NULL, &o, err, sizeof(err)), DRAY_EINCOMPAT);
    assert_non_null(strstr(err, "implements ABI 5"));
    v = 7;
    assert_int_equal(neg(&v, NULL, &o, err, sizeof(err)), 0);
    assert_int_equal(v, 5);
}

static void test_cpu_memory_roundtrip_copy_fill_and_bounds(void **state)
{
    (void)state;
    struct dray_buf *b = NULL;
    assert_int_equal(ops->alloc(cfast, 100, &b), 0);
    uint8_t src[100], dst[100];
    for (int i = 0; i < 100; i++)
        src[i] = (uint8_t)i;
    assert_int_equal(ops->upload(cfast, V(b), src, 100), 0);
    assert_int_equal(ops->copy(cfast, (struct dray_view){b, 10}, (struct dray_view){b, 0}, 50), 0);
    assert_int_equal(ops->fill(cfast, (struct dray_view){b, 80}, 0xA1B2C3D4u, 20), 0);
    down(cfast, b, dst, 100);
    assert_memory_equal(dst, src, 10);
    assert_memory_equal(dst + 10, src, 50);
    uint32_t pat;
    memcpy(&pat, dst + 96, 4);
    assert_int_equal(pat, 0xA1B2C3D4u);
    assert_int_equal(ops->upload(cfast, (struct dray_view){b, 60}, src, 41), DRAY_EINVAL);
    assert_true(strlen(ops->last_error(cfast)) > 0);
    assert_int_equal(ops->download(cfast, dst, (struct dray_view){b, 101}, 0), DRAY_EINVAL);
    assert_int_equal(ops->fill(cfast, V(b), 0, 6), DRAY_EINVAL);
    assert_int_equal(ops->upload(cfast, (struct dray_view){NULL, 0}, src, 4), DRAY_EINVAL);
    assert_int_equal(ops->synchronize(cfast), 0);
    assert_string_equal(ops->last_error(cfast), "");
    ops->free(cfast, b);
}

/* A large buffer's zero fill gives its whole pages back (they read as zero)
 * and clears the partial pages at either end by hand; bytes outside the range
 * keep their values. */
static void test_cpu_zero_fill_of_a_large_buffer_clears_exactly_its_range(void **state)
{
    (void)state;
    const size_t n = (size_t)3 << 20, off = 4096 * 3 + 100, len = ((size_t)2 << 20) + 1236;
    struct dray_buf *b = NULL;
    assert_int_equal(ops->alloc(cfast, n, &b), 0);
    uint8_t *src = malloc(n), *dst = malloc(n);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    assert_int_equal(ops->upload(cfast, V(b), src, n), 0);
    assert_int_equal(ops->fill(cfast, (struct dray_view){b, off}, 0, len), 0);
    down(cfast, b, dst, n);
    memset(src + off, 0, len);
    assert_memory_equal(dst, src, n);
    /* and the pages given back take writes again */
    assert_int_equal(ops->upload(cfast, (struct dray_view){b, off}, src + 5, 64), 0);
    down(cfast, b, dst, n);
    assert_memory_equal(dst + off, src + 5, 64);
    free(src);
    free(dst);
    ops->free(cfast, b);
}

/* ------------------------------------------------------------ matmul */

struct mm_case {
    uint32_t n_tok, n_out, k, pad_x, pad_out, n_outlier, accumulate, wdtype;
};

struct mm_data {
    float *x, *wf, *ws, *ow, *out0;
    int8_t *w;
    int32_t *idx;
    size_t nx, nout;
    uint32_t sx, so;
};

static void mm_make(const struct mm_case *c, struct mm_data *d)
{
    d->sx = c->k + c->pad_x;
    d->so = c->n_out + c->pad_out;
    d->nx = (size_t)c->n_tok * d->sx;
    d->nout = (size_t)c->n_tok * d->so;
    d->x = randv(d->nx, -2, 2);
    if (c->n_tok > 2) /* a zero row quantizes to q = 0, sx = 0 */
        memset(d->x + d->sx, 0, c->k * sizeof(float));
    d->w = randq((size_t)c->n_out * c->k);
    d->wf = randv((size_t)c->n_out * c->k, -1, 1);
    d->ws = randv(c->n_out, 0.001f, 0.02f);
    d->idx = malloc(sizeof(int32_t) * (c->n_outlier + 1));
    for (uint32_t j = 0; j < c->n_outlier; j++) {
        d->idx[j] = (int32_t)(j * (c->k / c->n_outlier) + 1);
        for (uint32_t o = 0; o < c->n_out; o++) /* the contract: w holds 0 at outlier channels */
            d->w[(size_t)o * c->k + d->idx[j]] = 0;
        for (uint32_t t = 0; t < c->n_tok; t++)
            d->x[(size_t)t * d->sx + d->idx[j]] = 50.0f; /* big: must not set the scale */
    }
    d->ow = randv((size_t)c->n_out * (c->n_outlier + 1), -0.1f, 0.1f);
    d->out0 = randv(d->nout, -1, 1);
}

static void mm_free(struct mm_data *d)
{
    free(d->x), free(d->wf), free(d->ws), free(d->ow), free(d->out0), free(d->w), free(d->idx);
}

static float *mm_run(struct dray_ctx *ctx, const struct mm_case *c, const struct mm_data *d)
{
    int i8 = c->wdtype == DRAY_I8;
    struct dray_buf *bx = up(ctx, d->x, d->nx * 4);
    struct dray_buf *bw = i8 ? up(ctx, d->w, (size_t)c->n_out * c->k) : up(ctx, d->wf, (size_t)c->n_out * c->k * 4);
    struct dray_buf *bs = up(ctx, d->ws, c->n_out * 4);
    struct dray_buf *bo = up(ctx, d->out0, d->nout * 4);
    struct dray_buf *bi = up(ctx, d->idx, (c->n_outlier + 1) * 4);
    struct dray_buf *bow = up(ctx, d->ow, (size_t)c->n_out * (c->n_outlier + 1) * 4);
    struct dray_matmul_args a = {.x = V(bx), .w = V(bw), .wscale = V(bs), .out = V(bo), .outlier_idx = V(bi),
                                 .outlier_w = V(bow), .n_tok = c->n_tok, .n_out = c->n_out, .k = c->k,
                                 .stride_x = d->sx, .stride_out = d->so, .n_outlier = c->n_outlier,
                                 .accumulate = c->accumulate, .wdtype = c->wdtype};
    int rc = ops->matmul(ctx, &a);
    if (rc)
        fail_msg("matmul: %d %s", rc, ops->last_error(ctx));
    float *out = malloc(d->nout * 4);
    down(ctx, bo, out, d->nout * 4);
    ops->free(ctx, bx), ops->free(ctx, bw), ops->free(ctx, bs), ops->free(ctx, bo), ops->free(ctx, bi);
    ops->free(ctx, bow);
    return out;
}

/* The contract computed here independently: quantization to the letter (exact
 * int sums), and a float-math bound: |out - x.W| <= sum |x - q*sx| |W| . */
static void mm_check_ref(const struct mm_case *c, const struct mm_data *d, const float *out)
{
    for (uint32_t t = 0; t < c->n_tok; t++) {
        const float *x = d->x + (size_t)t * d->sx;
        double amax = 0;
        for (uint32_t i = 0; i < c->k; i++) {
            int outl = 0;
            for (uint32_t j = 0; j < c->n_outlier; j++)
                outl |= (uint32_t)d->idx[j] == i;
            if (!outl && fabs(x[i]) > amax)
                amax = fabs(x[i]);
        }
        float sx = (float)amax / 127.0f;
        for (uint32_t o = 0; o < c->n_out; o++) {
            double exact = 0, err = 0, ref;
            if (c->wdtype == DRAY_I8) {
                long long isum = 0;
                for (uint32_t i = 0; i < c->k; i++) {
                    double W = (double)d->w[(size_t)o * c->k + i] * d->ws[o];
                    long q = sx > 0 ? lrint(x[i] / sx) : 0;
                    int outl = 0;
                    for (uint32_t j = 0; j < c->n_outlier; j++)
                        outl |= (uint32_t)d->idx[j] == i;
                    if (outl)
                        q = 0;
                    isum += q * d->w[(size_t)o * c->k + i];
                    exact += outl ? 0 : x[i] * W;
                    err += outl ? 0 : fabs(x[i] - q * (double)sx) * fabs(W);
                }
                for (uint32_t j = 0; j < c->n_outlier; j++)
                    exact += x[d->idx[j]] * (double)d->ow[(size_t)o * c->n_outlier + j];
                ref = (double)isum * sx * d->ws[o];
                for (uint32_t j = 0; j < c->n_outlier; j++)
                    ref += x[d->idx[j]] * (double)d->ow[(size_t)o * c->n_outlier + j];
            } else {
                for (uint32_t i = 0; i < c->k; i++) {
                    exact += (double)x[i] * d->wf[(size_t)o * c->k + i];
                    err += fabs(x[i] * d->wf[(size_t)o * c->k + i]);
                }
                ref = exact;
                err *= 1e-5;
            }
            double base = c->accumulate ? d->out0[(size_t)t * d->so + o] : 0.0;
            double got = out[(size_t)t * d->so + o] - base;
            if (fabs(got - ref) > 1e-5 * (fabs(ref) + 1) + 1e-6)
                fail_msg("matmul ref t %u o %u: %.9g vs exact-int %.9g", t, o, got, ref);
            if (fabs(got - exact) > err * 1.001 + 1e-4)
                fail_msg("matmul ref t %u o %u: %.9g vs float math %.9g beyond bound %.3g", t, o, got, exact, err);
        }
        /* padding between rows of out is untouched */
        for (uint32_t o = c->n_out; o < d->so; o++)
            assert_true(out[(size_t)t * d->so + o] == d->out0[(size_t)t * d->so + o]);
    }
}

static void mm_case_run(const struct mm_case *c)
{
    struct mm_data d;
    mm_make(c, &d);
    float *r = mm_run(cref, c, &d);
    float *f = mm_run(cfast, c, &d);
    float *o = mm_run(cone, c, &d);
    mm_check_ref(c, &d, r);
    double tol = 1e-4 * maxabs(r, d.nout);
    near("matmul avx2 vs ref", f, r, d.nout, tol, 0);
    /* the split over threads changes nothing: each output has one owner */
    assert_memory_equal(f, o, d.nout * 4);
    for (size_t i = 0; i < N_ISA; i++) {
        if (!isas[i].c2)
            continue;
        /* the same integer sums and the same finish as AVX2, so the same bits */
        float *v = mm_run(isas[i].c2, c, &d), *v1 = mm_run(isas[i].c1, c, &d);
        if (have_avx2 && memcmp(v, f, d.nout * 4))
            fail_msg("matmul %s differs from avx2 (n_tok %u n_out %u k %u)", isas[i].env, c->n_tok, c->n_out, c->k);
        near("matmul fast isa vs ref", v, r, d.nout, tol, 0);
        assert_memory_equal(v, v1, d.nout * 4);
        free(v), free(v1);
    }
    free(r), free(f), free(o);
    mm_free(&d);
}

/* One case per kernel set past the reference: where this CPU and build run it,
 * an int8 matmul of a layer's shape on it (2 and 1 threads) meets the contract
 * and matches the reference; where they do not, the case is skipped, so the
 * closing line counts it as skipped rather than passed. */
static void test_kernel_set_runs_where_the_cpu_has_it(void **state)
{
    const struct isa_ctx *s = *state;
    struct dray_ctx *c2 = s->c2, *c1 = s->c1;
    if (!strcmp(s->env, "avx2"))
        c2 = have_avx2 ? cfast : NULL, c1 = cone;
    if (!c2) {
        print_message("kernel set %s: this CPU or build lacks it (dray devices -v names what is missing)\n",
                      s->env);
        skip();
    }
    dray_test_seed(5);
    struct mm_case c = {17, 64, 640, 3, 1, 2, 0, DRAY_I8};
    struct mm_data d;
    mm_make(&c, &d);
    float *r = mm_run(cref, &c, &d), *v = mm_run(c2, &c, &d), *v1 = mm_run(c1, &c, &d);
    mm_check_ref(&c, &d, v);
    near(s->env, v, r, d.nout, 1e-4 * maxabs(r, d.nout), 0);
    assert_memory_equal(v, v1, d.nout * 4);
    free(r), free(v), free(v1);
    mm_free(&d);
}

static void test_matmul_i8_matches_contract_and_reference(void **state)
{
    (void)state;
    dray_test_seed(11);
    static const uint32_t toks[] = {1, 3, 17, 64};
    static const uint32_t ks[] = {640, 95, 33, 1019, 7}; /* tails past the last 32: 31, 1, 27, 7 */
    static const uint32_t outs[] = {256, 37, 5, 2};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++) {
            struct mm_case c = {toks[a], outs[(a + b) % 4], ks[b], b % 3, (a + b) % 2, 0, b % 2, DRAY_I8};
            mm_case_run(&c);
        }
}

/* Prefill shapes for the tile kernels (AMX takes 16-row x 16-token tiles where
 * k is a multiple of 64 and leaves the edges to AVX-512 VNNI): whole and
 * partial tile pairs, row and token edges, outlier counts around the vector
 * finish's groups of 8 and past its 64-channel limit, accumulate. */
static void test_matmul_i8_tile_shapes_match_every_path(void **state)
{
    (void)state;
    dray_test_seed(15);
    static const struct mm_case cs[] = {
        {16, 16, 64, 0, 0, 0, 0, DRAY_I8},   {32, 32, 640, 1, 3, 16, 1, DRAY_I8},
        {47, 80, 128, 0, 0, 3, 0, DRAY_I8},  {100, 53, 256, 0, 1, 13, 1, DRAY_I8},
        {64, 48, 2048, 0, 0, 32, 0, DRAY_I8}, {20, 40, 192, 2, 0, 70, 1, DRAY_I8},
        {130, 24, 64, 0, 0, 8, 0, DRAY_I8},  {24, 96, 100, 0, 0, 5, 0, DRAY_I8},
    };
    for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++)
        mm_case_run(&cs[i]);
}

static void test_matmul_i8_outliers_are_excluded_and_added_in_f32(void **state)
{
    (void)state;
    dray_test_seed(12);
    struct mm_case c1 = {5, 40, 130, 3, 1, 3, 0, DRAY_I8};
    mm_case_run(&c1);
    struct mm_case c2 = {64, 64, 256, 0, 0, 8, 1, DRAY_I8};
    mm_case_run(&c2);
}

/* Extreme int8 values (w = -128 and 127, every q = +-127, k up to 65536): the
 * sums must stay exact on every path (AVX2's int16 pairs, VNNI's biased u8). */
static void test_matmul_i8_extreme_values_are_exact_on_every_path(void **state)
{
    (void)state;
    static const uint32_t ks[] = {65536, 4099};
    for (size_t kc = 0; kc < 2; kc++) {
        struct mm_case c = {7, 6, ks[kc], 0, 0, 0, 0, DRAY_I8};
        struct mm_data d;
        dray_test_seed(14);
        mm_make(&c, &d);
        for (size_t i = 0; i < d.nx; i++)
            d.x[i] = (i / 3) % 2 ? -1.0f : 1.0f; /* q = +-127 */
        for (size_t i = 0; i < (size_t)c.n_out * c.k; i++)
            d.w[i] = (int8_t)((i % 5 == 0) ? 127 : -128); /* row sums far from 0 */
        float *r = mm_run(cref, &c, &d);
        mm_check_ref(&c, &d, r);
        struct dray_ctx *cs[2 + 2 * N_ISA] = {cfast, cone};
        for (size_t i = 0; i < N_ISA; i++)
            cs[2 + 2 * i] = isas[i].c2, cs[3 + 2 * i] = isas[i].c1;
        for (size_t i = 0; i < 2 + 2 * N_ISA; i++) {
            if (!cs[i])
                continue;
            float *f = mm_run(cs[i], &c, &d);
            /* no outliers, no accumulate: isum * sx * ws, the same float ops everywhere */
            assert_memory_equal(f, r, d.nout * 4);
            free(f);
        }
        free(r);
        mm_free(&d);
    }
}

static void test_cpu_isa_override_names_the_kernels_and_rejects_unknown(void **state)
{
    (void)state;
    struct dray_device_props p;
    struct dray_ctx *c = NULL;
    char err[256] = "";
    struct dray_open_options o = {.size = sizeof(o), .n_threads = 1};
    setenv("DRAY_CPU_ISA", "reference", 1);
    assert_int_equal(ops->device_props(0, &p), 0);
    assert_non_null(strstr(p.name, "(scalar)"));
    assert_true(p.flags & DRAY_DEV_REFERENCE);
    setenv("DRAY_CPU_ISA", "avx2", 1);
    assert_int_equal(ops->device_props(0, &p), 0);
    assert_non_null(strstr(p.name, have_avx2 ? "(avx2+fma)" : "(scalar)"));
    /* A set the CPU lacks (AMX also where the kernel refuses the tile state):
     * the default set, and open still succeeds (a warning says why) */
    struct dray_device_props pd;
    unsetenv("DRAY_CPU_ISA");
    assert_int_equal(ops->device_props(0, &pd), 0);
    for (size_t i = 0; i < N_ISA; i++) {
        setenv("DRAY_CPU_ISA", isas[i].env, 1);
        assert_int_equal(ops->device_props(0, &p), 0);
        if (!isas[i].c2)
            assert_string_equal(p.name, pd.name);
        else
            assert_non_null(strstr(p.name, isas[i].tag));
        assert_int_equal(ops->open(0, &o, &c, err, sizeof(err)), 0);
        ops->close(c);
        c = NULL;
    }
    setenv("DRAY_CPU_ISA", "avx512", 1);
    int rc = ops->open(0, &o, &c, err, sizeof(err));
    unsetenv("DRAY_CPU_ISA");
    assert_int_equal(rc, DRAY_EINVAL);
    assert_null(c);
    assert_non_null(strstr(err, "DRAY_CPU_ISA=avx512"));
    /* the default is the best set the CPU has, AMX excepted (opt-in) */
    assert_int_equal(ops->device_props(0, &p), 0);
    const char *best = NULL;
    for (size_t i = 0; i < N_ISA; i++)
        if (isas[i].c2 && strcmp(isas[i].env, "amx") != 0)
            best = isas[i].tag;
    if (best)
        assert_non_null(strstr(p.name, best));
    else if (have_avx2)
        assert_non_null(strstr(p.name, "(avx2+fma)"));
}

/* ------------------------------------------------------------ grouped, two passes */

/* Packed weights (ABI v3) with random codes (any byte: 8-bit codes, two
 * nibbles, or two nibbles and any high bits), positive scales and signed mins,
 * in f32 or f16 as the format says, and W[o][i] computed from backend.h's
 * layout-neutral definition to check against. */
struct gm_case {
    uint32_t n_tok, n_out, k, pad_x, pad_out, accumulate;
    struct dray_wformat f;
};

struct gm_data {
    float *x, *out0;
    uint8_t *codes;
    void *dv, *mv;
    uint8_t *sub; /* two-level formats: the sub-scales, else NULL */
    double *W; /* [n_out][k] */
    size_t nx, nout;
    uint32_t sx, so;
};

static void gm_make(const struct gm_case *c, struct gm_data *d)
{
    uint32_t G = c->k / 32;
    size_t groups = (size_t)c->n_out * G, sb = dray_util_wformat_scale_bytes(c->f);
    d->sx = c->k + c->pad_x, d->so = c->n_out + c->pad_out;
    d->nx = (size_t)c->n_tok * d->sx, d->nout = (size_t)c->n_tok * d->so;
    d->x = randv(d->nx, -2, 2);
    for (uint32_t t = 0; t < c->n_tok; t++) /* a loud channel in some groups: what groups are for */
        for (uint32_t g = 0; g < G; g += 3)
            d->x[(size_t)t * d->sx + 32 * g + dray_test_rand() % 32] *= 40.0f;
    d->codes = (uint8_t *)randq(groups * dray_util_wformat_group_bytes(c->f));
    /* two levels: a super-scale per 256 inputs (d, and m with a min), sub-scales
     * 0..63 (4/5 bits, (s, n) per group) or any int8 (6 bits, one per 16) */
    size_t scales = (size_t)c->n_out * dray_util_wformat_scales_per_row(c->f, c->k);
    size_t subs = (size_t)c->n_out * dray_util_wformat_sub_bytes(c->f, c->k);
    d->sub = subs ? (uint8_t *)randq(subs) : NULL;
    for (size_t i = 0; i < subs && c->f.bits != 6; i++)
        d->sub[i] &= 63;
    float top = c->f.super ? (c->f.bits == 6 ? 0.0004f : 0.0008f) : 0.05f;
    d->dv = malloc(scales * sb);
    d->mv = c->f.has_min ? malloc(scales * sb) : NULL;
    for (size_t i = 0; i < scales; i++) {
        float dd = dray_test_randf(top / 50, top), mm = c->f.super ? dray_test_randf(0.0f, 0.004f)
                                                                    : dray_test_randf(-0.2f, 0.2f);
        if (sb == 2) {
            ((uint16_t *)d->dv)[i] = dray_util_f32_to_f16(dd);
            if (d->mv)
                ((uint16_t *)d->mv)[i] = dray_util_f32_to_f16(mm);
        } else {
            ((float *)d->dv)[i] = dd;
            if (d->mv)
                ((float *)d->mv)[i] = mm;
        }
    }
    d->out0 = randv(d->nout, -1, 1);
    d->W = malloc((size_t)c->n_out * c->k * sizeof(double));
    float *row = malloc(c->k * sizeof(float));
    for (uint32_t o = 0; o < c->n_out; o++) {
        dray_util_packed_row(c->f, c->k, d->codes, d->dv, d->mv, d->sub, o, row);
        for (uint32_t i = 0; i < c->k; i++)
            d->W[(size_t)o * c->k + i] = row[i];
    }
    free(row);
}

static void gm_free(struct gm_data *d)
{
    free(d->x), free(d->codes), free(d->dv), free(d->mv), free(d->sub), free(d->out0), free(d->W);
}

static float *gm_run(struct dray_ctx *ctx, const struct gm_case *c, const struct gm_data *d, uint32_t passes)
{
    struct dray_weight_desc wd = {.size = sizeof(wd), .format = c->f, .n_out = c->n_out, .k = c->k,
                                  .uses = DRAY_WUSE_MATMUL, .codes = d->codes, .d = d->dv, .m = d->mv,
                                  .sub = d->sub};
    struct dray_packed *pk = NULL;
    uint64_t bytes = 0;
    int rc = ops->weight_create(ctx, &wd, &pk, &bytes);
    if (rc)
        fail_msg("weight_create q%u: %d %s", c->f.bits, rc, ops->last_error(ctx));
    struct dray_buf *bx = up(ctx, d->x, d->nx * 4), *bo = up(ctx, d->out0, d->nout * 4);
    struct dray_matmul_args a = {.x = V(bx), .out = V(bo), .n_tok = c->n_tok, .n_out = c->n_out, .k = c->k,
                                 .stride_x = d->sx, .stride_out = d->so, .accumulate = c->accumulate,
                                 .wdtype = DRAY_PACKED, .packed = pk, .passes = passes};
    rc = ops->matmul(ctx, &a);
    if (rc)
        fail_msg("matmul q%u passes %u: %d %s", c->f.bits, passes, rc, ops->last_error(ctx));
    float *out = malloc(d->nout * 4);
    down(ctx, bo, out, d->nout * 4);
    ops->free(ctx, bx), ops->free(ctx, bo);
    ops->weight_free(ctx, pk);
    return out;
}

/* out against x.W in double: one pass must stay within its rounding bound
 * sum |W| sx/2, two passes within sum |W| sx/508 (the residual is at most
 * sx/2, so its step is at most sx/254), both plus f32 rounding. Returns the
 * RMS error of two passes over that of one pass. */
static double gm_check(const struct gm_case *c, const struct gm_data *d, const float *one, const float *two)
{
    uint32_t G = c->k / 32;
    double ss1 = 0, ss2 = 0;
    for (uint32_t t = 0; t < c->n_tok; t++) {
        const float *x = d->x + (size_t)t * d->sx;
        for (uint32_t o = 0; o < c->n_out; o++) {
            const double *W = d->W + (size_t)o * c->k;
            double exact = 0, b1 = 0, b2 = 0, mag = 0;
            for (uint32_t g = 0; g < G; g++) {
                double amax = 0, wsum = 0;
                for (uint32_t i = 32 * g; i < 32 * g + 32; i++) {
                    amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
                    wsum += fabs(W[i]);
                    exact += x[i] * W[i];
                    mag += fabs(x[i] * W[i]);
                }
                b1 += wsum * amax / 127 / 2;
                b2 += wsum * amax / 127 / 508;
            }
            size_t at = (size_t)t * d->so + o;
            double base = c->accumulate ? d->out0[at] : 0, noise = 1e-6 * (mag + fabs(base));
            double e1 = fabs(one[at] - base - exact), e2 = fabs(two[at] - base - exact);
            if (e1 > b1 * 1.001 + noise)
                fail_msg("one pass t %u o %u: off by %.3g, bound %.3g (got %g want %g)", t, o, e1, b1, one[at], base + exact);
            if (e2 > b2 * 1.001 + noise)
                fail_msg("two passes t %u o %u: off by %.3g, bound %.3g (one pass: %.3g)", t, o, e2, b2, e1);
            ss1 += e1 * e1, ss2 += e2 * e2;
        }
        for (uint32_t o = c->n_out; o < d->so; o++) /* row padding untouched */
            assert_true(two[(size_t)t * d->so + o] == d->out0[(size_t)t * d->so + o]);
    }
    return ss1 > 0 ? sqrt(ss2 / ss1) : 0;
}

/* backend.h, packed weights and two-pass activations: every format the CPU
 * declares, one pass and two (the residual of the first pass by the same
 * rule). Every kernel set and thread count meets the bound, the fast ones
 * match the reference within the op's tolerance and are independent of the
 * thread count, and shapes cover decode (1 token), an odd token count,
 * token-split tiles (few rows, many tokens) and accumulation. */
static void test_matmul_grouped_two_pass_is_closer_to_f32_on_every_path(void **state)
{
    (void)state;
    dray_test_seed(31);
#define q4 {4, 0, 1, 0}
#define q4z {4, 0, 0, 0}
#define q4h {4, 1, 1, 0}
#define q4hz {4, 1, 0, 0}
#define q5 {5, 1, 1, 0}
#define q5z {5, 1, 0, 0}
#define q8 {8, 0, 0, 0}
#define q8h {8, 1, 0, 0}
#define k4 {4, 1, 1, 1}
#define k5 {5, 1, 1, 1}
#define k6 {6, 1, 0, 1}
    static const struct gm_case cases[] = {
        /* two levels (ABI v4: GGUF's Q4_K, Q5_K, Q6_K) */
        {1, 64, 512, 0, 0, 0, k4},    {67, 32, 256, 1, 2, 1, k4},  {20, 7, 768, 2, 0, 1, k4},
        {1, 48, 2304, 3, 1, 1, k5},   {9, 160, 256, 0, 3, 0, k5},  {5, 32, 512, 1, 2, 0, k5},
        {1, 64, 512, 0, 0, 0, k6},    {67, 32, 256, 1, 2, 1, k6},  {20, 7, 768, 2, 0, 1, k6},
        {1, 48, 2304, 3, 1, 1, k6},
        {1, 64, 576, 0, 0, 0, q4},    {1, 48, 1536, 3, 1, 1, q8},  {5, 32, 96, 1, 2, 0, q8h},
        {67, 32, 64, 0, 0, 1, q4},    {130, 16, 32, 2, 0, 0, q8},  {9, 160, 320, 0, 3, 0, q4z},
        {1, 64, 640, 0, 0, 0, q5},    {1, 48, 1536, 3, 1, 1, q5},  {7, 32, 96, 1, 2, 1, q5z},
        {67, 32, 64, 0, 0, 0, q5},    {1, 64, 640, 0, 0, 0, q4h},  {1, 48, 1536, 3, 1, 1, q4hz},
        {7, 32, 96, 1, 2, 1, q4h},    {67, 32, 64, 0, 0, 0, q4h},
        /* rows that end inside a 16-row block: computed whole, kept in part */
        {3, 40, 96, 1, 2, 1, q4},     {1, 257, 64, 0, 1, 0, q8h},  {20, 7, 640, 2, 0, 1, q5},
    };
#undef q4
#undef q4z
#undef q4h
#undef q4hz
#undef q5
#undef q5z
#undef q8
#undef q8h
#undef k4
#undef k5
#undef k6
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const struct gm_case *c = &cases[ci];
        struct gm_data d;
        gm_make(c, &d);
        float *r1 = gm_run(cref, c, &d, 1), *r2 = gm_run(cref, c, &d, 2);
        double ratio = gm_check(c, &d, r1, r2);
        /* the residual pass takes off two orders of magnitude (measured: RMS
         * 0.0033..0.0039 of one pass's error, about 1/254), not a few percent */
        if (ratio > 0.02)
            fail_msg("case %zu: two passes' RMS error is %.3g of one pass's", ci, ratio);
        double mag = 0; /* the op's tolerance: 1e-4 sum|x||W| (+ |out| accumulating) */
        for (size_t i = 0; i < d.nout; i++)
            mag = fabs(r2[i]) > mag ? fabs(r2[i]) : mag;
        struct dray_ctx *fast[2 + 2 * N_ISA] = {cfast, cone};
        for (size_t i = 0; i < N_ISA; i++)
            fast[2 + 2 * i] = isas[i].c2, fast[3 + 2 * i] = isas[i].c1;
        for (size_t i = 0; i < 2 + 2 * N_ISA; i += 2) {
            if (!fast[i])
                continue;
            float *f1 = gm_run(fast[i], c, &d, 1), *f2 = gm_run(fast[i], c, &d, 2);
            float *g2 = gm_run(fast[i + 1], c, &d, 2);
            gm_check(c, &d, f1, f2);
            near("one-pass fast vs ref", f1, r1, d.nout, 1e-5 * mag, 1e-5);
            near("two-pass fast vs ref", f2, r2, d.nout, 1e-5 * mag, 1e-5);
            assert_memory_equal(f2, g2, d.nout * 4); /* 2 threads = 1 thread */
            free(f1), free(f2), free(g2);
        }
        free(r1), free(r2);
        gm_free(&d);
    }
}

/* ABI v5, prepared layouts: a handle's exported bytes give back a handle
 * (used in place) whose matmul is bit for bit the original's; bytes of another
 * shape, a damaged header or a misaligned copy are refused by name. */
static void test_weight_export_import_round_trip_and_refusals(void **state)
{
    (void)state;
    dray_test_seed(5);
    struct gm_case c = {3, 40, 512, 0, 0, 0, {4, 1, 1, 1}};
    struct gm_data d;
    gm_make(&c, &d);
    struct dray_weight_desc wd = {.size = sizeof(wd), .format = c.f, .n_out = c.n_out, .k = c.k,
                                  .uses = DRAY_WUSE_MATMUL, .codes = d.codes, .d = d.dv, .m = d.mv, .sub = d.sub};
    struct dray_packed *pk = NULL, *back = NULL;
    uint64_t bytes = 0, n = 0, got = 0;
    assert_int_equal(ops->weight_create(cfast, &wd, &pk, &bytes), 0);
    assert_int_equal(ops->weight_export(cfast, pk, NULL, &n), 0);
    assert_true(n > bytes);
    uint8_t *blob = aligned_alloc(64, (n + 64 + 63) & ~(uint64_t)63);
    uint64_t small = n - 1;
    assert_int_equal(ops->weight_export(cfast, pk, blob, &small), DRAY_EINVAL);
    assert_int_equal(ops->weight_export(cfast, pk, blob, &n), 0);
    struct dray_weight_desc shape = {.size = sizeof(shape), .format = c.f, .n_out = c.n_out, .k = c.k,
                                     .uses = DRAY_WUSE_MATMUL};
    assert_int_equal(ops->weight_import(cfast, &shape, blob, n, &back, &got), 0);
    assert_int_equal(got, bytes);
    float *x = randv((size_t)c.n_tok * c.k, -1, 1), y0[3 * 40], y1[3 * 40];
    struct dray_buf *bx = up(cfast, x, (size_t)c.n_tok * c.k * 4), *bo = up(cfast, NULL, sizeof(y0));
    struct dray_matmul_args a = {.x = V(bx), .out = V(bo), .n_tok = c.n_tok, .n_out = c.n_out, .k = c.k,
                                 .stride_x = c.k, .stride_out = c.n_out, .wdtype = DRAY_PACKED, .packed = pk,
                                 .passes = 2};
    assert_int_equal(ops->matmul(cfast, &a), 0);
    down(cfast, bo, y0, sizeof(y0));
    a.packed = back;
    assert_int_equal(ops->matmul(cfast, &a), 0);
    down(cfast, bo, y1, sizeof(y1));
    assert_memory_equal(y0, y1, sizeof(y0));
    ops->weight_free(cfast, back);
    /* another shape, a damaged header, a misaligned copy */
    struct dray_packed *no = NULL;
    shape.n_out = 48;
    assert_int_equal(ops->weight_import(cfast, &shape, blob, n, &no, NULL), DRAY_EINVAL);
    assert_null(no);
    assert_non_null(strstr(ops->last_error(cfast), "not this plugin's export"));
    shape.n_out = c.n_out;
    blob[0] ^= 1;
    assert_int_equal(ops->weight_import(cfast, &shape, blob, n, &no, NULL), DRAY_EINVAL);
    blob[0] ^= 1;
    memmove(blob + 8, blob, n);
    assert_int_equal(ops->weight_import(cfast, &shape, blob + 8, n, &no, NULL), DRAY_EINVAL);
    assert_null(no);
    ops->free(cfast, bx), ops->free(cfast, bo);
    ops->weight_free(cfast, pk);
    free(blob), free(x);
    gm_free(&d);
}

static void test_matmul_f32_checking_path(void **state)
{
    (void)state;
    dray_test_seed(13);
    struct mm_case c1 = {3, 37, 100, 2, 1, 0, 0, DRAY_F32};
    mm_case_run(&c1);
    struct mm_case c2 = {17, 64, 640, 0, 0, 0, 1, DRAY_F32};
    mm_case_run(&c2);
}

static void test_matmul_rejects_bad_arguments(void **state)
{
    (void)state;
    struct dray_buf *b = up(cfast, NULL, 4096), *w = up(cfast, NULL, 1024), *s = up(cfast, NULL, 64);
    struct dray_matmul_args a = {.x = V(b), .w = V(w), .wscale = V(s), .out = {b, 2048}, .n_tok = 2,
                                 .n_out = 16, .k = 64, .stride_x = 64, .stride_out = 16, .wdtype = DRAY_I8};
    assert_int_equal(ops->matmul(cfast, &a), 0);
    a.out.offset = 256; /* overlaps x */
    assert_int_equal(ops->matmul(cfast, &a), DRAY_EINVAL);
    a.out.offset = 4096 - 64; /* out of bounds */
    assert_int_equal(ops->matmul(cfast, &a), DRAY_EINVAL);
    assert_non_null(strstr(ops->last_error(cfast), "exceeds"));
    a.out.offset = 2050; /* misaligned */
    assert_int_equal(ops->matmul(cfast, &a), DRAY_EINVAL);
    a.out.offset = 2048;
    a.w.buf = NULL;
    assert_int_equal(ops->matmul(cfast, &a), DRAY_EINVAL);
    a.w.buf = w;
    a.n_out = 65; /* w too small for 65 rows of 64 */
    assert_int_equal(ops->matmul(cfast, &a), DRAY_EINVAL);
    a.n_out = 16;
    a.stride_x = 10;
    assert_int_equal(ops->matmul(cfast, &a), DRAY_EINVAL);
    a.stride_x = 64;
    a.wdtype = DRAY_F16;
    assert_int_equal(ops->matmul(cfast, &a), DRAY_ENOTSUP);
    a.wdtype = DRAY_I8;
    a.n_outlier = 2;
    a.outlier_idx = V(s);
    a.outlier_w = V(b);
    int32_t bad[2] = {5, 5}; /* not strictly increasing */
    assert_int_equal(ops->upload(cfast, V(s), bad, 8), 0);
    assert_int_equal(ops->matmul(cfast, &a), DRAY_EINVAL);
    ops->free(cfast, b), ops->free(cfast, w), ops->free(cfast, s);
}

/* ------------------------------------------------------------ embed */

/* Packed tables (ABI v3): every embed format the CPU declares gathers
 * W[id] * scale as backend.h defines W, on every kernel set; a handle made for
 * matmul only is refused by embed, and weight_create refuses what the CPU does
 * not take (5-bit f32 scales) or what is no format at all, and goes on
 * working. */
static void test_embed_packed_tables_and_weight_create_refusals(void **state)
{
    (void)state;
    dray_test_seed(41);
    enum { ROWS = 48, K = 96, G = K / 32, NT = 5 };
    const struct dray_wformat fs[] = {{4, 0, 1, 0}, {4, 0, 0, 0}, {4, 1, 1, 0}, {4, 1, 0, 0}, {8, 0, 0, 0}, {8, 1, 0, 0}};
    int32_t ids[NT] = {0, 47, 3, 3, 20};
    for (size_t fi = 0; fi < sizeof(fs) / sizeof(fs[0]); fi++) {
        struct gm_case c = {1, ROWS, K, 0, 0, 0, fs[fi]};
        struct gm_data d;
        gm_make(&c, &d);
        struct dray_weight_desc wd = {.size = sizeof(wd), .format = c.f, .n_out = ROWS, .k = K,
                                      .uses = DRAY_WUSE_EMBED | DRAY_WUSE_MATMUL, .codes = d.codes, .d = d.dv,
                                      .m = d.mv};
        struct dray_ctx *ctxs[] = {cref, cfast};
        for (int ci = 0; ci < 2; ci++) {
            struct dray_packed *pk = NULL;
            assert_int_equal(ops->weight_create(ctxs[ci], &wd, &pk, NULL), 0);
            struct dray_buf *bi = up(ctxs[ci], ids, sizeof(ids)), *bo = up(ctxs[ci], NULL, NT * K * 4);
            struct dray_embed_args a = {.ids = V(bi), .out = V(bo), .dtype = DRAY_PACKED, .n_tok = NT, .dim = K,
                                        .n_rows = ROWS, .scale = 25.3f, .packed = pk};
            assert_int_equal(ops->embed(ctxs[ci], &a), 0);
            float got[NT * K];
            down(ctxs[ci], bo, got, sizeof(got));
            for (int t = 0; t < NT; t++)
                for (int i = 0; i < K; i++) {
                    double want = d.W[(size_t)ids[t] * K + i] * 25.3f;
                    if (fabs(got[t * K + i] - want) > 1e-6 * fabs(want) + 1e-30)
                        fail_msg("q%u scale %u min %u t %d i %d: %g vs %g", c.f.bits, c.f.scale, c.f.has_min, t,
                                 i, (double)got[t * K + i], want);
                }
            ops->free(ctxs[ci], bi), ops->free(ctxs[ci], bo);
            ops->weight_free(ctxs[ci], pk);
        }
        gm_free(&d);
    }
    /* refusals: each names what, and the context goes on */
    struct gm_case c = {1, ROWS, K, 0, 0, 0, {5, 0, 1, 0}};
    struct gm_data d;
    gm_make(&c, &d);
    struct dray_weight_desc wd = {.size = sizeof(wd), .format = c.f, .n_out = ROWS, .k = K,
                                  .uses = DRAY_WUSE_MATMUL, .codes = d.codes, .d = d.dv, .m = d.mv};
    struct dray_packed *pk = (struct dray_packed *)&wd;
    assert_int_equal(ops->weight_create(cfast, &wd, &pk, NULL), DRAY_ENOTSUP);
    assert_null(pk);
    assert_non_null(strstr(ops->last_error(cfast), "q5 f32"));
    wd.format.bits = 6;
    assert_int_equal(ops->weight_create(cfast, &wd, &pk, NULL), DRAY_EINVAL);
    wd.format = (struct dray_wformat){4, 0, 1, 0};
    uint64_t bytes = 0;
    assert_int_equal(ops->weight_create(cfast, &wd, &pk, &bytes), 0);
    assert_int_equal(bytes, ROWS * G * (16 + 8)); /* 4-bit codes and f32 d and m */
    struct dray_buf *b = up(cfast, NULL, 4096);
    struct dray_embed_args e = {.ids = V(b), .out = {b, 1024}, .dtype = DRAY_PACKED, .n_tok = 1, .dim = K,
                                .n_rows = ROWS, .scale = 1, .packed = pk};
    assert_int_equal(ops->embed(cfast, &e), DRAY_EINVAL); /* made for matmul only */
    struct dray_matmul_args m = {.x = V(b), .out = {b, 1024}, .n_tok = 1, .n_out = ROWS + 16, .k = K, .stride_x = K,
                                 .stride_out = ROWS + 16, .wdtype = DRAY_PACKED, .packed = pk, .passes = 1};
    assert_int_equal(ops->matmul(cfast, &m), DRAY_EINVAL); /* not the handle's shape */
    m.n_out = m.stride_out = ROWS;
    assert_int_equal(ops->matmul(cfast, &m), 0);
    m.passes = 3;
    assert_int_equal(ops->matmul(cfast, &m), DRAY_EINVAL);
    ops->free(cfast, b);
    ops->weight_free(cfast, pk);
    ops->weight_free(cfast, NULL);
    gm_free(&d);
}

static void test_embed_gathers_scaled_rows_and_rejects_bad_ids(void **state)
{
    (void)state;
    dray_test_seed(21);
    uint32_t n_rows = 50, dim = 37, n_tok = 6;
    int8_t *tq = randq(n_rows * dim);
    float *tf = randv(n_rows * dim, -1, 1), *rs = randv(n_rows, 0.01f, 0.1f);
    int32_t ids[6] = {0, 49, 7, 7, 3, 20};
    for (int dt = 0; dt < 2; dt++) {
        float *res[2];
        struct dray_ctx *cs[2] = {cref, cfast};
        for (int ci = 0; ci < 2; ci++) {
            struct dray_ctx *c = cs[ci];
            struct dray_buf *bi = up(c, ids, sizeof(ids)), *bo = up(c, NULL, n_tok * dim * 4);
            struct dray_buf *bt = dt ? up(c, tf, n_rows * dim * 4) : up(c, tq, n_rows * dim);
            struct dray_buf *br = up(c, rs, n_rows * 4);
            struct dray_embed_args a = {V(bi), V(bt), V(br), V(bo), dt ? DRAY_F32 : DRAY_I8, n_tok, dim, n_rows, 25.3f, NULL};
            assert_int_equal(ops->embed(c, &a), 0);
            res[ci] = malloc(n_tok * dim * 4);
            down(c, bo, res[ci], n_tok * dim * 4);
            int32_t bad = 50;
            assert_int_equal(ops->upload(c, V(bi), &bad, 4), 0);
            assert_int_equal(ops->embed(c, &a), DRAY_EINVAL);
            ops->free(c, bi), ops->free(c, bo), ops->free(c, bt), ops->free(c, br);
        }
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t i = 0; i < dim; i++) {
                size_t e = (size_t)ids[t] * dim + i;
                double want = dt ? tf[e] * 25.3 : tq[e] * (double)rs[ids[t]] * 25.3;
                assert_true(fabs(res[0][t * dim + i] - want) <= 1e-6 * fabs(want) + 1e-12);
            }
        near("embed avx2 vs ref", res[1], res[0], n_tok * dim, 0, dt ? 0 : 1e-6);
        free(res[0]), free(res[1]);
    }
    free(tq), free(tf), free(rs);
}

/* ------------------------------------------------------------ rmsnorm */

static void test_rmsnorm_plain_per_head_and_in_place(void **state)
{
    (void)state;
    dray_test_seed(31);
    uint32_t n_tok = 5, n_head = 3, n = 67, stride = n_head * n + 5;
    float *x = randv(n_tok * stride, -3, 3), *w = randv(n, 0.5f, 1.5f);
    for (int inplace = 0; inplace < 2; inplace++) {
        float *res[2];
        struct dray_ctx *cs[2] = {cref, cfast};
        for (int ci = 0; ci < 2; ci++) {
            struct dray_ctx *c = cs[ci];
            struct dray_buf *bx = up(c, x, n_tok * stride * 4), *bw = up(c, w, n * 4);
            struct dray_buf *bo = inplace ? bx : up(c, NULL, n_tok * stride * 4);
            struct dray_rmsnorm_args a = {V(bx), V(bw), V(bo), n_tok, n_head, n, stride, stride, 1e-6f};
            assert_int_equal(ops->rmsnorm(c, &a), 0);
            res[ci] = malloc(n_tok * stride * 4);
            down(c, bo, res[ci], n_tok * stride * 4);
            a.out.offset = 4; /* partial overlap is refused */
            if (inplace)
                assert_int_equal(ops->rmsnorm(c, &a), DRAY_EINVAL);
            ops->free(c, bx), ops->free(c, bw);
            if (!inplace)
                ops->free(c, bo);
        }
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t h = 0; h < n_head; h++) {
                const float *xr = x + t * stride + h * n;
                double ss = 0;
                for (uint32_t i = 0; i < n; i++)
                    ss += (double)xr[i] * xr[i];
                double inv = 1.0 / sqrt(ss / n + 1e-6);
                for (uint32_t i = 0; i < n; i++) {
                    double want = xr[i] * inv * w[i];
                    size_t e = t * stride + h * n + i;
                    assert_true(fabs(res[0][e] - want) <= 1e-5 * fabs(want) + 1e-7);
                    assert_true(fabs(res[1][e] - want) <= 1e-5 * fabs(want) + 1e-7);
                }
            }
        free(res[0]), free(res[1]);
    }
    free(x), free(w);
}

/* ------------------------------------------------------------ rope */

static void test_rope_matches_the_formula_at_long_positions(void **state)
{
    (void)state;
    dray_test_seed(41);
    uint32_t n_tok = 7, n_head = 3, hd = 40, n_rot = 32, stride = n_head * hd + 3;
    int32_t pos[7] = {0, 1, 17, 511, 4096, 100000, 131071};
    float *x = randv(n_tok * stride, -2, 2);
    float *res[2];
    struct dray_ctx *cs[2] = {cref, cfast};
    for (int ci = 0; ci < 2; ci++) {
        struct dray_buf *bx = up(cs[ci], x, n_tok * stride * 4), *bp = up(cs[ci], pos, sizeof(pos));
        struct dray_rope_args a = {V(bx), V(bp), n_tok, n_head, hd, n_rot, stride, 1000000.0f, 0.25f, {NULL, 0}, 0.0f};
        assert_int_equal(ops->rope(cs[ci], &a), 0);
        res[ci] = malloc(n_tok * stride * 4);
        down(cs[ci], bx, res[ci], n_tok * stride * 4);
        a.n_rot = 41;
        assert_int_equal(ops->rope(cs[ci], &a), DRAY_EINVAL);
        ops->free(cs[ci], bx), ops->free(cs[ci], bp);
    }
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t h = 0; h < n_head; h++)
            for (uint32_t i = 0; i < hd; i++) {
                size_t b = t * stride + h * hd;
                double want;
                if (i >= n_rot) {
                    want = x[b + i];
                } else {
                    uint32_t j = i % (n_rot / 2);
                    double th = pos[t] * 0.25 * pow(1000000.0, -2.0 * j / n_rot);
                    double x0 = x[b + j], x1 = x[b + j + n_rot / 2];
                    want = i < n_rot / 2 ? x0 * cos(th) - x1 * sin(th) : x0 * sin(th) + x1 * cos(th);
                }
                assert_true(fabs(res[0][b + i] - want) <= 1e-4);
                assert_true(fabs(res[1][b + i] - want) <= 1e-4);
            }
    free(res[0]), free(res[1]), free(x);
}

/* Largest distance from the formula of a rope of random x at pos (already on
 * bp, n_tok of them) with base, freq_scale and n_rot over 2 heads of 40; v4:
 * frequency factors bf (holding ff, NULL: none) and attn_factor af. The
 * elements past n_rot must come back untouched. */
static double rope_error_v4(struct dray_ctx *c, struct dray_buf *bp, const int32_t *pos, uint32_t n_tok,
                            uint32_t n_rot, float base, float fs, struct dray_buf *bf, const float *ff, float af)
{
    uint32_t hd = 40, n = n_tok * 2 * hd;
    float *x = randv(n, -2, 2), *y = malloc(n * 4);
    struct dray_buf *bx = up(c, x, n * 4);
    struct dray_rope_args a = {V(bx), V(bp), n_tok, 2, hd, n_rot, 2 * hd, base, fs, {bf, 0}, af};
    assert_int_equal(ops->rope(c, &a), 0);
    down(c, bx, y, n * 4);
    double worst = 0, ms = af == 0.0f ? 1.0 : af;
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t h = 0; h < 2; h++)
            for (uint32_t i = 0; i < hd; i++) {
                size_t b = (t * 2 + h) * hd;
                uint32_t j = i % (n_rot / 2 ? n_rot / 2 : 1);
                double th = pos[t] * (double)fs * pow(base, -2.0 * j / n_rot) / (ff ? ff[j] : 1.0);
                double x0 = x[b + j], x1 = x[b + j + n_rot / 2];
                double want = i >= n_rot       ? x[b + i]
                              : i < n_rot / 2 ? ms * (x0 * cos(th) - x1 * sin(th))
                                              : ms * (x0 * sin(th) + x1 * cos(th));
                worst = fmax(worst, fabs(y[b + i] - want) / fmax(1.0, ms));
            }
    ops->free(c, bx);
    free(x), free(y);
    return worst;
}

static double rope_error(struct dray_ctx *c, struct dray_buf *bp, const int32_t *pos, uint32_t n_tok,
                         uint32_t n_rot, float base, float fs)
{
    return rope_error_v4(c, bp, pos, n_tok, n_rot, base, fs, NULL, NULL, 0.0f);
}

/* v4: per-pair frequency divisors (Llama 3's rope_freqs: 1 for the fast
 * pairs, up to 8 for the slow ones, a blend between) and a magnitude factor
 * (YaRN's mscale), on every kernel set, at long positions and with a partial
 * n_rot; the kept angle tables follow the factors' values (the same buffer
 * rewritten) and the factor; freq_factors too short, or a negative
 * attn_factor, are refused. */
static void test_rope_freq_factors_and_attn_factor(void **state)
{
    (void)state;
    dray_test_seed(44);
    int32_t pos[5] = {0, 3, 1000, 30000, 131071};
    float ff[16], ff2[16];
    for (int i = 0; i < 16; i++) {
        ff[i] = i < 5 ? 1.0f : i > 11 ? 8.0f : 1.0f + 7.0f * (float)(i - 5) / 7.0f;
        ff2[i] = 1.0f + 0.37f * (float)i;
    }
    struct dray_ctx *cs[2 + N_ISA] = {cref, cfast};
    for (size_t i = 0; i < N_ISA; i++)
        cs[2 + i] = isas[i].c2;
    for (size_t ci = 0; ci < 2 + N_ISA; ci++) {
        struct dray_ctx *c = cs[ci];
        if (!c)
            continue;
        struct dray_buf *bp = up(c, pos, sizeof(pos)), *bf = up(c, ff, sizeof(ff));
        assert_true(rope_error_v4(c, bp, pos, 5, 32, 500000.0f, 1.0f, bf, ff, 0.0f) <= 1e-4);
        assert_true(rope_error_v4(c, bp, pos, 5, 32, 500000.0f, 1.0f, bf, ff, 1.3466f) <= 1e-4);
        assert_true(rope_error_v4(c, bp, pos, 5, 32, 10000.0f, 0.25f, NULL, NULL, 0.7f) <= 1e-4);
        assert_true(rope_error_v4(c, bp, pos, 5, 24, 10000.0f, 1.0f, bf, ff, 1.1f) <= 1e-4); /* partial */
        /* the same buffer, other factors: as a host that reuses it */
        assert_int_equal(ops->upload(c, (struct dray_view){bf, 0}, ff2, sizeof(ff2)), 0);
        assert_true(rope_error_v4(c, bp, pos, 5, 32, 500000.0f, 1.0f, bf, ff2, 1.3466f) <= 1e-4);
        assert_true(rope_error_v4(c, bp, pos, 5, 32, 500000.0f, 1.0f, NULL, NULL, 1.3466f) <= 1e-4);
        assert_true(rope_error_v4(c, bp, pos, 5, 32, 500000.0f, 1.0f, NULL, NULL, 0.0f) <= 1e-4);
        /* refusals */
        struct dray_buf *bx = up(c, NULL, 5 * 80 * 4), *small = up(c, ff, 8);
        struct dray_rope_args a = {V(bx), V(bp), 5, 2, 40, 32, 80, 10000.0f, 1.0f, V(small), 0.0f};
        assert_int_equal(ops->rope(c, &a), DRAY_EINVAL);
        assert_non_null(strstr(ops->last_error(c), "freq_factors"));
        a.freq_factors = V(bf);
        a.attn_factor = -1.0f;
        assert_int_equal(ops->rope(c, &a), DRAY_EINVAL);
        ops->free(c, bx), ops->free(c, small), ops->free(c, bp), ops->free(c, bf);
    }
}

/* The CPU plugin keeps the angles of the last positions it rotated for the
 * next layers of a step: a call with other positions (in the same buffer),
 * another base, scale, rotated width or token count gets its own. */
static void test_rope_angles_kept_between_calls_follow_their_inputs(void **state)
{
    (void)state;
    dray_test_seed(43);
    int32_t pos[6] = {0, 5, 9, 700, 4000, 90000};
    struct dray_buf *bp = up(cfast, pos, sizeof(pos));
    struct { uint32_t n_tok, n_rot; float base, fs; } run[] = {
        {6, 32, 10000.0f, 1.0f}, {6, 32, 10000.0f, 1.0f}, {6, 32, 1000000.0f, 1.0f}, {6, 32, 10000.0f, 0.5f},
        {6, 16, 10000.0f, 1.0f}, {4, 32, 10000.0f, 1.0f}, {6, 32, 10000.0f, 1.0f}, {6, 32, 1000000.0f, 1.0f},
    };
    for (size_t r = 0; r < sizeof(run) / sizeof(run[0]); r++)
        assert_true(rope_error(cfast, bp, pos, run[r].n_tok, run[r].n_rot, run[r].base, run[r].fs) <= 1e-4);
    for (int k = 0; k < 3; k++) { /* the same buffer, new positions: as after the next step's upload */
        for (int t = 0; t < 6; t++)
            pos[t] += 1 + k;
        struct dray_view v = {bp, 0};
        assert_int_equal(ops->upload(cfast, v, pos, sizeof(pos)), 0);
        assert_true(rope_error(cfast, bp, pos, 6, 32, 10000.0f, 1.0f) <= 1e-4);
        assert_true(rope_error(cfast, bp, pos, 6, 32, 1000000.0f, 1.0f) <= 1e-4);
    }
    ops->free(cfast, bp);
}

/* ------------------------------------------------------------ gated act, add */

static void test_gated_act_gelu_and_silu_with_aliasing(void **state)
{
    (void)state;
    dray_test_seed(51);
    uint32_t n_tok = 4, n = 75, sg = 80, su = 77;
    float *g = randv(n_tok * sg, -9, 9), *u = randv(n_tok * su, -2, 2);
    for (uint32_t act = 0; act < 2; act++)
        for (int alias = 0; alias < 3; alias++) { /* 0: own out, 1: out = gate, 2: out = up */
            float *res[2];
            struct dray_ctx *cs[2] = {cref, cfast};
            uint32_t so = alias == 1 ? sg : alias == 2 ? su : n + 1;
            for (int ci = 0; ci < 2; ci++) {
                struct dray_ctx *c = cs[ci];
                struct dray_buf *bg = up(c, g, n_tok * sg * 4), *bu = up(c, u, n_tok * su * 4);
                struct dray_buf *bo = alias == 1 ? bg : alias == 2 ? bu : up(c, NULL, n_tok * so * 4);
                struct dray_gated_act_args a = {V(bg), V(bu), V(bo), n_tok, n, sg, su, so, act};
                assert_int_equal(ops->gated_act(c, &a), 0);
                res[ci] = malloc(n_tok * so * 4);
                down(c, bo, res[ci], n_tok * so * 4);
                ops->free(c, bg), ops->free(c, bu);
                if (!alias)
                    ops->free(c, bo);
            }
            for (uint32_t t = 0; t < n_tok; t++)
                for (uint32_t i = 0; i < n; i++) {
                    double x = g[t * sg + i], y = u[t * su + i];
                    double a = act ? x / (1 + exp(-x)) : 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
                    double want = a * y;
                    for (int ci = 0; ci < 2; ci++)
                        if (!(fabs(res[ci][t * so + i] - want) <= 1e-5 * fabs(want) + 1e-6))
                            fail_msg("gated_act act %u alias %d ctx %d: %.9g vs %.9g", act, alias, ci,
                                     res[ci][t * so + i], want);
                }
            free(res[0]), free(res[1]);
        }
    free(g), free(u);
}

static void test_add_is_exact_and_allows_exact_aliasing(void **state)
{
    (void)state;
    dray_test_seed(61);
    size_t n = 5000;
    float *a = randv(n, -1, 1), *b = randv(n, -1, 1), *r = malloc(n * 4);
    struct dray_buf *ba = up(cfast, a, n * 4), *bb = up(cfast, b, n * 4);
    struct dray_add_args args = {V(ba), V(bb), V(ba), n};
    assert_int_equal(ops->add(cfast, &args), 0);
    down(cfast, ba, r, n * 4);
    for (size_t i = 0; i < n; i++)
        assert_true(r[i] == a[i] + b[i]);
    args.out.offset = 8;
    assert_int_equal(ops->add(cfast, &args), DRAY_EINVAL);
    args.out = V(bb);
    args.n = n + 1;
    assert_int_equal(ops->add(cfast, &args), DRAY_EINVAL);
    ops->free(cfast, ba), ops->free(cfast, bb);
    free(a), free(b), free(r);
}

/* ------------------------------------------------------------ KV store */

static void test_kv_store_quantizes_per_head_and_skips_padding(void **state)
{
    (void)state;
    dray_test_seed(71);
    uint32_t n_kv = 2, hd = 24, bs = 4, n_slots = 16, n_tok = 5, stride = n_kv * hd + 2;
    int32_t slots[5] = {3, -1, 8, 15, 0};
    float *k = randv(n_tok * stride, -3, 3), *v = randv(n_tok * stride, -3, 3);
    memset(k + 4 * stride, 0, hd * 4); /* an all-zero head stores scale 0 */
    for (int dt = 0; dt < 2; dt++) {
        struct dray_ctx *c = dt ? cfast : cref;
        uint32_t dtype = dt ? DRAY_F16 : DRAY_I8;
        size_t el = dt ? 2 : 1, nb = (size_t)n_slots * n_kv * hd * el;
        struct dray_buf *pk = up(c, NULL, nb), *pv = up(c, NULL, nb), *ks = up(c, NULL, n_slots * n_kv * 4),
                        *vs = up(c, NULL, n_slots * n_kv * 4);
        assert_int_equal(ops->fill(c, V(pk), 0x5a5a5a5a, nb), 0);
        struct dray_kv_pool pool = {V(pk), V(pv), V(ks), V(vs), dtype, n_kv, hd, bs, n_slots};
        struct dray_buf *bk = up(c, k, n_tok * stride * 4), *bv = up(c, v, n_tok * stride * 4),
                        *bsl = up(c, slots, sizeof(slots));
        struct dray_kv_store_args a = {V(bk), V(bv), V(bsl), &pool, n_tok, stride, stride};
        assert_int_equal(ops->kv_store(c, &a), 0);
        uint8_t *kq = malloc(nb);
        float *ksc = malloc(n_slots * n_kv * 4);
        down(c, pk, kq, nb);
        down(c, ks, ksc, n_slots * n_kv * 4);
        for (uint32_t t = 0; t < n_tok; t++) {
            if (slots[t] < 0)
                continue;
            for (uint32_t h = 0; h < n_kv; h++) {
                const float *src = k + t * stride + h * hd;
                size_t row = (size_t)slots[t] * n_kv + h;
                double amax = 0;
                for (uint32_t i = 0; i < hd; i++)
                    amax = fmax(amax, fabs(src[i]));
                if (!dt)
                    assert_true(ksc[row] == (float)amax / 127.0f);
                for (uint32_t i = 0; i < hd; i++) {
                    if (dt) {
                        uint16_t hv;
                        memcpy(&hv, kq + (row * hd + i) * 2, 2);
                        /* decode the half by hand: f16 keeps 11 significant bits */
                        int e = (hv >> 10) & 31, m = hv & 1023;
                        double val = (e ? (1024 + m) * ldexp(1, e - 25) : m * ldexp(1, -24)) * ((hv & 0x8000) ? -1 : 1);
                        assert_true(fabs(val - src[i]) <= fabs(src[i]) * (1.0 / 2048) + 6e-8);
                    } else {
                        int8_t q = (int8_t)kq[row * hd + i];
                        long want = amax > 0 ? lrint(src[i] / ((float)amax / 127.0f)) : 0;
                        assert_int_equal(q, want);
                    }
                }
            }
        }
        /* the slot of the padding token's neighbour (slot 1) is untouched */
        assert_int_equal(kq[1 * n_kv * hd * el], 0x5a);
        int32_t bad = 16;
        assert_int_equal(ops->upload(c, V(bsl), &bad, 4), 0);
        assert_int_equal(ops->kv_store(c, &a), DRAY_EINVAL);
        free(kq), free(ksc);
        ops->free(c, pk), ops->free(c, pv), ops->free(c, ks), ops->free(c, vs), ops->free(c, bk), ops->free(c, bv);
        ops->free(c, bsl);
    }
    free(k), free(v);
}

/* ------------------------------------------------------------ attention */

struct att_case {
    uint32_t dtype, n_head, n_kv, hd, window, bs;
    uint32_t n_seq;
    int32_t seqs[4][4]; /* q_start, n_q, kv_len, bt_start (bt_start filled here) */
    float softcap;      /* v4: Gemma 2's logit soft-capping; 0 = none */
};

struct att_env {
    struct dray_buf *pk, *pv, *ks, *vs, *q, *out, *seqs, *bt;
    struct dray_kv_pool pool;
    struct dray_attention_args a;
    uint32_t bt_n; /* block table entries */
};

/* Build the pool in ctx: every sequence gets its own blocks; blocks the window
 * never reaches are -1 in the block table. K/V go through kv_store. */
static void att_build(struct dray_ctx *c, struct att_case *ac, const float *kf, const float *vf, const float *qf,
                      uint32_t n_tok, struct att_env *e)
{
    uint32_t n_blocks = 0, bt_n = 0;
    int32_t bt[256];
    static int32_t slots[4096]; /* visible positions of all sequences */
    uint32_t n_kvtok = 0;
    uint32_t max_kv = 0;
    for (uint32_t s = 0; s < ac->n_seq; s++) {
        int32_t *sq = ac->seqs[s];
        uint32_t kv_len = (uint32_t)sq[2], nb = (kv_len + ac->bs - 1) / ac->bs;
        uint32_t first = (uint32_t)(sq[2] - sq[1]);
        uint32_t lo = (ac->window && first + 1 > ac->window) ? first + 1 - ac->window : 0;
        sq[3] = (int32_t)bt_n;
        for (uint32_t b = 0; b < nb; b++) {
            /* blocks entirely below lo are holes; the others get a block (reversed order) */
            bt[bt_n++] = (b + 1) * ac->bs <= lo ? -1 : (int32_t)(n_blocks++);
        }
        max_kv = kv_len > max_kv ? kv_len : max_kv;
    }
    uint32_t n_slots = n_blocks * ac->bs;
    /* store every visible position's K/V; kf rows are per (seq, position) */
    size_t row = (size_t)ac->n_kv * ac->hd;
    float *ks = malloc(4096 * row * 4), *vs = malloc(4096 * row * 4);
    uint32_t src = 0;
    for (uint32_t s = 0; s < ac->n_seq; s++)
        for (uint32_t p = 0; p < (uint32_t)ac->seqs[s][2]; p++, src++) {
            int32_t blk = bt[ac->seqs[s][3] + p / ac->bs];
            if (blk < 0)
                continue;
            slots[n_kvtok] = blk * (int32_t)ac->bs + (int32_t)(p % ac->bs);
            memcpy(ks + n_kvtok * row, kf + src * row, row * 4);
            memcpy(vs + n_kvtok * row, vf + src * row, row * 4);
            n_kvtok++;
        }
    size_t el = ac->dtype == DRAY_I8 ? 1 : 2, nb = (size_t)n_slots * row * el;
    e->pk = up(c, NULL, nb), e->pv = up(c, NULL, nb);
    e->ks = up(c, NULL, (size_t)n_slots * ac->n_kv * 4), e->vs = up(c, NULL, (size_t)n_slots * ac->n_kv * 4);
    e->pool = (struct dray_kv_pool){V(e->pk), V(e->pv), V(e->ks), V(e->vs), ac->dtype, ac->n_kv, ac->hd, ac->bs, n_slots};
    struct dray_buf *bk = up(c, ks, n_kvtok * row * 4), *bv = up(c, vs, n_kvtok * row * 4),
                    *bsl = up(c, slots, n_kvtok * 4);
    struct dray_kv_store_args st = {V(bk), V(bv), V(bsl), &e->pool, n_kvtok, (uint32_t)row, (uint32_t)row};
    assert_int_equal(ops->kv_store(c, &st), 0);
    ops->free(c, bk), ops->free(c, bv), ops->free(c, bsl);
    free(ks), free(vs);
    uint32_t sq_row = ac->n_head * ac->hd;
    e->q = up(c, qf, (size_t)n_tok * sq_row * 4);
    e->out = up(c, NULL, (size_t)n_tok * sq_row * 4);
    e->seqs = up(c, ac->seqs, ac->n_seq * 16);
    e->bt = up(c, bt, bt_n * 4);
    e->bt_n = bt_n;
    e->a = (struct dray_attention_args){V(e->q), V(e->out), V(e->seqs), V(e->bt), &e->pool, n_tok, ac->n_seq,
                                        ac->n_head, max_kv, sq_row, sq_row, ac->window, 1.0f / sqrtf((float)ac->hd),
                                        ac->softcap};
}

static void att_free(struct dray_ctx *c, struct att_env *e)
{
    ops->free(c, e->pk), ops->free(c, e->pv), ops->free(c, e->ks), ops->free(c, e->vs);
    ops->free(c, e->q), ops->free(c, e->out), ops->free(c, e->seqs), ops->free(c, e->bt);
}

static double half2d(uint16_t hv)
{
    int e = (hv >> 10) & 31, m = hv & 1023;
    double v = e ? (1024 + m) * ldexp(1, e - 25) : m * ldexp(1, -24);
    return (hv & 0x8000) ? -v : v;
}

/* Naive attention in double over the dequantized cache (read back from ctx). */
static void att_naive(struct dray_ctx *c, const struct att_case *ac, const struct att_env *e, const float *qf,
                      double *out, double *vmax)
{
    size_t row = (size_t)ac->n_kv * ac->hd, n_slots = e->pool.n_slots;
    size_t el = ac->dtype == DRAY_I8 ? 1 : 2;
    uint8_t *kr = malloc(n_slots * row * el), *vr = malloc(n_slots * row * el);
    float *ks = malloc(n_slots * ac->n_kv * 4 + 4), *vs = malloc(n_slots * ac->n_kv * 4 + 4);
    down(c, e->pk, kr, n_slots * row * el), down(c, e->pv, vr, n_slots * row * el);
    down(c, e->ks, ks, n_slots * ac->n_kv * 4), down(c, e->vs, vs, n_slots * ac->n_kv * 4);
    int32_t bt[256];
    down(c, e->bt, bt, e->bt_n * 4);
#define DEQ(buf, sc, slot, h, i)                                                                        \
    (el == 1 ? ((int8_t *)(buf))[((slot) * ac->n_kv + (h)) * ac->hd + (i)] * (double)(sc)[(slot) * ac->n_kv + (h)] \
             : half2d(((uint16_t *)(buf))[((slot) * ac->n_kv + (h)) * ac->hd + (i)]))
    *vmax = 0;
    uint32_t grp = ac->n_head / ac->n_kv;
    for (uint32_t s = 0; s < ac->n_seq; s++) {
        const int32_t *sq = ac->seqs[s];
        for (int32_t r = 0; r < sq[1]; r++) {
            uint32_t pos = (uint32_t)(sq[2] - sq[1] + r), t = (uint32_t)(sq[0] + r);
            for (uint32_t h = 0; h < ac->n_head; h++) {
                uint32_t g = h / grp;
                const float *q = qf + ((size_t)t * ac->n_head + h) * ac->hd;
                static double sc[4096];
                double m = -INFINITY, sum = 0;
                for (uint32_t j = 0; j <= pos; j++) {
                    sc[j] = -INFINITY;
                    if (ac->window && pos - j >= ac->window)
                        continue;
                    size_t slot = (size_t)bt[sq[3] + j / ac->bs] * ac->bs + j % ac->bs;
                    double d = 0;
                    for (uint32_t i = 0; i < ac->hd; i++)
                        d += q[i] * DEQ(kr, ks, slot, g, i);
                    sc[j] = d / sqrt((double)ac->hd);
                    if (ac->softcap > 0) /* backend.h, v4: s = softcap * tanh(s / softcap) */
                        sc[j] = ac->softcap * tanh(sc[j] / ac->softcap);
                    m = fmax(m, sc[j]);
                }
                for (uint32_t j = 0; j <= pos; j++)
                    sum += sc[j] == -INFINITY ? 0 : exp(sc[j] - m);
                double *o = out + ((size_t)t * ac->n_head + h) * ac->hd;
                for (uint32_t i = 0; i < ac->hd; i++)
                    o[i] = 0;
                for (uint32_t j = 0; j <= pos; j++) {
                    if (sc[j] == -INFINITY)
                        continue;
                    size_t slot = (size_t)bt[sq[3] + j / ac->bs] * ac->bs + j % ac->bs;
                    double p = exp(sc[j] - m) / sum;
                    for (uint32_t i = 0; i < ac->hd; i++) {
                        double v = DEQ(vr, vs, slot, g, i);
                        *vmax = fmax(*vmax, fabs(v));
                        o[i] += p * v;
                    }
                }
            }
        }
    }
#undef DEQ
    free(kr), free(vr), free(ks), free(vs);
}

/* Queries uniform in [-q_amp, q_amp]. */
static void att_case_run_amp(struct att_case *ac, float q_amp)
{
    uint32_t n_tok = 0, n_pos = 0;
    for (uint32_t s = 0; s < ac->n_seq; s++) {
        n_tok += (uint32_t)ac->seqs[s][1];
        n_pos += (uint32_t)ac->seqs[s][2];
    }
    size_t row = (size_t)ac->n_kv * ac->hd, qn = (size_t)n_tok * ac->n_head * ac->hd;
    float *kf = randv(n_pos * row, -2, 2), *vf = randv(n_pos * row, -1, 1), *qf = randv(qn, -q_amp, q_amp);
    struct dray_ctx *cs[3] = {cref, cfast, cone};
    float *res[3];
    struct att_env e[3];
    for (int ci = 0; ci < 3; ci++) {
        att_build(cs[ci], ac, kf, vf, qf, n_tok, &e[ci]);
        int rc = ops->attention(cs[ci], &e[ci].a);
        if (rc)
            fail_msg("attention: %d %s", rc, ops->last_error(cs[ci]));
        res[ci] = malloc(qn * 4);
        down(cs[ci], e[ci].out, res[ci], qn * 4);
    }
    double *want = malloc(qn * sizeof(double)), vmax;
    att_naive(cref, ac, &e[0], qf, want, &vmax);
    double tol = (ac->dtype == DRAY_I8 ? 2e-3 : 1e-4) * vmax;
    for (size_t i = 0; i < qn; i++)
        if (!(fabs(res[0][i] - want[i]) <= tol * 0.1))
            fail_msg("attention ref vs naive: element %zu: %.9g vs %.9g", i, res[0][i], want[i]);
    near("attention avx2 vs ref", res[1], res[0], qn, tol, 0);
    /* one thread or two: the same bits, unless two cut a decode row's keys into
     * chunks (cpu_attention_op.c: rows of sequences of up to 33 new rows, two
     * chunks of at least 128 keys), whose merge rounds differently */
    int chunked = 0;
    for (uint32_t s = 0; s < ac->n_seq; s++)
        chunked |= ac->seqs[s][1] <= 33 && ac->seqs[s][2] >= 256 && (!ac->window || ac->window >= 256);
    near("attention 1 thread vs 2", res[2], res[1], qn, chunked ? tol : 0, 0);
    for (int ci = 0; ci < 3; ci++) {
        att_free(cs[ci], &e[ci]);
        free(res[ci]);
    }
    /* the AVX-512 sets' attention (16-lane products), 2 and 1 threads */
    for (size_t i = 1; i < N_ISA; i++) {
        struct dray_ctx *c2[2] = {isas[i].c2, isas[i].c1};
        float *r2[2];
        if (!c2[0])
            continue;
        for (int ci = 0; ci < 2; ci++) {
            att_build(c2[ci], ac, kf, vf, qf, n_tok, &e[ci]);
            int rc = ops->attention(c2[ci], &e[ci].a);
            if (rc)
                fail_msg("attention %s: %d %s", isas[i].env, rc, ops->last_error(c2[ci]));
            r2[ci] = malloc(qn * 4);
            down(c2[ci], e[ci].out, r2[ci], qn * 4);
            att_free(c2[ci], &e[ci]);
        }
        for (size_t k = 0; k < qn; k++)
            if (!(fabs(r2[0][k] - want[k]) <= tol))
                fail_msg("attention %s vs naive: element %zu: %.9g vs %.9g", isas[i].env, k, r2[0][k], want[k]);
        near("attention avx512 1 thread vs 2", r2[1], r2[0], qn, chunked ? tol : 0, 0);
        free(r2[0]), free(r2[1]);
    }
    free(kf), free(vf), free(qf), free(want);
}

static void att_case_run(struct att_case *ac)
{
    att_case_run_amp(ac, 1.5f);
}

/* prefill (17 new), decode (1 new of 100), chunked prefill (5 new of 40), decode at kv_len 1 */
#define MIXED {{0, 17, 17, 0}, {17, 1, 100, 0}, {18, 5, 40, 0}, {23, 1, 1, 0}}

static void test_attention_mixed_batch_mqa_i8(void **state)
{
    (void)state;
    dray_test_seed(81);
    struct att_case c = {DRAY_I8, 4, 1, 64, 0, 8, 4, MIXED, 0};
    att_case_run(&c);
}

static void test_attention_gqa_f16_and_odd_head_dim(void **state)
{
    (void)state;
    dray_test_seed(82);
    struct att_case c = {DRAY_F16, 4, 2, 40, 0, 16, 4, MIXED, 0};
    att_case_run(&c);
    struct att_case c2 = {DRAY_I8, 6, 3, 19, 0, 4, 4, MIXED, 0};
    att_case_run(&c2);
}

/* n_q decode rows at kv_len kv in one call, then each alone: the same bits. */
static void rows_alone_and_together(uint32_t kv)
{
    const uint32_t n_head = 9, n_kv = 3, hd = 64, n_q = 6, qrow = n_head * hd;
    float *kf = randv(kv * n_kv * hd, -1, 1), *vf = randv(kv * n_kv * hd, -1, 1);
    float *qf = randv(n_q * qrow, -1.5f, 1.5f), *all = malloc(n_q * qrow * 4), *one = malloc(qrow * 4);
    for (size_t k = 0; k < 2 * N_ISA; k++) { /* AVX2, then the AVX-512 sets the CPU has */
        struct dray_ctx *c = k / 2 ? isas[k / 2].c2 : cfast;
        uint32_t dt = k % 2, dtype = dt ? DRAY_F16 : DRAY_I8;
        if (!c)
            continue;
        struct att_case whole = {dtype, n_head, n_kv, hd, 0, 8, 1, {{0, (int32_t)n_q, (int32_t)kv, 0}}, 0};
        struct att_env e;
        att_build(c, &whole, kf, vf, qf, n_q, &e);
        assert_int_equal(ops->attention(c, &e.a), 0);
        down(c, e.out, all, n_q * qrow * 4);
        att_free(c, &e);
        for (uint32_t r = 0; r < n_q; r++) {
            struct att_case alone = {dtype, n_head, n_kv, hd, 0, 8, 1, {{0, 1, (int32_t)(kv - n_q + r + 1), 0}}, 0};
            att_build(c, &alone, kf, vf, qf + r * qrow, 1, &e);
            assert_int_equal(ops->attention(c, &e.a), 0);
            down(c, e.out, one, qrow * 4);
            att_free(c, &e);
            for (uint32_t i = 0; i < qrow; i++)
                if (memcmp(&one[i], &all[r * qrow + i], 4))
                    fail_msg("%s %s row %u element %u: %.9g alone, %.9g among %u rows",
                             k / 2 ? isas[k / 2].env : "avx2", dt ? "f16" : "int8", r, i, one[i],
                             all[r * qrow + i], n_q);
        }
    }
    free(kf), free(vf), free(qf), free(all), free(one);
}

/* A row's output must not depend on the rows that share its call: speculative
 * drafts are verified in one step and must give exactly what one-at-a-time
 * decoding gives, and a stream what the whole reply gives. Six rows at the
 * last positions (18 query vectors under 9:3 GQA) against each row alone, at
 * 40 keys and at 600, where two threads cut each row's keys into chunks. */
static void test_attention_row_results_do_not_depend_on_the_batch(void **state)
{
    (void)state;
    dray_test_seed(87);
    for (int longer = 0; longer < 2; longer++) /* 40 keys, then 600: rows cut into key chunks */
        rows_alone_and_together(longer ? 600 : 40);
}

/* Window edges at exact positions: with window 16, the decode query at position
 * 99 sees 84..99; blocks of 8 wholly below 84 are -1 holes. The chunked prefill
 * first query (35) sees 20..35. */
static void test_attention_sliding_window_with_block_holes(void **state)
{
    (void)state;
    dray_test_seed(83);
    struct att_case c = {DRAY_I8, 4, 1, 64, 16, 8, 4, MIXED, 0};
    att_case_run(&c);
    struct att_case c2 = {DRAY_F16, 2, 1, 256, 8, 4, 4, MIXED, 0};
    att_case_run(&c2);
    struct att_case c3 = {DRAY_I8, 4, 1, 256, 1, 16, 4, MIXED, 0}; /* window 1: only itself */
    att_case_run(&c3);
}

/* 3 query heads per kv head: an odd number of query vectors per block; with
 * loud queries most probabilities are below 1e-30 of the largest (exp underflow
 * and denormal territory) and the result still matches the reference. */
static void test_attention_odd_vector_count_and_peaked_softmax(void **state)
{
    (void)state;
    dray_test_seed(85);
    struct att_case c = {DRAY_I8, 3, 1, 64, 0, 8, 4, MIXED, 0};
    att_case_run(&c);
    struct att_case c2 = {DRAY_I8, 3, 1, 64, 24, 8, 4, MIXED, 0};
    att_case_run_amp(&c2, 40.0f);
    struct att_case c3 = {DRAY_F16, 1, 1, 48, 0, 8, 4, MIXED, 0};
    att_case_run_amp(&c3, 40.0f);
}

/* A decode row over a long context has its keys cut into chunks for the
 * threads (flash decoding: MQA's one kv head would otherwise run on one) and
 * the partial sums merged: each path still matches the naive result, MQA and
 * GQA, with a window, beside a short decode that stays whole, and with loud
 * queries whose chunks have very different maxima. */
static void test_attention_long_decode_rows_split_keys_across_threads(void **state)
{
    (void)state;
    dray_test_seed(86);
    struct att_case c = {DRAY_I8, 4, 1, 64, 0, 16, 1, {{0, 1, 1000, 0}}, 0};
    att_case_run(&c);
    struct att_case c2 = {DRAY_F16, 9, 3, 64, 300, 16, 2, {{0, 1, 700, 0}, {1, 1, 90, 0}}, 0};
    att_case_run(&c2);
    struct att_case c3 = {DRAY_I8, 4, 1, 256, 0, 16, 1, {{0, 1, 2000, 0}}, 0};
    att_case_run_amp(&c3, 40.0f);
    /* a tg128 row: 130 keys stay whole (chunks of at least 128), bit for bit
     * the same on one thread and two */
    struct att_case c4 = {DRAY_I8, 4, 1, 256, 0, 16, 1, {{0, 1, 130, 0}}, 0};
    att_case_run(&c4);
}

/* v4 soft-capping (Gemma 2): loud queries put most raw scores far beyond the
 * cap, so a kernel that skips the tanh, applies it after the mask or before
 * the scale is off by whole probabilities. Prefill and decode, MQA and GQA,
 * a window, I8 and F16, and a long decode row cut into key chunks. */
static void test_attention_softcap_matches_the_formula(void **state)
{
    (void)state;
    dray_test_seed(88);
    struct att_case c = {DRAY_I8, 4, 1, 64, 0, 8, 4, MIXED, 2.5f};
    att_case_run_amp(&c, 6.0f);
    struct att_case c2 = {DRAY_F16, 6, 2, 64, 16, 8, 4, MIXED, 1.0f};
    att_case_run_amp(&c2, 6.0f);
    struct att_case c3 = {DRAY_F16, 4, 2, 40, 0, 16, 4, MIXED, 50.0f}; /* mostly below the cap */
    att_case_run_amp(&c3, 40.0f);
    struct att_case c4 = {DRAY_I8, 9, 3, 64, 300, 16, 2, {{0, 1, 700, 0}, {1, 1, 90, 0}}, 3.0f};
    att_case_run_amp(&c4, 6.0f);
    /* the cap changes the result: the same case without it is far off */
    struct att_case c5 = {DRAY_F16, 1, 1, 32, 0, 8, 1, {{0, 1, 24, 0}}, 0.5f};
    float *kf = randv(24 * 32, -2, 2), *vf = randv(24 * 32, -1, 1), *qf = randv(32, -6, 6), o[2][32];
    for (int capped = 0; capped < 2; capped++) {
        struct att_env e;
        c5.softcap = capped ? 0.5f : 0.0f;
        att_build(cfast, &c5, kf, vf, qf, 1, &e);
        assert_int_equal(ops->attention(cfast, &e.a), 0);
        down(cfast, e.out, o[capped], sizeof(o[capped]));
        att_free(cfast, &e);
    }
    double diff = 0;
    for (int i = 0; i < 32; i++)
        diff = fmax(diff, fabs(o[0][i] - o[1][i]));
    assert_true(diff > 0.05);
    free(kf), free(vf), free(qf);
}

static void test_attention_rejects_bad_sequences_and_reached_holes(void **state)
{
    (void)state;
    dray_test_seed(84);
    struct att_case ac = {DRAY_I8, 4, 1, 32, 8, 4, 1, {{0, 2, 40, 0}}, 0};
    float *kf = randv(40 * 32, -1, 1), *vf = randv(40 * 32, -1, 1), *qf = randv(2 * 4 * 32, -1, 1);
    struct att_env e;
    att_build(cfast, &ac, kf, vf, qf, 2, &e);
    assert_int_equal(ops->attention(cfast, &e.a), 0);
    e.a.window = 0; /* now the mask reaches the -1 blocks */
    assert_int_equal(ops->attention(cfast, &e.a), DRAY_EINVAL);
    assert_non_null(strstr(ops->last_error(cfast), "block"));
    e.a.window = 8;
    e.a.n_tok = 1; /* the sequence's queries run past n_tok */
    assert_int_equal(ops->attention(cfast, &e.a), DRAY_EINVAL);
    e.a.n_tok = 2;
    e.a.max_kv_len = 39;
    assert_int_equal(ops->attention(cfast, &e.a), DRAY_EINVAL);
    e.a.max_kv_len = 40;
    e.a.n_head = 3; /* not a multiple of n_kv_head... 3 % 1 == 0, so use out = q */
    e.a.n_head = 4;
    e.a.out = e.a.q;
    assert_int_equal(ops->attention(cfast, &e.a), DRAY_EINVAL);
    e.a.out = V(e.out);
    e.a.seqs.buf = NULL;
    assert_int_equal(ops->attention(cfast, &e.a), DRAY_EINVAL);
    e.a.seqs = V(e.seqs);
    e.a.softcap = -1.0f; /* v4: finite and >= 0 */
    assert_int_equal(ops->attention(cfast, &e.a), DRAY_EINVAL);
    assert_non_null(strstr(ops->last_error(cfast), "softcap"));
    e.a.softcap = NAN;
    assert_int_equal(ops->attention(cfast, &e.a), DRAY_EINVAL);
    att_free(cfast, &e);
    free(kf), free(vf), free(qf);
}

#define KERNEL_SET_CASE(name, st) {name, test_kernel_set_runs_where_the_cpu_has_it, NULL, NULL, st}

int main(void)
{
    static struct isa_ctx avx2 = {"avx2", "(avx2+fma)", NULL, NULL};
    const struct CMUnitTest tests[] = {
        KERNEL_SET_CASE("test_kernel_set_avx2_runs_where_the_cpu_has_it", &avx2),
        KERNEL_SET_CASE("test_kernel_set_avxvnni_runs_where_the_cpu_has_it", &isas[0]),
        KERNEL_SET_CASE("test_kernel_set_avx512vnni_runs_where_the_cpu_has_it", &isas[1]),
        KERNEL_SET_CASE("test_kernel_set_amx_runs_where_the_cpu_has_it", &isas[2]),
        cmocka_unit_test(test_cpu_plugin_describes_one_unified_device),
        cmocka_unit_test(test_cpu_memory_roundtrip_copy_fill_and_bounds),
        cmocka_unit_test(test_cpu_zero_fill_of_a_large_buffer_clears_exactly_its_range),
        cmocka_unit_test(test_matmul_i8_matches_contract_and_reference),
        cmocka_unit_test(test_matmul_i8_outliers_are_excluded_and_added_in_f32),
        cmocka_unit_test(test_matmul_i8_extreme_values_are_exact_on_every_path),
        cmocka_unit_test(test_cpu_isa_override_names_the_kernels_and_rejects_unknown),
        cmocka_unit_test(test_matmul_i8_tile_shapes_match_every_path),
        cmocka_unit_test(test_matmul_f32_checking_path),
        cmocka_unit_test(test_matmul_grouped_two_pass_is_closer_to_f32_on_every_path),
        cmocka_unit_test(test_weight_export_import_round_trip_and_refusals),
        cmocka_unit_test(test_matmul_rejects_bad_arguments),
        cmocka_unit_test(test_embed_gathers_scaled_rows_and_rejects_bad_ids),
        cmocka_unit_test(test_embed_packed_tables_and_weight_create_refusals),
        cmocka_unit_test(test_rmsnorm_plain_per_head_and_in_place),
        cmocka_unit_test(test_rope_matches_the_formula_at_long_positions),
        cmocka_unit_test(test_rope_angles_kept_between_calls_follow_their_inputs),
        cmocka_unit_test(test_rope_freq_factors_and_attn_factor),
        cmocka_unit_test(test_gated_act_gelu_and_silu_with_aliasing),
        cmocka_unit_test(test_add_is_exact_and_allows_exact_aliasing),
        cmocka_unit_test(test_kv_store_quantizes_per_head_and_skips_padding),
        cmocka_unit_test(test_attention_mixed_batch_mqa_i8),
        cmocka_unit_test(test_attention_gqa_f16_and_odd_head_dim),
        cmocka_unit_test(test_attention_row_results_do_not_depend_on_the_batch),
        cmocka_unit_test(test_attention_sliding_window_with_block_holes),
        cmocka_unit_test(test_attention_odd_vector_count_and_peaked_softmax),
        cmocka_unit_test(test_attention_long_decode_rows_split_keys_across_threads),
        cmocka_unit_test(test_attention_softcap_matches_the_formula),
        cmocka_unit_test(test_attention_rejects_bad_sequences_and_reached_holes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
