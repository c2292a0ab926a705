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
// Shape: a workgroup of RG = 4 output rows x L = 32 lanes (group x) and TT = 4
// tokens (group y). Lane l takes groups l, l+L, ...: the 32 lanes of a row read
// 32 consecutive groups, one contiguous run of weight bytes (coalesced), and
// each group's codes are decoded once for all TT tokens and both passes.
// Partial sums meet in a shared-memory tree per row. USE_DP4A uses the SPIR-V
// packed 4x8-bit signed dot product (codes 0..31 are non-negative bytes).
#include "common.glsl"
#define TT 4u  // tokens per group
#define RG 4u  // rows per group
#define L 32u  // lanes per row (RG * L = 128)
#if BITS == 4
#define WPG 4u // code words per group
#elif BITS == 5
#define WPG 5u
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
        uint gi = row * G + g;
        uint wb = pc.boff[2] + gi * WPG;
        uint c[8]; // the group's 32 codes as bytes, inputs 4i .. 4i+3 in word i
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
#endif
#endif
        float d = load_d(pc.boff[3] + gi);
        float m = pc.has_min != 0u ? load_m(pc.boff[4] + gi) : -pc.z * d;
        for (uint j = 0u; j < TT; j++) // a constant trip count keeps acc in registers
            for (uint p = 0u; j < nt && p < pc.passes; p++) {
                uint r = (t0 + j) * pc.passes + p;
                uint qb = pc.boff[0] + r * qrow + g * 8u;
                int s = 0;
                for (uint i = 0u; i < 8u; i++)
                    s = DOT4(q[qb + i], c[i], s);
                uint e = pc.boff[1] + 2u * (r * G + g);
                acc[j] += sxs[e] * (d * float(s) + m * sxs[e + 1u]);
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
