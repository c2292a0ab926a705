/* One case generator per op (random shapes, or the fixed timing shape when
 * bench = 1), the launch that fills an op's argument struct with device views,
 * and the checkers. Shapes deliberately hit odd sizes, padding strides, in-place
 * aliasing, zero rows, outlier channels, window edges, MQA/GQA, mixed
 * prefill/decode batches and block tables with holes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_internal.h"

/* ------------------------------------------------------------ case plumbing */

void *conf_arr_add(struct conf_case *c, size_t nbytes, int out)
{
    if (c->n >= CONF_MAX_ARRS)
        return NULL;
    struct conf_arr *a = &c->a[c->n];
    memset(a, 0, sizeof(*a));
    a->nbytes = nbytes;
    a->out = out;
    a->host = calloc(1, nbytes ? nbytes : 4);
    if (!a->host)
        return NULL;
    c->n++;
    return a->host;
}

void conf_case_free(struct conf_case *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->a[i].host);
        free(c->a[i].got[0]);
        free(c->a[i].got[1]);
    }
    free(c->params);
    free(c->elem_tol);
    free(c->wcodes);
    free(c->wd);
    free(c->wm);
    free(c->bcodes);
    free(c->bd);
    free(c->bm);
    free(c->wsub);
    free(c->bsub);
    memset(c, 0, sizeof(*c));
}

static int set_params(struct conf_case *c, const void *p, size_t n)
{
    c->params = malloc(n);
    if (!c->params)
        return DRAY_ENOMEM;
    memcpy(c->params, p, n);
    return 0;
}

static void fill_f32(struct conf_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = conf_randf(r, lo, hi);
}

static void fill_i8(struct conf_rng *r, int8_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (int8_t)((int)conf_range(r, 0, 254) - 127);
}

/* A random f16 with magnitude 2^-6 .. 2^3 (normal numbers only), as bits. */
static uint16_t rand_f16(struct conf_rng *r)
{
    uint32_t sign = conf_rand(r) & 1, exp = conf_range(r, 9, 18), man = conf_rand(r) & 0x3ff;
    return (uint16_t)(sign << 15 | exp << 10 | man);
}

/* "odd" sizes: mostly small, sometimes a power of two, sometimes one past it */
static uint32_t rand_dim(struct conf_rng *r, uint32_t max)
{
    switch (conf_range(r, 0, 3)) {
    case 0: return conf_range(r, 1, max);
    case 1: { uint32_t p = 1u << conf_range(r, 0, 9); return p <= max ? p : max; }
    case 2: { uint32_t p = (1u << conf_range(r, 0, 9)) + 1; return p <= max ? p : max; }
    default: return conf_range(r, 1, max < 64 ? max : 64) | 1;
    }
}

#define OOM_IF(p)                  \
    do {                           \
        if (!(p))                  \
            return DRAY_ENOMEM;    \
    } while (0)

/* ------------------------------------------------------------ embed */

static int launch_embed(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                        struct dray_packed *w, const void *params)
{
    (void)w;
    struct dray_embed_args a = *(const struct dray_embed_args *)params;
    a.ids = v[0];
    a.table = v[1];
    a.row_scale = v[2];
    a.out = v[3];
    return ops->embed(ctx, &a);
}

static int make_embed(struct conf_rng *r, struct conf_case *c, int bench, uint32_t dtype)
{
    struct dray_embed_args a = {.dtype = dtype};
    a.n_rows = bench ? 8192 : rand_dim(r, 300);
    a.dim = bench ? 1152 : rand_dim(r, 700);
    a.n_tok = bench ? 64 : conf_range(r, 1, 40);
    a.scale = bench ? 33.9411f : conf_randf(r, 0.5f, 40.0f);
    int32_t *ids = conf_arr_add(c, a.n_tok * 4, 0);
    OOM_IF(ids);
    for (uint32_t t = 0; t < a.n_tok; t++)
        ids[t] = (int32_t)(t == 0 ? a.n_rows - 1 : t == 1 ? 0 : conf_range(r, 0, a.n_rows - 1));
    size_t cells = (size_t)a.n_rows * a.dim;
    void *table = conf_arr_add(c, cells * (dtype == DRAY_F32 ? 4 : 1), 0);
    float *rs = conf_arr_add(c, (size_t)a.n_rows * 4, 0);
    float *out = conf_arr_add(c, (size_t)a.n_tok * a.dim * 4, 1);
    OOM_IF(table && rs && out);
    if (dtype == DRAY_F32)
        fill_f32(r, table, cells, -1, 1);
    else
        fill_i8(r, table, cells);
    fill_f32(r, rs, a.n_rows, 0.0005f, 0.02f);
    fill_f32(r, out, (size_t)a.n_tok * a.dim, -1, 1);
    snprintf(c->shape, sizeof(c->shape), "n_tok=%u dim=%u n_rows=%u", a.n_tok, a.dim, a.n_rows);
    c->launch = launch_embed;
    return set_params(c, &a, sizeof(a));
}

int conf_make_embed_i8(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_embed(r, c, bench, DRAY_I8);
}

int conf_make_embed_f32(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_embed(r, c, bench, DRAY_F32);
}

/* ------------------------------------------------------------ rmsnorm */

struct rmsnorm_p {
    struct dray_rmsnorm_args a;
    int out_idx; /* 0 = in place on x, 2 = separate out */
};

static int launch_rmsnorm(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                          struct dray_packed *w, const void *params)
{
    (void)w;
    const struct rmsnorm_p *p = params;
    struct dray_rmsnorm_args a = p->a;
    a.x = v[0];
    a.w = v[1];
    a.out = v[p->out_idx];
    return ops->rmsnorm(ctx, &a);
}

int conf_make_rmsnorm(struct conf_rng *r, struct conf_case *c, int bench)
{
    struct rmsnorm_p p = {.out_idx = 2};
    struct dray_rmsnorm_args *a = &p.a;
    a->n_tok = bench ? 64 : conf_range(r, 1, 20);
    a->n_head = bench || conf_range(r, 0, 1) ? 1 : conf_range(r, 1, 8);
    a->n = bench ? 1152 : rand_dim(r, 1100);
    a->stride_x = a->n_head * a->n + (bench ? 0 : conf_range(r, 0, 5));
    a->eps = conf_range(r, 0, 1) ? 1e-6f : 1e-5f;
    int inplace = !bench && conf_range(r, 0, 2) == 0;
    a->stride_out = inplace ? a->stride_x : a->n_head * a->n + (bench ? 0 : conf_range(r, 0, 3));
    size_t nx = (size_t)a->n_tok * a->stride_x;
    float *x = conf_arr_add(c, nx * 4, inplace);
    float *w = conf_arr_add(c, a->n * 4, 0);
    OOM_IF(x && w);
    for (uint32_t t = 0; t < a->n_tok; t++) {
        float mag = powf(10.0f, conf_randf(r, -3, 2)); /* rows of very different size */
        int zero = !bench && conf_range(r, 0, 9) == 0;
        for (uint32_t i = 0; i < a->stride_x; i++)
            x[(size_t)t * a->stride_x + i] = zero ? 0.0f : conf_randf(r, -mag, mag);
    }
    fill_f32(r, w, a->n, 0.5f, 1.5f);
    if (!inplace) {
        float *out = conf_arr_add(c, (size_t)a->n_tok * a->stride_out * 4, 1);
        OOM_IF(out);
        fill_f32(r, out, (size_t)a->n_tok * a->stride_out, -1, 1);
    } else {
        p.out_idx = 0;
    }
    snprintf(c->shape, sizeof(c->shape), "n_tok=%u n_head=%u n=%u stride_x=%u%s", a->n_tok,
             a->n_head, a->n, a->stride_x, inplace ? " in-place" : "");
    c->launch = launch_rmsnorm;
    return set_params(c, &p, sizeof(p));
}

/* ------------------------------------------------------------ matmul */

static int launch_matmul(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                         struct dray_packed *w, const void *params)
{
    (void)w;
    struct dray_matmul_args a = *(const struct dray_matmul_args *)params;
    a.x = v[0];
    a.w = v[1];
    a.wscale = v[2];
    a.out = v[3];
    a.outlier_idx = v[4];
    a.outlier_w = v[5];
    return ops->matmul(ctx, &a);
}

/* n distinct sorted channels of [0, k) */
static void pick_channels(struct conf_rng *r, int32_t *idx, uint32_t n, uint32_t k)
{
    uint32_t have = 0;
    while (have < n) {
        int32_t cnd = (int32_t)conf_range(r, 0, k - 1), pos = 0;
        int dup = 0;
        for (uint32_t i = 0; i < have; i++)
            dup |= idx[i] == cnd;
        if (dup)
            continue;
        while ((uint32_t)pos < have && idx[pos] < cnd)
            pos++;
        memmove(&idx[pos + 1], &idx[pos], (have - (uint32_t)pos) * sizeof(*idx));
        idx[pos] = cnd;
        have++;
    }
}

static int make_matmul(struct conf_rng *r, struct conf_case *c, int bench, uint32_t wdtype)
{
    struct dray_matmul_args a = {.wdtype = wdtype};
    a.n_tok = bench ? 8 : conf_range(r, 1, 24);
    a.k = bench ? 1152 : conf_range(r, 0, 7) == 0 ? 1152 + conf_range(r, 0, 3) : rand_dim(r, 600);
    a.n_out = bench ? (wdtype == DRAY_I8 ? 6912 : 1152) : rand_dim(r, 300);
    a.stride_x = a.k + (bench ? 0 : conf_range(r, 0, 4));
    a.stride_out = a.n_out + (bench ? 0 : conf_range(r, 0, 4));
    a.accumulate = !bench && conf_range(r, 0, 2) == 0;
    if (wdtype == DRAY_I8 && !bench && conf_range(r, 0, 2) == 0)
        a.n_outlier = conf_range(r, 1, a.k < 8 ? a.k : 8);
    size_t nx = (size_t)a.n_tok * a.stride_x, nw = (size_t)a.n_out * a.k;
    size_t no = (size_t)a.n_tok * a.stride_out;
    float *x = conf_arr_add(c, nx * 4, 0);
    void *w = conf_arr_add(c, nw * (wdtype == DRAY_I8 ? 1 : 4), 0);
    float *ws = conf_arr_add(c, a.n_out * 4, 0);
    float *out = conf_arr_add(c, no * 4, 1);
    int32_t *oidx = conf_arr_add(c, a.n_outlier * 4, 0);
    float *ow = conf_arr_add(c, (size_t)a.n_out * a.n_outlier * 4, 0);
    OOM_IF(x && w && ws && out && oidx && ow);
    fill_f32(r, x, nx, -2, 2);
    for (uint32_t t = 0; !bench && t < a.n_tok; t++)
        if (conf_range(r, 0, 7) == 0) /* a zero row quantizes to q = 0, sx = 0 */
            memset(x + (size_t)t * a.stride_x, 0, a.k * 4);
    fill_f32(r, ws, a.n_out, 0.001f, 0.05f);
    fill_f32(r, out, no, -1, 1);
    if (wdtype == DRAY_I8)
        fill_i8(r, w, nw);
    else
        fill_f32(r, w, nw, -0.1f, 0.1f);
    pick_channels(r, oidx, a.n_outlier, a.k);
    fill_f32(r, ow, (size_t)a.n_out * a.n_outlier, -0.05f, 0.05f);
    /* w keeps random values at outlier channels: backend.h says they are ignored */
    for (uint32_t j = 0; j < a.n_outlier; j++) {
        for (uint32_t t = 0; t < a.n_tok; t++) /* these are what make them outliers */
            x[(size_t)t * a.stride_x + (uint32_t)oidx[j]] *= 30.0f;
    }
    if (wdtype == DRAY_F32) { /* bound: a fraction of sum|x||w| (+ the value added to) */
        c->elem_tol = calloc(no, sizeof(float));
        OOM_IF(c->elem_tol);
        for (uint32_t t = 0; t < a.n_tok; t++)
            for (uint32_t o = 0; o < a.n_out; o++) {
                double s = a.accumulate ? fabs(out[(size_t)t * a.stride_out + o]) : 0.0;
                for (uint32_t i = 0; i < a.k; i++)
                    s += fabs(x[(size_t)t * a.stride_x + i] * ((float *)w)[(size_t)o * a.k + i]);
                c->elem_tol[(size_t)t * a.stride_out + o] = (float)s;
            }
    }
    c->scale_ref = wdtype == DRAY_I8 ? -1.0 : 0.0;
    snprintf(c->shape, sizeof(c->shape), "n_tok=%u k=%u n_out=%u outliers=%u%s", a.n_tok, a.k,
             a.n_out, a.n_outlier, a.accumulate ? " accumulate" : "");
    c->launch = launch_matmul;
    return set_params(c, &a, sizeof(a));
}

int conf_make_matmul_i8(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_matmul(r, c, bench, DRAY_I8);
}

int conf_make_matmul_f32(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_matmul(r, c, bench, DRAY_F32);
}

/* ------------------------------------------------------------ packed weights (version 3) */

/* The kit's own reading of backend.h's "Packed weights", written from its text
 * rather than from a plugin or from backend_util.h's helpers (which the
 * template uses), so the two check each other. Version 4's two-level formats
 * (super = 1: GGUF's Q4_K, Q5_K, Q6_K shapes) are read the same way. */

/* B: bytes of one group's codes. */
static uint32_t pk_group_bytes(struct dray_wformat f)
{
    return f.bits == 4 ? 16u : f.bits == 5 ? 20u : f.bits == 6 ? 24u : 32u;
}

/* Code of input c of row o: row-major groups of B bytes. 4 bits: byte j holds
 * input j (bits 0..3) and input 16+j (bits 4..7) of the group; 5 bits: those,
 * then a little-endian uint32 with bit 4 of input j at bit j; 6 bits: the
 * 16 bytes, then a little-endian uint64 with bits 4-5 of input j at bits 2j,
 * 2j+1; 8 bits: byte j, two's complement. */
static int pk_code(const struct dray_weight_desc *w, uint32_t o, uint32_t c)
{
    uint32_t G = w->k / 32, j = c % 32;
    const uint8_t *grp = (const uint8_t *)w->codes + ((size_t)o * G + c / 32) * pk_group_bytes(w->format);
    if (w->format.bits == 8)
        return (int8_t)grp[j];
    int code = j < 16 ? grp[j] & 0x0f : grp[j - 16] >> 4;
    if (w->format.bits == 5) {
        uint32_t hi = (uint32_t)grp[16] | (uint32_t)grp[17] << 8 | (uint32_t)grp[18] << 16 |
                      (uint32_t)grp[19] << 24;
        code += 16 * (int)((hi >> j) & 1u);
    } else if (w->format.bits == 6) {
        uint64_t hi = 0;
        for (int b = 7; b >= 0; b--)
            hi = hi << 8 | grp[16 + b];
        code += 16 * (int)((hi >> (2 * j)) & 3u);
    }
    return code;
}

static float pk_value(struct dray_wformat f, const void *arr, size_t i)
{
    return f.scale == DRAY_WSCALE_F16 ? dray_util_f16_to_f32(((const uint16_t *)arr)[i])
                                      : ((const float *)arr)[i];
}

/* Inputs under one scale: 32 (a group), or 16 for 6 bits, whose half-groups
 * are groups of their own. */
static uint32_t pk_unit(struct dray_wformat f)
{
    return f.super && f.bits == 6 ? 16u : 32u;
}

/* The zero point without a min: 8, 16, 32 (6 bits), 0. */
static int pk_z(struct dray_wformat f)
{
    return f.bits == 4 ? 8 : f.bits == 5 ? 16 : f.bits == 6 ? 32 : 0;
}

/* d and m of the unit (pk_unit inputs) that holds input c of row o. Two
 * levels: D, M of super-block c/256; d = D*s, m = -(M*n) for 4 and 5 bits,
 * (s, n) the group's pair in sub; d = D*sub of the half-group for 6 bits. */
static void pk_scales(const struct dray_weight_desc *w, uint32_t o, uint32_t c, float *d, float *m)
{
    const struct dray_wformat f = w->format;
    if (!f.super) {
        size_t i = (size_t)o * (w->k / 32) + c / 32;
        *d = pk_value(f, w->d, i);
        *m = f.has_min ? pk_value(f, w->m, i) : 0.0f;
        return;
    }
    const size_t sb = (size_t)o * (w->k / 256) + c / 256;
    const float D = pk_value(f, w->d, sb);
    if (f.bits == 6) {
        *d = D * (float)((const int8_t *)w->sub)[(size_t)o * (w->k / 16) + c / 16];
        *m = 0.0f;
        return;
    }
    const uint8_t *sn = (const uint8_t *)w->sub + 2 * ((size_t)o * (w->k / 32) + c / 32);
    *d = D * (float)sn[0];
    *m = -(pk_value(f, w->m, sb) * (float)sn[1]);
}

/* d of the unit of input c of row o, and m' (matmul's: m with a min, else -z*d). */
static void pk_dm(const struct dray_weight_desc *w, uint32_t o, uint32_t c, float *d, float *m)
{
    pk_scales(w, o, c, d, m);
    if (!w->format.has_min)
        *m = -(float)pk_z(w->format) * *d;
}

/* W[o][c] as backend.h defines it: code*d + m with a min, (code - z)*d without. */
static float pk_weight(const struct dray_weight_desc *w, uint32_t o, uint32_t c)
{
    float d, m;
    pk_scales(w, o, c, &d, &m);
    int code = pk_code(w, o, c);
    if (w->format.has_min)
        return (float)code * d + m;
    return (float)(code - pk_z(w->format)) * d;
}

/* The activation rule on one group of 32: sx = max|x|/127, q = x/sx rounded to
 * nearest even (rintf, default rounding mode), clamped to [-127, 127]. */
static float pk_quant(const float *x, int8_t *q)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float sx = amax / 127.0f;
    for (int j = 0; j < 32; j++) {
        float v = sx > 0.0f ? rintf(x[j] / sx) : 0.0f;
        q[j] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
    return sx;
}

/* One pass of one output: the sum over g, in f32, of
 * sx[g] * (d * (float)sum(q*code) + m' * (float)sum(q)), exact int32 group
 * sums; with 6-bit two-level weights the bracket sums both half-groups' terms. */
static float pk_dot(const struct dray_weight_desc *w, uint32_t o, const int8_t *q, const float *sx)
{
    const uint32_t unit = pk_unit(w->format);
    float acc = 0.0f;
    for (uint32_t g = 0; g < w->k / 32; g++) {
        float part = 0.0f;
        for (uint32_t c0 = 32 * g; c0 < 32 * g + 32; c0 += unit) {
            int32_t sqc = 0, sq = 0;
            for (uint32_t c = c0; c < c0 + unit; c++) {
                sqc += q[c] * pk_code(w, o, c);
                sq += q[c];
            }
            float d, m;
            pk_dm(w, o, c0, &d, &m);
            part += d * (float)sqc + m * (float)sq;
        }
        acc += sx[g] * part;
    }
    return acc;
}

/* "q4-f16-min", or "q4-k" for a two-level format: the name in case shapes
 * and in the dtype column. */
static const char *pk_name(struct dray_wformat f, char *buf, size_t len)
{
    if (f.super)
        snprintf(buf, len, "q%u-k", (unsigned)f.bits);
    else
        snprintf(buf, len, "q%u-%s%s", (unsigned)f.bits, f.scale == DRAY_WSCALE_F16 ? "f16" : "f32",
                 f.has_min ? "-min" : "");
    return buf;
}

/* Random d (or m) value i of a group in the format's scale type. */
static void pk_put(struct dray_wformat f, void *arr, size_t i, float v)
{
    if (f.scale == DRAY_WSCALE_F16)
        ((uint16_t *)arr)[i] = dray_util_f32_to_f16(v);
    else
        ((float *)arr)[i] = v;
}

/* Random sub-scales of a two-level format into c->wsub: (s, n) 0..63 for 4
 * and 5 bits, the extremes 0 and 63 now and then; any int8 for 6 bits. */
static int pk_random_sub(struct conf_rng *r, struct conf_case *c, struct dray_wformat f, uint32_t n_out,
                         uint32_t k)
{
    size_t n = (size_t)n_out * (k / 16); /* two bytes per 32, or one per 16 */
    uint8_t *sub = malloc(n);
    OOM_IF(sub);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = conf_rand(r), pick = conf_range(r, 0, 15);
        sub[i] = (uint8_t)(f.bits == 6 ? v : pick == 0 ? 0 : pick == 1 ? 63 : v % 64);
    }
    c->wsub = sub;
    return 0;
}

/* Random weights of format f, n_out x k, for uses: any code bytes (every byte
 * is valid codes), scales of either sign and a few zero groups, mins of either
 * sign; two levels: f16 super-scales per 256 inputs, scaled so that D*s and
 * M*n span what one level's d and m do, and random sub-scales. Into c->wdesc
 * and the arrays it names. */
static int pk_random_weights(struct conf_rng *r, struct conf_case *c, struct dray_wformat f,
                             uint32_t n_out, uint32_t k, uint32_t uses)
{
    size_t groups = (size_t)n_out * (k / 32), nc = groups * pk_group_bytes(f);
    size_t ns = f.super ? (size_t)n_out * (k / 256) : groups, sb = f.scale == DRAY_WSCALE_F16 ? 2 : 4;
    /* the sub-scale's largest size: 63 (s, n) or 128 (int8) */
    float sub_max = !f.super ? 1.0f : f.bits == 6 ? 128.0f : 63.0f;
    c->wcodes = malloc(nc);
    c->wd = malloc(ns * sb);
    c->wm = f.has_min ? malloc(ns * sb) : NULL;
    OOM_IF(c->wcodes && c->wd && (c->wm || !f.has_min));
    for (size_t i = 0; i < nc; i++)
        ((uint8_t *)c->wcodes)[i] = (uint8_t)conf_rand(r);
    for (size_t i = 0; i < ns; i++) {
        float d = conf_range(r, 0, 63) == 0 ? 0.0f : conf_randf(r, 0.001f, 0.05f) / sub_max;
        pk_put(f, c->wd, i, conf_range(r, 0, 7) == 0 ? -d : d);
        if (f.has_min)
            pk_put(f, c->wm, i, conf_randf(r, -0.2f, 0.2f) / sub_max);
    }
    if (f.super && pk_random_sub(r, c, f, n_out, k))
        return DRAY_ENOMEM;
    c->wdesc = (struct dray_weight_desc){.size = sizeof(struct dray_weight_desc), .format = f,
                                         .n_out = n_out, .k = k, .uses = uses, .codes = c->wcodes,
                                         .d = c->wd, .m = c->wm, .sub = c->wsub};
    return 0;
}

static const struct conf_tol tol_packed_embed = CONF_TOL_PACKED_EMBED;

/* ---- matmul on packed weights: arrays x, out */

static int launch_matmul_packed(const struct dray_ops *ops, struct dray_ctx *ctx,
                                const struct dray_view *v, struct dray_packed *w, const void *params)
{
    struct dray_matmul_args a = *(const struct dray_matmul_args *)params;
    a.x = v[0];
    a.out = v[1];
    a.packed = w; /* w, wscale and the outlier views stay empty: ignored */
    return ops->matmul(ctx, &a);
}

/* out (+)= the sum over the passes, in order, of the one-pass sums; the
 * second pass quantizes the residual x - q*sx of the first. */
static int expect_matmul_packed(struct conf_case *c)
{
    const struct dray_matmul_args *a = c->params;
    const struct dray_weight_desc *w = &c->wdesc;
    const float *x = c->a[0].host;
    uint32_t k = a->k, passes = a->passes ? a->passes : 1;
    float *y = malloc(c->a[1].nbytes), *res = malloc((size_t)k * 4), *sx = malloc((size_t)k / 32 * 4);
    int8_t *q = malloc(k);
    if (!y || !res || !sx || !q) {
        free(y);
        free(res);
        free(sx);
        free(q);
        return DRAY_ENOMEM;
    }
    memcpy(y, c->a[1].host, c->a[1].nbytes); /* padding and, accumulating, the prior values */
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *src = x + (size_t)t * a->stride_x;
        float *yr = y + (size_t)t * a->stride_out;
        for (uint32_t o = 0; !a->accumulate && o < a->n_out; o++)
            yr[o] = 0.0f;
        for (uint32_t p = 0; p < passes; p++) {
            for (uint32_t g = 0; g < k / 32; g++)
                sx[g] = pk_quant(src + 32 * g, q + 32 * g);
            for (uint32_t o = 0; o < a->n_out; o++)
                yr[o] += pk_dot(w, o, q, sx);
            for (uint32_t i = 0; p + 1 < passes && i < k; i++) /* r = x - q*sx, in f32 */
                res[i] = src[i] - (float)q[i] * sx[i / 32];
            src = res;
        }
    }
    free(res);
    free(sx);
    free(q);
    c->a[1].got[0] = y;
    return 0;
}

/* k from 32 to 2048 (mostly up to 512; two-level formats: rounded up to a
 * multiple of 256), n_out mostly not a multiple of 16 (odd tails), 1..9
 * tokens, padded strides, accumulate, zero tokens, zero groups and loud
 * channels; passes as the variant says (one-pass cases sometimes send
 * passes = 0, which means 1). */
int conf_make_matmul_packed(struct conf_rng *r, struct conf_case *c, int bench)
{
    struct dray_matmul_args a = {.wdtype = DRAY_PACKED, .passes = c->passes};
    uint32_t G = bench ? 36 : conf_range(r, 0, 7) == 0 ? 64 : conf_range(r, 0, 7) == 0 ? conf_range(r, 17, 63)
                                                                                     : conf_range(r, 1, 16);
    uint32_t shape = conf_range(r, 0, 7);
    if (c->wformat.super) /* whole super-blocks of 256 */
        G = (G + 7) / 8 * 8;
    a.k = 32 * G;
    a.n_out = bench ? 6912 : shape == 0 ? 1 : shape <= 2 ? 16 * conf_range(r, 1, 8)
                                                         : 16 * conf_range(r, 0, 9) + (conf_range(r, 0, 15) | 1);
    a.n_tok = bench ? 8 : conf_range(r, 0, 2) == 0 ? 1 : conf_range(r, 2, 9);
    a.stride_x = a.k + (bench ? 0 : conf_range(r, 0, 4));
    a.stride_out = a.n_out + (bench ? 0 : conf_range(r, 0, 4));
    a.accumulate = !bench && conf_range(r, 0, 2) == 0;
    if (a.passes == 1 && !bench && conf_range(r, 0, 3) == 0)
        a.passes = 0;
    size_t nx = (size_t)a.n_tok * a.stride_x, no = (size_t)a.n_tok * a.stride_out;
    float *x = conf_arr_add(c, nx * 4, 0);
    float *out = conf_arr_add(c, no * 4, 1);
    OOM_IF(x && out);
    int rc = pk_random_weights(r, c, c->wformat, a.n_out, a.k, DRAY_WUSE_MATMUL);
    if (rc)
        return rc;
    fill_f32(r, x, nx, -2, 2);
    for (uint32_t t = 0; !bench && t < a.n_tok; t++) {
        float *xr = x + (size_t)t * a.stride_x;
        uint32_t what = conf_range(r, 0, 7);
        if (what == 0) /* a zero token: q = 0, sx = 0 in every group */
            memset(xr, 0, a.k * 4);
        else if (what == 1) /* a zero group */
            memset(xr + 32 * conf_range(r, 0, G - 1), 0, 32 * 4);
        else if (what <= 3) /* one loud channel: only its group's scale sees it */
            xr[conf_range(r, 0, a.k - 1)] *= 40.0f;
    }
    fill_f32(r, out, no, -1, 1);
    if (!bench) { /* the bound: 1e-4 of sum_k |x||W| (+ |out| accumulating) */
        float *wf = malloc((size_t)a.n_out * a.k * sizeof(float));
        c->elem_tol = calloc(no, sizeof(float));
        if (!wf || !c->elem_tol) {
            free(wf);
            return DRAY_ENOMEM;
        }
        for (uint32_t o = 0; o < a.n_out; o++)
            for (uint32_t i = 0; i < a.k; i++)
                wf[(size_t)o * a.k + i] = fabsf(pk_weight(&c->wdesc, o, i));
        for (uint32_t t = 0; t < a.n_tok; t++)
            for (uint32_t o = 0; o < a.n_out; o++) {
                double s = a.accumulate ? fabs(out[(size_t)t * a.stride_out + o]) : 0.0;
                for (uint32_t i = 0; i < a.k; i++)
                    s += fabs(x[(size_t)t * a.stride_x + i]) * wf[(size_t)o * a.k + i];
                c->elem_tol[(size_t)t * a.stride_out + o] = (float)s;
            }
        free(wf);
    }
    char fn[24];
    snprintf(c->shape, sizeof(c->shape), "n_tok=%u k=%u n_out=%u %s passes=%u%s", a.n_tok, a.k,
             a.n_out, pk_name(c->wformat, fn, sizeof(fn)), a.passes, a.accumulate ? " accumulate" : "");
    c->launch = launch_matmul_packed;
    c->expect = expect_matmul_packed;
    return set_params(c, &a, sizeof(a));
}

/* ---- embed from packed weights: arrays ids, out */

static int launch_embed_packed(const struct dray_ops *ops, struct dray_ctx *ctx,
                               const struct dray_view *v, struct dray_packed *w, const void *params)
{
    struct dray_embed_args a = *(const struct dray_embed_args *)params;
    a.ids = v[0];
    a.out = v[1];
    a.packed = w; /* table and row_scale stay empty: ignored */
    return ops->embed(ctx, &a);
}

/* out[t][i] = W[ids[t]][i] * scale. */
static int expect_embed_packed(struct conf_case *c)
{
    const struct dray_embed_args *a = c->params;
    const int32_t *ids = c->a[0].host;
    float *y = malloc(c->a[1].nbytes);
    OOM_IF(y);
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t i = 0; i < a->dim; i++)
            y[(size_t)t * a->dim + i] = pk_weight(&c->wdesc, (uint32_t)ids[t], i) * a->scale;
    c->a[1].got[0] = y;
    return 0;
}

/* Odd row counts, dim from 32 to 1280 (two levels: 256 to 1280), the first and
 * last row among the ids; a table the subject declares for matmul too is
 * sometimes created for both (a tied embedding and output head). */
int conf_make_embed_packed(struct conf_rng *r, struct conf_case *c, int bench)
{
    struct dray_embed_args a = {.dtype = DRAY_PACKED};
    uint32_t bit = DRAY_WFORMAT_BIT(c->wformat), uses = DRAY_WUSE_EMBED;
    a.n_rows = bench ? 8192 : rand_dim(r, 300);
    a.dim = bench ? 1152 : 32 * (conf_range(r, 0, 3) == 0 ? conf_range(r, 9, 40) : conf_range(r, 1, 8));
    if (c->wformat.super) /* whole super-blocks of 256 */
        a.dim = (a.dim + 255) / 256 * 256;
    a.n_tok = bench ? 64 : conf_range(r, 1, 40);
    a.scale = bench ? 33.9411f : conf_randf(r, 0.5f, 40.0f);
    if (!bench && (c->caps_matmul & bit) && conf_range(r, 0, 2) == 0)
        uses |= DRAY_WUSE_MATMUL;
    int32_t *ids = conf_arr_add(c, a.n_tok * 4, 0);
    float *out = conf_arr_add(c, (size_t)a.n_tok * a.dim * 4, 1);
    OOM_IF(ids && out);
    for (uint32_t t = 0; t < a.n_tok; t++)
        ids[t] = (int32_t)(t == 0 ? a.n_rows - 1 : t == 1 ? 0 : conf_range(r, 0, a.n_rows - 1));
    int rc = pk_random_weights(r, c, c->wformat, a.n_rows, a.dim, uses);
    if (rc)
        return rc;
    fill_f32(r, out, (size_t)a.n_tok * a.dim, -1, 1);
    if (!bench) { /* the bound's terms: (|code*d| + |m'|) * |scale| */
        c->elem_tol = calloc((size_t)a.n_tok * a.dim, sizeof(float));
        OOM_IF(c->elem_tol);
        for (uint32_t t = 0; t < a.n_tok; t++)
            for (uint32_t i = 0; i < a.dim; i++) {
                float d, m;
                pk_dm(&c->wdesc, (uint32_t)ids[t], i, &d, &m);
                float cd = fabsf((float)pk_code(&c->wdesc, (uint32_t)ids[t], i) * d);
                c->elem_tol[(size_t)t * a.dim + i] = (cd + fabsf(m)) * fabsf(a.scale);
            }
    }
    char fn[24];
    snprintf(c->shape, sizeof(c->shape), "n_tok=%u dim=%u n_rows=%u %s%s", a.n_tok, a.dim, a.n_rows,
             pk_name(c->wformat, fn, sizeof(fn)), uses & DRAY_WUSE_MATMUL ? " uses=matmul+embed" : "");
    c->launch = launch_embed_packed;
    c->expect = expect_embed_packed;
    return set_params(c, &a, sizeof(a));
}

/* ---- weight_create refusals */

/* A random set bit of mask (non-zero). */
static uint32_t pick_bit(struct conf_rng *r, uint32_t mask)
{
    uint32_t n = (uint32_t)__builtin_popcount(mask), want = conf_range(r, 0, n - 1);
    for (uint32_t i = 0; i < 32; i++)
        if ((mask >> i & 1u) && want-- == 0)
            return i;
    return 0;
}

enum { BAD_UNDECLARED, BAD_BITS, BAD_SCALE, BAD_MIN_FLAG, BAD_RESERVED, BAD_K, BAD_N_OUT, BAD_NO_USES,
       BAD_USES, BAD_NO_MIN, BAD_NO_CODES, BAD_SIZE, BAD_KINDS };

/* A refusal case's good half: packed matmul in a format of mm where there is
 * one, else embed in one of em; then the bad descriptor starts as its copy
 * over zeroed arrays big enough for any format and one more group per row
 * (so a plugin that reads what it should have refused reads the kit's
 * memory, not past it). */
static int refusal_follow_up(struct conf_rng *r, struct conf_case *c, uint32_t mm, uint32_t em)
{
    c->wformat = dray_util_wformat_of_bit(pick_bit(r, mm ? mm : em));
    c->passes = (c->caps_passes & 2u) && (!(c->caps_passes & 1u) || conf_range(r, 0, 1)) ? 2 : 1;
    int rc = mm ? conf_make_matmul_packed(r, c, 0) : conf_make_embed_packed(r, c, 0);
    if (rc)
        return rc;
    if (!mm)
        c->tol = &tol_packed_embed;
    struct dray_weight_desc *b = &c->bad;
    *b = c->wdesc;
    size_t cells = (size_t)(b->n_out ? b->n_out : 1) * (b->k / 32 + 1);
    c->bcodes = calloc(cells, 32);
    c->bd = calloc(cells, 4);
    c->bm = calloc(cells, 4);
    c->bsub = calloc(cells, 2); /* two bytes per group: the larger sub */
    OOM_IF(c->bcodes && c->bd && c->bm && c->bsub);
    b->codes = c->bcodes;
    b->d = c->bd;
    b->m = b->format.has_min ? c->bm : NULL;
    b->sub = b->format.super ? c->bsub : NULL;
    return 0;
}

/* The case's shape: the refusal expected, then the follow-up's own shape. */
static int refusal_shape(struct conf_case *c)
{
    char *good = strdup(c->shape);
    OOM_IF(good);
    snprintf(c->shape, sizeof(c->shape), "refused %s (expect %s), then %s", c->bad_what,
             c->bad_rc == DRAY_ENOTSUP ? "ENOTSUP" : c->bad_exact ? "EINVAL" : "EINVAL or ENOTSUP", good);
    free(good);
    return 0;
}

/* One bad descriptor, then a good case on a declared format: the refusal must
 * be clean (the code, a NULL handle, a reason) and leave the plugin working. */
int conf_make_weight_refusal(struct conf_rng *r, struct conf_case *c, int bench)
{
    uint32_t mm = c->caps_matmul & DRAY_UTIL_WF_ALL, em = c->caps_embed & DRAY_UTIL_WF_ALL;
    if (bench || !(mm | em))
        return DRAY_ENOTSUP; /* nothing to time; nothing declared to follow up with */
    /* the follow-up, then the bad one: the good descriptor with one fault */
    int rc = refusal_follow_up(r, c, mm, em);
    if (rc)
        return rc;
    struct dray_weight_desc *b = &c->bad;
    /* undeclared formats, for matmul, embed, or both: one where some format is missing */
    const uint32_t uses[3] = {DRAY_WUSE_MATMUL, DRAY_WUSE_EMBED, DRAY_WUSE_MATMUL | DRAY_WUSE_EMBED};
    const uint32_t have[3] = {mm, em, mm & em};
    uint32_t open_uses = 0;
    for (int i = 0; i < 3; i++)
        open_uses |= (have[i] != DRAY_UTIL_WF_ALL) << i;
    uint32_t kind = conf_range(r, open_uses ? 0 : 1, BAD_KINDS - 1);
    if (open_uses && conf_range(r, 0, 2) == 0)
        kind = BAD_UNDECLARED; /* the refusal a partial plugin meets most: ask it more often */
    char fn[24];
    c->bad_rc = DRAY_EINVAL;
    switch (kind) {
    case BAD_UNDECLARED: {
        uint32_t u = pick_bit(r, open_uses);
        b->uses = uses[u];
        b->format = dray_util_wformat_of_bit(pick_bit(r, DRAY_UTIL_WF_ALL & ~have[u]));
        b->m = b->format.has_min ? c->bm : NULL;
        c->bad_rc = DRAY_ENOTSUP;
        snprintf(c->bad_what, sizeof(c->bad_what), "undeclared format %s for %s",
                 pk_name(b->format, fn, sizeof(fn)), u == 0 ? "matmul" : u == 1 ? "embed" : "matmul+embed");
        break;
    }
    case BAD_BITS:
        b->format.bits = (uint8_t)(conf_range(r, 0, 1) ? 6 : conf_range(r, 0, 1) ? 3 : 16);
        snprintf(c->bad_what, sizeof(c->bad_what), "format bits %u", b->format.bits);
        break;
    case BAD_SCALE:
        b->format.scale = 2;
        snprintf(c->bad_what, sizeof(c->bad_what), "format scale 2 (not f32 or f16)");
        break;
    case BAD_MIN_FLAG:
        b->format.has_min = 2;
        b->m = c->bm;
        snprintf(c->bad_what, sizeof(c->bad_what), "format has_min 2");
        break;
    case BAD_RESERVED:
        b->format.super = 2;
        snprintf(c->bad_what, sizeof(c->bad_what), "format super 2 (0 or 1)");
        break;
    case BAD_K:
        b->k += 16;
        snprintf(c->bad_what, sizeof(c->bad_what), "k = %u (not a multiple of 32)", b->k);
        break;
    case BAD_N_OUT:
        b->n_out = 0;
        snprintf(c->bad_what, sizeof(c->bad_what), "n_out = 0");
        break;
    case BAD_NO_USES:
        b->uses = 0;
        snprintf(c->bad_what, sizeof(c->bad_what), "uses = 0");
        break;
    case BAD_USES:
        b->uses |= 1u << 4;
        snprintf(c->bad_what, sizeof(c->bad_what), "uses %#x (an unknown use)", b->uses);
        break;
    case BAD_NO_MIN: /* a format with a min, no m */
        b->format.has_min = 1;
        b->m = NULL;
        snprintf(c->bad_what, sizeof(c->bad_what), "%s without m", pk_name(b->format, fn, sizeof(fn)));
        break;
    case BAD_NO_CODES:
        b->codes = NULL;
        snprintf(c->bad_what, sizeof(c->bad_what), "codes = NULL");
        break;
    default: /* a descriptor too short to hold its arrays */
        b->size = (uint32_t)offsetof(struct dray_weight_desc, codes);
        snprintf(c->bad_what, sizeof(c->bad_what), "size %u (too small to hold codes, d, m)", b->size);
        break;
    }
    return refusal_shape(c);
}

enum { BADK_SUB, BADK_K, BADK_NO_SUB, BADK_SIZE, BADK_SCALE, BADK_SHAPE, BADK_UNDECLARED, BADK_KINDS };

/* A 4- or 5-bit two-level descriptor (a format of have45) whose sub-scales
 * are all valid but one, 64..255: six bits hold 0..63. */
static void bad_sub_scale(struct conf_rng *r, struct conf_case *c, uint32_t have45)
{
    struct dray_weight_desc *b = &c->bad;
    char fn[24];
    b->format = dray_util_wformat_of_bit(pick_bit(r, have45));
    b->m = c->bm;
    b->sub = c->bsub;
    size_t i = conf_range(r, 0, b->n_out * (b->k / 16) - 1);
    uint8_t v = (uint8_t)(conf_range(r, 0, 1) ? 64 : conf_range(r, 64, 255));
    ((uint8_t *)c->bsub)[i] = v;
    snprintf(c->bad_what, sizeof(c->bad_what), "%s sub-scale %u at byte %zu (6 bits: 0..63)",
             pk_name(b->format, fn, sizeof(fn)), v, i);
}

/* A two-level descriptor in none of the three shapes: 8 bits, 6 bits with a
 * min, or 4 or 5 bits without one. */
static void bad_shape(struct conf_rng *r, struct conf_case *c)
{
    struct dray_weight_desc *b = &c->bad;
    static const struct dray_wformat shapes[4] = {{8, DRAY_WSCALE_F16, 1, 1}, {6, DRAY_WSCALE_F16, 1, 1},
                                                  {4, DRAY_WSCALE_F16, 0, 1}, {5, DRAY_WSCALE_F16, 0, 1}};
    b->format = shapes[conf_range(r, 0, 3)];
    b->m = b->format.has_min ? c->bm : NULL;
    b->sub = c->bsub;
    snprintf(c->bad_what, sizeof(c->bad_what), "two-level bits %u has_min %u (not Q4_K, Q5_K or Q6_K's shape)",
             b->format.bits, b->format.has_min);
}

/* One bad two-level descriptor, then a good case on a declared two-level
 * format. A bad sub-scale (where a 4- or 5-bit one is declared for the
 * follow-up's uses) and k not a multiple of 256 come twice as often, and are
 * bad data in a declared format: exactly DRAY_EINVAL, never DRAY_ENOTSUP. */
int conf_make_weight_refusal_k(struct conf_rng *r, struct conf_case *c, int bench)
{
    uint32_t mm = c->caps_matmul & DRAY_UTIL_WF_K, em = c->caps_embed & DRAY_UTIL_WF_K;
    if (bench || !(mm | em))
        return DRAY_ENOTSUP;
    int rc = refusal_follow_up(r, c, mm, em);
    if (rc)
        return rc;
    struct dray_weight_desc *b = &c->bad;
    const uint32_t uses[3] = {DRAY_WUSE_MATMUL, DRAY_WUSE_EMBED, DRAY_WUSE_MATMUL | DRAY_WUSE_EMBED};
    const uint32_t have[3] = {mm, em, mm & em};
    const uint32_t mine = b->uses == DRAY_WUSE_MATMUL ? have[0] : b->uses == DRAY_WUSE_EMBED ? have[1] : have[2];
    const uint32_t have45 = mine & (DRAY_UTIL_WFK(4) | DRAY_UTIL_WFK(5));
    uint32_t open_uses = 0;
    for (int i = 0; i < 3; i++)
        open_uses |= (have[i] != DRAY_UTIL_WF_K) << i;
    uint32_t kind = conf_range(r, 0, BADK_KINDS + 1) % BADK_KINDS; /* BADK_SUB, BADK_K twice */
    if (kind == BADK_SUB && !have45)
        kind = BADK_K;
    if (kind == BADK_UNDECLARED && !open_uses)
        kind = BADK_NO_SUB;
    char fn[24];
    c->bad_rc = DRAY_EINVAL;
    c->bad_exact = kind == BADK_SUB || kind == BADK_K;
    switch (kind) {
    case BADK_SUB:
        bad_sub_scale(r, c, have45);
        break;
    case BADK_K:
        b->k += 32;
        snprintf(c->bad_what, sizeof(c->bad_what), "%s with k = %u (not a multiple of 256)",
                 pk_name(b->format, fn, sizeof(fn)), b->k);
        break;
    case BADK_NO_SUB:
        b->sub = NULL;
        snprintf(c->bad_what, sizeof(c->bad_what), "%s without sub", pk_name(b->format, fn, sizeof(fn)));
        break;
    case BADK_SIZE: /* a version-3 descriptor: it ends before sub */
        b->size = (uint32_t)offsetof(struct dray_weight_desc, sub);
        snprintf(c->bad_what, sizeof(c->bad_what), "%s in a descriptor of size %u (too small to hold sub)",
                 pk_name(b->format, fn, sizeof(fn)), b->size);
        break;
    case BADK_SCALE:
        b->format.scale = DRAY_WSCALE_F32;
        snprintf(c->bad_what, sizeof(c->bad_what), "%s with f32 scales (two levels are f16)",
                 pk_name(b->format, fn, sizeof(fn)));
        break;
    case BADK_SHAPE:
        bad_shape(r, c);
        break;
    default: { /* BADK_UNDECLARED */
        uint32_t u = pick_bit(r, open_uses);
        b->uses = uses[u];
        b->format = dray_util_wformat_of_bit(pick_bit(r, DRAY_UTIL_WF_K & ~have[u]));
        b->m = b->format.has_min ? c->bm : NULL;
        b->sub = c->bsub;
        c->bad_rc = DRAY_ENOTSUP;
        snprintf(c->bad_what, sizeof(c->bad_what), "undeclared format %s for %s",
                 pk_name(b->format, fn, sizeof(fn)), u == 0 ? "matmul" : u == 1 ? "embed" : "matmul+embed");
        break;
    }
    }
    return refusal_shape(c);
}

/* ------------------------------------------------------------ rope */

/* Params of rope: the arguments, and where the v4 frequency factors are among
 * the case's arrays (-1: none, a NULL buffer). */
struct rope_p {
    struct dray_rope_args a;
    int ff_idx;
};

static int launch_rope(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                       struct dray_packed *w, const void *params)
{
    (void)w;
    const struct rope_p *p = params;
    struct dray_rope_args a = p->a;
    a.x = v[0];
    a.pos = v[1];
    if (p->ff_idx >= 0)
        a.freq_factors = v[p->ff_idx];
    return ops->rope(ctx, &a);
}

/* Version 4's additions on top of a rope case: attn_factor (YaRN's mscale
 * around 1.1-1.4, sometimes 0 = 1) and, most of the time, per-pair frequency
 * factors shaped like Llama 3's rope_freqs (1 for the fast pairs, up to 8 for
 * the slow ones, a blend between) or LongRoPE's (a smooth ramp of 1..~40). */
static int add_rope_v4(struct conf_rng *r, struct conf_case *c, struct rope_p *p, int bench)
{
    struct dray_rope_args *a = &p->a;
    uint32_t half = a->n_rot / 2, kind = bench ? 1 : conf_range(r, 0, 3);
    a->attn_factor = kind == 0 ? 0.0f : conf_randf(r, 0.9f, 1.45f);
    c->scale_ref = a->attn_factor > 1.0f ? a->attn_factor : 1.0; /* abs 1e-4 * max(1, mscale) */
    p->ff_idx = -1;
    if (kind == 3 || half == 0)
        return 0;
    p->ff_idx = c->n;
    float *ff = conf_arr_add(c, half * 4, 0);
    OOM_IF(ff);
    for (uint32_t i = 0; i < half; i++) {
        float t = half > 1 ? (float)i / (float)(half - 1) : 0.0f;
        ff[i] = kind == 2 ? 1.0f + 39.0f * t * t
                          : t < 0.3f ? 1.0f : t > 0.7f ? 8.0f : 1.0f + 7.0f * (t - 0.3f) / 0.4f;
    }
    return 0;
}

static int make_rope(struct conf_rng *r, struct conf_case *c, int bench, int v4)
{
    struct rope_p p;
    memset(&p, 0, sizeof(p));
    p.ff_idx = -1;
    struct dray_rope_args *ap = &p.a, a = {0};
    a.n_tok = bench ? 64 : conf_range(r, 1, 20);
    a.n_head = bench ? 4 : conf_range(r, 1, 8);
    a.head_dim = bench ? 256 : 2 * conf_range(r, 1, 128);
    a.n_rot = bench || conf_range(r, 0, v4 ? 1 : 2) ? a.head_dim : 2 * conf_range(r, 1, a.head_dim / 2);
    a.stride = a.n_head * a.head_dim + (bench ? 0 : conf_range(r, 0, 3));
    a.base = conf_range(r, 0, 1) ? 10000.0f : 1000000.0f;
    a.freq_scale = bench || conf_range(r, 0, 2) ? 1.0f : 0.125f;
    size_t nx = (size_t)a.n_tok * a.stride;
    float *x = conf_arr_add(c, nx * 4, 1);
    int32_t *pos = conf_arr_add(c, a.n_tok * 4, 0);
    OOM_IF(x && pos);
    fill_f32(r, x, nx, -1, 1);
    for (uint32_t t = 0; t < a.n_tok; t++) /* the contract holds for |p| < 2^17 */
        pos[t] = (int32_t)(bench ? 1000 + t : conf_range(r, 0, 3) ? conf_range(r, 0, 4095)
                                                                : conf_range(r, 0, (1u << 17) - 1));
    *ap = a;
    if (v4) {
        int rc = add_rope_v4(r, c, &p, bench);
        if (rc)
            return rc;
    }
    int n = snprintf(c->shape, sizeof(c->shape), "n_tok=%u n_head=%u head_dim=%u n_rot=%u base=%g fs=%g",
                     a.n_tok, a.n_head, a.head_dim, a.n_rot, (double)a.base, (double)a.freq_scale);
    if (v4 && n > 0 && (size_t)n < sizeof(c->shape))
        snprintf(c->shape + n, sizeof(c->shape) - (size_t)n, "%s attn_factor=%g",
                 p.ff_idx >= 0 ? " freq_factors" : "", (double)ap->attn_factor);
    c->launch = launch_rope;
    return set_params(c, &p, sizeof(p));
}

int conf_make_rope(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_rope(r, c, bench, 0);
}

/* ABI v4: frequency factors and attn_factor, half the cases with a partial n_rot. */
int conf_make_rope_v4(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_rope(r, c, bench, 1);
}

/* ------------------------------------------------------------ KV pool */

/* Params of kv_store and attention: the launch cannot see the case, so the pool
 * arrays' indices travel with the arguments. */
struct kv_p {
    struct dray_kv_pool pool;
    union {
        struct dray_kv_store_args st;
        struct dray_attention_args at;
    } u;
    int idx[4];
};

/* Pool arrays start at index first: k, v, k_scale, v_scale. For I8 the pool is
 * random codes with random scales; for F16 random halves. out marks whether the
 * op writes them (kv_store) or only reads them (attention). */
static int add_pool(struct conf_rng *r, struct conf_case *c, struct dray_kv_pool *pool, int out,
                    double *max_v)
{
    size_t cells = (size_t)pool->n_slots * pool->n_kv_head * pool->head_dim;
    size_t rows = (size_t)pool->n_slots * pool->n_kv_head;
    int i8 = pool->dtype == DRAY_I8;
    c->idx[0] = c->n;
    void *k = conf_arr_add(c, cells * (i8 ? 1 : 2), out);
    c->idx[1] = c->n;
    void *v = conf_arr_add(c, cells * (i8 ? 1 : 2), out);
    c->idx[2] = c->n;
    float *ks = conf_arr_add(c, rows * 4, out && i8);
    c->idx[3] = c->n;
    float *vs = conf_arr_add(c, rows * 4, out && i8);
    OOM_IF(k && v && ks && vs);
    c->inner = pool->head_dim;
    *max_v = 0;
    if (i8) {
        fill_i8(r, k, cells);
        fill_i8(r, v, cells);
        fill_f32(r, ks, rows, 0.5f / 127, 2.0f / 127);
        fill_f32(r, vs, rows, 0.5f / 127, 2.0f / 127);
        for (size_t i = 0; i < rows; i++) {
            if (!out && conf_range(r, 0, 15) == 0)
                vs[i] = ks[i] = 0.0f; /* an all-zero vector stores scale 0 */
            for (size_t j = 0; j < pool->head_dim; j++) {
                double d = fabs(((int8_t *)v)[i * pool->head_dim + j] * (double)vs[i]);
                *max_v = d > *max_v ? d : *max_v;
            }
        }
    } else {
        for (size_t i = 0; i < cells; i++) {
            ((uint16_t *)k)[i] = rand_f16(r);
            ((uint16_t *)v)[i] = rand_f16(r);
            double d = fabs(dray_util_f16_to_f32(((uint16_t *)v)[i]));
            *max_v = d > *max_v ? d : *max_v;
        }
    }
    return 0;
}

static struct dray_kv_pool pool_views(const struct kv_p *p, const struct dray_view *v)
{
    struct dray_kv_pool pool = p->pool;
    pool.k = v[p->idx[0]];
    pool.v = v[p->idx[1]];
    pool.k_scale = v[p->idx[2]];
    pool.v_scale = v[p->idx[3]];
    return pool;
}

/* ------------------------------------------------------------ kv_store */

static int launch_kv_store(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                           struct dray_packed *w, const void *params)
{
    (void)w;
    const struct kv_p *p = params;
    struct dray_kv_pool pool = pool_views(p, v);
    struct dray_kv_store_args a = p->u.st;
    a.k = v[0];
    a.v = v[1];
    a.slots = v[2];
    a.pool = &pool;
    return ops->kv_store(ctx, &a);
}

static int make_kv_store(struct conf_rng *r, struct conf_case *c, int bench, uint32_t dtype)
{
    struct kv_p p;
    memset(&p, 0, sizeof(p));
    struct dray_kv_pool *pool = &p.pool;
    struct dray_kv_store_args *a = &p.u.st;
    pool->dtype = dtype;
    pool->n_kv_head = bench ? 1 : conf_range(r, 1, 4);
    pool->head_dim = bench ? 256 : rand_dim(r, 256);
    pool->block_size = bench ? 16 : 1u << conf_range(r, 0, 5);
    pool->n_slots = pool->block_size * (bench ? 64 : conf_range(r, 1, 8));
    a->n_tok = bench ? 64 : conf_range(r, 1, pool->n_slots < 40 ? pool->n_slots : 40);
    uint32_t row = pool->n_kv_head * pool->head_dim;
    a->stride_k = row + (bench ? 0 : conf_range(r, 0, 3));
    a->stride_v = row + (bench ? 0 : conf_range(r, 0, 3));
    float *k = conf_arr_add(c, (size_t)a->n_tok * a->stride_k * 4, 0);
    float *v = conf_arr_add(c, (size_t)a->n_tok * a->stride_v * 4, 0);
    int32_t *slots = conf_arr_add(c, a->n_tok * 4, 0);
    OOM_IF(k && v && slots);
    fill_f32(r, k, (size_t)a->n_tok * a->stride_k, -3, 3);
    fill_f32(r, v, (size_t)a->n_tok * a->stride_v, -3, 3);
    for (uint32_t t = 0; !bench && t < a->n_tok; t++)
        if (conf_range(r, 0, 7) == 0) { /* one all-zero head: scale 0 */
            uint32_t h = conf_range(r, 0, pool->n_kv_head - 1);
            memset(k + (size_t)t * a->stride_k + h * pool->head_dim, 0, pool->head_dim * 4);
        }
    /* distinct slots in random order, some -1 (padding, not stored) */
    for (uint32_t t = 0; t < a->n_tok; t++)
        slots[t] = (int32_t)t;
    for (uint32_t t = a->n_tok; !bench && t < pool->n_slots; t++) {
        uint32_t j = conf_range(r, 0, t);
        if (j < a->n_tok)
            slots[j] = (int32_t)t;
    }
    for (uint32_t t = 0; !bench && t < a->n_tok; t++) {
        uint32_t j = conf_range(r, 0, a->n_tok - 1);
        int32_t s = slots[t];
        slots[t] = slots[j];
        slots[j] = s;
        if (conf_range(r, 0, 9) == 0)
            slots[t] = -1;
    }
    double max_v;
    int rc = add_pool(r, c, pool, 1, &max_v);
    if (rc)
        return rc;
    memcpy(p.idx, c->idx, sizeof(p.idx));
    snprintf(c->shape, sizeof(c->shape), "n_tok=%u kv_heads=%u head_dim=%u block=%u slots=%u",
             a->n_tok, pool->n_kv_head, pool->head_dim, pool->block_size, pool->n_slots);
    c->launch = launch_kv_store;
    return set_params(c, &p, sizeof(p));
}

int conf_make_kv_store_i8(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_kv_store(r, c, bench, DRAY_I8);
}

int conf_make_kv_store_f16(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_kv_store(r, c, bench, DRAY_F16);
}

/* ------------------------------------------------------------ attention */

static int launch_attention(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                            struct dray_packed *w, const void *params)
{
    (void)w;
    const struct kv_p *p = params;
    struct dray_kv_pool pool = pool_views(p, v);
    struct dray_attention_args a = p->u.at;
    a.q = v[0];
    a.out = v[1];
    a.seqs = v[2];
    a.block_table = v[3];
    a.pool = &pool;
    return ops->attention(ctx, &a);
}

#define ATT_MAX_SEQ 6

/* Sequences: decode (one query), fresh prefill (kv_len = n_q) and prefill chunks
 * with history, in one batch. Blocks are shuffled over the pool, a sliding
 * window leaves holes (-1) in the block table, and gaps separate the tables. */
static int make_attention(struct conf_rng *r, struct conf_case *c, int bench, uint32_t dtype, int v4)
{
    static const uint32_t dims[] = {16, 24, 64, 80, 128, 256};
    struct kv_p p;
    memset(&p, 0, sizeof(p));
    struct dray_kv_pool *pool = &p.pool;
    struct dray_attention_args *a = &p.u.at;
    uint32_t n_q[ATT_MAX_SEQ], kv_len[ATT_MAX_SEQ];
    pool->dtype = dtype;
    pool->n_kv_head = bench ? 1 : conf_range(r, 1, 4);
    a->n_head = pool->n_kv_head * (bench ? 4 : 1u << conf_range(r, 0, 2));
    pool->head_dim = bench ? 256 : conf_range(r, 0, 3) ? dims[conf_range(r, 0, 5)] : 2 * conf_range(r, 1, 64);
    pool->block_size = bench ? 16 : 4u << conf_range(r, 0, 3);
    a->window = bench || conf_range(r, 0, 1) ? 0 : conf_range(r, 1, 100);
    a->n_seq = bench ? 5 : conf_range(r, 1, 5);
    a->n_tok = a->max_kv_len = 0;
    uint32_t n_blocks = 0;
    for (uint32_t s = 0; s < a->n_seq; s++) {
        uint32_t kind = bench ? (s < 4 ? 0 : 1) : conf_range(r, 0, 2);
        n_q[s] = kind == 0 ? 1 : bench ? 64 : conf_range(r, 1, 40);
        kv_len[s] = kind == 0 ? (bench ? 1024 : conf_range(r, 1, 300))
                    : kind == 1 ? n_q[s] : n_q[s] + conf_range(r, 1, 200);
        a->n_tok += n_q[s];
        a->max_kv_len = kv_len[s] > a->max_kv_len ? kv_len[s] : a->max_kv_len;
        n_blocks += (kv_len[s] + pool->block_size - 1) / pool->block_size;
    }
    n_blocks += bench ? 0 : conf_range(r, 0, 3); /* blocks nobody uses: garbage */
    pool->n_slots = n_blocks * pool->block_size;
    uint32_t row = a->n_head * pool->head_dim;
    a->stride_q = row + (bench ? 0 : conf_range(r, 0, 3));
    a->stride_out = row + (bench ? 0 : conf_range(r, 0, 3));
    a->scale = bench || conf_range(r, 0, 3) ? 1.0f / sqrtf((float)pool->head_dim) : conf_randf(r, 0.02f, 0.5f);
    /* v4 soft-capping: Gemma 2's 50 when timed; random caps near the scores'
     * size (queries 4x louder) so the tanh bends most of them */
    float q_amp = 1.0f;
    if (v4) {
        a->softcap = bench ? 50.0f : conf_randf(r, 0.5f, 4.0f);
        q_amp = bench ? 1.0f : 4.0f;
    }

    float *q = conf_arr_add(c, (size_t)a->n_tok * a->stride_q * 4, 0);
    float *out = conf_arr_add(c, (size_t)a->n_tok * a->stride_out * 4, 1);
    int32_t *seqs = conf_arr_add(c, a->n_seq * 16, 0);
    int32_t *bt = conf_arr_add(c, (n_blocks + 3 * a->n_seq) * 4, 0);
    uint32_t *perm = calloc(n_blocks ? n_blocks : 1, sizeof(*perm));
    if (!q || !out || !seqs || !bt || !perm) {
        free(perm);
        return DRAY_ENOMEM;
    }
    fill_f32(r, q, (size_t)a->n_tok * a->stride_q, -q_amp, q_amp);
    fill_f32(r, out, (size_t)a->n_tok * a->stride_out, -1, 1);
    for (uint32_t b = 0; b < n_blocks; b++)
        perm[b] = b;
    for (uint32_t b = n_blocks; !bench && b > 1; b--) {
        uint32_t j = conf_range(r, 0, b - 1), t = perm[b - 1];
        perm[b - 1] = perm[j];
        perm[j] = t;
    }
    uint32_t next_block = 0, bt_pos = 0, q_start = 0, holes = 0;
    for (uint32_t s = 0; s < a->n_seq; s++) {
        uint32_t gap = bench ? 0 : conf_range(r, 0, 2);
        for (uint32_t g = 0; g < gap; g++)
            bt[bt_pos++] = -1;
        uint32_t nb = (kv_len[s] + pool->block_size - 1) / pool->block_size;
        /* first position any query of this sequence can see */
        uint32_t lo = kv_len[s] - n_q[s];
        uint32_t first = a->window && lo + 1 > a->window ? lo + 1 - a->window : 0;
        int32_t *e = &seqs[4 * s];
        e[0] = (int32_t)q_start;
        e[1] = (int32_t)n_q[s];
        e[2] = (int32_t)kv_len[s];
        e[3] = (int32_t)bt_pos;
        for (uint32_t b = 0; b < nb; b++) {
            int unreachable = (b + 1) * pool->block_size <= first;
            holes += unreachable;
            bt[bt_pos++] = unreachable ? -1 : (int32_t)perm[next_block];
            next_block++;
        }
        q_start += n_q[s];
    }
    free(perm);
    double max_v;
    int rc = add_pool(r, c, pool, 0, &max_v);
    if (rc)
        return rc;
    memcpy(p.idx, c->idx, sizeof(p.idx));
    c->scale_ref = max_v > 0 ? max_v : 1.0;
    size_t used = 0;
    used += (size_t)snprintf(c->shape, sizeof(c->shape),
                             "heads=%u/%u head_dim=%u block=%u window=%u holes=%u %sseqs(q/kv)=",
                             a->n_head, pool->n_kv_head, pool->head_dim, pool->block_size,
                             a->window, holes, v4 ? "softcap " : "");
    for (uint32_t s = 0; s < a->n_seq && used < sizeof(c->shape); s++)
        used += (size_t)snprintf(c->shape + used, sizeof(c->shape) - used, "%s%u/%u", s ? "," : "",
                                 n_q[s], kv_len[s]);
    c->launch = launch_attention;
    return set_params(c, &p, sizeof(p));
}

int conf_make_attention_i8(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_attention(r, c, bench, DRAY_I8, 0);
}

int conf_make_attention_f16(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_attention(r, c, bench, DRAY_F16, 0);
}

/* ABI v4: the same batches (prefill and decode, windows, GQA) with a softcap. */
int conf_make_attention_softcap_i8(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_attention(r, c, bench, DRAY_I8, 1);
}

int conf_make_attention_softcap_f16(struct conf_rng *r, struct conf_case *c, int bench)
{
    return make_attention(r, c, bench, DRAY_F16, 1);
}

/* ------------------------------------------------------------ gated_act */

struct gated_p {
    struct dray_gated_act_args a;
    int out_idx; /* 0 = out aliases gate, 1 = aliases up, 2 = separate */
};

static int launch_gated(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                        struct dray_packed *w, const void *params)
{
    (void)w;
    const struct gated_p *p = params;
    struct dray_gated_act_args a = p->a;
    a.gate = v[0];
    a.up = v[1];
    a.out = v[p->out_idx];
    return ops->gated_act(ctx, &a);
}

int conf_make_gated_act(struct conf_rng *r, struct conf_case *c, int bench)
{
    struct gated_p p;
    memset(&p, 0, sizeof(p));
    struct dray_gated_act_args *a = &p.a;
    a->n_tok = bench ? 64 : conf_range(r, 1, 20);
    a->n = bench ? 6912 : rand_dim(r, 2000);
    a->act = bench ? DRAY_ACT_GELU_TANH : conf_range(r, 0, 1);
    p.out_idx = bench ? 2 : (int)conf_range(r, 0, 2);
    a->stride_gate = a->n + (bench ? 0 : conf_range(r, 0, 3));
    a->stride_up = p.out_idx == 0 ? a->stride_gate : a->n + (bench ? 0 : conf_range(r, 0, 3));
    a->stride_out = p.out_idx == 0 ? a->stride_gate : p.out_idx == 1 ? a->stride_up
                                                                     : a->n + (bench ? 0 : conf_range(r, 0, 3));
    size_t ng = (size_t)a->n_tok * a->stride_gate, nu = (size_t)a->n_tok * a->stride_up;
    float *g = conf_arr_add(c, ng * 4, p.out_idx == 0);
    float *u = conf_arr_add(c, nu * 4, p.out_idx == 1);
    OOM_IF(g && u);
    fill_f32(r, g, ng, -8, 8);
    fill_f32(r, u, nu, -2, 2);
    if (p.out_idx == 2) {
        size_t no = (size_t)a->n_tok * a->stride_out;
        float *o = conf_arr_add(c, no * 4, 1);
        OOM_IF(o);
        fill_f32(r, o, no, -1, 1);
    }
    snprintf(c->shape, sizeof(c->shape), "n_tok=%u n=%u act=%s out=%s", a->n_tok, a->n,
             a->act == DRAY_ACT_SILU ? "silu" : "gelu_tanh",
             p.out_idx == 0 ? "gate" : p.out_idx == 1 ? "up" : "separate");
    c->launch = launch_gated;
    return set_params(c, &p, sizeof(p));
}

/* ------------------------------------------------------------ add */

struct add_p {
    struct dray_add_args a;
    int out_idx; /* 0 = aliases a, 1 = aliases b, 2 = separate */
};

static int launch_add(const struct dray_ops *ops, struct dray_ctx *ctx, const struct dray_view *v,
                      struct dray_packed *w, const void *params)
{
    (void)w;
    const struct add_p *p = params;
    struct dray_add_args a = p->a;
    a.a = v[0];
    a.b = v[1];
    a.out = v[p->out_idx];
    return ops->add(ctx, &a);
}

int conf_make_add(struct conf_rng *r, struct conf_case *c, int bench)
{
    struct add_p p;
    memset(&p, 0, sizeof(p));
    p.a.n = bench ? 64 * 1152 : rand_dim(r, 5000);
    p.out_idx = bench ? 2 : (int)conf_range(r, 0, 2);
    float *x = conf_arr_add(c, p.a.n * 4, p.out_idx == 0);
    float *y = conf_arr_add(c, p.a.n * 4, p.out_idx == 1);
    OOM_IF(x && y);
    fill_f32(r, x, p.a.n, -10, 10);
    fill_f32(r, y, p.a.n, -10, 10);
    if (p.out_idx == 2) {
        float *o = conf_arr_add(c, p.a.n * 4, 1);
        OOM_IF(o);
        fill_f32(r, o, p.a.n, -1, 1);
    }
    snprintf(c->shape, sizeof(c->shape), "n=%llu out=%s", (unsigned long long)p.a.n,
             p.out_idx == 0 ? "a" : p.out_idx == 1 ? "b" : "separate");
    c->launch = launch_add;
    return set_params(c, &p, sizeof(p));
}

/* ------------------------------------------------------------ comparison */

static void note(struct conf_metrics *m, double ref, double sub, int bad, size_t i)
{
    double d = fabs(sub - ref);
    if (isnan(sub) != isnan(ref))
        d = INFINITY;
    m->max_abs = d > m->max_abs ? d : m->max_abs;
    if (ref != 0 && d / fabs(ref) > m->max_rel)
        m->max_rel = d / fabs(ref);
    m->err2 += isfinite(d) ? d * d : 0;
    m->ref2 += ref * ref;
    if (bad && !m->n_bad++)
        m->first_bad = i;
    m->n++;
}

void conf_compare_f32(const float *ref, const float *sub, size_t n, const float *elem_tol,
                      double elem_scale, double abs_tol, double rel_tol, struct conf_metrics *m)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)sub[i] - (double)ref[i]);
        double lim = abs_tol + rel_tol * fabs((double)ref[i]) + (elem_tol ? elem_scale * elem_tol[i] : 0.0);
        int bad = !(d <= lim) || isnan(sub[i]) != isnan(ref[i]); /* NaN compares false */
        if (isnan(sub[i]) && isnan(ref[i]))
            bad = 0;
        note(m, ref[i], sub[i], bad, i);
    }
}

int conf_check_f32(const struct conf_case *c, const struct conf_tol *tol, struct conf_metrics *m,
                   char *why, size_t whylen)
{
    double scale = c->scale_ref > 0 ? c->scale_ref : 1.0;
    if (c->scale_ref < 0) { /* relative to the largest reference output */
        scale = 0;
        for (int i = 0; i < c->n; i++)
            for (size_t j = 0; c->a[i].out && j < c->a[i].nbytes / 4; j++) {
                double v = fabs(((const float *)c->a[i].got[0])[j]);
                scale = v > scale ? v : scale;
            }
    }
    for (int i = 0; i < c->n; i++) {
        if (!c->a[i].out)
            continue;
        const float *ref = c->a[i].got[0], *sub = c->a[i].got[1];
        size_t before = m->n_bad, base = m->n;
        conf_compare_f32(ref, sub, c->a[i].nbytes / 4, c->elem_tol, tol->elem, tol->abs * scale,
                         tol->rel, m);
        if (m->n_bad > before && before == 0) {
            size_t k = m->first_bad;
            double lim = tol->abs * scale + tol->rel * fabs(ref[k]) +
                         (c->elem_tol ? tol->elem * c->elem_tol[k] : 0.0);
            snprintf(why, whylen, "output %d element %zu: reference %.9g, got %.9g (allowed %.3g)", i,
                     k, (double)ref[k], (double)sub[k], lim);
            m->first_bad = base + k;
        }
    }
    return m->n_bad ? 1 : 0;
}

/* int8 codes: equal, or off by one (a rounding tie) in at most tol->abs of them;
 * scales within tol->rel. Metrics on the dequantized values. */
int conf_check_kv_i8(const struct conf_case *c, const struct conf_tol *tol, struct conf_metrics *m,
                     char *why, size_t whylen)
{
    size_t off_by_one = 0, total = 0;
    why[0] = '\0';
    for (int kv = 0; kv < 2; kv++) {
        const struct conf_arr *q = &c->a[c->idx[kv]], *s = &c->a[c->idx[kv + 2]];
        const int8_t *qr = q->got[0], *qs = q->got[1];
        const float *sr = s->got[0], *ss = s->got[1];
        for (size_t i = 0; i < q->nbytes; i++) {
            size_t row = i / c->inner;
            int dq = abs((int)qs[i] - (int)qr[i]);
            double ds = fabs((double)ss[row] - (double)sr[row]);
            int bad = dq > 1 || !(ds <= tol->rel * fabs((double)sr[row]));
            off_by_one += dq == 1;
            total++;
            if (bad && !m->n_bad && !why[0])
                snprintf(why, whylen, "%s code %zu: reference %d (scale %.9g), got %d (scale %.9g)",
                         kv ? "v" : "k", i, qr[i], (double)sr[row], qs[i], (double)ss[row]);
            note(m, qr[i] * (double)sr[row], qs[i] * (double)ss[row], bad, i);
        }
    }
    if (!m->n_bad && (double)off_by_one > tol->abs * (double)total) {
        snprintf(why, whylen, "%zu of %zu codes off by one: more than the %g allowed for ties",
                 off_by_one, total, tol->abs);
        m->n_bad = off_by_one;
    }
    return m->n_bad ? 1 : 0;
}

/* f16 pool: bit-exact (round to nearest even is exact). */
int conf_check_kv_f16(const struct conf_case *c, const struct conf_tol *tol, struct conf_metrics *m,
                      char *why, size_t whylen)
{
    (void)tol;
    for (int kv = 0; kv < 2; kv++) {
        const struct conf_arr *a = &c->a[c->idx[kv]];
        const uint16_t *r = a->got[0], *s = a->got[1];
        for (size_t i = 0; i < a->nbytes / 2; i++) {
            int bad = r[i] != s[i];
            if (bad && !m->n_bad)
                snprintf(why, whylen, "%s element %zu: reference 0x%04x, got 0x%04x", kv ? "v" : "k",
                         i, r[i], s[i]);
            note(m, dray_util_f16_to_f32(r[i]), dray_util_f16_to_f32(s[i]), bad, i);
        }
    }
    return m->n_bad ? 1 : 0;
}
