/* Host side of the element-wise, norm, rope, embedding and matmul ops:
 * argument checks, then dispatches over windows that each bind at most
 * maxStorageBufferRange bytes (token chunks; row windows for big tables).
 * Embed and matmul on packed weights (DRAY_PACKED) are vk_packed.c's. */
#include <math.h>
#include <string.h>

#include "vk_internal.h"

#define F32 4u
#define VK_MATMUL_TT 4u /* tokens per group in matmul.comp (TT) */
#define VK_MATMUL_RG 4u /* output rows per group in matmul.comp (RG) */

static uint32_t vk_div_up(uint64_t a, uint64_t b)
{
    return (uint32_t)((a + b - 1) / b);
}

/* Bytes of n_tok rows stride elements apart, each row elements long. */
static size_t vk_rows_bytes(uint32_t n_tok, uint32_t stride, size_t row, size_t esize)
{
    return n_tok ? ((size_t)(n_tok - 1) * stride + row) * esize : 0;
}

static int vk_no_room(struct dray_ctx *ctx, const char *op)
{
    return dray_vk_fail(ctx, DRAY_ENOTSUP, "%s: one row is larger than maxStorageBufferRange %llu",
                        op, (unsigned long long)ctx->max_range);
}

/* ------------------------------------------------------------------ add */

int dray_vk_add(struct dray_ctx *ctx, const struct dray_add_args *a)
{
    struct dray_util_needs nd;
    int rc = dray_vk_check_args(ctx, dray_util_check_add(a, &nd, ctx->err, sizeof(ctx->err)), &nd);
    uint64_t chunk = (uint64_t)VK_MAX_GROUPS * 256;
    uint64_t room = (ctx->max_range - ctx->off_align) / F32;
    chunk = chunk < room ? chunk : room;
    for (uint64_t i = 0; !rc && i < a->n; i += chunk) {
        uint32_t n = (uint32_t)(a->n - i < chunk ? a->n - i : chunk);
        struct vk_bind b[3] = {dray_vk_bind(a->a, i * F32, n * F32, F32),
                               dray_vk_bind(a->b, i * F32, n * F32, F32),
                               dray_vk_bind(a->out, i * F32, n * F32, F32)};
        rc = dray_vk_dispatch(ctx, VK_K_ADD, b, 3, &n, sizeof(n), vk_div_up(n, 256), 1, 1);
    }
    return rc;
}

/* ------------------------------------------------------------ gated act */

int dray_vk_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a)
{
    struct dray_util_needs nd;
    int rc = dray_vk_check_args(ctx, dray_util_check_gated_act(a, &nd, ctx->err, sizeof(ctx->err)), &nd);
    if (rc)
        return rc;
    if (vk_div_up(a->n, 256) > VK_MAX_GROUPS)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "gated_act: n = %u is too large", a->n);
    uint32_t smax = a->stride_gate > a->stride_up ? a->stride_gate : a->stride_up;
    smax = smax > a->stride_out ? smax : a->stride_out;
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)smax * F32, (size_t)a->n * F32);
    if (!rc && a->n && !nt)
        return vk_no_room(ctx, "gated_act");
    struct {
        uint32_t n, sg, su, so, act;
    } pc = {a->n, a->stride_gate, a->stride_up, a->stride_out, a->act};
    for (uint32_t t = 0; !rc && a->n && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        struct vk_bind b[3] = {
            dray_vk_bind(a->gate, (size_t)t * a->stride_gate * F32,
                         vk_rows_bytes(c, a->stride_gate, a->n, F32), F32),
            dray_vk_bind(a->up, (size_t)t * a->stride_up * F32,
                         vk_rows_bytes(c, a->stride_up, a->n, F32), F32),
            dray_vk_bind(a->out, (size_t)t * a->stride_out * F32,
                         vk_rows_bytes(c, a->stride_out, a->n, F32), F32)};
        rc = dray_vk_dispatch(ctx, VK_K_GATED_ACT, b, 3, &pc, sizeof(pc), vk_div_up(a->n, 256), c,
                              1);
    }
    return rc;
}

/* -------------------------------------------------------------- rmsnorm */

int dray_vk_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a)
{
    size_t row = (size_t)a->n_head * a->n;
    struct dray_util_needs nd;
    int rc = dray_vk_check_args(ctx, dray_util_check_rmsnorm(a, &nd, ctx->err, sizeof(ctx->err)), &nd);
    if (rc)
        return rc;
    /* beyond the contract: one workgroup row per head, and rows of n > 0 */
    if (a->n == 0 || a->n_head == 0 || a->n_head > VK_MAX_GROUPS)
        return dray_vk_fail(ctx, DRAY_EINVAL, "rmsnorm: n = %u, n_head = %u", a->n, a->n_head);
    uint32_t smax = a->stride_x > a->stride_out ? a->stride_x : a->stride_out;
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)smax * F32, row * F32);
    if (!rc && !nt)
        return vk_no_room(ctx, "rmsnorm");
    struct {
        uint32_t n, sx, so;
        float eps;
    } pc = {a->n, a->stride_x, a->stride_out, a->eps};
    for (uint32_t t = 0; !rc && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        struct vk_bind b[3] = {
            dray_vk_bind(a->x, (size_t)t * a->stride_x * F32, vk_rows_bytes(c, a->stride_x, row, F32),
                         F32),
            dray_vk_bind(a->w, 0, (size_t)a->n * F32, F32),
            dray_vk_bind(a->out, (size_t)t * a->stride_out * F32,
                         vk_rows_bytes(c, a->stride_out, row, F32), F32)};
        rc = dray_vk_dispatch(ctx, VK_K_RMSNORM, b, 3, &pc, sizeof(pc), a->n_head, c, 1);
    }
    return rc;
}

/* ----------------------------------------------------------------- rope */

/* Whether table slot k was made for a's frequencies (ff: its v4 factors, NULL
 * for none). */
static bool vk_rope_key_fits(const struct vk_rope_key *k, const struct dray_rope_args *a, const float *ff)
{
    if (!k->valid || k->n_rot != a->n_rot || k->base != a->base || k->freq_scale != a->freq_scale ||
        k->has_ff != (ff != NULL))
        return false;
    return !ff || !memcmp(k->ff, ff, (size_t)(a->n_rot / 2) * sizeof(float));
}

/* A slot made from the same factor view, not written since: no read-back. */
static bool vk_rope_same_view(const struct vk_rope_key *k, const struct dray_rope_args *a)
{
    const struct dray_buf *b = a->freq_factors.buf;
    return k->valid && k->has_ff && k->ff_buf == b && k->ff_off == a->freq_factors.offset &&
           k->ff_writes == b->writes && k->n_rot == a->n_rot && k->base == a->base &&
           k->freq_scale == a->freq_scale;
}

/* Slot of the frequency table for (n_rot, base, freq_scale, freq_factors),
 * uploading it if new. Entry i = frac(freq_scale * base^(-2i/n_rot) / ff[i] / 2pi)
 * as a 64-bit fraction. The factors (v4) live in device memory and the exact
 * angle reduction needs them on the host: they are read back (a wait for the
 * queue) unless a slot was made from the same view with no write to its
 * buffer since, which is every call after the first for a model's factors. */
static int vk_rope_table(struct dray_ctx *ctx, const struct dray_rope_args *a, uint32_t *slot)
{
    uint32_t half = a->n_rot / 2, words[2 * VK_ROPE_MAX_PAIRS];
    float ffv[VK_ROPE_MAX_PAIRS], *ff = NULL;
    int rc;

    for (uint32_t s = 0; a->freq_factors.buf && s < VK_ROPE_SLOTS; s++)
        if (vk_rope_same_view(&ctx->rope_key[s], a)) {
            *slot = s;
            return 0;
        }
    if (a->freq_factors.buf) {
        if ((rc = dray_vk_download(ctx, ffv, a->freq_factors, (size_t)half * sizeof(float))))
            return rc;
        for (uint32_t i = 0; i < half; i++)
            if (!(ffv[i] > 0.0f) || !isfinite(ffv[i])) /* the table needs a finite angle */
                return dray_vk_fail(ctx, DRAY_EINVAL, "rope: freq_factors[%u] = %g is not finite and > 0",
                                    i, (double)ffv[i]);
        ff = ffv;
    }
    for (uint32_t s = 0; s < VK_ROPE_SLOTS; s++) {
        struct vk_rope_key *k = &ctx->rope_key[s];
        if (vk_rope_key_fits(k, a, ff)) {
            if (ff) { /* the same values from this view: no read-back next time */
                k->ff_buf = a->freq_factors.buf;
                k->ff_off = a->freq_factors.offset;
                k->ff_writes = a->freq_factors.buf->writes;
            }
            *slot = s;
            return 0;
        }
    }
    if (!ctx->rope_tab &&
        (rc = dray_vk_buf_alloc(ctx, VK_ROPE_SLOTS * VK_ROPE_MAX_PAIRS * 8, &ctx->rope_tab)))
        return rc;
    for (uint32_t i = 0; i < half; i++) {
        double f = (double)a->freq_scale * pow((double)a->base, -2.0 * i / a->n_rot);
        if (ff)
            f /= ff[i];
        double g = f / (2.0 * M_PI);
        g -= floor(g);
        uint64_t G = (uint64_t)ldexp(g, 64);
        words[2 * i] = (uint32_t)(G >> 32);
        words[2 * i + 1] = (uint32_t)G;
    }
    /* Queued in order: ops recorded earlier still read the old table. */
    *slot = ctx->rope_next;
    ctx->rope_next = (ctx->rope_next + 1) % VK_ROPE_SLOTS;
    struct dray_view v = {ctx->rope_tab, (size_t)*slot * VK_ROPE_MAX_PAIRS * 8};
    rc = dray_vk_upload(ctx, v, words, (size_t)half * 8);
    struct vk_rope_key *k = &ctx->rope_key[*slot];
    *k = (struct vk_rope_key){a->n_rot, a->base, a->freq_scale, rc == 0, ff != NULL, {0}, NULL, 0, 0};
    if (ff) {
        memcpy(k->ff, ff, (size_t)half * sizeof(float));
        k->ff_buf = a->freq_factors.buf;
        k->ff_off = a->freq_factors.offset;
        k->ff_writes = a->freq_factors.buf->writes;
    }
    return rc;
}

int dray_vk_rope(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    size_t row = (size_t)a->n_head * a->head_dim;
    uint32_t slot = 0;
    int rc;

    struct dray_util_needs nd;
    rc = dray_vk_check_args(ctx, dray_util_check_rope(a, &nd, ctx->err, sizeof(ctx->err)), &nd);
    if (!rc && a->n_rot / 2 > VK_ROPE_MAX_PAIRS)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "rope: n_rot = %u (at most %u)", a->n_rot,
                            2 * VK_ROPE_MAX_PAIRS);
    if (rc || a->n_rot == 0 || a->n_tok == 0 || a->n_head == 0)
        return rc;
    uint32_t gx = vk_div_up((uint64_t)a->n_rot / 2 * a->n_head, 64);
    if (gx > VK_MAX_GROUPS)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "rope: too many heads");
    if ((rc = vk_rope_table(ctx, a, &slot)))
        return rc;
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)a->stride * F32, row * F32);
    if (!nt)
        return vk_no_room(ctx, "rope");
    struct {
        uint32_t n_head, head_dim, half, stride;
        float mscale; /* v4 attn_factor, 0 turned into 1 */
    } pc = {a->n_head, a->head_dim, a->n_rot / 2, a->stride, dray_util_rope_mscale(a)};
    struct dray_view tab = {ctx->rope_tab, (size_t)slot * VK_ROPE_MAX_PAIRS * 8};
    for (uint32_t t = 0; !rc && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        struct vk_bind b[3] = {
            dray_vk_bind(a->x, (size_t)t * a->stride * F32, vk_rows_bytes(c, a->stride, row, F32),
                         F32),
            dray_vk_bind(a->pos, (size_t)t * 4, (size_t)c * 4, 4),
            dray_vk_bind(tab, 0, (size_t)pc.half * 8, 8)};
        rc = dray_vk_dispatch(ctx, VK_K_ROPE, b, 3, &pc, sizeof(pc), gx, c, 1);
    }
    return rc;
}

/* ---------------------------------------------------------------- embed */

/* ids are read back to check them (the contract wants DRAY_EINVAL for a bad id)
 * and to skip table windows no token touches. */
int dray_vk_embed_ids(struct dray_ctx *ctx, const struct dray_embed_args *a, int32_t **out)
{
    int32_t *ids = dray_vk_alloc((size_t)a->n_tok * 4);
    if (!ids)
        return dray_vk_fail(ctx, DRAY_ENOMEM, "embed: out of host memory");
    int rc = dray_vk_download(ctx, ids, a->ids, (size_t)a->n_tok * 4);
    if (!rc)
        rc = dray_util_check_ids(ids, a->n_tok, a->n_rows, ctx->err, sizeof(ctx->err));
    if (rc)
        dray_vk_free(ids);
    else
        *out = ids;
    return rc;
}

int dray_vk_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    bool i8 = a->dtype == DRAY_I8;
    uint32_t esz = i8 ? 1 : F32;
    int32_t *ids = NULL;
    int rc;

    if (a->dtype == DRAY_PACKED)
        return dray_vk_embed_packed(ctx, a);
    struct dray_util_needs nd;
    if ((rc = dray_vk_check_args(ctx, dray_util_check_embed(a, &nd, ctx->err, sizeof(ctx->err)), &nd)))
        return rc;
    if (i8 && !ctx->has_i8)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "embed: device lacks 8-bit storage");
    if (vk_div_up(a->dim, 256) > VK_MAX_GROUPS)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "embed: dim %u too large", a->dim);
    if (a->n_tok == 0 || a->dim == 0)
        return 0;
    if ((rc = dray_vk_embed_ids(ctx, a, &ids)))
        return rc;
    /* table rows per window: one binding each; grid limits do not apply to rows */
    size_t room = (ctx->max_range - ctx->off_align) / ((size_t)a->dim * esz);
    uint32_t win = room < a->n_rows ? (uint32_t)room : a->n_rows;
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)a->dim * F32, (size_t)a->dim * F32);
    if (!win || !nt)
        rc = vk_no_room(ctx, "embed");
    struct {
        uint32_t dim, row0, n_win;
        float scale;
    } pc = {a->dim, 0, 0, a->scale};
    for (uint32_t r0 = 0; !rc && r0 < a->n_rows; r0 += win) {
        uint32_t nw = a->n_rows - r0 < win ? a->n_rows - r0 : win;
        bool used = dray_vk_ids_in(ids, a->n_tok, r0, nw);
        pc.row0 = r0;
        pc.n_win = nw;
        for (uint32_t t = 0; used && !rc && t < a->n_tok; t += nt) {
            uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
            struct vk_bind b[4] = {
                dray_vk_bind(a->ids, (size_t)t * 4, (size_t)c * 4, 4),
                dray_vk_bind(a->table, (size_t)r0 * a->dim * esz, (size_t)nw * a->dim * esz, esz),
                i8 ? dray_vk_bind(a->row_scale, (size_t)r0 * 4, (size_t)nw * 4, 4)
                   : dray_vk_bind(a->table, 0, 4, 4), /* unused by the F32 kernel */
                dray_vk_bind(a->out, (size_t)t * a->dim * F32, (size_t)c * a->dim * F32, F32)};
            rc = dray_vk_dispatch(ctx, i8 ? VK_K_EMBED_I8 : VK_K_EMBED_F32, b, 4, &pc, sizeof(pc),
                                  vk_div_up(a->dim, 256), c, 1);
        }
    }
    dray_vk_free(ids);
    return rc;
}

/* --------------------------------------------------------------- matmul */

static int vk_matmul_check(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    struct dray_util_needs nd;
    int rc = dray_vk_check_args(ctx, dray_util_check_matmul(a, &nd, ctx->err, sizeof(ctx->err)), &nd);
    if (rc)
        return rc;
    if (a->wdtype == DRAY_I8 && !ctx->has_i8)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "matmul: device lacks 8-bit storage");
    if (a->k == 0) /* the shaders need one column */
        return dray_vk_fail(ctx, DRAY_EINVAL, "matmul: k = 0 (want 1..65536)");
    return 0;
}

/* Quantize tokens [t, t+c) into scratch, then the int8 matmul over row windows. */
static int vk_matmul_chunk(struct dray_ctx *ctx, const struct dray_matmul_args *a, uint32_t t,
                           uint32_t c, uint32_t kq, bool dp4a)
{
    size_t qbytes = (size_t)c * kq, sxoff = (qbytes + 63) / 64 * 64;
    struct dray_view scr = {ctx->scratch, 0}, sxv = {ctx->scratch, sxoff};
    struct dray_view dummy = a->wscale;
    bool outl = a->n_outlier > 0;
    struct {
        uint32_t k, stride_x, kq, n_outlier;
    } qp = {a->k, a->stride_x, kq, a->n_outlier};
    size_t xoff = (size_t)t * a->stride_x * F32, xlen = vk_rows_bytes(c, a->stride_x, a->k, F32);
    struct vk_bind qb[4] = {
        dray_vk_bind(a->x, xoff, xlen, F32),
        outl ? dray_vk_bind(a->outlier_idx, 0, (size_t)a->n_outlier * 4, 4)
             : dray_vk_bind(dummy, 0, 4, 4),
        dray_vk_bind(scr, 0, qbytes, 1),
        dray_vk_bind(sxv, 0, (size_t)c * F32, F32)};
    int rc = dray_vk_dispatch(ctx, VK_K_QUANT_ROWS, qb, 4, &qp, sizeof(qp), c, 1, 1);
    uint32_t esz = dp4a ? 4 : 1;
    uint32_t nr = (uint32_t)((ctx->max_range - ctx->off_align) / a->k);
    nr = nr < VK_MAX_GROUPS ? nr : VK_MAX_GROUPS;
    struct {
        uint32_t k, kq, n_tok, stride_o, stride_x, n_outlier, accumulate, n_rows;
    } mp = {a->k, kq, c, a->stride_out, a->stride_x, a->n_outlier, a->accumulate, 0};
    for (uint32_t r = 0; !rc && r < a->n_out; r += nr) {
        uint32_t n = a->n_out - r < nr ? a->n_out - r : nr;
        mp.n_rows = n;
        struct vk_bind b[8] = {
            dray_vk_bind(scr, 0, qbytes, esz),
            dray_vk_bind(sxv, 0, (size_t)c * F32, F32),
            dray_vk_bind(a->w, (size_t)r * a->k, (size_t)n * a->k, esz),
            dray_vk_bind(a->wscale, (size_t)r * F32, (size_t)n * F32, F32),
            dray_vk_bind(a->out, ((size_t)t * a->stride_out + r) * F32,
                         vk_rows_bytes(c, a->stride_out, n, F32), F32),
            dray_vk_bind(a->x, xoff, xlen, F32),
            outl ? dray_vk_bind(a->outlier_idx, 0, (size_t)a->n_outlier * 4, 4)
                 : dray_vk_bind(dummy, 0, 4, 4),
            outl ? dray_vk_bind(a->outlier_w, (size_t)r * a->n_outlier * F32,
                                (size_t)n * a->n_outlier * F32, F32)
                 : dray_vk_bind(dummy, 0, 4, 4)};
        rc = dray_vk_dispatch(ctx, dp4a ? VK_K_MATMUL_DP4A : VK_K_MATMUL_I8, b, 8, &mp, sizeof(mp),
                              vk_div_up(n, VK_MATMUL_RG), vk_div_up(c, VK_MATMUL_TT), 1);
    }
    return rc;
}

/* F32 weights (the checking path): no quantization, f32 sums. */
static int vk_matmul_f32(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    uint32_t n2 = dray_vk_tok_chunk(ctx, (size_t)a->stride_x * F32, (size_t)a->k * F32);
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)a->stride_out * F32, (size_t)a->n_out * F32);
    uint32_t nr = (uint32_t)((ctx->max_range - ctx->off_align) / ((size_t)a->k * F32));
    int rc = 0;
    nt = nt < n2 ? nt : n2;
    nt = nt < 4 * VK_MAX_GROUPS ? nt : 4 * VK_MAX_GROUPS;
    nr = nr < VK_MAX_GROUPS ? nr : VK_MAX_GROUPS;
    if (!nt || !nr)
        return vk_no_room(ctx, "matmul");
    struct {
        uint32_t k, n_tok, stride_x, stride_o, accumulate;
    } pc = {a->k, 0, a->stride_x, a->stride_out, a->accumulate};
    for (uint32_t t = 0; !rc && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        pc.n_tok = c;
        for (uint32_t r = 0; !rc && r < a->n_out; r += nr) {
            uint32_t n = a->n_out - r < nr ? a->n_out - r : nr;
            struct vk_bind b[3] = {
                dray_vk_bind(a->x, (size_t)t * a->stride_x * F32,
                             vk_rows_bytes(c, a->stride_x, a->k, F32), F32),
                dray_vk_bind(a->w, (size_t)r * a->k * F32, (size_t)n * a->k * F32, F32),
                dray_vk_bind(a->out, ((size_t)t * a->stride_out + r) * F32,
                             vk_rows_bytes(c, a->stride_out, n, F32), F32)};
            rc = dray_vk_dispatch(ctx, VK_K_MATMUL_F32, b, 3, &pc, sizeof(pc), n, vk_div_up(c, 4),
                                  1);
        }
    }
    return rc;
}

int dray_vk_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    if (a->wdtype == DRAY_PACKED)
        return dray_vk_matmul_packed(ctx, a);
    int rc = vk_matmul_check(ctx, a);
    if (rc || a->n_tok == 0 || a->n_out == 0)
        return rc;
    if (a->wdtype == DRAY_F32)
        return vk_matmul_f32(ctx, a);
    uint32_t kq = (a->k + 3) & ~3u;
    bool dp4a = ctx->has_dp4a && a->k % 4 == 0 && a->w.offset % 4 == 0;
    /* tokens per chunk: q rows in scratch, x rows and out rows must each fit a binding */
    uint32_t nt = dray_vk_tok_chunk(ctx, kq, kq);
    uint32_t n2 = dray_vk_tok_chunk(ctx, (size_t)a->stride_x * F32, (size_t)a->k * F32);
    uint32_t n3 = dray_vk_tok_chunk(ctx, (size_t)a->stride_out * F32, (size_t)a->n_out * F32);
    nt = nt < n2 ? nt : n2;
    nt = nt < n3 ? nt : n3;
    nt = nt < a->n_tok ? nt : a->n_tok;
    if (!nt)
        return vk_no_room(ctx, "matmul");
    if ((rc = dray_vk_scratch(ctx, ((size_t)nt * kq + 63) / 64 * 64 + (size_t)nt * F32)))
        return rc;
    for (uint32_t t = 0; !rc && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        rc = vk_matmul_chunk(ctx, a, t, c, kq, dp4a);
    }
    return rc;
}
