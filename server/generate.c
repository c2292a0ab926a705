/* The generation endpoints: a parsed request is tokenized, checked against the
 * limits and submitted to the scheduler, n times for n choices (after one pass
 * that prefills the prompt into the prefix cache, which the n then share); the
 * output is collected into one body (gen_whole.c) or streamed (gen_stream.c).
 * A client that goes away cancels its requests at the scheduler's next step. */
#include <arpa/inet.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate.h"
#include "policy.h"
#include "route.h"
#include "tools.h"

int dray_srv_lps_add(struct dray_srv_lps *l, const struct dray_token_logprob *v, size_t n)
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

void dray_srv_gen_call_salt(const struct dray_srv_gen *g, uint32_t i, char *out, size_t n)
{
    snprintf(out, n, "%s%u", strchr(g->id.id, '-') + 1, i);
}

size_t dray_srv_gen_piece(const void *engine, int32_t id, char *out, size_t cap)
{
    return dray_engine_token_bytes(engine, id, out, cap);
}

void dray_srv_gen_usage(const struct dray_srv_gen *g, const uint32_t *completion,
                        struct dray_srv_usage *u)
{
    *u = (struct dray_srv_usage){.prompt = g->n_prompt, .cached = g->n_cached};
    for (uint32_t i = 0; i < g->n; i++)
        u->completion += completion[i];
}

void dray_srv_gen_observe(const struct dray_srv_gen *g, uint32_t i, const struct dray_request_output *o)
{
    struct dray_request_output once = *o;
    if (i > 0 || g->prompt_passed) /* the prompt is counted once */
        once.n_prompt = once.n_cached = 0;
    dray_srv_metrics_observe(&g->srv->rep[g->replica].metrics, &once);
}

bool dray_srv_gen_ended_badly(const struct dray_request_output *o, struct dray_srv_error *e)
{
    if (o->rc == DRAY_ERANGE) { /* the client's grammar went over its step budget */
        dray_srv_fail(e, 400, "invalid_request_error", "grammar_budget_exceeded", NULL, "%s",
                      o->error ? o->error : "the grammar went over its step budget");
        return true;
    }
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

void dray_srv_gen_release(struct dray_srv_gen *g)
{
    for (uint32_t i = 0; i < g->n; i++)
        if (g->r[i]) {
            dray_srv_flight_remove(g->srv, &g->flight[i]);
            dray_request_free(g->r[i]); /* cancels it when still running */
            g->r[i] = NULL;
        }
}

void dray_srv_gen_free(struct dray_srv_gen *g)
{
    if (!g)
        return;
    dray_srv_gen_release(g);
    free(g->echo);
    free(g->plp.v);
    free(g);
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

/* The prompt's tokens (a prompt of token ids is taken as it is: no BOS is added). */
static int prompt_ids(const struct dray_engine *en, const struct dray_srv_request *q, int32_t **ids,
                      size_t *n, struct dray_srv_error *e)
{
    char why[512];
    int rc;
    if (q->prompt_ids) {
        if (!(*ids = malloc(q->n_prompt_ids * sizeof(**ids))))
            return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, q->prompt_ids, (*n = q->n_prompt_ids) * sizeof(**ids));
        return 0;
    }
    rc = q->kind == DRAY_SRV_CHAT
             ? dray_engine_chat_tokenize(en, q->msgs, q->n_msgs, true, ids, n, why, sizeof(why))
             : dray_engine_tokenize(en, q->prompt, true, false, ids, n, why, sizeof(why));
    if (rc)
        submit_error(rc == DRAY_ENOMEM ? rc : DRAY_EINVAL, why,
                     q->kind == DRAY_SRV_CHAT ? "messages" : "prompt", e);
    return rc ? -1 : 0;
}

/* echo: the prompt's text, as given or detokenized from its ids. */
static int echo_text(struct dray_srv_gen *g, const struct dray_srv_request *q, const int32_t *ids,
                     size_t n, struct dray_srv_error *e)
{
    char why[512];
    if (!q->echo)
        return 0;
    if (q->prompt_ids) {
        if (dray_engine_detokenize(g->engine, ids, n, &g->echo, &g->echo_len, why, sizeof(why)))
            return dray_srv_fail(e, 500, "server_error", NULL, NULL, "%s", why);
    } else if (!(g->echo = strdup(q->prompt))) {
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    } else {
        g->echo_len = strlen(g->echo);
    }
    struct dray_token_logprob first = {.id = ids[0], .logprob = NAN}; /* it has no logprob */
    if (g->score_prompt && dray_srv_lps_add(&g->plp, &first, 1))
        return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

static int submit_one(struct dray_srv_gen *g, const struct dray_request_params *p, uint32_t i,
                      struct dray_srv_error *e)
{
    char why[512];
    int rc = dray_sched_submit(g->srv->rep[g->replica].sched, p, &g->r[i], why, sizeof(why));
    if (rc) {
        g->r[i] = NULL;
        submit_error(rc, why, g->id.kind == DRAY_SRV_CHAT ? "messages" : "prompt", e);
        return -1;
    }
    g->flight[i].req = g->r[i];
    dray_srv_flight_add(g->srv, &g->flight[i]);
    return 0;
}

/* n > 1: prefill the prompt once (scoring it for echo), so that it is in the
 * prefix cache when the n choices start. 1 when the client went away. */
static int prompt_pass(struct dray_srv_call *c, struct dray_srv_gen *g,
                       struct dray_request_params p, struct dray_srv_error *e)
{
    p.prompt_only = true;
    p.logprobs = false;
    p.gen.max_tokens = 0;
    if (submit_one(g, &p, 0, e))
        return -1;
    struct dray_request_output o;
    bool oom = false;
    for (;;) {
        if (!dray_request_poll(g->r[0], &o, DRAY_SRV_POLL_MS)) {
            if (dray_srv_client_gone(c->mc))
                return 1; /* the caller releases r[0], which cancels it */
            continue;
        }
        oom |= o.n_prompt_logprobs && dray_srv_lps_add(&g->plp, o.prompt_logprobs, o.n_prompt_logprobs);
        if (o.done)
            break;
    }
    g->n_cached = o.n_cached;
    dray_srv_gen_observe(g, 0, &o); /* the prompt's tokens, counted here */
    g->prompt_passed = true;
    int bad = dray_srv_gen_ended_badly(&o, e);
    dray_srv_flight_remove(g->srv, &g->flight[0]);
    dray_request_free(g->r[0]);
    g->r[0] = NULL;
    if (oom && !bad)
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return bad || oom ? -1 : 0;
}

/* Tokenize, check the prompt's length, and submit the n choices to g's replica.
 * 1 when the client went away meanwhile. */
static int submit(struct dray_srv_call *c, struct dray_srv_gen *g, const struct dray_srv_request *q,
                  struct dray_srv_error *e)
{
    struct dray_srv *s = c->srv;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = prompt_ids(g->engine, q, &ids, &n, e);
    if (rc)
        return -1;
    g->n_prompt = (uint32_t)n;
    rc = dray_srv_check_prompt(n, s->cfg->max_prompt_tokens, s->context,
                               q->kind == DRAY_SRV_CHAT ? "messages" : "prompt", e);
    if (!rc)
        rc = echo_text(g, q, ids, n, e);
    struct dray_request_params p = {.ids = ids, .n_ids = n, .gen = q->gen, .cache_salt = q->cache_salt,
                                    .chat = q->kind == DRAY_SRV_CHAT, .logprobs = q->logprobs,
                                    .top_logprobs = q->top_logprobs,
                                    .prompt_logprobs = g->score_prompt,
                                    .prompt_only = q->zero_tokens != NULL};
    /* without a prefix cache the choices could not share the prompt's KV */
    if (!rc && g->n > 1 && s->cfg->prefix_cache && !p.prompt_only) {
        rc = prompt_pass(c, g, p, e);
        p.prompt_logprobs = false;
    }
    for (uint32_t i = 0; !rc && i < g->n; i++) {
        struct dray_request_params pi = p;
        if (q->gen.seed) /* choices of a seeded request differ, and the first is n = 1's */
            pi.gen.seed = q->gen.seed + i;
        rc = submit_one(g, &pi, i, e);
    }
    free(ids);
    return rc;
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
    if (atomic_load(&s->draining)) {
        dray_srv_fail(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return dray_srv_send_error(c, &e);
    }
    if (dray_srv_request_parse(kind, c->body.data ? c->body.data : "", c->body.len, s->cfg, &q, &e))
        return dray_srv_send_error(c, &e);
    c->replica = (int)pick(c, q.user);
    struct dray_srv_gen *g = calloc(1, sizeof(*g));
    int rc = -1;
    if (!g)
        dray_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
    else if (!dray_srv_check_model(&s->models, q.model, &e)) {
        *g = (struct dray_srv_gen){.srv = s, .replica = c->replica, .engine = s->rep[c->replica].engine,
                                   .n = q.n, .logprobs = q.logprobs, .include_usage = q.include_usage,
                                   .tools = q.tool_choice != DRAY_SRV_TOOLS_OFF,
                                   .score_prompt = q.echo && q.logprobs};
        ident_init(s, kind, &g->id);
        if (!dray_srv_request_check_vocab(&q, dray_engine_get_info(g->engine)->n_vocab, &e))
            rc = submit(c, g, &q, &e);
    }
    c->n_prompt = g ? g->n_prompt : 0;
    bool streaming = q.stream;
    dray_srv_request_free(&q); /* the scheduler copied the prompt and the stop strings */
    if (rc == 1) { /* the client left during the prompt pass */
        dray_srv_gen_free(g);
        return dray_srv_send(c, 499, "text/plain", NULL, 0, 0);
    }
    if (rc) {
        dray_srv_gen_free(g);
        return dray_srv_send_error(c, &e);
    }
    enum MHD_Result res = streaming ? dray_srv_gen_stream(c, g) : dray_srv_gen_whole(c, g);
    return res;
}
