/* dray/dist.h — the message transport one model spread over processes runs on
 * (config `distributed: mpi`, core/dist.h). A transport is a module,
 * libdray-<name>.so, that dray loads with dlopen only when the config names it,
 * so a plain dray needs no MPI at run time. It exports one function,
 * dray_dist_transport_open, that fills the table below.
 *
 * The protocol on top (what the messages say) is core's: a transport moves
 * whole byte messages between ranks, in order between any two of them. */
#ifndef DRAY_DIST_H
#define DRAY_DIST_H

#include <stddef.h>
#include <stdint.h>

#define DRAY_DIST_ABI 2 /* 2: send timeouts, allreduce_f32 */
#define DRAY_DIST_OPEN_SYMBOL "dray_dist_transport_open"

enum dray_dist_status {
    DRAY_DIST_OK = 0,
    DRAY_DIST_EFAIL = 1,    /* the transport failed (err says how) */
    DRAY_DIST_ETIMEOUT = 2, /* nothing came from the peer in time */
};

struct dray_dist {
    uint32_t abi;       /* DRAY_DIST_ABI, set by the module */
    uint32_t rank, size; /* this process and how many there are; rank 0 leads */
    char name[32];      /* "mpi" */
    char host[64];      /* this process's host name */
    void *self;
    /* Send n bytes to peer; returns once buf may be reused, or fails once the
     * peer has taken nothing for timeout_s (<= 0: for ever). After a failure the
     * transport may still read buf, so the caller keeps it and gives the peer
     * up. Safe from several threads at once (to different peers). */
    int (*send)(void *self, uint32_t peer, const void *buf, size_t n, double timeout_s, char *err,
                size_t errlen);
    /* The next message from peer, waiting at most timeout_s (<= 0: for ever);
     * *buf is malloc'd and the caller frees it. */
    int (*recv)(void *self, uint32_t peer, double timeout_s, void **buf, size_t *n, char *err,
                size_t errlen);
    /* Leave the job (every rank calls it once, at exit). */
    void (*close)(void *self);
    /* Since ABI 2. buf[0..n) becomes the element-wise sum of every rank's buf
     * (tensor parallel: the partial sums of a row-split matmul). Collective: every
     * rank calls it with the same n, in the same order; the same result on each.
     * DRAY_DIST_ETIMEOUT when the ranks have not all joined in timeout_s (<= 0:
     * for ever); the job's collectives are out of step after that. */
    int (*allreduce_f32)(void *self, float *buf, size_t n, double timeout_s, char *err, size_t errlen);
};

/* Fill *out (the module may start its runtime here, e.g. MPI_Init_thread). */
typedef int (*dray_dist_open_fn)(struct dray_dist *out, char *err, size_t errlen);

#endif
