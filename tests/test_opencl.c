/*
 * The OpenCL plugin against the CPU plugin's reference kernels: both .so files
 * are dlopened from $DRAY_PLUGIN_PATH, fed the same random inputs, and every op
 * is compared within the tolerance backend.h states for it. Exit 77 (skip) when
 * there is no OpenCL device or no CPU plugin to compare with.
 */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "testutil.h"

/* ---------------------------------------------------------------- fixture */

struct side {
    void *so;
    const struct dray_ops *ops;
    struct dray_ctx *ctx;
};
static struct side ocl, ref;
static char g_skip[512];

static void host_log(int level, const char *plugin, const char *msg)
{
    if (level <= DRAY_LOG_WARN)
        fprintf(stderr, "[%s] %s\n", plugin, msg);
}
static const struct dray_host g_host = {DRAY_ABI_VERSION, malloc, free, host_log};

/* dlopen libdray-<name>.so from the first folder of $DRAY_PLUGIN_PATH that has it. */
static int load(const char *name, struct side *s)
{
    const char *path = getenv("DRAY_PLUGIN_PATH");
    char dirs[4096], file[4200];
    snprintf(dirs, sizeof(dirs), "%s", path ? path : "");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(file, sizeof(file), "%s/libdray-%s.so", d, name);
        if ((s->so = dlopen(file, RTLD_NOW | RTLD_LOCAL)) != NULL)
            break;
    }
    if (!s->so) {
        snprintf(g_skip, sizeof(g_skip), "libdray-%s.so not found on DRAY_PLUGIN_PATH", name);
        return -1;
    }
    dray_plugin_negotiate_fn neg = (dray_plugin_negotiate_fn)dlsym(s->so, DRAY_PLUGIN_SYMBOL);
    uint32_t v = DRAY_ABI_VERSION;
    char err[256] = "";
    if (!neg || neg(&v, &g_host, &s->ops, err, sizeof(err)) != 0) {
        snprintf(g_skip, sizeof(g_skip), "%s: negotiate failed: %s", name, err);
        return -1;
    }
    return 0;
}

static int open_side(struct side *s, uint32_t reference, struct dray_ctx **out)
{
    struct dray_open_options opt = {.size = sizeof(opt), .reference = reference};
    char err[1024] = "";
    int rc = s->ops->open(0, &opt, out, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "open %s: %s\n", s->ops->name, err);
    return rc;
}

static int setup_all(void **state)
{
    (void)state;
    uint32_t n = 0;
    if (load("opencl", &ocl) || load("cpu", &ref))
        return 0;
    if (ocl.ops->device_count(&n) != 0 || n == 0) {
        snprintf(g_skip, sizeof(g_skip), "no OpenCL device (device_count = %u)", n);
        return 0;
    }
    /* a device that exists but cannot be opened is a failure, not a skip */
    if (open_side(&ocl, 0, &ocl.ctx) || open_side(&ref, 1, &ref.ctx))
        return -1;
    return 0;
}

static int teardown_all(void **state)
{
    (void)state;
    if (ocl.ctx)
        ocl.ops->close(ocl.ctx);
    if (ref.ctx)
        ref.ops->close(ref.ctx);
    return 0;
}

/* ---------------------------------------------------------------- buffers */

/* The same bytes in a buffer on each side. */
struct pbuf {
    struct dray_buf *b[2]; /* [0] opencl, [1] reference */
    size_t n;
};

static struct side *sides[2] = {&ocl, &ref};

static struct pbuf pb_new(const void *data, size_t n)
{
    struct pbuf p = {.n = n};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sides[i]->ops->alloc(sides[i]->ctx, n, &p.b[i]), 0);
        if (data && n)
            assert_int_equal(sides[i]->ops->upload(sides[i]->ctx, (struct dray_view){p.b[i], 0}, data, n), 0);
    }
    return p;
}

static void pb_free(struct pbuf *p)
{
    for (int i = 0; i < 2; i++)
        sides[i]->ops->free(sides[i]->ctx, p->b[i]);
}

static struct dray_view V(const struct pbuf *p, int side, size_t off)
{
    return (struct dray_view){p->b[side], off};
}

/* Download both sides into fresh host arrays. */
static void pb_get(const struct pbuf *p, void **o, void **r)
{
    *o = malloc(p->n + 1);
    *r = malloc(p->n + 1);
    assert_int_equal(ocl.ops->download(ocl.ctx, *o, V(p, 0, 0), p->n), 0);
    assert_int_equal(ref.ops->download(ref.ctx, *r, V(p, 1, 0), p->n), 0);
}

static float *randf(size_t n, float lo, float hi)
{
    float *x = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++)
        x[i] = dray_test_randf(lo, hi);
    return x;
}

static int8_t *randq(size_t n)
{
    int8_t *q = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        q[i] = (int8_t)((int)(dray_test_rand() % 255) - 127);
    return q;
}

/* Compare n floats: |o - r| <= abs_tol + rel_tol*|r|. Prints the worst element. */
static void expect_close(const char *what, const float *o, const float *r, size_t n, double abs_tol,
                         double rel_tol)
{
    size_t worst = 0;
    double worst_ex = -1.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)o[i] - r[i]), lim = abs_tol + rel_tol * fabs(r[i]);
        if (!(d <= lim) && d - lim > worst_ex) {
            worst_ex = d - lim;
            worst = i;
        }
    }
    if (worst_ex >= 0)
        fail_msg("%s: element %zu: opencl %.9g vs reference %.9g (tolerance abs %g rel %g)", what,
                 worst, o[worst], r[worst], abs_tol, rel_tol);
}

static float max_abs(const float *x, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Both sides must agree on the return code; the OpenCL side is timed. */
#define RUN_BOTH(member, args_for)                                                              \
    do {                                                                                        \
        for (int s_ = 0; s_ < 2; s_++) {                                                        \
            double t0_ = now_ms();                                                              \
            int rc_ = sides[s_]->ops->member(sides[s_]->ctx, args_for(s_));                     \
            if (rc_ != 0)                                                                       \
                fail_msg("%s %s: rc %d: %s", sides[s_]->ops->name, #member, rc_,                \
                         sides[s_]->ops->last_error(sides[s_]->ctx));                           \
            assert_int_equal(sides[s_]->ops->synchronize(sides[s_]->ctx), 0);                   \
            if (s_ == 0 && getenv("DRAY_TEST_TIMES"))                                           \
                fprintf(stderr, "time %-10s %s: %.3f ms\n", #member, __func__, now_ms() - t0_); \
        }                                                                                       \
    } while (0)

#define SKIP_IF_NO_DEVICE()                 \
    do {                                    \
        if (!ocl.ctx) {                     \
            print_message("skip: %s\n", g_skip); \
            skip();                         \
        }                                   \
    } while (0)

/* ---------------------------------------------------------------- tests */

static void test_opencl_props_declare_every_op(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    struct dray_device_props p;
    assert_int_equal(ocl.ops->device_props(0, &p), 0);
    assert_true(p.name[0] != '\0');
    assert_true(p.max_alloc > 0 && p.mem_total >= p.max_alloc);
    for (int op = 0; op < DRAY_OP_COUNT; op++)
        assert_true(p.op_dtypes[op] != 0);
    assert_true(p.op_dtypes[DRAY_OP_MATMUL] & DRAY_DTYPE_BIT(DRAY_I8));
    assert_true(p.op_dtypes[DRAY_OP_ATTENTION] & DRAY_DTYPE_BIT(DRAY_F16));
    assert_int_equal(ocl.ops->device_props(1000, &p), DRAY_EINVAL);
}

static struct dray_embed_args g_emb[2];
static const struct dray_embed_args *emb_of(int s) { return &g_emb[s]; }

static void embed_case(uint32_t dtype, uint32_t n_rows, uint32_t dim, uint32_t n_tok)
{
    size_t es = dtype == DRAY_I8 ? 1 : 4;
    void *table = dtype == DRAY_I8 ? (void *)randq((size_t)n_rows * dim) : (void *)randf((size_t)n_rows * dim, -2, 2);
    float *rs = randf(n_rows, 0.001f, 0.1f);
    int32_t *ids = malloc(n_tok * 4);
    for (uint32_t t = 0; t < n_tok; t++)
        ids[t] = (int32_t)(t == 0 ? n_rows - 1 : dray_test_rand() % n_rows);
    struct pbuf bt = pb_new(table, (size_t)n_rows * dim * es), bs = pb_new(rs, n_rows * 4),
                bi = pb_new(ids, n_tok * 4), bo = pb_new(NULL, (size_t)n_tok * dim * 4);
    for (int s = 0; s < 2; s++)
        g_emb[s] = (struct dray_embed_args){V(&bi, s, 0), V(&bt, s, 0), V(&bs, s, 0), V(&bo, s, 0),
                                            dtype, n_tok, dim, n_rows, 25.3f, NULL};
    RUN_BOTH(embed, emb_of);
    float *o, *r;
    pb_get(&bo, (void **)&o, (void **)&r);
    expect_close("embed", o, r, (size_t)n_tok * dim, 0, dtype == DRAY_I8 ? 1e-6 : 0);

    /* an id past the table is an error, not a read out of bounds */
    ids[0] = (int32_t)n_rows;
    assert_int_equal(ocl.ops->upload(ocl.ctx, V(&bi, 0, 0), ids, 4), 0);
    assert_int_equal(ocl.ops->embed(ocl.ctx, &g_emb[0]), DRAY_EINVAL);
    assert_non_null(strstr(ocl.ops->last_error(ocl.ctx), "ids[0]"));
    free(o), free(r), free(table), free(rs), free(ids);
    pb_free(&bt), pb_free(&bs), pb_free(&bi), pb_free(&bo);
}

static void test_opencl_embed_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(1);
    embed_case(DRAY_I8, 300, 96, 7);
    embed_case(DRAY_F32, 50, 33, 3);
}

/* The 168 MB int8 table of a 262144 x 640 vocabulary (Gemma 3 270M) must fit. */
static void test_opencl_embed_handles_a_168mb_table(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    const uint32_t rows = 262144, dim = 640;
    size_t n = (size_t)rows * dim;
    int8_t *t = malloc(n);
    for (size_t i = 0; i < n; i++)
        t[i] = (int8_t)((i * 2654435761u) >> 24);
    float rs[1] = {0.5f};
    struct dray_buf *bt, *bs, *bi, *bo;
    assert_int_equal(ocl.ops->alloc(ocl.ctx, n, &bt), 0);
    assert_int_equal(ocl.ops->alloc(ocl.ctx, (size_t)rows * 4, &bs), 0);
    assert_int_equal(ocl.ops->alloc(ocl.ctx, 4, &bi), 0);
    assert_int_equal(ocl.ops->alloc(ocl.ctx, dim * 4, &bo), 0);
    assert_int_equal(ocl.ops->upload(ocl.ctx, (struct dray_view){bt, 0}, t, n), 0);
    assert_int_equal(ocl.ops->fill(ocl.ctx, (struct dray_view){bs, 0}, 0x3f000000u, (size_t)rows * 4), 0);
    int32_t id = (int32_t)rows - 1;
    assert_int_equal(ocl.ops->upload(ocl.ctx, (struct dray_view){bi, 0}, &id, 4), 0);
    struct dray_embed_args a = {{bi, 0}, {bt, 0}, {bs, 0}, {bo, 0}, DRAY_I8, 1, dim, rows, 2.0f, NULL};
    assert_int_equal(ocl.ops->embed(ocl.ctx, &a), 0);
    float out[640];
    assert_int_equal(ocl.ops->download(ocl.ctx, out, (struct dray_view){bo, 0}, sizeof(out)), 0);
    for (uint32_t i = 0; i < dim; i++)
        assert_true(out[i] == (float)t[(size_t)id * dim + i] * (rs[0] * 2.0f));
    ocl.ops->free(ocl.ctx, bt), ocl.ops->free(ocl.ctx, bs), ocl.ops->free(ocl.ctx, bi), ocl.ops->free(ocl.ctx, bo);
    free(t);
}

static struct dray_rmsnorm_args g_rms[2];
static const struct dray_rmsnorm_args *rms_of(int s) { return &g_rms[s]; }

static void test_opencl_rmsnorm_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(2);
    /* {n_tok, n_head, n, pad, in_place} */
    const uint32_t cases[][5] = {{5, 1, 640, 0, 0}, {3, 4, 256, 8, 1}, {1, 1, 7, 3, 0}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        uint32_t n_tok = cases[c][0], n_head = cases[c][1], n = cases[c][2];
        uint32_t stride = n_head * n + cases[c][3];
        float *x = randf((size_t)n_tok * stride, -3, 3), *w = randf(n, 0.5f, 1.5f);
        struct pbuf bx = pb_new(x, (size_t)n_tok * stride * 4), bw = pb_new(w, n * 4),
                    bo = pb_new(NULL, (size_t)n_tok * stride * 4);
        const struct pbuf *out = cases[c][4] ? &bx : &bo;
        for (int s = 0; s < 2; s++)
            g_rms[s] = (struct dray_rmsnorm_args){V(&bx, s, 0), V(&bw, s, 0), V(out, s, 0), n_tok,
                                                  n_head, n, stride, stride, 1e-6f};
        RUN_BOTH(rmsnorm, rms_of);
        float *o, *r;
        pb_get(out, (void **)&o, (void **)&r);
        for (uint32_t t = 0; t < n_tok; t++)
            expect_close("rmsnorm", o + (size_t)t * stride, r + (size_t)t * stride, (size_t)n_head * n,
                         1e-7, 1e-5);
        free(o), free(r), free(x), free(w);
        pb_free(&bx), pb_free(&bw), pb_free(&bo);
    }
}

static struct dray_matmul_args g_mm[2];
static const struct dray_matmul_args *mm_of(int s) { return &g_mm[s]; }

static void matmul_case(uint32_t wdtype, uint32_t n_tok, uint32_t n_out, uint32_t k,
                        uint32_t n_outlier, uint32_t accumulate)
{
    uint32_t sx = k + 3, so = n_out + 1;
    float *x = randf((size_t)n_tok * sx, -1, 1);
    if (n_tok > 1)
        memset(x + sx, 0, k * sizeof(float)); /* a zero row: q = 0, sx = 0 */
    size_t es = wdtype == DRAY_I8 ? 1 : 4;
    void *w = wdtype == DRAY_I8 ? (void *)randq((size_t)n_out * k) : (void *)randf((size_t)n_out * k, -1, 1);
    float *ws = randf(n_out, 0.001f, 0.02f), *ow = randf((size_t)n_out * (n_outlier + 1), -1, 1);
    float *o0 = randf((size_t)n_tok * so, -1, 1);
    int32_t idx[8];
    for (uint32_t j = 0; j < n_outlier; j++) {
        idx[j] = (int32_t)(j * (k / (n_outlier + 1)) + 1);
        for (uint32_t t = 0; t < n_tok; t++)
            x[(size_t)t * sx + idx[j]] *= 40.0f; /* outliers are large */
        if (wdtype == DRAY_I8)
            for (uint32_t o = 0; o < n_out; o++)
                ((int8_t *)w)[(size_t)o * k + idx[j]] = 0;
    }
    struct pbuf bx = pb_new(x, (size_t)n_tok * sx * 4), bw = pb_new(w, (size_t)n_out * k * es),
                bs = pb_new(ws, n_out * 4), bi = pb_new(idx, sizeof(idx)),
                bow = pb_new(ow, (size_t)n_out * (n_outlier + 1) * 4),
                bo = pb_new(o0, (size_t)n_tok * so * 4);
    for (int s = 0; s < 2; s++)
        g_mm[s] = (struct dray_matmul_args){
            .x = V(&bx, s, 0), .w = V(&bw, s, 0), .wscale = V(&bs, s, 0), .out = V(&bo, s, 0),
            .outlier_idx = V(&bi, s, 0), .outlier_w = V(&bow, s, 0), .n_tok = n_tok,
            .n_out = n_out, .k = k, .stride_x = sx, .stride_out = so, .n_outlier = n_outlier,
            .accumulate = accumulate, .wdtype = wdtype};
    RUN_BOTH(matmul, mm_of);
    float *o, *r;
    pb_get(&bo, (void **)&o, (void **)&r);
    float m = max_abs(r, (size_t)n_tok * so);
    char what[96];
    snprintf(what, sizeof(what), "matmul %s n_tok %u n_out %u k %u outliers %u acc %u",
             wdtype == DRAY_I8 ? "I8" : "F32", n_tok, n_out, k, n_outlier, accumulate);
    if (wdtype == DRAY_I8)
        expect_close(what, o, r, (size_t)n_tok * so, 1e-4 * m, 0);
    else
        expect_close(what, o, r, (size_t)n_tok * so, 1e-5 * m, 1e-5);
    free(o), free(r), free(x), free(w), free(ws), free(ow), free(o0);
    pb_free(&bx), pb_free(&bw), pb_free(&bs), pb_free(&bi), pb_free(&bow), pb_free(&bo);
}

static void test_opencl_matmul_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(3);
    matmul_case(DRAY_I8, 1, 640, 640, 0, 0);   /* decode GEMV */
    matmul_case(DRAY_I8, 9, 100, 259, 0, 1);   /* k % 16 != 0, tokens % 4 != 0, accumulate */
    matmul_case(DRAY_I8, 6, 64, 512, 3, 0);    /* outlier channels in f32 */
    matmul_case(DRAY_F32, 5, 70, 300, 0, 1);
}

static void test_opencl_matmul_rejects_bad_arguments(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    struct dray_buf *b;
    assert_int_equal(ocl.ops->alloc(ocl.ctx, 1024, &b), 0);
    struct dray_view v = {b, 0};
    struct dray_matmul_args a = {v, v, v, v, v, v, 1, 16, 64, 64, 16, 0, 0, DRAY_I8, NULL, 0};
    a.out.offset = 512;
    a.w.offset = 1024 - 64 * 16 + 1; /* w overruns the buffer */
    assert_int_equal(ocl.ops->matmul(ocl.ctx, &a), DRAY_EINVAL);
    assert_non_null(strstr(ocl.ops->last_error(ocl.ctx), "w"));
    a.w.offset = 0;
    a.out.offset = 128; /* overlaps x */
    assert_int_equal(ocl.ops->matmul(ocl.ctx, &a), DRAY_EINVAL);
    a.wdtype = DRAY_F16;
    assert_int_equal(ocl.ops->matmul(ocl.ctx, &a), DRAY_ENOTSUP);
    ocl.ops->free(ocl.ctx, b);
}

static struct dray_rope_args g_rope[2];
static const struct dray_rope_args *rope_of(int s) { return &g_rope[s]; }

/* Rope over 6 tokens up to position 2^17-1 on both sides, n_rot of 64; v4:
 * with frequency factors ff (n_rot/2 of them, NULL: none) and attn_factor
 * af. The subject is also held to the formula of backend.h, computed here. */
static void rope_case_v4(uint32_t n_rot, const float *ff, float af)
{
    uint32_t n_tok = 6, n_head = 3, hd = 64, stride = n_head * hd + 5, half = n_rot / 2;
    float *x = randf((size_t)n_tok * stride, -2, 2);
    int32_t pos[6] = {0, 1, 77, 4095, 100000, 131071};
    struct pbuf bx = pb_new(x, (size_t)n_tok * stride * 4), bp = pb_new(pos, sizeof(pos)),
                bf = pb_new(ff, ff ? half * 4 : 4);
    for (int s = 0; s < 2; s++)
        g_rope[s] = (struct dray_rope_args){V(&bx, s, 0), V(&bp, s, 0), n_tok, n_head, hd, n_rot,
                                            stride, 1000000.0f, 0.125f,
                                            ff ? V(&bf, s, 0) : (struct dray_view){NULL, 0}, af};
    RUN_BOTH(rope, rope_of);
    float *o, *r;
    pb_get(&bx, (void **)&o, (void **)&r);
    double ms = af == 0.0f ? 1.0 : af, tol = 1e-4 * fmax(1.0, ms);
    expect_close("rope", o, r, (size_t)n_tok * stride, tol, 0);
    for (uint32_t t = 0; t < n_tok; t++) /* backend.h's formula */
        for (uint32_t h = 0; h < n_head; h++)
            for (uint32_t i = 0; i < hd; i++) {
                size_t b = (size_t)t * stride + h * hd;
                uint32_t j = i % half;
                double th = pos[t] * 0.125 * pow(1000000.0, -2.0 * j / n_rot) / (ff ? ff[j] : 1.0);
                double x0 = x[b + j], x1 = x[b + j + half];
                double want = i >= n_rot  ? x[b + i]
                              : i < half ? ms * (x0 * cos(th) - x1 * sin(th))
                                         : ms * (x0 * sin(th) + x1 * cos(th));
                if (!(fabs(o[b + i] - want) <= tol))
                    fail_msg("rope token %u head %u element %u: %.9g, formula %.9g", t, h, i, o[b + i], want);
            }
    free(o), free(r), free(x);
    pb_free(&bx), pb_free(&bp), pb_free(&bf);
}

static void rope_case(void)
{
    rope_case_v4(48, NULL, 0.0f);
    /* v4: Llama 3-like factors (1 fast, 8 slow, a blend between) with a YaRN-like
     * mscale, then LongRoPE-like factors over the whole head, then mscale alone */
    float ff[32];
    for (int i = 0; i < 32; i++)
        ff[i] = i < 8 ? 1.0f : i > 20 ? 8.0f : 1.0f + 7.0f * (float)(i - 8) / 12.0f;
    rope_case_v4(48, ff, 1.2f);
    for (int i = 0; i < 32; i++)
        ff[i] = 1.0f + 0.04f * (float)(i * i);
    rope_case_v4(64, ff, 0.0f);
    rope_case_v4(64, NULL, 1.37f);
}

static void test_opencl_rope_matches_reference_at_long_positions(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(4);
    rope_case();
}

/* Devices without fp64 take the (hi, lo) frequency path; force it here. */
static void test_opencl_rope_without_fp64_stays_accurate(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(5);
    struct dray_ctx *saved = ocl.ctx, *c = NULL;
    setenv("DRAY_OCL_NO_FP64", "1", 1);
    int rc = open_side(&ocl, 0, &c);
    unsetenv("DRAY_OCL_NO_FP64");
    assert_int_equal(rc, 0);
    ocl.ctx = c;
    rope_case();
    ocl.ctx = saved;
    ocl.ops->close(c);
}

/* ---- KV pool and attention ---- */

struct pool {
    struct pbuf k, v, ks, vs;
    struct dray_kv_pool p[2];
};

static void pool_new(struct pool *P, uint32_t dtype, uint32_t n_kv, uint32_t hd, uint32_t bs,
                     uint32_t n_blocks)
{
    uint32_t n_slots = bs * n_blocks;
    size_t es = dtype == DRAY_I8 ? 1 : 2, rows = (size_t)n_slots * n_kv;
    /* random garbage in the pool: nothing unwritten may leak into results */
    int8_t *junk = randq(rows * hd * es);
    P->k = pb_new(junk, rows * hd * es);
    P->v = pb_new(junk, rows * hd * es);
    float *s = randf(rows, 0, 1);
    P->ks = pb_new(s, rows * 4);
    P->vs = pb_new(s, rows * 4);
    for (int i = 0; i < 2; i++)
        P->p[i] = (struct dray_kv_pool){V(&P->k, i, 0), V(&P->v, i, 0), V(&P->ks, i, 0),
                                        V(&P->vs, i, 0), dtype, n_kv, hd, bs, n_slots};
    free(junk), free(s);
}

static void pool_free(struct pool *P)
{
    pb_free(&P->k), pb_free(&P->v), pb_free(&P->ks), pb_free(&P->vs);
}

static struct dray_kv_store_args g_kvs[2];
static const struct dray_kv_store_args *kvs_of(int s) { return &g_kvs[s]; }

/* Store n_tok tokens at the given slots on both sides. */
static void store(struct pool *P, uint32_t n_tok, const int32_t *slots)
{
    const struct dray_kv_pool *p = &P->p[0];
    uint32_t row = p->n_kv_head * p->head_dim, stride = row + 2;
    float *k = randf((size_t)n_tok * stride, -2, 2), *v = randf((size_t)n_tok * stride, -2, 2);
    for (uint32_t i = 0; i < p->head_dim; i++)
        k[i] = 0.0f; /* an all-zero head stores scale 0 */
    struct pbuf bk = pb_new(k, (size_t)n_tok * stride * 4), bv = pb_new(v, (size_t)n_tok * stride * 4),
                bsl = pb_new(slots, n_tok * 4);
    for (int s = 0; s < 2; s++)
        g_kvs[s] = (struct dray_kv_store_args){V(&bk, s, 0), V(&bv, s, 0), V(&bsl, s, 0),
                                               &P->p[s], n_tok, stride, stride};
    RUN_BOTH(kv_store, kvs_of);
    free(k), free(v);
    pb_free(&bk), pb_free(&bv), pb_free(&bsl);
}

static void test_opencl_kv_store_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(6);
    for (uint32_t dtype = DRAY_F16; dtype <= DRAY_I8; dtype++) {
        struct pool P;
        pool_new(&P, dtype, 2, 80, 4, 6);
        int32_t slots[5] = {3, -1, 17, 0, 22};
        store(&P, 5, slots);
        uint8_t *o, *r;
        pb_get(&P.k, (void **)&o, (void **)&r);
        size_t n = P.k.n, diff = 0;
        for (size_t i = 0; i < n; i++)
            diff += o[i] != r[i];
        /* f16: exact; int8: exact but for ties (|q| off by one in <= 1e-3) */
        assert_true(diff <= (dtype == DRAY_I8 ? n / 1000 : 0));
        free(o), free(r);
        if (dtype == DRAY_I8) {
            float *so, *sr;
            pb_get(&P.ks, (void **)&so, (void **)&sr);
            expect_close("kv scales", so, sr, P.ks.n / 4, 0, 0);
            free(so), free(sr);
        }
        pool_free(&P);
    }
}

static struct dray_attention_args g_att[2];
static const struct dray_attention_args *att_of(int s) { return &g_att[s]; }

/* A mixed batch: a fresh prefill of 5, a decode at kv_len 23, a prefill chunk of 4
 * ending at kv_len 14. Blocks of 4, GQA 6 query heads on 2 kv heads. With a
 * window, blocks wholly before every visible position are -1 in the table. */
static void attention_case_capped(uint32_t dtype, uint32_t window, uint32_t hd, float softcap)
{
    const uint32_t bs = 4, n_kv = 2, n_head = 6, n_blocks = 20;
    struct pool P;
    pool_new(&P, dtype, n_kv, hd, bs, n_blocks);
    /* sequence s owns blocks given by its table row; kv_len positions each */
    const int32_t seqs[3][4] = {{0, 5, 5, 0}, {5, 1, 23, 2}, {6, 4, 14, 8}};
    int32_t bt[12] = {11, 3, /* seq 0: 2 blocks */
                      0, 7, 12, 4, 9, 15, /* seq 1: 6 blocks */
                      1, 19, 5, 2}; /* seq 2: 4 blocks */
    /* store every cached position of every sequence */
    for (int s = 0; s < 3; s++) {
        int32_t slots[32];
        uint32_t kv_len = (uint32_t)seqs[s][2];
        for (uint32_t p = 0; p < kv_len; p++)
            slots[p] = bt[seqs[s][3] + p / bs] * (int32_t)bs + (int32_t)(p % bs);
        store(&P, kv_len, slots);
    }
    if (window) /* holes the mask never reaches: seq 1 sees only positions >= 23 - window */
        for (uint32_t b = 0; (b + 1) * bs <= 23 - window; b++)
            bt[2 + b] = -1;
    uint32_t n_tok = 10, sq = n_head * hd + 4, so = n_head * hd;
    float q_amp = softcap > 0.0f ? 4.0f : 1.0f; /* louder: the cap bends most scores */
    float *q = randf((size_t)n_tok * sq, -q_amp, q_amp);
    struct pbuf bq = pb_new(q, (size_t)n_tok * sq * 4), bo = pb_new(NULL, (size_t)n_tok * so * 4),
                bseq = pb_new(seqs, sizeof(seqs)), bbt = pb_new(bt, sizeof(bt));
    for (int s = 0; s < 2; s++)
        g_att[s] = (struct dray_attention_args){V(&bq, s, 0), V(&bo, s, 0), V(&bseq, s, 0),
                                                V(&bbt, s, 0), &P.p[s], n_tok, 3, n_head, 23,
                                                sq, so, window, 1.0f / sqrtf((float)hd), softcap};
    RUN_BOTH(attention, att_of);
    float *o, *r;
    pb_get(&bo, (void **)&o, (void **)&r);
    char what[64];
    snprintf(what, sizeof(what), "attention %s window %u head_dim %u softcap %g", dtype == DRAY_I8 ? "I8" : "F16",
             window, hd, (double)softcap);
    /* values are in [-2, 2]: I8 abs 2e-3 * max|v|, F16 1e-4 * max|v| */
    expect_close(what, o, r, (size_t)n_tok * so, dtype == DRAY_I8 ? 4e-3 : 2e-4, 0);
    free(o), free(r), free(q);
    pb_free(&bq), pb_free(&bo), pb_free(&bseq), pb_free(&bbt);
    pool_free(&P);
}

static void attention_case(uint32_t dtype, uint32_t window, uint32_t hd)
{
    attention_case_capped(dtype, window, hd, 0.0f);
}

/* v4: Gemma 2's logit soft-capping on the same mixed batches (prefill, decode
 * and a prefill chunk, GQA), with and without a window, I8 and F16 KV. */
static void test_opencl_attention_softcap_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(17);
    attention_case_capped(DRAY_I8, 0, 64, 1.5f);
    attention_case_capped(DRAY_F16, 0, 64, 3.0f);
    attention_case_capped(DRAY_I8, 6, 80, 2.0f);
    attention_case_capped(DRAY_F16, 6, 256, 50.0f);
}

static void test_opencl_attention_matches_reference_on_a_mixed_batch(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(7);
    attention_case(DRAY_I8, 0, 64);
    attention_case(DRAY_F16, 0, 64);
    attention_case(DRAY_I8, 6, 80);
    attention_case(DRAY_F16, 6, 256);
}

static struct dray_gated_act_args g_ga[2];
static const struct dray_gated_act_args *ga_of(int s) { return &g_ga[s]; }
static struct dray_add_args g_add[2];
static const struct dray_add_args *add_of(int s) { return &g_add[s]; }

static void test_opencl_eltwise_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(8);
    uint32_t n_tok = 3, n = 2000, st = 2048;
    for (uint32_t act = 0; act < 2; act++) {
        float *g = randf((size_t)n_tok * st, -6, 6), *u = randf((size_t)n_tok * st, -2, 2);
        struct pbuf bg = pb_new(g, (size_t)n_tok * st * 4), bu = pb_new(u, (size_t)n_tok * st * 4);
        for (int s = 0; s < 2; s++) /* in place over gate */
            g_ga[s] = (struct dray_gated_act_args){V(&bg, s, 0), V(&bu, s, 0), V(&bg, s, 0),
                                                   n_tok, n, st, st, st, act};
        RUN_BOTH(gated_act, ga_of);
        float *o, *r;
        pb_get(&bg, (void **)&o, (void **)&r);
        expect_close(act ? "silu" : "gelu_tanh", o, r, (size_t)n_tok * st, 1e-6, 1e-5);
        free(o), free(r), free(g), free(u);
        pb_free(&bg), pb_free(&bu);
    }
    size_t n_add = 100003;
    float *a = randf(n_add, -5, 5), *b = randf(n_add, -5, 5);
    struct pbuf ba = pb_new(a, n_add * 4), bb = pb_new(b, n_add * 4);
    for (int s = 0; s < 2; s++)
        g_add[s] = (struct dray_add_args){V(&ba, s, 0), V(&bb, s, 0), V(&bb, s, 0), n_add};
    RUN_BOTH(add, add_of);
    float *o, *r;
    pb_get(&bb, (void **)&o, (void **)&r);
    expect_close("add", o, r, n_add, 0, 0);
    free(o), free(r), free(a), free(b);
    pb_free(&ba), pb_free(&bb);
}

static void test_opencl_copy_and_fill_follow_memmove_and_pattern_rules(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    uint8_t host[256], back[256];
    for (int i = 0; i < 256; i++)
        host[i] = (uint8_t)i;
    struct dray_buf *b;
    assert_int_equal(ocl.ops->alloc(ocl.ctx, 256, &b), 0);
    assert_int_equal(ocl.ops->upload(ocl.ctx, (struct dray_view){b, 0}, host, 256), 0);
    /* overlapping copy forward by 3 bytes: memmove semantics */
    assert_int_equal(ocl.ops->copy(ocl.ctx, (struct dray_view){b, 3}, (struct dray_view){b, 0}, 100), 0);
    memmove(host + 3, host, 100);
    /* fill at an odd offset: the pattern starts at the first filled byte */
    assert_int_equal(ocl.ops->fill(ocl.ctx, (struct dray_view){b, 129}, 0xa1b2c3d4u, 12), 0);
    for (int i = 0; i < 12; i++)
        host[129 + i] = (uint8_t)(0xa1b2c3d4u >> (8 * (i % 4)));
    assert_int_equal(ocl.ops->fill(ocl.ctx, (struct dray_view){b, 200}, 0x01020304u, 16), 0);
    for (int i = 0; i < 16; i++)
        host[200 + i] = (uint8_t)(0x01020304u >> (8 * (i % 4)));
    assert_int_equal(ocl.ops->download(ocl.ctx, back, (struct dray_view){b, 0}, 256), 0);
    assert_memory_equal(back, host, 256);
    /* out of range and odd sizes are refused with a reason */
    assert_int_equal(ocl.ops->fill(ocl.ctx, (struct dray_view){b, 0}, 0, 6), DRAY_EINVAL);
    assert_int_equal(ocl.ops->download(ocl.ctx, back, (struct dray_view){b, 200}, 57), DRAY_EINVAL);
    assert_non_null(strstr(ocl.ops->last_error(ocl.ctx), "overrun"));
    ocl.ops->free(ocl.ctx, b);
}

/* ---- packed weights (version 3) ---- */

/* The host arrays of one packed matrix, random, in format f. */
struct hostw {
    struct dray_wformat f;
    uint32_t n_out, k;
    uint8_t *codes;
    void *d, *m, *sub; /* sub: two-level formats only */
    float *w; /* W in f32 [n_out][k] (dray_util_packed_row): for tolerances */
};

/* Random scale values of format f (f16 or f32) in [lo, hi]. */
static void *rand_scales(struct dray_wformat f, size_t n, float lo, float hi)
{
    if (f.scale == DRAY_WSCALE_F32)
        return randf(n, lo, hi);
    uint16_t *h = malloc(n * 2 + 1);
    for (size_t i = 0; i < n; i++)
        h[i] = dray_util_f32_to_f16(dray_test_randf(lo, hi));
    return h;
}

/* Random sub-scales of a two-level format: 6-bit (s, n) pairs, or any int8. */
static uint8_t *rand_sub(struct dray_wformat f, size_t n)
{
    uint8_t *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        s[i] = (uint8_t)(dray_test_rand() % (f.bits == 6 ? 256u : 64u));
    return s;
}

static void hostw_new(struct hostw *w, struct dray_wformat f, uint32_t n_out, uint32_t k)
{
    size_t n = (size_t)n_out * (k / 32), nb = n * dray_util_wformat_group_bytes(f);
    size_t ns = (size_t)n_out * dray_util_wformat_scales_per_row(f, k);
    /* two levels: d = D * sub up to 63 or 128 times D, so D is that much smaller */
    float dmax = f.super ? 0.0005f : 0.02f, mmax = f.super ? 0.002f : 0.1f;
    *w = (struct hostw){.f = f, .n_out = n_out, .k = k};
    w->codes = malloc(nb + 1);
    for (size_t i = 0; i < nb; i++) /* every byte is a valid code of every format */
        w->codes[i] = (uint8_t)dray_test_rand();
    w->d = rand_scales(f, ns, -dmax, dmax);
    w->m = f.has_min ? rand_scales(f, ns, f.super ? 0.0f : -mmax, mmax) : NULL;
    w->sub = f.super ? rand_sub(f, (size_t)n_out * dray_util_wformat_sub_bytes(f, k)) : NULL;
    w->w = malloc((size_t)n_out * k * sizeof(float));
    for (uint32_t o = 0; o < n_out; o++)
        dray_util_packed_row(f, k, w->codes, w->d, w->m, w->sub, o, w->w + (size_t)o * k);
}

static void hostw_free(struct hostw *w)
{
    free(w->codes), free(w->d), free(w->m), free(w->sub), free(w->w);
}

/* What the device may hold: one level, exactly the host's codes + d + m; two
 * levels, the GGUF file's bytes (Q4_K 144, Q5_K 176, Q6_K 210 per 256). */
static uint64_t pk_device_bytes(struct dray_wformat f, uint32_t n_out, uint32_t k)
{
    uint64_t n = (uint64_t)n_out * (k / 32);
    if (f.super)
        return (uint64_t)n_out * (k / 256) * (f.bits == 4 ? 144u : f.bits == 5 ? 176u : 210u);
    uint32_t sb = dray_util_wformat_scale_bytes(f);
    return n * (dray_util_wformat_group_bytes(f) + sb * (1u + f.has_min));
}

static struct dray_packed *pk_create(const struct hostw *w, uint32_t uses)
{
    struct dray_weight_desc desc = {.size = sizeof(desc), .format = w->f, .n_out = w->n_out,
                                    .k = w->k, .uses = uses, .codes = w->codes, .d = w->d,
                                    .m = w->m, .sub = w->sub};
    struct dray_packed *h = NULL;
    uint64_t bytes = 0;
    int rc = ocl.ops->weight_create(ocl.ctx, &desc, &h, &bytes);
    if (rc != 0)
        fail_msg("weight_create: rc %d: %s", rc, ocl.ops->last_error(ocl.ctx));
    assert_int_equal(bytes, pk_device_bytes(w->f, w->n_out, w->k));
    return h;
}

/* backend.h's reference of matmul on packed weights for token row xt: the sum
 * over passes of dray_util_packed_dot, pass 2 on the residual x - q*sx. */
static void pk_ref_token(const struct hostw *w, const float *xt, uint32_t passes, float *pass_out)
{
    uint32_t k = w->k, G = k / 32;
    int8_t *q = malloc(k);
    float *sx = malloc(G * sizeof(float)), *r = malloc(k * sizeof(float));
    memcpy(r, xt, k * sizeof(float));
    for (uint32_t o = 0; o < w->n_out; o++)
        pass_out[o] = 0.0f;
    for (uint32_t p = 0; p < passes; p++) {
        for (uint32_t g = 0; g < G; g++)
            sx[g] = dray_util_quant_group(r + 32 * g, q + 32 * g);
        for (uint32_t o = 0; o < w->n_out; o++)
            pass_out[o] += dray_util_packed_dot(w->f, k, w->codes, w->d, w->m, w->sub, o, q, sx);
        for (uint32_t c = 0; c < k; c++)
            r[c] = r[c] - (float)q[c] * sx[c / 32];
    }
    free(q), free(sx), free(r);
}

/* One matmul on a handle of format f against the host reference; x and out
 * have padded strides and offset views, token 1 has a zero group and a spike. */
static void pk_matmul_case(struct dray_wformat f, uint32_t n_tok, uint32_t n_out, uint32_t k,
                           uint32_t passes, uint32_t acc)
{
    struct hostw w;
    hostw_new(&w, f, n_out, k);
    struct dray_packed *h = pk_create(&w, DRAY_WUSE_MATMUL);
    uint32_t sx = k + 5, so = n_out + 3, xo = 3, oo = 2; /* strides and view offsets (floats) */
    size_t nx = xo + (size_t)n_tok * sx, no = oo + (size_t)n_tok * so;
    float *x = randf(nx, -1, 1), *out0 = randf(no, -1, 1), *out = malloc(no * sizeof(float));
    if (n_tok > 1) {
        memset(x + xo + sx, 0, 32 * sizeof(float)); /* a zero group: q = 0, sx = 0 */
        x[xo + sx + k - 1] = 50.0f;                 /* an outlier costs only its group */
    }
    struct dray_buf *bx, *bo;
    assert_int_equal(ocl.ops->alloc(ocl.ctx, nx * 4, &bx), 0);
    assert_int_equal(ocl.ops->alloc(ocl.ctx, no * 4, &bo), 0);
    assert_int_equal(ocl.ops->upload(ocl.ctx, (struct dray_view){bx, 0}, x, nx * 4), 0);
    assert_int_equal(ocl.ops->upload(ocl.ctx, (struct dray_view){bo, 0}, out0, no * 4), 0);
    struct dray_matmul_args a = {.x = {bx, xo * 4}, .out = {bo, oo * 4}, .n_tok = n_tok,
                                 .n_out = n_out, .k = k, .stride_x = sx, .stride_out = so,
                                 .accumulate = acc, .wdtype = DRAY_PACKED, .packed = h,
                                 .passes = passes};
    int rc = ocl.ops->matmul(ocl.ctx, &a);
    if (rc != 0)
        fail_msg("matmul packed: rc %d: %s", rc, ocl.ops->last_error(ocl.ctx));
    assert_int_equal(ocl.ops->download(ocl.ctx, out, (struct dray_view){bo, 0}, no * 4), 0);

    char name[32], what[128];
    snprintf(what, sizeof(what), "matmul packed %s n_tok %u n_out %u k %u passes %u acc %u",
             dray_util_wformat_name(f, name, sizeof(name)), n_tok, n_out, k, passes, acc);
    float *ref = malloc(n_out * sizeof(float));
    for (uint32_t t = 0; t < n_tok; t++) {
        const float *xt = x + xo + (size_t)t * sx;
        const float *o0 = out0 + oo + (size_t)t * so, *ot = out + oo + (size_t)t * so;
        pk_ref_token(&w, xt, passes, ref);
        for (uint32_t o = 0; o < n_out; o++) {
            double mag = 0;
            for (uint32_t c = 0; c < k; c++)
                mag += fabs((double)xt[c] * w.w[(size_t)o * k + c]);
            double r = (acc ? o0[o] : 0.0f) + ref[o], tol = 1e-4 * (mag + (acc ? fabs(o0[o]) : 0));
            if (!(fabs(ot[o] - r) <= tol))
                fail_msg("%s: token %u output %u: opencl %.9g vs reference %.9g (tolerance %g)", what,
                         t, o, ot[o], r, tol);
        }
        for (uint32_t o = n_out; o < so; o++) /* the padding is not written */
            assert_true(ot[o] == o0[o]);
    }
    assert_true(out[0] == out0[0] && out[1] == out0[1]);
    free(x), free(out0), free(out), free(ref);
    ocl.ops->free(ocl.ctx, bx), ocl.ops->free(ocl.ctx, bo);
    ocl.ops->weight_free(ocl.ctx, h);
    hostw_free(&w);
}

static void test_opencl_caps_declare_packed_weights(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    assert_int_equal(ocl.ops->version, 4);
    assert_non_null(ocl.ops->weight_create);
    assert_non_null(ocl.ops->weight_free);
    struct dray_op_caps c = {.size = sizeof(c)};
    assert_int_equal(ocl.ops->op_caps(0, &c), 0);
    assert_int_equal(c.matmul_wformats, DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K);
    assert_int_equal(c.embed_wformats, DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K);
    assert_int_equal(c.matmul_passes, 3);
    /* the retired version-2 grouped dtypes are not declared */
    for (uint32_t t = DRAY_Q8G32; t <= DRAY_Q4G32H_X2; t++)
        for (int op = 0; op < DRAY_OP_COUNT; op++)
            assert_false(c.op_dtypes[op] & DRAY_DTYPE_BIT(t));
}

/* Every format, passes 1 and 2, accumulate 0 and 1, n_tok 1 and 5; k and
 * n_out cycle over the cases so that every format meets every k. */
static void test_opencl_matmul_packed_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(9);
    static const uint32_t ks[] = {32, 96, 640, 2048}, n_outs[] = {16, 40, 257};
    for (uint32_t i = 0; i < 12; i++) {
        struct dray_wformat f = dray_util_wformat_of_bit(i);
        for (uint32_t c = 0; c < 8; c++) {
            uint32_t passes = 1 + (c & 1), acc = (c >> 1) & 1, n_tok = c & 4 ? 5 : 1;
            pk_matmul_case(f, n_tok, n_outs[(c + i) % 3], ks[(c + i) % 4], passes, acc);
        }
    }
}

/* The two-level formats (Q4_K, Q5_K, Q6_K shapes): every n_tok of 1, 3, 17
 * with passes 1 and 2, accumulate 0 and 1; k over 256, 512, 2304 and n_out
 * over counts that leave a work-group part-filled. */
static void test_opencl_matmul_two_level_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(12);
    static const uint32_t ks[] = {256, 512, 2304}, n_outs[] = {40, 257, 70}, n_toks[] = {1, 3, 17};
    for (uint32_t i = 12; i < 15; i++) {
        struct dray_wformat f = dray_util_wformat_of_bit(i);
        for (uint32_t c = 0; c < 12; c++) {
            uint32_t passes = 1 + (c & 1), acc = (c >> 1) & 1, n_tok = n_toks[c / 4];
            pk_matmul_case(f, n_tok, n_outs[(c + i) % 3], ks[c % 3], passes, acc);
        }
    }
}

/* Gather 5 rows (first, last, a repeat) of a random n_rows x dim table of
 * format f, times 1.7, against dray_util_packed_row. */
static void pk_embed_case(struct dray_wformat f, uint32_t n_rows, uint32_t dim, uint32_t uses,
                          struct dray_buf *bi, struct dray_buf *bo, const int32_t ids[5])
{
    const uint32_t n_tok = 5;
    float *out = malloc((size_t)n_tok * dim * 4), *ref = malloc((size_t)n_tok * dim * 4);
    struct hostw w;
    hostw_new(&w, f, n_rows, dim);
    struct dray_packed *h = pk_create(&w, uses);
    struct dray_embed_args a = {.ids = {bi, 0}, .out = {bo, 0}, .dtype = DRAY_PACKED,
                                .n_tok = n_tok, .dim = dim, .n_rows = n_rows, .scale = 1.7f,
                                .packed = h};
    int rc = ocl.ops->embed(ocl.ctx, &a);
    if (rc != 0)
        fail_msg("embed packed: rc %d: %s", rc, ocl.ops->last_error(ocl.ctx));
    size_t nbytes = (size_t)n_tok * dim * 4;
    assert_int_equal(ocl.ops->download(ocl.ctx, out, (struct dray_view){bo, 0}, nbytes), 0);
    for (uint32_t t = 0; t < n_tok; t++) {
        float *r = ref + (size_t)t * dim;
        dray_util_packed_row(f, dim, w.codes, w.d, w.m, w.sub, (uint64_t)ids[t], r);
        for (uint32_t j = 0; j < dim; j++)
            r[j] *= 1.7f;
    }
    char name[32], what[64];
    snprintf(what, sizeof(what), "embed packed %s dim %u",
             dray_util_wformat_name(f, name, sizeof(name)), dim);
    expect_close(what, out, ref, (size_t)n_tok * dim, 0, 1e-6);
    ocl.ops->weight_free(ocl.ctx, h);
    hostw_free(&w);
    free(out), free(ref);
}

/* Every format; two levels at dim 256, 512 and 2304. */
static void test_opencl_embed_packed_matches_reference(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(10);
    const uint32_t n_rows = 40, max_dim = 2304;
    int32_t ids[5] = {n_rows - 1, 0, 17, 17, 3};
    struct dray_buf *bi, *bo;
    assert_int_equal(ocl.ops->alloc(ocl.ctx, sizeof(ids), &bi), 0);
    assert_int_equal(ocl.ops->alloc(ocl.ctx, (size_t)5 * max_dim * 4, &bo), 0);
    assert_int_equal(ocl.ops->upload(ocl.ctx, (struct dray_view){bi, 0}, ids, sizeof(ids)), 0);
    for (uint32_t i = 0; i < 15; i++) {
        /* a tied table and head: both uses on odd formats */
        uint32_t uses = DRAY_WUSE_EMBED | (i & 1 ? DRAY_WUSE_MATMUL : 0);
        if (i < 12) {
            pk_embed_case(dray_util_wformat_of_bit(i), n_rows, 96, uses, bi, bo, ids);
            continue;
        }
        static const uint32_t dims[] = {256, 512, 2304};
        for (uint32_t d = 0; d < 3; d++)
            pk_embed_case(dray_util_wformat_of_bit(i), n_rows, dims[d], uses, bi, bo, ids);
    }
    ocl.ops->free(ocl.ctx, bi), ocl.ops->free(ocl.ctx, bo);
}

static void test_opencl_packed_rejects_bad_arguments(void **state)
{
    (void)state;
    SKIP_IF_NO_DEVICE();
    dray_test_seed(11);
    struct hostw w;
    hostw_new(&w, dray_util_wformat_of_bit(1), 16, 64); /* q4 f32 +min */
    struct dray_weight_desc desc = {.size = sizeof(desc), .format = {6, 0, 1, 0}, .n_out = 16,
                                    .k = 64, .uses = DRAY_WUSE_MATMUL, .codes = w.codes, .d = w.d,
                                    .m = w.m};
    struct dray_packed *h = (struct dray_packed *)&desc;
    uint64_t bytes = 0;
    assert_int_equal(ocl.ops->weight_create(ocl.ctx, &desc, &h, &bytes), DRAY_EINVAL);
    assert_null(h);
    assert_true(ocl.ops->last_error(ocl.ctx)[0] != '\0');
    ocl.ops->weight_free(ocl.ctx, NULL); /* a no-op */

    h = pk_create(&w, DRAY_WUSE_MATMUL);
    struct dray_buf *b;
    assert_int_equal(ocl.ops->alloc(ocl.ctx, 4096, &b), 0);
    struct dray_matmul_args a = {.x = {b, 0}, .out = {b, 2048}, .n_tok = 1, .n_out = 17, .k = 64,
                                 .stride_x = 64, .stride_out = 17, .wdtype = DRAY_PACKED,
                                 .packed = h, .passes = 1};
    assert_int_equal(ocl.ops->matmul(ocl.ctx, &a), DRAY_EINVAL); /* n_out is not the handle's */
    assert_non_null(strstr(ocl.ops->last_error(ocl.ctx), "n_out"));
    a.n_out = a.stride_out = 16;
    a.passes = 3;
    assert_int_equal(ocl.ops->matmul(ocl.ctx, &a), DRAY_EINVAL);
    struct dray_embed_args e = {.ids = {b, 0}, .out = {b, 2048}, .dtype = DRAY_PACKED, .n_tok = 1,
                                .dim = 64, .n_rows = 16, .scale = 1.0f, .packed = h};
    assert_int_equal(ocl.ops->embed(ocl.ctx, &e), DRAY_EINVAL); /* not created for embed */
    ocl.ops->free(ocl.ctx, b);
    ocl.ops->weight_free(ocl.ctx, h);
    hostw_free(&w);
    /* two levels: k a multiple of 256, sub given, 4/5-bit sub-scales of 6 bits */
    struct hostw kw;
    hostw_new(&kw, dray_util_wformat_of_bit(13), 4, 256);
    struct dray_weight_desc kd = {.size = sizeof(kd), .format = kw.f, .n_out = 4, .k = 224,
                                  .uses = DRAY_WUSE_MATMUL, .codes = kw.codes, .d = kw.d,
                                  .m = kw.m, .sub = kw.sub};
    assert_int_equal(ocl.ops->weight_create(ocl.ctx, &kd, &h, &bytes), DRAY_EINVAL);
    kd.k = 256, kd.sub = NULL;
    assert_int_equal(ocl.ops->weight_create(ocl.ctx, &kd, &h, &bytes), DRAY_EINVAL);
    kd.sub = kw.sub, ((uint8_t *)kw.sub)[9] = 64;
    assert_int_equal(ocl.ops->weight_create(ocl.ctx, &kd, &h, &bytes), DRAY_EINVAL);
    assert_null(h);
    hostw_free(&kw);
    /* and the plugin keeps working */
    pk_matmul_case(dray_util_wformat_of_bit(9), 5, 40, 96, 2, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opencl_props_declare_every_op),
        cmocka_unit_test(test_opencl_embed_matches_reference),
        cmocka_unit_test(test_opencl_embed_handles_a_168mb_table),
        cmocka_unit_test(test_opencl_rmsnorm_matches_reference),
        cmocka_unit_test(test_opencl_matmul_matches_reference),
        cmocka_unit_test(test_opencl_matmul_rejects_bad_arguments),
        cmocka_unit_test(test_opencl_rope_matches_reference_at_long_positions),
        cmocka_unit_test(test_opencl_rope_without_fp64_stays_accurate),
        cmocka_unit_test(test_opencl_kv_store_matches_reference),
        cmocka_unit_test(test_opencl_attention_matches_reference_on_a_mixed_batch),
        cmocka_unit_test(test_opencl_attention_softcap_matches_reference),
        cmocka_unit_test(test_opencl_eltwise_matches_reference),
        cmocka_unit_test(test_opencl_copy_and_fill_follow_memmove_and_pattern_rules),
        cmocka_unit_test(test_opencl_caps_declare_packed_weights),
        cmocka_unit_test(test_opencl_matmul_packed_matches_reference),
        cmocka_unit_test(test_opencl_matmul_two_level_matches_reference),
        cmocka_unit_test(test_opencl_embed_packed_matches_reference),
        cmocka_unit_test(test_opencl_packed_rejects_bad_arguments),
    };
    if (setup_all(NULL) != 0) {
        fprintf(stderr, "cannot open the OpenCL device or the CPU reference\n");
        return 1;
    }
    if (!ocl.ctx) {
        printf("skip: %s\n", g_skip);
        return 77;
    }
    int rc = cmocka_run_group_tests(tests, NULL, teardown_all);
    return rc;
}
