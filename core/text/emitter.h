/* Emitter: turns generated token ids into streamed text. Each id goes through the
 * streaming detokenizer (complete UTF-8 only) and then the stop-string watcher,
 * which holds back whatever could still grow into a stop string; what is safe to
 * show is passed to the caller's dray_emit_fn. Used by sessions and the scheduler. */
#ifndef DRAY_CORE_EMITTER_H
#define DRAY_CORE_EMITTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"
#include "stop.h"
#include "tokenizer.h"

struct dray_emitter {
    dray_emit_fn fn;
    void *user;
    const struct dray_tokenizer *tok;
    struct dray_detok detok;
    struct dray_stop stop;
    char *piece;               /* one token's text, dray_tokenizer_max_piece + slack */
    size_t piece_cap;
};

/* Copies the stop strings. DRAY_EINVAL (empty stop string) or DRAY_ENOMEM. */
int dray_emitter_init(struct dray_emitter *em, const struct dray_tokenizer *tok,
                      const char *const *stop, uint32_t n_stop, dray_emit_fn fn, void *user,
                      char *err, size_t errlen);
void dray_emitter_free(struct dray_emitter *em);
/* Emit token id. *stopped becomes true when a stop string completed (its text and
 * anything after it are not emitted). Returns what the callback returned
 * (non-zero: the caller wants to stop). */
int dray_emitter_token(struct dray_emitter *em, int32_t id, bool *stopped);
/* End of the stream: release held-back text (an incomplete UTF-8 character
 * becomes U+FFFD; a partial stop-string match that never completed is text). */
void dray_emitter_flush(struct dray_emitter *em);

#endif
