/* dray_session_eval (dray.h): feed a token sequence and hand the caller the
 * logits of every position from `first` on, one row at a time, without ever
 * holding more than EVAL_ROWS rows of n_vocab floats (1 MiB each at Gemma 3's
 * 262144-token vocabulary). Perplexity and KL divergence are built on it. */
#include <stdlib.h>

#include "engine_internal.h"
#include "error.h"

/* Most positions whose logits one step computes: steps that score tokens are
 * cut to this many; steps before `first` take the engine's whole chunk. */
#define EVAL_ROWS 64u

static int check_ids(const struct dray_session *s, const int32_t *ids, size_t n, size_t first,
                     char *err, size_t errlen)
{
    const struct dray_engine_info *in = &s->e->info;
    if (n == 0 || first >= n)
        return dray_fail(err, errlen, DRAY_EINVAL, "eval: %zu tokens, first scored position %zu", n, first);
    if (s->n_hist + n > in->context)
        return dray_fail(err, errlen, DRAY_ERANGE, "eval: %zu tokens after %zu held exceed the context of %u",
                         n, s->n_hist, in->context);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= in->n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL, "eval: token id %d at %zu is outside the vocabulary (0..%u)",
                             ids[i], i, in->n_vocab - 1);
    return 0;
}

int dray_session_eval(struct dray_session *s, const int32_t *ids, size_t n, size_t first,
                      dray_logits_fn fn, void *user, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    uint32_t rows[EVAL_ROWS], n_vocab = e->info.n_vocab;
    int rc = check_ids(s, ids, n, first, err, errlen);
    float *buf = rc ? NULL : malloc((size_t)EVAL_ROWS * n_vocab * sizeof(float));
    if (!rc && !buf)
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "eval: out of memory for %u rows of logits", EVAL_ROWS);
    for (size_t i = 0; !rc && i < n;) {
        /* a step ends where scoring starts, and scored steps hold EVAL_ROWS at most */
        size_t m = n - i < e->chunk ? n - i : e->chunk;
        if (i < first && i + m > first)
            m = first - i;
        if (i >= first && m > EVAL_ROWS)
            m = EVAL_ROWS;
        uint32_t n_rows = i >= first ? (uint32_t)m : 0;
        for (uint32_t r = 0; r < n_rows; r++)
            rows[r] = r;
        rc = dray_engine_step(&s, 1, &(uint32_t){(uint32_t)m}, ids + i, rows, n_rows, buf, err, errlen);
        for (uint32_t r = 0; !rc && r < n_rows; r++)
            if (fn(user, i + r, buf + (size_t)r * n_vocab))
                rc = dray_fail(err, errlen, DRAY_ECANCELED, "eval: stopped by the caller at position %zu", i + r);
        i += m;
    }
    free(buf);
    return rc;
}
