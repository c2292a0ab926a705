/* Reference embedding gather: out[t][i] = table[ids[t]][i] * row_scale[ids[t]] * scale. */
#include "cpu_kernels.h"

void dray_cpu_ref_embed(const struct dray_cpu_embed *a, uint32_t t0, uint32_t t1)
{
    for (uint32_t t = t0; t < t1; t++) {
        size_t row = (size_t)a->ids[t];
        float *y = a->out + (size_t)t * a->dim;
        if (a->gdtype) {
            dray_cpu_ref_grow(a->gdtype, a->table, a->row_scale, row, a->dim, a->scale, y);
        } else if (a->is_i8) {
            const int8_t *q = (const int8_t *)a->table + row * a->dim;
            float s = a->row_scale[row] * a->scale; /* one rounding, then one multiply */
            for (uint32_t i = 0; i < a->dim; i++)
                y[i] = (float)q[i] * s;
        } else {
            const float *r = (const float *)a->table + row * a->dim;
            for (uint32_t i = 0; i < a->dim; i++)
                y[i] = r[i] * a->scale;
        }
    }
}
