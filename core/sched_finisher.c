/* Finishers and checkpoints: what a request of the scheduler (scheduler.c)
 * leaves in the prefix cache.
 *
 * A request that ends on max_tokens, or on the stop token that the chat template
 * renders as the end of an assistant turn (Gemma's <end_of_turn>), has sampled a
 * token the next turn's prompt contains but never fed it. Its response is sent at
 * once; its sequence becomes a *finisher* that feeds that one token (no logits)
 * in the next step, beside the others' decoding, and then goes into the prefix
 * cache. A chat request (dray_request_params.chat) feeds in the same step what
 * the next turn's prompt has after the reply up to the new user message's text:
 * the turn end (when max_tokens cut the reply), the template's "\n" and the next
 * user turn's header (dray_chat_next_user_head). It goes into the cache once
 * before that step (the reply without its last token) and once after; a request
 * that continues the reply some other way still reuses it up to the divergence,
 * the window layers' blocks coming from those two checkpoints (prefix_cache.h).
 * Admission waits for the finishers (one step at most), so the next turn's
 * lookup sees the whole previous turn. A cancelled request, a stop string (the
 * template does not render it), or a preemption feeds nothing.
 *
 * A long sequence also leaves checkpoints while it runs: window layers recycle
 * their old blocks, and a later request that diverges inside the sequence can
 * reuse it up to the divergence only if checkpoints lie less than a window
 * apart around that point (prefix_cache.h). So after a step, a sequence that
 * the next step could carry more than `ckpt_gap` tokens past its last
 * checkpoint (or the prefix it was given) goes into the cache at its last
 * block boundary. Chat turns shorter than the window never need one.
 */
#include "sched_internal.h"

#include <string.h>

#include "engine_internal.h"
#include "kv.h"
#include "prefix_cache.h"

/* Put the first len tokens of sess (ids) into the prefix cache, timed. */
void sched_cache_insert(struct dray_sched *s, uint64_t salt, const int32_t *ids, size_t len,
                        struct dray_session *sess)
{
    double t0 = dray_now_s();
    dray_pcache_insert(s->pc, salt, ids, len, sess->seq);
    s->cache_s += dray_now_s() - t0;
}

/* Hand r's sequence to a finisher that feeds r->feed (and a chat's next user
 * head when the context has room for it); false (nothing changed) when there is
 * nothing to feed or no memory for it. */
bool sched_start_finisher(struct dray_sched *s, struct dray_request *r)
{
    size_t mid = r->n_toks + 1, n = mid;
    if (r->chat && s->n_head)
        n += (r->feed != s->turn_end) + s->n_head;
    if (n > s->e->info.context || !grow((void **)&r->toks, &r->cap_toks, n, sizeof(int32_t)))
        n = mid;
    if (!s->pc || !r->sess || r->feed < 0 || mid > s->e->info.context ||
        !grow((void **)&r->toks, &r->cap_toks, n, sizeof(int32_t)))
        return false;
    struct finisher *f = malloc(sizeof(*f));
    if (!f)
        return false;
    r->toks[r->n_toks] = r->feed;
    if (n > mid) {
        size_t at = mid;
        if (r->feed != s->turn_end)
            r->toks[at++] = s->turn_end; /* max_tokens cut the reply: the next prompt closes it */
        memcpy(r->toks + at, s->head, s->n_head * sizeof(int32_t));
        /* the checkpoint after the feed also serves a request that continues the
         * reply otherwise, unless the feed moves a window past a block it needs:
         * then the reply as it is now goes in too (the two serve it together) */
        if (dray_kv_window_moves(s->e->kv, (uint32_t)r->n_toks, (uint32_t)n))
            sched_cache_insert(s, r->salt, r->toks, r->n_toks, r->sess);
    }
    *f = (struct finisher){.next = s->finishing, .sess = r->sess, .toks = r->toks,
                           .n = n, .salt = r->salt};
    s->finishing = f;
    s->n_finishing++;
    r->sess = NULL;
    r->toks = NULL;
    r->n_toks = r->cap_toks = 0;
    return true;
}

/* Insert what f's KV holds into the cache. */
static void finisher_insert(struct dray_sched *s, const struct finisher *f)
{
    sched_cache_insert(s, f->salt, f->toks, dray_session_len(f->sess), f->sess);
}

/* After a step that fed the first n finishers: those that fed all they have go
 * into the cache and are freed; the others (a step shorter than their tokens)
 * stay at the head of the list, in the same order, for the next step. */
void sched_finishers_fed(struct dray_sched *s, uint32_t n)
{
    for (struct finisher **pf = &s->finishing, *f; n && (f = *pf); n--) {
        size_t len = dray_session_len(f->sess);
        if (len < f->n) {
            pf = &f->next;
            continue;
        }
        finisher_insert(s, f);
        *pf = f->next;
        dray_session_free(f->sess);
        free(f->toks);
        free(f);
        s->n_finishing--;
    }
}

/* Free the first n finishers; what each holds goes into the cache when keep (fed
 * or not: the cache takes the tokens that are in its KV). */
void sched_end_finishers(struct dray_sched *s, uint32_t n, bool keep)
{
    for (; n && s->finishing; n--) {
        struct finisher *f = s->finishing;
        s->finishing = f->next;
        if (keep)
            finisher_insert(s, f);
        dray_session_free(f->sess);
        free(f->toks);
        free(f);
        s->n_finishing--;
    }
}

/* After a step: checkpoint r at its last block boundary when the next step could
 * take it more than ckpt_gap tokens past the block of its last one. */
void sched_checkpoint_if_due(struct dray_sched *s, struct dray_request *r)
{
    size_t len = dray_session_len(r->sess), pending = r->n_toks - len;
    size_t bs = dray_kv_block_size(s->e->kv), base = r->ckpt_at / bs * bs, at = len / bs * bs;
    size_t next = pending ? (pending < s->chunk ? pending : s->chunk) : 1;
    if (at <= base || len + next - base <= s->ckpt_gap)
        return;
    sched_cache_insert(s, r->salt, r->toks, at, r->sess);
    r->ckpt_at = at;
}
