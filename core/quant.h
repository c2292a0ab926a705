/* The int8 weight quantizer (quant.c). */
#ifndef DRAY_CORE_QUANT_H
#define DRAY_CORE_QUANT_H

#include <stdint.h>

/* dray's int8 layout: per-output-channel (row) symmetric int8.
 * scale[r] = max|w[r][:]| / 127, q = round-nearest-even(w/scale) in [-127,127],
 * a zero row gets scale 0. w is [rows][cols] f32. */
void dray_quantize_rows_i8(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale);

#endif
