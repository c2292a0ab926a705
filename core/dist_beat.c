/* A rank's heartbeat (dist_beat.h): one thread that, while the rank is busy,
 * sends a DIST_ALIVE answer to rank 0 every DIST_BEAT_S. Beats are sent with
 * the lock held, and idle takes the lock, so no beat follows the answer. */
#include "dist_beat.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "dist_proto.h"
#include "log.h"

struct dist_beat {
    struct dray_dist *t;
    double send_timeout_s, every_s; /* beat period: DIST_BEAT_S, or a quarter of a shorter timeout */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool busy, stop;
    struct timespec since; /* when the rank became busy, or last beat */
};

static double age_s(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void *beat_loop(void *arg)
{
    static const struct dist_ans alive = {.kind = DIST_ALIVE}; /* static: a failed send may still read it */
    struct dist_beat *b = arg;
    char why[256];
    pthread_mutex_lock(&b->mu);
    while (!b->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(b->every_s * 0.25e9); /* wake 4 times a beat: a late beat is a short one */
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&b->cv, &b->mu, &until);
        if (b->stop || !b->busy || age_s(&b->since) < b->every_s)
            continue;
        if (b->t->send(b->t->self, 0, &alive, sizeof(alive), b->send_timeout_s, why, sizeof(why))) {
            dray_warn("rank %u: a heartbeat to rank 0: %s", b->t->rank, why);
            b->busy = false; /* rank 0 is gone: the request's answer will say so */
        }
        clock_gettime(CLOCK_MONOTONIC, &b->since);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int dist_beat_start(struct dray_dist *t, double timeout_s, struct dist_beat **out)
{
    struct dist_beat *b = calloc(1, sizeof(*b));
    *out = NULL;
    if (!b)
        return -1;
    b->t = t;
    b->send_timeout_s = timeout_s;
    b->every_s = timeout_s > 0 && timeout_s < 4 * DIST_BEAT_S ? timeout_s / 4 : DIST_BEAT_S;
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&b->th, NULL, beat_loop, b)) {
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return -1;
    }
    *out = b;
    return 0;
}

void dist_beat_busy(struct dist_beat *b)
{
    pthread_mutex_lock(&b->mu);
    b->busy = true;
    clock_gettime(CLOCK_MONOTONIC, &b->since);
    pthread_mutex_unlock(&b->mu);
}

void dist_beat_idle(struct dist_beat *b)
{
    pthread_mutex_lock(&b->mu);
    b->busy = false;
    pthread_mutex_unlock(&b->mu);
}

void dist_beat_stop(struct dist_beat *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->th, NULL);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
