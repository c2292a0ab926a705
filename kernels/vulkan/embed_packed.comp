#version 450
// Embedding gather from packed weights over a window of rows [row0, row0 + n_win):
//   out[t][i] = (code(id, i) * d + m') * scale,  m' = m (has_min) or -z*d,
// each step one f32 rounding, as dray_util_packed_row then the scale. The
// weights are in the layout of matmul_packed.comp (row-major groups of B bytes,
// d and m [rows][G] as f32 words or f16 pairs; two levels: D and M [rows][S]
// and the sub-scales per super-block in binding 5, which is d again for one
// level). Tokens whose id lies outside the window are left for another dispatch.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer IDS { int ids[]; };
layout(binding = 1) readonly buffer CW { uint cw[]; };
layout(binding = 2) readonly buffer D { uint dw[]; };
layout(binding = 3) readonly buffer M { uint mw[]; };
layout(binding = 4) writeonly buffer O { float o[]; };
layout(binding = 5) readonly buffer SUB { uint sw[]; };
layout(push_constant) uniform P {
    uint boff[8]; // boff[2], boff[3]: in elements of d and m (halves when f16)
    uint dim, row0, n_win, bits, f16, has_min;
    float z, scale;
    uint super; // two-level scales (version 4)
} pc;

// Byte b of the codes, counted from the window start.
uint code_byte(uint b)
{
    return (cw[pc.boff[1] + b / 4u] >> (8u * (b % 4u))) & 255u;
}

// Byte b of the sub-scales, counted from the window start.
uint sub_byte(uint b)
{
    return (sw[pc.boff[5] + b / 4u] >> (8u * (b % 4u))) & 255u;
}

float load_d(uint e)
{
    e += pc.boff[2];
    return pc.f16 != 0u ? unpackHalf2x16(dw[e >> 1])[e & 1u] : uintBitsToFloat(dw[e]);
}

float load_m(uint e)
{
    e += pc.boff[3];
    return pc.f16 != 0u ? unpackHalf2x16(mw[e >> 1])[e & 1u] : uintBitsToFloat(mw[e]);
}

// Code j (0..31) of group gi (B bytes from the window start).
float group_code(uint gi, uint j)
{
    uint B = pc.bits == 4u ? 16u : pc.bits == 5u ? 20u : pc.bits == 6u ? 24u : 32u;
    uint gb = gi * B;
    if (pc.bits == 8u)
        return float(bitfieldExtract(int(code_byte(gb + j)), 0, 8));
    uint c = code_byte(gb + j % 16u) >> (j < 16u ? 0u : 4u) & 15u;
    if (pc.bits == 5u)
        c |= (cw[pc.boff[1] + gb / 4u + 4u] >> j & 1u) << 4;
    else if (pc.bits == 6u)
        c |= (cw[pc.boff[1] + gb / 4u + 4u + j / 16u] >> (2u * (j % 16u)) & 3u) << 4;
    return float(c);
}

// d and m' of the scale unit of input i of window row r: a group's d and m
// (or -z*d); two levels, backend.h's products of D or M and the sub-scale
// (the 6-bit (s, n) as GGUF packs them, or the int8 of a half-group).
vec2 unit_scales(uint r, uint i)
{
    if (pc.super == 0u) {
        uint gi = r * (pc.dim / 32u) + i / 32u;
        float d = load_d(gi);
        return vec2(d, pc.has_min != 0u ? load_m(gi) : -pc.z * d);
    }
    uint si = r * (pc.dim / 256u) + i / 256u, j = (i / 32u) % 8u;
    float D = load_d(si);
    if (pc.bits == 6u) {
        float d = D * float(bitfieldExtract(int(sub_byte(si * 16u + (i / 16u) % 16u)), 0, 8));
        return vec2(d, -32.0 * d);
    }
    uint b = si * 12u, s, n;
    if (j < 4u) {
        s = sub_byte(b + j) & 63u;
        n = sub_byte(b + j + 4u) & 63u;
    } else {
        s = (sub_byte(b + j + 4u) & 15u) | (sub_byte(b + j - 4u) >> 6) << 4;
        n = (sub_byte(b + j + 4u) >> 4) | (sub_byte(b + j) >> 6) << 4;
    }
    return vec2(D * float(s), -(load_m(si) * float(n)));
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
    uint r = uint(id) - pc.row0;
    float code = group_code(r * (pc.dim / 32u) + i / 32u, i % 32u);
    vec2 dm = unit_scales(r, i);
    precise float w = code * dm.x + dm.y;
    precise float v = w * pc.scale;
    o[pc.boff[4] + t * pc.dim + i] = v;
}
