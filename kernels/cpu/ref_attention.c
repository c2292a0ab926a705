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

/* Query q at position pos against the visible keys of chunk c of n: out the
 * normalized result (n = 1), or the chunk's partial sums (acc not divided, its
 * max *m and probability sum *l; cpu_kernels.h, struct dray_cpu_attention). */
static void one_query(const struct dray_cpu_attention *a, const int32_t *bt, uint32_t pos, uint32_t g,
                      uint32_t c, uint32_t n, const float *q, float *out, float *m_out, float *l_out,
                      float *scores, float *row)
{
    const struct dray_cpu_kv *p = a->pool;
    uint32_t lo = dray_cpu_att_lo(pos, a->window), k0, k1;
    dray_cpu_att_chunk(lo, pos, c, n, &k0, &k1);
    float m = -INFINITY;
    for (uint32_t j = k0; j < k1; j++) {
        load_row(p, 0, slot_of(p, bt, j), g, row);
        float s = 0.0f;
        for (uint32_t i = 0; i < p->head_dim; i++)
            s += q[i] * row[i];
        s *= a->scale;
        if (a->softcap > 0.0f)
            s = dray_cpu_softcap(s, a->softcap);
        scores[j - k0] = s;
        if (s > m)
            m = s;
    }
    float sum = 0.0f;
    for (uint32_t j = k0; j < k1; j++) {
        scores[j - k0] = expf(scores[j - k0] - m);
        sum += scores[j - k0];
    }
    for (uint32_t i = 0; i < p->head_dim; i++)
        out[i] = 0.0f;
    for (uint32_t j = k0; j < k1; j++) {
        load_row(p, 1, slot_of(p, bt, j), g, row);
        float w = n == 1 ? scores[j - k0] / sum : scores[j - k0];
        for (uint32_t i = 0; i < p->head_dim; i++)
            out[i] += w * row[i];
    }
    if (n > 1) {
        *m_out = m;
        *l_out = sum;
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
        uint32_t g = a->item[it][3], c = a->item[it][4], n = a->item[it][5];
        float *part = n > 1 ? a->part + it * a->part_stride : NULL; /* one row: group heads */
        for (uint32_t r = a->item[it][1]; r < a->item[it][2]; r++) {
            uint32_t pos = kv_len - n_q + r;
            size_t t = (size_t)q_start + r;
            for (uint32_t h = g * group; h < (g + 1) * group; h++) {
                uint32_t j = h - g * group;
                float *o = part ? part + (size_t)j * p->head_dim : a->out + t * a->stride_out + (size_t)h * p->head_dim;
                one_query(a, bt, pos, g, c, n, a->q + t * a->stride_q + (size_t)h * p->head_dim, o,
                          part ? part + (size_t)group * p->head_dim + j : NULL,
                          part ? part + (size_t)group * (p->head_dim + 1) + j : NULL, scores, row);
            }
        }
    }
}
