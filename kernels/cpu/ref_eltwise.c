/* Reference element-wise ops: gated activation (in double) and residual add. */
#include <math.h>

#include "cpu_kernels.h"

static double act(uint32_t kind, double x)
{
    if (kind == 1) /* DRAY_ACT_SILU */
        return x / (1.0 + exp(-x));
    /* DRAY_ACT_GELU_TANH */
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

void dray_cpu_ref_gated_act(const struct dray_cpu_gated_act *a, uint32_t t0, uint32_t t1)
{
    for (uint32_t t = t0; t < t1; t++) {
        const float *g = a->gate + (size_t)t * a->stride_gate;
        const float *u = a->up + (size_t)t * a->stride_up;
        float *y = a->out + (size_t)t * a->stride_out;
        for (uint32_t i = 0; i < a->n; i++) /* y may alias g or u exactly */
            y[i] = (float)(act(a->act, g[i]) * u[i]);
    }
}

void dray_cpu_ref_add(const float *a, const float *b, float *out, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++)
        out[i] = a[i] + b[i];
}
