/* Packed weights (backend.h, "Packed weights", ABI version 3; two-level
 * scales, version 4).
 *
 * Device layout of one handle (backends/opencl/ocl_packed.c writes it): one
 * buffer of five planes, each row-major over the n_out*G groups (gi = o*G + g)
 * or the n_out*S super-blocks of 256 inputs (si = o*S + g/8):
 *   lo  16 bytes per group (4, 5 and 6 bits: the host's nibble bytes as given),
 *       32 bytes per group (8 bits: the codes)                 at byte 0
 *   hi  per group, 5 bits: one uint, bit j = bit 4 of code j;
 *       6 bits: one uint2, bits 2j, 2j+1 = bits 4-5 of code j   at off_hi
 *   sub two levels only, per super-block: 4/5 bits, the 8 groups' 6-bit (s, n)
 *       in 12 bytes as GGUF packs them (pk_sn); 6 bits, the 16 int8 half-group
 *       scales                                                 at off_sub
 *   d   one f32 or f16 per group; two levels: the f16 D per super-block, at off_d
 *   m   the same, with a min only (two levels: M)              at off_m
 * One level, that is the host's bytes exactly (5 bits: each 20-byte group
 * split into its 16 + 4); two levels, GGUF's bytes per super-block (144, 176,
 * 210 for Q4_K, Q5_K, Q6_K). Every group's codes start 16-byte aligned and
 * load as one or two uint4. Neighbouring work-items of a row take neighbouring
 * groups, so their uint4 (and d, m) loads are contiguous: coalesced.
 *
 * Runtime format arguments (uniform per launch, so the branches cost little):
 * bits 4/5/6/8, f16 (d and m are halves), has_min, z (the zero point: 8, 16,
 * 32, 0), super (two-level scales). */

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

/* The 32 codes of group gi as two char16 (codes 0..15 and 16..31); 4-, 5-
 * and 6-bit codes are 0..63, so they fit a signed char for the int8 dot. */
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
    const uint16 sh = (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    if (bits == 5) {
        uint h = ((__global const uint *)(w + off_hi))[gi];
        n0 |= convert_uchar16(((uint16)(h) >> sh) & (uint16)(1)) << (uchar16)(4);
        n1 |= convert_uchar16(((uint16)(h >> 16) >> sh) & (uint16)(1)) << (uchar16)(4);
    } else if (bits == 6) {
        uint2 h = ((__global const uint2 *)(w + off_hi))[gi];
        n0 |= convert_uchar16(((uint16)(h.x) >> (sh * 2u)) & (uint16)(3)) << (uchar16)(4);
        n1 |= convert_uchar16(((uint16)(h.y) >> (sh * 2u)) & (uint16)(3)) << (uchar16)(4);
    }
    *c0 = as_char16(n0);
    *c1 = as_char16(n1);
}

/* Code j (0..31) of group gi, one at a time (embed). */
inline int pk_code(__global const uchar *w, ulong off_hi, uint bits, size_t gi, uint j)
{
    if (bits == 8)
        return ((__global const char *)w)[gi * 32 + j];
    uchar b = w[gi * 16 + (j & 15)];
    int c = j < 16 ? (b & 15) : (b >> 4);
    __global const uint *hi = (__global const uint *)(w + off_hi);
    if (bits == 5)
        c |= (int)((hi[gi] >> j) & 1u) << 4;
    else if (bits == 6)
        c |= (int)((hi[2 * gi + j / 16] >> (2 * (j % 16))) & 3u) << 4;
    return c;
}

/* (s, n) of group j (0..7) of a super-block from its 12 bytes q, unpacked as
 * GGUF's get_scale_min_k4: j < 4 in the low 6 bits of q[j], q[j+4]; j >= 4
 * split between a nibble of q[j+4] and the top 2 bits of q[j-4], q[j]. */
inline uint2 pk_sn(__global const uchar *q, uint j)
{
    if (j < 4)
        return (uint2)(q[j] & 63u, q[j + 4] & 63u);
    return (uint2)((q[j + 4] & 15u) | (uint)(q[j - 4] >> 6) << 4,
                   (uint)(q[j + 4] >> 4) | (uint)(q[j] >> 6) << 4);
}

/* d and m' of group g of row o, two levels with a min (4/5 bits): D*s and
 * -(M*n) in f32, as backend.h forms them. */
inline float2 pk_dm_k(__global const uchar *w, ulong off_sub, ulong off_d, ulong off_m, uint k,
                      size_t o, uint g)
{
    size_t si = o * (k / 256) + g / 8;
    uint2 sn = pk_sn(w + off_sub + si * 12, g % 8);
    float D = vload_half(si, (__global const half *)(w + off_d));
    float M = vload_half(si, (__global const half *)(w + off_m));
    return (float2)(D * (float)sn.x, -(M * (float)sn.y));
}

/* d of the two half-groups of group g of row o, 6 bits: D * sub (m' = -32 d). */
inline float2 pk_d6(__global const uchar *w, ulong off_sub, ulong off_d, uint k, size_t o, uint g)
{
    size_t si = o * (k / 256) + g / 8;
    __global const char *s = (__global const char *)(w + off_sub) + si * 16 + (g % 8) * 2;
    float D = vload_half(si, (__global const half *)(w + off_d));
    return (float2)(D * (float)s[0], D * (float)s[1]);
}

/* d and m' of the scale unit holding input c of row o (every format): a
 * group, or a half-group with 6 bits. */
inline float2 pk_unit_dm(__global const uchar *w, ulong off_sub, ulong off_d, ulong off_m,
                         uint bits, uint f16, uint has_min, int z, uint super, uint k, size_t o,
                         uint c)
{
    if (!super)
        return pk_dm(w, off_d, off_m, f16, has_min, z, o * (k / 32) + c / 32);
    if (bits != 6)
        return pk_dm_k(w, off_sub, off_d, off_m, k, o, c / 32);
    float2 dd = pk_d6(w, off_sub, off_d, k, o, c / 32);
    float d = (c / 16) % 2 ? dd.y : dd.x;
    return (float2)(d, -32.0f * d);
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

/* One group's codes and scales for the dot: (d, m') per group, or with 6 bits
 * the two half-groups' d with the codes centred (code - 32, in -32..31), so
 * that each half's sum(q*(code-32)) carries its m' = -32 d exactly. */
inline float2 pk_group(__global const uchar *w, ulong off_hi, ulong off_sub, ulong off_d,
                       ulong off_m, uint bits, uint f16, uint has_min, int z, uint super, uint k,
                       size_t o, uint g, char16 *c0, char16 *c1)
{
    pk_codes(w, off_hi, bits, o * (k / 32) + g, c0, c1);
    if (!super)
        return pk_dm(w, off_d, off_m, f16, has_min, z, o * (k / 32) + g);
    if (bits != 6)
        return pk_dm_k(w, off_sub, off_d, off_m, k, o, g);
    *c0 -= (char16)(32);
    *c1 -= (char16)(32);
    return pk_d6(w, off_sub, off_d, k, o, g);
}

/* One group's term before sx: d * sum(q*code) + m' * sum(q), or with 6 bits
 * d0 * sum_h0(q*(code-32)) + d1 * sum_h1(...), exact int32 sums each. */
inline float pk_term(__global const char *qg, char16 c0, char16 c1, float2 dm, float sq, uint six)
{
    int s0 = dray_dot16(vload16(0, qg), c0, 0);
    if (six)
        return dm.x * (float)s0 + dm.y * (float)dray_dot16(vload16(1, qg), c1, 0);
    return dm.x * (float)dray_dot16(vload16(1, qg), c1, s0) + dm.y * sq;
}

/* out[t][o] (+)= sum over passes and groups of sx * (d * sum(q*code) + m' * sum(q)).
 * A work-group of DRAY_WG items is 2^(6 - lanes_log2) output rows of
 * 2^lanes_log2 lanes; lane l takes groups l, l + lanes, ... of its row against
 * PK_TT activation rows at a time, then the lanes sum in local memory. PK_TT
 * is a multiple of passes, so a sweep never splits a token's passes.
 * Grid (DRAY_WG * ceil(n_out / rows per group)). */
__kernel __attribute__((reqd_work_group_size(DRAY_WG, 1, 1)))
void pk_matmul(__global const uchar *w, ulong off_hi, ulong off_sub, ulong off_d, ulong off_m,
               uint bits, uint f16, uint has_min, int z, uint super, __global const char *q,
               __global const float2 *sq, uint passes, __global float *out, ulong out_off,
               uint stride_out, uint n_tok, uint n_out, uint k, uint lanes_log2, uint accumulate)
{
    __local float part[PK_TT][DRAY_WG];
    uint lid = get_local_id(0), lanes = 1u << lanes_log2, lane = lid & (lanes - 1u);
    size_t o = get_group_id(0) * (DRAY_WG >> lanes_log2) + (lid >> lanes_log2);
    bool live = o < n_out;
    uint G = k / 32, n_rows = n_tok * passes, six = super && bits == 6;
    for (uint r0 = 0; r0 < n_rows; r0 += PK_TT) {
        uint nr = min((uint)PK_TT, n_rows - r0);
        float acc[PK_TT];
        for (uint j = 0; j < PK_TT; j++)
            acc[j] = 0.0f;
        for (uint g = lane; live && g < G; g += lanes) {
            char16 c0, c1;
            float2 dm = pk_group(w, off_hi, off_sub, off_d, off_m, bits, f16, has_min, z, super,
                                 k, o, g, &c0, &c1);
            for (uint j = 0; j < PK_TT; j++) {
                if (j >= nr)
                    break;
                size_t row = r0 + j;
                float2 xs = sq[row * G + g];
                acc[j] += xs.x * pk_term(q + row * k + 32 * g, c0, c1, dm, xs.y, six);
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
                       ulong off_hi, ulong off_sub, ulong off_d, ulong off_m, uint bits, uint f16,
                       uint has_min, int z, uint super, __global float *out, ulong out_off,
                       uint dim, uint n_tok, float scale)
{
    size_t i = get_global_id(0), t = get_global_id(1);
    if (i >= dim || t >= n_tok)
        return;
    size_t o = (size_t)ids[ids_off + t];
    int c = pk_code(w, off_hi, bits, o * (dim / 32) + i / 32, (uint)(i % 32));
    float2 dm = pk_unit_dm(w, off_sub, off_d, off_m, bits, f16, has_min, z, super, dim, o, (uint)i);
    out[out_off + t * dim + i] = ((float)c * dm.x + dm.y) * scale;
}
