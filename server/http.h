/* server/http.h — the server's state and the libmicrohttpd glue shared by the
 * routing (http.c), the generation endpoints (generate.c) and the lifecycle
 * (serve.c). libmicrohttpd runs one thread per connection, so a handler may
 * block while its request is generated. */
#ifndef DRAY_SERVER_HTTP_H
#define DRAY_SERVER_HTTP_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "apierr.h"
#include "buf.h"
#include "dray/dray.h"
#include "metrics.h"
#include "models.h"

/* A submitted request, listed so that shutdown can cancel what is still running. */
struct dray_srv_flight {
    struct dray_request *req;
    struct dray_srv_flight *prev, *next;
};

/* One engine and its scheduler: a replica of the model on one device. */
struct dray_srv_replica {
    struct dray_engine *engine;
    struct dray_sched *sched;
    struct dray_srv_metrics metrics; /* its requests' tokens and latencies */
};

struct dray_srv {
    struct dray_srv_replica *rep;  /* [n_rep] */
    uint32_t n_rep;
    const struct dray_config *cfg;
    uint32_t context;              /* tokens per sequence (the same in every replica) */
    struct dray_srv_models models; /* the names requests may use; models.name[0] is reported */
    int64_t started;               /* Unix seconds */
    struct dray_srv_metrics metrics; /* HTTP responses by status (the process's) */
    pthread_mutex_t mu;            /* guards flights and n_flight */
    struct dray_srv_flight *flights;
    unsigned n_flight;
    atomic_bool draining;          /* SIGTERM seen: new generations get 503 */
    atomic_ulong next_id;          /* for response ids */
    struct MHD_Daemon *daemon;
};

/* One HTTP request (libmicrohttpd's per-request pointer). */
struct dray_srv_call {
    struct dray_srv *srv;
    struct MHD_Connection *mc;
    double t0;                     /* monotonic seconds at arrival */
    char method[16], path[512];    /* for the log line; GET /v1/models/{id} reads the id */
    struct dray_srv_buf body;
    const char *allow;             /* for a 405: the method the path takes */
    bool too_big;                  /* body over max_body: dropped as it arrives */
    bool refuse_now;               /* body far over max_body: answer before reading it */
    int framing;                   /* an RFC 9110/9112 framing fault: its status (0 = none) */
    char framing_why[160];
    bool started;                  /* the request's headers are in (on_request's first call) */
    bool logged;                   /* a stream writes its own log line when it ends */
    int status;
    int replica;                   /* the replica that served it; -1 = none */
    uint32_t n_prompt, n_cached, n_completion;
};

double dray_srv_now(void); /* monotonic seconds */
/* Queue a response; body (malloc'd, may be NULL with len 0) is taken over.
 * retry_after: seconds for a Retry-After header, 0 = none. */
enum MHD_Result dray_srv_send(struct dray_srv_call *c, int status, const char *content_type,
                              char *body, size_t len, unsigned retry_after);
enum MHD_Result dray_srv_send_error(struct dray_srv_call *c, const struct dray_srv_error *e);
/* "dray serve: POST /v1/completions 200 prompt=5 cached=0 completion=16 ms=120.3"
 * and " replica=1" when a replica served it (replica >= 0). */
void dray_srv_log(const char *method, const char *path, int status, uint32_t n_prompt,
                  uint32_t n_cached, uint32_t n_completion, double ms, int replica);
/* "X-Dray-Replica: N" on a response that replica N served; nothing for -1. */
void dray_srv_add_replica_header(struct MHD_Response *r, int replica);
/* Whether the peer of the connection has closed it (checked without blocking). */
bool dray_srv_client_gone(struct MHD_Connection *mc);

void dray_srv_flight_add(struct dray_srv *s, struct dray_srv_flight *f);
void dray_srv_flight_remove(struct dray_srv *s, struct dray_srv_flight *f);
unsigned dray_srv_in_flight(struct dray_srv *s);
void dray_srv_cancel_all(struct dray_srv *s);

/* POST /v1/chat/completions and /v1/completions (generate.c). */
enum MHD_Result dray_srv_generate(struct dray_srv_call *c, int kind);
/* POST /tokenize and /detokenize (tokenize.c). */
enum MHD_Result dray_srv_tokenize(struct dray_srv_call *c, int kind);

/* Start listening on cfg->host:cfg->port (http.c). */
int dray_srv_http_start(struct dray_srv *s, char *err, size_t errlen);

#endif
