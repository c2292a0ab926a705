/*
 * packed.cu — matmul and embed on packed weights (backend.h, "Packed weights";
 * the device layout is backends/cuda/gpu_layout.h: the host's row-major groups
 * as given, then the two-level formats' sub-scales, then d, then m).
 *
 * matmul, two kernels on one stream:
 *  1. k_pq_quantize: 32 threads per (token, group of 32 inputs), one input each.
 *     A 32-lane shuffle max gives sx = max|x|/127, q = rne(x/sx) clamped to
 *     [-127, 127], a shuffle sum gives sum(q). With passes = 2 the same threads
 *     then quantize the residual r = x - q*sx (rounded as two f32 operations,
 *     the host reference's order) into a second row. Scratch holds q as int8
 *     [n_tok*passes][k] (row t*passes + pass) and {sx, (float)sum q} as float2
 *     [n_tok*passes][k/32].
 *  2. k_pq_dot<F>: one warp per output row and up to PQ_NT tokens, so each
 *     weight group is read once per PQ_NT tokens; lane l takes groups l, l +
 *     warp, ... of the row (consecutive lanes, consecutive groups: coalesced).
 *     F, the format, loads a group: its codes widened in registers to 8 words
 *     of 4 int8 lanes (4-bit nibbles masked, 5- and 6-bit high bits spread in)
 *     and its scales; the words are dotted with q by dp4a (NVIDIA) / gpu_dot4
 *     (AMD) into exact int32 sums; then, in f32,
 *       acc += sx * (d * (float)sum(q*code) + m' * (float)sum(q))
 *     with m' = m or -z*d. Two-level formats find their scales by the group's
 *     index: Q4_K/Q5_K shapes form d = D*s, m = -(M*n) from the super-block's
 *     f16 D, M and its 12-byte (s, n) pairs; the Q6_K shape stores its codes
 *     minus 32 as int8 lanes, so each half-group is one exact sum
 *     sum(q*(code-32)) times its own d = D*sub, and
 *       acc += sx * (d0 * (float)sum_0 + d1 * (float)sum_1)
 *     (backend.h's d*sum(q*code) + m'*sum(q) with m' = -32d, the integer part
 *     exact). Lanes' partial sums meet in a warp-shuffle sum; lane 0 writes or
 *     accumulates out. The f32 order of the group terms differs from the
 *     reference's (backend.h allows it). Launch bounds ask for 4 blocks per SM
 *     (at most 64 registers on NVIDIA, no spills): decode is memory bound and
 *     wants warps in flight. Prefill reads W once per PQ_NT tokens through this
 *     same kernel; no tensor-core path yet.
 * embed: k_pq_embed, one block per token, one thread per output element:
 *   out = (code * d + m') * scale, the product and sum rounded separately,
 *   d and m' of the element's group (or half-group) formed as the host's
 *   reference forms them (dray_util_packed_unit_dm).
 */
#include "gpu_common.cuh"
#include "gpu_kscales.h"

#define PQ_NT 8    /* tokens per k_pq_dot warp */
#define PQ_BLOCK 256

static inline size_t pq_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Scratch: q [rows][k] int8, then {sx, sum q} [rows][k/32] float2. */
extern "C" size_t dray_gk_pmatmul_scratch(uint32_t n_tok, uint32_t k, uint32_t passes)
{
    const size_t rows = (size_t)n_tok * (passes ? passes : 1);
    return pq_round_up(rows * k, 256) + rows * (k / 32) * sizeof(float2);
}

/* a*b + c with the product and the sum each rounded (never one fma): what the
 * host reference (dray_util_packed_row, the residual) computes. */
static __device__ __forceinline__ float mul_add_rn(float a, float b, float c)
{
#if defined(DRAY_GPU_HIP)
#pragma clang fp contract(off)
    return a * b + c;
#else
    return __fadd_rn(__fmul_rn(a, b), c);
#endif
}

/* Reductions over the 32 lanes of one group: xor distances below 32 stay in
 * an aligned half of a 64-wide AMD wavefront, so both warp sizes work. */
static __device__ __forceinline__ float group_max(float v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        v = fmaxf(v, GPU_SHFL_XOR(v, m));
    return v;
}

static __device__ __forceinline__ int group_isum(int v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        v += GPU_SHFL_XOR(v, m);
    return v;
}

/* ---------------------------------------------------- stage 1: quantize */

static __global__ void __launch_bounds__(PQ_BLOCK) k_pq_quantize(struct gk_pmatmul p, int8_t *qx, float2 *xs)
{
    const uint32_t G = p.k / 32u, j = threadIdx.x % 32u;
    const uint64_t gi = (uint64_t)blockIdx.x * (PQ_BLOCK / 32) + threadIdx.x / 32u;
    /* no early return: every lane of a group takes part in its shuffles */
    const bool live = gi < (uint64_t)p.n_tok * G;
    const uint32_t t = live ? (uint32_t)(gi / G) : 0u, g = live ? (uint32_t)(gi % G) : 0u;
    float v = live ? p.x[(size_t)t * p.stride_x + 32u * g + j] : 0.0f;
    for (uint32_t s = 0; s < p.passes; s++) {
        const float sx = group_max(fabsf(v)) / 127.0f;
        const int q = quant_rne(v, sx);
        const int sq = group_isum(q);
        const size_t r = (size_t)t * p.passes + s;
        if (live) {
            qx[r * p.k + 32u * g + j] = (int8_t)q;
            if (j == 0)
                xs[r * G + g] = make_float2(sx, (float)sq);
        }
        v = mul_add_rn(-(float)q, sx, v); /* the residual x - q*sx, for the next pass */
    }
}

/* ---------------------------------------------------- stage 2: the dot */

/* Bits 0..3 of b into bit 4 of bytes 0..3 (the 5-bit codes' high bits). */
static __device__ __forceinline__ uint32_t spread4(uint32_t b)
{
    return (((b & 15u) * 0x00204081u) & 0x01010101u) << 4;
}

/* A group's 32 codes as 8 words of 4 int8 lanes, word i = inputs 4i..4i+3. */
template <int BITS>
static __device__ __forceinline__ void load_codes(const unsigned char *grp, int w[8])
{
    if constexpr (BITS == 8) {
        const int4 a = ((const int4 *)grp)[0], b = ((const int4 *)grp)[1];
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
        w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
        uint32_t l[4], h = 0;
        if constexpr (BITS == 4) {
            const int4 a = *(const int4 *)grp; /* 16-byte groups: aligned */
            l[0] = (uint32_t)a.x, l[1] = (uint32_t)a.y, l[2] = (uint32_t)a.z, l[3] = (uint32_t)a.w;
        } else {
            const uint32_t *u = (const uint32_t *)grp; /* 20-byte groups: 4-byte aligned */
            l[0] = u[0], l[1] = u[1], l[2] = u[2], l[3] = u[3];
            h = u[4];
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[i] = (int)((l[i] & 0x0f0f0f0fu) | spread4(h >> (4 * i)));
            w[4 + i] = (int)(((l[i] >> 4) & 0x0f0f0f0fu) | spread4(h >> (16 + 4 * i)));
        }
    }
}

/* Bits 0..7 of b, four 2-bit pairs, into bits 4-5 of bytes 0..3 (the 6-bit
 * codes' high bits). */
static __device__ __forceinline__ uint32_t spread2(uint32_t b)
{
    uint32_t x = (b | (b << 12)) & 0x000f000fu; /* pairs 0-1 in byte 0, 2-3 in byte 2 */
    x = (x | (x << 6)) & 0x03030303u;          /* one pair per byte */
    return x << 4;
}

/* A 6-bit group (24 bytes, 8-byte aligned) as 8 words of 4 int8 lanes holding
 * code - 32 (-32..31), word i = inputs 4i..4i+3. */
static __device__ __forceinline__ void load_codes6(const unsigned char *grp, int w[8])
{
    const uint2 *u = (const uint2 *)grp;
    const uint2 a = u[0], b = u[1], h = u[2];
    const uint32_t l[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t c0 = (l[i] & 0x0f0f0f0fu) | spread2((h.x >> (8 * i)) & 0xffu);
        const uint32_t c1 = ((l[i] >> 4) & 0x0f0f0f0fu) | spread2((h.y >> (8 * i)) & 0xffu);
        /* per-byte c - 32 without borrows: bias each byte by 128 first */
        w[i] = (int)(((c0 | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
        w[4 + i] = (int)(((c1 | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
    }
}

template <bool F16>
static __device__ __forceinline__ float ld_scale(const void *a, size_t i)
{
    if constexpr (F16)
        return f16_bits_to_f32(((const uint16_t *)a)[i]);
    else
        return ((const float *)a)[i];
}

/* The exact int32 sum of 16 products: four code words w against 16 bytes of q. */
static __device__ __forceinline__ int dot16(const int *w, int4 q)
{
    int s = gpu_dot4(w[0], q.x, 0);
    s = gpu_dot4(w[1], q.y, s);
    s = gpu_dot4(w[2], q.z, s);
    return gpu_dot4(w[3], q.w, s);
}

/* One group's term of one activation row: sx * (d * sum(q*code) + m' * sum(q)),
 * the int32 sum exact; q is 32 bytes of the row, e = {sx, (float)sum q}. */
static __device__ __forceinline__ float group_term(const int w[8], const int8_t *q, float2 e, float d, float m)
{
    const int4 qa = ((const int4 *)q)[0], qb = ((const int4 *)q)[1];
    const int sqc = dot16(w, qa) + dot16(w + 4, qb);
    return e.x * (d * (float)sqc + m * e.y);
}

/* Formats for k_pq_dot: F::B code bytes a group; f.load(w, gi) reads group gi
 * (of o*G + g) and its scales; f.term(q, e) is its term for one activation row. */

/* One level: d and m (or -z*d) per group, f32 or f16. */
template <int BITS, bool F16, bool MIN>
struct fmt_one {
    static constexpr uint32_t B = BITS == 4 ? 16u : BITS == 5 ? 20u : 32u;
    int w[8];
    float d, m;
    __device__ __forceinline__ void load(const struct gk_pweights &p, size_t gi)
    {
        constexpr float Z = BITS == 4 ? 8.0f : BITS == 5 ? 16.0f : 0.0f;
        load_codes<BITS>(p.codes + gi * B, w);
        d = ld_scale<F16>(p.d, gi);
        m = MIN ? ld_scale<F16>(p.m, gi) : -Z * d;
    }
    __device__ __forceinline__ float term(const int8_t *q, float2 e) const { return group_term(w, q, e, d, m); }
};

/* Q4_K, Q5_K shapes: d = D*s, m = -(M*n), D and M of super-block gi/8, (s, n)
 * pair gi%8 of its 12 packed bytes. */
template <int BITS>
struct fmt_k {
    static constexpr uint32_t B = BITS == 4 ? 16u : 20u;
    int w[8];
    float d, m;
    __device__ __forceinline__ void load(const struct gk_pweights &p, size_t gi)
    {
        uint32_t s, n;
        load_codes<BITS>(p.codes + gi * B, w);
        gk_kscale_get(p.sub + gi / 8u * GK_KSCALE_BYTES, (uint32_t)(gi % 8u), &s, &n);
        d = ld_scale<true>(p.d, gi / 8u) * (float)s;
        m = -(ld_scale<true>(p.m, gi / 8u) * (float)n);
    }
    __device__ __forceinline__ float term(const int8_t *q, float2 e) const { return group_term(w, q, e, d, m); }
};

/* Q6_K shape: codes - 32 in the words, each half-group its own d = D * sub. */
struct fmt_q6 {
    static constexpr uint32_t B = 24u;
    int w[8];
    float d0, d1;
    __device__ __forceinline__ void load(const struct gk_pweights &p, size_t gi)
    {
        const float D = ld_scale<true>(p.d, gi / 8u);
        const int8_t *sub = (const int8_t *)p.sub + 2u * gi;
        load_codes6(p.codes + gi * B, w);
        d0 = D * (float)sub[0];
        d1 = D * (float)sub[1];
    }
    __device__ __forceinline__ float term(const int8_t *q, float2 e) const
    {
        const int4 qa = ((const int4 *)q)[0], qb = ((const int4 *)q)[1];
        return e.x * (d0 * (float)dot16(w, qa) + d1 * (float)dot16(w + 4, qb));
    }
};

template <class F>
static __global__ void __launch_bounds__(PQ_BLOCK, 4) k_pq_dot(struct gk_pmatmul p, const int8_t *qx,
                                                              const float2 *xs)
{
    const uint32_t lane = threadIdx.x % GPU_WARP;
    const uint32_t o = blockIdx.x * (PQ_BLOCK / GPU_WARP) + threadIdx.x / GPU_WARP;
    const uint32_t t0 = blockIdx.y * PQ_NT;
    if (o >= p.n_out) /* the same for the whole warp */
        return;
    const uint32_t nt = min((uint32_t)PQ_NT, p.n_tok - t0), G = p.k / 32u;
    float acc[PQ_NT];
#pragma unroll
    for (int i = 0; i < PQ_NT; i++)
        acc[i] = 0.0f;
    for (uint32_t g = lane; g < G; g += GPU_WARP) {
        F f;
        f.load(p.w, (size_t)o * G + g);
#pragma unroll
        for (int i = 0; i < PQ_NT; i++) {
            if ((uint32_t)i < nt) {
                const size_t r = (size_t)(t0 + i) * p.passes;
                acc[i] += f.term(qx + r * p.k + 32u * g, xs[r * G + g]);
                if (p.passes == 2)
                    acc[i] += f.term(qx + (r + 1) * p.k + 32u * g, xs[(r + 1) * G + g]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PQ_NT; i++) {
        const float s = warp_sum(acc[i]);
        if (lane == 0 && (uint32_t)i < nt) {
            float *dst = p.out + (size_t)(t0 + i) * p.stride_out + o;
            *dst = p.accumulate ? *dst + s : s;
        }
    }
}

typedef void (*pq_dot_launch)(const struct gk_pmatmul *p, const int8_t *qx, const float2 *xs,
                              gpuStream_t st);

template <class F>
static void launch_dot(const struct gk_pmatmul *p, const int8_t *qx, const float2 *xs, gpuStream_t st)
{
    const unsigned wpb = PQ_BLOCK / GPU_WARP; /* output rows per block */
    const dim3 grid((p->n_out + wpb - 1) / wpb, (p->n_tok + PQ_NT - 1) / PQ_NT);
    k_pq_dot<F><<<grid, PQ_BLOCK, 0, st>>>(*p, qx, xs);
}

/* Indexed [bits 4, 5, 8][f16 * 2 + has_min], the order of DRAY_WFORMAT_BIT. */
#define PQ_ROW(b)                                                                                  \
    {launch_dot<fmt_one<b, false, false>>, launch_dot<fmt_one<b, false, true>>,                   \
     launch_dot<fmt_one<b, true, false>>, launch_dot<fmt_one<b, true, true>>}
static const pq_dot_launch pq_dots[3][4] = {PQ_ROW(4), PQ_ROW(5), PQ_ROW(8)};
/* Two levels, indexed by bits 4, 5, 6 (DRAY_WFORMAT_BIT's bits 12..14). */
static const pq_dot_launch pq_kdots[3] = {launch_dot<fmt_k<4>>, launch_dot<fmt_k<5>>, launch_dot<fmt_q6>};

extern "C" int dray_gk_pmatmul(const struct gk_pmatmul *p, void *stream)
{
    gpuStream_t st = (gpuStream_t)stream;
    if (p->n_tok == 0 || p->n_out == 0)
        return 0;
    struct gk_pmatmul q = *p;
    q.passes = p->passes == 2 ? 2u : 1u;
    const size_t rows = (size_t)q.n_tok * q.passes, groups = (size_t)q.n_tok * (q.k / 32u);
    int8_t *qx = (int8_t *)q.scratch;
    float2 *xs = (float2 *)((char *)q.scratch + pq_round_up(rows * q.k, 256));
    k_pq_quantize<<<gk_blocks(groups, PQ_BLOCK / 32, 0x7fffffffu), PQ_BLOCK, 0, st>>>(q, qx, xs);
    int rc = GK_LAUNCH_RESULT();
    if (rc)
        return rc;
    const int bi = q.w.bits == 4 ? 0 : q.w.bits == 5 ? 1 : 2;
    if (q.w.super)
        pq_kdots[bi](&q, qx, xs, st);
    else
        pq_dots[bi][(q.w.f16 ? 2 : 0) + (q.w.has_min ? 1 : 0)](&q, qx, xs, st);
    return GK_LAUNCH_RESULT();
}

/* ---------------------------------------------------------------- embed */

/* Code j (0..31) of a group: unsigned 4-, 5- or 6-bit, signed 8-bit. */
static __device__ __forceinline__ int code_at(const unsigned char *grp, uint32_t bits, uint32_t j)
{
    if (bits == 8)
        return (int)(signed char)grp[j];
    int c = j < 16 ? grp[j] & 15 : grp[j - 16] >> 4;
    if (bits == 5)
        c |= ((grp[16 + j / 8] >> (j % 8)) & 1) << 4; /* bit j of the little-endian word */
    else if (bits == 6)
        c |= ((grp[16 + j / 4] >> (2 * (j % 4))) & 3) << 4; /* bits 2j, 2j+1 of the uint64 */
    return c;
}

/* d and m' of input j of group gi, as dray_util_packed_unit_dm forms them:
 * per group (one level, Q4_K/Q5_K shapes) or per half-group (Q6_K shape). */
static __device__ __forceinline__ void embed_dm(const struct gk_pweights &w, size_t gi, uint32_t j, float *d,
                                                float *m)
{
    if (!w.super) {
        const float z = w.bits == 4 ? 8.0f : w.bits == 5 ? 16.0f : 0.0f;
        *d = w.f16 ? ld_scale<true>(w.d, gi) : ld_scale<false>(w.d, gi);
        *m = !w.has_min ? -z * *d : w.f16 ? ld_scale<true>(w.m, gi) : ld_scale<false>(w.m, gi);
        return;
    }
    const float D = ld_scale<true>(w.d, gi / 8u);
    if (w.bits == 6) {
        *d = D * (float)((const int8_t *)w.sub)[2u * gi + j / 16u];
        *m = -32.0f * *d;
        return;
    }
    uint32_t s, n;
    gk_kscale_get(w.sub + gi / 8u * GK_KSCALE_BYTES, (uint32_t)(gi % 8u), &s, &n);
    *d = D * (float)s;
    *m = -(ld_scale<true>(w.m, gi / 8u) * (float)n);
}

/* One block per token; an id outside [0, n_rows) writes zeros and raises a flag. */
static __global__ void k_pq_embed(struct gk_pembed p)
{
    const uint32_t t = blockIdx.x, G = p.dim / 32u;
    const uint32_t B = p.w.bits == 4 ? 16u : p.w.bits == 5 ? 20u : p.w.bits == 6 ? 24u : 32u;
    const int32_t id = p.ids[t];
    float *o = p.out + (size_t)t * p.dim;
    if (id < 0 || (uint32_t)id >= p.n_rows) {
        for (uint32_t i = threadIdx.x; i < p.dim; i += blockDim.x)
            o[i] = 0.0f;
        if (threadIdx.x == 0)
            atomicOr(p.flag, (unsigned)GK_FLAG_EMBED_ID);
        return;
    }
    for (uint32_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
        const size_t gi = (size_t)id * G + i / 32u;
        float d, m;
        embed_dm(p.w, gi, i % 32u, &d, &m);
        const int c = code_at(p.w.codes + gi * B, p.w.bits, i % 32u);
        o[i] = mul_add_rn((float)c, d, m) * p.scale;
    }
}

extern "C" int dray_gk_pembed(const struct gk_pembed *p, void *stream)
{
    if (p->n_tok == 0 || p->dim == 0)
        return 0;
    k_pq_embed<<<p->n_tok, PQ_BLOCK, 0, (gpuStream_t)stream>>>(*p);
    return GK_LAUNCH_RESULT();
}
