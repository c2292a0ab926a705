/* IEEE binary16 <-> binary32 conversions in portable C (no F16C needed), so the
 * reference and any CPU produce the same bits. */
#include <string.h>

#include "cpu_kernels.h"

float dray_cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;

    if (exp == 0x1f) {                /* inf or NaN: keep the payload */
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {            /* normal: rebias 15 -> 127 */
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {            /* signed zero */
        bits = sign;
    } else {                          /* subnormal: normalise the mantissa */
        uint32_t e = 113;             /* exponent of 2^-14 in f32 bias, +1 for the shift below */
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t dray_cpu_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) /* inf or NaN (keep a quiet NaN) */
        return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0);
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) {
        /* below 2^-14: subnormal half. value = ax_mantissa * 2^(e-150); the half
         * unit is 2^-24, so shift by (126 - e) + 1 ... done with integer rounding. */
        uint32_t e = ax >> 23;
        if (e < 102) /* < 2^-25: rounds to zero (2^-25 exactly is a tie -> even 0) */
            return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24: m * 2^(e-150) / 2^-24 = m >> (126-e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return sign | (uint16_t)q;
    }
    /* normal: rebias and round the 13 dropped mantissa bits to nearest even;
     * a carry into the exponent is the correct result. */
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return sign | (uint16_t)h;
}
