#version 450
// int8 matmul on activations already quantized by quant_rows:
//   out[t][o] (+)= (sum_k q[t][k] * w[o][k]) * sx[t] * wscale[o]
//                  + sum_j x[t][oidx[j]] * ow[o][j]          (outlier channels, f32)
// One group of 64 invocations per (RG = 4 output rows = group x, TT = 4 tokens =
// group y); 16 invocations per row each sum a strided share of k exactly in
// int32, then a shared-memory tree reduction within the row's 16. USE_DP4A reads q and w as packed words and uses the
// SPIR-V packed 4x8-bit signed dot product (host picks it when k % 4 == 0 and
// the weight window is word aligned).
#include "common.glsl"
#define TT 4u  // tokens per group
#define RG 4u  // rows per group
#define RL 16u // invocations per row (RG * RL = 64)
layout(local_size_x = 64) in;
#ifdef USE_DP4A
#extension GL_EXT_spirv_intrinsics : require
// OpSDotAccSatKHR (4453), capabilities DotProductInput4x8BitPacked (6018), DotProduct (6019);
// glslang here lacks GL_EXT_integer_dot_product. fmt 0 = PackedVectorFormat4x8Bit.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6018, 6019], id = 4453)
int sdot4x8_acc_sat(uint a, uint b, int acc, spirv_literal int fmt);
layout(binding = 0) readonly buffer Q { uint q[]; };
layout(binding = 2) readonly buffer W { uint w[]; };
#else
layout(binding = 0) readonly buffer Q { int8_t q[]; };
layout(binding = 2) readonly buffer W { int8_t w[]; };
#endif
layout(binding = 1) readonly buffer SX { float sx[]; };
layout(binding = 3) readonly buffer WS { float ws[]; };
layout(binding = 4) buffer O { float o[]; };
layout(binding = 5) readonly buffer X { float x[]; };
layout(binding = 6) readonly buffer OI { int oidx[]; };
layout(binding = 7) readonly buffer OW { float ow[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint k, kq, n_tok, stride_o, stride_x, n_outlier, accumulate, n_rows;
} pc;

shared int red[TT][64];

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint lane = lid % RL;
    uint row = gl_WorkGroupID.x * RG + lid / RL;
    bool live = row < pc.n_rows; // the last group may have rows past the end
    uint t0 = gl_WorkGroupID.y * TT;
    uint nt = min(TT, pc.n_tok - t0);
    int acc[TT];
    for (uint j = 0u; j < TT; j++)
        acc[j] = 0;
#ifdef USE_DP4A
    uint k4 = pc.k / 4u;
    uint wb = pc.boff[2] + row * k4;
    uint qb = pc.boff[0] + t0 * (pc.kq / 4u);
    for (uint i = lane; live && i < k4; i += RL) {
        uint wv = w[wb + i];
        for (uint j = 0u; j < nt; j++)
            acc[j] = sdot4x8_acc_sat(wv, q[qb + j * (pc.kq / 4u) + i], acc[j], 0);
    }
#else
    uint wb = pc.boff[2] + row * pc.k;
    uint qb = pc.boff[0] + t0 * pc.kq;
    for (uint i = lane; live && i < pc.k; i += RL) {
        int wv = int(w[wb + i]);
        for (uint j = 0u; j < nt; j++)
            acc[j] += wv * int(q[qb + j * pc.kq + i]);
    }
#endif
    for (uint j = 0u; j < TT; j++)
        red[j][lid] = acc[j];
    barrier();
    for (uint s = RL / 2u; s > 0u; s >>= 1) {
        if (lane < s)
            for (uint j = 0u; j < TT; j++)
                red[j][lid] += red[j][lid + s];
        barrier();
    }
    if (!live || lane >= nt)
        return;
    uint t = t0 + lane;
    precise float r = float(red[lane][lid - lane]) * sx[pc.boff[1] + t] * ws[pc.boff[3] + row];
    for (uint j = 0u; j < pc.n_outlier; j++) {
        uint c = uint(oidx[pc.boff[6] + j]);
        if (c >= pc.k)
            continue; // malformed index: never read outside the row
        precise float p = x[pc.boff[5] + t * pc.stride_x + c] * ow[pc.boff[7] + row * pc.n_outlier + j];
        r += p;
    }
    uint oi = pc.boff[4] + t * pc.stride_o + row;
    if (pc.accumulate != 0u)
        r += o[oi];
    o[oi] = r;
}
