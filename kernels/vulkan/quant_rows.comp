#version 450
// Per-token symmetric int8 quantization of matmul activations (one group per token):
//   sx = max|x| / 127 over non-outlier channels; q = clamp(roundEven(x / sx), -127, 127);
//   an all-zero row gives sx = 0, q = 0; outlier channels get q = 0.
// q rows are kq bytes apart (k rounded up to 4, padding zeroed) so that the
// matmul can read them as packed 32-bit words.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer OI { int oidx[]; };
layout(binding = 2) writeonly buffer Q { int8_t q[]; };
layout(binding = 3) writeonly buffer SX { float sx[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint k, stride_x, kq, n_outlier;
} pc;

shared float red[256];

// Is input channel c one of the (strictly increasing) outlier channels?
bool is_outlier(uint c)
{
    uint lo = 0u, hi = pc.n_outlier;
    while (lo < hi) {
        uint mid = (lo + hi) / 2u;
        int v = oidx[pc.boff[1] + mid];
        if (v == int(c))
            return true;
        if (v < int(c))
            lo = mid + 1u;
        else
            hi = mid;
    }
    return false;
}

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.x;
    uint xb = pc.boff[0] + t * pc.stride_x;
    uint qb = pc.boff[2] + t * pc.kq;
    float m = 0.0;
    for (uint i = lid; i < pc.k; i += 256u)
        if (pc.n_outlier == 0u || !is_outlier(i))
            m = max(m, abs(x[xb + i]));
    red[lid] = m;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (lid < s)
            red[lid] = max(red[lid], red[lid + s]);
        barrier();
    }
    float amax = red[0];
    precise float scale = amax / 127.0;
    for (uint i = lid; i < pc.kq; i += 256u) {
        int v = 0;
        if (i < pc.k && amax > 0.0 && (pc.n_outlier == 0u || !is_outlier(i))) {
            precise float r = x[xb + i] / scale;
            v = int(clamp(roundEven(r), -127.0, 127.0));
        }
        q[qb + i] = int8_t(v);
    }
    if (lid == 0u)
        sx[pc.boff[3] + t] = scale;
}
