#version 450
// KV store of one tensor (K or V; the host dispatches twice): token t = group y,
// kv head h = group x, 64 invocations over head_dim.
//   KV_I8: scale = max|x|/127, q = clamp(roundEven(x/scale), -127, 127), scale
//          stored at [slot][h]; an all-zero vector stores scale 0 and q 0.
//   F16:   round-to-nearest-even binary16 (dray_f2h), binding 3 unused.
// A slot < 0 (padding) or >= n_slots is skipped.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer SRC { float src[]; };
layout(binding = 1) readonly buffer SL { int slots[]; };
#ifdef KV_I8
layout(binding = 2) writeonly buffer POOL { int8_t pool[]; };
layout(binding = 3) writeonly buffer SC { float sc[]; };
#else
layout(binding = 2) writeonly buffer POOL { uint16_t pool[]; };
layout(binding = 3) readonly buffer SC { float sc_unused[]; };
#endif
layout(push_constant) uniform P {
    uint boff[8];
    uint head_dim, n_kv_head, stride, n_slots;
} pc;

shared float red[64];

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    int slot = slots[pc.boff[1] + t];
    if (slot < 0 || uint(slot) >= pc.n_slots)
        return; // uniform across the group: no barrier is skipped by part of it
    uint sb = pc.boff[0] + t * pc.stride + h * pc.head_dim;
    uint row = uint(slot) * pc.n_kv_head + h;
    uint pb = pc.boff[2] + row * pc.head_dim;
#ifdef KV_I8
    float m = 0.0;
    for (uint i = lid; i < pc.head_dim; i += 64u)
        m = max(m, abs(src[sb + i]));
    red[lid] = m;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (lid < s)
            red[lid] = max(red[lid], red[lid + s]);
        barrier();
    }
    float amax = red[0];
    precise float scale = amax / 127.0;
    for (uint i = lid; i < pc.head_dim; i += 64u) {
        int v = 0;
        if (amax > 0.0) {
            precise float r = src[sb + i] / scale;
            v = int(clamp(roundEven(r), -127.0, 127.0));
        }
        pool[pb + i] = int8_t(v);
    }
    if (lid == 0u)
        sc[pc.boff[3] + row] = scale;
#else
    for (uint i = lid; i < pc.head_dim; i += 64u)
        pool[pb + i] = uint16_t(dray_f2h(src[sb + i]));
#endif
}
