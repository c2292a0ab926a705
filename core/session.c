/* Sessions (one sequence each in the engine's KV): their token history, the
 * forward step over one or several sessions, chunked prefill, batched decode
 * steps, and dumping the logits of every position. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dray/dray.h"
#include "engine_internal.h"
#include "error.h"
#include "kv.h"
#include "model.h"
#include "split.h"

int dray_session_new(struct dray_engine *e, struct dray_session **out, char *err, size_t errlen)
{
    struct dray_session *s = calloc(1, sizeof(*s));
    *out = NULL;
    if (!s)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    int rc = dray_kv_seq_new(e->kv, &s->seq);
    if (rc) {
        free(s);
        return dray_fail(err, errlen, rc, "no free sequence slot (max_seqs = %u)", e->info.max_seqs);
    }
    s->e = e;
    *out = s;
    return 0;
}

void dray_session_free(struct dray_session *s)
{
    if (!s)
        return;
    dray_kv_seq_free(s->e->kv, s->seq);
    free(s->hist);
    free(s);
}

uint32_t dray_session_len(const struct dray_session *s)
{
    return (uint32_t)s->n_hist;
}

static int hist_push(struct dray_session *s, const int32_t *ids, size_t n)
{
    if (s->n_hist + n > s->cap_hist) {
        size_t cap = s->cap_hist ? s->cap_hist : 256;
        while (cap < s->n_hist + n)
            cap *= 2;
        int32_t *h = realloc(s->hist, cap * sizeof(*h));
        if (!h)
            return DRAY_ENOMEM;
        s->hist = h;
        s->cap_hist = cap;
    }
    memcpy(s->hist + s->n_hist, ids, n * sizeof(*ids));
    s->n_hist += n;
    return 0;
}

int dray_session_adopt(struct dray_session *s, const int32_t *ids, size_t n)
{
    return hist_push(s, ids, n);
}

int dray_session_truncate(struct dray_session *s, size_t len)
{
    int rc = len <= s->n_hist ? dray_kv_seq_truncate(s->e->kv, s->seq, (uint32_t)len) : DRAY_ERANGE;
    if (!rc)
        s->n_hist = len;
    return rc;
}

/* One forward step over several sessions: session i appends n[i] tokens (ids are
 * concatenated in session order). The logits of the listed batch rows go to logits. */
int dray_engine_step(struct dray_session *const *ss, uint32_t n_seq, const uint32_t *n,
                     const int32_t *ids, const uint32_t *logit_rows, uint32_t n_logits,
                     float *logits, char *err, size_t errlen)
{
    struct dray_engine *e = ss[0]->e;
    uint32_t T = 0, seq_ids[n_seq];
    for (uint32_t i = 0; i < n_seq; i++) {
        seq_ids[i] = ss[i]->seq;
        T += n[i];
    }
    int32_t *pos = malloc(T * sizeof(int32_t));
    if (!pos)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    for (uint32_t i = 0, t = 0; i < n_seq; i++)
        for (uint32_t j = 0; j < n[i]; j++)
            pos[t++] = (int32_t)(ss[i]->n_hist + j);
    struct dray_batch b = {.n_tok = T, .ids = ids, .pos = pos, .n_logits = n_logits,
                           .logit_rows = logit_rows, .logits = logits};
    int rc = e->split ? dray_split_forward(e->split, e->kv, n_seq, seq_ids, n, &b, err, errlen)
                      : dray_kv_step_begin(e->kv, n_seq, seq_ids, n, err, errlen);
    if (!rc && !e->split) {
        rc = dray_model_forward(e->model, e->kv, &b, err, errlen);
        if (rc)
            dray_kv_step_abort(e->kv);
        else
            dray_kv_step_end(e->kv);
    }
    for (uint32_t i = 0, t = 0; !rc && i < n_seq; t += n[i], i++)
        if (hist_push(ss[i], ids + t, n[i]))
            rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    free(pos);
    return rc;
}

int dray_session_step(struct dray_session *s, const int32_t *ids, uint32_t n, const uint32_t *logit_rows,
                      uint32_t n_logits, float *logits, char *err, size_t errlen)
{
    return dray_engine_step(&s, 1, &n, ids, logit_rows, n_logits, logits, err, errlen);
}

int dray_sessions_decode(struct dray_session *const *ss, uint32_t n_seq, const int32_t *ids,
                         float *logits, char *err, size_t errlen)
{
    uint32_t ones[n_seq], rows[n_seq];
    if (n_seq == 0 || n_seq > ss[0]->e->chunk)
        return dray_fail(err, errlen, DRAY_EINVAL, "decode step of %u sequences (1..%u)", n_seq,
                         ss[0]->e->chunk);
    for (uint32_t i = 0; i < n_seq; i++) {
        if (ss[i]->e != ss[0]->e || ss[i]->n_hist + 1 > ss[i]->e->info.context)
            return dray_fail(err, errlen, DRAY_ERANGE, "session %u cannot take another token", i);
        ones[i] = 1;
        rows[i] = i;
    }
    return dray_engine_step(ss, n_seq, ones, ids, rows, logits ? n_seq : 0, logits, err, errlen);
}

int dray_session_prefill(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen)
{
    int rc = dray_session_check_fits(s, n, err, errlen);
    return rc ? rc : dray_session_feed(s, ids, n, err, errlen);
}

int dray_session_check_fits(struct dray_session *s, size_t n, char *err, size_t errlen)
{
    uint32_t ctx = s->e->info.context;
    if (s->n_hist + n > ctx)
        return dray_fail(err, errlen, DRAY_ERANGE,
                         "the prompt is %zu tokens and the session already holds %zu, but the "
                         "context is %u tokens: shorten the prompt or raise 'context' (-c)",
                         n, s->n_hist, ctx);
    return 0;
}

/* Prefill in chunks; the logits of the last token land in e->logits. */
int dray_session_feed(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    for (size_t i = 0; i < n; i += e->chunk) {
        uint32_t m = (uint32_t)(n - i < e->chunk ? n - i : e->chunk);
        uint32_t last = m - 1;
        bool final = i + m == n;
        int rc = dray_session_step(s, ids + i, m, &last, final ? 1 : 0, e->logits, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int dray_session_dump_logits(struct dray_session *s, const int32_t *ids, size_t n, void *logits_out,
                             char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    int rc = dray_session_check_fits(s, n, err, errlen);
    uint32_t *rows = malloc(e->chunk * sizeof(uint32_t));
    float *buf = malloc((size_t)e->chunk * e->info.n_vocab * sizeof(float));
    if (!rows || !buf)
        rc = rc ? rc : dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for %u rows of logits", e->chunk);
    for (uint32_t i = 0; rows && i < e->chunk; i++)
        rows[i] = i;
    for (size_t i = 0; !rc && i < n; i += e->chunk) {
        uint32_t m = (uint32_t)(n - i < e->chunk ? n - i : e->chunk);
        rc = dray_session_step(s, ids + i, m, rows, m, buf, err, errlen);
        if (!rc && fwrite(buf, sizeof(float) * e->info.n_vocab, m, logits_out) != m)
            rc = dray_fail(err, errlen, DRAY_EIO, "writing logits failed: %s", strerror(errno));
    }
    free(rows);
    free(buf);
    return rc;
}
