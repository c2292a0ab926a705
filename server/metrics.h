/* server/metrics.h — counters and latency histograms of the server, printed in
 * Prometheus' text exposition format (version 0.0.4) for GET /metrics. */
#ifndef DRAY_SERVER_METRICS_H
#define DRAY_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "buf.h"
#include "dray/dray.h"

#define DRAY_SRV_HIST_MAX 16

/* Cumulative counts are computed when printing; counts[i] holds observations in
 * (bounds[i-1], bounds[i]], counts[n] those above the last bound. Seconds. */
struct dray_srv_hist {
    const double *bounds;
    uint32_t n;
    uint64_t counts[DRAY_SRV_HIST_MAX + 1];
    uint64_t count;
    double sum;
};

struct dray_srv_metrics {
    pthread_mutex_t mu;
    uint64_t by_status[600];  /* HTTP responses by status code */
    uint64_t by_status_mhd[600]; /* those libmicrohttpd answered itself (malformed HTTP) */
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    struct dray_srv_hist ttft; /* submit -> first token */
    struct dray_srv_hist itl;  /* between consecutive tokens of a request */
    struct dray_srv_hist e2e;  /* submit -> done */
};

void dray_srv_metrics_init(struct dray_srv_metrics *m);
void dray_srv_metrics_destroy(struct dray_srv_metrics *m);
void dray_srv_metrics_count_status(struct dray_srv_metrics *m, int status);
/* A response libmicrohttpd made itself (a request it could not parse): printed
 * as dray_http_requests_total{code="400",answered_by="libmicrohttpd"}. */
void dray_srv_metrics_count_mhd_status(struct dray_srv_metrics *m, int status);
/* A finished generation (the last output of a request): its tokens and timings.
 * The inter-token latency is observed once per gap, as the request's mean gap
 * (the scheduler reports the first and last token times, not each one). */
void dray_srv_metrics_observe(struct dray_srv_metrics *m, const struct dray_request_output *o);
/* Print every metric. http: the process's metrics (only its counts by status
 * are printed); rep[i] and st[i] (the scheduler's gauges: queue, running, KV
 * blocks, preemptions, prefix cache) are replica i's, printed with the label
 * replica="i", for i < n. Returns 0 or DRAY_ENOMEM. */
int dray_srv_metrics_format(struct dray_srv_metrics *http, struct dray_srv_metrics *const *rep,
                            const struct dray_sched_stats *st, uint32_t n, struct dray_srv_buf *out);

#endif
