/* Matmul, two kernels for the W8A8 path plus one for F32 weights.
 *   mm_quantize: one work-group per token: sx = max|x|/127 over non-outlier
 *                channels, q = rint(x/sx) clamped to [-127,127] (outliers -> 0).
 *                q is [n_tok][k] int8 in a scratch buffer, sx [n_tok] f32.
 *   mm_i8:       one work-item per (output channel, block of MM_TT tokens): exact
 *                int32 dot of q and w, then (float)isum * sx * wscale, plus the
 *                f32 outlier channels, plus out when accumulating.
 *   mm_f32:      one work-item per (output, token); f32 weights, sum in double
 *                when the device has fp64 (the reference does), else f32. */

#define MM_TT 4 /* tokens per work-item: each weight row is read once per block */

/* Is channel c in the strictly increasing list idx[0..n)? Binary search. */
inline bool dray_is_outlier(__global const int *idx, uint n, uint c)
{
    uint lo = 0, hi = n;
    while (lo < hi) {
        uint mid = (lo + hi) / 2;
        uint v = (uint)idx[mid];
        if (v == c)
            return true;
        if (v < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* Grid (DRAY_WG, n_tok). */
__kernel __attribute__((reqd_work_group_size(DRAY_WG, 1, 1)))
void mm_quantize(__global const float *x, ulong x_off, uint stride_x, uint k,
                 __global const int *idx, ulong idx_off, uint n_outlier,
                 __global char *q, __global float *sx)
{
    __local float part[DRAY_WG];
    uint lid = get_local_id(0);
    size_t t = get_group_id(1);
    __global const float *xr = x + x_off + t * stride_x;
    __global char *qr = q + t * k;
    idx += idx_off;

    float m = 0.0f;
    for (uint c = lid; c < k; c += DRAY_WG)
        if (!n_outlier || !dray_is_outlier(idx, n_outlier, c))
            m = fmax(m, fabs(xr[c]));
    part[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = DRAY_WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] = fmax(part[lid], part[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float s = part[0] / 127.0f;
    if (lid == 0)
        sx[t] = s;
    for (uint c = lid; c < k; c += DRAY_WG) {
        bool out = n_outlier && dray_is_outlier(idx, n_outlier, c);
        qr[c] = out ? (char)0 : dray_q8(xr[c], s);
    }
}

/* Exact int32 dot of 16 int8 pairs, added to acc. */
inline int dray_dot16(char16 a, char16 b, int acc)
{
#if defined(DRAY_OCL_INT_DOT) && defined(cl_khr_integer_dot_product)
    acc = dot_acc_sat(a.s0123, b.s0123, acc);
    acc = dot_acc_sat(a.s4567, b.s4567, acc);
    acc = dot_acc_sat(a.s89ab, b.s89ab, acc);
    acc = dot_acc_sat(a.scdef, b.scdef, acc);
    return acc;
#else
    /* |q*w| <= 127*128 fits a short; pairs of shorts are summed in int. */
    short16 p = convert_short16(a) * convert_short16(b);
    int8 s = convert_int8(p.lo) + convert_int8(p.hi);
    int4 s4 = s.lo + s.hi;
    int2 s2 = s4.lo + s4.hi;
    return acc + s2.x + s2.y;
#endif
}

/* Grid (n_out, ceil(n_tok / MM_TT)). */
__kernel void mm_i8(__global const char *q, __global const float *sx,
                    __global const char *w, ulong w_off, __global const float *ws, ulong ws_off,
                    __global float *out, ulong out_off, uint stride_out,
                    __global const float *x, ulong x_off, uint stride_x,
                    __global const int *idx, ulong idx_off,
                    __global const float *ow, ulong ow_off, uint n_outlier,
                    uint n_tok, uint n_out, uint k, uint accumulate)
{
    size_t o = get_global_id(0), t0 = get_global_id(1) * MM_TT;
    if (o >= n_out || t0 >= n_tok)
        return;
    uint nt = min((uint)MM_TT, (uint)(n_tok - t0));
    __global const char *wr = w + w_off + o * k;
    int acc[MM_TT] = {0};
    uint c = 0;
    for (; c + 16 <= k; c += 16) {
        char16 wv = vload16(0, wr + c);
        for (uint j = 0; j < nt; j++)
            acc[j] = dray_dot16(vload16(0, q + (t0 + j) * k + c), wv, acc[j]);
    }
    for (; c < k; c++)
        for (uint j = 0; j < nt; j++)
            acc[j] += (int)q[(t0 + j) * k + c] * (int)wr[c];

    float wsc = ws[ws_off + o];
    for (uint j = 0; j < nt; j++) {
        size_t t = t0 + j;
        float v = (float)acc[j] * sx[t] * wsc;
        __global const float *xr = x + x_off + t * stride_x;
        for (uint i = 0; i < n_outlier; i++)
            v += xr[idx[idx_off + i]] * ow[ow_off + o * n_outlier + i];
        __global float *y = out + out_off + t * stride_out + o;
        *y = accumulate ? *y + v : v;
    }
}

#ifdef DRAY_OCL_FP64
typedef double mm_acc_t;
#else
typedef float mm_acc_t;
#endif

/* Grid (n_out, n_tok). */
__kernel void mm_f32(__global const float *x, ulong x_off, uint stride_x,
                     __global const float *w, ulong w_off,
                     __global float *out, ulong out_off, uint stride_out,
                     uint n_tok, uint n_out, uint k, uint accumulate)
{
    size_t o = get_global_id(0), t = get_global_id(1);
    if (o >= n_out || t >= n_tok)
        return;
    __global const float *xr = x + x_off + t * stride_x;
    __global const float *wr = w + w_off + o * k;
    mm_acc_t s = 0;
    for (uint c = 0; c < k; c++)
        s += (mm_acc_t)xr[c] * (mm_acc_t)wr[c];
    float v = (float)s;
    __global float *y = out + out_off + t * stride_out + o;
    *y = accumulate ? *y + v : v;
}
