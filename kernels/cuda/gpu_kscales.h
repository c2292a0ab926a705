/*
 * gpu_kscales.h — the 12-byte packing of a Q4_K / Q5_K super-block's eight
 * (s, n) sub-scale pairs, GGUF's own (llama.cpp's get_scale_min_k4): eight
 * 6-bit s and eight 6-bit n in 96 bits. The GPU plugins' device layout keeps
 * the sub-scales this way (backends/cuda/gpu_layout.h) so a handle holds no
 * more than the file's bytes. Plain C (host packer, tests) and device code
 * (the kernels' decoder) alike: one definition of the bit layout for both.
 *   j < 4:  s = q[j] & 63,                   n = q[j+4] & 63
 *   j >= 4: s = q[j+4] & 15 | (q[j-4] >> 6) << 4,
 *           n = q[j+4] >> 4 | (q[j]   >> 6) << 4
 */
#ifndef DRAY_GPU_KSCALES_H
#define DRAY_GPU_KSCALES_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GK_HD __host__ __device__ __forceinline__
#else
#define GK_HD inline
#endif

#define GK_KSCALE_BYTES 12u /* per super-block of 256 inputs */

/* Pair j (0..7) of a packed super-block: s and n, each 0..63. */
static GK_HD void gk_kscale_get(const uint8_t *q, uint32_t j, uint32_t *s, uint32_t *n)
{
    if (j < 4) {
        *s = q[j] & 63u;
        *n = q[j + 4] & 63u;
    } else {
        *s = (q[j + 4] & 15u) | (uint32_t)(q[j - 4] >> 6) << 4;
        *n = (uint32_t)(q[j + 4] >> 4) | (uint32_t)(q[j] >> 6) << 4;
    }
}

/* Pack eight (s, n) pairs (sn[2j], sn[2j+1], each 0..63: backend.h's sub of
 * one super-block) into q[12], the inverse of gk_kscale_get. */
static GK_HD void gk_kscale_pack(const uint8_t *sn, uint8_t *q)
{
    for (uint32_t j = 0; j < 4; j++) {
        const uint32_t s = sn[2 * j], n = sn[2 * j + 1], s4 = sn[2 * j + 8], n4 = sn[2 * j + 9];
        q[j] = (uint8_t)((s & 63u) | (s4 >> 4) << 6);
        q[j + 4] = (uint8_t)((n & 63u) | (n4 >> 4) << 6);
        q[j + 8] = (uint8_t)((s4 & 15u) | (n4 & 15u) << 4);
    }
}

#endif
