/*
 * gpu_common.cuh — device helpers shared by the kernel files: warp and block
 * reductions (lane count GPU_WARP from gpu_port.h), the int8 quantizer and the
 * half-precision bit conversions. Internal linkage only.
 */
#ifndef DRAY_GPU_COMMON_CUH
#define DRAY_GPU_COMMON_CUH

#include "gpu_port.h"
#include "gpu_kernels.h"

#define GK_LAUNCH_RESULT() ((int)gpuGetLastError())

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int m = GPU_WARP / 2; m > 0; m >>= 1)
        v += GPU_SHFL_XOR(v, m);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int m = GPU_WARP / 2; m > 0; m >>= 1)
        v = fmaxf(v, GPU_SHFL_XOR(v, m));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of GPU_WARP, <= 1024); every
 * thread gets the result. red must hold 1024 / GPU_WARP floats. */
static __device__ __forceinline__ float block_sum(float v, float *red)
{
    const int lane = threadIdx.x % GPU_WARP, wid = threadIdx.x / GPU_WARP;
    const int nw = blockDim.x / GPU_WARP;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0)
        red[wid] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

static __device__ __forceinline__ float block_max(float v, float *red)
{
    const int lane = threadIdx.x % GPU_WARP, wid = threadIdx.x / GPU_WARP;
    const int nw = blockDim.x / GPU_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[wid] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_max(v);
}

/* The house int8 rule (backend.h): q = x / s rounded to nearest, ties to even,
 * clamped to [-127, 127]; s = 0 gives 0. IEEE division (no fast-math), so the
 * result matches the CPU reference bit for bit. */
static __device__ __forceinline__ int quant_rne(float x, float s)
{
    if (s == 0.0f)
        return 0;
    int q = __float2int_rn(x / s);
    return q > 127 ? 127 : (q < -127 ? -127 : q);
}

static __device__ __forceinline__ float f16_bits_to_f32(uint16_t b)
{
    return __half2float(__ushort_as_half(b));
}

static __device__ __forceinline__ uint16_t f32_to_f16_bits(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

static inline unsigned gk_blocks(uint64_t n, unsigned per, unsigned cap)
{
    uint64_t b = (n + per - 1) / per;
    if (b == 0)
        b = 1;
    return (unsigned)(b > cap ? cap : b);
}

#endif
