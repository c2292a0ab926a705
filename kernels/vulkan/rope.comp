#version 450
// Rotary embedding, NEOX layout, in place. One invocation per (pair i, head h)
// of token t (group y). Angle reduction is exact integer work: the host gives,
// per pair, G = frac(freq_i / 2pi) as a 64-bit fraction (uvec2: hi, lo words),
// so frac(p * freq_i / 2pi) is p*G mod 1, kept to 32 bits of a turn. The
// remaining angle in [-pi/4, pi/4) goes through Taylor polynomials (error
// below 1e-10), then the quadrant is applied. No fp64, no large-argument sin.
// Version 4: the host folds the frequency factors into the table; cos and sin
// are scaled by mscale (attn_factor, 1 when unset).
layout(local_size_x = 64) in;
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer POS { int pos[]; };
layout(binding = 2) readonly buffer TAB { uvec2 tab[]; };
layout(push_constant) uniform P {
    uint boff[8];
    uint n_head, head_dim, half_rot, stride;
    float mscale;
} pc;

void main()
{
    uint g = gl_GlobalInvocationID.x;
    uint t = gl_WorkGroupID.y;
    if (g >= pc.half_rot * pc.n_head)
        return;
    uint h = g / pc.half_rot, i = g % pc.half_rot;
    int p = pos[pc.boff[1] + t];
    uvec2 G = tab[pc.boff[2] + i];
    uint ap = uint(abs(p));
    uint hi, lo;
    umulExtended(ap, G.y, hi, lo);
    uint turns = ap * G.x + hi; // 2^-32 turns, mod 1 turn
    if (p < 0)
        turns = 0u - turns;
    uint q = (turns + 0x20000000u) >> 30;
    int rem = int(turns - (q << 30));
    precise float a = float(rem) * 1.4629180792671596e-9; // 2pi / 2^32
    precise float a2 = a * a;
    precise float sn = a * (1.0 + a2 * (-1.0 / 6.0 + a2 * (1.0 / 120.0 + a2 * (-1.0 / 5040.0 +
                       a2 * (1.0 / 362880.0 + a2 * (-1.0 / 39916800.0))))));
    precise float cs = 1.0 + a2 * (-0.5 + a2 * (1.0 / 24.0 + a2 * (-1.0 / 720.0 +
                       a2 * (1.0 / 40320.0 + a2 * (-1.0 / 3628800.0 + a2 * (1.0 / 479001600.0))))));
    float c = cs, s = sn;
    if (q == 1u) {
        c = -sn;
        s = cs;
    } else if (q == 2u) {
        c = -cs;
        s = -sn;
    } else if (q == 3u) {
        c = sn;
        s = -cs;
    }
    c *= pc.mscale;
    s *= pc.mscale;
    uint b = pc.boff[0] + t * pc.stride + h * pc.head_dim + i;
    float v0 = x[b], v1 = x[b + pc.half_rot];
    precise float r0 = v0 * c - v1 * s;
    precise float r1 = v0 * s + v1 * c;
    x[b] = r0;
    x[b + pc.half_rot] = r1;
}
