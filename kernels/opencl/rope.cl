/* Rotary embedding, NEOX layout, in place. Grid (n_rot/2, n_head, n_tok): each
 * work-item rotates the pair (v[i], v[i + n_rot/2]) of one head of one token.
 *
 * Angles must stay accurate for positions up to 2^17 (an f32 pow/multiply chain
 * loses ~1e-2 rad there). With fp64 the angle, cos and sin are computed in double,
 * exactly like the CPU reference. Without fp64 the host passes each frequency
 * f_i = freq_scale * base^(-2i/n_rot), computed in double, as two floats
 * (hi + lo); the kernel forms p*hi exactly (fma), reduces it modulo 2*pi with a
 * three-part Cody-Waite constant, and adds the low parts: error ~1e-6 rad.
 *
 * Version 4: with has_ff each frequency is divided by its factor ff[i] (in
 * double with fp64; without, the quotient of (hi + lo) / ff is carried as a
 * new (hi, lo) pair, its rounding error recovered with an fma), and cos and
 * sin are scaled by mscale (attn_factor; the host turns 0 into 1). */

/* (hi + lo) / f as a new (hi, lo) pair: q = hi / f, then the exact remainder
 * hi - q*f (fma) and lo give the low part, so the pair keeps ~2^-40 relative
 * accuracy whatever the division's rounding. */
inline float2 dray_rope_div(float hi, float lo, float f)
{
    float q = hi / f;
    float rem = fma(-q, f, hi);
    return (float2)(q, (rem + lo) / f);
}

inline float dray_rope_reduce(int p, float hi, float lo)
{
    const float inv_2pi = 0.15915494309189535f;
    const float c1 = 6.28125f;                 /* 8 significant bits: n*c1 is exact */
    const float c2 = 1.9353071693331003e-3f;   /* (2pi - c1) rounded to f32 */
    const float c3 = 1.0253376273028358e-11f;  /* 2pi - c1 - c2, rounded to f32 */
    float pf = (float)p;                       /* |p| < 2^24: exact */
    float a = pf * hi;
    float e = fma(pf, hi, -a);                 /* exact error of the product */
    float n = rint(a * inv_2pi);
    float r = fma(-n, c1, a);                  /* exact: result fits in ulp(a) */
    r = fma(-n, c2, r);
    r = fma(-n, c3, r);
    return r + (e + pf * lo);
}

__kernel void rope(__global float *x, ulong x_off, __global const int *pos, ulong pos_off,
                   __global const float *tab, uint n_head, uint head_dim, uint n_rot,
                   uint stride, uint n_tok, float base, float freq_scale,
                   __global const float *ff, ulong ff_off, uint has_ff, float mscale)
{
    uint i = get_global_id(0);
    size_t h = get_global_id(1), t = get_global_id(2);
    uint half_rot = n_rot / 2;
    if (i >= half_rot || h >= n_head || t >= n_tok)
        return;
    __global float *v = x + x_off + t * stride + h * head_dim;
    int p = pos[pos_off + t];
#ifdef DRAY_OCL_FP64
    (void)tab;
    double th = (double)p * (double)freq_scale * pow((double)base, -2.0 * (double)i / (double)n_rot);
    if (has_ff)
        th /= (double)ff[ff_off + i];
    double c = cos(th) * mscale, s = sin(th) * mscale;
    double x0 = v[i], x1 = v[i + half_rot];
    v[i] = (float)(x0 * c - x1 * s);
    v[i + half_rot] = (float)(x0 * s + x1 * c);
#else
    (void)base;
    (void)freq_scale;
    float2 f = (float2)(tab[2 * i], tab[2 * i + 1]);
    if (has_ff)
        f = dray_rope_div(f.x, f.y, ff[ff_off + i]);
    float r = dray_rope_reduce(p, f.x, f.y);
    float c = cos(r) * mscale, s = sin(r) * mscale;
    float x0 = v[i], x1 = v[i + half_rot];
    v[i] = x0 * c - x1 * s;
    v[i + half_rot] = x0 * s + x1 * c;
#endif
}
