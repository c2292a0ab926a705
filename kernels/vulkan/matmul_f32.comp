#version 450
// f32 matmul, the checking path: out[t][o] (+)= sum_k x[t][k] * w[o][k], sums in f32.
// One group of 64 invocations per (output row o = group x, 4 tokens = group y):
// strided partial sums, then a shared-memory tree reduction.
#define TT 4u
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint k, n_tok, stride_x, stride_o, accumulate;
} pc;

shared float red[TT][64];

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint row = gl_WorkGroupID.x;
    uint t0 = gl_WorkGroupID.y * TT;
    uint nt = min(TT, pc.n_tok - t0);
    float acc[TT];
    for (uint j = 0u; j < TT; j++)
        acc[j] = 0.0;
    uint wb = pc.boff[1] + row * pc.k;
    uint xb = pc.boff[0] + t0 * pc.stride_x;
    for (uint i = lid; i < pc.k; i += 64u) {
        float wv = w[wb + i];
        for (uint j = 0u; j < nt; j++)
            acc[j] += wv * x[xb + j * pc.stride_x + i];
    }
    for (uint j = 0u; j < TT; j++)
        red[j][lid] = acc[j];
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (lid < s)
            for (uint j = 0u; j < TT; j++)
                red[j][lid] += red[j][lid + s];
        barrier();
    }
    if (lid >= nt)
        return;
    uint oi = pc.boff[2] + (t0 + lid) * pc.stride_o + row;
    float r = red[lid][0];
    if (pc.accumulate != 0u)
        r += o[oi];
    o[oi] = r;
}
