/*
 * matmul.cu — out[t][o] = sum_k x[t][k] * W[o][k]  (backend.h, struct dray_matmul_args)
 *
 * int8 weights (W8A8), three stages on one stream:
 *  1. k_quantize, the producer: one block per token finds max|x| over the
 *     non-outlier channels (the row-max reduction) and writes q = rne(x / sx)
 *     as int8 [n_tok][k_pad] plus sx [n_tok] to scratch. k_pad = k rounded up
 *     to 32, zero padded, so the consumers never test the k tail.
 *  2. a consumer, chosen by shape:
 *     - k_mma (CUDA sm_80+, n_tok > 8, k % 16 == 0, w 16-byte aligned): tensor
 *       cores through inline PTX mma.sync.m16n8k32.s8.s8.s32. Block tile 64
 *       tokens x 64 outputs, 4 warps of 32 x 32, k step 32, shared-memory tiles
 *       with a 48-byte row pitch (conflict-free fragment loads) and the next
 *       tile prefetched into registers while the current one multiplies.
 *     - k_dot (decode, and every AMD shape): one warp per output row and up to
 *       8 tokens, so each weight byte is read once per 8 tokens. 16-byte loads
 *       and dp4a (NVIDIA) / a written-out 4-way int8 dot (AMD: no MFMA in v1)
 *       when aligned, a byte loop otherwise. Decode is memory bound: this path
 *       streams W at close to bandwidth and the tensor cores would idle anyway.
 *  3. the epilogue, in the consumer: acc * sx[t] * wscale[o], plus the f32
 *     outlier channels, written or accumulated into out.
 * f32 weights (the checking path): k_dot_f32, same shape as k_dot, f32 sums.
 */
#include "gpu_common.cuh"

#define MM_NT 8       /* tokens per k_dot warp */
#define MM_KALIGN 32u /* k_pad granularity (mma k step) */

static inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

extern "C" size_t dray_gk_matmul_scratch(uint32_t n_tok, uint32_t k)
{
    size_t q = round_up((size_t)n_tok * round_up(k, MM_KALIGN), 256);
    return q + round_up((size_t)n_tok * sizeof(float), 256);
}

/* --------------------------------------------------------------- stage 1 */

static __device__ bool is_outlier(const int32_t *idx, uint32_t n, uint32_t c)
{
    uint32_t lo = 0, hi = n; /* idx strictly increasing: binary search */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if ((uint32_t)idx[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && (uint32_t)idx[lo] == c;
}

static __global__ void k_quantize(struct gk_matmul p, int8_t *qx, float *sx, uint32_t k_pad)
{
    __shared__ float red[1024 / GPU_WARP];
    const uint32_t t = blockIdx.x;
    const float *x = p.x + (size_t)t * p.stride_x;
    float amax = 0.0f;
    for (uint32_t c = threadIdx.x; c < p.k; c += blockDim.x)
        if (p.n_outlier == 0 || !is_outlier(p.outlier_idx, p.n_outlier, c))
            amax = fmaxf(amax, fabsf(x[c]));
    amax = block_max(amax, red);
    const float s = amax / 127.0f;
    int8_t *q = qx + (size_t)t * k_pad;
    for (uint32_t c = threadIdx.x; c < k_pad; c += blockDim.x) {
        int v = 0;
        if (c < p.k && (p.n_outlier == 0 || !is_outlier(p.outlier_idx, p.n_outlier, c)))
            v = quant_rne(x[c], s);
        q[c] = (int8_t)v;
    }
    if (threadIdx.x == 0)
        sx[t] = s;
}

/* --------------------------------------------------------------- stage 3 */

static __device__ __forceinline__ void mm_store(const struct gk_matmul &p, uint32_t t, uint32_t o,
                                                float r)
{
    if (p.n_outlier) {
        const float *x = p.x + (size_t)t * p.stride_x;
        const float *ow = p.outlier_w + (size_t)o * p.n_outlier;
        for (uint32_t j = 0; j < p.n_outlier; j++) {
            const uint32_t c = (uint32_t)p.outlier_idx[j];
            if (c < p.k) /* a bad index is skipped, never read past the row */
                r += x[c] * ow[j];
        }
    }
    float *dst = p.out + (size_t)t * p.stride_out + o;
    *dst = p.accumulate ? *dst + r : r;
}

static __device__ __forceinline__ void mm_epilogue(const struct gk_matmul &p, uint32_t t, uint32_t o,
                                                   int acc, float sx)
{
    mm_store(p, t, o, (float)acc * sx * p.wscale[o]);
}

static __device__ __forceinline__ int warp_isum(int v)
{
#pragma unroll
    for (int m = GPU_WARP / 2; m > 0; m >>= 1)
        v += GPU_SHFL_XOR(v, m);
    return v;
}

/* ------------------------------------------------------ stage 2: k_dot */

template <bool VEC>
static __global__ void k_dot(struct gk_matmul p, const int8_t *qx, const float *sx, uint32_t k_pad)
{
    const uint32_t lane = threadIdx.x % GPU_WARP;
    const uint32_t o = blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP;
    const uint32_t t0 = blockIdx.y * MM_NT;
    if (o >= p.n_out)
        return;
    const uint32_t nt = min((uint32_t)MM_NT, p.n_tok - t0);
    const int8_t *w = (const int8_t *)p.w + (size_t)o * p.k;
    int acc[MM_NT];
#pragma unroll
    for (int i = 0; i < MM_NT; i++)
        acc[i] = 0;
    if (VEC) {
        const int4 *w4 = (const int4 *)w;
        for (uint32_t c = lane; c < p.k / 16; c += GPU_WARP) {
            const int4 wv = w4[c];
#pragma unroll
            for (int i = 0; i < MM_NT; i++) {
                if ((uint32_t)i < nt) {
                    const int4 qv = ((const int4 *)(qx + (size_t)(t0 + i) * k_pad))[c];
                    int a = acc[i];
                    a = gpu_dot4(wv.x, qv.x, a);
                    a = gpu_dot4(wv.y, qv.y, a);
                    a = gpu_dot4(wv.z, qv.z, a);
                    a = gpu_dot4(wv.w, qv.w, a);
                    acc[i] = a;
                }
            }
        }
    } else {
        for (uint32_t c = lane; c < p.k; c += GPU_WARP) {
            const int wv = w[c];
#pragma unroll
            for (int i = 0; i < MM_NT; i++)
                if ((uint32_t)i < nt)
                    acc[i] += wv * (int)qx[(size_t)(t0 + i) * k_pad + c];
        }
    }
#pragma unroll
    for (int i = 0; i < MM_NT; i++) {
        const int s = warp_isum(acc[i]);
        if (lane == 0 && (uint32_t)i < nt)
            mm_epilogue(p, t0 + i, o, s, sx[t0 + i]);
    }
}

/* f32 weights: the checking path. Same shape as k_dot, sums in f32. */
static __global__ void k_dot_f32(struct gk_matmul p)
{
    const uint32_t lane = threadIdx.x % GPU_WARP;
    const uint32_t o = blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP;
    const uint32_t t0 = blockIdx.y * MM_NT;
    if (o >= p.n_out)
        return;
    const uint32_t nt = min((uint32_t)MM_NT, p.n_tok - t0);
    const float *w = (const float *)p.w + (size_t)o * p.k;
    float acc[MM_NT];
#pragma unroll
    for (int i = 0; i < MM_NT; i++)
        acc[i] = 0.0f;
    for (uint32_t c = lane; c < p.k; c += GPU_WARP) {
        const float wv = w[c];
#pragma unroll
        for (int i = 0; i < MM_NT; i++)
            if ((uint32_t)i < nt)
                acc[i] += wv * p.x[(size_t)(t0 + i) * p.stride_x + c];
    }
#pragma unroll
    for (int i = 0; i < MM_NT; i++) {
        const float s = warp_sum(acc[i]);
        if (lane == 0 && (uint32_t)i < nt) {
            float *dst = p.out + (size_t)(t0 + i) * p.stride_out + o;
            *dst = p.accumulate ? *dst + s : s;
        }
    }
}

/* ------------------------------------------------------ stage 2: k_mma */
#if !defined(DRAY_GPU_HIP)

#define MMA_BM 64
#define MMA_BN 64
#define MMA_PITCH 48 /* bytes per smem row: 12 words, fragment loads hit 32 banks */

static __device__ __forceinline__ void mma_s8(int c[4], const int a[4], const int b[2])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)c, (void)a, (void)b; /* never launched below sm_80 (host checks) */
#endif
}

/* A = q [n_tok][k_pad] (row-major, "row"), B = w [n_out][k] (= K x N col-major).
 * Fragment layouts of m16n8k32 .s8 (PTX ISA, "Matrix fragments for mma.m16n8k32"),
 * with g = lane/4, q4 = lane%4:
 *   a0: A[g][4q4..+3]  a1: A[g+8][4q4..]  a2: A[g][16+4q4..]  a3: A[g+8][16+4q4..]
 *   b0: B[4q4..+3][g] = w[g][4q4..]       b1: w[g][16+4q4..]
 *   c0,c1: C[g][2q4], C[g][2q4+1]         c2,c3: C[g+8][2q4], C[g+8][2q4+1] */
static __global__ void __launch_bounds__(128) k_mma(struct gk_matmul p, const int8_t *qx,
                                                    const float *sx, uint32_t k_pad)
{
    __shared__ __align__(16) unsigned char As[MMA_BM * MMA_PITCH];
    __shared__ __align__(16) unsigned char Bs[MMA_BN * MMA_PITCH];
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t g = lane / 4, q4 = lane % 4;
    const uint32_t wm = warp / 2, wn = warp % 2;
    const uint32_t m0 = blockIdx.y * MMA_BM, n0 = blockIdx.x * MMA_BN;
    const uint32_t lrow = tid / 2, lhalf = tid % 2; /* each thread moves 16 B of A and of B */
    const int8_t *w = (const int8_t *)p.w;
    const bool a_ok = m0 + lrow < p.n_tok, b_ok = n0 + lrow < p.n_out;
    const int4 zero = make_int4(0, 0, 0, 0);
    int acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0;

    int4 ra = a_ok ? *(const int4 *)(qx + (size_t)(m0 + lrow) * k_pad + lhalf * 16) : zero;
    int4 rb = (b_ok && lhalf * 16 < p.k) ? *(const int4 *)(w + (size_t)(n0 + lrow) * p.k + lhalf * 16)
                                        : zero;
    for (uint32_t k0 = 0; k0 < k_pad; k0 += 32) {
        *(int4 *)(As + lrow * MMA_PITCH + lhalf * 16) = ra;
        *(int4 *)(Bs + lrow * MMA_PITCH + lhalf * 16) = rb;
        __syncthreads();
        const uint32_t kn = k0 + 32 + lhalf * 16;
        if (k0 + 32 < k_pad) { /* prefetch the next k step while this one multiplies */
            ra = a_ok ? *(const int4 *)(qx + (size_t)(m0 + lrow) * k_pad + kn) : zero;
            rb = (b_ok && kn < p.k) ? *(const int4 *)(w + (size_t)(n0 + lrow) * p.k + kn) : zero;
        }
        int a[2][4], b[4][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const unsigned char *base = As + (wm * 32 + i * 16 + g) * MMA_PITCH + q4 * 4;
            a[i][0] = *(const int *)(base);
            a[i][1] = *(const int *)(base + 8 * MMA_PITCH);
            a[i][2] = *(const int *)(base + 16);
            a[i][3] = *(const int *)(base + 8 * MMA_PITCH + 16);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned char *base = Bs + (wn * 32 + j * 8 + g) * MMA_PITCH + q4 * 4;
            b[j][0] = *(const int *)(base);
            b[j][1] = *(const int *)(base + 16);
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                mma_s8(acc[i][j], a[i], b[j]);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t t = m0 + wm * 32 + i * 16 + g + (e >= 2 ? 8 : 0);
                const uint32_t o = n0 + wn * 32 + j * 8 + q4 * 2 + (e & 1);
                if (t < p.n_tok && o < p.n_out)
                    mm_epilogue(p, t, o, acc[i][j][e], sx[t]);
            }
}
#endif /* !DRAY_GPU_HIP */

/* -------------------------------------------------------------- launcher */

extern "C" int dray_gk_matmul(const struct gk_matmul *p, void *stream)
{
    gpuStream_t st = (gpuStream_t)stream;
    if (p->n_tok == 0 || p->n_out == 0)
        return 0;
    const unsigned wpb = 256 / GPU_WARP; /* warps (= output rows) per k_dot block */
    const dim3 dot_grid((p->n_out + wpb - 1) / wpb, (p->n_tok + MM_NT - 1) / MM_NT);
    if (p->is_f32) {
        k_dot_f32<<<dot_grid, 256, 0, st>>>(*p);
        return GK_LAUNCH_RESULT();
    }
    const uint32_t k_pad = (uint32_t)round_up(p->k, MM_KALIGN);
    int8_t *qx = (int8_t *)p->scratch;
    float *sx = (float *)((char *)p->scratch + round_up((size_t)p->n_tok * k_pad, 256));
    k_quantize<<<p->n_tok, 256, 0, st>>>(*p, qx, sx, k_pad);
    int rc = GK_LAUNCH_RESULT();
    if (rc)
        return rc;
    const bool aligned = p->k % 16 == 0 && ((uintptr_t)p->w % 16) == 0;
#if !defined(DRAY_GPU_HIP)
    if (p->use_mma && aligned && p->n_tok > MM_NT) {
        dim3 grid((p->n_out + MMA_BN - 1) / MMA_BN, (p->n_tok + MMA_BM - 1) / MMA_BM);
        k_mma<<<grid, 128, 0, st>>>(*p, qx, sx, k_pad);
        return GK_LAUNCH_RESULT();
    }
#endif
    if (aligned)
        k_dot<true><<<dot_grid, 256, 0, st>>>(*p, qx, sx, k_pad);
    else
        k_dot<false><<<dot_grid, 256, 0, st>>>(*p, qx, sx, k_pad);
    return GK_LAUNCH_RESULT();
}
