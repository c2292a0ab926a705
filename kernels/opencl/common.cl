/* Shared definitions for every dray OpenCL kernel. The host concatenates the
 * .cl files of kernels/opencl (this one first) into one program and builds it at
 * context open with these -D options:
 *   DRAY_OCL_INT_DOT  the device has cl_khr_integer_dot_product (packed 4x8 dots)
 *   DRAY_OCL_FP64     the device has cl_khr_fp64 (rope angles in double)
 * Conventions: every data argument is a base buffer plus an element offset
 * (`ulong *_off`), so views need no sub-buffers (which need alignment); strides
 * are in elements; work-group sizes are fixed per kernel (reqd_work_group_size)
 * and the host rounds global sizes up, so each kernel guards its bounds. */

/* The CPU reference rounds every product and sum separately; do the same. */
#pragma OPENCL FP_CONTRACT OFF

#ifdef DRAY_OCL_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

/* Work-group size of the row kernels (rmsnorm, quantize, kv_store, attention). */
#define DRAY_WG 64

/* Largest head_dim attention supports: each work-item keeps HD_MAX/DRAY_WG
 * accumulators in private memory. The host declines larger heads. */
#define DRAY_HD_MAX 512
#define DRAY_HD_PER_ITEM (DRAY_HD_MAX / DRAY_WG)

/* Round to nearest, ties to even, clamp to the symmetric int8 range [-127, 127]. */
inline char dray_q8(float x, float scale)
{
    if (scale == 0.0f)
        return 0;
    return (char)clamp(rint(x / scale), -127.0f, 127.0f);
}
