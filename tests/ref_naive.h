/* Building blocks of the naive double-precision reference forward passes that
 * the tiny-model tests (test_gemma3_tiny.c, test_llama_tiny.c) write from the
 * math, and the engine side they are compared with: logits of every position.
 * Failures are cmocka failures (these run inside cmocka tests only). */
#ifndef DRAY_TEST_REF_NAIVE_H
#define DRAY_TEST_REF_NAIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "dray/dray.h"
#include "dray/gguf.h"

/* The tensor "blk.IL.WHAT.KIND" (IL < 0: "WHAT.KIND") as doubles, row-major
 * [rows][ne0] (a vector is one row); malloc'd. A missing tensor fails the test
 * when need is set, else gives NULL. */
double *ref_tensor(const struct dray_gguf *g, int il, const char *what, const char *kind, bool need);
/* x <- x / sqrt(mean(x^2) + 1e-6) * w, n elements. */
void ref_rmsnorm(double *x, const double *w, uint32_t n);
/* y = W x (+ b when b is not NULL); W is n_out rows of k. */
void ref_linear(const double *W, const double *b, const double *x, double *y, uint32_t k, uint32_t n_out);
/* Index of the largest of n values (the first on ties). */
uint32_t ref_argmax_f(const float *x, uint32_t n);
uint32_t ref_argmax_d(const double *x, uint32_t n);

/* The engine's logits [n][n_vocab] of every position of ids, from a fresh
 * session (dray_session_dump_logits through a temp file); malloc'd. */
float *ref_engine_logits(struct dray_engine *e, const int32_t *ids, uint32_t n, uint32_t n_vocab);

#endif
