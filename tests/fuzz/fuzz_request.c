/* libFuzzer target: dray serve's request bodies (server/request.c, jansson) and
 * the error body it answers a refusal with (server/apierr.c). The first byte
 * picks the endpoint, modulo 4: /v1/chat/completions, /v1/completions,
 * /tokenize, /detokenize; the rest is the body, as the HTTP layer hands it
 * over (not NUL-terminated). A grammar in it (grammar, tools, response_format)
 * is compiled and its start state built, under the default limits.
 * Invariants beyond "no crash, no leak, no hang": a refusal is a 400 with a
 * message, and its error body is JSON that parses again; an accepted request
 * has what the generator needs (every message a role and content, a prompt, at
 * most max_completion_tokens and DRAY_SRV_MAX_STOP stop strings).
 * Build and run: ci/fuzz.sh request SECONDS. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "apierr.h"
#include "dray/dray.h"
#include "request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static struct dray_config cfg;
    static int ready;
    if (!ready) {
        dray_config_defaults(&cfg);
        cfg.max_completion_tokens = 256;
        cfg.max_messages = 64;
        ready = 1;
    }
    static const enum dray_srv_kind kinds[] = {DRAY_SRV_CHAT, DRAY_SRV_COMPLETION, DRAY_SRV_TOKENIZE,
                                               DRAY_SRV_DETOKENIZE};
    enum dray_srv_kind kind = kinds[data[0] % 4];
    /* a copy of exactly the body's bytes: a read past its end is ASan's to see */
    size_t len = size - 1;
    char *body = malloc(len ? len : 1);
    if (!body)
        return 0;
    memcpy(body, data + 1, len);
    struct dray_srv_request req;
    struct dray_srv_error e;
    memset(&e, 0, sizeof(e));
    if (dray_srv_request_parse(kind, body, len, &cfg, &req, &e)) {
        if (e.status != 400 || !e.message[0])
            abort(); /* a refusal is the client's fault and says why */
        char *json = dray_srv_error_json(&e);
        if (json) {
            json_error_t je;
            json_t *back = json_loads(json, 0, &je);
            if (!back || !json_is_object(json_object_get(back, "error")))
                abort(); /* the error body must be JSON a client can read */
            json_decref(back);
            free(json);
        }
        free(body);
        return 0;
    }
    if (kind == DRAY_SRV_TOKENIZE || kind == DRAY_SRV_DETOKENIZE) {
        /* parsed: nothing more a generator needs */
    } else if (kind == DRAY_SRV_CHAT) {
        if (!req.n_msgs || !req.msgs)
            abort();
        for (size_t i = 0; i < req.n_msgs; i++)
            if (!req.msgs[i].role || !req.msgs[i].content)
                abort();
    } else if (!req.prompt) {
        abort();
    }
    if (req.gen.max_tokens > cfg.max_completion_tokens || req.gen.n_stop > DRAY_SRV_MAX_STOP)
        abort();
    for (size_t i = 0; i < req.gen.n_stop; i++)
        if (!req.gen.stop[i] || !req.gen.stop[i][0])
            abort();
    dray_srv_request_free(&req);
    free(body);
    return 0;
}
