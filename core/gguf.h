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

/* float <-> half helpers (IEEE binary16, round to nearest even) */
float dray_f16_to_f32(uint16_t h);
uint16_t dray_f32_to_f16(float f);

#endif
