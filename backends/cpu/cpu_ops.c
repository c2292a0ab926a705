/* The ops except attention: check every argument against the contract in
 * backend.h (views are bounds-checked against their buffers), resolve views to
 * pointers, then split the work over the pool. */
#include <math.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_layout.h"

/* ---------------------------------------------------------------- embed */

struct embed_job {
    struct dray_ctx *ctx;
    struct dray_cpu_embed k;
};

static void embed_body(void *arg, uint32_t i0, uint32_t i1, uint32_t ith)
{
    (void)ith;
    struct embed_job *j = arg;
    j->ctx->k.embed(&j->k, i0, i1);
}

int dray_cpu_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "embed: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    const struct dray_packed *pk = a->dtype == DRAY_PACKED ? a->packed : NULL;
    if (a->dtype == DRAY_PACKED) /* views ids, out; the table is the handle's */
        CHECK(dray_cpu_args(ctx, dray_util_check_embed_packed(a, pk ? pk->n_out : 0, pk ? pk->k : 0,
                                                              pk && (pk->uses & DRAY_WUSE_EMBED), &nd,
                                                              ctx->err, sizeof(ctx->err)), &nd, p));
    else
        CHECK(dray_cpu_args(ctx, dray_util_check_embed(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    int i8 = a->dtype == DRAY_I8;
    const int32_t *id = p[0];
    void *table = pk ? pk->w : p[1], *rs = pk ? pk->scale : p[2], *out = pk ? p[1] : p[3];
    CHECK(dray_util_check_ids(id, a->n_tok, a->n_rows, ctx->err, sizeof(ctx->err)));
    struct embed_job j = {ctx, {id, table, rs, out, (uint32_t)i8, a->dim, a->scale, pk ? pk->layout : 0}};
    dray_cpu_parallel(ctx, a->n_tok, 1, (double)a->n_tok * a->dim, embed_body, &j);
    return 0;
}

/* ---------------------------------------------------------------- rmsnorm */

struct rmsnorm_job {
    struct dray_ctx *ctx;
    struct dray_cpu_rmsnorm k;
};

static void rmsnorm_body(void *arg, uint32_t i0, uint32_t i1, uint32_t ith)
{
    (void)ith;
    struct rmsnorm_job *j = arg;
    j->ctx->k.rmsnorm(&j->k, i0, i1);
}

int dray_cpu_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "rmsnorm: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    CHECK(dray_cpu_args(ctx, dray_util_check_rmsnorm(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    /* the slices count rows of all heads in 32 bits */
    if ((uint64_t)a->n_tok * a->n_head > UINT32_MAX)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "rmsnorm: n_tok*n_head too large");
    void *x = p[0], *w = p[1], *out = p[2];
    struct rmsnorm_job j = {ctx, {x, w, out, a->n_head, a->n, a->stride_x, a->stride_out, a->eps}};
    uint32_t rows = a->n_tok * a->n_head;
    dray_cpu_parallel(ctx, rows, 1, (double)rows * a->n, rmsnorm_body, &j);
    return 0;
}

/* ---------------------------------------------------------------- matmul */

#define MM_MAX_GUIDED 128u /* guided row tiles of a job at most */

struct matmul_job {
    struct dray_ctx *ctx;
    struct dray_cpu_matmul k;
    /* The output split into tiles of row_blk rows x tok_blk tokens, handed out
     * one at a time (tokens outer, so consecutive tiles share activations): a
     * thread the VM descheduled for a while just takes fewer of them. When the
     * tokens are not cut, row tiles shrink instead (guided): tile i is rows
     * row0[i] .. row0[i+1], so the threads finish within 16 rows of each other. */
    uint32_t row_blk, tok_blk, n_rt, n_tile;
    uint32_t row0[MM_MAX_GUIDED + 1]; /* n_tile + 1 entries when guided, else unused */
    bool guided;
    atomic_uint next;
};

static void quantize_body(void *arg, uint32_t i0, uint32_t i1, uint32_t ith)
{
    (void)ith;
    struct matmul_job *j = arg;
    if (j->k.wdtype) {
        j->ctx->k.gquantize(&j->k, i0, i1);
        dray_cpu_glo_fill(&j->k, (size_t)i0 << j->k.pairs, (size_t)i1 << j->k.pairs);
    } else
        j->ctx->k.quantize(&j->k, i0, i1);
}

/* Output channels [o0, o1) of every token of a, through the kernel pair of its dtype. */
static void matmul_rows(struct dray_ctx *ctx, const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    if (a->wdtype)
        ctx->k.gmatmul(a, o0, o1);
    else
        ctx->k.matmul(a, o0, o1);
}

/* Tile i of the job: the kernel sees only its tokens (pointers moved to the
 * first one), so the split cannot change any result: integer sums are exact
 * whatever microkernel a token lands in, and f32 rows keep their grouping
 * (row_blk is a multiple of 16). */
static void matmul_tile(struct matmul_job *j, uint32_t i)
{
    const struct dray_cpu_matmul *a = &j->k;
    uint32_t o0 = (i % j->n_rt) * j->row_blk, t0 = (i / j->n_rt) * j->tok_blk;
    uint32_t o1 = o0 + j->row_blk < a->n_out ? o0 + j->row_blk : a->n_out;
    if (j->guided)
        o0 = j->row0[i], o1 = j->row0[i + 1], t0 = 0;
    uint32_t t1 = t0 + j->tok_blk < a->n_tok ? t0 + j->tok_blk : a->n_tok;
    struct dray_cpu_matmul sub = *a;
    sub.n_tok = t1 - t0;
    sub.x = a->x + (size_t)(t0 >> a->pairs) * a->stride_x;
    sub.out = a->out + (size_t)(t0 >> a->pairs) * a->stride_out; /* t0 even with pairs */
    if (a->is_i8) {
        sub.q = a->q + (size_t)t0 * a->q_stride;
        sub.sx = a->sx + t0;
        if (a->xo)
            sub.xo = a->xo + (size_t)t0 * a->xo_stride;
        if (a->qt) /* t0 is a multiple of 16: a whole packed group */
            sub.qt = a->qt + (size_t)t0 * a->q_stride;
    }
    if (a->wdtype) {
        sub.q = a->q + (size_t)t0 * a->q_stride;
        sub.gsx = a->gsx + (size_t)t0 * (a->k / 32);
        sub.gsum = a->gsum + (size_t)t0 * (a->k / 32);
        sub.gmin = a->gmin + (size_t)t0 * (a->k / 32);
        if (a->glo)
            sub.glo = a->glo + (size_t)t0 * (a->k / 32);
    }
    matmul_rows(j->ctx, &sub, o0, o1);
}

static void matmul_task(void *arg, uint32_t ith, uint32_t nth)
{
    (void)ith, (void)nth;
    struct matmul_job *j = arg;
    for (uint32_t i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_tile;)
        matmul_tile(j, i);
}

/* Tiles: rows in multiples of 16 (the kernels' row blocks stay whole), about 8
 * per thread; when that leaves too few (few rows, many tokens: the K/V
 * projections in prefill) the tokens are cut too, in multiples of 48 (whole
 * 8-, 6-, 4- and 3-token microkernel groups, and AMX's 16-token tile groups). */
static void matmul_split(struct matmul_job *j, uint32_t nth)
{
    const struct dray_cpu_matmul *a = &j->k;
    uint32_t want = 8 * nth;
    uint32_t rb = (a->n_out + want - 1) / want;
    j->row_blk = rb < 16 ? 16 : (rb + 15) & ~15u;
    j->n_rt = (a->n_out + j->row_blk - 1) / j->row_blk;
    j->tok_blk = a->n_tok;
    if (j->n_rt < want && a->n_tok >= 48) {
        uint32_t per = want / j->n_rt + 1;           /* token tiles wanted */
        uint32_t tb = (a->n_tok + per - 1) / per;
        tb = (tb + 47) / 48 * 48;
        j->tok_blk = tb < a->n_tok ? tb : a->n_tok;
    }
    j->n_tile = j->n_rt * ((a->n_tok + j->tok_blk - 1) / j->tok_blk);
    j->guided = j->tok_blk == a->n_tok && j->n_rt > 1;
    if (!j->guided)
        return;
    /* each tile a (2 nth)-th of the rows left, in 16s: the last ones are 16 */
    uint32_t n = 0, o = 0;
    for (; o < a->n_out && n < MM_MAX_GUIDED - 1; n++) {
        uint32_t take = ((a->n_out - o + 2 * nth - 1) / (2 * nth) + 15) & ~15u;
        j->row0[n] = o;
        o = take < a->n_out - o ? o + take : a->n_out;
    }
    if (o < a->n_out) /* the table is full: the rest in one tile */
        j->row0[n++] = o;
    j->row0[n] = a->n_out;
    j->n_tile = n;
}

/* Outlier channels (I8 only; ix and ow are the checked views). */
static int matmul_outliers(struct dray_ctx *ctx, const struct dray_matmul_args *a, struct dray_cpu_matmul *k,
                           const int32_t *ix, const float *ow)
{
    if (!k->is_i8 || a->n_outlier == 0)
        return 0;
    CHECK(dray_util_check_outliers(ix, a->n_outlier, a->k, ctx->err, sizeof(ctx->err)));
    k->outlier_idx = ix;
    k->outlier_w = ow;
    k->n_outlier = a->n_outlier;
    return 0;
}

/* Grouped weights: scratch for q, the group scales and sums, then the quantize
 * step over the tokens. Two-pass activations quantize two rows per token, and
 * the matmul step then runs over rows (n_tok doubled). */
static int grouped_scratch(struct dray_ctx *ctx, struct matmul_job *j)
{
    struct dray_cpu_matmul *k = &j->k;
    size_t G = k->k / 32, up = 63, rows = (size_t)k->n_tok << k->pairs;
    k->q_stride = ((size_t)k->k + up) & ~up;
    size_t qb = k->q_stride * rows, gb = (G * 4 * rows + up) & ~up;
    char *s = dray_cpu_scratch(ctx, qb + 4 * gb + 64);
    if (!s)
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "matmul: no memory for %zu bytes of activations", qb);
    k->q = (int8_t *)s;
    k->gsx = (float *)(s + qb);
    k->gsum = (int32_t *)(s + qb + gb);
    k->gmin = (float *)(s + qb + 2 * gb);
    k->glo = k->wdtype == DRAY_CPU_K6 ? (int32_t *)(s + qb + 3 * gb) : NULL;
    dray_cpu_parallel(ctx, k->n_tok, 1, (double)rows * k->k, quantize_body, j);
    k->n_tok = (uint32_t)rows;
    return 0;
}

/* ---------------------------------------------------- the next weights */

/* A decode step runs the same matmuls in the same order every time, and
 * between two of them the caller's thread runs the small ops alone while the
 * workers wait: memory idles until the next matmul reads its weights from it.
 * So each packed matmul notes which one came after it, and an idle worker
 * fetches the start of what came next last time into its cache
 * (docs/performance.md, "The next weights fetched while a worker waits"). */
#define AHEAD_BYTES (192u << 10) /* of the next weights at most */

static struct dray_cpu_next *next_slot(struct dray_ctx *ctx, const void *key)
{
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
    return &ctx->next[(h >> 40) % DRAY_CPU_NEXT_SLOTS];
}

/* pk follows the last packed matmul; what followed pk last time goes ahead. */
static void note_weights(struct dray_ctx *ctx, const struct dray_packed *pk)
{
    if (ctx->last_w)
        *next_slot(ctx, ctx->last_w) = (struct dray_cpu_next){ctx->last_w, pk->w, pk->scale, pk->wbytes, pk->sbytes};
    ctx->last_w = pk->w;
    const struct dray_cpu_next *n = next_slot(ctx, pk->w);
    int hit = n->key == pk->w;
    atomic_store_explicit(&ctx->ahead.w, hit ? n->w : NULL, memory_order_relaxed);
    atomic_store_explicit(&ctx->ahead.scale, hit ? n->scale : NULL, memory_order_relaxed);
    atomic_store_explicit(&ctx->ahead.wbytes, hit ? n->wbytes : 0, memory_order_relaxed);
    atomic_store_explicit(&ctx->ahead.sbytes, hit ? n->sbytes : 0, memory_order_relaxed);
}

/* The first AHEAD_BYTES of the next weights and the same share of their
 * scales, into this core's L2, until a new task arrives. */
void dray_cpu_fetch_ahead(void *arg, const struct dray_cpu_pool *pool, unsigned gen)
{
    struct dray_ctx *ctx = arg;
    const char *w = atomic_load_explicit(&ctx->ahead.w, memory_order_relaxed);
    const char *sc = atomic_load_explicit(&ctx->ahead.scale, memory_order_relaxed);
    size_t wb = atomic_load_explicit(&ctx->ahead.wbytes, memory_order_relaxed);
    size_t sb = atomic_load_explicit(&ctx->ahead.sbytes, memory_order_relaxed);
    if (!w || !wb)
        return;
    size_t n = wb < AHEAD_BYTES ? wb : AHEAD_BYTES;
    size_t ns = sc && sb ? (size_t)((double)n * sb / wb) : 0;
    for (size_t off = 0; off < n; off += 64) {
        if ((off & 2047) == 0) {
            if (dray_cpu_pool_gen(pool) != gen)
                return;
            for (size_t so = off * ns / n; so < (off + 2048) * ns / n && so < ns; so += 64)
                __builtin_prefetch(sc + so, 0, 2);
        }
        __builtin_prefetch(w + off, 0, 2);
    }
}

/* The matmul over every row of k->n_out: inline when small, else tiles over the pool. */
static void run_rows(struct dray_ctx *ctx, struct matmul_job *j, double work)
{
    if (ctx->n_threads == 1 || work < 20000.0) {
        matmul_rows(ctx, &j->k, 0, j->k.n_out);
        return;
    }
    matmul_split(j, ctx->n_threads);
    atomic_init(&j->next, 0);
    if (j->n_tile == 1)
        matmul_rows(ctx, &j->k, 0, j->k.n_out);
    else
        dray_cpu_pool_run(ctx->pool, matmul_task, j);
}

int dray_cpu_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "matmul: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    const struct dray_packed *pk = a->wdtype == DRAY_PACKED ? a->packed : NULL;
    if (a->wdtype == DRAY_PACKED) /* views x, out; the weights are the handle's */
        CHECK(dray_cpu_args(ctx, dray_util_check_matmul_packed(a, pk ? pk->n_out : 0, pk ? pk->k : 0,
                                                               pk && (pk->uses & DRAY_WUSE_MATMUL) ? 3u : 0u,
                                                               &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    else
        CHECK(dray_cpu_args(ctx, dray_util_check_matmul(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    if (a->k == 0) /* the kernels' row loops need one column */
        return dray_cpu_fail(ctx, DRAY_EINVAL, "matmul: k = 0 (want 1..65536)");
    int i8 = a->wdtype == DRAY_I8;
    uint32_t pairs = pk && a->passes == 2; /* two-pass activations: two rows per token */
    struct matmul_job j = {.ctx = ctx};
    struct dray_cpu_matmul *k = &j.k;
    *k = (struct dray_cpu_matmul){.x = p[0], .w = pk ? pk->w : p[1], .wscale = pk ? pk->scale : p[2],
                                  .out = pk ? p[1] : p[3], .n_tok = a->n_tok,
                                  .n_out = a->n_out, .k = a->k, .stride_x = a->stride_x,
                                  .stride_out = a->stride_out, .accumulate = a->accumulate != 0,
                                  .is_i8 = (uint32_t)i8, .wdtype = pk ? pk->layout : 0, .pairs = pairs};
    if (!pk)
        CHECK(matmul_outliers(ctx, a, k, p[4], p[5]));
    if (a->n_tok == 0 || a->n_out == 0)
        return 0;
    double work = (double)((size_t)a->n_tok << pairs) * a->n_out * a->k;
    if (i8) {
        k->q_stride = ((size_t)a->k + 63) & ~(size_t)63;
        size_t qbytes = k->q_stride * a->n_tok;
        k->xo_stride = k->n_outlier ? (k->n_outlier + 7u) & ~7u : 0;
        size_t sxbytes = ((size_t)a->n_tok * 4 + 63) & ~(size_t)63;
        size_t xobytes = ((size_t)a->n_tok * k->xo_stride * 4 + 63) & ~(size_t)63;
        /* AMX: the packed copy of whole 16-token groups for the tile B operand */
        int amx = ctx->isa == DRAY_CPU_ISA_AMX && a->n_tok >= 16 && a->k % 64 == 0;
        size_t qtbytes = amx ? k->q_stride * (a->n_tok & ~15u) : 0;
        char *s = dray_cpu_scratch(ctx, qbytes + sxbytes + xobytes + qtbytes + 64);
        if (!s)
            return dray_cpu_fail(ctx, DRAY_ENOMEM, "matmul: no memory for %zu bytes of activations", qbytes);
        k->q = (int8_t *)s;
        k->sx = (float *)(s + ((qbytes + 63) & ~(size_t)63));
        k->xo = k->xo_stride ? (float *)((char *)k->sx + sxbytes) : NULL;
        k->qt = amx ? (int8_t *)((char *)k->sx + sxbytes + xobytes) : NULL;
        dray_cpu_parallel(ctx, a->n_tok, 1, (double)a->n_tok * a->k, quantize_body, &j);
    }
    /* packed rows are stored in whole blocks of 16: a matrix that ends inside
     * one is computed whole into a side buffer, then its rows are kept */
    float *whole = NULL;
    if (pk && pk->rows != a->n_out) {
        whole = malloc((size_t)a->n_tok * pk->rows * sizeof(float));
        if (!whole)
            return dray_cpu_fail(ctx, DRAY_ENOMEM, "matmul: no memory for %u padded rows", pk->rows);
        k->out = whole, k->n_out = k->stride_out = pk->rows, k->accumulate = 0;
    }
    int rc = k->wdtype ? grouped_scratch(ctx, &j) : 0;
    if (pk && ctx->n_threads > 1)
        note_weights(ctx, pk);
    if (!rc)
        run_rows(ctx, &j, work);
    for (uint32_t t = 0; whole && !rc && t < a->n_tok; t++) {
        float *o = (float *)p[1] + (size_t)t * a->stride_out;
        const float *w = whole + (size_t)t * pk->rows;
        for (uint32_t r = 0; r < a->n_out; r++)
            o[r] = a->accumulate ? o[r] + w[r] : w[r];
    }
    free(whole);
    return rc;
}

/* ---------------------------------------------------------------- rope */

struct rope_job {
    struct dray_ctx *ctx;
    struct dray_cpu_rope k;
};

static void rope_body(void *arg, uint32_t i0, uint32_t i1, uint32_t ith)
{
    (void)ith;
    struct rope_job *j = arg;
    j->ctx->k.rope(&j->k, i0, i1);
}

/* Whether table t was made for k's configuration and positions pos: the
 * frequency factors are compared by value (n_rot/2 floats, cheap next to the
 * table), since the host may rewrite a buffer between steps. */
static bool rope_table_fits(const struct dray_cpu_rope_table *t, const struct dray_cpu_rope *k, uint32_t n_tok,
                            const int32_t *pos)
{
    if (!t->cs || t->n_tok != n_tok || t->n_rot != k->n_rot || t->base != k->base ||
        t->freq_scale != k->freq_scale || t->mscale != k->mscale || t->has_ff != (k->ff != NULL))
        return false;
    if (k->ff && memcmp(t->ff, k->ff, (size_t)(k->n_rot / 2) * sizeof(float)))
        return false;
    return !memcmp(t->pos, pos, (size_t)n_tok * sizeof(int32_t));
}

/* Table t grown to hold n_tok positions of k's configuration; false (t
 * emptied) when there is no memory. */
static bool rope_table_grow(struct dray_cpu_rope_table *t, const struct dray_cpu_rope *k, uint32_t n_tok)
{
    size_t floats = (size_t)n_tok * (k->n_rot / 2 * 2) + 1, nff = k->n_rot / 2 + 1;
    if (floats <= t->cap_cs && n_tok <= t->cap_pos && nff <= t->cap_ff)
        return true;
    free(t->cs);
    free(t->pos);
    free(t->ff);
    t->cs = malloc(floats * sizeof(float));
    t->pos = malloc((size_t)n_tok * sizeof(int32_t));
    t->ff = malloc(nff * sizeof(float));
    if (!t->cs || !t->pos || !t->ff) {
        free(t->cs);
        free(t->pos);
        free(t->ff);
        *t = (struct dray_cpu_rope_table){0};
        return false;
    }
    t->cap_cs = floats, t->cap_pos = n_tok, t->cap_ff = nff;
    return true;
}

/* The angle table for k's positions: one kept from an earlier call with the
 * same positions and frequencies (*fill = 0: every layer of a step asks
 * again), else the oldest one, taken over for them (*fill = 1). NULL when
 * there is no memory for it: the kernel then computes its own. */
static float *rope_table(struct dray_ctx *ctx, const struct dray_cpu_rope *k, uint32_t n_tok, int *fill)
{
    for (uint32_t i = 0; i < DRAY_CPU_ROPE_TABLES; i++) {
        if (rope_table_fits(&ctx->rope[i], k, n_tok, k->pos)) {
            *fill = 0;
            return ctx->rope[i].cs;
        }
    }
    struct dray_cpu_rope_table *t = &ctx->rope[ctx->rope_next];
    ctx->rope_next = (ctx->rope_next + 1) % DRAY_CPU_ROPE_TABLES;
    if (!rope_table_grow(t, k, n_tok))
        return NULL;
    memcpy(t->pos, k->pos, (size_t)n_tok * sizeof(int32_t));
    if (k->ff)
        memcpy(t->ff, k->ff, (size_t)(k->n_rot / 2) * sizeof(float));
    t->n_tok = n_tok, t->n_rot = k->n_rot, t->base = k->base, t->freq_scale = k->freq_scale;
    t->mscale = k->mscale, t->has_ff = k->ff != NULL;
    *fill = 1;
    return t->cs;
}

int dray_cpu_rope(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "rope: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    CHECK(dray_cpu_args(ctx, dray_util_check_rope(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    /* the kernels' frequency tables need a positive base and a finite scale */
    if (!(a->base > 0.0f) || !isfinite(a->freq_scale))
        return dray_cpu_fail(ctx, DRAY_EINVAL, "rope: base %g, freq_scale %g", a->base, a->freq_scale);
    void *x = p[0], *pos = p[1];
    struct rope_job j = {ctx, {.x = x, .pos = pos, .n_head = a->n_head, .head_dim = a->head_dim,
                               .n_rot = a->n_rot, .stride = a->stride, .base = a->base,
                               .freq_scale = a->freq_scale, .ff = p[2], /* NULL: no factors */
                               .mscale = dray_util_rope_mscale(a)}};
    if (!ctx->reference)
        j.k.table = rope_table(ctx, &j.k, a->n_tok, &j.k.fill);
    dray_cpu_parallel(ctx, a->n_tok, 1, (double)a->n_tok * a->n_head * a->n_rot * 8, rope_body, &j);
    return 0;
}

/* ---------------------------------------------------------------- gated act */

struct gated_job {
    struct dray_ctx *ctx;
    struct dray_cpu_gated_act k;
};

static void gated_body(void *arg, uint32_t i0, uint32_t i1, uint32_t ith)
{
    (void)ith;
    struct gated_job *j = arg;
    j->ctx->k.gated_act(&j->k, i0, i1);
}

int dray_cpu_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "gated_act: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    CHECK(dray_cpu_args(ctx, dray_util_check_gated_act(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    void *g = p[0], *u = p[1], *out = p[2];
    struct gated_job j = {ctx, {g, u, out, a->n, a->stride_gate, a->stride_up, a->stride_out, a->act}};
    dray_cpu_parallel(ctx, a->n_tok, 1, (double)a->n_tok * a->n * 8, gated_body, &j);
    return 0;
}

/* ---------------------------------------------------------------- add */

struct add_job {
    const float *a, *b;
    float *out;
};

static void add_body(void *arg, uint32_t i0, uint32_t i1, uint32_t ith)
{
    (void)ith;
    struct add_job *j = arg;
    dray_cpu_ref_add(j->a, j->b, j->out, (size_t)i0 * 1024, (size_t)i1 * 1024);
}

int dray_cpu_add(struct dray_ctx *ctx, const struct dray_add_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "add: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    CHECK(dray_cpu_args(ctx, dray_util_check_add(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    void *pa = p[0], *pb = p[1], *po = p[2];
    /* Whole 1024-element blocks per slice; the last one is cut at n. */
    uint64_t nblk = (a->n + 1023) / 1024;
    if (nblk > UINT32_MAX)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "add: n too large");
    struct add_job j = {pa, pb, po};
    if (a->n % 1024) {
        /* Slices in block units would overrun: do the partial block here. */
        size_t full = (size_t)(a->n / 1024) * 1024;
        dray_cpu_ref_add(pa, pb, po, full, (size_t)a->n);
        nblk--;
    }
    dray_cpu_parallel(ctx, (uint32_t)nblk, 1, (double)a->n, add_body, &j);
    return 0;
}
