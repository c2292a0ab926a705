/* Stop strings: the watcher that holds back generated text that may still grow
 * into a stop string (stop.c). */
#ifndef DRAY_CORE_STOP_H
#define DRAY_CORE_STOP_H

#include <stddef.h>

/*
 * Stop strings. Generated text arrives one token piece at a time; a stop string
 * may span pieces. dray_stop_feed holds back the tail of the text that could
 * still grow into a stop string and releases everything that cannot.
 */
struct dray_stop {
    char **stops;       /* [n] NUL-terminated copies */
    size_t *stop_len;   /* [n] */
    size_t n;
    char *pending;      /* held-back bytes: a suffix that may start a stop string */
    size_t n_pending, cap;
    char *out;          /* bytes released by the last call */
    size_t out_cap;
    int matched;        /* index of the stop string found, -1 while none */
};

/* Copies n non-empty stop strings. */
int dray_stop_init(struct dray_stop *st, const char *const *stops, size_t n, char *err,
                   size_t errlen);
void dray_stop_free(struct dray_stop *st);
/* Append a piece. emit and emit_len get the text that is safe to show now (valid
 * until the next call). Returns 1 when a stop string is complete: the text before
 * it is in *emit, the stop string and anything after it are dropped, and
 * st->matched says which one. Returns 0 otherwise, DRAY_ENOMEM on allocation
 * failure, and 1 again (emitting nothing) once stopped. */
int dray_stop_feed(struct dray_stop *st, const char *piece, size_t len, const char **emit,
                   size_t *emit_len);
/* Generation ended without a stop: release the held-back text. */
void dray_stop_flush(struct dray_stop *st, const char **emit, size_t *emit_len);

#endif
