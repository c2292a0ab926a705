/* The int8 weight quantizer (quant.c). */
#ifndef DRAY_CORE_QUANT_H
#define DRAY_CORE_QUANT_H

#include <stdint.h>

/* dray's int8 layout: per-output-channel (row) symmetric int8.
 * scale[r] = max|w[r][:]| / 127, q = round-nearest-even(w/scale) in [-127,127],
 * a zero row gets scale 0. w is [rows][cols] f32. */
void dray_quantize_rows_i8(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale);

/* backend.h's Q8G32 layout (cols a multiple of 32): each group of 32 along a row
 * quantized like a row above, scale [rows][cols/32]. Q8_0 sources come back
 * exactly (codes times one scale, the largest code 127); Q5_0 ones to within
 * 1/16 of their step (their largest code is 16: codes times 127/16 are not
 * integers), which is why W4A8 keeps them in Q5G32 where it can. Q4G32 needs no quantizer: 4-bit files convert
 * losslessly (dray_gguf_tensor_row_q4g). */
void dray_quantize_rows_q8g(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale);

/* backend.h's Q4G32 codes of f32 rows (cols a multiple of 32), row-major: q
 * [rows][cols/2] (16 bytes per group, input i low and i+16 high in byte i, as
 * dray_gguf_tensor_row_q4g), dm [rows][cols/32][2] = {d, m}, y = code*d + m.
 * Lossy (for 8-bit sources such as a Q8_0 head): per group the min/max grid
 * (every error within (max-min)/30), refined by least squares on d and m when
 * that lowers the group's squared error, so the squared error is never above
 * the min/max grid's. A group already on a 16-level grid comes back exactly. */
void dray_quantize_rows_q4g(const float *w, uint64_t rows, uint64_t cols, uint8_t *q, float *dm);

/* The same for DRAY_Q4G32H (f16 d and m): every d and m it returns is an f16
 * value (exactly representable), and the codes are the ones fitted against those
 * rounded values, so storing them as f16 loses nothing more. */
void dray_quantize_rows_q4gh(const float *w, uint64_t rows, uint64_t cols, uint8_t *q, float *dm);

#endif
