/*
 * packed.cu — matmul and embed on packed weights (backend.h, "Packed weights";
 * the device layout is backends/cuda/gpu_layout.h: the host's row-major groups
 * as given, then d, then m).
 *
 * matmul, two kernels on one stream:
 *  1. k_pq_quantize: 32 threads per (token, group of 32 inputs), one input each.
 *     A 32-lane shuffle max gives sx = max|x|/127, q = rne(x/sx) clamped to
 *     [-127, 127], a shuffle sum gives sum(q). With passes = 2 the same threads
 *     then quantize the residual r = x - q*sx (rounded as two f32 operations,
 *     the host reference's order) into a second row. Scratch holds q as int8
 *     [n_tok*passes][k] (row t*passes + pass) and {sx, (float)sum q} as float2
 *     [n_tok*passes][k/32].
 *  2. k_pq_dot<bits, f16, min>: one warp per output row and up to PQ_NT tokens,
 *     so each weight group is read once per PQ_NT tokens; lane l takes groups
 *     l, l + warp, ... of the row (consecutive lanes, consecutive groups:
 *     coalesced). A group's codes are widened in registers to 8 words of 4
 *     int8 lanes (4-bit nibbles masked, 5-bit high bits spread in with one
 *     multiply) and dotted with q by dp4a (NVIDIA) / gpu_dot4 (AMD) into an
 *     exact int32 group sum; then, in f32,
 *       acc += sx * (d * (float)sum(q*code) + m' * (float)sum(q))
 *     with m' = m or -z*d. Lanes' partial sums meet in a warp-shuffle sum;
 *     lane 0 writes or accumulates out. The f32 order of the group terms
 *     differs from the reference's (backend.h allows it). Launch bounds ask
 *     for 4 blocks per SM (at most 64 registers on NVIDIA, no spills): decode
 *     is memory bound and wants warps in flight. Prefill reads W once per
 *     PQ_NT tokens through this same kernel; no tensor-core path yet.
 * embed: k_pq_embed, one block per token, one thread per output element:
 *   out = (code * d + m') * scale, the product and sum rounded separately.
 */
#include "gpu_common.cuh"

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

template <bool F16>
static __device__ __forceinline__ float ld_scale(const void *a, size_t i)
{
    if constexpr (F16)
        return f16_bits_to_f32(((const uint16_t *)a)[i]);
    else
        return ((const float *)a)[i];
}

/* One group's term of one activation row: sx * (d * sum(q*code) + m' * sum(q)),
 * the int32 sum exact; q is 32 bytes of the row, e = {sx, (float)sum q}. */
static __device__ __forceinline__ float group_term(const int w[8], const int8_t *q, float2 e, float d, float m)
{
    const int4 qa = ((const int4 *)q)[0], qb = ((const int4 *)q)[1];
    int sqc = gpu_dot4(w[0], qa.x, 0);
    sqc = gpu_dot4(w[1], qa.y, sqc);
    sqc = gpu_dot4(w[2], qa.z, sqc);
    sqc = gpu_dot4(w[3], qa.w, sqc);
    sqc = gpu_dot4(w[4], qb.x, sqc);
    sqc = gpu_dot4(w[5], qb.y, sqc);
    sqc = gpu_dot4(w[6], qb.z, sqc);
    sqc = gpu_dot4(w[7], qb.w, sqc);
    return e.x * (d * (float)sqc + m * e.y);
}

template <int BITS, bool F16, bool MIN>
static __global__ void __launch_bounds__(PQ_BLOCK, 4) k_pq_dot(struct gk_pmatmul p, const int8_t *qx,
                                                              const float2 *xs)
{
    constexpr uint32_t B = BITS == 4 ? 16u : BITS == 5 ? 20u : 32u;
    constexpr float Z = BITS == 4 ? 8.0f : BITS == 5 ? 16.0f : 0.0f;
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
        const size_t gi = (size_t)o * G + g;
        int w[8];
        load_codes<BITS>(p.w.codes + gi * B, w);
        const float d = ld_scale<F16>(p.w.d, gi);
        const float m = MIN ? ld_scale<F16>(p.w.m, gi) : -Z * d;
#pragma unroll
        for (int i = 0; i < PQ_NT; i++) {
            if ((uint32_t)i < nt) {
                const size_t r = (size_t)(t0 + i) * p.passes;
                acc[i] += group_term(w, qx + r * p.k + 32u * g, xs[r * G + g], d, m);
                if (p.passes == 2)
                    acc[i] += group_term(w, qx + (r + 1) * p.k + 32u * g, xs[(r + 1) * G + g], d, m);
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

template <int BITS, bool F16, bool MIN>
static void launch_dot(const struct gk_pmatmul *p, const int8_t *qx, const float2 *xs, gpuStream_t st)
{
    const unsigned wpb = PQ_BLOCK / GPU_WARP; /* output rows per block */
    const dim3 grid((p->n_out + wpb - 1) / wpb, (p->n_tok + PQ_NT - 1) / PQ_NT);
    k_pq_dot<BITS, F16, MIN><<<grid, PQ_BLOCK, 0, st>>>(*p, qx, xs);
}

/* Indexed [bits 4, 5, 8][f16 * 2 + has_min], the order of DRAY_WFORMAT_BIT. */
#define PQ_ROW(b) \
    {launch_dot<b, false, false>, launch_dot<b, false, true>, launch_dot<b, true, false>, launch_dot<b, true, true>}
static const pq_dot_launch pq_dots[3][4] = {PQ_ROW(4), PQ_ROW(5), PQ_ROW(8)};

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
    pq_dots[bi][(q.w.f16 ? 2 : 0) + (q.w.has_min ? 1 : 0)](&q, qx, xs, st);
    return GK_LAUNCH_RESULT();
}

/* ---------------------------------------------------------------- embed */

/* Code j (0..31) of a group: unsigned 4- or 5-bit, signed 8-bit. */
static __device__ __forceinline__ int code_at(const unsigned char *grp, uint32_t bits, uint32_t j)
{
    if (bits == 8)
        return (int)(signed char)grp[j];
    int c = j < 16 ? grp[j] & 15 : grp[j - 16] >> 4;
    if (bits == 5)
        c |= ((grp[16 + j / 8] >> (j % 8)) & 1) << 4; /* bit j of the little-endian word */
    return c;
}

/* One block per token; an id outside [0, n_rows) writes zeros and raises a flag. */
static __global__ void k_pq_embed(struct gk_pembed p)
{
    const uint32_t t = blockIdx.x, G = p.dim / 32u;
    const uint32_t B = p.w.bits == 4 ? 16u : p.w.bits == 5 ? 20u : 32u;
    const float z = p.w.bits == 4 ? 8.0f : p.w.bits == 5 ? 16.0f : 0.0f;
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
        const float d = p.w.f16 ? ld_scale<true>(p.w.d, gi) : ld_scale<false>(p.w.d, gi);
        const float m = !p.w.has_min ? -z * d : p.w.f16 ? ld_scale<true>(p.w.m, gi) : ld_scale<false>(p.w.m, gi);
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
