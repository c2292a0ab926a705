// Shared by the dray Vulkan kernels. Every kernel's push block starts with
// uint boff[8]: for binding i, the element index where the host's window
// starts inside the bound (alignment-rounded) range. Indices in the kernels
// are relative to those window starts.
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require

// IEEE binary16 bits -> f32, exact (subnormals included).
float dray_h2f(uint h)
{
    uint s = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu;
    uint m = h & 0x3ffu;
    if (e == 0u) {
        float v = float(m) * 5.9604644775390625e-8; // m * 2^-24, exact
        return s != 0u ? -v : v;
    }
    if (e == 31u)
        return uintBitsToFloat(s | 0x7f800000u | (m << 13));
    return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}

// f32 -> binary16 bits, round to nearest even, overflow to inf, NaN kept NaN.
uint dray_f2h(float f)
{
    uint x = floatBitsToUint(f);
    uint s = (x >> 16) & 0x8000u;
    uint e = (x >> 23) & 0xffu;
    uint m = x & 0x7fffffu;
    if (e == 255u)
        return s | 0x7c00u | (m != 0u ? 0x200u : 0u);
    int E = int(e) - 112; // binary16 biased exponent
    if (E >= 31)
        return s | 0x7c00u;
    if (E <= 0) { // subnormal or zero in binary16
        if (E < -10)
            return s;
        m |= 0x800000u;
        uint sh = uint(14 - E);
        uint hm = m >> sh;
        uint rem = m & ((1u << sh) - 1u);
        uint half_ = 1u << (sh - 1u);
        if (rem > half_ || (rem == half_ && (hm & 1u) != 0u))
            hm++;
        return s | hm;
    }
    uint r = s | (uint(E) << 10) | (m >> 13);
    uint rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) != 0u))
        r++; // a carry into the exponent is right, up to inf
    return r;
}
