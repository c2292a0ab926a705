/* Chat over the engine: a turn renders the messages with the model's template
 * (continuing the session's KV on later turns) and generates the reply; the
 * server renders whole conversations through dray_engine_chat_tokenize. */
#include <stdbool.h>
#include <stdlib.h>

#include "chat.h"
#include "chat_tokenize.h"
#include "dray/dray.h"
#include "engine_internal.h"
#include "error.h"

int dray_chat_turn(struct dray_session *s, const char *system, const char *user_text,
                   const struct dray_gen_params *p, dray_emit_fn emit, void *user,
                   struct dray_gen_stats *st, char *err, size_t errlen)
{
    struct dray_chat_msg msgs[2];
    size_t n_msgs = 0, n = 0;
    int32_t *ids = NULL;
    /* later turns continue the KV: the reply ended at the end-of-turn marker,
     * which was sampled but not fed */
    bool cont = s->chatted || s->n_hist > 0;
    if (!cont && system && system[0])
        msgs[n_msgs++] = (struct dray_chat_msg){"system", system};
    msgs[n_msgs++] = (struct dray_chat_msg){"user", user_text};
    int rc = dray_chat_tokenize(s->e->tok, &s->e->chat, msgs, n_msgs, cont, false, true, &ids, &n,
                                err, errlen);
    if (!rc) {
        rc = dray_session_generate(s, ids, n, p, emit, user, st, err, errlen);
        if (!rc)
            s->chatted = true;
    }
    free(ids);
    return rc;
}

const char *dray_engine_chat_template(const struct dray_engine *e)
{
    return e->chat.name;
}

int dray_engine_chat_tokenize(const struct dray_engine *e, const struct dray_chat_message *msgs,
                              size_t n, bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                              char *err, size_t errlen)
{
    struct dray_chat_msg *m = malloc((n ? n : 1) * sizeof(*m));
    if (!m)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        m[i] = (struct dray_chat_msg){msgs[i].role, msgs[i].content};
    int rc = dray_chat_tokenize(e->tok, &e->chat, m, n, false, false, add_generation_prompt, ids,
                                n_ids, err, errlen);
    free(m);
    return rc;
}
