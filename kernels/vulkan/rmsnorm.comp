#version 450
// RMSNorm of one row (token t = group y, head h = group x) of n floats:
// y = x * (1 / sqrt(mean(x^2) + eps)) * w. Each of the 256 invocations sums a strided
// share, then a tree reduction in shared memory (pairwise partial sums).
// out may alias x exactly: every element is re-read by the invocation that writes it.
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint n, stride_x, stride_o;
    float eps;
} pc;

shared float red[256];

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.y, h = gl_WorkGroupID.x;
    uint xb = pc.boff[0] + t * pc.stride_x + h * pc.n;
    uint ob = pc.boff[2] + t * pc.stride_o + h * pc.n;
    float s = 0.0;
    for (uint i = lid; i < pc.n; i += 256u) {
        float v = x[xb + i];
        s += v * v;
    }
    red[lid] = s;
    barrier();
    for (uint k = 128u; k > 0u; k >>= 1) {
        if (lid < k)
            red[lid] += red[lid + k];
        barrier();
    }
    // same order as the CPU reference: inv = 1/sqrt(mean + eps), y = x * inv * w
    precise float inv = 1.0 / sqrt(red[0] / float(pc.n) + pc.eps);
    for (uint i = lid; i < pc.n; i += 256u) {
        precise float y = x[xb + i] * inv * w[pc.boff[1] + i];
        o[ob + i] = y;
    }
}
