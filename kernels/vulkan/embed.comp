#version 450
// Embedding gather over a window of table rows [row0, row0 + n_win):
//   out[t][i] = table[id][i] * row_scale[id] * scale   (TABLE_I8)
//   out[t][i] = table[id][i] * scale                    (F32, no row scale)
// Tokens whose id lies outside the window are left for another dispatch; the
// host splits tables larger than maxStorageBufferRange into such windows.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer IDS { int ids[]; };
#ifdef TABLE_I8
layout(binding = 1) readonly buffer TB { int8_t tb[]; };
#else
layout(binding = 1) readonly buffer TB { float tb[]; };
#endif
layout(binding = 2) readonly buffer RS { float rs[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint dim, row0, n_win;
    float scale;
} pc;

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
#ifdef TABLE_I8
    precise float s = rs[pc.boff[2] + r] * pc.scale; // one rounding, as the CPU reference
    precise float v = float(int(tb[pc.boff[1] + r * pc.dim + i])) * s;
#else
    precise float v = tb[pc.boff[1] + r * pc.dim + i] * pc.scale;
#endif
    o[pc.boff[3] + t * pc.dim + i] = v;
}
