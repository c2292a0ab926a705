/* dray's int8 weight layout: one symmetric scale per output channel (row).
 * scale[r] = max|w[r][:]| / 127;  q = round-to-nearest-even(w / scale) in [-127, 127].
 * -128 is never produced, so negating a code cannot overflow and the range is
 * symmetric. A zero row gets scale 0 and all-zero codes. */
#include <math.h>

#include "gguf.h"

static int8_t quant_one(float w, float scale)
{
    /* rintf rounds half to even in the default FE_TONEAREST mode, which dray never
     * changes. NaN weights give 0; the clamp guards w/scale = 127.0000x. */
    float v = rintf(w / scale);
    if (!(v == v))
        return 0;
    if (v > 127.0f)
        return 127;
    if (v < -127.0f)
        return -127;
    return (int8_t)v;
}

void dray_quantize_rows_i8(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale)
{
    for (uint64_t r = 0; r < rows; r++) {
        const float *wr = w + r * cols;
        int8_t *qr = q + r * cols;
        float amax = 0.0f;
        for (uint64_t c = 0; c < cols; c++)
            amax = fmaxf(amax, fabsf(wr[c])); /* fmaxf ignores NaN */
        scale[r] = amax / 127.0f;
        for (uint64_t c = 0; c < cols; c++)
            qr[c] = amax > 0.0f ? quant_one(wr[c], scale[r]) : 0;
    }
}
