/* A generation answered with one body: the n choices' outputs are collected
 * side by side (they run in the same scheduler steps), then written as one
 * completion with n choices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "logprobs_json.h"
#include "tools.h"

/* What one choice has produced so far. */
struct collected {
    struct dray_srv_buf text;
    struct dray_srv_lps lps;
    struct dray_request_output last;
    bool done;
};

/* Add output o of choice i to its collection; false when out of memory. */
static bool take(struct dray_srv_gen *g, uint32_t i, struct collected *k,
                 const struct dray_request_output *o)
{
    bool ok = !(o->len && dray_srv_buf_add(&k->text, o->text, o->len));
    ok = ok && !(o->n_prompt_logprobs &&
                 dray_srv_lps_add(&k->lps, o->prompt_logprobs, o->n_prompt_logprobs));
    ok = ok && !(o->logprobs && o->n_ids && dray_srv_lps_add(&k->lps, o->logprobs, o->n_ids));
    k->last = *o;
    if (o->done) {
        k->done = true;
        dray_srv_gen_observe(g, i, o);
        if (i == 0 && !g->prompt_passed)
            g->n_cached = o->n_cached;
    }
    return ok;
}

/* Wait until every choice is done. Returns whether the client went away (the
 * choices are then cancelled, and their outputs say so). */
static bool collect(struct dray_srv_call *c, struct dray_srv_gen *g, struct collected *k, bool *oom)
{
    bool gone = false;
    double checked = dray_srv_now();
    for (uint32_t i = 0, left = g->n; left;) {
        struct dray_request_output o;
        if (k[i].done) {
            i = (i + 1) % g->n;
            continue;
        }
        /* one choice waits while the others have nothing new; then the next */
        if (dray_request_poll(g->r[i], &o, g->n == 1 ? DRAY_SRV_POLL_MS : 10)) {
            *oom |= !take(g, i, &k[i], &o);
            left -= o.done;
        } else {
            i = (i + 1) % g->n;
        }
        /* output may come faster than the poll: look at the client on a clock */
        if (!gone && dray_srv_now() - checked >= DRAY_SRV_POLL_MS * 1e-3) {
            checked = dray_srv_now();
            if ((gone = dray_srv_client_gone(c->mc)))
                for (uint32_t j = 0; j < g->n; j++)
                    dray_request_cancel(g->r[j]);
        }
    }
    return gone;
}

/* Choice i's body: echo's text and the prompt's log-probabilities first. */
static bool build_choice(struct dray_srv_gen *g, uint32_t i, struct collected *k,
                         struct dray_srv_choice *ch)
{
    struct dray_srv_buf text = {0};
    struct dray_srv_lps lps = {0};
    bool ok = !(g->echo && dray_srv_buf_add(&text, g->echo, g->echo_len)) &&
              !(k->text.len && dray_srv_buf_add(&text, k->text.data, k->text.len)) &&
              !(g->plp.n && dray_srv_lps_add(&lps, g->plp.v, g->plp.n)) &&
              !(k->lps.n && dray_srv_lps_add(&lps, k->lps.v, k->lps.n));
    dray_srv_buf_free(&k->text);
    k->text = text;
    *ch = (struct dray_srv_choice){.index = i, .text = text.data ? text.data : "", .len = text.len,
                                   .finish_reason = k->last.finish_reason};
    char salt[64];
    dray_srv_gen_call_salt(g, i, salt, sizeof(salt));
    if (ok && g->tools && (ch->tool_calls = dray_srv_tool_calls_json(ch->text, ch->len, salt))) {
        ch->text = NULL; /* "content": null */
        ch->finish_reason = "tool_calls";
    }
    if (ok && g->logprobs) {
        ch->logprobs = g->id.kind == DRAY_SRV_CHAT
                           ? dray_srv_chat_logprobs_json(lps.v, lps.n, dray_srv_gen_piece, g->engine)
                           : dray_srv_text_logprobs_json(lps.v, lps.n, 0, NULL, dray_srv_gen_piece,
                                                         g->engine);
        ok = ch->logprobs != NULL;
    }
    free(lps.v);
    return ok;
}

enum MHD_Result dray_srv_gen_whole(struct dray_srv_call *c, struct dray_srv_gen *g)
{
    struct collected k[DRAY_SRV_MAX_N] = {0};
    struct dray_srv_choice ch[DRAY_SRV_MAX_N] = {0};
    uint32_t completion[DRAY_SRV_MAX_N] = {0};
    struct dray_srv_error e = {0};
    struct dray_srv_usage u;
    bool oom = false, bad = false;
    char *body = NULL;
    bool gone = collect(c, g, k, &oom);
    for (uint32_t i = 0; i < g->n; i++) {
        completion[i] = k[i].last.n_generated;
        bad = bad || (!gone && dray_srv_gen_ended_badly(&k[i].last, &e));
    }
    dray_srv_gen_usage(g, completion, &u);
    c->n_cached = u.cached;
    c->n_completion = u.completion;
    for (uint32_t i = 0; !gone && !bad && !oom && i < g->n; i++)
        oom = !build_choice(g, i, &k[i], &ch[i]);
    if (!gone && !bad && !oom)
        body = dray_srv_choices_json(&g->id, ch, g->n, &u);
    for (uint32_t i = 0; i < g->n; i++) {
        json_decref(ch[i].logprobs); /* left when a later choice failed */
        json_decref(ch[i].tool_calls);
        dray_srv_buf_free(&k[i].text);
        free(k[i].lps.v);
    }
    dray_srv_gen_free(g); /* the outputs' pointers die here */
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
