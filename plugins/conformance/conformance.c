/* The conformance runner: every op of a subject plugin against the CPU plugin's
 * scalar reference kernels (opened with reference = 1), through the op table only.
 * For each op and dtype: `reps` random cases (each reproducible from the seed),
 * a row of max abs / max rel error, NMSE, the tolerance and a verdict, and the
 * median time of the op on a fixed Gemma-3-1B-like shape on both sides.
 * Packed weights (version 3) have a row per format (and, for matmul, per
 * number of activation passes) that the subject declares, checked against the
 * kit's own reference of backend.h's arithmetic instead of the CPU plugin. */
#include "conformance.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf_internal.h"

/* ------------------------------------------------------------ random numbers */

uint32_t conf_rand(struct conf_rng *r)
{
    /* xorshift64*: fast, and the same sequence on every platform */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545F4914F6CDD1Dull) >> 32);
}

uint32_t conf_range(struct conf_rng *r, uint32_t lo, uint32_t hi)
{
    if (hi <= lo)
        return lo;
    return lo + (uint32_t)(((uint64_t)conf_rand(r) * ((uint64_t)hi - lo + 1)) >> 32);
}

float conf_randf(struct conf_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)(conf_rand(r) >> 8) * (1.0f / 16777216.0f);
}

/* Seed of case `rep` of variant `v`: each case can be rerun alone. */
static uint64_t case_seed(uint64_t seed, size_t v, uint32_t rep)
{
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (v * 100003u + rep + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

/* ------------------------------------------------------------ the op table */

/* Tolerances: as include/dray/backend.h states them in the comment above each
 * op's argument struct (the "Tolerance:" lines). Mandatory = what the default
 * configuration (int8 weights, int8 KV) needs; a plugin may leave the others out
 * of op_dtypes and still pass. Packed weights (version 3) are one variant per
 * format and, for matmul, per number of activation passes: each runs when the
 * subject declares it in op_caps (matmul_wformats / embed_wformats and
 * matmul_passes), against the kit's own reference of backend.h's arithmetic
 * (conf_cases.c), with the handle made by the subject's weight_create. The
 * two-level formats (version 4: bits 12..14, GGUF's K quants' shapes) run
 * only for subjects of ABI >= 4, which alone can declare them. */
enum variant_kind {
    V_PLAIN = 0, /* the op on views, against the CPU plugin's reference kernels */
    V_PACKED,    /* the op on a packed-weight handle, against the kit's reference */
    V_REFUSAL,   /* weight_create refusing bad descriptors, then a packed case */
    V_ABI4,      /* as V_PLAIN, with arguments version 4 added: subjects of ABI >= 4 only */
    V_REFUSAL_K, /* as V_REFUSAL, for the two-level formats (version 4) */
};

static const struct variant {
    const char *op;
    enum dray_op id;
    uint32_t dtype; /* the op's cap dtype (see enum dray_op) */
    int mandatory;
    conf_make_fn make;
    conf_check_fn check;
    struct conf_tol tol;
    enum variant_kind kind;
    uint32_t wbit;   /* V_PACKED: the format's bit (0..14) in matmul_wformats / embed_wformats */
    uint32_t passes; /* V_PACKED matmul: activation passes, 1 or 2 */
} variants[] = {
/* packed weights: embed in format bit b; matmul in format bit b, one pass and two */
#define PK_EMBED(b)                                                                                \
    {"embed", DRAY_OP_EMBED, DRAY_PACKED, 0, conf_make_embed_packed, conf_check_f32,              \
     CONF_TOL_PACKED_EMBED, V_PACKED, b, 0}
#define PK_MATMUL(b)                                                                               \
    {"matmul", DRAY_OP_MATMUL, DRAY_PACKED, 0, conf_make_matmul_packed, conf_check_f32,           \
     CONF_TOL_PACKED_MATMUL, V_PACKED, b, 1},                                                      \
    {"matmul", DRAY_OP_MATMUL, DRAY_PACKED, 0, conf_make_matmul_packed, conf_check_f32,           \
     CONF_TOL_PACKED_MATMUL, V_PACKED, b, 2}
    /* embed: "exact for F32; one f32 multiply order for I8 and packed (rel 1e-6)" */
    {"embed", DRAY_OP_EMBED, DRAY_I8, 1, conf_make_embed_i8, conf_check_f32, {0, 1e-6, 0, "rel 1e-6"}, V_PLAIN, 0, 0},
    {"embed", DRAY_OP_EMBED, DRAY_F32, 0, conf_make_embed_f32, conf_check_f32, {0, 0, 0, "exact"}, V_PLAIN, 0, 0},
    PK_EMBED(0), PK_EMBED(1), PK_EMBED(2), PK_EMBED(3), PK_EMBED(4), PK_EMBED(5),
    PK_EMBED(6), PK_EMBED(7), PK_EMBED(8), PK_EMBED(9), PK_EMBED(10), PK_EMBED(11),
    /* rmsnorm: "rel 1e-5" */
    {"rmsnorm", DRAY_OP_RMSNORM, DRAY_F32, 1, conf_make_rmsnorm, conf_check_f32, {0, 1e-5, 0, "rel 1e-5"}, V_PLAIN, 0, 0},
    /* matmul I8: "abs 1e-4 * (max|out|)"; F32: "rel 1e-5 of the sum of |x||w|" */
    {"matmul", DRAY_OP_MATMUL, DRAY_I8, 1, conf_make_matmul_i8, conf_check_f32,
     {1e-4, 0, 0, "abs 1e-4*max|out|"}, V_PLAIN, 0, 0},
    {"matmul", DRAY_OP_MATMUL, DRAY_F32, 0, conf_make_matmul_f32, conf_check_f32,
     {0, 0, 1e-5, "1e-5*sum|x||w|"}, V_PLAIN, 0, 0},
    /* packed: "abs 1e-4 * sum_k |x[t][k]| |W[o][k]| (+ |out| when accumulating)" */
    PK_MATMUL(0), PK_MATMUL(1), PK_MATMUL(2), PK_MATMUL(3), PK_MATMUL(4), PK_MATMUL(5),
    PK_MATMUL(6), PK_MATMUL(7), PK_MATMUL(8), PK_MATMUL(9), PK_MATMUL(10), PK_MATMUL(11),
    /* weight_create: refuses a bad or undeclared format or shape (DRAY_ENOTSUP /
     * DRAY_EINVAL, *out NULL, a reason), then a declared one works (its op's tolerance) */
    {"weight_create", DRAY_OP_MATMUL, DRAY_PACKED, 0, conf_make_weight_refusal, conf_check_f32,
     {0, 0, 1e-4, "refused; 1e-4*sum|x||W|"}, V_REFUSAL, 0, 0},
    /* rope: "abs 1e-4 for |p| < 2^17" */
    {"rope", DRAY_OP_ROPE, DRAY_F32, 1, conf_make_rope, conf_check_f32, {1e-4, 0, 0, "abs 1e-4"}, V_PLAIN, 0, 0},
    /* kv_store: "I8 bit-exact ... except ties (|q| off by one in at most 1e-3 of
     * elements); F16 round-to-nearest-even exact". Scales get one f32 rounding
     * (rel 1e-6): OpenCL and GPUs need not divide correctly rounded. */
    {"kv_store", DRAY_OP_KV_STORE, DRAY_I8, 1, conf_make_kv_store_i8, conf_check_kv_i8,
     {1e-3, 1e-6, 0, "codes exact, 1e-3 ties"}, V_PLAIN, 0, 0},
    {"kv_store", DRAY_OP_KV_STORE, DRAY_F16, 0, conf_make_kv_store_f16, conf_check_kv_f16,
     {0, 0, 0, "bit-exact"}, V_PLAIN, 0, 0},
    /* attention: "abs 2e-3 relative to max|v| for I8, 1e-4 for F16" */
    {"attention", DRAY_OP_ATTENTION, DRAY_I8, 1, conf_make_attention_i8, conf_check_f32,
     {2e-3, 0, 0, "abs 2e-3*max|v|"}, V_PLAIN, 0, 0},
    {"attention", DRAY_OP_ATTENTION, DRAY_F16, 0, conf_make_attention_f16, conf_check_f32,
     {1e-4, 0, 0, "abs 1e-4*max|v|"}, V_PLAIN, 0, 0},
    /* gated_act: "rel 1e-5 + abs 1e-6" */
    {"gated_act", DRAY_OP_GATED_ACT, DRAY_F32, 1, conf_make_gated_act, conf_check_f32,
     {1e-6, 1e-5, 0, "rel 1e-5 + abs 1e-6"}, V_PLAIN, 0, 0},
    /* add: "Exact" */
    {"add", DRAY_OP_ADD, DRAY_F32, 1, conf_make_add, conf_check_f32, {0, 0, 0, "exact"}, V_PLAIN, 0, 0},
    /* version 4 (appended, so the earlier variants keep their seeds): rope with
     * freq_factors and attn_factor, "abs 1e-4 * max(1, mscale)"; attention with
     * a softcap, the op's tolerances */
    {"rope", DRAY_OP_ROPE, DRAY_F32, 1, conf_make_rope_v4, conf_check_f32, {1e-4, 0, 0, "abs 1e-4*max(1,msc)"},
     V_ABI4, 0, 0},
    {"attention", DRAY_OP_ATTENTION, DRAY_I8, 1, conf_make_attention_softcap_i8, conf_check_f32,
     {2e-3, 0, 0, "abs 2e-3*max|v|"}, V_ABI4, 0, 0},
    {"attention", DRAY_OP_ATTENTION, DRAY_F16, 0, conf_make_attention_softcap_f16, conf_check_f32,
     {1e-4, 0, 0, "abs 1e-4*max|v|"}, V_ABI4, 0, 0},
    /* version 4's two-level formats (appended too): embed, matmul one pass and
     * two, and weight_create's refusals of bad two-level descriptors */
    PK_EMBED(12), PK_EMBED(13), PK_EMBED(14),
    PK_MATMUL(12), PK_MATMUL(13), PK_MATMUL(14),
    {"weight_create", DRAY_OP_MATMUL, DRAY_PACKED, 0, conf_make_weight_refusal_k, conf_check_f32,
     {0, 0, 1e-4, "refused; 1e-4*sum|x||W|"}, V_REFUSAL_K, 0, 0},
#undef PK_EMBED
#undef PK_MATMUL
};
#define N_VARIANTS (sizeof(variants) / sizeof(variants[0]))

/* The dtype column: the cap dtype ("i8"), a packed format with its passes
 * ("q4-f16-min", "q4-f16-min-x2": q<bits>-<scale type>[-min][-x2]; two levels
 * "q4-k", "q6-k-x2"), or "refusals" / "refusals-k" (weight_create). */
static const char *variant_dtype(const struct variant *v, char *buf, size_t len)
{
    if (v->kind == V_REFUSAL)
        return "refusals";
    if (v->kind == V_REFUSAL_K)
        return "refusals-k";
    if (v->kind == V_PACKED) {
        struct dray_wformat f = dray_util_wformat_of_bit(v->wbit);
        if (f.super)
            snprintf(buf, len, "q%u-k%s", (unsigned)f.bits, v->passes == 2 ? "-x2" : "");
        else
            snprintf(buf, len, "q%u-%s%s%s", (unsigned)f.bits, f.scale == DRAY_WSCALE_F16 ? "f16" : "f32",
                     f.has_min ? "-min" : "", v->passes == 2 ? "-x2" : "");
        return buf;
    }
    if (v->kind == V_ABI4) /* what version 4 adds to the op */
        return v->id == DRAY_OP_ROPE ? "f32-ff-mscale" : v->dtype == DRAY_I8 ? "i8-softcap" : "f16-softcap";
    switch (v->dtype) {
    case DRAY_F32: return "f32";
    case DRAY_F16: return "f16";
    case DRAY_I8: return "i8";
    case DRAY_I32: return "i32";
    }
    return "?";
}

/* ------------------------------------------------------------ running a case */

struct side {
    const struct dray_ops *ops;
    struct dray_ctx *ctx;
};

static const char *side_error(const struct side *s, int rc)
{
    const char *e = s->ops->last_error(s->ctx);
    return e && e[0] ? e : conf_status_name(rc);
}

/* A refusal probe (c->bad): weight_create must fail with c->bad_rc (DRAY_EINVAL
 * also takes DRAY_ENOTSUP unless bad_exact), leave the handle NULL and give a
 * reason. */
static int probe_refusal(const struct side *s, const struct conf_case *c, char *why, size_t whylen)
{
    static char sentinel;
    struct dray_packed *w = (struct dray_packed *)(void *)&sentinel; /* must come back NULL */
    uint64_t bytes = 0;
    int rc = s->ops->weight_create(s->ctx, &c->bad, &w, &bytes);
    const char *want = c->bad_rc == DRAY_ENOTSUP ? "DRAY_ENOTSUP"
                       : c->bad_exact            ? "DRAY_EINVAL"
                                                 : "DRAY_EINVAL or DRAY_ENOTSUP";
    if (rc == 0) {
        if (w && w != (struct dray_packed *)(void *)&sentinel)
            s->ops->weight_free(s->ctx, w);
        snprintf(why, whylen, "weight_create accepted %s: it must refuse it with %s", c->bad_what, want);
        return DRAY_EINVAL;
    }
    if (rc != c->bad_rc && !(c->bad_rc == DRAY_EINVAL && !c->bad_exact && rc == DRAY_ENOTSUP)) {
        snprintf(why, whylen, "weight_create refused %s with %d (%s), not %s: %s", c->bad_what, rc,
                 conf_status_name(rc), want, side_error(s, rc));
        return DRAY_EINVAL;
    }
    if (w) {
        snprintf(why, whylen, "weight_create refused %s but did not set its handle to NULL",
                 c->bad_what);
        return DRAY_EINVAL;
    }
    const char *e = s->ops->last_error(s->ctx);
    if (!e || !e[0]) {
        snprintf(why, whylen, "weight_create refused %s with no reason in last_error", c->bad_what);
        return DRAY_EINVAL;
    }
    return 0;
}

/* The case's packed weights on this side: its weight_create, or NULL when the
 * case has none. */
static int create_weights(const struct side *s, const struct conf_case *c, struct dray_packed **w,
                          char *why, size_t whylen)
{
    uint64_t bytes = 0;
    char name[32];
    *w = NULL;
    if (!c->wdesc.size)
        return 0;
    int rc = s->ops->weight_create(s->ctx, &c->wdesc, w, &bytes);
    if (rc) {
        snprintf(why, whylen, "weight_create (%s, %u x %u) returned %d (%s): %s",
                 dray_util_wformat_name(c->wdesc.format, name, sizeof(name)), c->wdesc.n_out,
                 c->wdesc.k, rc, conf_status_name(rc), side_error(s, rc));
        *w = NULL;
    } else if (!*w) {
        snprintf(why, whylen, "weight_create returned 0 and no handle");
        rc = DRAY_EINVAL;
    }
    return rc;
}

/* Upload every array, create the packed weights (after a refusal probe, when
 * the case has one), run the op, download the outputs into got[which]. */
static int run_side(const struct side *s, struct conf_case *c, int which, char *why, size_t whylen)
{
    struct dray_buf *bufs[CONF_MAX_ARRS] = {0};
    struct dray_view v[CONF_MAX_ARRS];
    struct dray_packed *w = NULL;
    int rc = 0, i;
    for (i = 0; i < c->n && rc == 0; i++) {
        size_t n = c->a[i].nbytes;
        rc = s->ops->alloc(s->ctx, n ? n : 4, &bufs[i]);
        if (rc) {
            bufs[i] = NULL;
            snprintf(why, whylen, "alloc of %zu bytes failed: %s", n, side_error(s, rc));
            break;
        }
        v[i] = (struct dray_view){bufs[i], 0};
        if (n && (rc = s->ops->upload(s->ctx, v[i], c->a[i].host, n)))
            snprintf(why, whylen, "upload of %zu bytes failed: %s", n, side_error(s, rc));
    }
    if (rc == 0 && c->bad.size)
        rc = probe_refusal(s, c, why, whylen);
    if (rc == 0)
        rc = create_weights(s, c, &w, why, whylen);
    if (rc == 0 && (rc = c->launch(s->ops, s->ctx, v, w, c->params)))
        snprintf(why, whylen, "the op returned %d (%s): %s", rc, conf_status_name(rc),
                 side_error(s, rc));
    if (rc == 0 && (rc = s->ops->synchronize(s->ctx)))
        snprintf(why, whylen, "synchronize failed: %s", side_error(s, rc));
    for (i = 0; i < c->n && rc == 0; i++) {
        if (!c->a[i].out)
            continue;
        free(c->a[i].got[which]);
        c->a[i].got[which] = malloc(c->a[i].nbytes ? c->a[i].nbytes : 4);
        if (!c->a[i].got[which]) {
            rc = DRAY_ENOMEM;
            snprintf(why, whylen, "out of host memory");
        } else if (c->a[i].nbytes &&
                   (rc = s->ops->download(s->ctx, c->a[i].got[which], v[i], c->a[i].nbytes))) {
            snprintf(why, whylen, "download failed: %s", side_error(s, rc));
        }
    }
    if (w)
        s->ops->weight_free(s->ctx, w);
    for (i = 0; i < c->n; i++)
        if (bufs[i])
            s->ops->free(s->ctx, bufs[i]);
    return rc;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median microseconds of op + synchronize over reps runs (after one warm-up);
 * inputs are uploaded once. Returns < 0 if the op failed. */
static double time_side(const struct side *s, struct conf_case *c, uint32_t reps)
{
    struct dray_buf *bufs[CONF_MAX_ARRS] = {0};
    struct dray_view v[CONF_MAX_ARRS];
    double *t = calloc(reps, sizeof(*t)), med = -1;
    struct dray_packed *w = NULL;
    char why[320];
    int rc = t ? 0 : DRAY_ENOMEM, i;
    for (i = 0; i < c->n && rc == 0; i++) {
        size_t n = c->a[i].nbytes;
        if ((rc = s->ops->alloc(s->ctx, n ? n : 4, &bufs[i])))
            bufs[i] = NULL;
        v[i] = (struct dray_view){bufs[i], 0};
        if (rc == 0 && n)
            rc = s->ops->upload(s->ctx, v[i], c->a[i].host, n);
    }
    if (rc == 0) /* packed weights are created once: the op is timed, not the packing */
        rc = create_weights(s, c, &w, why, sizeof(why));
    for (uint32_t k = 0; rc == 0 && k <= reps; k++) {
        double t0 = now_us();
        rc = c->launch(s->ops, s->ctx, v, w, c->params);
        if (rc == 0)
            rc = s->ops->synchronize(s->ctx);
        if (k) /* run 0 warms caches and lazy compilation */
            t[k - 1] = now_us() - t0;
    }
    if (rc == 0) {
        qsort(t, reps, sizeof(*t), cmp_double);
        med = t[reps / 2];
    }
    if (w)
        s->ops->weight_free(s->ctx, w);
    for (i = 0; i < c->n; i++)
        if (bufs[i])
            s->ops->free(s->ctx, bufs[i]);
    free(t);
    return med;
}

/* ------------------------------------------------------------ one variant */

struct row {
    uint32_t cases, failed;
    struct conf_metrics m;
    double us_sub, us_ref;
    char why[640];   /* first failure */
    char shape[320]; /* the timed shape */
};

/* What the subject declares for packed weights, as far as its ABI has them:
 * the formats for matmul and for embed (DRAY_WFORMAT_BIT; the two-level ones
 * from version 4) and matmul's activation passes (0 declared: one). */
struct pk_caps {
    uint32_t mm, em, passes;
};

static struct pk_caps pk_caps_of(const struct conf_device *sub, uint32_t abi)
{
    const uint32_t known = abi >= 4 ? DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K : abi >= 3 ? DRAY_UTIL_WF_ALL : 0;
    struct pk_caps pk = {sub->caps.matmul_wformats & known, sub->caps.embed_wformats & known, 0};
    if (abi >= 3)
        pk.passes = sub->caps.matmul_passes ? sub->caps.matmul_passes : 1u;
    return pk;
}

/* Whether the subject declares what a packed or refusal variant needs: its
 * format (and, for matmul, its passes), or any format of the refusal's kind. */
static int pk_declared(const struct variant *v, const struct pk_caps *pk)
{
    if (v->kind == V_REFUSAL)
        return ((pk->mm | pk->em) & DRAY_UTIL_WF_ALL) != 0;
    if (v->kind == V_REFUSAL_K)
        return ((pk->mm | pk->em) & DRAY_UTIL_WF_K) != 0;
    if (v->id == DRAY_OP_EMBED)
        return (pk->em >> v->wbit) & 1u;
    return (pk->mm >> v->wbit & 1u) && (pk->passes >> (v->passes - 1) & 1u);
}

/* What the runner tells a packed case before make: the variant's format and
 * passes, and what the subject declares. */
static void case_inputs(struct conf_case *c, const struct variant *v, const struct pk_caps *pk)
{
    memset(c, 0, sizeof(*c));
    if (v->kind == V_PLAIN || v->kind == V_ABI4)
        return;
    c->wformat = dray_util_wformat_of_bit(v->wbit);
    c->passes = v->passes ? v->passes : 1;
    c->caps_matmul = pk->mm;
    c->caps_embed = pk->em;
    c->caps_passes = pk->passes ? pk->passes : 1u; /* 0: one pass */
}

static void run_variant(const struct dray_conformance_opts *o, size_t vi, const struct side *ref,
                        const struct side *sub, const struct pk_caps *pk, struct row *row, FILE *out)
{
    const struct variant *v = &variants[vi];
    uint32_t reps = o->reps ? o->reps : 12;
    char dt[24];
    for (uint32_t rep = 0; rep < reps; rep++) {
        struct conf_rng rng = {case_seed(o->seed ? o->seed : 1, vi, rep)};
        struct conf_case c;
        struct conf_metrics m;
        char why[320] = "", first[sizeof(row->why)] = "";
        case_inputs(&c, v, pk);
        memset(&m, 0, sizeof(m));
        int rc = v->make(&rng, &c, 0);
        if (rc)
            snprintf(first, sizeof(first), "%s",
                     rc == DRAY_ENOMEM ? "out of host memory building a case" : "the kit cannot build a case");
        else if (c.expect && (rc = c.expect(&c)))
            snprintf(first, sizeof(first), "%s: out of host memory for the kit's reference", c.shape);
        else if (!c.expect && (rc = run_side(ref, &c, 0, why, sizeof(why))))
            snprintf(first, sizeof(first), "reference failed on %s: %s", c.shape, why);
        else if ((rc = run_side(sub, &c, 1, why, sizeof(why))))
            snprintf(first, sizeof(first), "%s: %s", c.shape, why);
        else if (v->check(&c, c.tol ? c.tol : &v->tol, &m, why, sizeof(why))) {
            rc = 1;
            snprintf(first, sizeof(first), "%s: %s", c.shape, why);
        }
        if (rc && !row->failed)
            snprintf(row->why, sizeof(row->why), "%s", first);
        row->cases++;
        row->failed += rc != 0;
        row->m.max_abs = m.max_abs > row->m.max_abs ? m.max_abs : row->m.max_abs;
        row->m.max_rel = m.max_rel > row->m.max_rel ? m.max_rel : row->m.max_rel;
        row->m.err2 += m.err2;
        row->m.ref2 += m.ref2;
        row->m.n += m.n;
        if (o->verbose)
            fprintf(out, "  %s %s case %u: %s: %s (max abs %.3g, max rel %.3g)%s%s\n", v->op,
                    variant_dtype(v, dt, sizeof(dt)), rep, c.shape, rc ? "FAIL" : "ok", m.max_abs,
                    m.max_rel, rc ? ": " : "", rc ? first : "");
        conf_case_free(&c);
    }
    row->us_sub = row->us_ref = -1;
    if (o->no_timing)
        return;
    struct conf_rng rng = {case_seed(o->seed ? o->seed : 1, vi, 0xFFFFFFFFu)};
    struct conf_case c;
    case_inputs(&c, v, pk);
    if (v->make(&rng, &c, 1) == 0) {
        uint32_t tr = o->time_reps ? o->time_reps : 9;
        snprintf(row->shape, sizeof(row->shape), "%s", c.shape);
        row->us_sub = time_side(sub, &c, tr);
        /* the kit's own reference is plain loops on the host: not timed */
        row->us_ref = c.expect ? -1 : time_side(ref, &c, tr);
    }
    conf_case_free(&c);
}

/* ------------------------------------------------------------ the report */

static void print_time(FILE *out, double us)
{
    if (us < 0)
        fprintf(out, " %10s", "-");
    else
        fprintf(out, " %10.1f", us);
}

/* Both sides: the reference is the CPU plugin's scalar kernels, the subject is
 * what the caller named. Loaded by the kit itself (conf_loader.c). */
struct sides {
    struct conf_plugin ref_p, sub_p;
    struct conf_device ref, sub;
};

static void close_sides(struct sides *s)
{
    conf_device_close(&s->sub);
    conf_device_close(&s->ref);
    conf_plugin_unload(&s->sub_p);
    conf_plugin_unload(&s->ref_p);
}

static int open_sides(const struct dray_conformance_opts *o, struct sides *s, FILE *out)
{
    char err[1024];
    struct dray_open_options ropt = {.size = sizeof(ropt), .n_threads = o->n_threads, .reference = 1};
    struct dray_open_options sopt = {.size = sizeof(sopt), .n_threads = o->n_threads, .reference = 0};
    memset(s, 0, sizeof(*s));
    int rc = conf_plugin_load("cpu", o->plugin_path, &s->ref_p, err, sizeof(err));
    if (rc == 0)
        rc = conf_device_open(&s->ref_p, "", &ropt, &s->ref, err, sizeof(err));
    if (rc) {
        fprintf(out, "conformance: the reference (the CPU plugin's scalar kernels) is not "
                     "available: %s\n", err);
        close_sides(s);
        return rc;
    }
    rc = conf_plugin_load(o->plugin, o->plugin_path, &s->sub_p, err, sizeof(err));
    if (rc == 0)
        rc = conf_device_open(&s->sub_p, o->device, &sopt, &s->sub, err, sizeof(err));
    if (rc) {
        fprintf(out, "conformance: cannot open the subject: %s\n", err);
        close_sides(s);
    }
    return rc;
}

int dray_conformance_run(const struct dray_conformance_opts *o, FILE *out)
{
    struct sides sd;
    int matched = 0, any_fail = 0;
    size_t n_pass = 0, n_run = 0, n_total = 0;
    for (size_t i = 0; i < N_VARIANTS; i++)
        matched |= !o->op || !o->op[0] || !strcmp(o->op, variants[i].op);
    if (!o->plugin || !o->plugin[0] || !matched) {
        fprintf(out, "conformance: %s; ops are embed, rmsnorm, matmul, weight_create, rope, "
                     "kv_store, attention, gated_act, add\n",
                o->plugin && o->plugin[0] ? "unknown op" : "no plugin given");
        return DRAY_EINVAL;
    }
    int rc = open_sides(o, &sd, out);
    if (rc)
        return rc;
    const struct conf_device *refd = &sd.ref, *subd = &sd.sub;
    struct side ref = {sd.ref_p.ops, refd->ctx}, sub = {sd.sub_p.ops, subd->ctx};
    struct dray_conformance_report *rep = o->report;
    if (rep) {
        snprintf(rep->plugin, sizeof(rep->plugin), "%s", sd.sub_p.ops->name);
        snprintf(rep->path, sizeof(rep->path), "%s", sd.sub_p.path);
        snprintf(rep->device, sizeof(rep->device), "%s", subd->props.name);
        snprintf(rep->vendor, sizeof(rep->vendor), "%s", subd->props.vendor);
        rep->abi = sd.sub_p.abi;
        rep->device_index = subd->index;
        rep->seed = o->seed ? o->seed : 1;
        rep->reps = o->reps ? o->reps : 12;
        rep->opened = 1;
    }
    fprintf(out, "subject:   %s device %u: %s (%s, ABI %u)\nreference: cpu device %u: %s, "
                 "scalar reference kernels\nseed %llu, %u cases per op\n\n",
            sd.sub_p.ops->name, subd->index, subd->props.name, sd.sub_p.path, sd.sub_p.abi,
            refd->index, refd->props.name, (unsigned long long)(o->seed ? o->seed : 1),
            o->reps ? o->reps : 12);
    fprintf(out, "%-13s %-13s %5s %10s %10s %10s  %-24s %-16s %10s %10s\n", "op", "dtype", "cases",
            "max_abs", "max_rel", "nmse", "tolerance", "verdict", "us(subj)", "us(ref)");
    /* packed weights (version 3): declared per device in op_caps; weight_create
     * and weight_free are mandatory for a plugin that declares any format */
    const struct pk_caps pk = pk_caps_of(subd, sd.sub_p.abi);
    int pk_members = DRAY_HAS(sd.sub_p.ops, weight_create, 3) && DRAY_HAS(sd.sub_p.ops, weight_free, 3);
    char dt[24];
    struct row *rows = calloc(N_VARIANTS, sizeof(*rows));
    for (size_t i = 0; rows && i < N_VARIANTS; i++) {
        const struct variant *v = &variants[i];
        if (o->op && o->op[0] && strcmp(o->op, v->op))
            continue;
        struct row *row = &rows[i];
        n_total++;
        uint32_t bit = DRAY_DTYPE_BIT(v->dtype);
        const char *verdict;
        int fail = 0;
        int packed = v->kind == V_PACKED || v->kind == V_REFUSAL || v->kind == V_REFUSAL_K;
        if (packed && !pk_declared(v, &pk)) {
            verdict = "not supported";
        } else if (packed && !pk_members) {
            verdict = "FAIL no weight_create";
            fail = 1;
        } else if (v->kind == V_ABI4 && sd.sub_p.abi < 4) { /* the host never sets them below 4 */
            verdict = "not supported"; /* as an op the plugin leaves out */
        } else if (packed) { /* the kit's reference: no CPU plugin involved */
            run_variant(o, i, &ref, &sub, &pk, row, out);
            verdict = row->failed ? "FAIL" : "pass";
            fail = row->failed != 0;
            n_run++;
        } else if (!(refd->caps.op_dtypes[v->id] & bit)) {
            verdict = "no reference";
            fail = 1;
        } else if (v->id >= subd->caps.n_ops || !(subd->caps.op_dtypes[v->id] & bit)) {
            verdict = v->mandatory ? "FAIL unsupported" : "not supported";
            fail = v->mandatory;
        } else {
            run_variant(o, i, &ref, &sub, &pk, row, out);
            verdict = row->failed ? "FAIL" : "pass";
            fail = row->failed != 0;
            n_run++;
        }
        n_pass += !fail && row->cases;
        any_fail |= fail;
        fprintf(out, "%-13s %-13s %5u", v->op, variant_dtype(v, dt, sizeof(dt)), row->cases);
        if (row->cases)
            fprintf(out, " %10.3g %10.3g %10.3g", row->m.max_abs, row->m.max_rel,
                    row->m.ref2 > 0 ? row->m.err2 / row->m.ref2 : 0.0);
        else
            fprintf(out, " %10s %10s %10s", "-", "-", "-");
        fprintf(out, "  %-24s %-16s", v->tol.text, verdict);
        print_time(out, row->cases ? row->us_sub : -1);
        print_time(out, row->cases ? row->us_ref : -1);
        fprintf(out, "\n");
        if (row->failed)
            fprintf(out, "    %u of %u cases failed; first: %s\n", row->failed, row->cases, row->why);
        if (rep && rep->n_rows < DRAY_CONF_MAX_ROWS) {
            struct dray_conformance_row *r = &rep->rows[rep->n_rows++];
            snprintf(r->op, sizeof(r->op), "%s", v->op);
            snprintf(r->dtype, sizeof(r->dtype), "%s", variant_dtype(v, dt, sizeof(dt)));
            snprintf(r->verdict, sizeof(r->verdict), "%s", verdict);
            snprintf(r->tolerance, sizeof(r->tolerance), "%s", v->tol.text);
            r->passed = !fail && row->cases;
            r->cases = row->cases;
            r->failed = row->failed;
            r->max_abs = row->m.max_abs;
            r->max_rel = row->m.max_rel;
            r->nmse = row->m.ref2 > 0 ? row->m.err2 / row->m.ref2 : 0.0;
        }
    }
    if (rep) {
        rep->n_run = n_run;
        rep->n_pass = n_pass;
    }
    if (!o->no_timing) {
        fprintf(out, "\ntimed shapes (median of %u runs, op + synchronize, microseconds):\n",
                o->time_reps ? o->time_reps : 9);
        for (size_t i = 0; rows && i < N_VARIANTS; i++)
            if (rows[i].shape[0])
                fprintf(out, "  %-13s %-13s %s\n", variants[i].op,
                        variant_dtype(&variants[i], dt, sizeof(dt)), rows[i].shape);
    }
    fprintf(out, "\n%s: %zu of %zu op variants ran, %zu passed\n", any_fail ? "FAIL" : "PASS",
            n_run, n_total, n_pass);
    if (!rows)
        any_fail = 1;
    free(rows);
    close_sides(&sd);
    return any_fail ? 1 : 0;
}
