/* The generation endpoints: a parsed request is tokenized, checked against the
 * limits and submitted to the scheduler; its output is then either collected
 * into one body or streamed as server-sent events. A client that goes away
 * cancels its request, so its sequence stops at the scheduler's next step. */
#include <arpa/inet.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http.h"
#include "logprobs_json.h"
#include "policy.h"
#include "request.h"
#include "response.h"
#include "route.h"

#define POLL_MS 100 /* how often a waiting handler checks that its client is still there */

/* What a request asked for beyond text: logprobs and echo (logprobs.h). */
struct extras {
    const struct dray_engine *engine; /* for the tokens' bytes */
    bool logprobs;
    char *echo;          /* echo: the prompt's text (malloc'd), else NULL */
    size_t echo_len;
    int32_t first;       /* echo with logprobs: the prompt's first token (it has no logprob) */
    bool score_prompt;   /* echo with logprobs: the prompt's tokens come first */
};

/* Log-probabilities collected for one body. */
struct lp_list {
    struct dray_token_logprob *v;
    size_t n, cap;
};

static int lp_add(struct lp_list *l, const struct dray_token_logprob *v, size_t n)
{
    if (l->n + n > l->cap) {
        size_t cap = l->cap ? l->cap : 64;
        while (cap < l->n + n)
            cap *= 2;
        struct dray_token_logprob *p = realloc(l->v, cap * sizeof(*p));
        if (!p)
            return -1;
        l->v = p;
        l->cap = cap;
    }
    memcpy(l->v + l->n, v, n * sizeof(*v));
    l->n += n;
    return 0;
}

static size_t piece(const void *engine, int32_t id, char *out, size_t cap)
{
    return dray_engine_token_bytes(engine, id, out, cap);
}

static void ident_init(struct dray_srv *s, enum dray_srv_kind kind, struct dray_srv_ident *id)
{
    unsigned long n = atomic_fetch_add(&s->next_id, 1) + 1;
    id->kind = kind;
    snprintf(id->id, sizeof(id->id), "%s-%llx%08lx", kind == DRAY_SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)s->started, n);
    id->created = (int64_t)time(NULL);
    id->model = s->models.name[0];
}

/* The submit error as the client should see it. */
static void submit_error(int rc, const char *why, const char *param, struct dray_srv_error *e)
{
    if (rc == DRAY_EBUSY)
        dray_srv_fail(e, 429, "rate_limit_error", "queue_full", NULL, "%s", why);
    else if (rc == DRAY_ECANCELED)
        dray_srv_fail(e, 503, "server_error", "shutting_down", NULL, "%s", why);
    else if (rc == DRAY_ERANGE)
        dray_srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", param, "%s", why);
    else if (rc == DRAY_EINVAL)
        dray_srv_bad(e, NULL, "%s", why);
    else
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "%s", why);
}

static int oom_why(char *why, size_t n)
{
    snprintf(why, n, "out of memory");
    return DRAY_ENOMEM;
}

/* Tokenize (a prompt of token ids is taken as it is), check the prompt's length
 * and submit to replica rep; x gets what echo needs. */
static int submit(struct dray_srv *s, struct dray_srv_replica *rep, const struct dray_srv_request *q,
                  struct dray_request **out, uint32_t *n_prompt, struct extras *x,
                  struct dray_srv_error *e)
{
    char why[512];
    int32_t *ids = NULL;
    size_t n = 0;
    const char *param = q->kind == DRAY_SRV_CHAT ? "messages" : "prompt";
    int rc = 0;
    if (q->prompt_ids) { /* token ids are taken as they are: no BOS is added */
        if (!(ids = malloc(q->n_prompt_ids * sizeof(*ids))))
            rc = oom_why(why, sizeof(why));
        else
            memcpy(ids, q->prompt_ids, (n = q->n_prompt_ids) * sizeof(*ids));
    } else {
        rc = q->kind == DRAY_SRV_CHAT
                 ? dray_engine_chat_tokenize(rep->engine, q->msgs, q->n_msgs, true, &ids, &n, why, sizeof(why))
                 : dray_engine_tokenize(rep->engine, q->prompt, true, false, &ids, &n, why, sizeof(why));
    }
    if (rc) {
        submit_error(rc == DRAY_ENOMEM ? rc : DRAY_EINVAL, why, param, e);
        goto out;
    }
    *n_prompt = (uint32_t)n;
    if ((rc = dray_srv_check_prompt(n, s->cfg->max_prompt_tokens, s->context, param, e)))
        goto out;
    struct dray_request_params p = {.ids = ids, .n_ids = n, .gen = q->gen, .cache_salt = q->cache_salt,
                                    .chat = q->kind == DRAY_SRV_CHAT, .logprobs = q->logprobs,
                                    .top_logprobs = q->top_logprobs,
                                    .prompt_logprobs = q->echo && q->logprobs,
                                    .prompt_only = q->zero_tokens != NULL};
    x->first = ids[0];
    if (q->echo && !q->prompt_ids && !(x->echo = strdup(q->prompt)))
        rc = oom_why(why, sizeof(why));
    else if (q->echo && q->prompt_ids)
        rc = dray_engine_detokenize(rep->engine, ids, n, &x->echo, &x->echo_len, why, sizeof(why));
    if (x->echo && !q->prompt_ids)
        x->echo_len = strlen(x->echo);
    if (rc) {
        submit_error(rc, why, param, e);
        goto out;
    }
    rc = dray_sched_submit(rep->sched, &p, out, why, sizeof(why));
    if (rc)
        submit_error(rc, why, param, e);
out:
    free(ids);
    return rc ? -1 : 0;
}

static void usage_of(const struct dray_request_output *o, struct dray_srv_usage *u)
{
    *u = (struct dray_srv_usage){.prompt = o->n_prompt, .completion = o->n_generated, .cached = o->n_cached};
}

/* How a request that ended without finishing normally is reported. */
static bool ended_badly(const struct dray_request_output *o, struct dray_srv_error *e)
{
    if (o->rc && o->rc != DRAY_ECANCELED) {
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "generation failed: %s",
                      o->error ? o->error : dray_strerror(o->rc));
        return true;
    }
    if (o->rc || !strcmp(o->finish_reason, "cancelled")) {
        dray_srv_fail(e, 503, "server_error", "shutting_down", NULL,
                      "the request was cancelled: the server is shutting down");
        return true;
    }
    return false;
}

/* ------------------------------------------------------------ one body */

/* Wait for the whole output of r into text; *o is its last output. Returns
 * whether the client went away (r is then cancelled, and o says so). */
static bool collect(struct dray_srv_call *c, struct dray_request *r, struct dray_srv_buf *text,
                    struct lp_list *lps, struct dray_request_output *o, bool *oom)
{
    bool gone = false;
    double checked = dray_srv_now();
    for (;;) {
        bool got = dray_request_poll(r, o, POLL_MS);
        /* output may come faster than POLL_MS: look at the client on a clock */
        if (!gone && dray_srv_now() - checked >= POLL_MS * 1e-3) {
            checked = dray_srv_now();
            if ((gone = dray_srv_client_gone(c->mc)))
                dray_request_cancel(r);
        }
        if (!got)
            continue;
        *oom |= o->len && dray_srv_buf_add(text, o->text, o->len) != 0;
        *oom |= o->n_prompt_logprobs && lp_add(lps, o->prompt_logprobs, o->n_prompt_logprobs);
        *oom |= o->logprobs && o->n_ids && lp_add(lps, o->logprobs, o->n_ids);
        if (o->done)
            return gone;
    }
}

/* The choice's "logprobs" of a whole body (NULL when none was asked). */
static json_t *whole_logprobs(const struct extras *x, const struct dray_srv_ident *id,
                              const struct lp_list *l, bool *oom)
{
    if (!x->logprobs)
        return NULL;
    json_t *j = id->kind == DRAY_SRV_CHAT
                    ? dray_srv_chat_logprobs_json(l->v, l->n, piece, x->engine)
                    : dray_srv_text_logprobs_json(l->v, l->n, 0, NULL, piece, x->engine);
    *oom |= !j;
    return j;
}

static enum MHD_Result whole(struct dray_srv_call *c, struct dray_request *r, const struct dray_srv_ident *id,
                             const struct extras *x)
{
    struct dray_srv *s = c->srv;
    struct dray_srv_flight flight = {.req = r};
    struct dray_srv_buf text = {0};
    struct lp_list lps = {0};
    struct dray_request_output o = {0};
    struct dray_srv_error e = {0};
    struct dray_srv_usage u;
    bool oom = false;
    char *body = NULL;
    dray_srv_flight_add(s, &flight);
    /* echo: the prompt's text first; with logprobs its first token has none */
    struct dray_token_logprob first = {.id = x->first, .logprob = NAN};
    oom |= x->echo && dray_srv_buf_add(&text, x->echo, x->echo_len);
    oom |= x->score_prompt && lp_add(&lps, &first, 1);
    bool gone = collect(c, r, &text, &lps, &o, &oom);
    dray_srv_flight_remove(s, &flight);
    dray_srv_metrics_observe(&s->rep[c->replica].metrics, &o);
    c->n_cached = o.n_cached;
    c->n_completion = o.n_generated;
    usage_of(&o, &u);
    if (!gone && !ended_badly(&o, &e) && !oom) {
        json_t *lj = whole_logprobs(x, id, &lps, &oom);
        if (!oom)
            body = dray_srv_completion_json_lp(id, text.data ? text.data : "", text.len,
                                               o.finish_reason, &u, lj);
    }
    dray_request_free(r); /* o's pointers die here */
    dray_srv_buf_free(&text);
    free(lps.v);
    if (gone) {
        /* nobody to answer: log it as nginx does (499, client closed request). An
         * empty answer is still queued, for libmicrohttpd to drop on the closed
         * socket: MHD_NO would make it log an "internal error" */
        return dray_srv_send(c, 499, "text/plain", NULL, 0, 0);
    }
    if (!body && !e.status)
        dray_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory, or output that is not UTF-8");
    return body ? dray_srv_send(c, 200, "application/json", body, strlen(body), 0) : dray_srv_send_error(c, &e);
}

/* ------------------------------------------------------------ stream */

struct stream {
    struct dray_srv *srv;
    struct MHD_Connection *mc;
    struct dray_request *req;
    struct dray_srv_flight flight;
    struct dray_srv_ident id;
    int replica;         /* the replica generating it */
    bool include_usage;
    struct extras x;     /* logprobs (a stream has no echo) */
    size_t offset;       /* text: the text_offset of the next token */
    bool role_pending;   /* chat: the first chunk names the role */
    bool finished;       /* the last chunk is written; [DONE] comes next */
    bool ended;          /* [DONE] written */
    struct dray_srv_buf out;
    size_t off;          /* bytes of out already handed to libmicrohttpd */
    char method[16], path[512];
    double t0;
    struct dray_request_output last; /* the latest output polled */
};

/* The request is done: the finishing chunk (or an error event), then usage. */
static int stream_finish(struct stream *st, const struct dray_request_output *o)
{
    struct dray_srv_error e;
    struct dray_srv_usage u;
    int rc;
    st->finished = true;
    dray_srv_metrics_observe(&st->srv->rep[st->replica].metrics, o);
    if (ended_badly(o, &e))
        return dray_srv_sse_error(&st->out, &e);
    rc = dray_srv_sse_chunk(&st->out, &st->id, false, NULL, 0, o->finish_reason, st->include_usage);
    usage_of(o, &u);
    if (!rc && st->include_usage)
        rc = dray_srv_sse_usage(&st->out, &st->id, &u);
    return rc;
}

/* Put the next events into st->out; -1 when the stream must end now. */
static int stream_fill(struct stream *st)
{
    struct dray_request_output o;
    if (st->role_pending) {
        st->role_pending = false;
        return dray_srv_sse_chunk(&st->out, &st->id, true, NULL, 0, NULL, st->include_usage) ? -1 : 0;
    }
    if (st->finished) {
        st->ended = true;
        return dray_srv_sse_done(&st->out) ? -1 : 0;
    }
    if (!dray_request_poll(st->req, &o, POLL_MS))
        return dray_srv_client_gone(st->mc) ? -1 : 0;
    st->last = o; /* its counts, for the log line (its pointers die at the next poll) */
    /* with logprobs each chunk carries its tokens' (one may come with no text yet) */
    json_t *lj = NULL;
    if (st->x.logprobs && o.logprobs && o.n_ids) {
        lj = st->id.kind == DRAY_SRV_CHAT
                 ? dray_srv_chat_logprobs_json(o.logprobs, o.n_ids, piece, st->x.engine)
                 : dray_srv_text_logprobs_json(o.logprobs, o.n_ids, st->offset, &st->offset, piece,
                                               st->x.engine);
        if (!lj)
            return -1;
    }
    if ((o.len || lj) &&
        dray_srv_sse_chunk_lp(&st->out, &st->id, false, o.text, o.len, NULL, st->include_usage, lj))
        return -1;
    if (o.done)
        return stream_finish(st, &o) ? -1 : 0;
    return 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *st = cls;
    while (st->off == st->out.len) {
        dray_srv_buf_reset(&st->out);
        st->off = 0;
        if (st->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (stream_fill(st))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->out.len - st->off < max ? st->out.len - st->off : max;
    memcpy(buf, st->out.data + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

/* libmicrohttpd is done with the response: the stream ended, or the client left. */
static void stream_free(void *cls)
{
    struct stream *st = cls;
    if (!st->finished)
        dray_request_cancel(st->req);
    dray_srv_flight_remove(st->srv, &st->flight);
    dray_request_free(st->req);
    dray_srv_log(st->method, st->path, st->ended ? 200 : 499, st->last.n_prompt, st->last.n_cached,
                 st->last.n_generated, (dray_srv_now() - st->t0) * 1e3, st->replica);
    /* counted once, with the status its log line gives (a stream the client left
     * is 499, though its 200 status line went out first) */
    dray_srv_metrics_count_status(&st->srv->metrics, st->ended ? 200 : 499);
    dray_srv_buf_free(&st->out);
    free(st);
}

static enum MHD_Result stream(struct dray_srv_call *c, struct dray_request *r,
                              const struct dray_srv_ident *id, bool include_usage, uint32_t n_prompt,
                              const struct extras *x)
{
    struct stream *st = calloc(1, sizeof(*st));
    struct MHD_Response *resp = NULL;
    if (st)
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    if (!resp) {
        free(st);
        dray_request_free(r);
        return MHD_NO;
    }
    *st = (struct stream){.srv = c->srv, .mc = c->mc, .req = r, .flight = {.req = r}, .id = *id,
                          .replica = c->replica, .include_usage = include_usage, .role_pending = id->kind == DRAY_SRV_CHAT,
                          .t0 = c->t0, .last = {.n_prompt = n_prompt}, .x = *x};
    memcpy(st->method, c->method, sizeof(st->method));
    memcpy(st->path, c->path, sizeof(st->path));
    dray_srv_flight_add(c->srv, &st->flight);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    dray_srv_add_replica_header(resp, c->replica);
    enum MHD_Result ok = MHD_queue_response(c->mc, 200, resp);
    MHD_destroy_response(resp); /* stream_free runs when libmicrohttpd lets go of it */
    c->status = 200;
    c->logged = true; /* stream_free logs and counts it */
    return ok;
}

/* The replica that holds this conversation: see route.h for the key. */
static uint32_t pick(struct dray_srv_call *c, const char *user)
{
    struct dray_srv *s = c->srv;
    if (s->n_rep == 1)
        return 0;
    const char *session = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "X-Session-Id");
    char addr[INET6_ADDRSTRLEN] = "";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr)
        getnameinfo(ci->client_addr, ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                            : sizeof(struct sockaddr_in),
                    addr, sizeof(addr), NULL, 0, NI_NUMERICHOST);
    const char *key;
    dray_srv_route_key(session, user, addr, &key);
    return dray_srv_pick_replica(key, strlen(key), s->n_rep);
}

enum MHD_Result dray_srv_generate(struct dray_srv_call *c, int kind)
{
    struct dray_srv *s = c->srv;
    struct dray_srv_request q;
    struct dray_srv_error e;
    struct dray_srv_ident id;
    struct dray_request *r = NULL;
    struct extras x = {0};
    if (atomic_load(&s->draining)) {
        dray_srv_fail(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return dray_srv_send_error(c, &e);
    }
    if (dray_srv_request_parse(kind, c->body.data ? c->body.data : "", c->body.len, s->cfg, &q, &e))
        return dray_srv_send_error(c, &e);
    c->replica = (int)pick(c, q.user);
    x = (struct extras){.engine = s->rep[c->replica].engine, .logprobs = q.logprobs,
                        .score_prompt = q.echo && q.logprobs};
    if (dray_srv_check_model(&s->models, q.model, &e) ||
        dray_srv_request_check_vocab(&q, dray_engine_get_info(s->rep[c->replica].engine)->n_vocab, &e) ||
        submit(s, &s->rep[c->replica], &q, &r, &c->n_prompt, &x, &e)) {
        dray_srv_request_free(&q);
        free(x.echo);
        return dray_srv_send_error(c, &e);
    }
    bool streaming = q.stream, include_usage = q.include_usage;
    dray_srv_request_free(&q); /* the scheduler copied the prompt and the stop strings */
    ident_init(s, kind, &id);
    enum MHD_Result res = streaming ? stream(c, r, &id, include_usage, c->n_prompt, &x)
                                    : whole(c, r, &id, &x);
    free(x.echo);
    return res;
}
