/* Reference rotary embedding (NEOX layout): the angle and its sine/cosine are
 * computed in double, so long positions keep their accuracy. Version 4: each
 * pair's angle divided by its frequency factor, cos and sin scaled by mscale. */
#include <math.h>

#include "cpu_kernels.h"

void dray_cpu_ref_rope(const struct dray_cpu_rope *a, uint32_t t0, uint32_t t1)
{
    uint32_t half = a->n_rot / 2;
    for (uint32_t t = t0; t < t1; t++) {
        double p = (double)a->pos[t];
        for (uint32_t h = 0; h < a->n_head; h++) {
            float *v = a->x + (size_t)t * a->stride + (size_t)h * a->head_dim;
            for (uint32_t i = 0; i < half; i++) {
                double theta = p * dray_cpu_rope_freq(a, i);
                double c = cos(theta) * a->mscale, s = sin(theta) * a->mscale;
                double x0 = v[i], x1 = v[i + half];
                v[i] = (float)(x0 * c - x1 * s);
                v[i + half] = (float)(x0 * s + x1 * c);
            }
        }
    }
}
