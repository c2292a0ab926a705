/* Packed weights (backend.h, "Packed weights", ABI version 3).
 *
 * Device layout of one handle (backends/opencl/ocl_packed.c writes it): one
 * buffer of four planes, each row-major over the n_out*G groups (gi = o*G + g):
 *   lo  16 bytes per group (4 and 5 bits: the host's nibble bytes as given),
 *       32 bytes per group (8 bits: the codes)                 at byte 0
 *   hi  one uint per group, bit j = bit 4 of code j (5 bits only) at off_hi
 *   d   one f32 or f16 per group                               at off_d
 *   m   the same, with a min only                              at off_m
 * That is the host's bytes exactly (5 bits: each 20-byte group split into its
 * 16 + 4), so every group's codes start 16-byte aligned and load as one or two
 * uint4. Neighbouring work-items of a row take neighbouring groups, so their
 * uint4 (and d, m) loads are contiguous: coalesced.
 *
 * Runtime format arguments (uniform per launch, so the branches cost little):
 * bits 4/5/8, f16 (d and m are halves), has_min, z (the zero point: 8, 16, 0). */

/* d and m' (m, or -z*d without a min) of group gi, widened to f32 exactly. */
inline float2 pk_dm(__global const uchar *w, ulong off_d, ulong off_m, uint f16, uint has_min,
                    int z, size_t gi)
{
    float d, m;
    if (f16) {
        d = vload_half(gi, (__global const half *)(w + off_d));
        m = has_min ? vload_half(gi, (__global const half *)(w + off_m)) : 0.0f;
    } else {
        d = ((__global const float *)(w + off_d))[gi];
        m = has_min ? ((__global const float *)(w + off_m))[gi] : 0.0f;
    }
    return (float2)(d, has_min ? m : -(float)z * d);
}

/* The 32 codes of group gi as two char16 (codes 0..15 and 16..31); 4- and
 * 5-bit codes are 0..31, so they fit a signed char for the int8 dot. */
inline void pk_codes(__global const uchar *w, ulong off_hi, uint bits, size_t gi, char16 *c0,
                     char16 *c1)
{
    __global const uint4 *lo = (__global const uint4 *)w;
    if (bits == 8) {
        *c0 = as_char16(lo[2 * gi]);
        *c1 = as_char16(lo[2 * gi + 1]);
        return;
    }
    uchar16 b = as_uchar16(lo[gi]);
    uchar16 n0 = b & (uchar16)(15), n1 = b >> (uchar16)(4);
    if (bits == 5) {
        uint h = ((__global const uint *)(w + off_hi))[gi];
        const uint16 sh = (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        n0 |= convert_uchar16(((uint16)(h) >> sh) & (uint16)(1)) << (uchar16)(4);
        n1 |= convert_uchar16(((uint16)(h >> 16) >> sh) & (uint16)(1)) << (uchar16)(4);
    }
    *c0 = as_char16(n0);
    *c1 = as_char16(n1);
}

/* backend.h's activation rule on 16 of a group's inputs, given the group's sx. */
inline char16 pk_q16(float16 v, float s)
{
    if (s == 0.0f)
        return (char16)(0);
    return convert_char16(clamp(rint(v / s), -127.0f, 127.0f));
}

inline float pk_amax(float16 a, float16 b)
{
    float16 m16 = fmax(fabs(a), fabs(b));
    float8 m8 = fmax(m16.lo, m16.hi);
    float4 m4 = fmax(m8.lo, m8.hi);
    float2 m2 = fmax(m4.lo, m4.hi);
    return fmax(m2.x, m2.y);
}

inline int pk_sum16(char16 c)
{
    int16 v = convert_int16(c);
    int8 s8 = v.lo + v.hi;
    int4 s4 = s8.lo + s8.hi;
    int2 s2 = s4.lo + s4.hi;
    return s2.x + s2.y;
}

/* Per token and group of 32: q (and for passes = 2 the residual pass q') into
 * row t*passes + p of q [n_tok*passes][k] int8, and (sx, sum q) into sq
 * [n_tok*passes][G] float2 (the sum is exact in f32: |sum| <= 32*127).
 * One work-item per group. Grid (G, n_tok). */
__kernel void pk_quantize(__global const float *x, ulong x_off, uint stride_x, uint k, uint n_tok,
                          uint passes, __global char *q, __global float2 *sq)
{
    size_t g = get_global_id(0), t = get_global_id(1);
    uint G = k / 32;
    if (g >= G || t >= n_tok)
        return;
    __global const float *xg = x + x_off + t * stride_x + 32 * g;
    float16 a = vload16(0, xg), b = vload16(1, xg);
    for (uint p = 0; p < passes; p++) {
        size_t row = t * passes + p;
        float s = pk_amax(a, b) / 127.0f;
        char16 qa = pk_q16(a, s), qb = pk_q16(b, s);
        vstore16(qa, 0, q + row * k + 32 * g);
        vstore16(qb, 1, q + row * k + 32 * g);
        sq[row * G + g] = (float2)(s, (float)(pk_sum16(qa) + pk_sum16(qb)));
        /* the residual r = x - q*sx, rounded once per operation (FP_CONTRACT off) */
        a = a - convert_float16(qa) * s;
        b = b - convert_float16(qb) * s;
    }
}

#define PK_TT 4 /* activation rows (token passes) per sweep over a weight row */

/* out[t][o] (+)= sum over passes and groups of sx * (d * sum(q*code) + m' * sum(q)).
 * A work-group of DRAY_WG items is 2^(6 - lanes_log2) output rows of
 * 2^lanes_log2 lanes; lane l takes groups l, l + lanes, ... of its row against
 * PK_TT activation rows at a time, then the lanes sum in local memory. PK_TT
 * is a multiple of passes, so a sweep never splits a token's passes.
 * Grid (DRAY_WG * ceil(n_out / rows per group)). */
__kernel __attribute__((reqd_work_group_size(DRAY_WG, 1, 1)))
void pk_matmul(__global const uchar *w, ulong off_hi, ulong off_d, ulong off_m, uint bits, uint f16,
               uint has_min, int z, __global const char *q, __global const float2 *sq, uint passes,
               __global float *out, ulong out_off, uint stride_out, uint n_tok, uint n_out, uint k,
               uint lanes_log2, uint accumulate)
{
    __local float part[PK_TT][DRAY_WG];
    uint lid = get_local_id(0), lanes = 1u << lanes_log2, lane = lid & (lanes - 1u);
    size_t o = get_group_id(0) * (DRAY_WG >> lanes_log2) + (lid >> lanes_log2);
    bool live = o < n_out;
    uint G = k / 32, n_rows = n_tok * passes;
    for (uint r0 = 0; r0 < n_rows; r0 += PK_TT) {
        uint nr = min((uint)PK_TT, n_rows - r0);
        float acc[PK_TT];
        for (uint j = 0; j < PK_TT; j++)
            acc[j] = 0.0f;
        for (uint g = lane; live && g < G; g += lanes) {
            size_t gi = o * G + g;
            char16 c0, c1;
            pk_codes(w, off_hi, bits, gi, &c0, &c1);
            float2 dm = pk_dm(w, off_d, off_m, f16, has_min, z, gi);
            for (uint j = 0; j < PK_TT; j++) {
                if (j >= nr)
                    break;
                size_t row = r0 + j;
                __global const char *qg = q + row * k + 32 * g;
                int s = dray_dot16(vload16(0, qg), c0, 0);
                s = dray_dot16(vload16(1, qg), c1, s);
                float2 xs = sq[row * G + g];
                acc[j] += xs.x * (dm.x * (float)s + dm.y * xs.y);
            }
        }
        for (uint j = 0; j < PK_TT; j++)
            part[j][lid] = acc[j];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint s = lanes / 2; s > 0; s >>= 1) {
            if (lane < s)
                for (uint j = 0; j < PK_TT; j++)
                    part[j][lid] += part[j][lid + s];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (live && lane == 0)
            for (uint j = 0; j < nr; j += passes) {
                __global float *y = out + out_off + (size_t)((r0 + j) / passes) * stride_out + o;
                float v = accumulate ? *y : 0.0f;
                for (uint p = 0; p < passes; p++)
                    v += part[j + p][lid];
                *y = v;
            }
        barrier(CLK_LOCAL_MEM_FENCE); /* part is rewritten by the next sweep */
    }
}

/* out[t][i] = W[ids[t]][i] * scale, W = code * d + m' (one rounding each, as the
 * reference dray_util_packed_row). The host checked every id. Grid (dim, n_tok). */
__kernel void pk_embed(__global const int *ids, ulong ids_off, __global const uchar *w,
                       ulong off_hi, ulong off_d, ulong off_m, uint bits, uint f16, uint has_min,
                       int z, __global float *out, ulong out_off, uint dim, uint n_tok, float scale)
{
    size_t i = get_global_id(0), t = get_global_id(1);
    if (i >= dim || t >= n_tok)
        return;
    size_t gi = (size_t)ids[ids_off + t] * (dim / 32) + i / 32;
    uint j = (uint)(i % 32);
    int c;
    if (bits == 8) {
        c = ((__global const char *)w)[gi * 32 + j];
    } else {
        uchar b = w[gi * 16 + (j & 15)];
        c = j < 16 ? (b & 15) : (b >> 4);
        if (bits == 5)
            c |= (int)((((__global const uint *)(w + off_hi))[gi] >> j) & 1u) << 4;
    }
    float2 dm = pk_dm(w, off_d, off_m, f16, has_min, z, gi);
    out[out_off + t * dim + i] = ((float)c * dm.x + dm.y) * scale;
}
