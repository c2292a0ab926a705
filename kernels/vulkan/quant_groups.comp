#version 450
// Activations of a matmul on packed weights, per token and group of 32 inputs
// (backend.h, "Packed weights"):
//   sx = max_{c in g} |x| / 127; q = clamp(roundEven(x / sx), -127, 127); a zero
//   group gives sx = 0, q = 0.
// With passes = 2 the residual r = x - q*sx (in f32) is quantized by the same
// rule into (q', sx'). Output rows are (token, pass), row = t * passes + p:
//   q    packed int8, 4 per uint, k/4 words per row (the matmul reads words);
//   sxs  vec2 per (row, group): sx and float(sum of the group's q), exact
//        (|sum| <= 32*127), so the matmul needs no second dot for the min.
// A workgroup is 8 groups of one token; each invocation owns 4 inputs (one
// word) and the 8 invocations of a group share their maxima through shared
// memory. Uses no 8-bit storage.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Q { uint q[]; };
layout(binding = 2) writeonly buffer SXS { float sxs[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint k, stride_x, passes;
} pc;

shared float red[64];
shared int sums[64];

// The 8 lanes' values of this invocation's group in shared memory: their max.
float group_max(uint base)
{
    float m = 0.0;
    for (uint i = 0u; i < 8u; i++)
        m = max(m, red[base + i]);
    return m;
}

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.y;
    uint G = pc.k / 32u;
    uint g = gl_WorkGroupID.x * 8u + lid / 8u;
    uint base = lid & ~7u; // first lane of the group in shared memory
    bool live = g < G;     // the last workgroup may run past the row
    uint c0 = g * 32u + (lid % 8u) * 4u;
    precise vec4 v = vec4(0.0);
    if (live)
        for (uint j = 0u; j < 4u; j++)
            v[j] = x[pc.boff[0] + t * pc.stride_x + c0 + j];
    for (uint p = 0u; p < pc.passes; p++) {
        red[lid] = max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w)));
        barrier();
        float amax = group_max(base);
        precise float sx = amax / 127.0;
        ivec4 qi = ivec4(0);
        if (amax > 0.0)
            for (uint j = 0u; j < 4u; j++) {
                precise float r = v[j] / sx;
                qi[j] = int(clamp(roundEven(r), -127.0, 127.0));
            }
        sums[lid] = qi.x + qi.y + qi.z + qi.w;
        barrier();
        uint row = t * pc.passes + p;
        if (live) {
            q[pc.boff[1] + row * (pc.k / 4u) + c0 / 4u] =
                (uint(qi.x) & 255u) | (uint(qi.y) & 255u) << 8 | (uint(qi.z) & 255u) << 16 |
                (uint(qi.w) & 255u) << 24;
            if (lid % 8u == 0u) {
                int s = 0;
                for (uint i = 0u; i < 8u; i++)
                    s += sums[base + i];
                uint e = pc.boff[2] + 2u * (row * G + g);
                sxs[e] = sx;
                sxs[e + 1u] = float(s);
            }
        }
        // the residual for the next pass: x - q*sx, each step rounded in f32
        for (uint j = 0u; j < 4u; j++) {
            precise float qs = float(qi[j]) * sx;
            v[j] = v[j] - qs;
        }
        barrier(); // red and sums are rewritten by the next pass
    }
}
