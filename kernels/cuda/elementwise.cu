/*
 * elementwise.cu — the small ops: fill, embed, rmsnorm, rope, gated activation,
 * residual add, KV store. Each is a simple kernel; they are memory bound and
 * short, so clarity beats fusion here. Semantics: include/dray/backend.h.
 */
#include "gpu_common.cuh"

/* ----------------------------------------------------------------- fill */

static __global__ void k_fill(uint32_t *dst, uint64_t n, uint32_t pattern)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        dst[i] = pattern;
}

extern "C" int dray_gk_fill(const struct gk_fill *p, void *stream)
{
    if (p->n_words == 0)
        return 0;
    k_fill<<<gk_blocks(p->n_words, 256, 65535), 256, 0, (gpuStream_t)stream>>>(p->dst, p->n_words,
                                                                             p->pattern);
    return GK_LAUNCH_RESULT();
}

/* ---------------------------------------------------------------- embed */

/* One block per token. An id outside [0, n_rows) writes zeros and raises a flag. */
static __global__ void k_embed(struct gk_embed p)
{
    const uint32_t t = blockIdx.x;
    const int32_t id = p.ids[t];
    float *o = p.out + (size_t)t * p.dim;
    if (id < 0 || (uint32_t)id >= p.n_rows) {
        for (uint32_t i = threadIdx.x; i < p.dim; i += blockDim.x)
            o[i] = 0.0f;
        if (threadIdx.x == 0)
            atomicOr(p.flag, (unsigned)GK_FLAG_EMBED_ID);
        return;
    }
    if (p.is_i8) {
        const int8_t *row = (const int8_t *)p.table + (size_t)id * p.dim;
        const float rs = p.row_scale[id];
        for (uint32_t i = threadIdx.x; i < p.dim; i += blockDim.x)
            o[i] = (float)row[i] * rs * p.scale;
    } else {
        const float *row = (const float *)p.table + (size_t)id * p.dim;
        for (uint32_t i = threadIdx.x; i < p.dim; i += blockDim.x)
            o[i] = row[i] * p.scale;
    }
}

extern "C" int dray_gk_embed(const struct gk_embed *p, void *stream)
{
    if (p->n_tok == 0 || p->dim == 0)
        return 0;
    k_embed<<<p->n_tok, 256, 0, (gpuStream_t)stream>>>(*p);
    return GK_LAUNCH_RESULT();
}

/* -------------------------------------------------------------- rmsnorm */

/* One block per (token, head) row. Each thread sums a strided subset in f32,
 * then a tree over lanes and warps: pairwise-style partial sums, as asked. */
static __global__ void k_rmsnorm(struct gk_rmsnorm p)
{
    __shared__ float red[1024 / GPU_WARP];
    const uint32_t t = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
    const float *x = p.x + (size_t)t * p.stride_x + (size_t)h * p.n;
    float *y = p.out + (size_t)t * p.stride_out + (size_t)h * p.n;
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < p.n; i += blockDim.x)
        ss += x[i] * x[i];
    ss = block_sum(ss, red);
    const float r = sqrtf(ss / (float)p.n + p.eps);
    /* all reads of x are done before block_sum's barrier: in place is safe */
    for (uint32_t i = threadIdx.x; i < p.n; i += blockDim.x)
        y[i] = x[i] / r * p.w[i];
}

extern "C" int dray_gk_rmsnorm(const struct gk_rmsnorm *p, void *stream)
{
    uint64_t rows = (uint64_t)p->n_tok * p->n_head;
    if (rows == 0 || p->n == 0)
        return 0;
    unsigned threads = p->n >= 1024 ? 512 : 256;
    k_rmsnorm<<<(unsigned)rows, threads, 0, (gpuStream_t)stream>>>(*p);
    return GK_LAUNCH_RESULT();
}

/* ----------------------------------------------------------------- rope */

/* One thread per rotated pair. The angle is formed and reduced in double:
 * p * freq reaches 2^17 rad, where an f32 angle is off by ~1e-2. Version 4:
 * the angle is divided by the pair's frequency factor, cos and sin scaled by
 * mscale. */
static __global__ void k_rope(struct gk_rope p)
{
    const uint32_t half = p.n_rot / 2;
    const uint64_t n = (uint64_t)p.n_tok * p.n_head * half;
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < n;
         g += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t i = (uint32_t)(g % half);
        const uint64_t th = g / half;
        const uint32_t h = (uint32_t)(th % p.n_head), t = (uint32_t)(th / p.n_head);
        float *v = p.x + (size_t)t * p.stride + (size_t)h * p.head_dim;
        double theta = (double)p.pos[t] * (double)p.freq_scale *
                       pow((double)p.base, -2.0 * (double)i / (double)p.n_rot);
        if (p.ff)
            theta /= (double)p.ff[i];
        double s, c;
        sincos(theta, &s, &c);
        const float cf = (float)(c * p.mscale), sf = (float)(s * p.mscale);
        const float a = v[i], b = v[i + half];
        v[i] = a * cf - b * sf;
        v[i + half] = a * sf + b * cf;
    }
}

extern "C" int dray_gk_rope(const struct gk_rope *p, void *stream)
{
    uint64_t n = (uint64_t)p->n_tok * p->n_head * (p->n_rot / 2);
    if (n == 0)
        return 0;
    k_rope<<<gk_blocks(n, 256, 65535), 256, 0, (gpuStream_t)stream>>>(*p);
    return GK_LAUNCH_RESULT();
}

/* ------------------------------------------------------------ gated act */

static __global__ void k_gated_act(struct gk_gated_act p)
{
    const uint64_t n = (uint64_t)p.n_tok * p.n;
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < n;
         g += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(g / p.n), i = (uint32_t)(g % p.n);
        const float x = p.gate[(size_t)t * p.stride_gate + i];
        const float u = p.up[(size_t)t * p.stride_up + i];
        float a;
        if (p.act == 0) /* gelu-tanh; sqrt(2/pi) = 0.7978845608... */
            a = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
        else
            a = x / (1.0f + expf(-x));
        p.out[(size_t)t * p.stride_out + i] = a * u;
    }
}

extern "C" int dray_gk_gated_act(const struct gk_gated_act *p, void *stream)
{
    uint64_t n = (uint64_t)p->n_tok * p->n;
    if (n == 0)
        return 0;
    k_gated_act<<<gk_blocks(n, 256, 65535), 256, 0, (gpuStream_t)stream>>>(*p);
    return GK_LAUNCH_RESULT();
}

/* ------------------------------------------------------------------ add */

static __global__ void k_add(const float *a, const float *b, float *out, uint64_t n)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

extern "C" int dray_gk_add(const struct gk_add *p, void *stream)
{
    if (p->n == 0)
        return 0;
    k_add<<<gk_blocks(p->n, 256, 65535), 256, 0, (gpuStream_t)stream>>>(p->a, p->b, p->out, p->n);
    return GK_LAUNCH_RESULT();
}

/* ------------------------------------------------------------- kv store */

/* One warp per (token, kv head, K or V). int8: the warp finds max|x|, then
 * each lane quantizes its strided elements with the shared scale. */
static __global__ void k_kv_store(struct gk_kv_store p)
{
    const uint32_t lane = threadIdx.x % GPU_WARP;
    const uint64_t wg = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) / GPU_WARP;
    const uint32_t nkh = p.pool.n_kv_head, d = p.pool.head_dim;
    if (wg >= (uint64_t)p.n_tok * nkh * 2)
        return;
    const uint32_t which = (uint32_t)(wg % 2), h = (uint32_t)((wg / 2) % nkh);
    const uint32_t t = (uint32_t)(wg / 2 / nkh);
    const int32_t slot = p.slots[t];
    if (slot < 0)
        return;
    if ((uint32_t)slot >= p.pool.n_slots) {
        if (lane == 0)
            atomicOr(p.flag, (unsigned)GK_FLAG_KV_SLOT);
        return;
    }
    const float *x = which ? p.v + (size_t)t * p.stride_v + (size_t)h * d
                           : p.k + (size_t)t * p.stride_k + (size_t)h * d;
    const size_t row = (size_t)slot * nkh + h; /* [slot][kv head] */
    if (p.pool.is_i8) {
        int8_t *dst = (int8_t *)(which ? p.pool.v : p.pool.k) + row * d;
        float *sc = which ? p.pool.v_scale : p.pool.k_scale;
        float amax = 0.0f;
        for (uint32_t i = lane; i < d; i += GPU_WARP)
            amax = fmaxf(amax, fabsf(x[i]));
        amax = warp_max(amax);
        const float s = amax / 127.0f;
        for (uint32_t i = lane; i < d; i += GPU_WARP)
            dst[i] = (int8_t)quant_rne(x[i], s);
        if (lane == 0)
            sc[row] = s;
    } else {
        uint16_t *dst = (uint16_t *)(which ? p.pool.v : p.pool.k) + row * d;
        for (uint32_t i = lane; i < d; i += GPU_WARP)
            dst[i] = f32_to_f16_bits(x[i]);
    }
}

extern "C" int dray_gk_kv_store(const struct gk_kv_store *p, void *stream)
{
    uint64_t threads = (uint64_t)p->n_tok * p->pool.n_kv_head * 2 * GPU_WARP;
    if (threads == 0 || p->pool.head_dim == 0)
        return 0;
    unsigned bs = 4 * GPU_WARP;
    k_kv_store<<<(unsigned)((threads + bs - 1) / bs), bs, 0, (gpuStream_t)stream>>>(*p);
    return GK_LAUNCH_RESULT();
}
