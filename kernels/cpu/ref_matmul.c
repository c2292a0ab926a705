/* Reference matmul. I8 (W8A8): per-token symmetric activation quantization, exact
 * int32 dot products, then the f32 scale product and f32 outlier channels.
 * F32: plain dot products (accumulated in double here, the most accurate truth). */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

/* Is channel c one of the (strictly increasing) outlier channels? */
static int is_outlier(const struct dray_cpu_matmul *a, uint32_t c)
{
    for (uint32_t j = 0; j < a->n_outlier; j++)
        if ((uint32_t)a->outlier_idx[j] == c)
            return 1;
    return 0;
}

void dray_cpu_ref_quantize(const struct dray_cpu_matmul *a, uint32_t t0, uint32_t t1)
{
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = a->x + (size_t)t * a->stride_x;
        int8_t *q = a->q + (size_t)t * a->q_stride;
        float amax = 0.0f;
        for (uint32_t c = 0; c < a->k; c++)
            if (!is_outlier(a, c) && fabsf(x[c]) > amax)
                amax = fabsf(x[c]);
        float sx = amax / 127.0f;
        memset(q, 0, a->q_stride);
        a->sx[t] = sx;
        if (sx == 0.0f)
            continue;
        for (uint32_t c = 0; c < a->k; c++) {
            if (is_outlier(a, c))
                continue;
            float v = nearbyintf(x[c] / sx); /* default rounding mode: nearest, ties to even */
            if (v > 127.0f)
                v = 127.0f;
            if (v < -127.0f)
                v = -127.0f;
            q[c] = (int8_t)v;
        }
    }
}

void dray_cpu_ref_matmul(const struct dray_cpu_matmul *a, uint32_t o0, uint32_t o1)
{
    for (uint32_t t = 0; t < a->n_tok; t++) {
        float *y = a->out + (size_t)t * a->stride_out;
        for (uint32_t o = o0; o < o1; o++) {
            float v;
            if (a->is_i8) {
                const int8_t *w = (const int8_t *)a->w + (size_t)o * a->k;
                const int8_t *q = a->q + (size_t)t * a->q_stride;
                int32_t isum = 0;
                for (uint32_t c = 0; c < a->k; c++)
                    isum += (int32_t)q[c] * w[c];
                v = dray_cpu_mm_finish(a, t, o, isum);
            } else {
                const float *w = (const float *)a->w + (size_t)o * a->k;
                const float *x = a->x + (size_t)t * a->stride_x;
                double s = 0.0;
                for (uint32_t c = 0; c < a->k; c++)
                    s += (double)x[c] * w[c];
                v = (float)s;
            }
            y[o] = a->accumulate ? y[o] + v : v;
        }
    }
}
