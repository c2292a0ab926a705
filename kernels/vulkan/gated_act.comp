#version 450
// Gated activation: out[t][i] = act(gate[t][i]) * up[t][i].
// Grid: x covers i (256 per group), y = token in this chunk.
// gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715 x^3):
// the second form has no cancellation for negative x.
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer G { float g[]; };
layout(binding = 1) readonly buffer U { float u[]; };
layout(binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint n, stride_g, stride_u, stride_o, act;
} pc;

void main()
{
    uint i = gl_GlobalInvocationID.x;
    uint t = gl_WorkGroupID.y;
    if (i >= pc.n)
        return;
    float x = g[pc.boff[0] + t * pc.stride_g + i];
    float up = u[pc.boff[1] + t * pc.stride_u + i];
    precise float a;
    if (pc.act == 0u) {
        float v = 0.7978845608028654 * (x + 0.044715 * x * x * x);
        a = x / (1.0 + exp(-2.0 * v));
    } else {
        a = x / (1.0 + exp(-x));
    }
    o[pc.boff[2] + t * pc.stride_o + i] = a * up;
}
