#version 450
// Matmul on packed weights (backend.h, "Packed weights"), activations already
// quantized per (token, pass) row and group by quant_groups.comp:
//   out[t][o] (+)= sum over passes p, groups g of
//                  sx[t,p][g] * (d(o,g) * sum_c(q*code) + m'(o,g) * sum_c(q))
// with exact int32 group sums, m' = m (has_min) or -z*d.
// Weights stay in the host's row-major group order (vk_packed.c): codes of row o,
// group g are the B/4 words at (o*G + g) * B/4; d and m are [n_out][G] arrays,
// f32 words or f16 pairs (unpackHalf2x16). BITS (4, 5, 8) is compiled in; the
// scale type and the min are push constants (uniform branches).
// SUPER (two-level scales, version 4; BITS 4 or 5 with a min, or 6): d and m
// are the f16 D and M per super-block of 256 inputs, [n_out][S] (M is D again
// at 6 bits), and binding 6 holds the sub-scales per super-block: 4/5 bits,
// the 8 groups' 6-bit (s, n) in 12 bytes as GGUF packs them (d = D*s,
// m' = -(M*n)); 6 bits, 16 int8 half-group scales (d = D*sub, m' = -32 d),
// whose halves are summed apart with the codes centred (code - 32), so each
// half's int32 sum carries its m' exactly.
// Shape: a workgroup of RG = 4 output rows x L = 32 lanes (group x) and TT = 4
// tokens (group y). Lane l takes groups l, l+L, ...: the 32 lanes of a row read
// 32 consecutive groups, one contiguous run of weight bytes (coalesced), and
// each group's codes are decoded once for all TT tokens and both passes.
// Partial sums meet in a shared-memory tree per row. USE_DP4A uses the SPIR-V
// packed 4x8-bit signed dot product (codes 0..63 are non-negative bytes, and
// centred ones -32..31 signed bytes).
#include "common.glsl"
#define TT 4u  // tokens per group
#define RG 4u  // rows per group
#define L 32u  // lanes per row (RG * L = 128)
#if BITS == 4
#define WPG 4u // code words per group
#elif BITS == 5
#define WPG 5u
#elif BITS == 6
#define WPG 6u
#define SUPER 1
#else
#define WPG 8u
#endif
layout(local_size_x = 128) in;
#ifdef USE_DP4A
#extension GL_EXT_spirv_intrinsics : require
// OpSDotAccSatKHR (4453), capabilities DotProductInput4x8BitPacked (6018), DotProduct (6019).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6018, 6019], id = 4453)
int sdot4x8_acc_sat(uint a, uint b, int acc, spirv_literal int fmt);
#define DOT4(a, b, acc) sdot4x8_acc_sat(a, b, acc, 0)
#else
int dot4(uint a, uint b, int acc)
{
    for (int i = 0; i < 32; i += 8)
        acc += bitfieldExtract(int(a), i, 8) * bitfieldExtract(int(b), i, 8);
    return acc;
}
#define DOT4(a, b, acc) dot4(a, b, acc)
#endif
layout(binding = 0) readonly buffer Q { uint q[]; };
layout(binding = 1) readonly buffer SXS { float sxs[]; };
layout(binding = 2) readonly buffer CW { uint cw[]; };
layout(binding = 3) readonly buffer D { uint dw[]; };
layout(binding = 4) readonly buffer M { uint mw[]; };
layout(binding = 5) buffer O { float o[]; };
#ifdef SUPER
layout(binding = 6) readonly buffer SUB { uint sw[]; };
#endif
layout(push_constant) uniform P {
    uint boff[8]; // boff[3], boff[4]: in elements of d and m (halves when f16)
    uint k, n_tok, passes, stride_o, accumulate, n_rows, f16, has_min;
    float z;
} pc;

shared float red[TT][RG * L];

float load_d(uint e)
{
    return pc.f16 != 0u ? unpackHalf2x16(dw[e >> 1])[e & 1u] : uintBitsToFloat(dw[e]);
}

float load_m(uint e)
{
    return pc.f16 != 0u ? unpackHalf2x16(mw[e >> 1])[e & 1u] : uintBitsToFloat(mw[e]);
}

// Bits 0..3 of b to bit 4 of bytes 0..3 (the fifth bit of four 5-bit codes).
uint spread(uint b)
{
    return (b & 1u) << 4 | (b & 2u) << 11 | (b & 4u) << 18 | (b & 8u) << 25;
}

// The 2-bit fields 0..3 of b to bits 4-5 of bytes 0..3 (the top of 6-bit codes).
uint spread2(uint b)
{
    return (b & 3u) << 4 | (b & 0xcu) << 10 | (b & 0x30u) << 16 | (b & 0xc0u) << 22;
}

// Four 6-bit codes (bytes 0..63) minus 32, as signed bytes: with bit 7 set
// first no byte borrows from the next, and flipping it back gives c - 32.
uint centre(uint c)
{
    return ((c | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// Group gi's 32 codes as bytes, inputs 4i .. 4i+3 in word i (6 bits: centred).
void group_codes(uint gi, out uint c[8])
{
    uint wb = pc.boff[2] + gi * WPG;
#if BITS == 8
    for (uint i = 0u; i < 8u; i++)
        c[i] = cw[wb + i];
#else
    for (uint i = 0u; i < 4u; i++) {
        uint w = cw[wb + i];
        c[i] = w & 0x0f0f0f0fu;
        c[i + 4u] = (w >> 4) & 0x0f0f0f0fu;
    }
#if BITS == 5
    uint h = cw[wb + 4u];
    for (uint i = 0u; i < 4u; i++) {
        c[i] |= spread(h >> (4u * i));
        c[i + 4u] |= spread(h >> (16u + 4u * i));
    }
#elif BITS == 6
    uint h0 = cw[wb + 4u], h1 = cw[wb + 5u];
    for (uint i = 0u; i < 4u; i++) {
        c[i] = centre(c[i] | spread2(h0 >> (8u * i)));
        c[i + 4u] = centre(c[i + 4u] | spread2(h1 >> (8u * i)));
    }
#endif
#endif
}

#ifdef SUPER
// Byte b of the sub-scales, counted from the window start.
uint sub_byte(uint b)
{
    return (sw[pc.boff[6] + b / 4u] >> (8u * (b % 4u))) & 255u;
}
#endif

// Group g of row: (d, m') for the one-sum formats, or at 6 bits the two
// half-groups' (d0, d1). Two levels: backend.h's f32 products of D or M and
// the 6-bit (s, n), unpacked as GGUF's get_scale_min_k4, or the int8 sub.
vec2 group_scales(uint row, uint g)
{
#ifdef SUPER
    uint si = row * (pc.k / 256u) + g / 8u, j = g % 8u;
    float D = load_d(pc.boff[3] + si); // f16: two levels always are
#if BITS == 6
    uint b = si * 16u + 2u * j;
    float s0 = float(bitfieldExtract(int(sub_byte(b)), 0, 8));
    float s1 = float(bitfieldExtract(int(sub_byte(b + 1u)), 0, 8));
    return vec2(D * s0, D * s1);
#else
    uint b = si * 12u, s, n;
    if (j < 4u) {
        s = sub_byte(b + j) & 63u;
        n = sub_byte(b + j + 4u) & 63u;
    } else {
        s = (sub_byte(b + j + 4u) & 15u) | (sub_byte(b + j - 4u) >> 6) << 4;
        n = (sub_byte(b + j + 4u) >> 4) | (sub_byte(b + j) >> 6) << 4;
    }
    return vec2(D * float(s), -(load_m(pc.boff[4] + si) * float(n)));
#endif
#else
    uint gi = row * (pc.k / 32u) + g;
    float d = load_d(pc.boff[3] + gi);
    return vec2(d, pc.has_min != 0u ? load_m(pc.boff[4] + gi) : -pc.z * d);
#endif
}

// One group's term before sx against activation words qb..qb+7 (sum of q: sq):
// d * sum(q*code) + m' * sq, or at 6 bits d0 * sum_h0 + d1 * sum_h1.
float group_term(uint qb, uint c[8], vec2 dm, float sq)
{
#if BITS == 6
    int s0 = 0, s1 = 0;
    for (uint i = 0u; i < 4u; i++) {
        s0 = DOT4(q[qb + i], c[i], s0);
        s1 = DOT4(q[qb + 4u + i], c[i + 4u], s1);
    }
    return dm.x * float(s0) + dm.y * float(s1);
#else
    int s = 0;
    for (uint i = 0u; i < 8u; i++)
        s = DOT4(q[qb + i], c[i], s);
    return dm.x * float(s) + dm.y * sq;
#endif
}

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint lane = lid % L;
    uint row = gl_WorkGroupID.x * RG + lid / L;
    bool live = row < pc.n_rows; // the last group may have rows past the end
    uint t0 = gl_WorkGroupID.y * TT;
    uint nt = min(TT, pc.n_tok - t0);
    uint G = pc.k / 32u, qrow = pc.k / 4u;
    float acc[TT];
    for (uint j = 0u; j < TT; j++)
        acc[j] = 0.0;
    for (uint g = lane; live && g < G; g += L) {
        uint c[8];
        group_codes(row * G + g, c);
        vec2 dm = group_scales(row, g);
        for (uint j = 0u; j < TT; j++) // a constant trip count keeps acc in registers
            for (uint p = 0u; j < nt && p < pc.passes; p++) {
                uint r = (t0 + j) * pc.passes + p;
                uint e = pc.boff[1] + 2u * (r * G + g);
                acc[j] += sxs[e] * group_term(pc.boff[0] + r * qrow + g * 8u, c, dm, sxs[e + 1u]);
            }
    }
    for (uint j = 0u; j < TT; j++)
        red[j][lid] = acc[j];
    barrier();
    for (uint s = L / 2u; s > 0u; s >>= 1) {
        if (lane < s)
            for (uint j = 0u; j < TT; j++)
                red[j][lid] += red[j][lid + s];
        barrier();
    }
    if (!live || lane >= nt)
        return;
    uint oi = pc.boff[5] + (t0 + lane) * pc.stride_o + row;
    float r = red[lane][lid - lane];
    if (pc.accumulate != 0u)
        r += o[oi];
    o[oi] = r;
}
