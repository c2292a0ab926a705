/* Reference paged attention: for every query row and head, the scores against
 * every visible position (dequantized K), a softmax with max subtraction in f32,
 * and the weighted sum of dequantized V. Two passes, no tiling: the spec in code. */
#include <math.h>
#include <stdlib.h>

#include "cpu_kernels.h"

size_t dray_cpu_attention_scratch(uint32_t max_kv_len, uint32_t head_dim, uint32_t max_rows)
{
    size_t ref = ((size_t)max_kv_len + 2u * head_dim) * sizeof(float);
    /* AVX2: per row an accumulator [head_dim], a max and a sum; a K/V tile of
     * 32 positions x head_dim floats; scores [max_rows][32]; K scales [32];
     * up to 8 floats of alignment before each of the 6 areas. */
    size_t avx = ((size_t)max_rows * (head_dim + 2u) + 32u * head_dim + (size_t)max_rows * 32u + 64u + 64u) *
                 sizeof(float);
    return (ref > avx ? ref : avx) + 64;
}

/* Slot holding position p of a sequence whose block list starts at bt. */
static size_t slot_of(const struct dray_cpu_kv *p, const int32_t *bt, uint32_t pos)
{
    return (size_t)bt[pos / p->block_size] * p->block_size + pos % p->block_size;
}

/* Dequantize head h of the K or V row in slot into dst[head_dim]. */
static void load_row(const struct dray_cpu_kv *p, int is_v, size_t slot, uint32_t h, float *dst)
{
    size_t row = slot * p->n_kv_head + h;
    const void *base = is_v ? p->v : p->k;
    if (p->is_i8) {
        const int8_t *q = (const int8_t *)base + row * p->head_dim;
        float s = (is_v ? p->v_scale : p->k_scale)[row];
        for (uint32_t i = 0; i < p->head_dim; i++)
            dst[i] = (float)q[i] * s;
    } else {
        const uint16_t *q = (const uint16_t *)base + row * p->head_dim;
        for (uint32_t i = 0; i < p->head_dim; i++)
            dst[i] = dray_util_f16_to_f32(q[i]);
    }
}

static void one_query(const struct dray_cpu_attention *a, const int32_t *bt, uint32_t pos, uint32_t g,
                      const float *q, float *out, float *scores, float *row)
{
    const struct dray_cpu_kv *p = a->pool;
    uint32_t lo = (a->window > 0 && pos + 1 > a->window) ? pos + 1 - a->window : 0;
    float m = -INFINITY;
    for (uint32_t j = lo; j <= pos; j++) {
        load_row(p, 0, slot_of(p, bt, j), g, row);
        float s = 0.0f;
        for (uint32_t i = 0; i < p->head_dim; i++)
            s += q[i] * row[i];
        s *= a->scale;
        scores[j - lo] = s;
        if (s > m)
            m = s;
    }
    float sum = 0.0f;
    for (uint32_t j = lo; j <= pos; j++) {
        scores[j - lo] = expf(scores[j - lo] - m);
        sum += scores[j - lo];
    }
    for (uint32_t i = 0; i < p->head_dim; i++)
        out[i] = 0.0f;
    for (uint32_t j = lo; j <= pos; j++) {
        load_row(p, 1, slot_of(p, bt, j), g, row);
        float w = scores[j - lo] / sum;
        for (uint32_t i = 0; i < p->head_dim; i++)
            out[i] += w * row[i];
    }
}

void dray_cpu_ref_attention(const struct dray_cpu_attention *a, uint32_t i0, uint32_t i1, void *scratch)
{
    const struct dray_cpu_kv *p = a->pool;
    uint32_t group = a->n_head / p->n_kv_head; /* query heads per kv head */
    float *row = scratch;
    float *scores = row + p->head_dim;
    for (uint32_t it = i0; it < i1; it++) {
        const int32_t *sq = a->seqs + (size_t)a->item[it][0] * 4;
        uint32_t q_start = (uint32_t)sq[0], n_q = (uint32_t)sq[1], kv_len = (uint32_t)sq[2];
        const int32_t *bt = a->block_table + sq[3];
        uint32_t g = a->item[it][3];
        for (uint32_t r = a->item[it][1]; r < a->item[it][2]; r++) {
            uint32_t pos = kv_len - n_q + r;
            size_t t = (size_t)q_start + r;
            for (uint32_t h = g * group; h < (g + 1) * group; h++)
                one_query(a, bt, pos, g, a->q + t * a->stride_q + (size_t)h * p->head_dim,
                          a->out + t * a->stride_out + (size_t)h * p->head_dim, scores, row);
        }
    }
}
