/* RMSNorm over rows of n floats: one work-group per row (row = t*n_head + h).
 * Grid (DRAY_WG, n_tok*n_head). Sum of squares: strided partial sums per item,
 * then a tree over the group (pairwise), in double when the device has it (the
 * reference sums in double). out may alias x exactly: every item reads its own
 * elements again in the second loop before writing them, and the whole group has
 * finished reading (barrier) before anyone writes. */
#ifdef DRAY_OCL_FP64
typedef double acc_t;
#else
typedef float acc_t;
#endif

__kernel __attribute__((reqd_work_group_size(DRAY_WG, 1, 1)))
void rmsnorm(__global const float *x, ulong x_off, __global const float *w, ulong w_off,
             __global float *out, ulong out_off, uint n_head, uint n, uint stride_x,
             uint stride_out, float eps)
{
    __local acc_t part[DRAY_WG];
    uint lid = get_local_id(0);
    size_t row = get_group_id(1);
    size_t t = row / n_head, h = row % n_head;
    __global const float *xr = x + x_off + t * stride_x + h * n;
    __global float *yr = out + out_off + t * stride_out + h * n;

    acc_t s = 0;
    for (uint i = lid; i < n; i += DRAY_WG)
        s += (acc_t)xr[i] * (acc_t)xr[i];
    part[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint k = DRAY_WG / 2; k > 0; k >>= 1) {
        if (lid < k)
            part[lid] += part[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float inv = (float)((acc_t)1 / sqrt(part[0] / (acc_t)n + (acc_t)eps));
    w += w_off;
    for (uint i = lid; i < n; i += DRAY_WG)
        yr[i] = xr[i] * inv * w[i];
}
