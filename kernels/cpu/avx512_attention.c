/* AVX-512 paged attention. Items of 16 or more query vectors (prefill, and
 * decode under a wide GQA group) run with the query vectors in the lanes:
 *   Q is transposed once per item to qt[d][row], so a score tile is
 *   s[key][row] = sum_d qt[d][row] * k[key][d], 16 rows per FMA with the key
 *   element broadcast: no horizontal reductions, and the online softmax runs
 *   16 rows a vector (max, rescale and sum per row are lane-wise);
 *   the output is kept transposed too, ot[d][row] = ot*c + sum_key p[key][row]
 *   * v[key][d], the same outer-product kernel with the V element broadcast,
 *   and its rescale by c is one multiply per vector.
 * Narrower items (a decode row of MQA/GQA's 1-9 heads) take the 2-row dot
 * product code of avx2_attention.c, built here with 16-lane steps
 * (DRAY_ATT_512); the tiles, masking and flushing rules are that file's. */
#define DRAY_ATT_512 1
#define DRAY_ATT_ENTRY narrow_attention
#define DRAY_ATT_STATIC static
#include "avx2_attention.c"

#define LANES 16u
#define VMAX 4u /* row vectors a kernel call holds: 4 x 16 rows */

/* c[k][v] = (init ? c[k][v] * sc[v] : 0) + sum_t x[t][v] * y[k * yk + t * yt]
 * for k < KB keys/dims and v < NV row vectors; rows of x and c are xs floats
 * apart. NV * KB accumulators stay in registers over all t. */
#define DEFINE_OUTER(NV, KB)                                                                             \
    static void outer_##NV##x##KB(const float *x, size_t xs, const float *y, size_t yk, size_t yt,       \
                                  uint32_t nt, float *c, const __m512 *sc)                               \
    {                                                                                                    \
        __m512 acc[KB][NV];                                                                              \
        _Pragma("GCC unroll 8") for (int k = 0; k < KB; k++) _Pragma("GCC unroll 4") for (int v = 0;     \
                                                                                      v < NV; v++)      \
            acc[k][v] = sc ? _mm512_mul_ps(_mm512_loadu_ps(c + k * xs + LANES * v), sc[v])              \
                           : _mm512_setzero_ps();                                                        \
        for (uint32_t t = 0; t < nt; t++, x += xs, y += yt) {                                            \
            __m512 xv[NV];                                                                               \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) xv[v] = _mm512_loadu_ps(x + LANES * v); \
            _Pragma("GCC unroll 8") for (int k = 0; k < KB; k++)                                        \
            {                                                                                            \
                __m512 b = _mm512_set1_ps(y[k * yk]);                                                    \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[k][v] =                        \
                    _mm512_fmadd_ps(xv[v], b, acc[k][v]);                                                \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 8") for (int k = 0; k < KB; k++) _Pragma("GCC unroll 4") for (int v = 0;     \
                                                                                      v < NV; v++)      \
            _mm512_storeu_ps(c + k * xs + LANES * v, acc[k][v]);                                         \
    }
#define DEFINE_OUTER_NV(NV) DEFINE_OUTER(NV, 1) DEFINE_OUTER(NV, 2) DEFINE_OUTER(NV, 4)
DEFINE_OUTER_NV(1)
DEFINE_OUTER_NV(2)
DEFINE_OUTER_NV(3)
DEFINE_OUTER_NV(4)
DEFINE_OUTER(1, 8)
DEFINE_OUTER(2, 8)
DEFINE_OUTER(3, 8)

typedef void (*outer_fn)(const float *, size_t, const float *, size_t, size_t, uint32_t, float *, const __m512 *);
/* [NV - 1][log2 KB]: KB 8 only where NV * 8 accumulators fit (NV <= 3) */
static const outer_fn OUTER[VMAX][4] = {
    {outer_1x1, outer_1x2, outer_1x4, outer_1x8},
    {outer_2x1, outer_2x2, outer_2x4, outer_2x8},
    {outer_3x1, outer_3x2, outer_3x4, outer_3x8},
    {outer_4x1, outer_4x2, outer_4x4, outer_4x4},
};

/* The outer products for nk keys/dims (c rows k0 .. k0+nk-1) and nv row
 * vectors, in blocks of the widest kernel that fits, then narrower ones. */
static void outer(uint32_t nv, const float *x, size_t xs, const float *y, size_t yk, size_t yt, uint32_t nt,
                  float *c, uint32_t nk, const __m512 *sc)
{
    for (uint32_t v0 = 0; v0 < nv; v0 += VMAX) {
        uint32_t n = nv - v0 < VMAX ? nv - v0 : VMAX, k = 0;
        for (int lg = 3; lg >= 0; lg--) {
            uint32_t kb = 1u << lg;
            if (lg == 3 && n == 4)
                continue;
            for (; k + kb <= nk; k += kb)
                OUTER[n - 1][lg](x + LANES * v0, xs, y + k * yk, yk, yt, nt, c + k * xs + LANES * v0,
                                 sc ? sc + v0 : NULL);
        }
    }
}

/* e^x for 16 floats: dray_exp_ps's steps, lane for lane the same results. */
DRAY_AI __m512 exp512(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(126)), 23);
    return _mm512_mul_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(e)), _mm512_set1_ps(2.0f));
}

struct wide_state {
    uint32_t rows, nv, stride; /* query vectors, their 16-row vectors, floats a row of qt/ot/s */
    float *qt, *ot, *s, *tile, *ksc;
    int32_t *lo, *hi;   /* each row's visible keys [lo, hi] */
    float *m, *l;       /* running max and sum per row */
};

/* The online-softmax update of the tile's keys j0 .. j0+31 from the raw scores
 * in s[key][row], lane-wise over rows: s becomes the probabilities (exactly 0
 * outside a row's [lo, hi] and below e^FLUSH of its max), cs[v] each row
 * vector's rescale factor. Returns whether any row saw a visible key. */
static int wide_softmax(const struct dray_cpu_attention *a, struct wide_state *w, uint32_t j0, __m512 *cs)
{
    __mmask16 any = 0;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), flush = _mm512_set1_ps(FLUSH);
    for (uint32_t v = 0; v < w->nv; v++) {
        __m512i lo = _mm512_loadu_si512(w->lo + LANES * v), hi = _mm512_loadu_si512(w->hi + LANES * v);
        float *s = w->s + LANES * v;
        __m512 mx = ninf;
        for (uint32_t j = 0; j < TILE; j++) {
            __m512i jj = _mm512_set1_epi32((int32_t)(j0 + j));
            __mmask16 vis = _mm512_cmple_epi32_mask(lo, jj) & _mm512_cmple_epi32_mask(jj, hi);
            __m512 x = _mm512_mask_mul_ps(ninf, vis, _mm512_loadu_ps(s + (size_t)j * w->stride),
                                          _mm512_set1_ps(a->scale * w->ksc[j]));
            _mm512_storeu_ps(s + (size_t)j * w->stride, x);
            mx = _mm512_max_ps(mx, x);
            any |= vis;
        }
        __m512 m_old = _mm512_loadu_ps(w->m + LANES * v), m_new = _mm512_max_ps(m_old, mx);
        /* rows with nothing visible yet keep m = -inf: their differences are
         * NaN, which the ordered compares turn into c = 0 and p = 0 */
        __m512 d = _mm512_sub_ps(m_old, m_new);
        cs[v] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d, flush, _CMP_GE_OQ), exp512(d));
        __m512 sum = _mm512_setzero_ps();
        for (uint32_t j = 0; j < TILE; j++) {
            __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + (size_t)j * w->stride), m_new);
            __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, flush, _CMP_GE_OQ), exp512(x));
            sum = _mm512_add_ps(sum, e);
            _mm512_storeu_ps(s + (size_t)j * w->stride, e);
        }
        _mm512_storeu_ps(w->m + LANES * v, m_new);
        _mm512_storeu_ps(w->l + LANES * v, _mm512_fmadd_ps(_mm512_loadu_ps(w->l + LANES * v), cs[v], sum));
    }
    return any != 0;
}

static float *align16(float *p)
{
    return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

static void wide_item(const struct dray_cpu_attention *a, uint32_t i, void *scratch)
{
    const uint32_t *it = a->item[i];
    const struct dray_cpu_kv *p = a->pool;
    uint32_t hd = p->head_dim, group = a->n_head / p->n_kv_head, g = it[3];
    const int32_t *sq = a->seqs + (size_t)it[0] * 4;
    uint32_t q_start = (uint32_t)sq[0], n_q = (uint32_t)sq[1], kv_len = (uint32_t)sq[2];
    uint32_t first_pos = kv_len - n_q;
    const int32_t *bt = a->block_table + sq[3];
    struct wide_state w = {.rows = (it[2] - it[1]) * group};
    w.nv = (w.rows + LANES - 1) / LANES;
    w.stride = w.nv * LANES;
    w.qt = align16(scratch);
    w.ot = align16(w.qt + (size_t)hd * w.stride);
    w.s = align16(w.ot + (size_t)hd * w.stride);
    w.tile = align16(w.s + (size_t)TILE * w.stride);
    w.ksc = align16(w.tile + (size_t)TILE * hd);
    w.m = align16(w.ksc + TILE);
    w.l = align16(w.m + w.stride);
    w.lo = (int32_t *)align16(w.l + w.stride);
    w.hi = w.lo + w.stride;
    memset(w.qt, 0, (size_t)hd * w.stride * sizeof(float));
    memset(w.ot, 0, (size_t)hd * w.stride * sizeof(float));
    for (uint32_t r = 0; r < w.stride; r++) {
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
        w.lo[r] = 1, w.hi[r] = 0; /* padding rows see nothing */
    }
    for (uint32_t r = 0; r < w.rows; r++) {
        size_t t = (size_t)q_start + it[1] + r / group;
        const float *q = a->q + t * a->stride_q + (size_t)(g * group + r % group) * hd;
        for (uint32_t d = 0; d < hd; d++)
            w.qt[(size_t)d * w.stride + r] = q[d];
        uint32_t pos = first_pos + it[1] + r / group;
        w.lo[r] = (int32_t)dray_cpu_att_lo(pos, a->window), w.hi[r] = (int32_t)pos;
    }
    uint32_t pos_lo = first_pos + it[1], pos_hi = first_pos + it[2] - 1;
    uint32_t j_lo = dray_cpu_att_lo(pos_lo, a->window), j_end = pos_hi + 1;
    if (it[5] > 1)
        dray_cpu_att_chunk(j_lo, pos_hi, it[4], it[5], &j_lo, &j_end);
    __m512 cs[64];
    for (uint32_t j0 = j_lo; j0 < j_end; j0 += TILE) {
        uint32_t nj = j_end - j0 < TILE ? j_end - j0 : TILE;
        size_t rows[TILE];
        tile_rows(p, bt, g, j0, nj, rows);
        load_kscales(p, rows, nj, w.ksc);
        load_tile(p, rows, 0, nj, w.tile);
        outer(w.nv, w.qt, w.stride, w.tile, hd, 1, hd, w.s, TILE, NULL);
        if (!wide_softmax(a, &w, j0, cs))
            continue;
        load_tile(p, rows, 1, nj, w.tile);
        outer(w.nv, w.s, w.stride, w.tile, 1, hd, nj, w.ot, hd, cs);
    }
    if (it[5] > 1) { /* the chunk's partial sums, merged by the glue */
        float *part = a->part + i * a->part_stride;
        for (uint32_t r = 0; r < w.rows; r++)
            for (uint32_t d = 0; d < hd; d++)
                part[(size_t)r * hd + d] = w.ot[(size_t)d * w.stride + r];
        memcpy(part + (size_t)w.rows * hd, w.m, w.rows * sizeof(float));
        memcpy(part + (size_t)w.rows * (hd + 1), w.l, w.rows * sizeof(float));
        return;
    }
    for (uint32_t r = 0; r < w.rows; r++) {
        size_t t = (size_t)q_start + it[1] + r / group;
        float *o = a->out + t * a->stride_out + (size_t)(g * group + r % group) * hd;
        float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;
        for (uint32_t d = 0; d < hd; d++)
            o[d] = w.ot[(size_t)d * w.stride + r] * inv;
    }
}

void dray_cpu_avx512_attention(const struct dray_cpu_attention *a, uint32_t i0, uint32_t i1, void *scratch)
{
    uint32_t group = a->n_head / a->pool->n_kv_head;
    if (group > 64) { /* more query vectors than the stack arrays hold */
        dray_cpu_ref_attention(a, i0, i1, scratch);
        return;
    }
    for (uint32_t i = i0; i < i1; i++) {
        if ((a->item[i][2] - a->item[i][1]) * group >= LANES)
            wide_item(a, i, scratch);
        else
            narrow_attention(a, i, i + 1, scratch);
    }
}
