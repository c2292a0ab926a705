/* The template's dense operators: embed, rmsnorm, matmul, rope, gated_act, add
 * (on packed weights, version 3, embed and matmul hand over to template_packed.c).
 * Each is one function in two steps: first check every argument and every
 * view (nothing is written before all checks pass), then do the math as
 * backend.h states it, in scalar C. A device plugin keeps step 1 on the host and turns
 * step 2 into a kernel launch. */
#include <math.h>
#include <string.h>

#include "template.h"

/* ------------------------------------------------------------ embed */

/* out[t][i] = table[ids[t]][i] * row_scale[ids[t]] * scale.
 *   ids I32 [n_tok], each < n_rows (else DRAY_EINVAL, checked before writing);
 *   table I8 [n_rows][dim] + row_scale F32 [n_rows], or F32 [n_rows][dim];
 *   out F32 [n_tok][dim]. F32 is exact; I8 multiplies q by (row_scale*scale). */
int dray_tpl_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    OP_BEGIN(ctx, a, "embed");
#if TPL_ABI >= 3
    if (a->dtype == DRAY_PACKED) /* a packed table (template_packed.c) */
        return dray_tpl_embed_packed(ctx, a);
#endif
    struct dray_util_needs nd;
    CHECK_ARGS(ctx, dray_util_check_embed, a, &nd);
    const int32_t *ids = dray_tpl_at(a->ids);
    const void *table = dray_tpl_at(a->table);
    const float *rs = dray_tpl_at(a->row_scale);
    float *out = dray_tpl_at(a->out);
    TRY(dray_util_check_ids(ids, a->n_tok, a->n_rows, ctx->err, sizeof(ctx->err)));
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
    struct dray_util_needs nd;
    CHECK_ARGS(ctx, dray_util_check_rmsnorm, a, &nd);
    const float *x = dray_tpl_at(a->x), *w = dray_tpl_at(a->w);
    float *out = dray_tpl_at(a->out);

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

/* Argument checks of matmul (the shared helper), then the outlier list. */
struct mm_views {
    const float *x, *wscale, *ow;
    const void *w;
    const int32_t *idx;
    float *out;
};

static int matmul_check(struct dray_ctx *ctx, const struct dray_matmul_args *a, struct mm_views *m)
{
    struct dray_util_needs nd;
    CHECK_ARGS(ctx, dray_util_check_matmul, a, &nd);
    m->x = dray_tpl_at(a->x);
    m->w = dray_tpl_at(a->w);
    m->wscale = dray_tpl_at(a->wscale);
    m->out = dray_tpl_at(a->out);
    m->idx = dray_tpl_at(a->outlier_idx);
    m->ow = dray_tpl_at(a->outlier_w);
    if (a->wdtype != DRAY_I8)
        return 0; /* outliers are ignored for F32 weights */
    return dray_util_check_outliers(m->idx, a->n_outlier, a->k, ctx->err, sizeof(ctx->err));
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
#if TPL_ABI >= 3
    if (a->wdtype == DRAY_PACKED) /* packed weights (template_packed.c) */
        return dray_tpl_matmul_packed(ctx, a);
#endif
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
 * theta = pos[t] * freq_scale * base^(-2i/n_rot) / ff[i] rotates
 * (v[i], v[i+n_rot/2]) with cos and sin scaled by mscale (version 4: ff the
 * freq_factors, all 1 when its buffer is NULL; mscale the attn_factor, 0 = 1).
 * The angle and its sine and cosine are computed in double: a plain f32 chain
 * loses the 1e-4 tolerance at long positions. */
int dray_tpl_rope(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    OP_BEGIN(ctx, a, "rope");
    struct dray_util_needs nd;
    CHECK_ARGS(ctx, dray_util_check_rope, a, &nd);
    float *x = dray_tpl_at(a->x);
    const int32_t *pos = dray_tpl_at(a->pos);
    const float *ff = NULL; /* a plugin of version < 4 never gets factors */
    double mscale = 1.0;
#if TPL_ABI >= 4
    ff = a->freq_factors.buf && a->n_rot ? dray_tpl_at(a->freq_factors) : NULL;
    mscale = dray_util_rope_mscale(a);
#endif

    uint32_t half = a->n_rot / 2;
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++) {
            float *v = x + (size_t)t * a->stride + (size_t)h * a->head_dim;
            for (uint32_t i = 0; i < half; i++) {
                double theta = (double)pos[t] * a->freq_scale * pow(a->base, -2.0 * i / a->n_rot);
                if (ff)
                    theta /= ff[i];
                double c = cos(theta) * mscale, s = sin(theta) * mscale, x0 = v[i], x1 = v[i + half];
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
    struct dray_util_needs nd;
    CHECK_ARGS(ctx, dray_util_check_gated_act, a, &nd);
    const float *g = dray_tpl_at(a->gate), *u = dray_tpl_at(a->up);
    float *out = dray_tpl_at(a->out);

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
    struct dray_util_needs nd;
    CHECK_ARGS(ctx, dray_util_check_add, a, &nd);
    const float *x = dray_tpl_at(a->a), *y = dray_tpl_at(a->b);
    float *out = dray_tpl_at(a->out);
    for (uint64_t i = 0; i < a->n; i++)
        out[i] = x[i] + y[i];
    return 0;
}
