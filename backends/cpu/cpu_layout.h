/* The CPU plugin's layouts of packed weights (ABI version 3): backend.h's
 * layout-neutral groups interleaved for the SIMD kernels, chosen per matrix in
 * weight_create (cpu_packed.c). They were ABI version 2's grouped dtypes; the
 * names stay (DRAY_Q8G32, DRAY_Q4G32, DRAY_Q5G32, DRAY_Q4G32H) and now mean
 * only this plugin's layouts. The value W[o][c] of each is backend.h's.
 *
 * k is a multiple of 32 and n_out of 16;
 * G = k / 32 groups per row; group g is input channels 32g .. 32g+31. Rows come
 * in blocks of 16 (block b = rows 16b .. 16b+15), and within a block each group
 * is stored as 64-byte units that hold 4 consecutive inputs of all 16 rows (unit
 * byte 4r + e = row 16b+r), so one 32-bit lane of a vector register is one row:
 *   DRAY_Q8G32: w I8, n_out*k bytes: W8(o, c) is byte
 *                 ((b*G + g)*8 + i)*64 + 4r + e,  o = 16b+r, c = 32g + 4i + e;
 *               wscale F32 [n_out/16][G][16]: s(o, g) = wscale[(b*G + g)*16 + r];
 *               W[o][c] = W8(o, c) * s(o, c/32).
 *   DRAY_Q4G32: w U8, n_out*k/2 bytes: unit u (0..3) of (b, g) at
 *                 ((b*G + g)*4 + u)*64; its byte 4r + e holds, as unsigned 0..15,
 *                 input 32g + 4u + e in the low nibble and 32g + 16 + 4u + e in
 *                 the high nibble of row 16b+r;
 *               wscale F32 [n_out/16][G][2][16]: d(o, g) = wscale[((b*G + g)*2)*16 + r],
 *                 m(o, g) = wscale[((b*G + g)*2 + 1)*16 + r];
 *               W[o][c] = nib(o, c) * d(o, c/32) + m(o, c/32).
 *   DRAY_Q5G32 (matmul only, its own bit; not an embedding table): w U8,
 *               n_out*k*5/8 bytes, 320 per (b, g) at (b*G + g)*320: units u = 0..3
 *               at +64u hold the low 4 bits of the codes exactly as Q4G32's units
 *               do, and the high unit at +256 holds bit 4 of all 32 inputs of the
 *               16 rows: its 64-bit little-endian word j (bytes 8j .. 8j+7, j =
 *               0..7) has at bit 4r + e bit 4 of the code of input 32g + 4j + e of
 *               row 16b+r (so word j is a byte mask over unit j%4's low (j < 4) or
 *               high (j >= 4) nibbles: a kernel adds 16 where it is set);
 *                 code(o, c) = nib(o, c) + 16 * hibit(o, c), 0..31;
 *               wscale F16 (binary16) [n_out/16][G][2][16], 4 bytes per row and
 *                 group (the validators count it as k/32 f32-sized values per row):
 *                 d(o, g) = half ((b*G + g)*2)*16 + r, m(o, g) = half
 *                 ((b*G + g)*2 + 1)*16 + r, both widened to f32 exactly;
 *               W[o][c] = code(o, c) * d(o, c/32) + m(o, c/32)   (in f32).
 *               24 bytes per 32 weights against Q8G32's 36.
 *   DRAY_Q4G32H (matmul only, its own bit; not an embedding table): w exactly
 *               as Q4G32 (n_out*k/2 bytes, the same four units per (b, g)),
 *               wscale F16 exactly as Q5G32's (d then m, [n_out/16][G][2][16],
 *               4 bytes per row and group, counted as k/32 f32-sized values);
 *               W[o][c] = nib(o, c) * d(o, c/32) + m(o, c/32)   (in f32).
 *               So Q5G32 is Q4G32H plus its high unit. 20 bytes per 32 weights.
 */
#ifndef DRAY_CPU_LAYOUT_H
#define DRAY_CPU_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "cpu_isa.h"

struct dray_packed {
    uint32_t layout;       /* DRAY_Q8G32, DRAY_Q4G32, DRAY_Q5G32, DRAY_Q4G32H or
                            * DRAY_CPU_K4/K5/K6 (cpu_kernels.h) */
    uint32_t n_out, k, uses;
    uint32_t rows;         /* n_out rounded up to whole 16-row blocks (zero rows after) */
    void *w, *scale;       /* the layout's w and wscale, 64-byte aligned */
    size_t wbytes, sbytes;
    int borrowed;          /* w and scale point into the host's bytes (weight_import) */
};

/* The formats weight_create takes for matmul (embed = 0) or embed (1). */
DRAY_CPU_HIDDEN uint32_t dray_cpu_wformats(int embed);
DRAY_CPU_HIDDEN int dray_cpu_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *w,
                                           struct dray_packed **out, uint64_t *device_bytes);
DRAY_CPU_HIDDEN void dray_cpu_weight_free(struct dray_ctx *ctx, struct dray_packed *p);
/* ABI v5 (cpu_prepared.c): a handle's bytes, and one from them in place. */
DRAY_CPU_HIDDEN int dray_cpu_weight_export(struct dray_ctx *ctx, const struct dray_packed *p, void *dst,
                                           uint64_t *nbytes);
DRAY_CPU_HIDDEN int dray_cpu_weight_import(struct dray_ctx *ctx, const struct dray_weight_desc *d, const void *src,
                                           uint64_t nbytes, struct dray_packed **out, uint64_t *device_bytes);
/* Row-major codes (backend.h's B bytes per group) and float scales (Q8G32: d per
 * group; else {d, m} per group) of `rows` rows into layout's qo and so. */
/* Blocks [b0, b1) of a two-level weight into p's DRAY_CPU_K* layout (cpu_kpack.c). */
DRAY_CPU_HIDDEN void dray_cpu_kpack(const struct dray_weight_desc *w, struct dray_packed *p, uint64_t b0,
                                    uint64_t b1);
DRAY_CPU_HIDDEN void dray_cpu_interleave(uint32_t layout, uint64_t rows, uint64_t k, const void *q,
                                         const float *sc, void *qo, void *so);

#endif
