/*
 * attention.cu — paged attention over a mixed prefill/decode batch
 * (backend.h, struct dray_attention_args).
 *
 * Work split, all decided on the device so the op never waits for the host
 * (and can be captured into a graph):
 *  - k_att_plan (one thread): per sequence, the number of row blocks
 *    ceil(n_q * G / NW) (G = query heads per kv head, NW = warps per block, one
 *    (query token, group head) row per warp) as a prefix sum, and a split
 *    count: a sequence whose rows fit one block (decode) is split over its KV
 *    range into up to max_split parts (split-K); others are not split.
 *  - k_att (grid: row blocks x splits x kv heads): flash style. The block walks
 *    its KV range in tiles of BK keys; each tile is gathered through the block
 *    table, dequantized once (int8 * per-token-per-head scale, or f16) into
 *    shared memory and used by all NW rows — for MQA/GQA those are the query
 *    heads that share the kv head, so each KV block is read once per block.
 *    Per row an online softmax (running max m, sum l, unnormalized acc) in f32.
 *    Scores: lane j of the warp takes key j of the tile; outputs: lane owns
 *    dims lane, lane + W, ... . Unsplit rows write out; split rows write
 *    (acc, m, l) partials to scratch.
 *  - k_att_reduce: merges the partials of split sequences.
 * Only positions some row of the block attends are gathered (the union of the
 * rows' causal/window ranges is one interval), so -1 block entries outside the
 * mask are never read; one inside it is skipped and flagged.
 */
#include "gpu_common.cuh"

#define ATT_NW (256 / GPU_WARP)                 /* warps (rows) per block */
#define ATT_DPL (GK_ATT_MAX_HEAD_DIM / GPU_WARP) /* head dims per lane */
#define ATT_SMEM_KV_FLOATS 8192u                /* K + V tile budget */
#define ATT_SPLIT_KEYS 256                      /* min keys per decode split */

static inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static inline size_t att_plan_bytes(uint32_t n_seq)
{
    return round_up(((size_t)2 * n_seq + 1) * sizeof(int32_t), 256);
}

extern "C" size_t dray_gk_attention_scratch(uint32_t n_seq, uint32_t n_kv_head, uint32_t head_dim,
                                            uint32_t max_split)
{
    size_t part = 0;
    if (max_split > 1)
        part = (size_t)n_seq * max_split * n_kv_head * ATT_NW * (head_dim + 2) * sizeof(float);
    return att_plan_bytes(n_seq) + part;
}

static inline uint32_t att_bk(uint32_t d)
{
    uint32_t bk = ATT_SMEM_KV_FLOATS / (2 * d + 1);
    return bk > 64 ? 64 : (bk < 1 ? 1 : bk);
}

/* ------------------------------------------------------------------ plan */

struct att_seq {
    int32_t q_start, n_q, kv_len, bt_start;
    bool ok;
};

static __device__ struct att_seq att_read_seq(const struct gk_attention &p, uint32_t s)
{
    struct att_seq r;
    r.q_start = p.seqs[4 * s];
    r.n_q = p.seqs[4 * s + 1];
    r.kv_len = p.seqs[4 * s + 2];
    r.bt_start = p.seqs[4 * s + 3];
    r.ok = r.q_start >= 0 && r.n_q >= 0 && r.kv_len >= r.n_q && r.bt_start >= 0 &&
           (int64_t)r.q_start + r.n_q <= (int64_t)p.n_tok;
    if (!r.ok)
        r.n_q = 0;
    return r;
}

/* rb_start[n_seq + 1]: first row block of each sequence; nsplit[n_seq]. */
static __global__ void k_att_plan(struct gk_attention p, int32_t *rb_start, int32_t *nsplit, uint32_t g)
{
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    int32_t acc = 0;
    for (uint32_t s = 0; s < p.n_seq; s++) {
        const struct att_seq q = att_read_seq(p, s);
        if (!q.ok)
            atomicOr(p.flag, (unsigned)GK_FLAG_ATT_SEQ);
        const int64_t rows = (int64_t)q.n_q * g;
        const int32_t nrb = (int32_t)((rows + ATT_NW - 1) / ATT_NW);
        int32_t ns = 1;
        if (nrb == 1 && p.max_split > 1) {
            int64_t lo = p.window ? (int64_t)q.kv_len - q.n_q - p.window + 1 : 0;
            int64_t len = q.kv_len - (lo > 0 ? lo : 0);
            int64_t want = (len + ATT_SPLIT_KEYS - 1) / ATT_SPLIT_KEYS;
            ns = (int32_t)(want < 1 ? 1 : (want > p.max_split ? p.max_split : want));
        }
        rb_start[s] = acc;
        nsplit[s] = ns;
        acc += nrb;
    }
    rb_start[p.n_seq] = acc;
}

/* ------------------------------------------------------------ main kernel */

static __device__ __forceinline__ float att_load(const struct gk_pool &pl, bool is_k, size_t row,
                                                 uint32_t d)
{
    const size_t e = row * pl.head_dim + d;
    if (pl.is_i8) {
        const int8_t *src = (const int8_t *)(is_k ? pl.k : pl.v);
        return (float)src[e] * (is_k ? pl.k_scale : pl.v_scale)[row];
    }
    return f16_bits_to_f32(((const uint16_t *)(is_k ? pl.k : pl.v))[e]);
}

static __device__ int32_t att_find_seq(const int32_t *rb_start, uint32_t n_seq, uint32_t bx)
{
    uint32_t lo = 0, hi = n_seq; /* last s with rb_start[s] <= bx */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if ((uint32_t)rb_start[mid] <= bx)
            lo = mid;
        else
            hi = mid;
    }
    return (int32_t)lo;
}

static __global__ void __launch_bounds__(256) k_att(struct gk_attention p, const int32_t *rb_start,
                                                    const int32_t *nsplit, float *part, uint32_t g,
                                                    uint32_t bk)
{
    extern __shared__ float sm[];
    const uint32_t d = p.pool.head_dim, nkh = p.pool.n_kv_head;
    float *kt = sm;                     /* [bk][d + 1]: pitch d+1, lane-per-key reads spread */
    float *vt = kt + bk * (d + 1);      /* [bk][d] */
    float *qs = vt + bk * d;            /* [NW][d], pre-scaled */
    float *ps = qs + ATT_NW * d;        /* [NW][bk] scores, then probabilities */
    int32_t *kslot = (int32_t *)(ps + ATT_NW * bk); /* [bk] pool row of key j, -1 = skip */

    const uint32_t bx = blockIdx.x, split = blockIdx.y, kvh = blockIdx.z;
    if (bx >= (uint32_t)rb_start[p.n_seq])
        return;
    const uint32_t s = (uint32_t)att_find_seq(rb_start, p.n_seq, bx);
    const uint32_t ns = (uint32_t)nsplit[s];
    if (split >= ns)
        return;
    const struct att_seq sq = att_read_seq(p, s);
    const uint32_t lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP;
    const uint32_t rows = (uint32_t)sq.n_q * g, r0 = (bx - (uint32_t)rb_start[s]) * ATT_NW;
    const uint32_t r = r0 + warp;
    const bool active = r < rows;
    const uint32_t r_last = min(r0 + ATT_NW, rows) - 1;
    const int32_t pos0 = sq.kv_len - sq.n_q; /* position of query 0 */
    const int32_t my_pos = pos0 + (int32_t)(r / g);
    const uint32_t h = kvh * g + r % g, tok = (uint32_t)sq.q_start + r / g;

    /* the block's key interval [lo, hi], then this split's share of it */
    const int32_t pmin = pos0 + (int32_t)(r0 / g), pmax = pos0 + (int32_t)(r_last / g);
    int32_t lo = p.window ? pmin - (int32_t)p.window + 1 : 0;
    lo = lo < 0 ? 0 : lo;
    const int32_t len = pmax - lo + 1;
    const int32_t chunk = (len + (int32_t)ns - 1) / (int32_t)ns;
    const int32_t kbeg = lo + (int32_t)split * chunk;
    const int32_t kend = min(pmax + 1, kbeg + chunk);

    if (active) {
        const float *qr = p.q + (size_t)tok * p.stride_q + (size_t)h * d;
        for (uint32_t i = lane; i < d; i += GPU_WARP)
            qs[warp * d + i] = qr[i] * p.scale;
    }
    float m = -INFINITY, l = 0.0f, acc[ATT_DPL];
#pragma unroll
    for (int e = 0; e < ATT_DPL; e++)
        acc[e] = 0.0f;

    for (int32_t t0 = kbeg; t0 < kend; t0 += (int32_t)bk) {
        const uint32_t nk = (uint32_t)min((int32_t)bk, kend - t0);
        __syncthreads(); /* previous tile fully consumed (and qs written, first time) */
        if (threadIdx.x < nk) { /* resolve the block table once per key */
            const int32_t pos = t0 + (int32_t)threadIdx.x;
            const int64_t bi = (int64_t)sq.bt_start + pos / (int32_t)p.pool.block_size;
            const int32_t ent = bi < (int64_t)p.n_bt ? p.block_table[bi] : -1;
            const int64_t slot = (int64_t)ent * p.pool.block_size + pos % (int32_t)p.pool.block_size;
            int32_t row = -1;
            if (ent < 0 || bi >= (int64_t)p.n_bt)
                atomicOr(p.flag, (unsigned)(ent < 0 ? GK_FLAG_ATT_HOLE : GK_FLAG_ATT_SLOT));
            else if (slot >= (int64_t)p.pool.n_slots)
                atomicOr(p.flag, (unsigned)GK_FLAG_ATT_SLOT);
            else
                row = (int32_t)(slot * nkh + kvh);
            kslot[threadIdx.x] = row;
        }
        __syncthreads();
        for (uint32_t idx = threadIdx.x; idx < nk * d; idx += blockDim.x) {
            const uint32_t j = idx / d, i = idx % d;
            const int32_t row = kslot[j];
            kt[j * (d + 1) + i] = row < 0 ? 0.0f : att_load(p.pool, true, (size_t)row, i);
            vt[j * d + i] = row < 0 ? 0.0f : att_load(p.pool, false, (size_t)row, i);
        }
        __syncthreads();
        if (!active)
            continue;
        /* scores, lane per key */
        float mt = -INFINITY;
        for (uint32_t j = lane; j < nk; j += GPU_WARP) {
            const int32_t pos = t0 + (int32_t)j;
            const bool ok = kslot[j] >= 0 && pos <= my_pos &&
                            (p.window == 0 || my_pos - pos < (int32_t)p.window);
            float sc = -INFINITY;
            if (ok) {
                const float *kr = kt + j * (d + 1), *qr = qs + warp * d;
                sc = 0.0f;
                for (uint32_t i = 0; i < d; i++)
                    sc += qr[i] * kr[i];
                if (p.softcap > 0.0f) /* v4, Gemma 2: q is pre-scaled, so sc = scale * q.k */
                    sc = p.softcap * tanhf(sc / p.softcap);
            }
            ps[warp * bk + j] = sc;
            mt = fmaxf(mt, sc);
        }
        mt = warp_max(mt);
        const float m_new = fmaxf(m, mt);
        if (m_new == -INFINITY) /* nothing visible yet for this row */
            continue;
        const float alpha = expf(m - m_new); /* 0 when m was -inf */
        float lsum = 0.0f;
        for (uint32_t j = lane; j < nk; j += GPU_WARP) {
            const float pj = expf(ps[warp * bk + j] - m_new);
            ps[warp * bk + j] = pj;
            lsum += pj;
        }
        GPU_SYNCWARP();
        l = l * alpha + warp_sum(lsum);
        m = m_new;
#pragma unroll
        for (int e = 0; e < ATT_DPL; e++) {
            const uint32_t i = lane + (uint32_t)e * GPU_WARP;
            if (i < d) {
                float a = acc[e] * alpha;
                for (uint32_t j = 0; j < nk; j++)
                    a += ps[warp * bk + j] * vt[j * d + i];
                acc[e] = a;
            }
        }
        GPU_SYNCWARP(); /* ps is rewritten by the next tile */
    }
    if (!active)
        return;
    if (ns == 1) {
        float *o = p.out + (size_t)tok * p.stride_out + (size_t)h * d;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int e = 0; e < ATT_DPL; e++) {
            const uint32_t i = lane + (uint32_t)e * GPU_WARP;
            if (i < d)
                o[i] = acc[e] * inv;
        }
    } else {
        float *pr = part + (((size_t)s * p.max_split + split) * nkh + kvh) * ATT_NW * (d + 2) +
                    (size_t)warp * (d + 2);
#pragma unroll
        for (int e = 0; e < ATT_DPL; e++) {
            const uint32_t i = lane + (uint32_t)e * GPU_WARP;
            if (i < d)
                pr[i] = acc[e];
        }
        if (lane == 0) {
            pr[d] = m;
            pr[d + 1] = l;
        }
    }
}

/* ---------------------------------------------------------------- reduce */

/* grid (n_seq, n_kv_head); warp w merges row w of a split sequence. */
static __global__ void k_att_reduce(struct gk_attention p, const int32_t *nsplit, const float *part,
                                    uint32_t g)
{
    const uint32_t s = blockIdx.x, kvh = blockIdx.y, d = p.pool.head_dim, nkh = p.pool.n_kv_head;
    const uint32_t ns = (uint32_t)nsplit[s];
    if (ns <= 1)
        return;
    const struct att_seq sq = att_read_seq(p, s);
    const uint32_t lane = threadIdx.x % GPU_WARP, r = threadIdx.x / GPU_WARP;
    if (r >= (uint32_t)sq.n_q * g)
        return;
    const size_t pitch = (size_t)nkh * ATT_NW * (d + 2); /* between splits */
    const float *base = part + ((size_t)s * p.max_split * nkh + kvh) * ATT_NW * (d + 2) +
                        (size_t)r * (d + 2);
    float mx = -INFINITY;
    for (uint32_t k = 0; k < ns; k++)
        mx = fmaxf(mx, base[k * pitch + d]);
    float l = 0.0f;
    for (uint32_t k = 0; k < ns; k++)
        if (base[k * pitch + d + 1] > 0.0f)
            l += base[k * pitch + d + 1] * expf(base[k * pitch + d] - mx);
    const uint32_t h = kvh * g + r % g, tok = (uint32_t)sq.q_start + r / g;
    float *o = p.out + (size_t)tok * p.stride_out + (size_t)h * d;
    for (uint32_t i = lane; i < d; i += GPU_WARP) {
        float a = 0.0f;
        for (uint32_t k = 0; k < ns; k++)
            if (base[k * pitch + d + 1] > 0.0f)
                a += base[k * pitch + i] * expf(base[k * pitch + d] - mx);
        o[i] = l > 0.0f ? a / l : 0.0f;
    }
}

/* -------------------------------------------------------------- launcher */

extern "C" int dray_gk_attention(const struct gk_attention *p, void *stream)
{
    gpuStream_t st = (gpuStream_t)stream;
    const uint32_t d = p->pool.head_dim, nkh = p->pool.n_kv_head;
    if (p->n_seq == 0 || p->n_tok == 0)
        return 0;
    const uint32_t g = p->n_head / nkh;
    int32_t *rb_start = (int32_t *)p->scratch;
    int32_t *nsplit = rb_start + p->n_seq + 1;
    float *part = (float *)((char *)p->scratch + att_plan_bytes(p->n_seq));
    k_att_plan<<<1, 32, 0, st>>>(*p, rb_start, nsplit, g);
    int rc = GK_LAUNCH_RESULT();
    if (rc)
        return rc;
    const uint64_t blocks = ((uint64_t)p->n_tok * g + ATT_NW - 1) / ATT_NW + p->n_seq;
    const uint32_t bk = att_bk(d);
    const size_t smem = ((size_t)bk * (d + 1) + (size_t)bk * d + (size_t)ATT_NW * d +
                         (size_t)ATT_NW * bk) * sizeof(float) + bk * sizeof(int32_t);
    dim3 grid((unsigned)blocks, p->max_split, nkh);
    k_att<<<grid, ATT_NW * GPU_WARP, smem, st>>>(*p, rb_start, nsplit, part, g, bk);
    rc = GK_LAUNCH_RESULT();
    if (rc || p->max_split <= 1)
        return rc;
    k_att_reduce<<<dim3(p->n_seq, nkh), ATT_NW * GPU_WARP, 0, st>>>(*p, nsplit, part, g);
    return GK_LAUNCH_RESULT();
}
