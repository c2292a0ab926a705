/* The template's dense operators: embed, rmsnorm, matmul, rope, gated_act, add.
 * Each is one function in two steps: first check every argument and every
 * view (nothing is written before all checks pass), then do the math as
 * backend.h states it, in scalar C. A device plugin keeps step 1 on the host and turns
 * step 2 into a kernel launch. */
#include <math.h>
#include <string.h>

#include "template.h"

/* An output that may alias an input only exactly (same buffer, offset, stride):
 * then each element is read before it is written. Any other overlap is refused. */
static int alias_ok(struct dray_view out, size_t nout, uint32_t sout, struct dray_view in,
                    size_t nin, uint32_t sin)
{
    if (!dray_tpl_overlap(out, nout, in, nin))
        return 1;
    return out.offset == in.offset && sout == sin;
}

/* ------------------------------------------------------------ embed */

/* out[t][i] = table[ids[t]][i] * row_scale[ids[t]] * scale.
 *   ids I32 [n_tok], each < n_rows (else DRAY_EINVAL, checked before writing);
 *   table I8 [n_rows][dim] + row_scale F32 [n_rows], or F32 [n_rows][dim];
 *   out F32 [n_tok][dim]. F32 is exact; I8 multiplies q by (row_scale*scale). */
int dray_tpl_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    OP_BEGIN(ctx, a, "embed");
    if (a->dtype != DRAY_I8 && a->dtype != DRAY_F32)
        return dray_tpl_fail(ctx, DRAY_ENOTSUP, "embed: table dtype %u is not I8 or F32", a->dtype);
    size_t esz = a->dtype == DRAY_I8 ? 1 : 4, n_ids, n_table, n_scale, n_out;
    const int32_t *ids;
    const void *table;
    const float *rs = NULL;
    float *out;
    TRY(dray_tpl_span(ctx, "embed ids", 1, 0, a->n_tok, 4, &n_ids));
    TRY(dray_tpl_span(ctx, "embed table", a->n_rows, a->dim, a->dim, esz, &n_table));
    TRY(dray_tpl_span(ctx, "embed row_scale", 1, 0, a->dtype == DRAY_I8 ? a->n_rows : 0, 4, &n_scale));
    TRY(dray_tpl_span(ctx, "embed out", a->n_tok, a->dim, a->dim, 4, &n_out));
    VIEW(ctx, "embed ids", a->ids, n_ids, 4, ids);
    VIEW(ctx, "embed table", a->table, n_table, esz, table);
    VIEW(ctx, "embed row_scale", a->row_scale, n_scale, 4, rs);
    VIEW(ctx, "embed out", a->out, n_out, 4, out);
    for (uint32_t t = 0; t < a->n_tok; t++)
        if (ids[t] < 0 || (uint32_t)ids[t] >= a->n_rows)
            return dray_tpl_fail(ctx, DRAY_EINVAL, "embed: ids[%u] = %d is outside the table's %u rows",
                            t, ids[t], a->n_rows);
    if (a->dim == 0)
        return 0;

    for (uint32_t t = 0; t < a->n_tok; t++) {
        size_t row = (size_t)ids[t];
        float *y = out + (size_t)t * a->dim;
        if (a->dtype == DRAY_I8) {
            const int8_t *q = (const int8_t *)table + row * a->dim;
            float s = rs[row] * a->scale;
            for (uint32_t i = 0; i < a->dim; i++)
                y[i] = (float)q[i] * s;
        } else {
            const float *r = (const float *)table + row * a->dim;
            for (uint32_t i = 0; i < a->dim; i++)
                y[i] = r[i] * a->scale;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ rmsnorm */

/* Per row of n elements (n_head rows per token, stride_x / stride_out elements
 * between tokens): y = x / sqrt(mean(x^2) + eps) * w. out may alias x exactly.
 * The sum of squares is accumulated in double (the contract asks for at least
 * f32 with pairwise or wider partial sums). */
int dray_tpl_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a)
{
    OP_BEGIN(ctx, a, "rmsnorm");
    uint64_t row = (uint64_t)a->n_head * a->n;
    if (a->n_tok && (a->n == 0 || a->n_head == 0))
        return dray_tpl_fail(ctx, DRAY_EINVAL, "rmsnorm: n = %u and n_head = %u must be > 0", a->n,
                        a->n_head);
    if (a->stride_x < row || a->stride_out < row)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "rmsnorm: strides %u/%u are below n_head*n = %llu",
                        a->stride_x, a->stride_out, (unsigned long long)row);
    size_t nx, nw, no;
    const float *x, *w;
    float *out;
    TRY(dray_tpl_span(ctx, "rmsnorm x", a->n_tok, a->stride_x, row, 4, &nx));
    TRY(dray_tpl_span(ctx, "rmsnorm w", 1, 0, a->n_tok ? a->n : 0, 4, &nw));
    TRY(dray_tpl_span(ctx, "rmsnorm out", a->n_tok, a->stride_out, row, 4, &no));
    VIEW(ctx, "rmsnorm x", a->x, nx, 4, x);
    VIEW(ctx, "rmsnorm w", a->w, nw, 4, w);
    VIEW(ctx, "rmsnorm out", a->out, no, 4, out);
    if (!alias_ok(a->out, no, a->stride_out, a->x, nx, a->stride_x))
        return dray_tpl_fail(ctx, DRAY_EINVAL, "rmsnorm: out overlaps x without being x");

    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++) {
            const float *xr = x + (size_t)t * a->stride_x + (size_t)h * a->n;
            float *yr = out + (size_t)t * a->stride_out + (size_t)h * a->n;
            double ss = 0.0;
            for (uint32_t i = 0; i < a->n; i++)
                ss += (double)xr[i] * xr[i];
            float inv = (float)(1.0 / sqrt(ss / a->n + (double)a->eps));
            for (uint32_t i = 0; i < a->n; i++) /* in place: x[i] is read before y[i] is written */
                yr[i] = xr[i] * inv * w[i];
        }
    return 0;
}

/* ------------------------------------------------------------ matmul */

/* Quantize one row of x (k channels) to q per the W8A8 rule: outlier channels
 * (sorted idx) are left out of the maximum and get q = 0; sx = max|x|/127;
 * q = round-to-nearest-even(x/sx) clamped to [-127, 127]; a zero row gives sx = 0. */
static float quantize_row(const float *x, uint32_t k, const int32_t *idx, uint32_t n_outlier,
                          int8_t *q)
{
    float amax = 0.0f;
    for (uint32_t c = 0, j = 0; c < k; c++) {
        if (j < n_outlier && (uint32_t)idx[j] == c) {
            j++;
            continue;
        }
        amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
    }
    float sx = amax / 127.0f;
    for (uint32_t c = 0, j = 0; c < k; c++) {
        float v = 0.0f;
        if (j < n_outlier && (uint32_t)idx[j] == c)
            j++;
        else if (sx != 0.0f)
            v = nearbyintf(x[c] / sx); /* default rounding mode: nearest, ties to even */
        q[c] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
    return sx;
}

/* Argument checks of matmul: sizes, strides, outlier list, and every view. */
struct mm_views {
    const float *x, *wscale, *ow;
    const void *w;
    const int32_t *idx;
    float *out;
};

static int matmul_check(struct dray_ctx *ctx, const struct dray_matmul_args *a, struct mm_views *m)
{
    int i8 = a->wdtype == DRAY_I8;
    uint32_t n_outlier = i8 ? a->n_outlier : 0; /* ignored for F32 weights */
    size_t nx, nw, ns, no, ni, now;
    if (a->k > 65536)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "matmul: k = %u exceeds 65536", a->k);
    if (a->stride_x < a->k || a->stride_out < a->n_out)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "matmul: stride_x %u < k %u or stride_out %u < n_out %u",
                        a->stride_x, a->k, a->stride_out, a->n_out);
    if (n_outlier > a->k)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "matmul: %u outliers but k = %u", n_outlier, a->k);
    TRY(dray_tpl_span(ctx, "matmul x", a->n_tok, a->stride_x, a->k, 4, &nx));
    TRY(dray_tpl_span(ctx, "matmul w", a->n_out, a->k, a->k, i8 ? 1 : 4, &nw));
    TRY(dray_tpl_span(ctx, "matmul wscale", 1, 0, i8 ? a->n_out : 0, 4, &ns));
    TRY(dray_tpl_span(ctx, "matmul out", a->n_tok, a->stride_out, a->n_out, 4, &no));
    TRY(dray_tpl_span(ctx, "matmul outlier_idx", 1, 0, n_outlier, 4, &ni));
    TRY(dray_tpl_span(ctx, "matmul outlier_w", a->n_out, n_outlier, n_outlier, 4, &now));
    VIEW(ctx, "matmul x", a->x, nx, 4, m->x);
    VIEW(ctx, "matmul w", a->w, nw, i8 ? 1 : 4, m->w);
    VIEW(ctx, "matmul wscale", a->wscale, ns, 4, m->wscale);
    VIEW(ctx, "matmul out", a->out, no, 4, m->out);
    VIEW(ctx, "matmul outlier_idx", a->outlier_idx, ni, 4, m->idx);
    VIEW(ctx, "matmul outlier_w", a->outlier_w, now, 4, m->ow);
    if (dray_tpl_overlap(a->out, no, a->x, nx))
        return dray_tpl_fail(ctx, DRAY_EINVAL, "matmul: out overlaps x");
    for (uint32_t j = 0; j < n_outlier; j++)
        if (m->idx[j] < 0 || (uint32_t)m->idx[j] >= a->k || (j && m->idx[j] <= m->idx[j - 1]))
            return dray_tpl_fail(ctx, DRAY_EINVAL, "matmul: outlier_idx[%u] = %d: channels must be "
                            "strictly increasing and below k = %u", j, m->idx[j], a->k);
    return 0;
}

/* out[t][o] (+)= sum_k x[t][k] * W[o][k].
 *   I8:  W = w (I8 [n_out][k]) * wscale[o]; x quantized per token inside the op;
 *        exact int32 dot product, then * sx[t] * wscale[o]; outlier channels
 *        added in f32 from outlier_w F32 [n_out][n_outlier].
 *   F32: w F32 [n_out][k], plain dot products (summed in double here).
 * out must not overlap x; accumulate = 1 adds to out. */
int dray_tpl_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    OP_BEGIN(ctx, a, "matmul");
    if (a->wdtype != DRAY_I8 && a->wdtype != DRAY_F32)
        return dray_tpl_fail(ctx, DRAY_ENOTSUP, "matmul: weight dtype %u is not I8 or F32", a->wdtype);
    struct mm_views m;
    memset(&m, 0, sizeof(m));
    TRY(matmul_check(ctx, a, &m));
    int8_t *q = NULL;
    if (a->wdtype == DRAY_I8 && a->k && !(q = dray_tpl_alloc(a->k)))
        return dray_tpl_fail(ctx, DRAY_ENOMEM, "matmul: no host memory for %u quantized inputs", a->k);

    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *xr = m.x + (size_t)t * a->stride_x;
        float *yr = m.out + (size_t)t * a->stride_out;
        float sx = q ? quantize_row(xr, a->k, m.idx, a->n_outlier, q) : 0.0f;
        for (uint32_t o = 0; o < a->n_out; o++) {
            float v;
            if (a->wdtype == DRAY_I8) {
                const int8_t *wr = (const int8_t *)m.w + (size_t)o * a->k;
                int32_t isum = 0; /* |q*w| <= 127*127 and k <= 65536: cannot overflow */
                for (uint32_t c = 0; c < a->k; c++)
                    isum += (int32_t)q[c] * wr[c];
                v = (float)isum * sx * m.wscale[o];
                for (uint32_t j = 0; j < a->n_outlier; j++)
                    v += xr[m.idx[j]] * m.ow[(size_t)o * a->n_outlier + j];
            } else {
                const float *wr = (const float *)m.w + (size_t)o * a->k;
                double s = 0.0;
                for (uint32_t c = 0; c < a->k; c++)
                    s += (double)xr[c] * wr[c];
                v = (float)s;
            }
            yr[o] = a->accumulate ? yr[o] + v : v;
        }
    }
    dray_tpl_free(q);
    return 0;
}

/* ------------------------------------------------------------ rope */

/* NEOX rotary embedding in place on n_head heads of each token: for i < n_rot/2,
 * theta = pos[t] * freq_scale * base^(-2i/n_rot) rotates (v[i], v[i+n_rot/2]).
 * The angle and its sine and cosine are computed in double: a plain f32 chain
 * loses the 1e-4 tolerance at long positions. */
int dray_tpl_rope(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    OP_BEGIN(ctx, a, "rope");
    uint64_t row = (uint64_t)a->n_head * a->head_dim;
    if (a->n_rot % 2 || a->n_rot > a->head_dim)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "rope: n_rot = %u must be even and <= head_dim = %u",
                        a->n_rot, a->head_dim);
    if (a->stride < row)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "rope: stride %u is below n_head*head_dim = %llu",
                        a->stride, (unsigned long long)row);
    size_t nx, np;
    float *x;
    const int32_t *pos;
    TRY(dray_tpl_span(ctx, "rope x", a->n_tok, a->stride, row, 4, &nx));
    TRY(dray_tpl_span(ctx, "rope pos", 1, 0, a->n_tok, 4, &np));
    VIEW(ctx, "rope x", a->x, nx, 4, x);
    VIEW(ctx, "rope pos", a->pos, np, 4, pos);

    uint32_t half = a->n_rot / 2;
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++) {
            float *v = x + (size_t)t * a->stride + (size_t)h * a->head_dim;
            for (uint32_t i = 0; i < half; i++) {
                double theta = (double)pos[t] * a->freq_scale * pow(a->base, -2.0 * i / a->n_rot);
                double c = cos(theta), s = sin(theta), x0 = v[i], x1 = v[i + half];
                v[i] = (float)(x0 * c - x1 * s);
                v[i + half] = (float)(x0 * s + x1 * c);
            }
        }
    return 0;
}

/* ------------------------------------------------------------ gated_act */

static double act(uint32_t kind, double x)
{
    if (kind == DRAY_ACT_SILU)
        return x / (1.0 + exp(-x));
    /* gelu_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* out[t][i] = act(gate[t][i]) * up[t][i] for i < n, rows at their own strides.
 * out may alias gate or up exactly. Computed in double, rounded once. */
int dray_tpl_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a)
{
    OP_BEGIN(ctx, a, "gated_act");
    if (a->act != DRAY_ACT_GELU_TANH && a->act != DRAY_ACT_SILU)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "gated_act: unknown activation %u", a->act);
    if (a->stride_gate < a->n || a->stride_up < a->n || a->stride_out < a->n)
        return dray_tpl_fail(ctx, DRAY_EINVAL, "gated_act: strides %u/%u/%u must be >= n = %u",
                        a->stride_gate, a->stride_up, a->stride_out, a->n);
    size_t ng, nu, no;
    const float *g, *u;
    float *out;
    TRY(dray_tpl_span(ctx, "gated_act gate", a->n_tok, a->stride_gate, a->n, 4, &ng));
    TRY(dray_tpl_span(ctx, "gated_act up", a->n_tok, a->stride_up, a->n, 4, &nu));
    TRY(dray_tpl_span(ctx, "gated_act out", a->n_tok, a->stride_out, a->n, 4, &no));
    VIEW(ctx, "gated_act gate", a->gate, ng, 4, g);
    VIEW(ctx, "gated_act up", a->up, nu, 4, u);
    VIEW(ctx, "gated_act out", a->out, no, 4, out);
    if (!alias_ok(a->out, no, a->stride_out, a->gate, ng, a->stride_gate) ||
        !alias_ok(a->out, no, a->stride_out, a->up, nu, a->stride_up))
        return dray_tpl_fail(ctx, DRAY_EINVAL, "gated_act: out overlaps gate or up without being it");

    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *gr = g + (size_t)t * a->stride_gate, *ur = u + (size_t)t * a->stride_up;
        float *yr = out + (size_t)t * a->stride_out;
        for (uint32_t i = 0; i < a->n; i++)
            yr[i] = (float)(act(a->act, gr[i]) * ur[i]);
    }
    return 0;
}

/* ------------------------------------------------------------ add */

/* out[i] = a[i] + b[i], F32 [n]; out may alias a or b exactly. Exact (one f32 add). */
int dray_tpl_add(struct dray_ctx *ctx, const struct dray_add_args *a)
{
    OP_BEGIN(ctx, a, "add");
    size_t n;
    const float *x, *y;
    float *out;
    TRY(dray_tpl_span(ctx, "add", 1, 0, a->n, 4, &n));
    VIEW(ctx, "add a", a->a, n, 4, x);
    VIEW(ctx, "add b", a->b, n, 4, y);
    VIEW(ctx, "add out", a->out, n, 4, out);
    if (!alias_ok(a->out, n, 0, a->a, n, 0) || !alias_ok(a->out, n, 0, a->b, n, 0))
        return dray_tpl_fail(ctx, DRAY_EINVAL, "add: out overlaps a or b without being it");
    for (uint64_t i = 0; i < a->n; i++)
        out[i] = x[i] + y[i];
    return 0;
}
