/* What the scheduler's files share (scheduler.c: requests, admission, batches,
 * the loop and the API; sched_finisher.c: finishers and checkpoints, what a
 * request leaves in the prefix cache): the request and scheduler state. The
 * scheduler's files only. */
#ifndef DRAY_CORE_SCHED_INTERNAL_H
#define DRAY_CORE_SCHED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "dray/dray.h"
#include "emitter.h"

enum req_state { REQ_WAITING, REQ_RUNNING, REQ_DONE };

#define PROMPT_ROWS 32 /* rows of prompt logits per step, for prompt_logprobs */

/* Output produced by the loop and not yet handed to the client. */
struct outbuf {
    char *text;
    size_t len, cap;
    int32_t *ids;
    size_t n_ids, cap_ids;
    struct dray_token_logprob *lps;  /* [n_ids] when the request wants logprobs */
    size_t cap_lps;
    struct dray_token_logprob *plps; /* [n_plps] prompt tokens' */
    size_t n_plps, cap_plps;
};

struct dray_request {
    struct dray_sched *s;
    struct dray_request *prev, *next; /* in s->waiting or s->running */
    enum req_state state;

    /* loop thread only */
    int32_t *toks;
    size_t n_toks, cap_toks, n_prompt;
    uint32_t max_tokens;             /* 0 = until the context is full */
    int32_t *stop_ids;               /* [n_stop_ids] end generation like end-of-generation */
    size_t n_stop_ids;
    struct dray_session *sess;       /* NULL while waiting */
    struct dray_sampler *smp;
    struct dray_constraint *con;     /* the grammar its text follows; NULL = free */
    struct dray_emitter em;
    uint64_t admit_seq;              /* admission order: the newest is preempted first */
    uint64_t salt;                   /* prefix-cache tenant */
    int32_t feed;                    /* sampled when it finished, to feed after; -1: none */
    bool chat;                       /* a rendered conversation (dray_request_params.chat) */
    size_t ckpt_at;                  /* length at its last checkpoint or cache hit */
    bool lp, plp, prompt_only;       /* dray_request_params.logprobs, prompt_logprobs, prompt_only */
    uint32_t lp_top;                 /* top_logprobs */
    struct dray_token_logprob cur_lp; /* the token being emitted's, for on_emit */
    size_t n_scored;                 /* plp: prompt rows 0..n_scored scored (tokens 1..n_scored) */
    bool lp_oom;                     /* no memory for a prompt score: ended at the next reap */

    /* shared, under s->mu */
    pthread_cond_t cv;
    struct outbuf pend, given;
    bool done, cancel, client_gone;
    atomic_bool stop;                /* cancel, set before taking s->mu: a grammar step
                                      * in progress sees it (dray_constraint_watch) */
    int rc;
    char error[256];
    const char *finish;
    uint32_t n_generated, n_cached, n_preempted;
    double t_submit, t_admit, t_first, t_done;
};

/* A finished request's sequence feeding what it sampled last and, for a chat,
 * the next user turn's head (loop thread only; the request itself may be freed by
 * its client meanwhile). toks[0..n) is what the KV holds once all is fed. */
struct finisher {
    struct finisher *next;
    struct dray_session *sess;
    int32_t *toks;
    size_t n;
    uint64_t salt;
};

struct req_list {
    struct dray_request *head, *tail;
    uint32_t n;
};

struct dray_sched {
    struct dray_engine *e;
    struct dray_pcache *pc;          /* NULL when prefix_cache is off */
    double cache_s;                  /* seconds spent in pc's lookup and insert */
    double sample_s;                 /* seconds spent drawing tokens */
    double grammar_s;                /* of them under a grammar, with the grammar's advances */
    pthread_mutex_t mu;
    pthread_cond_t work;             /* the loop sleeps here when idle */
    pthread_t thread;
    struct req_list waiting, running;
    struct finisher *finishing;      /* fed in the next step, then inserted in pc */
    uint32_t n_finishing;
    int32_t turn_end;                /* the chat template's end-of-turn token, or -1 */
    int32_t *head;                   /* [n_head] the next user turn's head after turn_end */
    size_t n_head;                   /* 0: a chat feeds only what it sampled */
    uint32_t ckpt_gap;               /* most tokens between two checkpoints that still
                                      * serve everything between them; 0: no window */
    bool stopping, draining, destroyed;
    uint32_t n_live;                 /* requests not yet freed by their clients */
    uint32_t max_waiting, max_seqs, chunk;
    uint64_t admit_counter;
    struct dray_sched_stats st;

    /* one step's batch (loop thread only) */
    struct dray_session **b_sess;    /* [max_seqs]: requests first, then finishers */
    struct dray_request **b_req;     /* [max_seqs] */
    uint32_t *b_n;                   /* [max_seqs] tokens each */
    int32_t *b_ids;                  /* [chunk] */
    uint32_t *b_rows, *b_row_req;    /* [max_seqs + PROMPT_ROWS] logit rows and whose they are */
    int64_t *b_row_pos;              /* [max_seqs + PROMPT_ROWS] the prompt position a row scores
                                      * the next token of; -1: the row to sample from */
    float *logits;                   /* [max_seqs][n_vocab], + PROMPT_ROWS rows when wide */
    bool wide;                       /* logits has the PROMPT_ROWS rows (a plp request came) */
};

static inline bool grow(void **p, size_t *cap, size_t need, size_t elt)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *n = realloc(*p, c * elt);
    if (!n)
        return false;
    *p = n;
    *cap = c;
    return true;
}

/* sched_finisher.c */
/* Put the first len tokens of sess (ids) into the prefix cache, timed. */
void sched_cache_insert(struct dray_sched *s, uint64_t salt, const int32_t *ids, size_t len,
                        struct dray_session *sess);
/* Hand r's sequence to a finisher; false (nothing changed) when it has nothing
 * to feed or there is no memory for it. */
bool sched_start_finisher(struct dray_sched *s, struct dray_request *r);
/* After a step that fed the first n finishers. */
void sched_finishers_fed(struct dray_sched *s, uint32_t n);
/* Free the first n finishers, into the cache first when keep. */
void sched_end_finishers(struct dray_sched *s, uint32_t n, bool keep);
/* After a step: checkpoint r when it is due. */
void sched_checkpoint_if_due(struct dray_sched *s, struct dray_request *r);

#endif
