/* Internals of the conformance runner, shared by conformance.c (driver, table,
 * comparison, timing) and conf_cases.c (one generator and one checker per op).
 * Depends on backend.h only: the runner sees plugins exactly as the core does. */
#ifndef DRAY_CONF_INTERNAL_H
#define DRAY_CONF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/backend_util.h" /* f16 */
#include "conf_loader.h"

/* ------------------------------------------------------------ random numbers */

struct conf_rng {
    uint64_t s;
};
uint32_t conf_rand(struct conf_rng *r);
/* uniform in [lo, hi] (integers, inclusive) */
uint32_t conf_range(struct conf_rng *r, uint32_t lo, uint32_t hi);
float conf_randf(struct conf_rng *r, float lo, float hi);

/* ------------------------------------------------------------ one case */

/* One array of a case. Inputs and outputs alike are uploaded from host before
 * the op (outputs carry their prior content: accumulate, in place, untouched
 * padding); outputs are downloaded afterwards into got[0] (reference) and
 * got[1] (subject). */
struct conf_arr {
    void *host;
    size_t nbytes;
    int out;
    void *got[2];
};

#define CONF_MAX_ARRS 12

/* Launch the op on one side: v[i] is the device view of a[i]. */
typedef int (*conf_launch_fn)(const struct dray_ops *ops, struct dray_ctx *ctx,
                              const struct dray_view *v, const void *params);

struct conf_case {
    struct conf_arr a[CONF_MAX_ARRS];
    int n;
    conf_launch_fn launch;
    void *params;      /* op arguments without views (malloc'd, freed with the case) */
    char shape[200];   /* "n_tok=7 k=129 n_out=33 outliers=3 accumulate" */
    /* facts the checker needs */
    double scale_ref;  /* abs tolerance is tol.abs * this: > 0 as given (attention: max|v|),
                        * < 0 = max|reference output| (matmul), 0 = 1 (plain absolute) */
    float *elem_tol;   /* per-element bound on the one f32 output, before tol.elem:
                        * sum_k |x||w| (+ |prior out| when accumulating) for matmul f32 */
    int idx[4];        /* kv_store: array indices of k, v, k_scale, v_scale */
    uint32_t inner;    /* kv_store: elements per scale (head_dim) */
};

/* Add an array of nbytes (zeroed) to c; returns its host memory, NULL on OOM. */
void *conf_arr_add(struct conf_case *c, size_t nbytes, int out);
void conf_case_free(struct conf_case *c);

/* ------------------------------------------------------------ comparison */

struct conf_metrics {
    double max_abs, max_rel;  /* over elements; rel only where the reference is non-zero */
    double err2, ref2;        /* sums for NMSE = err2 / ref2 */
    size_t n, n_bad;          /* elements compared, elements out of tolerance */
    size_t first_bad;         /* index of the first bad element */
};

/* |sub - ref| <= abs_tol + rel_tol*|ref| (+ elem_scale*elem_tol[i] when given). NaN is bad
 * unless both are NaN. */
void conf_compare_f32(const float *ref, const float *sub, size_t n, const float *elem_tol,
                      double elem_scale, double abs_tol, double rel_tol, struct conf_metrics *m);

/* ------------------------------------------------------------ variants */

/* The tolerances backend.h writes next to each op; see the table in conformance.c. */
struct conf_tol {
    double abs;  /* absolute, or relative to a per-case scale where the op says so;
                  * kv_store i8: the fraction of codes that may be off by one (ties) */
    double rel;  /* relative to |reference| per element (kv_store i8: of the scales) */
    double elem; /* times the case's per-element bound elem_tol (matmul f32) */
    const char *text;
};

/* Build a case: random shapes when bench = 0, the fixed timing shape when 1. */
typedef int (*conf_make_fn)(struct conf_rng *r, struct conf_case *c, int bench);
/* Compare got[0] with got[1]; 0 = pass. why gets the first failure. */
typedef int (*conf_check_fn)(const struct conf_case *c, const struct conf_tol *tol,
                             struct conf_metrics *m, char *why, size_t whylen);

int conf_make_embed_i8(struct conf_rng *, struct conf_case *, int);
int conf_make_embed_f32(struct conf_rng *, struct conf_case *, int);
int conf_make_rmsnorm(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_i8(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_f32(struct conf_rng *, struct conf_case *, int);
/* version 2's grouped weights (matmul) and tables (embed) */
int conf_make_matmul_q8g(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_q4g(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_q8gx2(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_q4gx2(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_q5g(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_q5gx2(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_q4gh(struct conf_rng *, struct conf_case *, int);
int conf_make_matmul_q4ghx2(struct conf_rng *, struct conf_case *, int);
int conf_make_embed_q8g(struct conf_rng *, struct conf_case *, int);
int conf_make_embed_q4g(struct conf_rng *, struct conf_case *, int);
int conf_make_rope(struct conf_rng *, struct conf_case *, int);
int conf_make_kv_store_i8(struct conf_rng *, struct conf_case *, int);
int conf_make_kv_store_f16(struct conf_rng *, struct conf_case *, int);
int conf_make_attention_i8(struct conf_rng *, struct conf_case *, int);
int conf_make_attention_f16(struct conf_rng *, struct conf_case *, int);
int conf_make_gated_act(struct conf_rng *, struct conf_case *, int);
int conf_make_add(struct conf_rng *, struct conf_case *, int);

/* Every f32 output compared element-wise: abs (times the case's scale), rel, and
 * the per-element bound elem_tol when the case has one (matmul f32). */
int conf_check_f32(const struct conf_case *, const struct conf_tol *, struct conf_metrics *, char *, size_t);
/* kv_store: int8 q exact but for ties, scales to one rounding; f16 bit-exact. */
int conf_check_kv_i8(const struct conf_case *, const struct conf_tol *, struct conf_metrics *, char *, size_t);
int conf_check_kv_f16(const struct conf_case *, const struct conf_tol *, struct conf_metrics *, char *, size_t);

#endif
