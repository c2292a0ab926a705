/* dray_session_generate: prefill a prompt, then the decode loop that samples a
 * token per step and streams its text through the emitter (stop strings), until
 * end of generation, a stop string, max tokens, a full context or the caller. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "dray/dray.h"
#include "constraint.h"
#include "emitter.h"
#include "engine_internal.h"
#include "error.h"
#include "gen_sampler.h"
#include "kv.h"
#include "lookup.h"
#include "sampler.h"
#include "tokenizer.h"

/* One generated token through the checks every token passes: end of
 * generation, stop ids, the grammar, the emitter and its stop strings. Returns
 * 1 when generation ends at it (st->stop_reason says why; in_kv: whether the
 * token still has to go into the KV so the session can go on), 0 to go on, or
 * a negative DRAY_E*. */
static int take(struct dray_session *s, const struct dray_gen_params *p, struct dray_emitter *em,
                struct dray_constraint *con, int32_t id, bool *in_kv, struct dray_gen_stats *st,
                char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    bool stopped;
    *in_kv = false;
    if (dray_tokenizer_is_eog(e->tok, id)) {
        st->stop_reason = "eog";
        return 1;
    }
    if (dray_gen_is_stop_id(p->stop_ids, p->n_stop_ids, id)) {
        st->stop_reason = "stop id";
        return 1;
    }
    st->n_generated++;
    if (con && dray_constraint_accept(con, id))
        return dray_fail(err, errlen, DRAY_EINVAL, "the grammar refused a token its mask allowed");
    *in_kv = true;
    if (dray_emitter_token(em, id, &stopped)) {
        st->stop_reason = "caller";
        return 1;
    }
    if (stopped || (con && dray_constraint_must_end(con))) {
        st->stop_reason = stopped ? "stop string" : "grammar";
        return 1;
    }
    return 0;
}

/* The draft to verify with id (core/lookup.h): at most room tokens, none that
 * ends generation, none past a point a window moves. */
static size_t draft_after(struct dray_session *s, int32_t id, int32_t *draft, size_t room)
{
    struct dray_engine *e = s->e;
    size_t k = dray_lookup_draft(s->hist, s->n_hist, id, draft, room);
    for (size_t j = 0; j < k; j++)
        if (dray_tokenizer_is_eog(e->tok, draft[j]))
            k = j;
    while (k && dray_kv_window_moves(e->kv, (uint32_t)(s->n_hist + 1), (uint32_t)(s->n_hist + 1 + k)))
        k--;
    return k;
}

struct drafting { /* speculative decoding by prompt lookup (lookup_draft > 0) */
    uint32_t max;          /* tokens per draft */
    int32_t *feed;         /* [1 + max]: the sampled token, then the draft */
    uint32_t *rows;        /* [1 + max]: 0, 1, ... */
    float *logits;         /* [1 + max][n_vocab] */
    struct dray_lookup_policy policy;
};

static int drafting_init(struct drafting *d, const struct dray_engine *e, uint32_t max)
{
    *d = (struct drafting){.max = max};
    if (!max)
        return 0;
    d->feed = malloc((max + 1) * sizeof(*d->feed));
    d->rows = malloc((max + 1) * sizeof(*d->rows));
    d->logits = malloc((size_t)(max + 1) * e->info.n_vocab * sizeof(*d->logits));
    for (uint32_t i = 0; d->rows && i <= max; i++)
        d->rows[i] = i;
    return d->feed && d->rows && d->logits ? 0 : DRAY_ENOMEM;
}

static void drafting_free(struct drafting *d)
{
    free(d->feed);
    free(d->rows);
    free(d->logits);
}

static int32_t draw(struct dray_sampler *smp, struct dray_constraint *con, const float *row,
                    uint32_t n_vocab, const int32_t *hist, size_t n_hist, bool *dead)
{
    *dead = false;
    return con ? dray_constraint_sample(con, smp, row, n_vocab, hist, n_hist, false, dead)
               : dray_sampler_sample(smp, row, n_vocab, hist, n_hist);
}

static int decode(struct dray_session *s, const struct dray_gen_params *p, struct dray_emitter *em,
                  struct dray_gen_stats *st, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    struct dray_sampler *smp = NULL;
    struct dray_constraint *con = NULL;
    struct drafting d;
    uint32_t V = e->info.n_vocab;
    int rc = dray_gen_sampler(p, e->tok, s->n_hist, &smp, err, errlen);
    if (!rc)
        rc = dray_constraint_new(e, p, &con, err, errlen);
    if (!rc && drafting_init(&d, e, p->lookup_draft))
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for lookup drafts");
    if (rc) {
        dray_sampler_free(smp);
        dray_constraint_free(con);
        return rc;
    }
    double t0 = dray_now_s();
    st->stop_reason = "max tokens";
    const float *row = e->logits; /* the logits of the next position */
    int32_t next = -1;            /* a token drawn while verifying a draft, not yet taken */
    for (uint32_t i = 0; rc == 0 && i < p->max_tokens;) {
        bool dead = false, in_kv;
        int32_t id = next >= 0 ? next : draw(smp, con, row, V, s->hist, s->n_hist, &dead);
        next = -1;
        if (id < 0 && con && dray_constraint_error(con)) { /* over the grammar's step budget */
            rc = dray_fail(err, errlen, id, "%s", dray_constraint_error(con));
            break;
        }
        if (id < 0) {
            rc = dray_fail(err, errlen, id, "sampling failed: %s", dray_strerror(id));
            break;
        }
        if (dead) {
            st->stop_reason = "grammar";
            if (!dray_constraint_can_end(con))
                rc = dray_fail(err, errlen, DRAY_EINVAL, "the grammar allows no token the sampler "
                               "may draw next (logit_bias, ignore_eos or min_tokens ban them all)");
            break;
        }
        int end = take(s, p, em, con, id, &in_kv, st, err, errlen);
        i++;
        if (end) {
            if (end > 0 && in_kv) /* so the session can go on */
                rc = dray_session_step(s, &id, 1, NULL, 0, NULL, err, errlen);
            else if (end < 0)
                rc = end;
            break;
        }
        if (s->n_hist + 1 > e->info.context) {
            st->stop_reason = "context full";
            break;
        }
        /* the last token of max_tokens still goes into the KV so the session can go on */
        bool want = i < p->max_tokens;
        size_t room = p->max_tokens - i, n0 = s->n_hist, k = 0;
        if (room > d.max)
            room = d.max;
        if (room > e->info.context - n0 - 1)
            room = e->info.context - n0 - 1;
        uint32_t len = want && d.max ? dray_lookup_try(&d.policy, d.max) : 0;
        if (len)
            k = draft_after(s, id, d.feed + 1, room < len ? room : len);
        if (!k) {
            uint32_t r0 = 0;
            rc = dray_session_step(s, &id, 1, &r0, want ? 1 : 0, e->logits, err, errlen);
            row = e->logits;
            continue;
        }
        /* verify: one step over id and the draft, every row's logits; keep the
         * drafted tokens the sampler draws too, and the first it does not */
        d.feed[0] = id;
        rc = dray_session_step(s, d.feed, (uint32_t)(1 + k), d.rows, (uint32_t)(1 + k), d.logits, err,
                               errlen);
        st->n_drafted += (uint32_t)k;
        size_t kept = 0;
        for (; rc == 0 && kept < k; kept++) {
            int32_t x = draw(smp, con, d.logits + kept * V, V, s->hist, n0 + 1 + kept, &dead);
            if (x < 0 || dead || x != d.feed[1 + kept]) {
                next = x >= 0 && !dead ? x : -1;
                row = d.logits + kept * V; /* dead or failed: drawn again, the same way */
                break;
            }
            end = take(s, p, em, con, x, &in_kv, st, err, errlen);
            i++;
            if (end) {
                rc = end < 0 ? end : 0;
                kept += end > 0 && in_kv; /* it stays in the KV */
                i = p->max_tokens; /* ends the loop */
                break;
            }
        }
        st->n_draft_kept += (uint32_t)(kept < k ? kept : k);
        dray_lookup_kept(&d.policy, k, kept);
        if (kept == k && i < p->max_tokens)
            row = d.logits + k * V; /* all kept: the next position is the last row */
        if (rc == 0 && s->n_hist > n0 + 1 + kept)
            rc = dray_session_truncate(s, n0 + 1 + kept);
    }
    st->decode_s = dray_now_s() - t0;
    dray_sampler_free(smp);
    dray_constraint_free(con);
    drafting_free(&d);
    if (!rc)
        dray_emitter_flush(em);
    return rc;
}

int dray_session_generate(struct dray_session *s, const int32_t *ids, size_t n,
                          const struct dray_gen_params *p, dray_emit_fn emit, void *user,
                          struct dray_gen_stats *st, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    memset(st, 0, sizeof(*st));
    st->n_prompt = (uint32_t)n;
    st->n_reused = (uint32_t)s->n_hist;
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "empty prompt");
    int rc = dray_gen_check_ids(p, e->info.n_vocab, err, errlen);
    if (!rc)
        rc = dray_session_check_fits(s, n, err, errlen);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= e->info.n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL, "token id %d at %zu is outside the vocabulary (0..%u)",
                             ids[i], i, e->info.n_vocab - 1);
    double t0 = dray_now_s();
    rc = dray_session_feed(s, ids, n, err, errlen);
    st->prefill_s = dray_now_s() - t0;
    st->n_prefilled = (uint32_t)n;
    if (rc)
        return rc;
    struct dray_emitter em;
    rc = dray_emitter_init(&em, e->tok, p->stop, p->n_stop, emit, user, err, errlen);
    if (rc)
        return rc;
    rc = decode(s, p, &em, st, err, errlen);
    dray_emitter_free(&em);
    return rc;
}
