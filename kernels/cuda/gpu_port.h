/*
 * gpu_port.h — one spelling for CUDA and ROCm/HIP.
 *
 * The CUDA plugin (nvcc for .cu, the C compiler for the host glue) and the HIP
 * plugin (hipcc for the same .cu files, the C compiler for the same glue) both
 * include this header; DRAY_GPU_HIP selects HIP. Host code uses the gpu* names
 * below, device code the GPU_* helpers. Everything here is a macro or a static
 * inline, so it adds no symbols to either plugin.
 *
 * Warp size is a compile-time parameter of the kernels: 32 lanes on NVIDIA, 64
 * on the AMD CDNA targets we build (gfx90a, gfx940 run wave64).
 */
#ifndef DRAY_GPU_PORT_H
#define DRAY_GPU_PORT_H

#if defined(DRAY_GPU_HIP)
/* ------------------------------------------------------------------ HIP */
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#else
#include <hip/hip_runtime_api.h>
#endif
#define GPU_API_NAME "HIP"
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipEvent_t gpuEvent_t;
typedef hipGraph_t gpuGraph_t;
typedef hipGraphExec_t gpuGraphExec_t;
typedef hipDeviceProp_t gpuDeviceProp;
#define gpuSuccess hipSuccess
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuSetDevice hipSetDevice
#define gpuMemGetInfo hipMemGetInfo
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuGraphDestroy hipGraphDestroy
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventBlockingSync hipEventBlockingSync
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuMemsetAsync hipMemsetAsync
#define gpuEventCreate hipEventCreate
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuGetLastError hipGetLastError
#define gpuGetErrorName hipGetErrorName
#define gpuGetErrorString hipGetErrorString
#define gpuRuntimeGetVersion hipRuntimeGetVersion
#define gpuDriverGetVersion hipDriverGetVersion
#define gpuErrorNoDevice hipErrorNoDevice
#define gpuErrorInsufficientDriver hipErrorInsufficientDriver
static inline gpuError_t gpu_graph_instantiate(gpuGraphExec_t *exec, gpuGraph_t g)
{
    return hipGraphInstantiate(exec, g, NULL, NULL, 0);
}
#else
/* ----------------------------------------------------------------- CUDA */
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#else
#include <cuda_runtime_api.h>
#endif
#define GPU_API_NAME "CUDA"
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaEvent_t gpuEvent_t;
typedef cudaGraph_t gpuGraph_t;
typedef cudaGraphExec_t gpuGraphExec_t;
typedef struct cudaDeviceProp gpuDeviceProp;
#define gpuSuccess cudaSuccess
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuSetDevice cudaSetDevice
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuStreamCaptureModeRelaxed cudaStreamCaptureModeRelaxed
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuGraphDestroy cudaGraphDestroy
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventBlockingSync cudaEventBlockingSync
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuMemsetAsync cudaMemsetAsync
#define gpuEventCreate cudaEventCreate
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuGetLastError cudaGetLastError
#define gpuGetErrorName cudaGetErrorName
#define gpuGetErrorString cudaGetErrorString
#define gpuRuntimeGetVersion cudaRuntimeGetVersion
#define gpuDriverGetVersion cudaDriverGetVersion
#define gpuErrorNoDevice cudaErrorNoDevice
#define gpuErrorInsufficientDriver cudaErrorInsufficientDriver
static inline gpuError_t gpu_graph_instantiate(gpuGraphExec_t *exec, gpuGraph_t g)
{
    return cudaGraphInstantiate(exec, g, 0); /* CUDA >= 12 signature */
}
#endif

/* ------------------------------------------------------- device helpers */
#if defined(__CUDACC__) || defined(__HIPCC__)

#if defined(DRAY_GPU_HIP)
#define GPU_WARP 64 /* CDNA wavefront */
#define GPU_SHFL_XOR(v, m) __shfl_xor((v), (m), GPU_WARP)
#define GPU_SHFL(v, src) __shfl((v), (src), GPU_WARP)
/* a wavefront runs in lockstep; this only stops the compiler reordering LDS ops */
#define GPU_SYNCWARP() __builtin_amdgcn_wave_barrier()
/* Signed 4x int8 dot product with int32 accumulate. Written out: the compiler
 * forms v_dot4 where the target has it; no MFMA in v1. */
static __device__ __forceinline__ int gpu_dot4(int a, int b, int c)
{
    c += (int)(signed char)(a) * (int)(signed char)(b);
    c += (int)(signed char)(a >> 8) * (int)(signed char)(b >> 8);
    c += (int)(signed char)(a >> 16) * (int)(signed char)(b >> 16);
    c += (int)(signed char)(a >> 24) * (int)(signed char)(b >> 24);
    return c;
}
#else
#define GPU_WARP 32
#define GPU_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define GPU_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src))
#define GPU_SYNCWARP() __syncwarp()
static __device__ __forceinline__ int gpu_dot4(int a, int b, int c)
{
    return __dp4a(a, b, c);
}
#endif

#endif /* device compiler */
#endif /* DRAY_GPU_PORT_H */
