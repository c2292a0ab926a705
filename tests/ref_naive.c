/* The naive reference's building blocks and the engine's logits (ref_naive.h). */
#include "ref_naive.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "testutil.h"

double *ref_tensor(const struct dray_gguf *g, int il, const char *what, const char *kind, bool need)
{
    char name[64];
    if (il < 0)
        snprintf(name, sizeof(name), "%s.%s", what, kind);
    else
        snprintf(name, sizeof(name), "blk.%d.%s.%s", il, what, kind);
    const struct dray_gguf_tensor *t = dray_gguf_find_tensor(g, name);
    if (!t) {
        if (need)
            fail_msg("the model has no tensor %s", name);
        return NULL;
    }
    uint64_t rows = t->n_dims > 1 ? t->ne[1] : 1;
    float *row = malloc(t->ne[0] * sizeof(float));
    double *w = malloc(t->ne[0] * rows * sizeof(double));
    for (uint64_t i = 0; i < rows; i++) {
        assert_int_equal(dray_gguf_tensor_row_f32(t, i, row), 0);
        for (uint64_t j = 0; j < t->ne[0]; j++)
            w[i * t->ne[0] + j] = row[j];
    }
    free(row);
    return w;
}

void ref_rmsnorm(double *x, const double *w, uint32_t n)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + 1e-6);
    for (uint32_t i = 0; i < n; i++)
        x[i] = x[i] * s * w[i];
}

void ref_linear(const double *W, const double *b, const double *x, double *y, uint32_t k, uint32_t n_out)
{
    for (uint32_t o = 0; o < n_out; o++) {
        double s = b ? b[o] : 0;
        for (uint32_t j = 0; j < k; j++)
            s += W[(size_t)o * k + j] * x[j];
        y[o] = s;
    }
}

uint32_t ref_argmax_f(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

uint32_t ref_argmax_d(const double *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

float *ref_engine_logits(struct dray_engine *e, const int32_t *ids, uint32_t n, uint32_t n_vocab)
{
    char err[512];
    struct dray_session *s;
    assert_int_equal(dray_session_new(e, &s, err, sizeof(err)), 0);
    const char *path = dray_test_path("logits.bin");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (dray_session_dump_logits(s, ids, n, f, err, sizeof(err)))
        fail_msg("dump_logits: %s", err);
    fclose(f);
    dray_session_free(s);
    float *l = malloc((size_t)n * n_vocab * sizeof(float));
    f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(l, sizeof(float) * n_vocab, n, f), n);
    fclose(f);
    return l;
}
