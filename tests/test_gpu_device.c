/*
 * Device tests of the GPU plugins: every op on the first CUDA (else HIP) device
 * against the CPU plugin opened with reference = 1, under each op's tolerance
 * from backend.h. Shapes hit every kernel path: dp4a decode, the tensor-core
 * prefill tile, the byte path (k not a multiple of 16) with outliers, f32
 * weights; flash prefill and split-K decode attention with GQA, windows and -1
 * holes, over int8 and f16 caches; packed weights (ABI v3) in every format,
 * version 4's two-level ones (Q4_K, Q5_K, Q6_K shapes) included, one and two
 * activation passes, against backend.h's host reference
 * (dray_util_quant_group, dray_util_packed_dot / _row). Without a device the
 * whole file exits 77 (meson: SKIP) after one line saying why.
 */
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

struct side {
    void *handle;
    const struct dray_ops *o;
    struct dray_ctx *c;
};
static struct side G, C; /* GPU under test, CPU reference */

static char logged[256]; /* the plugin's reason for having no device */

static void quiet_log(int level, const char *plugin, const char *msg)
{
    (void)level, (void)plugin;
    snprintf(logged, sizeof(logged), "%s", msg ? msg : "");
}
static const struct dray_host host = {.version = DRAY_ABI_VERSION, .alloc = malloc, .free = free, .log = quiet_log};

static int load(const char *name, struct side *s, char *why, size_t whylen)
{
    char path[1024];
    const char *root = getenv("DRAY_BUILD_ROOT");
    snprintf(path, sizeof(path), "%s/backends/%s/libdray-%s.so", root ? root : ".", name, name);
    s->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!s->handle) {
        snprintf(why, whylen, "%s: %s", name, dlerror());
        return -1;
    }
    dray_plugin_negotiate_fn neg = (dray_plugin_negotiate_fn)dlsym(s->handle, DRAY_PLUGIN_SYMBOL);
    uint32_t v = DRAY_ABI_VERSION, n = 0;
    logged[0] = '\0';
    if (!neg || neg(&v, &host, &s->o, why, whylen) || s->o->device_count(&n) || n == 0) {
        if (!why[0])
            snprintf(why, whylen, "%s: %s", name, logged[0] ? logged : "no device");
        return -1;
    }
    struct dray_open_options opt = {.size = sizeof(opt), .reference = strcmp(name, "cpu") == 0};
    return s->o->open(0, &opt, &s->c, why, whylen) ? -1 : 0;
}

/* --------------------------------------------------- paired buffers */

struct pb {
    struct dray_buf *g, *c;
    size_t n;
};

static struct pb mk(const void *data, size_t n)
{
    struct pb b = {NULL, NULL, n};
    assert_int_equal(G.o->alloc(G.c, n, &b.g), 0);
    assert_int_equal(C.o->alloc(C.c, n, &b.c), 0);
    void *z = data ? NULL : calloc(1, n ? n : 1);
    assert_int_equal(G.o->upload(G.c, (struct dray_view){b.g, 0}, data ? data : z, n), 0);
    assert_int_equal(C.o->upload(C.c, (struct dray_view){b.c, 0}, data ? data : z, n), 0);
    free(z);
    return b;
}

static struct pb mk_rand(size_t n_floats, float lo, float hi)
{
    float *f = malloc(n_floats * sizeof(float));
    for (size_t i = 0; i < n_floats; i++)
        f[i] = dray_test_randf(lo, hi);
    struct pb b = mk(f, n_floats * sizeof(float));
    free(f);
    return b;
}

static struct pb mk_i8(size_t n)
{
    int8_t *q = malloc(n);
    for (size_t i = 0; i < n; i++)
        q[i] = (int8_t)((int)(dray_test_rand() % 255) - 127);
    struct pb b = mk(q, n);
    free(q);
    return b;
}

static struct dray_view V(struct pb b, int gpu) { return (struct dray_view){gpu ? b.g : b.c, 0}; }

static void rel(struct pb b)
{
    G.o->free(G.c, b.g);
    C.o->free(C.c, b.c);
}

/* Download both sides; max |g - c| and max |c|. */
static void diff_f32(struct pb b, size_t n, double *maxdiff, double *maxref)
{
    float *g = malloc(n * 4), *c = malloc(n * 4);
    assert_int_equal(G.o->download(G.c, g, V(b, 1), n * 4), 0);
    assert_int_equal(C.o->download(C.c, c, V(b, 0), n * 4), 0);
    *maxdiff = 0;
    *maxref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - c[i]);
        if (!(d <= *maxdiff)) /* NaN counts as a failure */
            *maxdiff = isnan(d) ? INFINITY : d;
        if (fabs(c[i]) > *maxref)
            *maxref = fabs(c[i]);
    }
    free(g);
    free(c);
}

static void expect_close(struct pb b, size_t n, double abs_tol, double rel_tol, const char *what)
{
    double md, mr;
    diff_f32(b, n, &md, &mr);
    if (md > abs_tol + rel_tol * mr)
        fail_msg("%s: max diff %g > %g (max |ref| %g)", what, md, abs_tol + rel_tol * mr, mr);
}

#define BOTH(call)                                                                   \
    do {                                                                             \
        for (int gpu = 0; gpu < 2; gpu++) {                                          \
            struct side *s_ = gpu ? &G : &C;                                         \
            int rc_ = (call);                                                        \
            if (rc_)                                                                 \
                fail_msg("%s: rc %d: %s", gpu ? "gpu" : "cpu", rc_, s_->o->last_error(s_->c)); \
        }                                                                            \
    } while (0)

/* --------------------------------------------------------------- ops */

static void test_gpu_embed_matches_cpu_for_i8_and_f32(void **state)
{
    (void)state;
    int32_t ids[9] = {0, 49, 3, 3, 17, 22, 48, 1, 30};
    struct pb id = mk(ids, sizeof(ids)), t8 = mk_i8(50 * 70), rs = mk_rand(50, 0.001f, 0.1f);
    struct pb t32 = mk_rand(50 * 70, -2, 2), out = mk(NULL, 9 * 70 * 4);
    for (uint32_t dt = 0; dt < 2; dt++) {
        BOTH(s_->o->embed(s_->c, &(struct dray_embed_args){.ids = V(id, gpu), .table = V(dt ? t32 : t8, gpu),
                                                           .row_scale = V(rs, gpu), .out = V(out, gpu),
                                                           .dtype = dt ? DRAY_F32 : DRAY_I8, .n_tok = 9,
                                                           .dim = 70, .n_rows = 50, .scale = 25.3f}));
        expect_close(out, 9 * 70, 0, 1e-6, dt ? "embed f32" : "embed i8");
    }
    /* an id past the table is refused, never read */
    int32_t bad[2] = {1, 50};
    struct pb bid = mk(bad, sizeof(bad));
    int rc = G.o->embed(G.c, &(struct dray_embed_args){.ids = V(bid, 1), .table = V(t32, 1), .out = V(out, 1),
                                                        .dtype = DRAY_F32, .n_tok = 2, .dim = 70, .n_rows = 50});
    if (rc == 0)
        rc = G.o->synchronize(G.c);
    assert_int_equal(rc, DRAY_EINVAL);
    rel(id), rel(t8), rel(rs), rel(t32), rel(out), rel(bid);
}

static void test_gpu_rmsnorm_matches_cpu_per_head_and_in_place(void **state)
{
    (void)state;
    struct pb x = mk_rand(5 * 310, -3, 3), w = mk_rand(100, 0.5f, 1.5f), out = mk(NULL, 5 * 300 * 4);
    BOTH(s_->o->rmsnorm(s_->c, &(struct dray_rmsnorm_args){.x = V(x, gpu), .w = V(w, gpu), .out = V(out, gpu),
                                                           .n_tok = 5, .n_head = 3, .n = 100, .stride_x = 310,
                                                           .stride_out = 300, .eps = 1e-6f}));
    expect_close(out, 5 * 300, 0, 1e-5, "rmsnorm");
    BOTH(s_->o->rmsnorm(s_->c, &(struct dray_rmsnorm_args){.x = V(x, gpu), .w = V(w, gpu), .out = V(x, gpu),
                                                           .n_tok = 5, .n_head = 1, .n = 100, .stride_x = 310,
                                                           .stride_out = 310, .eps = 1e-6f}));
    expect_close(x, 5 * 310, 0, 1e-5, "rmsnorm in place");
    rel(x), rel(w), rel(out);
}

static void run_matmul(uint32_t n_tok, uint32_t n_out, uint32_t k, uint32_t n_outlier, uint32_t acc, uint32_t wdt)
{
    struct pb x = mk_rand((size_t)n_tok * (k + 3), -2, 2), out = mk_rand((size_t)n_tok * n_out, -1, 1);
    struct pb w = wdt == DRAY_I8 ? mk_i8((size_t)n_out * k) : mk_rand((size_t)n_out * k, -1, 1);
    struct pb ws = mk_rand(n_out, 0.001f, 0.02f), ow = mk_rand((size_t)n_out * (n_outlier + 1), -1, 1);
    int32_t idx[8];
    for (uint32_t j = 0; j < n_outlier; j++)
        idx[j] = (int32_t)(j * 7 + 2);
    struct pb oi = mk(idx, sizeof(idx));
    if (n_outlier) { /* int8 weights are 0 on outlier channels (contract) */
        int8_t *hw = malloc((size_t)n_out * k);
        for (size_t i = 0; i < (size_t)n_out * k; i++)
            hw[i] = (int8_t)((int)(dray_test_rand() % 255) - 127);
        for (uint32_t o = 0; o < n_out; o++)
            for (uint32_t j = 0; j < n_outlier; j++)
                hw[(size_t)o * k + idx[j]] = 0;
        rel(w);
        w = mk(hw, (size_t)n_out * k);
        free(hw);
    }
    BOTH(s_->o->matmul(s_->c, &(struct dray_matmul_args){
                                  .x = V(x, gpu), .w = V(w, gpu), .wscale = V(ws, gpu), .out = V(out, gpu),
                                  .outlier_idx = V(oi, gpu), .outlier_w = V(ow, gpu), .n_tok = n_tok,
                                  .n_out = n_out, .k = k, .stride_x = k + 3, .stride_out = n_out,
                                  .n_outlier = n_outlier, .accumulate = acc, .wdtype = wdt}));
    double md, mr;
    diff_f32(out, (size_t)n_tok * n_out, &md, &mr);
    double tol = wdt == DRAY_I8 ? 1e-4 * mr : 1e-5 * k * 2.0; /* f32: rel 1e-5 of sum |x||w| */
    if (md > tol)
        fail_msg("matmul n_tok %u n_out %u k %u outliers %u acc %u wdtype %u: diff %g > %g", n_tok, n_out, k,
                 n_outlier, acc, wdt, md, tol);
    rel(x), rel(out), rel(w), rel(ws), rel(ow), rel(oi);
}

static void test_gpu_matmul_matches_cpu_on_every_path(void **state)
{
    (void)state;
    run_matmul(3, 70, 640, 0, 0, DRAY_I8);    /* decode: dp4a, 16-byte loads */
    run_matmul(1, 64, 2048, 0, 1, DRAY_I8);   /* single token, accumulate */
    run_matmul(77, 130, 640, 0, 1, DRAY_I8);  /* prefill: tensor-core tiles, ragged edges */
    run_matmul(200, 64, 2048, 0, 0, DRAY_I8); /* prefill, several k steps */
    run_matmul(20, 33, 100, 3, 0, DRAY_I8);   /* k % 16 != 0: byte path, outliers */
    run_matmul(9, 40, 100, 0, 1, DRAY_F32);   /* checking path */
}

static void test_gpu_rope_matches_cpu_at_long_positions(void **state)
{
    (void)state;
    int32_t pos[6] = {0, 1, 77, 4095, 65536, 131000};
    struct pb p = mk(pos, sizeof(pos)), x = mk_rand(6 * 4 * 64 + 10, -2, 2);
    BOTH(s_->o->rope(s_->c, &(struct dray_rope_args){.x = V(x, gpu), .pos = V(p, gpu), .n_tok = 6, .n_head = 4,
                                                     .head_dim = 64, .n_rot = 48, .stride = 4 * 64,
                                                     .base = 1000000.0f, .freq_scale = 0.125f}));
    expect_close(x, 6 * 4 * 64, 1e-4, 0, "rope");
    rel(p), rel(x);
}

static void test_gpu_gated_act_and_add_match_cpu(void **state)
{
    (void)state;
    struct pb g = mk_rand(4 * 90, -6, 6), u = mk_rand(4 * 90, -2, 2), o = mk(NULL, 4 * 90 * 4);
    for (uint32_t act = 0; act < 2; act++) {
        BOTH(s_->o->gated_act(s_->c, &(struct dray_gated_act_args){.gate = V(g, gpu), .up = V(u, gpu),
                                                                   .out = V(o, gpu), .n_tok = 4, .n = 80,
                                                                   .stride_gate = 90, .stride_up = 90,
                                                                   .stride_out = 90, .act = act}));
        expect_close(o, 4 * 90, 1e-6, 1e-5, act ? "silu" : "gelu_tanh");
    }
    BOTH(s_->o->add(s_->c, &(struct dray_add_args){.a = V(g, gpu), .b = V(u, gpu), .out = V(g, gpu), .n = 4 * 90}));
    expect_close(g, 4 * 90, 0, 0, "add");
    rel(g), rel(u), rel(o);
}

/* ----------------------------------------------------- KV and attention */

struct kvset {
    struct pb k, v, ks, vs;
    struct dray_kv_pool pool[2]; /* [cpu, gpu] */
};

static void kv_make(struct kvset *s, uint32_t dtype, uint32_t nkh, uint32_t d, uint32_t bs, uint32_t n_slots)
{
    size_t esz = dtype == DRAY_I8 ? 1 : 2, n = (size_t)n_slots * nkh * d;
    s->k = mk(NULL, n * esz);
    s->v = mk(NULL, n * esz);
    s->ks = mk(NULL, (size_t)n_slots * nkh * 4);
    s->vs = mk(NULL, (size_t)n_slots * nkh * 4);
    for (int gpu = 0; gpu < 2; gpu++)
        s->pool[gpu] = (struct dray_kv_pool){.k = V(s->k, gpu), .v = V(s->v, gpu), .k_scale = V(s->ks, gpu),
                                             .v_scale = V(s->vs, gpu), .dtype = dtype, .n_kv_head = nkh,
                                             .head_dim = d, .block_size = bs, .n_slots = n_slots};
    /* fill every slot through kv_store on both sides (slot -1 rows are skipped) */
    struct pb kin = mk_rand((size_t)n_slots * nkh * d, -3, 3), vin = mk_rand((size_t)n_slots * nkh * d, -3, 3);
    int32_t *slots = malloc(n_slots * 4);
    for (uint32_t i = 0; i < n_slots; i++)
        slots[i] = i % 17 == 5 ? -1 : (int32_t)i;
    struct pb sl = mk(slots, n_slots * 4);
    BOTH(s_->o->kv_store(s_->c, &(struct dray_kv_store_args){.k = V(kin, gpu), .v = V(vin, gpu),
                                                             .slots = V(sl, gpu), .pool = &s->pool[gpu],
                                                             .n_tok = n_slots, .stride_k = nkh * d,
                                                             .stride_v = nkh * d}));
    free(slots);
    rel(kin), rel(vin), rel(sl);
}

static void kv_free(struct kvset *s) { rel(s->k), rel(s->v), rel(s->ks), rel(s->vs); }

static void test_gpu_kv_store_matches_cpu_bit_for_bit(void **state)
{
    (void)state;
    for (uint32_t dt = DRAY_F16; dt <= DRAY_I8; dt++) {
        struct kvset s;
        kv_make(&s, dt, 2, 64, 16, 64);
        size_t n = 64 * 2 * 64 * (dt == DRAY_I8 ? 1 : 2);
        unsigned char *g = malloc(n), *c = malloc(n);
        assert_int_equal(G.o->download(G.c, g, V(s.k, 1), n), 0);
        assert_int_equal(C.o->download(C.c, c, V(s.k, 0), n), 0);
        size_t mism = 0;
        for (size_t i = 0; i < n; i++)
            mism += g[i] != c[i];
        if (dt == DRAY_F16)
            assert_int_equal(mism, 0);
        else
            assert_true(mism <= n / 1000 + 1); /* ties only */
        if (dt == DRAY_I8)
            expect_close(s.ks, 64 * 2, 0, 1e-6, "k_scale");
        free(g), free(c);
        kv_free(&s);
    }
}

/* Three sequences: a prefill, a long decode (split-K), a short chunked prefill;
 * blocks in a scrambled order, unreachable blocks -1. */
static void run_attention(uint32_t dtype, uint32_t n_head, uint32_t nkh, uint32_t d, uint32_t window)
{
    const uint32_t bs = 16, n_blocks = 80;
    struct kvset s;
    kv_make(&s, dtype, nkh, d, bs, bs * n_blocks);
    /* note kv_make left slot%17==5 unwritten (zero): still valid data */
    int32_t seqs[3][4] = {{0, 37, 37, 0}, {37, 1, 700, 3}, {38, 3, 300, 47}};
    int32_t bt[3 + 44 + 19];
    for (int i = 0; i < (int)(sizeof(bt) / 4); i++)
        bt[i] = (int32_t)((i * 37 + 11) % n_blocks);
    if (window) /* blocks wholly before every query's window are never read */
        for (uint32_t b = 0; b + 1 < (700 - window) / bs; b++)
            bt[3 + b] = -1;
    const uint32_t n_tok = 41, row = n_head * d;
    struct pb sq = mk(seqs, sizeof(seqs)), bp = mk(bt, sizeof(bt));
    struct pb q = mk_rand((size_t)n_tok * row, -1, 1), out = mk(NULL, (size_t)n_tok * row * 4);
    BOTH(s_->o->attention(s_->c, &(struct dray_attention_args){
                                     .q = V(q, gpu), .out = V(out, gpu), .seqs = V(sq, gpu),
                                     .block_table = V(bp, gpu), .pool = &s.pool[gpu], .n_tok = n_tok,
                                     .n_seq = 3, .n_head = n_head, .max_kv_len = 700, .stride_q = row,
                                     .stride_out = row, .window = window, .scale = 1.0f / sqrtf((float)d)}));
    double tol = dtype == DRAY_I8 ? 2e-3 * 3.0 : 1e-4; /* |v| <= 3 */
    expect_close(out, (size_t)n_tok * row, tol, 0, "attention");
    rel(sq), rel(bp), rel(q), rel(out);
    kv_free(&s);
}

static void test_gpu_attention_matches_cpu_mixed_batch(void **state)
{
    (void)state;
    run_attention(DRAY_I8, 8, 2, 64, 0);   /* GQA 4:1 */
    run_attention(DRAY_F16, 8, 2, 64, 0);
    run_attention(DRAY_I8, 4, 1, 256, 0);  /* Gemma 3 270M shape: MQA, head_dim 256 */
    run_attention(DRAY_I8, 4, 1, 256, 128); /* sliding window with -1 holes */
    run_attention(DRAY_F16, 6, 6, 80, 64);  /* MHA, odd head_dim */
}

/* ------------------------------------------- packed weights (version 3) */
/* Against the host reference of backend.h, not the CPU plugin:
 * dray_util_quant_group + dray_util_packed_dot for matmul, dray_util_packed_row
 * for embed. */

/* One packed matrix's host arrays, random: any code bytes are valid codes. */
struct hostw {
    struct dray_wformat f;
    uint32_t n_out, k;
    uint8_t *codes;
    void *d, *m;
    uint8_t *sub; /* two levels: (s, n) 0..63 per group, or int8 per 16; else NULL */
    float *w;     /* W [n_out][k] in f32, for the tolerance's sum |x||W| */
};

static void *scales(struct dray_wformat f, size_t n, float lo, float hi)
{
    void *a = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        float v = dray_test_randf(lo, hi);
        if (f.scale == DRAY_WSCALE_F16)
            ((uint16_t *)a)[i] = dray_util_f32_to_f16(v);
        else
            ((float *)a)[i] = v;
    }
    return a;
}

/* Random sub-scales of a two-level format (NULL for one level): 0..63 for
 * 4 and 5 bits, any int8 for 6. */
static uint8_t *sub_scales(struct dray_wformat f, uint32_t n_out, uint32_t k)
{
    const size_t n = (size_t)n_out * dray_util_wformat_sub_bytes(f, k);
    uint8_t *sub = n ? malloc(n) : NULL;
    for (size_t i = 0; i < n; i++)
        sub[i] = (uint8_t)(f.bits == 6 ? dray_test_rand() : dray_test_rand() % 64);
    return sub;
}

static void hostw_make(struct hostw *h, struct dray_wformat f, uint32_t n_out, uint32_t k)
{
    const size_t ng = (size_t)n_out * (k / 32), nc = ng * dray_util_wformat_group_bytes(f);
    const size_t ns = (size_t)n_out * dray_util_wformat_scales_per_row(f, k);
    /* two levels: D * s and M * n of the same size as one level's d and m */
    const float dmax = !f.super ? 0.02f : f.bits == 6 ? 0.0002f : 0.0003f, mmax = f.super ? 0.003f : 0.2f;
    h->f = f, h->n_out = n_out, h->k = k;
    h->codes = malloc(nc);
    for (size_t i = 0; i < nc; i++)
        h->codes[i] = (uint8_t)dray_test_rand();
    h->d = scales(f, ns, dmax / 20, dmax);
    h->m = f.has_min ? scales(f, ns, f.super ? 0.0f : -mmax, mmax) : NULL;
    h->sub = sub_scales(f, n_out, k);
    h->w = malloc((size_t)n_out * k * sizeof(float));
    for (uint32_t o = 0; o < n_out; o++)
        dray_util_packed_row(f, k, h->codes, h->d, h->m, h->sub, o, h->w + (size_t)o * k);
}

static void hostw_free(struct hostw *h) { free(h->codes), free(h->d), free(h->m), free(h->sub), free(h->w); }

/* The handle's device bytes in the CUDA/HIP layout: the host's arrays, or
 * GGUF's 144, 176, 210 bytes per 256 weights for the two-level formats. */
static uint64_t gpu_bytes(const struct hostw *h)
{
    const uint64_t ng = (uint64_t)h->n_out * (h->k / 32), sb = dray_util_wformat_scale_bytes(h->f);
    if (h->f.super)
        return (uint64_t)h->n_out * (h->k / 256) * (h->f.bits == 4 ? 144 : h->f.bits == 5 ? 176 : 210);
    return ng * (dray_util_wformat_group_bytes(h->f) + sb * (h->f.has_min ? 2 : 1));
}

/* The formats the plugin under test declares for uses (matmul and/or embed). */
static uint32_t declared_wformats(uint32_t uses)
{
    struct dray_op_caps caps = {.size = sizeof(caps)};
    assert_int_equal(G.o->op_caps(0, &caps), 0);
    return ((uses & DRAY_WUSE_MATMUL) ? caps.matmul_wformats : ~0u) &
           ((uses & DRAY_WUSE_EMBED) ? caps.embed_wformats : ~0u);
}

/* weight_create on the GPU side; the CUDA/HIP layout holds exactly the host
 * bytes (two levels: GGUF's). */
static struct dray_packed *hostw_upload(const struct hostw *h, uint32_t uses)
{
    struct dray_weight_desc desc = {.size = sizeof(desc), .format = h->f, .n_out = h->n_out, .k = h->k,
                                    .uses = uses, .codes = h->codes, .d = h->d, .m = h->m, .sub = h->sub};
    struct dray_packed *p = NULL;
    uint64_t bytes = 0;
    int rc = G.o->weight_create(G.c, &desc, &p, &bytes);
    if (rc)
        fail_msg("weight_create: rc %d: %s", rc, G.o->last_error(G.c));
    if (!strcmp(G.o->name, "cuda") || !strcmp(G.o->name, "hip"))
        assert_int_equal(bytes, gpu_bytes(h));
    assert_true(bytes > 0);
    return p;
}

/* GPU-only buffer with data (NULL: zeros). */
static struct dray_buf *gbuf(const void *data, size_t n)
{
    struct dray_buf *b = NULL;
    assert_int_equal(G.o->alloc(G.c, n, &b), 0);
    void *z = data ? NULL : calloc(1, n);
    assert_int_equal(G.o->upload(G.c, (struct dray_view){b, 0}, data ? data : z, n), 0);
    free(z);
    return b;
}

static float *randv(size_t n, float lo, float hi)
{
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = dray_test_randf(lo, hi);
    return f;
}

/* backend.h's packed matmul for one token row x (k inputs): out[o] for every
 * o (not accumulated), and bound[o] = sum_k |x||W|. */
static void ref_packed_matmul(const struct hostw *h, const float *x, uint32_t passes, float *out, double *bound)
{
    const uint32_t k = h->k, G_ = k / 32;
    int8_t *q = malloc(k), *q2 = malloc(k);
    float *sx = malloc(G_ * 4), *sx2 = malloc(G_ * 4), *r = malloc(k * 4);
    for (uint32_t g = 0; g < G_; g++)
        sx[g] = dray_util_quant_group(x + 32 * g, q + 32 * g);
    if (passes == 2) { /* the residual, rounded as x - (q*sx) */
        for (uint32_t c = 0; c < k; c++)
            r[c] = x[c] - (float)q[c] * sx[c / 32];
        for (uint32_t g = 0; g < G_; g++)
            sx2[g] = dray_util_quant_group(r + 32 * g, q2 + 32 * g);
    }
    for (uint32_t o = 0; o < h->n_out; o++) {
        out[o] = dray_util_packed_dot(h->f, k, h->codes, h->d, h->m, h->sub, o, q, sx);
        if (passes == 2)
            out[o] += dray_util_packed_dot(h->f, k, h->codes, h->d, h->m, h->sub, o, q2, sx2);
        double b = 0;
        for (uint32_t c = 0; c < k; c++)
            b += fabs((double)x[c] * h->w[(size_t)o * k + c]);
        bound[o] = b;
    }
    free(q), free(q2), free(sx), free(sx2), free(r);
}

/* One matmul on a handle: strided x and out, passes 1 or 2, maybe accumulating. */
static void run_packed_matmul(const struct hostw *h, struct dray_packed *p, uint32_t n_tok, uint32_t passes,
                              uint32_t acc)
{
    char name[32];
    const uint32_t k = h->k, n_out = h->n_out, sx_ = k + 3, so = n_out + 5;
    float *x = randv((size_t)n_tok * sx_, -2, 2), *out0 = randv((size_t)n_tok * so, -1, 1);
    if (n_tok > 1 && k >= 64) /* an outlier channel, and an all-zero group (sx = 0) */
        x[sx_ + 7] = 40.0f, memset(x + 32, 0, 32 * sizeof(float));
    float *got = malloc((size_t)n_tok * so * 4), *ref = malloc(n_out * 4);
    double *bound = malloc(n_out * sizeof(double));
    struct dray_buf *bx = gbuf(x, (size_t)n_tok * sx_ * 4), *bo = gbuf(out0, (size_t)n_tok * so * 4);
    struct dray_matmul_args a = {.x = {bx, 0}, .out = {bo, 0}, .n_tok = n_tok, .n_out = n_out, .k = k,
                                 .stride_x = sx_, .stride_out = so, .accumulate = acc, .wdtype = DRAY_PACKED,
                                 .packed = p, .passes = passes};
    int rc = G.o->matmul(G.c, &a);
    if (rc)
        fail_msg("packed matmul %s: rc %d: %s", dray_util_wformat_name(h->f, name, sizeof(name)), rc,
                 G.o->last_error(G.c));
    assert_int_equal(G.o->download(G.c, got, (struct dray_view){bo, 0}, (size_t)n_tok * so * 4), 0);
    for (uint32_t t = 0; t < n_tok; t++) {
        ref_packed_matmul(h, x + (size_t)t * sx_, passes, ref, bound);
        for (uint32_t o = 0; o < so; o++) {
            const float init = out0[(size_t)t * so + o], g = got[(size_t)t * so + o];
            if (o >= n_out) { /* the stride's gap is never written */
                if (g != init)
                    fail_msg("packed matmul wrote past n_out at t %u o %u", t, o);
                continue;
            }
            const double want = (acc ? init : 0.0f) + (double)ref[o];
            const double tol = 1e-4 * (bound[o] + (acc ? fabs(init) : 0.0));
            if (!(fabs(g - want) <= tol))
                fail_msg("packed matmul %s n_tok %u n_out %u k %u passes %u acc %u: t %u o %u: %.9g vs %.9g "
                         "(tol %g)", dray_util_wformat_name(h->f, name, sizeof(name)), n_tok, n_out, k, passes,
                         acc, t, o, g, want, tol);
        }
    }
    G.o->free(G.c, bx), G.o->free(G.c, bo);
    free(x), free(out0), free(got), free(ref), free(bound);
}

static int have_packed(void)
{
    if (DRAY_HAS(G.o, weight_create, 3) && DRAY_HAS(G.o, weight_free, 3))
        return 1;
    print_message("skip: %s has no packed weights (ABI %u)\n", G.o->name, G.o->version);
    return 0;
}

static void test_gpu_packed_caps_declare_every_format_and_both_passes(void **state)
{
    (void)state;
    if (!have_packed())
        skip();
    struct dray_op_caps caps = {.size = sizeof(caps)};
    assert_int_equal(G.o->op_caps(0, &caps), 0);
    if (strcmp(G.o->name, "cuda") && strcmp(G.o->name, "hip"))
        skip(); /* a dry run on another plugin declares its own */
    assert_int_equal(caps.matmul_wformats, DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K);
    assert_int_equal(caps.embed_wformats, DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K);
    assert_int_equal(caps.matmul_passes, 3);
    /* the retired version-2 grouped dtypes are not declared */
    for (uint32_t t = DRAY_Q8G32; t <= DRAY_Q4G32H_X2; t++)
        assert_false(caps.op_dtypes[DRAY_OP_MATMUL] & DRAY_DTYPE_BIT(t));
}

/* Every format, passes 1 and 2: decode (fewer groups than lanes), a long row
 * (lanes loop), several token tiles with ragged edges; accumulate both ways.
 * Two-level formats (bits 12..14) with k a multiple of 256. Only declared
 * formats run: the CUDA/HIP plugins declare all (the caps test), a dry run on
 * another plugin its own. */
static void test_gpu_packed_matmul_matches_reference_for_every_format(void **state)
{
    (void)state;
    if (!have_packed())
        skip();
    static const uint32_t shape[][4] = {{3, 70, 640, 0}, {1, 64, 2048, 1}, {19, 33, 96, 0}, {9, 17, 32, 1}};
    static const uint32_t kshape[][4] = {{3, 70, 768, 0}, {1, 64, 2048, 1}, {19, 33, 256, 0}, {9, 17, 512, 1}};
    const uint32_t have = declared_wformats(DRAY_WUSE_MATMUL);
    for (uint32_t bit = 0; bit < 15; bit++)
        for (size_t s = 0; s < sizeof(shape) / sizeof(shape[0]) && (have >> bit & 1u); s++) {
            const uint32_t *sh = bit < 12 ? shape[s] : kshape[s];
            struct hostw h;
            hostw_make(&h, dray_util_wformat_of_bit(bit), sh[1], sh[2]);
            struct dray_packed *p = hostw_upload(&h, DRAY_WUSE_MATMUL);
            for (uint32_t passes = 1; passes <= 2; passes++)
                run_packed_matmul(&h, p, sh[0], passes, sh[3]);
            run_packed_matmul(&h, p, sh[0], 0, !sh[3]); /* passes 0 means 1 */
            G.o->weight_free(G.c, p);
            hostw_free(&h);
        }
}

/* Every declared format: rows gathered from a handle made for embed and
 * matmul (a tied table), against the reference rows times scale (rel 1e-6);
 * two-level ones with dim 512 (two super-blocks). */
static void test_gpu_packed_embed_matches_reference_for_every_format(void **state)
{
    (void)state;
    if (!have_packed())
        skip();
    const uint32_t n_rows = 50, kdim = 512, n_tok = 9;
    const int32_t ids[9] = {0, 49, 3, 3, 17, 22, 48, 1, 30};
    const float scale = 25.3f;
    const uint32_t have = declared_wformats(DRAY_WUSE_EMBED | DRAY_WUSE_MATMUL);
    struct dray_buf *bid = gbuf(ids, sizeof(ids)), *bo = gbuf(NULL, n_tok * kdim * 4);
    float *got = malloc(n_tok * kdim * 4), *row = malloc(kdim * 4);
    for (uint32_t bit = 0; bit < 15; bit++) {
        char name[32];
        struct hostw h;
        const uint32_t dim = bit < 12 ? 96 : kdim;
        if (!(have >> bit & 1u))
            continue;
        hostw_make(&h, dray_util_wformat_of_bit(bit), n_rows, dim);
        struct dray_packed *p = hostw_upload(&h, DRAY_WUSE_EMBED | DRAY_WUSE_MATMUL);
        struct dray_embed_args a = {.ids = {bid, 0}, .out = {bo, 0}, .dtype = DRAY_PACKED, .n_tok = n_tok,
                                    .dim = dim, .n_rows = n_rows, .scale = scale, .packed = p};
        int rc = G.o->embed(G.c, &a);
        if (rc)
            fail_msg("packed embed %s: rc %d: %s", dray_util_wformat_name(h.f, name, sizeof(name)), rc,
                     G.o->last_error(G.c));
        assert_int_equal(G.o->download(G.c, got, (struct dray_view){bo, 0}, n_tok * dim * 4), 0);
        for (uint32_t t = 0; t < n_tok; t++) {
            dray_util_packed_row(h.f, dim, h.codes, h.d, h.m, h.sub, (uint64_t)ids[t], row);
            double maxref = 0;
            for (uint32_t i = 0; i < dim; i++)
                maxref = fmax(maxref, fabs(row[i] * scale));
            for (uint32_t i = 0; i < dim; i++) {
                const float want = row[i] * scale, g = got[t * dim + i];
                if (!(fabs(g - want) <= 1e-6 * maxref))
                    fail_msg("packed embed %s: t %u i %u: %.9g vs %.9g",
                             dray_util_wformat_name(h.f, name, sizeof(name)), t, i, g, want);
            }
        }
        G.o->weight_free(G.c, p);
        hostw_free(&h);
    }
    G.o->free(G.c, bid), G.o->free(G.c, bo);
    free(got), free(row);
}

/* The contract's refusals on handles: each returns its code and queues nothing. */
static void test_gpu_packed_refuses_bad_arguments(void **state)
{
    (void)state;
    if (!have_packed())
        skip();
    struct hostw h;
    hostw_make(&h, (struct dray_wformat){4, DRAY_WSCALE_F16, 0, 0}, 16, 64);
    struct dray_weight_desc desc = {.size = sizeof(desc), .format = h.f, .n_out = 16, .k = 48,
                                    .uses = DRAY_WUSE_MATMUL, .codes = h.codes, .d = h.d};
    struct dray_packed *p = (struct dray_packed *)&desc; /* must be reset to NULL */
    uint64_t bytes = 7;
    assert_int_equal(G.o->weight_create(G.c, &desc, &p, &bytes), DRAY_EINVAL); /* k % 32 */
    assert_null(p);
    desc.k = 64, desc.m = h.d; /* m without a min */
    assert_int_equal(G.o->weight_create(G.c, &desc, &p, &bytes), DRAY_EINVAL);
    p = hostw_upload(&h, DRAY_WUSE_MATMUL);
    struct dray_buf *bx = gbuf(NULL, 4 * 64 * 4), *bo = gbuf(NULL, 4 * 16 * 4);
    const struct dray_matmul_args ok = {.x = {bx, 0}, .out = {bo, 0}, .n_tok = 4, .n_out = 16, .k = 64,
                                        .stride_x = 64, .stride_out = 16, .wdtype = DRAY_PACKED, .packed = p,
                                        .passes = 1};
    struct dray_matmul_args a = ok;
    assert_int_equal(G.o->matmul(G.c, &a), 0);
    a = ok, a.n_out = 15;
    assert_int_equal(G.o->matmul(G.c, &a), DRAY_EINVAL);
    a = ok, a.n_outlier = 1;
    assert_int_equal(G.o->matmul(G.c, &a), DRAY_EINVAL);
    a = ok, a.passes = 3;
    assert_int_equal(G.o->matmul(G.c, &a), DRAY_EINVAL);
    a = ok, a.packed = NULL;
    assert_int_equal(G.o->matmul(G.c, &a), DRAY_EINVAL);
    a = ok, a.n_tok = 5; /* x and out too short */
    assert_int_equal(G.o->matmul(G.c, &a), DRAY_EINVAL);
    a = ok, a.out = a.x, a.stride_out = 64; /* out overlaps x */
    assert_int_equal(G.o->matmul(G.c, &a), DRAY_EINVAL);
    /* a matmul-only handle is not an embedding table; a bad id is refused */
    int32_t ids[2] = {1, 16};
    struct dray_buf *bid = gbuf(ids, sizeof(ids));
    struct dray_embed_args e = {.ids = {bid, 0}, .out = {bo, 0}, .dtype = DRAY_PACKED, .n_tok = 1, .dim = 64,
                                .n_rows = 16, .scale = 1.0f, .packed = p};
    assert_int_equal(G.o->embed(G.c, &e), DRAY_EINVAL);
    G.o->weight_free(G.c, p);
    p = hostw_upload(&h, DRAY_WUSE_EMBED);
    e.packed = p;
    assert_int_equal(G.o->embed(G.c, &e), 0);
    e.n_tok = 2; /* ids[1] = 16 = n_rows */
    int rc = G.o->embed(G.c, &e);
    if (rc == 0)
        rc = G.o->synchronize(G.c);
    assert_int_equal(rc, DRAY_EINVAL);
    e.n_tok = 1, e.dim = 32;
    assert_int_equal(G.o->embed(G.c, &e), DRAY_EINVAL);
    assert_int_equal(G.o->synchronize(G.c), 0);
    G.o->weight_free(G.c, p);
    G.o->weight_free(G.c, NULL);
    G.o->free(G.c, bx), G.o->free(G.c, bo), G.o->free(G.c, bid);
    hostw_free(&h);
}

/* Two-level refusals on the device's weight_create (where declared): a 4-bit
 * sub-scale of 64 (6 bits hold 0..63) and k not a multiple of 256 are
 * DRAY_EINVAL with a NULL handle; the same weights, fixed, are taken. */
static void test_gpu_packed_refuses_bad_two_level_weights(void **state)
{
    (void)state;
    if (!have_packed() || !(declared_wformats(DRAY_WUSE_MATMUL) & DRAY_UTIL_WFK(4)))
        skip();
    struct hostw h;
    hostw_make(&h, dray_util_wformat_of_bit(12), 8, 512);
    struct dray_weight_desc desc = {.size = sizeof(desc), .format = h.f, .n_out = 8, .k = 512,
                                    .uses = DRAY_WUSE_MATMUL, .codes = h.codes, .d = h.d, .m = h.m,
                                    .sub = h.sub};
    struct dray_packed *p = (struct dray_packed *)&desc; /* must be reset to NULL */
    uint64_t bytes = 7;
    const uint8_t keep = h.sub[37];
    h.sub[37] = 64;
    assert_int_equal(G.o->weight_create(G.c, &desc, &p, &bytes), DRAY_EINVAL);
    assert_null(p);
    h.sub[37] = keep, desc.k = 288; /* 32 * 9: not a multiple of 256 */
    assert_int_equal(G.o->weight_create(G.c, &desc, &p, &bytes), DRAY_EINVAL);
    assert_null(p);
    desc.k = 512;
    assert_int_equal(G.o->weight_create(G.c, &desc, &p, &bytes), 0);
    assert_non_null(p);
    G.o->weight_free(G.c, p);
    hostw_free(&h);
}

int main(void)
{
    char why_c[256] = "", why_h[256] = "", why_cpu[256] = "";
    if (load("cpu", &C, why_cpu, sizeof(why_cpu))) {
        printf("SKIP: the CPU reference plugin cannot be opened: %s\n", why_cpu);
        return 77;
    }
    /* DRAY_DEVICE_TEST_PLUGIN=cpu dry-runs this file against the CPU's fast
     * kernels, to check the harness itself on a machine without a GPU */
    const char *only = getenv("DRAY_DEVICE_TEST_PLUGIN");
    if (only && load(only, &G, why_c, sizeof(why_c))) {
        printf("SKIP: %s\n", why_c);
        return 77;
    }
    if (!only && load("cuda", &G, why_c, sizeof(why_c)) && load("hip", &G, why_h, sizeof(why_h))) {
        printf("SKIP: no GPU device (%s; %s)\n", why_c, why_h);
        return 77;
    }
    printf("gpu device tests on %s\n", G.o->name);
    dray_test_seed(1234);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_embed_matches_cpu_for_i8_and_f32),
        cmocka_unit_test(test_gpu_rmsnorm_matches_cpu_per_head_and_in_place),
        cmocka_unit_test(test_gpu_matmul_matches_cpu_on_every_path),
        cmocka_unit_test(test_gpu_rope_matches_cpu_at_long_positions),
        cmocka_unit_test(test_gpu_gated_act_and_add_match_cpu),
        cmocka_unit_test(test_gpu_kv_store_matches_cpu_bit_for_bit),
        cmocka_unit_test(test_gpu_attention_matches_cpu_mixed_batch),
        cmocka_unit_test(test_gpu_packed_caps_declare_every_format_and_both_passes),
        cmocka_unit_test(test_gpu_packed_matmul_matches_reference_for_every_format),
        cmocka_unit_test(test_gpu_packed_embed_matches_reference_for_every_format),
        cmocka_unit_test(test_gpu_packed_refuses_bad_arguments),
        cmocka_unit_test(test_gpu_packed_refuses_bad_two_level_weights),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    G.o->close(G.c);
    C.o->close(C.c);
    return rc;
}
