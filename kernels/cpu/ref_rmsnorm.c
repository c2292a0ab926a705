/* Reference RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, sum of squares in double. */
#include <math.h>

#include "cpu_kernels.h"

void dray_cpu_ref_rmsnorm(const struct dray_cpu_rmsnorm *a, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r++) {
        uint32_t t = r / a->n_head, h = r % a->n_head;
        const float *x = a->x + (size_t)t * a->stride_x + (size_t)h * a->n;
        float *y = a->out + (size_t)t * a->stride_out + (size_t)h * a->n;
        double ss = 0.0;
        for (uint32_t i = 0; i < a->n; i++)
            ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / a->n + (double)a->eps));
        for (uint32_t i = 0; i < a->n; i++) /* y may alias x: read x[i] before writing y[i] */
            y[i] = x[i] * inv * a->w[i];
    }
}
