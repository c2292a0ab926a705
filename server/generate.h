/* server/generate.h — one generation request on its way through the server:
 * its n choices, each a scheduler request, and what its bodies add to their
 * text (echo, log-probabilities). generate.c submits; gen_whole.c answers with
 * one body, gen_stream.c with server-sent events. */
#ifndef DRAY_SERVER_GENERATE_H
#define DRAY_SERVER_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http.h"
#include "request.h"
#include "response.h"

#define DRAY_SRV_POLL_MS 100 /* how often a waiting handler checks that its client is still there */

/* Log-probabilities collected for one choice. */
struct dray_srv_lps {
    struct dray_token_logprob *v;
    size_t n, cap;
};
int dray_srv_lps_add(struct dray_srv_lps *l, const struct dray_token_logprob *v, size_t n);

struct dray_srv_gen {
    struct dray_srv *srv;
    int replica;
    const struct dray_engine *engine;
    struct dray_srv_ident id;
    uint32_t n;                      /* choices */
    struct dray_request *r[DRAY_SRV_MAX_N];
    struct dray_srv_flight flight[DRAY_SRV_MAX_N];
    bool logprobs;                   /* each token's log-probability is reported */
    bool include_usage;              /* stream_options.include_usage */
    bool tools;                      /* functions may be called: a reply that starts with
                                      * <tool_call> is calls (tools.h) */
    char *echo;                      /* echo: the prompt's text (malloc'd), else NULL */
    size_t echo_len;
    /* echo with logprobs: the prompt's tokens, the first with none (NaN); with
     * n > 1 the prompt pass scored them all here, with n = 1 the rest come in
     * the choice's own output */
    bool score_prompt;
    struct dray_srv_lps plp;
    bool prompt_passed;              /* a prompt pass ran: n_cached is its; else the
                                      * first choice's output says */
    uint32_t n_prompt, n_cached;     /* usage: the prompt once */
};

/* The submitted choices as the client sees them: the usage of the whole. */
void dray_srv_gen_usage(const struct dray_srv_gen *g, const uint32_t *completion,
                        struct dray_srv_usage *u);
/* Count output o of choice i in the replica's metrics (the prompt once). */
void dray_srv_gen_observe(const struct dray_srv_gen *g, uint32_t i,
                          const struct dray_request_output *o);
/* How a choice that ended without finishing normally is reported: true with e
 * filled (400 when its grammar went over the step budget, 500 for a failure,
 * 503 when the server cancelled it). */
bool dray_srv_gen_ended_badly(const struct dray_request_output *o, struct dray_srv_error *e);
/* The salt of choice i's tool-call ids ("call_<salt>_<n>"): the response id's
 * suffix and i, so ids differ across requests and choices. */
void dray_srv_gen_call_salt(const struct dray_srv_gen *g, uint32_t i, char *out, size_t n);
/* The bytes of a token, for the log-probabilities' JSON (engine is the user). */
size_t dray_srv_gen_piece(const void *engine, int32_t id, char *out, size_t cap);
/* Cancel and free every choice still held, and take the flights off the list. */
void dray_srv_gen_release(struct dray_srv_gen *g);
/* Release, and free g. */
void dray_srv_gen_free(struct dray_srv_gen *g);

/* Answer with one body (gen_whole.c) or a stream (gen_stream.c); both take g. */
enum MHD_Result dray_srv_gen_whole(struct dray_srv_call *c, struct dray_srv_gen *g);
enum MHD_Result dray_srv_gen_stream(struct dray_srv_call *c, struct dray_srv_gen *g);

#endif
