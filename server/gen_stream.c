/* A generation answered with server-sent events. Each choice's chunks carry its
 * index: a chat choice starts with a chunk naming the role, an echoed prompt
 * comes as the choice's first text (with its log-probabilities once they are
 * all in), and each choice ends with a chunk giving its finish_reason. After
 * the last: the usage chunk (include_usage), then [DONE]. With tools, a reply
 * whose first byte opens a call is held back and streamed call by call, each
 * as one delta.tool_calls entry when its </tool_call> is in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "logprobs_json.h"
#include "tools.h"

enum reply { UNDECIDED, TEXT, CALLS }; /* with tools: what the reply turned out to be */

struct chan { /* one choice's side of the stream */
    bool role_pending;   /* chat: the role chunk is still to come */
    enum reply reply;    /* without tools: TEXT from the start */
    struct dray_srv_buf held; /* UNDECIDED or CALLS: text not streamed yet */
    size_t n_calls;      /* CALLS: calls streamed */
    bool echo_pending;   /* echo: the prompt's text is still to come */
    bool finished;       /* its last chunk is written */
    size_t offset;       /* text: the text_offset of its next token */
    struct dray_srv_lps plp; /* echo, n = 1: the prompt's log-probabilities as they come */
    struct dray_request_output last; /* its latest output (counts only: pointers die) */
};

struct stream {
    struct dray_srv_gen *g;
    struct MHD_Connection *mc;
    struct chan ch[DRAY_SRV_MAX_N];
    uint32_t next;       /* the choice to poll next */
    uint32_t left;       /* choices not finished */
    bool failed;         /* an error event was written */
    bool ended;          /* [DONE] written */
    struct dray_srv_buf out;
    size_t off;          /* bytes of out already handed to libmicrohttpd */
    char method[16], path[512];
    double t0;
};

/* Log-probabilities of lp[0..n) of choice i in its shape (NULL when none asked). */
static int lp_json(struct stream *st, struct chan *h, const struct dray_token_logprob *lp, size_t n,
                   json_t **out)
{
    const struct dray_srv_gen *g = st->g;
    *out = NULL;
    if (!g->logprobs || !n)
        return 0;
    *out = g->id.kind == DRAY_SRV_CHAT
               ? dray_srv_chat_logprobs_json(lp, n, dray_srv_gen_piece, g->engine)
               : dray_srv_text_logprobs_json(lp, n, h->offset, &h->offset, dray_srv_gen_piece,
                                             g->engine);
    return *out ? 0 : -1;
}

static int chunk_calls(struct stream *st, uint32_t i, const char *text, size_t len,
                       const char *finish, json_t *lp, json_t *calls)
{
    struct dray_srv_choice c = {.index = i, .role = st->ch[i].role_pending, .text = text, .len = len,
                                .finish_reason = finish, .logprobs = lp, .tool_calls = calls};
    st->ch[i].role_pending = false;
    return dray_srv_sse_choice(&st->out, &st->g->id, &c, st->g->include_usage);
}

static int chunk(struct stream *st, uint32_t i, const char *text, size_t len, const char *finish,
                 json_t *lp)
{
    return chunk_calls(st, i, text, len, finish, lp, NULL);
}

/* The complete calls in choice i's held text, one chunk each; what follows the
 * last stays held. */
static int stream_calls(struct stream *st, uint32_t i)
{
    struct chan *h = &st->ch[i];
    size_t end, lead = 0;
    while (lead < h->held.len && h->held.data[lead] == '\n') /* the separator of calls */
        lead++;
    memmove(h->held.data, h->held.data + lead, h->held.len - lead);
    h->held.len -= lead;
    while ((end = dray_srv_tool_call_end(h->held.data, h->held.len, 0))) {
        char salt[64];
        dray_srv_gen_call_salt(st->g, i, salt, sizeof(salt));
        json_t *calls = dray_srv_tool_calls_json(h->held.data, end, salt), *c;
        if (!calls)
            return -1;
        c = json_array_get(calls, 0);
        char id[80];
        snprintf(id, sizeof(id), "call_%s_%zu", salt, h->n_calls);
        json_object_set_new(c, "id", json_string(id));
        json_object_set_new(c, "index", json_integer((json_int_t)h->n_calls++));
        size_t skip = end;
        while (skip < h->held.len && h->held.data[skip] == '\n')
            skip++;
        memmove(h->held.data, h->held.data + skip, h->held.len - skip);
        h->held.len -= skip;
        if (chunk_calls(st, i, NULL, 0, NULL, NULL, calls))
            return -1;
    }
    return 0;
}

/* Choice i's new text: streamed, or held while it may be (or is) a call. */
static int add_text(struct stream *st, uint32_t i, const char *text, size_t len, json_t *lp)
{
    struct chan *h = &st->ch[i];
    if (h->reply == TEXT)
        return (len || lp) ? chunk(st, i, text, len, NULL, lp) : 0;
    if (dray_srv_buf_add(&h->held, text, len)) {
        json_decref(lp);
        return -1;
    }
    if (h->reply == UNDECIDED && h->held.len)
        h->reply = h->held.data[0] == '<' ? CALLS : TEXT;
    if (h->reply == TEXT) { /* a text reply: what was held goes out now */
        int rc = chunk(st, i, h->held.data, h->held.len, NULL, lp);
        h->held.len = 0;
        return rc;
    }
    /* a call's tokens' logprobs come in chunks of their own */
    if (lp && chunk_calls(st, i, NULL, 0, NULL, lp, NULL))
        return -1;
    return h->reply == CALLS ? stream_calls(st, i) : 0;
}

/* The echoed prompt of choice i: its text, with every prompt token's logprob. */
static int echo_chunk(struct stream *st, uint32_t i)
{
    struct chan *h = &st->ch[i];
    struct dray_srv_lps all = {0};
    json_t *lp = NULL;
    h->echo_pending = false;
    int rc = (st->g->plp.n && dray_srv_lps_add(&all, st->g->plp.v, st->g->plp.n)) ||
             (h->plp.n && dray_srv_lps_add(&all, h->plp.v, h->plp.n)) ||
             lp_json(st, h, all.v, all.n, &lp);
    free(all.v);
    return rc ? -1 : chunk(st, i, st->g->echo, st->g->echo_len, NULL, lp);
}

/* Choice i is done: its finishing chunk, or an error event that ends the stream. */
static int finish(struct stream *st, uint32_t i, const struct dray_request_output *o)
{
    struct dray_srv_error e;
    st->ch[i].finished = true;
    st->left--;
    dray_srv_gen_observe(st->g, i, o);
    if (i == 0 && !st->g->prompt_passed)
        st->g->n_cached = o->n_cached;
    if (dray_srv_gen_ended_badly(o, &e)) {
        st->failed = true;
        return dray_srv_sse_error(&st->out, &e);
    }
    struct chan *h = &st->ch[i];
    /* a call cut short (max_tokens) comes out as the text it is */
    if (h->reply == CALLS && stream_calls(st, i))
        return -1;
    if (h->held.len && chunk(st, i, h->held.data, h->held.len, NULL, NULL))
        return -1;
    bool calls = h->reply == CALLS && h->n_calls && !h->held.len && !strcmp(o->finish_reason, "stop");
    return chunk(st, i, NULL, 0, calls ? "tool_calls" : o->finish_reason, NULL);
}

/* What choice i's output o adds to the stream. */
static int add_output(struct stream *st, uint32_t i, const struct dray_request_output *o)
{
    struct chan *h = &st->ch[i];
    json_t *lp = NULL;
    h->last = *o;
    if (h->echo_pending) {
        if (o->n_prompt_logprobs && dray_srv_lps_add(&h->plp, o->prompt_logprobs, o->n_prompt_logprobs))
            return -1;
        /* n = 1: the prompt's scores come in before any generated token's */
        bool scoring = st->g->score_prompt && !st->g->prompt_passed;
        if (scoring && !o->n_ids && !o->done)
            return 0;
        if (echo_chunk(st, i))
            return -1;
    }
    if (lp_json(st, h, o->logprobs, o->logprobs ? o->n_ids : 0, &lp))
        return -1;
    /* a token may come with no text yet; with logprobs it still has its chunk */
    if (add_text(st, i, o->text, o->len, lp))
        return -1;
    return o->done ? finish(st, i, o) : 0;
}

/* Put the next events into st->out; -1 when the stream must end now. */
static int fill(struct stream *st)
{
    struct dray_srv_gen *g = st->g;
    if (st->failed || !st->left) {
        if (!st->failed && g->include_usage) {
            uint32_t completion[DRAY_SRV_MAX_N];
            struct dray_srv_usage u;
            for (uint32_t i = 0; i < g->n; i++)
                completion[i] = st->ch[i].last.n_generated;
            dray_srv_gen_usage(g, completion, &u);
            if (dray_srv_sse_usage(&st->out, &g->id, &u))
                return -1;
        }
        st->ended = true;
        return dray_srv_sse_done(&st->out) ? -1 : 0;
    }
    for (uint32_t i = 0; i < g->n; i++) /* every choice's role chunk first */
        if (st->ch[i].role_pending)
            return chunk(st, i, NULL, 0, NULL, NULL) ? -1 : 0;
    for (uint32_t tried = 0; tried < g->n; tried++) {
        uint32_t i = st->next;
        st->next = (st->next + 1) % g->n;
        struct dray_request_output o;
        if (st->ch[i].finished)
            continue;
        /* a lone choice waits; several look at each in turn and wait on the last */
        int wait = g->n == 1 ? DRAY_SRV_POLL_MS : tried + 1 == g->n ? 10 : 0;
        if (dray_request_poll(g->r[i], &o, wait))
            return add_output(st, i, &o) ? -1 : 0;
    }
    return dray_srv_client_gone(st->mc) ? -1 : 0;
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
        if (fill(st))
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
    struct dray_srv_gen *g = st->g;
    uint32_t completion = 0, cached = g->prompt_passed ? g->n_cached : st->ch[0].last.n_cached;
    for (uint32_t i = 0; i < g->n; i++) {
        completion += st->ch[i].last.n_generated;
        free(st->ch[i].plp.v);
        dray_srv_buf_free(&st->ch[i].held);
    }
    int status = st->ended ? 200 : 499;
    dray_srv_log(st->method, st->path, status, g->n_prompt, cached, completion,
                 (dray_srv_now() - st->t0) * 1e3, g->replica);
    /* counted once, with the status its log line gives (a stream the client left
     * is 499, though its 200 status line went out first) */
    dray_srv_metrics_count_status(&g->srv->metrics, status);
    dray_srv_gen_free(g); /* cancels the choices still running */
    dray_srv_buf_free(&st->out);
    free(st);
}

enum MHD_Result dray_srv_gen_stream(struct dray_srv_call *c, struct dray_srv_gen *g)
{
    struct stream *st = calloc(1, sizeof(*st));
    struct MHD_Response *resp = NULL;
    if (st)
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    if (!resp) {
        free(st);
        dray_srv_gen_free(g);
        return MHD_NO;
    }
    st->g = g;
    st->mc = c->mc;
    st->left = g->n;
    st->t0 = c->t0;
    for (uint32_t i = 0; i < g->n; i++)
        st->ch[i] = (struct chan){.role_pending = g->id.kind == DRAY_SRV_CHAT,
                                  .reply = g->tools ? UNDECIDED : TEXT,
                                  .echo_pending = g->echo != NULL,
                                  .last = {.n_prompt = g->n_prompt}};
    memcpy(st->method, c->method, sizeof(st->method));
    memcpy(st->path, c->path, sizeof(st->path));
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    dray_srv_add_replica_header(resp, c->replica);
    enum MHD_Result ok = MHD_queue_response(c->mc, 200, resp);
    MHD_destroy_response(resp); /* stream_free runs when libmicrohttpd lets go of it */
    c->status = 200;
    c->logged = true; /* stream_free logs and counts it */
    return ok;
}
