/* Core's side of GGUF: the reader itself is public (dray/gguf.h); here is what
 * only the engine uses: block dequantization, f16 conversion and the int8
 * quantizer. (The writer that tests build tiny models with is tests/gguf_write.h.) */
#ifndef DRAY_CORE_GGUF_H
#define DRAY_CORE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/gguf.h"

/* Dequantize n elements (a multiple of the block size) of type from src to f32. */
int dray_dequant_row(uint32_t type, const void *src, float *dst, uint64_t n);

/* float <-> half helpers (IEEE binary16, round to nearest even) */
float dray_f16_to_f32(uint16_t h);
uint16_t dray_f32_to_f16(float f);

/* dray's int8 layout: per-output-channel (row) symmetric int8.
 * scale[r] = max|w[r][:]| / 127, q = round-nearest-even(w/scale) in [-127,127],
 * a zero row gets scale 0. w is [rows][cols] f32. */
void dray_quantize_rows_i8(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale);

#endif
