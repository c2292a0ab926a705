/* The stop-string watcher (stop.h): text arrives a token piece at a time; the
 * tail that could still become a stop string is held back until it cannot. */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

#include "dray/backend.h"
#include "error.h"

int dray_stop_init(struct dray_stop *st, const char *const *stops, size_t n, char *err,
                   size_t errlen)
{
    memset(st, 0, sizeof(*st));
    st->matched = -1;
    if (!n)
        return 0;
    st->stops = calloc(n, sizeof(*st->stops));
    st->stop_len = calloc(n, sizeof(*st->stop_len));
    if (!st->stops || !st->stop_len) {
        dray_stop_free(st);
        return dray_fail(err, errlen, DRAY_ENOMEM, "stop: out of memory");
    }
    st->n = n;
    for (size_t i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) {
            dray_stop_free(st);
            return dray_fail(err, errlen, DRAY_EINVAL, "stop: stop string %zu is empty", i);
        }
        st->stops[i] = strdup(stops[i]);
        if (!st->stops[i]) {
            dray_stop_free(st);
            return dray_fail(err, errlen, DRAY_ENOMEM, "stop: out of memory");
        }
        st->stop_len[i] = strlen(stops[i]);
    }
    return 0;
}

void dray_stop_free(struct dray_stop *st)
{
    for (size_t i = 0; st->stops && i < st->n; i++)
        free(st->stops[i]);
    free(st->stops);
    free(st->stop_len);
    free(st->pending);
    free(st->out);
    memset(st, 0, sizeof(*st));
    st->matched = -1;
}

static int grow(char **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    char *q = realloc(*p, c);
    if (!q)
        return DRAY_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* Earliest start of any stop string in pending; sets *which. SIZE_MAX if none. */
static size_t find_stop(const struct dray_stop *st, int *which)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < st->n; i++) {
        const char *hit = memmem(st->pending, st->n_pending, st->stops[i], st->stop_len[i]);
        if (hit && (size_t)(hit - st->pending) < best) {
            best = (size_t)(hit - st->pending);
            *which = (int)i;
        }
    }
    return best;
}

/* Longest suffix of pending that is a proper prefix of some stop string. */
static size_t held_suffix(const struct dray_stop *st)
{
    size_t hold = 0;
    for (size_t i = 0; i < st->n; i++) {
        size_t l = st->stop_len[i] - 1;
        if (l > st->n_pending)
            l = st->n_pending;
        for (; l > hold; l--)
            if (!memcmp(st->pending + st->n_pending - l, st->stops[i], l)) {
                hold = l;
                break;
            }
    }
    return hold;
}

static int release(struct dray_stop *st, size_t n, const char **emit, size_t *emit_len)
{
    if (grow(&st->out, &st->out_cap, n + 1))
        return DRAY_ENOMEM;
    memcpy(st->out, st->pending, n);
    st->out[n] = 0;
    memmove(st->pending, st->pending + n, st->n_pending - n);
    st->n_pending -= n;
    *emit = st->out;
    *emit_len = n;
    return 0;
}

int dray_stop_feed(struct dray_stop *st, const char *piece, size_t len, const char **emit,
                   size_t *emit_len)
{
    *emit = "";
    *emit_len = 0;
    if (st->matched >= 0)
        return 1;
    /* an empty piece (a control token's text) changes nothing held back; it may
     * come before any buffer exists, and memcpy/memmem must not see NULL */
    if (len == 0)
        return 0;
    if (grow(&st->pending, &st->cap, st->n_pending + len))
        return DRAY_ENOMEM;
    memcpy(st->pending + st->n_pending, piece, len);
    st->n_pending += len;
    int which = -1;
    size_t at = find_stop(st, &which);
    if (at != SIZE_MAX) {
        if (release(st, at, emit, emit_len))
            return DRAY_ENOMEM;
        st->matched = which;
        st->n_pending = 0;
        return 1;
    }
    return release(st, st->n_pending - held_suffix(st), emit, emit_len);
}

void dray_stop_flush(struct dray_stop *st, const char **emit, size_t *emit_len)
{
    *emit = "";
    *emit_len = 0;
    if (st->matched < 0 && release(st, st->n_pending, emit, emit_len))
        *emit_len = 0;
}
