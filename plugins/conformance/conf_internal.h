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

/* Launch the op on one side: v[i] is the device view of a[i]; w is the
 * handle the runner created from the case's wdesc (packed weights), else NULL. */
typedef int (*conf_launch_fn)(const struct dray_ops *ops, struct dray_ctx *ctx,
                              const struct dray_view *v, struct dray_packed *w,
                              const void *params);

struct conf_case;
struct conf_tol;
/* The expected outputs of a case computed by the kit itself (packed weights:
 * backend.h's arithmetic, written from its text): fills got[0] of every
 * output. 0 or DRAY_ENOMEM. */
typedef int (*conf_expect_fn)(struct conf_case *c);

struct conf_case {
    struct conf_arr a[CONF_MAX_ARRS];
    int n;
    conf_launch_fn launch;
    void *params;      /* op arguments without views (malloc'd, freed with the case) */
    char shape[320];   /* "n_tok=7 k=129 n_out=33 outliers=3 accumulate" */
    /* facts the checker needs */
    double scale_ref;  /* abs tolerance is tol.abs * this: > 0 as given (attention: max|v|),
                        * < 0 = max|reference output| (matmul), 0 = 1 (plain absolute) */
    float *elem_tol;   /* per-element bound on the one f32 output, before tol.elem:
                        * sum_k |x||w| (+ |prior out| when accumulating) for matmul f32 */
    int idx[4];        /* kv_store: array indices of k, v, k_scale, v_scale */
    uint32_t inner;    /* kv_store: elements per scale (head_dim) */

    /* Packed weights (version 3). Set by the runner before make: the variant's
     * format and activation passes, and what the subject declares in op_caps
     * (matmul_wformats, embed_wformats, matmul_passes). */
    struct dray_wformat wformat;
    uint32_t passes;
    uint32_t caps_matmul, caps_embed, caps_passes;
    /* Set by make: wdesc.size != 0 means the runner creates a handle from wdesc
     * with the side's weight_create before the op (its arrays are wcodes, wd,
     * wm and, two-level formats, wsub: host memory, never uploaded) and frees
     * it after; expect != NULL means
     * the kit computes the expected outputs (got[0]) instead of the CPU
     * plugin; tol != NULL overrides the variant's tolerance. */
    struct dray_weight_desc wdesc;
    void *wcodes, *wd, *wm, *wsub;
    conf_expect_fn expect;
    const struct conf_tol *tol;
    /* A refusal probe (bad.size != 0): before creating wdesc, weight_create is
     * called with bad (arrays bcodes, bd, bm, bsub) and must fail with bad_rc
     * (DRAY_ENOTSUP: exactly that; DRAY_EINVAL: that or DRAY_ENOTSUP, or only
     * that with bad_exact: a declared format's bad data), leave its handle
     * NULL and say why in last_error; bad_what names the fault. */
    struct dray_weight_desc bad;
    void *bcodes, *bd, *bm, *bsub;
    int bad_rc, bad_exact;
    char bad_what[96];
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

/* Packed weights (backend.h): matmul "abs 1e-4 * sum_k |x[t][k]| |W[o][k]| (+ |out|
 * when accumulating)" per output (the case's elem_tol); embed "one f32 multiply
 * order (rel 1e-6)", taken relative to the terms |code*d| + |m'| of each weight
 * (elem_tol) as well as to the result: code*d + m' and (code - z)*d, fused or
 * not, differ by a rounding of the larger term where the two cancel. */
#define CONF_TOL_PACKED_MATMUL {0, 0, 1e-4, "1e-4*sum|x||W|"}
#define CONF_TOL_PACKED_EMBED {0, 1e-6, 1e-6, "rel 1e-6 of |c*d|+|m|"}

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
/* Packed weights (version 3), in the format and passes the runner set in the
 * case (c->wformat, c->passes): matmul and embed on a handle from weight_create,
 * checked against the kit's own reference. weight_refusal: weight_create with a
 * bad or undeclared format or shape must fail cleanly, and a declared one then
 * still works (the subject's declared formats are in c->caps_*). */
int conf_make_matmul_packed(struct conf_rng *, struct conf_case *, int);
int conf_make_embed_packed(struct conf_rng *, struct conf_case *, int);
int conf_make_weight_refusal(struct conf_rng *, struct conf_case *, int);
/* The same for version 4's two-level formats (c->caps_* & DRAY_UTIL_WF_K):
 * a 4- or 5-bit sub-scale over 63, k not a multiple of 256, no sub, a
 * descriptor too short for sub, f32 scales, a shape that is none of the
 * three, or an undeclared one, then a declared two-level format works. */
int conf_make_weight_refusal_k(struct conf_rng *, struct conf_case *, int);
int conf_make_rope(struct conf_rng *, struct conf_case *, int);
int conf_make_rope_v4(struct conf_rng *, struct conf_case *, int); /* ABI v4 */
int conf_make_kv_store_i8(struct conf_rng *, struct conf_case *, int);
int conf_make_kv_store_f16(struct conf_rng *, struct conf_case *, int);
int conf_make_attention_i8(struct conf_rng *, struct conf_case *, int);
int conf_make_attention_f16(struct conf_rng *, struct conf_case *, int);
int conf_make_attention_softcap_i8(struct conf_rng *, struct conf_case *, int);  /* ABI v4 */
int conf_make_attention_softcap_f16(struct conf_rng *, struct conf_case *, int); /* ABI v4 */
int conf_make_gated_act(struct conf_rng *, struct conf_case *, int);
int conf_make_add(struct conf_rng *, struct conf_case *, int);

/* Every f32 output compared element-wise: abs (times the case's scale), rel, and
 * the per-element bound elem_tol when the case has one (matmul f32). */
int conf_check_f32(const struct conf_case *, const struct conf_tol *, struct conf_metrics *, char *, size_t);
/* kv_store: int8 q exact but for ties, scales to one rounding; f16 bit-exact. */
int conf_check_kv_i8(const struct conf_case *, const struct conf_tol *, struct conf_metrics *, char *, size_t);
int conf_check_kv_f16(const struct conf_case *, const struct conf_tol *, struct conf_metrics *, char *, size_t);

#endif
