/* vLLM's POST /tokenize and POST /detokenize: the model's tokenizer without a
 * generation. A prompt is tokenized as /v1/completions would tokenize it, and
 * messages as /v1/chat/completions renders them, so a client can count the
 * tokens a request will cost. Any replica's engine will do: they all serve one
 * model, and tokenizing does not touch the scheduler. */
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "request.h"
#include "response.h"

static char *tokenize(struct dray_srv *s, const struct dray_engine *en, const struct dray_srv_request *q,
                      struct dray_srv_error *e)
{
    char why[512];
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = q->prompt ? dray_engine_tokenize(en, q->prompt, q->add_special_tokens, false, &ids, &n, why,
                                              sizeof(why))
                       : dray_engine_chat_tokenize(en, q->msgs, q->n_msgs, q->add_generation_prompt, &ids,
                                                   &n, why, sizeof(why));
    char *body = NULL;
    if (rc == DRAY_ENOMEM)
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "%s", why);
    else if (rc)
        dray_srv_bad(e, q->prompt ? "prompt" : "messages", "%s", why);
    else if (!(body = dray_srv_tokens_json(ids, n, s->context)))
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    free(ids);
    return body;
}

static char *detokenize(const struct dray_engine *en, const struct dray_srv_request *q,
                        struct dray_srv_error *e)
{
    char why[512], *text = NULL, *body = NULL;
    size_t len = 0;
    int rc = dray_engine_detokenize(en, q->tokens, q->n_tokens, &text, &len, why, sizeof(why));
    if (rc == DRAY_EINVAL)
        dray_srv_bad(e, "tokens", "%s", why);
    else if (rc)
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "%s", why);
    else if (!(body = dray_srv_detokenized_json(text, len)))
        dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    free(text);
    return body;
}

enum MHD_Result dray_srv_tokenize(struct dray_srv_call *c, int kind)
{
    struct dray_srv *s = c->srv;
    struct dray_srv_request q;
    struct dray_srv_error e;
    const struct dray_engine *en = s->rep[0].engine;
    char *body = NULL;
    if (dray_srv_request_parse(kind, c->body.data ? c->body.data : "", c->body.len, s->cfg, &q, &e))
        return dray_srv_send_error(c, &e);
    if (!dray_srv_check_model(&s->models, q.model, &e) &&
        !dray_srv_request_check_vocab(&q, dray_engine_get_info(en)->n_vocab, &e))
        body = kind == DRAY_SRV_TOKENIZE ? tokenize(s, en, &q, &e) : detokenize(en, &q, &e);
    dray_srv_request_free(&q);
    return body ? dray_srv_send(c, 200, "application/json", body, strlen(body), 0)
                : dray_srv_send_error(c, &e);
}
