/* Scheduler: continuous batching of many requests over one engine (dray.h).
 *
 * One loop thread owns the engine's device and KV. Every step it
 *   1. ends requests that were cancelled (their blocks go back at once),
 *   2. admits waiting requests, oldest first, while a sequence slot is free and
 *      the KV pool has the blocks their tokens need (plus one block of growth for
 *      every running sequence),
 *   3. builds one batch of at most `chunk` tokens: first the one pending token of
 *      every decoding sequence, then prefill chunks of the others in admission
 *      order, so a long prompt never stalls anyone's decoding,
 *   4. runs one forward pass; if the pool ran out of blocks it preempts the
 *      newest sequence (frees its KV, puts it back at the head of the queue: its
 *      tokens so far are recomputed when it is readmitted) and tries again,
 *   5. samples the next token of every sequence whose pending tokens were all
 *      fed, and streams its text.
 *
 * A request's tokens: toks[0..n_toks) = prompt + tokens generated so far. Those
 * that are in the KV are its session's history; the rest (the whole prompt after
 * admission or preemption, or just the last sampled token) are pending. Because a
 * preempted request recomputes exactly toks, its later tokens are the ones it
 * would have produced without the preemption.
 *
 * What a request leaves in the prefix cache when it finishes (its sequence
 * becomes a *finisher*) and while it runs (checkpoints): sched_finisher.c.
 *
 * Log-probabilities (dray_request_params.logprobs): a generated token's come
 * from the row its sampler drew from (dray_sampler_row), computed before the
 * emitter sees the id. Prompt tokens' (prompt_logprobs) need the logits of every
 * prompt position, not just the last: such a request asks build_batch for those
 * rows too, at most PROMPT_ROWS of them per step over all requests (its prefill
 * chunk is cut to fit; chunked prefill goes on as before), into a logits buffer
 * widened the first time one is admitted. A prefix-cache hit would skip
 * positions, so such a request attaches no more of a cached prefix than it has
 * already scored: nothing on its first admission (the cache is bypassed), and
 * after a preemption only what it scored before it (n_scored).
 *
 * Locking: one mutex guards the queues, every request's shared fields and the
 * stats. The loop drops it only around the forward pass, which touches nothing a
 * client can see.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dray/dray.h"
#include "chat_tokenize.h"
#include "constraint.h"
#include "emitter.h"
#include "engine_internal.h"
#include "error.h"
#include "gen_sampler.h"
#include "kv.h"
#include "log.h"
#include "logprobs.h"
#include "prefix_cache.h"
#include "sched_internal.h"
#include "sampler.h"
#include "tokenizer.h"

/* ------------------------------------------------------------ lists */

static void list_push(struct req_list *l, struct dray_request *r, bool front)
{
    r->prev = front ? NULL : l->tail;
    r->next = front ? l->head : NULL;
    if (front ? !l->head : !l->tail)
        l->head = l->tail = r;
    else if (front)
        l->head = l->head->prev = r;
    else
        l->tail = l->tail->next = r;
    l->n++;
}

static void list_remove(struct req_list *l, struct dray_request *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        l->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        l->tail = r->prev;
    r->prev = r->next = NULL;
    l->n--;
}

/* ------------------------------------------------------------ output */

/* dray_emit_fn of every request: runs on the loop thread with s->mu held. */
static int on_emit(void *user, const char *text, size_t len, int32_t id)
{
    struct dray_request *r = user;
    struct outbuf *o = &r->pend;
    if (!grow((void **)&o->text, &o->cap, o->len + len + 1, 1) ||
        (id >= 0 && !grow((void **)&o->ids, &o->cap_ids, o->n_ids + 1, sizeof(int32_t))))
        return DRAY_ENOMEM;
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = 0;
    if (id >= 0 && r->lp) {
        if (!grow((void **)&o->lps, &o->cap_lps, o->n_ids + 1, sizeof(*o->lps)))
            return DRAY_ENOMEM;
        o->lps[o->n_ids] = r->cur_lp;
    }
    if (id >= 0)
        o->ids[o->n_ids++] = id;
    return 0;
}

static void outbuf_free(struct outbuf *o)
{
    free(o->text);
    free(o->ids);
    free(o->lps);
    free(o->plps);
}

static void request_destroy(struct dray_request *r)
{
    dray_emitter_free(&r->em);
    dray_sampler_free(r->smp);
    dray_constraint_free(r->con);
    free(r->stop_ids);
    outbuf_free(&r->pend);
    outbuf_free(&r->given);
    pthread_cond_destroy(&r->cv);
    free(r->toks);
    free(r);
}

static void sched_free(struct dray_sched *s)
{
    dray_pcache_free(s->pc);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    free(s->b_sess);
    free(s->b_req);
    free(s->b_n);
    free(s->b_ids);
    free(s->b_rows);
    free(s->b_row_req);
    free(s->b_row_pos);
    free(s->logits);
    free(s->head);
    free(s);
}

/* ------------------------------------------------------------ the loop */

/* Give r's KV back; what it computed stays in the prefix cache when keep. */
static void release_kv(struct dray_sched *s, struct dray_request *r, bool keep)
{
    if (!r->sess)
        return;
    if (s->pc && keep)
        sched_cache_insert(s, r->salt, r->toks, dray_session_len(r->sess), r->sess);
    dray_session_free(r->sess);
    r->sess = NULL;
}

/* End r (mu held): free its KV, record why, wake its client. A request whose
 * client already let go is freed here. */
static void finish(struct dray_sched *s, struct dray_request *r, const char *why, int rc,
                   const char *error)
{
    if (r->state == REQ_DONE)
        return;
    list_remove(r->state == REQ_WAITING ? &s->waiting : &s->running, r);
    if (rc == 0)
        dray_emitter_flush(&r->em);
    if (rc != 0 || !sched_start_finisher(s, r))
        release_kv(s, r, rc == 0 || rc == DRAY_ECANCELED);
    r->state = REQ_DONE;
    r->done = true;
    r->finish = why;
    r->rc = rc;
    if (error)
        snprintf(r->error, sizeof(r->error), "%s", error);
    r->t_done = dray_now_s();
    s->st.completion_tokens += r->n_generated;
    if (rc == DRAY_ECANCELED)
        s->st.requests_cancelled++;
    else if (rc)
        s->st.requests_failed++;
    else
        s->st.requests_done++;
    pthread_cond_broadcast(&r->cv);
    if (r->client_gone)
        request_destroy(r);
}

static void reap_cancelled(struct dray_sched *s)
{
    struct req_list *lists[2] = {&s->waiting, &s->running};
    for (int l = 0; l < 2; l++)
        for (struct dray_request *r = lists[l]->head, *next; r; r = next) {
            next = r->next;
            if (r->cancel || s->stopping)
                finish(s, r, "cancelled", DRAY_ECANCELED, "cancelled");
            else if (r->lp_oom)
                finish(s, r, "error", DRAY_ENOMEM, "out of memory for the prompt's logprobs");
        }
}

/* Would the n tokens r still has to compute fit in the free blocks (after the
 * prefix cache gave back what it can), leaving one block of growth for every
 * running sequence? A lone sequence always fits: the KV plan guarantees one
 * sequence of the full context. */
static bool blocks_fit(struct dray_sched *s, size_t n)
{
    if (s->running.n == 0)
        return true;
    struct dray_kv *kv = s->e->kv;
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    uint32_t bs = dray_kv_block_size(kv);
    for (uint32_t g = 0; g < p->n_group; g++) {
        uint64_t need = (n + 1 + bs - 1) / bs + 1;
        if (p->group[g].window && need > p->group[g].seq_blocks_max)
            need = p->group[g].seq_blocks_max;
        need += s->running.n;
        if (dray_kv_make_free(kv, g, (uint32_t)need) < need)
            return false;
    }
    return true;
}

/* A sequence for r, starting from the longest prefix the cache holds. */
static bool start_sequence(struct dray_sched *s, struct dray_request *r)
{
    char err[256];
    if (dray_session_new(s->e, &r->sess, err, sizeof(err)))
        return false;
    uint32_t L = 0;
    if (s->pc) {
        double t0 = dray_now_s();
        /* prompt_logprobs: no more than what is scored (see the top) */
        size_t most = r->plp && r->n_scored < r->n_toks - 1 ? r->n_scored : r->n_toks - 1;
        L = most ? dray_pcache_attach(s->pc, r->salt, r->toks, most, r->sess->seq) : 0;
        s->cache_s += dray_now_s() - t0;
    }
    if ((L && dray_session_adopt(r->sess, r->toks, L)) || !blocks_fit(s, r->n_toks - L)) {
        dray_session_free(r->sess); /* gives the attached blocks back too */
        r->sess = NULL;
        return false;
    }
    r->ckpt_at = L;
    if (!r->t_admit) { /* first admission: what the client sees as cached */
        r->n_cached = L;
        s->st.prompt_tokens_cached += L;
    }
    return true;
}

/* Widen the logits buffer for prompt rows; false when there is no memory. */
static bool widen_logits(struct dray_sched *s)
{
    if (s->wide)
        return true;
    float *l = realloc(s->logits, (size_t)(s->max_seqs + PROMPT_ROWS) * s->e->info.n_vocab * sizeof(float));
    if (!l)
        return false;
    s->logits = l;
    s->wide = true;
    return true;
}

static void admit(struct dray_sched *s)
{
    while (s->waiting.head && s->running.n < s->max_seqs) {
        struct dray_request *r = s->waiting.head;
        if (r->plp && !widen_logits(s)) {
            finish(s, r, "error", DRAY_ENOMEM, "out of memory for the prompt's logits");
            continue;
        }
        if (!start_sequence(s, r))
            return;
        list_remove(&s->waiting, r);
        list_push(&s->running, r, false);
        r->state = REQ_RUNNING;
        r->admit_seq = ++s->admit_counter;
        if (!r->t_admit)
            r->t_admit = dray_now_s();
    }
}

/* Fill the batch arrays; returns the number of sequences in it. */
static uint32_t build_batch(struct dray_sched *s, uint32_t *n_tok, uint32_t *n_rows)
{
    uint32_t nb = 0, T = 0, nr = 0, budget = PROMPT_ROWS; /* prompt rows left */
    /* first the finishers (the head of s->finishing): up to their next stop, no logits */
    for (struct finisher *f = s->finishing; f && T < s->chunk; f = f->next) {
        size_t have = dray_session_len(f->sess), to = f->n;
        uint32_t take = (uint32_t)(to - have < s->chunk - T ? to - have : s->chunk - T);
        memcpy(s->b_ids + T, f->toks + have, take * sizeof(int32_t));
        s->b_sess[nb] = f->sess;
        s->b_req[nb] = NULL;
        s->b_n[nb++] = take;
        T += take;
    }
    for (int pass = 0; pass < 2; pass++)
        for (struct dray_request *r = s->running.head; r && T < s->chunk; r = r->next) {
            size_t have = dray_session_len(r->sess), pending = r->n_toks - have;
            if ((pass == 0) != (pending == 1))
                continue; /* pass 0: decoders; pass 1: prefills */
            uint32_t take = (uint32_t)(pending < s->chunk - T ? pending : s->chunk - T);
            /* prompt_logprobs: the rows q in [lo, hi) still to score, at most budget */
            size_t lo = have > r->n_scored ? have : r->n_scored, hi = r->plp ? r->n_prompt - 1 : 0;
            if (lo < hi && lo - have + budget < take)
                take = (uint32_t)(lo - have + budget);
            if (take == 0)
                continue; /* the budget is spent: its next chunk waits a step */
            memcpy(s->b_ids + T, r->toks + have, take * sizeof(int32_t));
            for (size_t q = lo; q < hi && q < have + take; q++, budget--) {
                s->b_rows[nr] = T + (uint32_t)(q - have);
                s->b_row_pos[nr] = (int64_t)q;
                s->b_row_req[nr++] = nb;
            }
            if (take == pending) {
                s->b_rows[nr] = T + take - 1;
                s->b_row_pos[nr] = -1;
                s->b_row_req[nr++] = nb;
            }
            s->b_sess[nb] = r->sess;
            s->b_req[nb] = r;
            s->b_n[nb++] = take;
            T += take;
        }
    *n_tok = T;
    *n_rows = nr;
    return nb;
}

/* The pool ran out: the newest running sequence gives its blocks back and waits
 * at the head of the queue to be recomputed. */
static void preempt_newest(struct dray_sched *s)
{
    struct dray_request *victim = s->running.head;
    for (struct dray_request *r = s->running.head; r; r = r->next)
        if (r->admit_seq > victim->admit_seq)
            victim = r;
    release_kv(s, victim, true); /* its recompute may start from the cache */
    list_remove(&s->running, victim);
    list_push(&s->waiting, victim, true);
    victim->state = REQ_WAITING;
    victim->n_preempted++;
    s->st.preemptions++;
    dray_debug("scheduler: preempted a request of %zu tokens (KV pool full)", victim->n_toks);
}

/* Score prompt token q + 1 of r from the raw logits row of position q (mu held).
 * Never ends r: no memory for it marks r for the next reap. */
static void score_prompt(struct dray_sched *s, struct dray_request *r, size_t q, const float *row)
{
    struct outbuf *o = &r->pend;
    if (q < r->n_scored)
        return; /* scored before a preemption */
    if (!grow((void **)&o->plps, &o->cap_plps, o->n_plps + 1, sizeof(*o->plps))) {
        r->lp_oom = true;
        return;
    }
    dray_logprobs_of(row, s->e->info.n_vocab, r->toks[q + 1], r->lp_top, &o->plps[o->n_plps++]);
    r->n_scored = q + 1;
    pthread_cond_broadcast(&r->cv);
}

/* A constrained r that cannot go on: a complete text stops, else it fails. */
static void end_constrained(struct dray_sched *s, struct dray_request *r, const char *why)
{
    if (dray_constraint_can_end(r->con))
        finish(s, r, "stop", 0, NULL);
    else
        finish(s, r, "error", DRAY_EINVAL, why);
}

/* Sample r's next token from its logits row (mu held; dropped around a grammar's draw). */
static void advance(struct dray_sched *s, struct dray_request *r, const float *row)
{
    const struct dray_engine *e = s->e;
    if (!r->t_first)
        r->t_first = dray_now_s();
    if (r->prompt_only) {
        finish(s, r, "length", 0, NULL);
        return;
    }
    bool dead = false;
    double t0 = dray_now_s();
    int32_t id;
    if (r->con) {
        /* a grammar step may take up to grammar_step_ms: without the lock, so that
         * clients can poll, cancel and read /metrics meanwhile (what it reads is
         * the loop thread's alone: the constraint, the sampler, the row, toks) */
        pthread_mutex_unlock(&s->mu);
        id = dray_constraint_sample(r->con, r->smp, row, e->info.n_vocab, r->toks, r->n_toks, r->lp,
                                    &dead);
        pthread_mutex_lock(&s->mu);
    } else {
        id = dray_sampler_sample(r->smp, row, e->info.n_vocab, r->toks, r->n_toks);
    }
    double dt = dray_now_s() - t0;
    s->sample_s += dt;
    s->st.sampled_tokens++;
    if (r->con) {
        s->grammar_s += dt;
        s->st.grammar_tokens++;
    }
    if (id < 0 && atomic_load(&r->stop)) { /* cancelled inside its grammar step */
        finish(s, r, "cancelled", DRAY_ECANCELED, "cancelled");
        return;
    }
    if (id < 0 && r->con && dray_constraint_error(r->con)) { /* this one only: the batch goes on */
        finish(s, r, "error", DRAY_ERANGE, dray_constraint_error(r->con));
        return;
    }
    if (id < 0) {
        finish(s, r, "error", id, id == DRAY_ENOMEM ? "out of memory for sampling" : "sampling failed");
        return;
    }
    if (dead) { /* the sampler banned all the grammar allows, or it allows nothing */
        end_constrained(s, r, "the grammar allows no token the sampler may draw next (logit_bias, "
                        "ignore_eos or min_tokens ban them all)");
        return;
    }
    if (r->lp) /* from the row the sampler drew from: penalized, before temperature */
        dray_logprobs_of(dray_sampler_row(r->smp), e->info.n_vocab, id, r->lp_top, &r->cur_lp);
    if (dray_tokenizer_is_eog(e->tok, id) || dray_gen_is_stop_id(r->stop_ids, r->n_stop_ids, id)) {
        r->feed = id == s->turn_end ? id : -1;
        finish(s, r, "stop", 0, NULL);
        return;
    }
    r->n_generated++;
    bool stopped = false;
    t0 = r->con ? dray_now_s() : 0;
    int refused = r->con ? dray_constraint_accept(r->con, id) : 0;
    if (r->con)
        s->grammar_s += dray_now_s() - t0;
    if (refused && atomic_load(&r->stop)) {
        finish(s, r, "cancelled", DRAY_ECANCELED, "cancelled");
        return;
    }
    if (refused && dray_constraint_error(r->con)) {
        finish(s, r, "error", DRAY_ERANGE, dray_constraint_error(r->con));
        return;
    }
    if (refused) {
        finish(s, r, "error", DRAY_EINVAL, "the grammar refused a token its mask allowed");
        return;
    }
    if (dray_emitter_token(&r->em, id, &stopped)) {
        finish(s, r, "error", DRAY_ENOMEM, "out of memory for the output");
        return;
    }
    pthread_cond_broadcast(&r->cv);
    if (stopped)
        finish(s, r, "stop", 0, NULL);
    else if (r->con && dray_constraint_must_end(r->con)) {
        r->feed = id; /* complete: nothing may follow; the next turn's prompt holds it */
        finish(s, r, "stop", 0, NULL);
    }
    else if ((r->max_tokens && r->n_generated >= r->max_tokens) || r->n_toks + 1 > e->info.context) {
        r->feed = id; /* the reply's text holds it: the next turn's prompt does too */
        finish(s, r, "length", 0, NULL);
    }
    else if (!grow((void **)&r->toks, &r->cap_toks, r->n_toks + 1, sizeof(int32_t)))
        finish(s, r, "error", DRAY_ENOMEM, "out of memory");
    else
        r->toks[r->n_toks++] = id;
}

static void note_kv_usage(struct dray_sched *s)
{
    const struct dray_kv_plan *p = dray_kv_get_plan(s->e->kv);
    uint64_t total = 0, free_blocks = 0;
    for (uint32_t g = 0; g < p->n_group; g++) {
        total += p->group[g].n_blocks;
        free_blocks += dray_kv_group_free_blocks(s->e->kv, g);
    }
    s->st.kv_blocks_total = total;
    s->st.kv_blocks_used = total - free_blocks;
    if (s->pc) {
        struct dray_pcache_stats c;
        dray_pcache_get_stats(s->pc, &c);
        s->st.cache_lookups = c.lookups;
        s->st.cache_lookup_tokens = c.lookup_tokens;
        s->st.cache_hit_tokens = c.hit_tokens;
        s->st.cache_entries = c.entries;
        s->st.cache_checkpoints = c.checkpoints;
        s->st.cache_blocks = c.blocks;
        s->st.cache_evictions = c.evictions;
        s->st.cache_host_bytes = c.host_bytes;
        s->st.cache_spills = c.spills;
        s->st.cache_restores = c.restores;
        s->st.cache_assembled = c.assembled;
        uint64_t copies;
        double cow_s;
        dray_kv_cow_stats(s->e->kv, &copies, &cow_s);
        s->st.cache_us = (uint64_t)((s->cache_s + cow_s) * 1e6);
        s->st.cache_cow_copies = copies;
    }
    s->st.finishing = s->n_finishing;
    s->st.grammar_us = (uint64_t)(s->grammar_s * 1e6);
    s->st.sample_us = (uint64_t)(s->sample_s * 1e6);
}

/* One step (mu held on entry and exit, dropped around the forward pass). */
static void step(struct dray_sched *s)
{
    char err[512];
    uint32_t T, n_rows, nb = build_batch(s, &T, &n_rows);
    pthread_mutex_unlock(&s->mu);
    int rc = dray_engine_step(s->b_sess, nb, s->b_n, s->b_ids, s->b_rows, n_rows, s->logits, err,
                              sizeof(err));
    pthread_mutex_lock(&s->mu);
    s->st.steps++;
    uint32_t n_fed = 0, fed_tokens = 0; /* finishers in this batch, tokens they fed */
    for (uint32_t i = 0; i < nb; i++)
        if (!s->b_req[i]) {
            n_fed++;
            fed_tokens += s->b_n[i];
        }
    if (rc == DRAY_ENOMEM && s->n_finishing) {
        sched_end_finishers(s, s->n_finishing, true); /* the pool is short: they give way, unfed */
    } else if (rc == DRAY_ENOMEM && s->running.n > 1) {
        preempt_newest(s);
    } else if (rc) {
        dray_error("scheduler: step of %u tokens failed: %s", T, err);
        sched_end_finishers(s, s->n_finishing, false);
        for (uint32_t i = 0; i < nb; i++)
            if (s->b_req[i])
                finish(s, s->b_req[i], "error", rc, err);
    } else {
        for (uint32_t i = 0; s->pc && s->ckpt_gap && i < nb; i++)
            if (s->b_req[i])
                sched_checkpoint_if_due(s, s->b_req[i]);
        s->st.cache_fed_tokens += fed_tokens;
        sched_finishers_fed(s, n_fed); /* those in this batch: the list's head */
        /* a request's prompt rows come before its row to sample (which may end it) */
        for (uint32_t i = 0; i < n_rows; i++) {
            const float *row = s->logits + (size_t)i * s->e->info.n_vocab;
            if (s->b_row_pos[i] >= 0)
                score_prompt(s, s->b_req[s->b_row_req[i]], (size_t)s->b_row_pos[i], row);
            else
                advance(s, s->b_req[s->b_row_req[i]], row);
        }
    }
    note_kv_usage(s);
}

static void *loop(void *arg)
{
    struct dray_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        reap_cancelled(s);
        note_kv_usage(s);
        if (s->stopping)
            break;
        if (!s->n_finishing)
            admit(s);
        if (!s->running.n && !s->n_finishing) {
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        step(s);
    }
    sched_end_finishers(s, s->n_finishing, false);
    note_kv_usage(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ------------------------------------------------------------ API */

int dray_sched_create(struct dray_engine *e, uint32_t max_waiting, struct dray_sched **out,
                      char *err, size_t errlen)
{
    struct dray_sched *s = calloc(1, sizeof(*s));
    *out = NULL;
    if (!s)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    s->e = e;
    s->max_seqs = e->info.max_seqs;
    s->chunk = e->chunk;
    s->max_waiting = max_waiting ? max_waiting : 256;
    s->st.max_seqs = s->max_seqs;
    s->st.max_waiting = s->max_waiting;
    const char *end = dray_chat_turn_end(&e->chat);
    s->turn_end = end ? dray_tokenizer_find(e->tok, end, strlen(end)) : -1;
    s->ckpt_gap = dray_kv_ckpt_gap(e->kv);
    char why[256];
    if (s->turn_end >= 0 &&
        dray_chat_next_user_head(e->tok, &e->chat, &s->head, &s->n_head, why, sizeof(why)))
        dray_debug("scheduler: chat replies are cached without the next user head: %s", why);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    s->b_sess = calloc(s->max_seqs, sizeof(*s->b_sess));
    s->b_req = calloc(s->max_seqs, sizeof(*s->b_req));
    s->b_n = calloc(s->max_seqs, sizeof(*s->b_n));
    s->b_rows = calloc(s->max_seqs + PROMPT_ROWS, sizeof(*s->b_rows));
    s->b_row_req = calloc(s->max_seqs + PROMPT_ROWS, sizeof(*s->b_row_req));
    s->b_row_pos = calloc(s->max_seqs + PROMPT_ROWS, sizeof(*s->b_row_pos));
    s->b_ids = calloc(s->chunk, sizeof(*s->b_ids));
    s->logits = malloc((size_t)s->max_seqs * e->info.n_vocab * sizeof(float));
    if (!s->b_sess || !s->b_req || !s->b_n || !s->b_rows || !s->b_row_req || !s->b_row_pos || !s->b_ids || !s->logits) {
        sched_free(s);
        return dray_fail(err, errlen, DRAY_ENOMEM, "scheduler: out of memory for %u sequences",
                         e->info.max_seqs);
    }
    if (e->cfg.prefix_cache && dray_pcache_create(e->kv, e->cfg.host_cache, &s->pc)) {
        sched_free(s);
        return dray_fail(err, errlen, DRAY_ENOMEM, "scheduler: out of memory for the prefix cache");
    }
    note_kv_usage(s);
    /* the scheduler's thread takes no process signals (see the CPU pool) */
    sigset_t all, old_mask;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old_mask);
    int created = pthread_create(&s->thread, NULL, loop, s);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (created) {
        sched_free(s);
        return dray_fail(err, errlen, DRAY_ENOMEM, "scheduler: cannot start its thread");
    }
    *out = s;
    return 0;
}

void dray_sched_destroy(struct dray_sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    s->destroyed = true;
    bool last = s->n_live == 0;
    pthread_mutex_unlock(&s->mu);
    if (last)
        sched_free(s);
}

void dray_sched_drain(struct dray_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
}

static int check_request(const struct dray_engine *e, const struct dray_request_params *p,
                         char *err, size_t errlen)
{
    if (!p->ids || p->n_ids == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "empty prompt");
    if (p->top_logprobs > DRAY_MAX_TOP_LOGPROBS)
        return dray_fail(err, errlen, DRAY_EINVAL, "top_logprobs %u, at most %d", p->top_logprobs,
                         DRAY_MAX_TOP_LOGPROBS);
    if (p->n_ids >= e->info.context)
        return dray_fail(err, errlen, DRAY_ERANGE,
                         "the prompt is %zu tokens but the context is %u tokens, which leaves no "
                         "room for a reply: shorten the prompt or raise 'context'",
                         p->n_ids, e->info.context);
    for (size_t i = 0; i < p->n_ids; i++)
        if (p->ids[i] < 0 || (uint32_t)p->ids[i] >= e->info.n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL,
                             "token id %d at %zu is outside the vocabulary (0..%u)", p->ids[i], i,
                             e->info.n_vocab - 1);
    return dray_gen_check_ids(&p->gen, e->info.n_vocab, err, errlen);
}

static int request_new(struct dray_sched *s, const struct dray_request_params *p,
                       struct dray_request **out, char *err, size_t errlen)
{
    const struct dray_gen_params *g = &p->gen;
    struct dray_request *r = calloc(1, sizeof(*r));
    if (!r)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    r->s = s;
    pthread_cond_init(&r->cv, NULL);
    int rc = dray_emitter_init(&r->em, s->e->tok, g->stop, g->n_stop, on_emit, r, err, errlen);
    if (rc) {
        r->em.piece = NULL;
        goto fail;
    }
    rc = dray_gen_sampler(g, s->e->tok, p->n_ids, &r->smp, err, errlen);
    if (!rc)
        rc = dray_constraint_new(s->e, g, &r->con, err, errlen);
    if (rc)
        goto fail;
    if (r->con)
        dray_constraint_watch(r->con, &r->stop);
    if (g->n_stop_ids) {
        if (!(r->stop_ids = malloc(sizeof(*r->stop_ids) * g->n_stop_ids))) {
            rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
            goto fail;
        }
        memcpy(r->stop_ids, g->stop_ids, sizeof(*r->stop_ids) * g->n_stop_ids);
        r->n_stop_ids = g->n_stop_ids;
    }
    if (!grow((void **)&r->toks, &r->cap_toks, p->n_ids + 1, sizeof(int32_t))) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for %zu tokens", p->n_ids);
        goto fail;
    }
    memcpy(r->toks, p->ids, p->n_ids * sizeof(int32_t));
    r->n_toks = r->n_prompt = p->n_ids;
    r->salt = dray_pcache_salt(p->cache_salt);
    r->max_tokens = g->max_tokens;
    r->feed = -1;
    r->chat = p->chat;
    r->lp = p->logprobs;
    r->lp_top = p->top_logprobs;
    r->plp = p->prompt_logprobs;
    r->prompt_only = p->prompt_only;
    *out = r;
    return 0;
fail:
    request_destroy(r);
    return rc;
}

int dray_sched_submit(struct dray_sched *s, const struct dray_request_params *p,
                      struct dray_request **out, char *err, size_t errlen)
{
    struct dray_request *r = NULL;
    *out = NULL;
    int rc = check_request(s->e, p, err, errlen);
    if (!rc)
        rc = request_new(s, p, &r, err, errlen);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->draining)
        rc = dray_fail(err, errlen, DRAY_ECANCELED, "the server is shutting down");
    /* admitted: max_seqs running and max_waiting beyond them, counted together so
     * a burst gets exactly that many whether or not the loop has moved the first
     * ones to running yet */
    else if (s->waiting.n + s->running.n >= s->max_waiting + s->max_seqs)
        rc = dray_fail(err, errlen, DRAY_EBUSY, "%u requests are running and %u waiting, the most "
                       "this server admits: try again later", s->running.n, s->waiting.n);
    if (!rc) {
        r->t_submit = dray_now_s();
        r->state = REQ_WAITING;
        list_push(&s->waiting, r, false);
        s->n_live++;
        s->st.prompt_tokens += r->n_prompt;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc)
        request_destroy(r);
    else
        *out = r;
    return rc;
}

static void fill_output(struct dray_request *r, struct dray_request_output *o)
{
    struct outbuf t = r->given;
    r->given = r->pend;
    r->pend = t;
    r->pend.len = r->pend.n_ids = r->pend.n_plps = 0;
    *o = (struct dray_request_output){
        .text = r->given.text ? r->given.text : "", .len = r->given.len, .ids = r->given.ids,
        .n_ids = r->given.n_ids, .logprobs = r->lp ? r->given.lps : NULL,
        .prompt_logprobs = r->given.plps, .n_prompt_logprobs = r->given.n_plps, .done = r->done, .rc = r->rc, .finish_reason = r->finish,
        .error = r->rc ? r->error : NULL, .n_prompt = (uint32_t)r->n_prompt,
        .n_cached = r->n_cached, .n_generated = r->n_generated, .n_preempted = r->n_preempted,
        .queue_s = r->t_admit ? r->t_admit - r->t_submit : 0,
        .ttft_s = r->t_first ? r->t_first - r->t_submit : 0,
        .total_s = r->t_done ? r->t_done - r->t_submit : 0,
    };
}

int dray_request_poll(struct dray_request *r, struct dray_request_output *out, int timeout_ms)
{
    struct dray_sched *s = r->s;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&s->mu);
    int got = 1;
    while (!r->done && !r->pend.len && !r->pend.n_ids && !r->pend.n_plps) {
        if (timeout_ms == 0 ||
            (timeout_ms > 0 && pthread_cond_timedwait(&r->cv, &s->mu, &until) == ETIMEDOUT)) {
            got = r->done || r->pend.len || r->pend.n_ids || r->pend.n_plps;
            break;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &s->mu);
    }
    if (got)
        fill_output(r, out);
    pthread_mutex_unlock(&s->mu);
    return got;
}

void dray_request_cancel(struct dray_request *r)
{
    struct dray_sched *s = r->s;
    atomic_store(&r->stop, true); /* a grammar step holding s->mu ends at its next check */
    pthread_mutex_lock(&s->mu);
    r->cancel = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

void dray_request_free(struct dray_request *r)
{
    if (!r)
        return;
    struct dray_sched *s = r->s;
    atomic_store(&r->stop, true);
    pthread_mutex_lock(&s->mu);
    bool now = r->state == REQ_DONE;
    if (!now) {
        r->cancel = r->client_gone = true; /* the loop frees it when it ends */
        pthread_cond_signal(&s->work);
    }
    bool last = --s->n_live == 0 && s->destroyed;
    pthread_mutex_unlock(&s->mu);
    if (now)
        request_destroy(r);
    if (last)
        sched_free(s);
}

void dray_sched_get_stats(struct dray_sched *s, struct dray_sched_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->waiting = s->waiting.n;
    st->running = s->running.n;
    pthread_mutex_unlock(&s->mu);
}
