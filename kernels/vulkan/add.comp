#version 450
// Residual add: out[i] = a[i] + b[i], F32. One invocation per element;
// out may alias a or b exactly (each element is read before it is written by
// the same invocation).
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P { uint boff[8]; uint n; } pc;

void main()
{
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n)
        return;
    precise float r = a[pc.boff[0] + i] + b[pc.boff[1] + i];
    o[pc.boff[2] + i] = r;
}
