/* dray's int8 weight layout: one symmetric scale per output channel (row).
 * scale[r] = max|w[r][:]| / 127;  q = round-to-nearest-even(w / scale) in [-127, 127].
 * -128 is never produced, so negating a code cannot overflow and the range is
 * symmetric. A zero row gets scale 0 and all-zero codes. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "dray/backend.h"

#include "gguf.h"
#include "quant.h"

/* Round half to even without libm, so the loop vectorizes with plain SSE2/AVX:
 * adding and subtracting 1.5 * 2^23 leaves the nearest integer (ties to even, in
 * the default rounding mode dray never changes) for |v| < 2^22. The clamp guards
 * w/scale = 127.0000x; NaN weights give 0. */
static inline float round_even_small(float v)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23; dray is never built with -ffast-math */
    return (v + magic) - magic;
}

void dray_quantize_rows_i8(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale)
{
    for (uint64_t r = 0; r < rows; r++) {
        const float *wr = w + r * cols;
        int8_t *qr = q + r * cols;
        float amax = 0.0f;
        for (uint64_t c = 0; c < cols; c++) {
            float a = fabsf(wr[c]);
            amax = a > amax ? a : amax; /* NaN compares false: ignored, as fmaxf would */
        }
        scale[r] = amax / 127.0f;
        if (!(amax > 0.0f)) {
            for (uint64_t c = 0; c < cols; c++)
                qr[c] = 0;
            continue;
        }
        const float s = scale[r];
        for (uint64_t c = 0; c < cols; c++) {
            float v = round_even_small(wr[c] / s);
            v = v > 127.0f ? 127.0f : v;
            v = v < -127.0f ? -127.0f : v;
            qr[c] = (int8_t)(v == v ? (int)v : 0);
        }
    }
}

void dray_quantize_rows_q8g(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale)
{
    /* each group of 32 is a row of its own as far as the rule goes */
    dray_quantize_rows_i8(w, rows * (cols / 32), 32, q, scale);
}

/* Squared error of x[0..31] against codes c with y = c*d + m. */
static double q4_sse(const float *x, const uint8_t *c, float d, float m)
{
    double e = 0;
    for (int i = 0; i < 32; i++) {
        double r = (double)x[i] - ((double)c[i] * d + m);
        e += r * r;
    }
    return e;
}

static void q4_codes(const float *x, float d, float m, uint8_t *c)
{
    for (int i = 0; i < 32; i++) {
        float v = d > 0.0f ? round_even_small((x[i] - m) / d) : 0.0f;
        v = v > 15.0f ? 15.0f : v;
        v = v < 0.0f ? 0.0f : v;
        c[i] = (uint8_t)(v == v ? (int)v : 0);
    }
}

/* v as the f16 it will be stored as */
static float as_f16(float v)
{
    return dray_f16_to_f32(dray_f32_to_f16(v));
}

/* One group of 32: start from the min/max grid (every error within d/2), then
 * alternate a least-squares fit of d and m to the codes with re-rounding,
 * keeping the smallest squared error seen, so the result is never worse than
 * min/max. Codes packed like dray_gguf_tensor_row_q4g (i low, i+16 high).
 * half: then d and m are rounded to f16 and the codes picked again against the
 * rounded pair, keeping those or the fit's own codes, whichever has the smaller
 * squared error with the rounded pair, so what is stored (Q4G32H) is exactly
 * what was chosen, and never worse than rounding the f32 fit's d and m alone.
 * (Fitting with rounded candidates throughout did no better: on Q8_0-like rows
 * the rounding moves the error by about 1e-4 of itself either way.) */
static void q4_group(const float *x, uint8_t *packed, float *dm, bool half)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    uint8_t best[32], c[32];
    float bd = (hi - lo) / 15.0f, bm = lo;
    q4_codes(x, bd, bm, best);
    double be = q4_sse(x, best, bd, bm);
    memcpy(c, best, sizeof(c));
    for (int it = 0; it < 4 && be > 0 && bd > 0.0f; it++) {
        double n = 32, sq = 0, sqq = 0, sx = 0, sqx = 0;
        for (int i = 0; i < 32; i++) {
            sq += c[i];
            sqq += (double)c[i] * c[i];
            sx += x[i];
            sqx += (double)c[i] * x[i];
        }
        double det = n * sqq - sq * sq;
        if (!(det > 0))
            break;
        float d = (float)((n * sqx - sq * sx) / det), m = (float)((sx - (n * sqx - sq * sx) / det * sq) / n);
        if (!(d > 0.0f))
            break;
        q4_codes(x, d, m, c);
        double e = q4_sse(x, c, d, m);
        if (!(e < be))
            break;
        be = e, bd = d, bm = m;
        memcpy(best, c, sizeof(c));
    }
    if (half) {
        bd = as_f16(bd), bm = as_f16(bm);
        q4_codes(x, bd, bm, c);
        if (q4_sse(x, c, bd, bm) < q4_sse(x, best, bd, bm))
            memcpy(best, c, sizeof(c));
    }
    for (int i = 0; i < 16; i++)
        packed[i] = (uint8_t)(best[i] | best[i + 16] << 4);
    dm[0] = bd;
    dm[1] = bm;
}

/* Groups g0 .. g1-1 of a 4-bit rounding, one thread's share. */
struct q4_share {
    const float *w;
    uint8_t *q;
    float *dm;
    uint64_t g0, g1;
    bool half;
};

static void *q4_run(void *arg)
{
    const struct q4_share *s = arg;
    for (uint64_t g = s->g0; g < s->g1; g++)
        q4_group(s->w + g * 32, s->q + g * 16, s->dm + g * 2, s->half);
    return NULL;
}

/* The least-squares fit costs ~1 us a group: rounding a 262144 x 640 head is
 * 5.2M groups, seconds of a model's load on one core. Groups are independent,
 * so large calls split them over the online cores (at most 8); each group's
 * result is the same whichever thread computes it. */
static void q4_rows(const float *w, uint64_t rows, uint64_t cols, uint8_t *q, float *dm, bool half)
{
    enum { MAX_THREADS = 8, MIN_SHARE = 4096 };
    const uint64_t n = rows * (cols / 32);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t nt = cores > 1 ? (uint64_t)cores : 1;
    nt = nt > MAX_THREADS ? MAX_THREADS : nt;
    nt = n / MIN_SHARE < nt ? n / MIN_SHARE : nt;
    struct q4_share sh[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (uint64_t i = 0; i < (nt ? nt : 1); i++)
        sh[i] = (struct q4_share){w, q, dm, n * i / (nt ? nt : 1), n * (i + 1) / (nt ? nt : 1), half};
    for (uint64_t i = 1; i < nt; i++) /* a thread that cannot start: its share runs here */
        started[i] = pthread_create(&th[i], NULL, q4_run, &sh[i]) == 0;
    q4_run(&sh[0]);
    for (uint64_t i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            q4_run(&sh[i]);
    }
}

void dray_quantize_rows_q4g(const float *w, uint64_t rows, uint64_t cols, uint8_t *q, float *dm)
{
    q4_rows(w, rows, cols, q, dm, false);
}

void dray_quantize_rows_q4gh(const float *w, uint64_t rows, uint64_t cols, uint8_t *q, float *dm)
{
    q4_rows(w, rows, cols, q, dm, true);
}
