/* dray_session_generate: prefill a prompt, then the decode loop that samples a
 * token per step and streams its text through the emitter (stop strings), until
 * end of generation, a stop string, max tokens, a full context or the caller. */
#include <stdbool.h>
#include <string.h>

#include "dray/dray.h"
#include "constraint.h"
#include "emitter.h"
#include "engine_internal.h"
#include "error.h"
#include "gen_sampler.h"
#include "sampler.h"
#include "tokenizer.h"

static int decode(struct dray_session *s, const struct dray_gen_params *p, struct dray_emitter *em,
                  struct dray_gen_stats *st, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    struct dray_sampler *smp = NULL;
    struct dray_constraint *con = NULL;
    int rc = dray_gen_sampler(p, e->tok, s->n_hist, &smp, err, errlen);
    if (!rc)
        rc = dray_constraint_new(e, p, &con, err, errlen);
    if (rc) {
        dray_sampler_free(smp);
        return rc;
    }
    double t0 = dray_now_s();
    st->stop_reason = "max tokens";
    for (uint32_t i = 0; i < p->max_tokens; i++) {
        const uint32_t *allow = NULL;
        long n_allowed = 1;
        if (con && !(allow = dray_constraint_mask(con, &n_allowed, &rc))) {
            rc = dray_fail(err, errlen, rc, "the grammar's mask: %s", dray_strerror(rc));
            break;
        }
        int32_t id = n_allowed ? dray_sampler_sample_allowed(smp, e->logits, e->info.n_vocab, s->hist,
                                                             s->n_hist, allow)
                               : 0;
        if (id < 0) {
            rc = dray_fail(err, errlen, id, "sampling failed: %s", dray_strerror(id));
            break;
        }
        if (con && (!n_allowed || !dray_constraint_allowed(con, id))) {
            st->stop_reason = "grammar";
            if (!dray_constraint_can_end(con))
                rc = dray_fail(err, errlen, DRAY_EINVAL, "the grammar allows no token the sampler "
                               "may draw next (logit_bias, ignore_eos or min_tokens ban them all)");
            break;
        }
        if (dray_tokenizer_is_eog(e->tok, id)) {
            st->stop_reason = "eog";
            break;
        }
        if (dray_gen_is_stop_id(p->stop_ids, p->n_stop_ids, id)) {
            st->stop_reason = "stop id";
            break;
        }
        st->n_generated++;
        bool stopped;
        if (con && dray_constraint_accept(con, id)) {
            rc = dray_fail(err, errlen, DRAY_EINVAL, "the grammar refused a token its mask allowed");
            break;
        }
        if (dray_emitter_token(em, id, &stopped)) {
            st->stop_reason = "caller";
            rc = dray_session_step(s, &id, 1, NULL, 0, NULL, err, errlen);
            break;
        }
        if (stopped || (con && dray_constraint_must_end(con))) {
            st->stop_reason = stopped ? "stop string" : "grammar";
            rc = dray_session_step(s, &id, 1, NULL, 0, NULL, err, errlen);
            break;
        }
        if (s->n_hist + 1 > e->info.context) {
            st->stop_reason = "context full";
            break;
        }
        uint32_t row = 0;
        /* the last token of max_tokens still goes into the KV so the session can go on */
        bool want = i + 1 < p->max_tokens;
        rc = dray_session_step(s, &id, 1, &row, want ? 1 : 0, e->logits, err, errlen);
        if (rc)
            break;
    }
    st->decode_s = dray_now_s() - t0;
    dray_sampler_free(smp);
    dray_constraint_free(con);
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
