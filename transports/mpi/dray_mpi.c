/* libdray-mpi.so: dray's message transport over MPI (dray/dist.h). Messages
 * are MPI_BYTE sends on MPI_COMM_WORLD with one tag; a receive probes, sizes
 * and takes the next one. Calls into MPI hold one lock, so MPI_THREAD_SERIALIZED
 * is enough, and waits poll (MPI_Test / MPI_Iprobe) so that other threads can
 * use MPI meanwhile and a receive can give up after its timeout. */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "dray/dist.h"

#define TAG 7

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Between polls: yield for the first 0.2 ms (a hop is tens of µs), then sleep
 * 20 µs: a rank waits a whole step of the others' layers for its next request
 * and must see it at once, yet not take a core from them. After 2 s (an idle
 * server) 1 ms. */
static void backoff(double waited)
{
    if (waited < 2e-4) {
        sched_yield();
        return;
    }
    static __thread int slack_set;
    if (!slack_set) /* Linux stretches a 20 µs sleep by its 50 µs default slack */
        slack_set = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0 ? 1 : -1;
    struct timespec ts = {0, waited < 2.0 ? 20000 : 1000000};
    nanosleep(&ts, NULL);
}

static int fail(int rc, char *err, size_t errlen, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    snprintf(err, errlen, "mpi: %s: %.*s", what, n, s);
    return DRAY_DIST_EFAIL;
}

static int mpi_send(void *self, uint32_t peer, const void *buf, size_t n, double timeout_s, char *err,
                    size_t errlen)
{
    (void)self;
    if (n > INT_MAX) {
        snprintf(err, errlen, "mpi: a message of %zu bytes to rank %u is over 2 GiB", n, peer);
        return DRAY_DIST_EFAIL;
    }
    MPI_Request rq;
    pthread_mutex_lock(&mu);
    int rc = MPI_Isend(buf, (int)n, MPI_BYTE, (int)peer, TAG, MPI_COMM_WORLD, &rq);
    pthread_mutex_unlock(&mu);
    if (rc != MPI_SUCCESS)
        return fail(rc, err, errlen, "send");
    double t0 = now_s();
    for (int done = 0;;) {
        pthread_mutex_lock(&mu);
        rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&mu);
        if (rc != MPI_SUCCESS)
            return fail(rc, err, errlen, "send");
        if (done)
            return DRAY_DIST_OK;
        double waited = now_s() - t0;
        if (timeout_s > 0 && waited > timeout_s) { /* a dead peer: rq and buf stay MPI's */
            snprintf(err, errlen, "mpi: rank %u took nothing in %.0f s", peer, timeout_s);
            return DRAY_DIST_ETIMEOUT;
        }
        backoff(waited);
    }
}

static int mpi_recv(void *self, uint32_t peer, double timeout_s, void **buf, size_t *n, char *err,
                    size_t errlen)
{
    (void)self;
    double t0 = now_s();
    *buf = NULL;
    *n = 0;
    for (;;) {
        int flag = 0, count = 0;
        MPI_Status st;
        pthread_mutex_lock(&mu);
        int rc = MPI_Iprobe((int)peer, TAG, MPI_COMM_WORLD, &flag, &st);
        if (rc == MPI_SUCCESS && flag) {
            MPI_Get_count(&st, MPI_BYTE, &count);
            *buf = malloc(count ? (size_t)count : 1);
            rc = *buf ? MPI_Recv(*buf, count, MPI_BYTE, (int)peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE)
                      : MPI_ERR_NO_MEM;
        }
        pthread_mutex_unlock(&mu);
        if (rc != MPI_SUCCESS) {
            free(*buf);
            *buf = NULL;
            return fail(rc, err, errlen, "receive");
        }
        if (flag) {
            *n = (size_t)count;
            return DRAY_DIST_OK;
        }
        double waited = now_s() - t0;
        if (timeout_s > 0 && waited > timeout_s) {
            snprintf(err, errlen, "mpi: nothing from rank %u in %.0f s", peer, timeout_s);
            return DRAY_DIST_ETIMEOUT;
        }
        backoff(waited);
    }
}

/* Wait for a non-blocking collective, polling (the lock only around each
 * test), giving up after timeout_s (<= 0: never). The ranks meet here twice a
 * layer, a slice's compute apart: yield for the first 5 ms, as a blocking
 * collective would spin, then back off as a receive does. */
static int wait_collective(MPI_Request *rq, double timeout_s, const char *what, char *err, size_t errlen)
{
    double t0 = now_s();
    for (int done = 0;;) {
        pthread_mutex_lock(&mu);
        int rc = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&mu);
        if (rc != MPI_SUCCESS)
            return fail(rc, err, errlen, what);
        if (done)
            return DRAY_DIST_OK;
        double waited = now_s() - t0;
        if (timeout_s > 0 && waited > timeout_s) {
            snprintf(err, errlen, "mpi: %s: not every rank joined in %.0f s", what, timeout_s);
            return DRAY_DIST_ETIMEOUT;
        }
        if (waited < 5e-3)
            sched_yield();
        else
            backoff(waited);
    }
}

/* The sum in place: reduced to rank 0 and broadcast, so every rank gets the
 * same bits whatever order MPI would add in. Non-blocking, so that a rank that
 * never joins costs a timeout, not a hang. */
static int mpi_allreduce_f32(void *self, float *buf, size_t n, double timeout_s, char *err, size_t errlen)
{
    (void)self;
    if (n > INT_MAX) {
        snprintf(err, errlen, "mpi: an all-reduce of %zu floats is over INT_MAX", n);
        return DRAY_DIST_EFAIL;
    }
    int rank = 0;
    MPI_Request rq;
    pthread_mutex_lock(&mu);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = MPI_Ireduce(rank ? buf : MPI_IN_PLACE, rank ? NULL : buf, (int)n, MPI_FLOAT, MPI_SUM, 0,
                         MPI_COMM_WORLD, &rq);
    pthread_mutex_unlock(&mu);
    if (rc != MPI_SUCCESS)
        return fail(rc, err, errlen, "all-reduce");
    if ((rc = wait_collective(&rq, timeout_s, "all-reduce", err, errlen)))
        return rc;
    pthread_mutex_lock(&mu);
    rc = MPI_Ibcast(buf, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD, &rq);
    pthread_mutex_unlock(&mu);
    if (rc != MPI_SUCCESS)
        return fail(rc, err, errlen, "all-reduce");
    return wait_collective(&rq, timeout_s, "all-reduce", err, errlen);
}

static void mpi_close(void *self)
{
    (void)self;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
}

int dray_dist_transport_open(struct dray_dist *out, char *err, size_t errlen)
{
    int inited = 0, provided = 0, rank = 0, size = 0;
    MPI_Initialized(&inited);
    int rc = inited ? MPI_Query_thread(&provided)
                    : MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
        return fail(rc, err, errlen, "init");
    if (provided < MPI_THREAD_SERIALIZED) {
        snprintf(err, errlen, "mpi: the library gives thread level %d, dray needs MPI_THREAD_SERIALIZED",
                 provided);
        return DRAY_DIST_EFAIL;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    *out = (struct dray_dist){.abi = DRAY_DIST_ABI, .rank = (uint32_t)rank, .size = (uint32_t)size,
                              .name = "mpi", .send = mpi_send, .recv = mpi_recv, .close = mpi_close,
                              .allreduce_f32 = mpi_allreduce_f32};
    if (gethostname(out->host, sizeof(out->host) - 1))
        snprintf(out->host, sizeof(out->host), "?");
    return DRAY_DIST_OK;
}
