/* Two-level weights (backend.h, ABI v4) into the CPU layouts DRAY_CPU_K4, K5
 * and K6 (cpu_kernels.h): the file's codes and scales, rearranged so one
 * 32-bit lane of a vector register is one row, at the file's size. */
#include <string.h>

#include "cpu_internal.h"
#include "cpu_layout.h"

/* Codes of one (b, g): n rows (the rest of the 16 zero) of neutral groups of B
 * bytes at in, row stride G*B. */
static void pack_codes(uint32_t layout, const uint8_t *in, uint64_t stride, uint64_t n, uint8_t *unit)
{
    memset(unit, 0, dray_cpu_k_wbytes(layout));
    for (uint64_t r = 0; r < n; r++) {
        const uint8_t *src = in + r * stride;
        for (uint64_t i = 0; i < 4; i++) /* unit i byte 4r+e = neutral byte 4i+e */
            memcpy(unit + i * 64 + r * 4, src + 4 * i, 4);
        if (layout == DRAY_CPU_K5) { /* bit 4 of input c at bit 4r + c%4 of word c/4 */
            uint32_t h;
            memcpy(&h, src + 16, 4);
            for (uint32_t c = 0; c < 32; c++) {
                uint32_t bit = (uint32_t)r * 4 + c % 4;
                unit[256 + (c / 4) * 8 + bit / 8] |= (uint8_t)(((h >> c) & 1u) << (bit % 8));
            }
        } else if (layout == DRAY_CPU_K6) { /* bits 4-5 of input 16p + 4u + e */
            uint64_t h;
            memcpy(&h, src + 16, 8);
            for (uint32_t c = 0; c < 32; c++) {
                uint32_t p = c / 16, u = (c % 16) / 4, e = c % 4;
                unit[256 + 64 * p + r * 4 + e] |= (uint8_t)(((h >> (2 * c)) & 3u) << (2 * u));
            }
        }
    }
}

/* Scales of one (b, s) for n rows from row r0. */
static void pack_scales(uint32_t layout, const struct dray_weight_desc *w, uint64_t r0, uint64_t n, uint64_t s,
                        uint8_t *out)
{
    const uint64_t S = w->k / 256, sub_row = w->k / 16;
    const uint16_t *D = w->d, *M = w->m;
    const uint8_t *sub = w->sub;
    memset(out, 0, dray_cpu_k_sbytes(layout));
    for (uint64_t r = 0; r < n; r++) {
        uint64_t o = r0 + r;
        memcpy(out + 2 * r, &D[o * S + s], 2);
        if (layout == DRAY_CPU_K6) {
            for (uint64_t h = 0; h < 16; h++)
                out[32 + 16 * h + r] = sub[o * sub_row + 16 * s + h];
            continue;
        }
        memcpy(out + 32 + 2 * r, &M[o * S + s], 2);
        uint32_t hi = 0;
        for (uint32_t j = 0; j < 8; j++) {
            uint8_t sc = sub[o * sub_row + 16 * s + 2 * j], mn = sub[o * sub_row + 16 * s + 2 * j + 1];
            hi |= (uint32_t)(sc >> 4) << (4 * j) | (uint32_t)(mn >> 4) << (4 * j + 2);
            out[128 + 16 * j + r] = (uint8_t)((sc & 15) | (mn & 15) << 4);
        }
        memcpy(out + 64 + 4 * r, &hi, 4);
    }
}

void dray_cpu_kpack(const struct dray_weight_desc *w, struct dray_packed *p, uint64_t b0, uint64_t b1)
{
    const uint64_t G = w->k / 32, S = w->k / 256, B = dray_util_wformat_group_bytes(w->format);
    const size_t wb = dray_cpu_k_wbytes(p->layout), sb = dray_cpu_k_sbytes(p->layout);
    for (uint64_t b = b0; b < b1; b++) {
        uint64_t r0 = b * 16, n = w->n_out - r0 < 16 ? w->n_out - r0 : 16;
        const uint8_t *codes = (const uint8_t *)w->codes + r0 * G * B;
        for (uint64_t g = 0; g < G; g++)
            pack_codes(p->layout, codes + g * B, G * B, n, (uint8_t *)p->w + (b * G + g) * wb);
        for (uint64_t s = 0; s < S; s++)
            pack_scales(p->layout, w, r0, n, s, (uint8_t *)p->scale + (b * S + s) * sb);
    }
}
