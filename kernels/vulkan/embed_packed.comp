#version 450
// Embedding gather from packed weights over a window of rows [row0, row0 + n_win):
//   out[t][i] = (code(id, i) * d + m') * scale,  m' = m (has_min) or -z*d,
// each step one f32 rounding, as dray_util_packed_row then the scale. The
// weights are in the layout of matmul_packed.comp (row-major groups of B bytes,
// d and m [rows][G] as f32 words or f16 pairs). Tokens whose id lies outside the
// window are left for another dispatch.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer IDS { int ids[]; };
layout(binding = 1) readonly buffer CW { uint cw[]; };
layout(binding = 2) readonly buffer D { uint dw[]; };
layout(binding = 3) readonly buffer M { uint mw[]; };
layout(binding = 4) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint boff[8]; // boff[2], boff[3]: in elements of d and m (halves when f16)
    uint dim, row0, n_win, bits, f16, has_min;
    float z, scale;
} pc;

// Byte b of the codes, counted from the window start.
uint code_byte(uint b)
{
    return (cw[pc.boff[1] + b / 4u] >> (8u * (b % 4u))) & 255u;
}

void main()
{
    uint i = gl_GlobalInvocationID.x;
    uint t = gl_WorkGroupID.y;
    if (i >= pc.dim)
        return;
    int id = ids[pc.boff[0] + t];
    if (id < int(pc.row0) || id >= int(pc.row0 + pc.n_win))
        return;
    uint G = pc.dim / 32u, g = i / 32u, j = i % 32u;
    uint gi = (uint(id) - pc.row0) * G + g;
    uint B = pc.bits == 4u ? 16u : pc.bits == 5u ? 20u : 32u;
    uint gb = gi * B;
    float code;
    if (pc.bits == 8u) {
        code = float(bitfieldExtract(int(code_byte(gb + j)), 0, 8));
    } else {
        uint c = code_byte(gb + j % 16u) >> (j < 16u ? 0u : 4u) & 15u;
        if (pc.bits == 5u)
            c |= (cw[pc.boff[1] + gb / 4u + 4u] >> j & 1u) << 4;
        code = float(c);
    }
    uint e2 = pc.boff[2] + gi, e3 = pc.boff[3] + gi;
    float d = pc.f16 != 0u ? unpackHalf2x16(dw[e2 >> 1])[e2 & 1u] : uintBitsToFloat(dw[e2]);
    float m = pc.has_min == 0u ? -pc.z * d
              : pc.f16 != 0u  ? unpackHalf2x16(mw[e3 >> 1])[e3 & 1u]
                              : uintBitsToFloat(mw[e3]);
    precise float w = code * d + m;
    precise float v = w * pc.scale;
    o[pc.boff[4] + t * pc.dim + i] = v;
}
