/* AVX2 paged attention, one pass with an online softmax (flash style).
 * A work item is one sequence's block of up to DRAY_CPU_ATT_QBLOCK query rows
 * times the query heads that share one kv head, so every K/V row is read from
 * the cache and dequantized once per item and reused by all its query vectors
 * (MQA/GQA). Keys go in tiles of 32 positions: scores for all query vectors,
 * one rescale of the running sums per tile, then the V accumulation. */
#include <math.h>
#include <string.h>

#include "avx2_util.h"
#include "cpu_kernels.h"

#define TILE 32u

/* Dequantize K or V of kv head g for positions j0 .. j0+n-1 into tile[n][hd]. */
static void load_tile(const struct dray_cpu_kv *p, const int32_t *bt, int is_v, uint32_t g, uint32_t j0,
                      uint32_t n, float *tile)
{
    uint32_t hd = p->head_dim;
    const void *base = is_v ? p->v : p->k;
    const float *scales = is_v ? p->v_scale : p->k_scale;
    for (uint32_t jj = 0; jj < n; jj++) {
        uint32_t pos = j0 + jj;
        size_t row = ((size_t)bt[pos / p->block_size] * p->block_size + pos % p->block_size) * p->n_kv_head + g;
        float *dst = tile + (size_t)jj * hd;
        uint32_t i = 0;
        if (p->is_i8) {
            const int8_t *q = (const int8_t *)base + row * hd;
            float s = scales[row];
            __m256 vs = _mm256_set1_ps(s);
            for (; i + 8 <= hd; i += 8) {
                __m256i qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(qi), vs));
            }
            for (; i < hd; i++)
                dst[i] = (float)q[i] * s;
        } else {
            const uint16_t *h = (const uint16_t *)base + row * hd;
            for (; i + 8 <= hd; i += 8)
                _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
            for (; i < hd; i++)
                dst[i] = dray_cpu_f16_to_f32(h[i]);
        }
    }
}

static float dot_f32(const float *a, const float *b, uint32_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = dray_hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* y[0..n) = y * c + sum_j p[j] * tile[j] over the nonzero p[j]. */
static void accum_v(float *y, uint32_t n, float c, const float *p, const float *tile, uint32_t nj)
{
    if (n % 64 == 0) {
        /* 64 dims at a time held in 8 registers across all keys of the tile:
         * one load per FMA instead of a load, an FMA and a store. */
        __m256 vc = _mm256_set1_ps(c);
        for (uint32_t d = 0; d < n; d += 64) {
            __m256 acc[8];
            for (int u = 0; u < 8; u++)
                acc[u] = _mm256_mul_ps(_mm256_loadu_ps(y + d + 8 * u), vc);
            for (uint32_t j = 0; j < nj; j++) {
                if (p[j] == 0.0f)
                    continue;
                __m256 vp = _mm256_set1_ps(p[j]);
                const float *v = tile + (size_t)j * n + d;
                for (int u = 0; u < 8; u++)
                    acc[u] = _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + 8 * u), acc[u]);
            }
            for (int u = 0; u < 8; u++)
                _mm256_storeu_ps(y + d + 8 * u, acc[u]);
        }
        return;
    }
    if (c != 1.0f) {
        __m256 vc = _mm256_set1_ps(c);
        uint32_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vc));
        for (; i < n; i++)
            y[i] *= c;
    }
    for (uint32_t j = 0; j < nj; j++) {
        if (p[j] == 0.0f)
            continue;
        const float *v = tile + (size_t)j * n;
        __m256 vp = _mm256_set1_ps(p[j]);
        uint32_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + i), _mm256_loadu_ps(y + i)));
        for (; i < n; i++)
            y[i] += p[j] * v[i];
    }
}

struct item_state {
    uint32_t rows;       /* query vectors: (query row, head) pairs */
    uint32_t group;      /* heads per kv head */
    uint32_t r0;         /* first query row of the item, relative to the sequence */
    uint32_t first_pos;  /* position of query row 0 of the sequence */
    float *acc, *m, *l, *tile, *sc;
};

static float *align8(float *p)
{
    return (float *)(((uintptr_t)p + 31) & ~(uintptr_t)31);
}

/* Scores of every query vector against keys j0 .. j0+nj-1 (tile holds K), the
 * online-softmax update, with masked keys at probability 0. Returns whether
 * any vector saw a visible key (so V must be accumulated). Fills st->sc with
 * probabilities and cs[r] with each vector's rescale factor. */
static int score_tile(const struct dray_cpu_attention *a, struct item_state *st, const float *const *qv,
                      uint32_t j0, uint32_t nj, float *cs)
{
    uint32_t hd = a->pool->head_dim;
    int any = 0;
    for (uint32_t r = 0; r < st->rows; r++) {
        uint32_t pos = st->first_pos + st->r0 + r / st->group;
        uint32_t lo = (a->window > 0 && pos + 1 > a->window) ? pos + 1 - a->window : 0;
        float *s = st->sc + (size_t)r * TILE;
        float mx = -INFINITY;
        for (uint32_t j = 0; j < TILE; j++) {
            uint32_t p = j0 + j;
            if (j < nj && p >= lo && p <= pos) {
                s[j] = dot_f32(qv[r], st->tile + (size_t)j * hd, hd) * a->scale;
                mx = s[j] > mx ? s[j] : mx;
            } else {
                s[j] = -INFINITY;
            }
        }
        float mnew = mx > st->m[r] ? mx : st->m[r];
        if (mnew == -INFINITY) { /* nothing visible yet: leave the sums alone */
            cs[r] = 1.0f;
            for (uint32_t j = 0; j < TILE; j++)
                s[j] = 0.0f;
            continue;
        }
        cs[r] = st->m[r] == -INFINITY ? 0.0f : expf(st->m[r] - mnew);
        st->m[r] = mnew;
        __m256 vm = _mm256_set1_ps(mnew), sum = _mm256_setzero_ps();
        for (uint32_t j = 0; j < TILE; j += 8) {
            __m256 e = dray_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)); /* -inf -> 0 */
            _mm256_storeu_ps(s + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        st->l[r] = st->l[r] * cs[r] + dray_hsum_ps(sum);
        any |= mx != -INFINITY;
    }
    return any;
}

static void do_item(const struct dray_cpu_attention *a, const uint32_t it[4], void *scratch)
{
    const struct dray_cpu_kv *p = a->pool;
    uint32_t hd = p->head_dim, group = a->n_head / p->n_kv_head;
    const int32_t *sq = a->seqs + (size_t)it[0] * 4;
    uint32_t q_start = (uint32_t)sq[0], n_q = (uint32_t)sq[1], kv_len = (uint32_t)sq[2];
    const int32_t *bt = a->block_table + sq[3];
    uint32_t g = it[3];
    struct item_state st = {.rows = (it[2] - it[1]) * group, .group = group, .r0 = it[1], .first_pos = kv_len - n_q};
    st.acc = align8(scratch);
    st.m = align8(st.acc + (size_t)st.rows * hd);
    st.l = align8(st.m + st.rows);
    st.tile = align8(st.l + st.rows);
    st.sc = align8(st.tile + (size_t)TILE * hd);
    memset(st.acc, 0, (size_t)st.rows * hd * sizeof(float));
    const float *qv[DRAY_CPU_ATT_QBLOCK * 64];
    float cs[DRAY_CPU_ATT_QBLOCK * 64];
    for (uint32_t r = 0; r < st.rows; r++) {
        st.m[r] = -INFINITY;
        st.l[r] = 0.0f;
        size_t t = (size_t)q_start + it[1] + r / group;
        qv[r] = a->q + t * a->stride_q + (size_t)(g * group + r % group) * hd;
    }
    uint32_t pos_lo = st.first_pos + it[1], pos_hi = st.first_pos + it[2] - 1;
    uint32_t j_lo = (a->window > 0 && pos_lo + 1 > a->window) ? pos_lo + 1 - a->window : 0;
    for (uint32_t j0 = j_lo; j0 <= pos_hi; j0 += TILE) {
        uint32_t nj = pos_hi + 1 - j0 < TILE ? pos_hi + 1 - j0 : TILE;
        load_tile(p, bt, 0, g, j0, nj, st.tile);
        if (!score_tile(a, &st, qv, j0, nj, cs))
            continue;
        load_tile(p, bt, 1, g, j0, nj, st.tile);
        for (uint32_t r = 0; r < st.rows; r++)
            accum_v(st.acc + (size_t)r * hd, hd, cs[r], st.sc + (size_t)r * TILE, st.tile, nj);
    }
    for (uint32_t r = 0; r < st.rows; r++) {
        size_t t = (size_t)q_start + it[1] + r / group;
        float *o = a->out + t * a->stride_out + (size_t)(g * group + r % group) * hd;
        float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
        for (uint32_t i = 0; i < hd; i++)
            o[i] = st.acc[(size_t)r * hd + i] * inv;
    }
}

void dray_cpu_avx2_attention(const struct dray_cpu_attention *a, uint32_t i0, uint32_t i1, void *scratch)
{
    uint32_t group = a->n_head / a->pool->n_kv_head;
    if (group > 64) { /* more query vectors than the stack arrays hold */
        dray_cpu_ref_attention(a, i0, i1, scratch);
        return;
    }
    for (uint32_t i = i0; i < i1; i++)
        do_item(a, a->item[i], scratch);
}
