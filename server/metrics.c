#include "metrics.h"

#include <string.h>

/* Buckets (seconds): TTFT spans a short prompt on a GPU to a long prefill on two
 * CPU cores; a decode step spans a few ms to a loaded CPU's hundreds of ms. */
static const double ttft_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double itl_bounds[] = {0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5};
static const double e2e_bounds[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
#define N(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
_Static_assert(N(ttft_bounds) <= DRAY_SRV_HIST_MAX && N(itl_bounds) <= DRAY_SRV_HIST_MAX &&
                   N(e2e_bounds) <= DRAY_SRV_HIST_MAX, "histogram bounds fit");

void dray_srv_metrics_init(struct dray_srv_metrics *m)
{
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
    m->ttft = (struct dray_srv_hist){.bounds = ttft_bounds, .n = N(ttft_bounds)};
    m->itl = (struct dray_srv_hist){.bounds = itl_bounds, .n = N(itl_bounds)};
    m->e2e = (struct dray_srv_hist){.bounds = e2e_bounds, .n = N(e2e_bounds)};
}

void dray_srv_metrics_destroy(struct dray_srv_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void dray_srv_metrics_count_status(struct dray_srv_metrics *m, int status)
{
    pthread_mutex_lock(&m->mu);
    m->by_status[status >= 100 && status < 600 ? status : 500]++;
    pthread_mutex_unlock(&m->mu);
}

/* count observations of value v */
static void hist_add(struct dray_srv_hist *h, double v, uint64_t count)
{
    uint32_t i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    h->counts[i] += count;
    h->count += count;
    h->sum += v * (double)count;
}

void dray_srv_metrics_observe(struct dray_srv_metrics *m, const struct dray_request_output *o)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += o->n_prompt;
    m->cached_tokens += o->n_cached;
    m->completion_tokens += o->n_generated;
    if (o->n_generated > 0 && o->ttft_s > 0)
        hist_add(&m->ttft, o->ttft_s, 1);
    if (o->n_generated > 1 && o->total_s > o->ttft_s)
        hist_add(&m->itl, (o->total_s - o->ttft_s) / (o->n_generated - 1), o->n_generated - 1);
    if (o->total_s > 0)
        hist_add(&m->e2e, o->total_s, 1);
    pthread_mutex_unlock(&m->mu);
}

static int print_hist(struct dray_srv_buf *b, const char *name, const char *help,
                      const struct dray_srv_hist *h)
{
    uint64_t cum = 0;
    int rc = dray_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (uint32_t i = 0; !rc && i < h->n; i++) {
        cum += h->counts[i];
        rc = dray_srv_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i],
                                 (unsigned long long)cum);
    }
    if (!rc)
        rc = dray_srv_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                                 (unsigned long long)h->count, name, h->sum, name,
                                 (unsigned long long)h->count);
    return rc;
}

static int print_one(struct dray_srv_buf *b, const char *name, const char *type, const char *help,
                     unsigned long long v)
{
    return dray_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type,
                               name, v);
}

static int print_requests(struct dray_srv_buf *b, const struct dray_srv_metrics *m)
{
    int rc = dray_srv_buf_printf(b, "# HELP dray_http_requests_total HTTP responses by status code.\n"
                                    "# TYPE dray_http_requests_total counter\n");
    for (int s = 100; !rc && s < 600; s++)
        if (m->by_status[s])
            rc = dray_srv_buf_printf(b, "dray_http_requests_total{code=\"%d\"} %llu\n", s,
                                     (unsigned long long)m->by_status[s]);
    return rc;
}

static int print_outcomes(struct dray_srv_buf *b, const struct dray_sched_stats *st)
{
    return dray_srv_buf_printf(b, "# HELP dray_scheduler_requests_total Requests the scheduler ended, by outcome.\n"
                                  "# TYPE dray_scheduler_requests_total counter\n"
                                  "dray_scheduler_requests_total{outcome=\"done\"} %llu\n"
                                  "dray_scheduler_requests_total{outcome=\"failed\"} %llu\n"
                                  "dray_scheduler_requests_total{outcome=\"cancelled\"} %llu\n",
                               (unsigned long long)st->requests_done, (unsigned long long)st->requests_failed,
                               (unsigned long long)st->requests_cancelled);
}

/* The prefix cache: lookups and hits (hit rate = hit tokens / lookup tokens),
 * what it holds in each tier, and what moved between them. */
static int print_cache(struct dray_srv_buf *b, const struct dray_sched_stats *st)
{
    return print_one(b, "dray_prefix_cache_lookup_tokens_total", "counter",
                     "Prompt tokens looked up in the prefix cache.",
                     (unsigned long long)st->cache_lookup_tokens) ||
           print_one(b, "dray_prefix_cache_hit_tokens_total", "counter",
                     "Prompt tokens served from the prefix cache.",
                     (unsigned long long)st->cache_hit_tokens) ||
           print_one(b, "dray_prefix_cache_device_blocks", "gauge",
                     "KV block references the prefix cache holds on the device.",
                     (unsigned long long)st->cache_blocks) ||
           print_one(b, "dray_prefix_cache_host_bytes", "gauge",
                     "Bytes of KV the prefix cache holds in host memory.",
                     (unsigned long long)st->cache_host_bytes) ||
           print_one(b, "dray_prefix_cache_evictions_total", "counter",
                     "Cached prefixes and checkpoints dropped.",
                     (unsigned long long)st->cache_evictions) ||
           print_one(b, "dray_prefix_cache_spills_total", "counter",
                     "Cached blocks moved from the device to host memory.",
                     (unsigned long long)st->cache_spills) ||
           print_one(b, "dray_prefix_cache_restores_total", "counter",
                     "Cached blocks moved back from host memory to the device.",
                     (unsigned long long)st->cache_restores) ||
           print_one(b, "dray_prefix_cache_microseconds_total", "counter",
                     "Time the scheduler spent in prefix-cache lookups and inserts.",
                     (unsigned long long)st->cache_us);
}

static int print_sched(struct dray_srv_buf *b, const struct dray_sched_stats *st)
{
    return print_outcomes(b, st) ||
           print_one(b, "dray_queue_depth", "gauge", "Requests waiting to be admitted.", st->waiting) ||
           print_one(b, "dray_running_sequences", "gauge", "Sequences admitted (prefilling or decoding).",
                     st->running) ||
           print_one(b, "dray_max_sequences", "gauge", "Sequences one step can hold (max_seqs).",
                     st->max_seqs) ||
           print_one(b, "dray_kv_blocks_used", "gauge", "KV cache blocks in use, all layer groups.",
                     (unsigned long long)st->kv_blocks_used) ||
           print_one(b, "dray_kv_blocks_total", "gauge", "KV cache blocks in the pool, all layer groups.",
                     (unsigned long long)st->kv_blocks_total) ||
           print_one(b, "dray_preemptions_total", "counter",
                     "Sequences preempted (blocks freed, recomputed later).",
                     (unsigned long long)st->preemptions) ||
           print_one(b, "dray_scheduler_steps_total", "counter", "Batches the scheduler ran.",
                     (unsigned long long)st->steps) ||
           print_cache(b, st)
               ? DRAY_ENOMEM
               : 0;
}

int dray_srv_metrics_format(struct dray_srv_metrics *m, const struct dray_sched_stats *st,
                            struct dray_srv_buf *out)
{
    pthread_mutex_lock(&m->mu);
    int rc = print_requests(out, m) ||
             print_one(out, "dray_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                       (unsigned long long)m->prompt_tokens) ||
             print_one(out, "dray_prompt_tokens_cached_total", "counter",
                       "Prompt tokens served from cached KV (not recomputed).",
                       (unsigned long long)m->cached_tokens) ||
             print_one(out, "dray_completion_tokens_total", "counter", "Tokens generated.",
                       (unsigned long long)m->completion_tokens) ||
             print_hist(out, "dray_time_to_first_token_seconds",
                        "Time from submit to the first generated token.", &m->ttft) ||
             print_hist(out, "dray_inter_token_latency_seconds",
                        "Time between consecutive generated tokens of a request.", &m->itl) ||
             print_hist(out, "dray_request_duration_seconds", "Time from submit to the last token.",
                        &m->e2e);
    pthread_mutex_unlock(&m->mu);
    if (!rc)
        rc = print_sched(out, st);
    return rc ? DRAY_ENOMEM : 0;
}
