/* AVX2 kernels for the cheap ops: embed, rmsnorm, rope, gated activation.
 * Same results as the reference up to f32 rounding (see backend.h tolerances). */
#include <math.h>
#include <string.h>

#include "avx2_util.h"
#include "cpu_kernels.h"

/* Row r of a DRAY_Q8G32 table (backend.h: rows in blocks of 16, each group of
 * 32 inputs stored as 8 units of 64 bytes = 4 inputs x 16 rows) as f32: per
 * group one gather of the row's 4 bytes from each unit gives its 32 codes in
 * input order. The rescored head gathers a few thousand rows a step. Same
 * products as the reference: ((float)w * s) * scale. */
static void q8g_row(const int8_t *table, const float *rs, size_t r, uint32_t dim, float scale, float *y)
{
    const uint32_t G = dim / 32, o = (uint32_t)(r % 16);
    const size_t b = r / 16;
    const __m256i units = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
    const __m256 vscale = _mm256_set1_ps(scale);
    for (uint32_t g = 0; g < G; g++) {
        const int8_t *grp = table + (b * G + g) * 512 + o * 4;
        __m256i w = _mm256_i32gather_epi32((const int *)grp, units, 1);
        __m256 s = _mm256_set1_ps(rs[(b * G + g) * 16 + o]);
        __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
        __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; i++) {
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[i]));
            _mm256_storeu_ps(y + g * 32 + i * 8, _mm256_mul_ps(_mm256_mul_ps(v, s), vscale));
        }
    }
}

/* Rows of an I8 table asked for this many ids ahead: the rescored head's
 * candidates are 20 group rows of 32 bytes each, contiguous per token but with
 * the tokens anywhere in the table, so every candidate is a cold miss the
 * hardware prefetcher cannot see coming (docs/performance.md, "Candidate rows
 * prefetched"). */
#define EMBED_PF_AHEAD 64u

/* Ask for the first 512 bytes of I8 row ids[t] (and its scale). */
static void prefetch_i8_row(const struct dray_cpu_embed *a, uint32_t t)
{
    const char *r = (const char *)a->table + (size_t)a->ids[t] * a->dim;
    uint32_t n = a->dim < 512 ? a->dim : 512;
    for (uint32_t o = 0; o < n; o += 64)
        _mm_prefetch(r + o, _MM_HINT_T0);
    _mm_prefetch((const char *)(a->row_scale + a->ids[t]), _MM_HINT_T0);
}

void dray_cpu_avx2_embed(const struct dray_cpu_embed *a, uint32_t t0, uint32_t t1)
{
    int pf = a->is_i8 && !a->gdtype;
    for (uint32_t t = t0; pf && t < t1 && t < t0 + EMBED_PF_AHEAD; t++)
        prefetch_i8_row(a, t);
    for (uint32_t t = t0; t < t1; t++) {
        size_t row = (size_t)a->ids[t];
        float *y = a->out + (size_t)t * a->dim;
        uint32_t i = 0;
        if (pf && t + EMBED_PF_AHEAD < t1)
            prefetch_i8_row(a, t + EMBED_PF_AHEAD);
        if (a->gdtype == DRAY_Q8G32) {
            q8g_row(a->table, a->row_scale, row, a->dim, a->scale, y);
        } else if (a->gdtype) { /* a few rows per step: the reference is plenty */
            dray_cpu_ref_grow(a->gdtype, a->table, a->row_scale, row, a->dim, a->scale, y);
        } else if (a->is_i8) {
            const int8_t *q = (const int8_t *)a->table + row * a->dim;
            float s = a->row_scale[row] * a->scale;
            __m256 vs = _mm256_set1_ps(s);
            for (; i + 8 <= a->dim; i += 8) {
                __m256i qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
                _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_cvtepi32_ps(qi), vs));
            }
            for (; i < a->dim; i++)
                y[i] = (float)q[i] * s;
        } else {
            const float *r = (const float *)a->table + row * a->dim;
            __m256 vs = _mm256_set1_ps(a->scale);
            for (; i + 8 <= a->dim; i += 8)
                _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(r + i), vs));
            for (; i < a->dim; i++)
                y[i] = r[i] * a->scale;
        }
    }
}

void dray_cpu_avx2_rmsnorm(const struct dray_cpu_rmsnorm *a, uint32_t r0, uint32_t r1)
{
    uint32_t n = a->n;
    for (uint32_t r = r0; r < r1; r++) {
        uint32_t t = r / a->n_head, h = r % a->n_head;
        const float *x = a->x + (size_t)t * a->stride_x + (size_t)h * n;
        float *y = a->out + (size_t)t * a->stride_out + (size_t)h * n;
        /* four partial sums of 8 lanes: wide enough for the contract's accuracy */
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        uint32_t i = 0;
        for (; i + 32 <= n; i += 32) {
            __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
            __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
            s0 = _mm256_fmadd_ps(v0, v0, s0);
            s1 = _mm256_fmadd_ps(v1, v1, s1);
            s2 = _mm256_fmadd_ps(v2, v2, s2);
            s3 = _mm256_fmadd_ps(v3, v3, s3);
        }
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            s0 = _mm256_fmadd_ps(v, v, s0);
        }
        double ss = dray_hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
        for (; i < n; i++)
            ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / n + (double)a->eps));
        __m256 vi = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), _mm256_loadu_ps(a->w + i)));
        for (; i < n; i++)
            y[i] = x[i] * inv * a->w[i];
    }
}

/* Angles in double (exact enough for long positions), rotation in f32 FMA.
 * Their cosines and sines come from a->table when the glue keeps one (every
 * layer of a step rotates the same positions), computed into it when fill.
 * Frequency factors and mscale (v4) only change what goes into the table, so
 * the rotation costs the same with or without them. */
void dray_cpu_avx2_rope(const struct dray_cpu_rope *a, uint32_t t0, uint32_t t1)
{
    uint32_t half = a->n_rot / 2;
    if (half > 512) { /* beyond the stack tables: the reference handles it */
        dray_cpu_ref_rope(a, t0, t1);
        return;
    }
    double inv_freq[512];
    float own[1024];
    int compute = !a->table || a->fill;
    for (uint32_t i = 0; compute && i < half; i++)
        inv_freq[i] = dray_cpu_rope_freq(a, i);
    for (uint32_t t = t0; t < t1; t++) {
        float *cs = a->table ? a->table + (size_t)t * 2 * half : own, *sn = cs + half;
        double p = (double)a->pos[t];
        for (uint32_t i = 0; compute && i < half; i++) {
            double th = p * inv_freq[i];
            cs[i] = (float)(cos(th) * a->mscale);
            sn[i] = (float)(sin(th) * a->mscale);
        }
        for (uint32_t h = 0; h < a->n_head; h++) {
            float *v = a->x + (size_t)t * a->stride + (size_t)h * a->head_dim;
            uint32_t i = 0;
            for (; i + 8 <= half; i += 8) {
                __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
                __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
                _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
            }
            for (; i < half; i++) {
                float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * cs[i] - x1 * sn[i];
                v[i + half] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

/* gelu_tanh(x) = 0.5x(1 + tanh(u)) = x * sigmoid(2u): the second form has no
 * cancellation for negative x. silu(x) = x * sigmoid(x). */
DRAY_AI __m256 act8(__m256 x, int silu)
{
    __m256 z = x;
    if (!silu) {
        __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        z = _mm256_mul_ps(_mm256_fmadd_ps(x3, _mm256_set1_ps(0.044715f), x), _mm256_set1_ps(2.0f * 0.7978845608028654f));
    }
    __m256 e = dray_exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static float act1(float x, int silu)
{
    double z = silu ? x : 2.0 * 0.7978845608028654 * (x + 0.044715 * (double)x * x * x);
    return (float)(x / (1.0 + exp(-z)));
}

void dray_cpu_avx2_gated_act(const struct dray_cpu_gated_act *a, uint32_t t0, uint32_t t1)
{
    int silu = a->act == 1;
    for (uint32_t t = t0; t < t1; t++) {
        const float *g = a->gate + (size_t)t * a->stride_gate;
        const float *u = a->up + (size_t)t * a->stride_up;
        float *y = a->out + (size_t)t * a->stride_out;
        uint32_t i = 0;
        for (; i + 8 <= a->n; i += 8) {
            __m256 r = silu ? act8(_mm256_loadu_ps(g + i), 1) : act8(_mm256_loadu_ps(g + i), 0);
            _mm256_storeu_ps(y + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
        }
        for (; i < a->n; i++)
            y[i] = act1(g[i], silu) * u[i];
    }
}
