/* Token ids -> streamed text with stop strings held back (see emitter.h). */
#include "emitter.h"

#include <stdlib.h>

#include "error.h"

int dray_emitter_init(struct dray_emitter *em, const struct dray_tokenizer *tok,
                      const char *const *stop, uint32_t n_stop, dray_emit_fn fn, void *user,
                      char *err, size_t errlen)
{
    *em = (struct dray_emitter){.fn = fn, .user = user, .tok = tok};
    dray_detok_init(&em->detok);
    em->piece_cap = dray_tokenizer_max_piece(tok) + 8;
    em->piece = malloc(em->piece_cap);
    if (!em->piece)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    int rc = dray_stop_init(&em->stop, stop, n_stop, err, errlen);
    if (rc) {
        free(em->piece);
        em->piece = NULL;
    }
    return rc;
}

void dray_emitter_free(struct dray_emitter *em)
{
    if (!em->piece)
        return;
    dray_stop_free(&em->stop);
    free(em->piece);
    em->piece = NULL;
}

int dray_emitter_token(struct dray_emitter *em, int32_t id, bool *stopped)
{
    size_t n = dray_detok_push(&em->detok, em->tok, id, em->piece, em->piece_cap);
    const char *ready = "";
    size_t ready_len = 0;
    int r = dray_stop_feed(&em->stop, em->piece, n, &ready, &ready_len);
    *stopped = r == 1;
    return em->fn ? em->fn(em->user, ready, ready_len, id) : 0;
}

void dray_emitter_flush(struct dray_emitter *em)
{
    char tail[8];
    size_t n = dray_detok_flush(&em->detok, tail, sizeof(tail));
    const char *ready = "";
    size_t ready_len = 0;
    if (dray_stop_feed(&em->stop, tail, n, &ready, &ready_len) == 0 && em->fn && ready_len)
        em->fn(em->user, ready, ready_len, -1);
    ready_len = 0;
    if (em->stop.matched < 0)
        dray_stop_flush(&em->stop, &ready, &ready_len);
    if (em->fn && ready_len)
        em->fn(em->user, ready, ready_len, -1);
}
