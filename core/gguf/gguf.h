/* Core's side of GGUF data: the reader and the ggml type table are public
 * (dray/gguf.h); here is turning block data into f32 (dequant.c, f16). The int8
 * quantizer is quant.h; the writer the tests use is tests/gguf_write.h. */
#ifndef DRAY_CORE_GGUF_H
#define DRAY_CORE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/gguf.h"

/* Dequantize n elements (a multiple of the block size) of type from src to f32. */
int dray_dequant_row(uint32_t type, const void *src, float *dst, uint64_t n);
/* Row r of a 4-bit tensor (dray_ggml_is_4bit) in backend.h's Q4G32 layout without
 * loss: q [ne0/2] packed codes, dm [ne0/32][2] = {d, m}; nib*d + m is the f32
 * value dray_gguf_tensor_row_f32 gives. DRAY_ENOTSUP for other types. */
int dray_gguf_tensor_row_q4g(const struct dray_gguf_tensor *t, uint64_t r, uint8_t *q, float *dm);

/* Row r of a Q8_0 tensor as dray_quantize_rows_q8g would quantize its f32 values
 * (codes [ne0], scale [ne0/32]), read straight from the blocks: exact wherever
 * each block's largest |code| is 127 or the block is zero (llama.cpp's Q8_0
 * always is), which is checked. DRAY_ENOTSUP for any other block or type:
 * then take dray_gguf_tensor_row_f32 and the quantizer. */
int dray_gguf_tensor_row_q8g(const struct dray_gguf_tensor *t, uint64_t r, int8_t *q, float *scale);

/* Row r of a Q5_0 or Q5_1 tensor (dray_ggml_is_5bit) in backend.h's Q5G32
 * codes without loss, row-major: q [ne0/32][20], per group of 32 the 16 bytes of
 * low nibbles (input i low, i+16 high in byte i, as Q4G32) then a little-endian
 * uint32 whose bit i is bit 4 of input i; dm [ne0/32][2] = {d, m}, each exact in
 * f16 (Q5_0: m = -16 d); code*d + m is the f32 value dray_gguf_tensor_row_f32
 * gives. DRAY_ENOTSUP for other types; DRAY_ERANGE for a Q5_0 scale of 4096 or
 * more (or not finite), whose -16 d f16 cannot hold. */
int dray_gguf_tensor_row_q5g(const struct dray_gguf_tensor *t, uint64_t r, uint8_t *q, float *dm);

/* Whether a 4-bit tensor's rows from dray_gguf_tensor_row_q4g have f16 d and m
 * (so DRAY_Q4G32H holds them exactly): Q4_1 always, Q4_0 when every block's
 * -8 d fits f16 (|d| <= 8188), never Q4_K (d * scale products in f32). */
bool dray_gguf_tensor_q4_half(const struct dray_gguf_tensor *t);

/* Row r of a Q4_K, Q5_K or Q6_K tensor in backend.h's two-level layout, the
 * file's own codes and scales (no arithmetic): codes [ne0/32][B] (B = 16, 20,
 * 24), sub [ne0/16] bytes ((s, n) per 32, or an int8 per 16), D and M
 * [ne0/256] f16 super-scales (M only with a min; NULL for Q6_K). DRAY_ENOTSUP
 * for other types. */
int dray_gguf_tensor_row_k(const struct dray_gguf_tensor *t, uint64_t r, uint8_t *codes, uint8_t *sub,
                           uint16_t *D, uint16_t *M);

/* float <-> half helpers (IEEE binary16, round to nearest even) */
float dray_f16_to_f32(uint16_t h);
uint16_t dray_f32_to_f16(float f);

#endif
