#include "metrics.h"

#include <stddef.h>
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

void dray_srv_metrics_count_mhd_status(struct dray_srv_metrics *m, int status)
{
    pthread_mutex_lock(&m->mu);
    m->by_status_mhd[status >= 100 && status < 600 ? status : 500]++;
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

/* A histogram family: one series of buckets, sum and count per replica. */
static int print_hist(struct dray_srv_buf *b, const char *name, const char *help,
                      const struct dray_srv_hist *const *h, uint32_t n)
{
    int rc = dray_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (uint32_t r = 0; !rc && r < n; r++) {
        uint64_t cum = 0;
        for (uint32_t i = 0; !rc && i < h[r]->n; i++) {
            cum += h[r]->counts[i];
            rc = dray_srv_buf_printf(b, "%s_bucket{replica=\"%u\",le=\"%g\"} %llu\n", name, r,
                                     h[r]->bounds[i], (unsigned long long)cum);
        }
        if (!rc)
            rc = dray_srv_buf_printf(b, "%s_bucket{replica=\"%u\",le=\"+Inf\"} %llu\n"
                                        "%s_sum{replica=\"%u\"} %.6f\n%s_count{replica=\"%u\"} %llu\n",
                                     name, r, (unsigned long long)h[r]->count, name, r, h[r]->sum,
                                     name, r, (unsigned long long)h[r]->count);
    }
    return rc;
}

/* A counter or gauge family: v[r] is replica r's value. */
static int print_family(struct dray_srv_buf *b, const char *name, const char *type, const char *help,
                        const unsigned long long *v, uint32_t n)
{
    int rc = dray_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (uint32_t r = 0; !rc && r < n; r++)
        rc = dray_srv_buf_printf(b, "%s{replica=\"%u\"} %llu\n", name, r, v[r]);
    return rc;
}

/* A family of the scheduler's stats: the field at off (size 4 or 8 bytes) of
 * each replica's struct dray_sched_stats. */
#define STAT(field) offsetof(struct dray_sched_stats, field), sizeof(((struct dray_sched_stats *)0)->field)
static int print_stat(struct dray_srv_buf *b, const char *name, const char *type, const char *help,
                      const struct dray_sched_stats *st, uint32_t n, unsigned long long *v,
                      size_t off, size_t size)
{
    for (uint32_t r = 0; r < n; r++) {
        const char *p = (const char *)&st[r] + off;
        uint32_t v32;
        uint64_t v64;
        if (size == sizeof(v32))
            memcpy(&v32, p, size), v[r] = v32;
        else
            memcpy(&v64, p, sizeof(v64)), v[r] = v64;
    }
    return print_family(b, name, type, help, v, n);
}
static int print_requests(struct dray_srv_buf *b, const struct dray_srv_metrics *m)
{
    int rc = dray_srv_buf_printf(b, "# HELP dray_http_requests_total HTTP responses by status code.\n"
                                    "# TYPE dray_http_requests_total counter\n");
    for (int s = 100; !rc && s < 600; s++)
        if (m->by_status[s])
            rc = dray_srv_buf_printf(b, "dray_http_requests_total{code=\"%d\"} %llu\n", s,
                                     (unsigned long long)m->by_status[s]);
    for (int s = 100; !rc && s < 600; s++)
        if (m->by_status_mhd[s])
            rc = dray_srv_buf_printf(b, "dray_http_requests_total{code=\"%d\",answered_by=\"libmicrohttpd\"} %llu\n",
                                     s, (unsigned long long)m->by_status_mhd[s]);
    return rc;
}

static int print_outcomes(struct dray_srv_buf *b, const struct dray_sched_stats *st, uint32_t n)
{
    static const char *const outcome[] = {"done", "failed", "cancelled"};
    int rc = dray_srv_buf_printf(b, "# HELP dray_scheduler_requests_total Requests the scheduler ended, by outcome.\n"
                                    "# TYPE dray_scheduler_requests_total counter\n");
    for (uint32_t r = 0; !rc && r < n; r++)
        for (int k = 0; !rc && k < 3; k++)
            rc = dray_srv_buf_printf(b, "dray_scheduler_requests_total{replica=\"%u\",outcome=\"%s\"} %llu\n",
                                     r, outcome[k],
                                     (unsigned long long)(k == 0   ? st[r].requests_done
                                                          : k == 1 ? st[r].requests_failed
                                                                   : st[r].requests_cancelled));
    return rc;
}

/* The scheduler's counters and gauges, one row per family, in the order
 * /metrics lists them: name, type, help, and the field of each replica's struct
 * dray_sched_stats. The prefix-cache rows give the hit rate (hit tokens / lookup
 * tokens), what the cache holds in each tier, and what moved between them. */
static const struct {
    const char *name, *type, *help;
    size_t off, size;
} stat_families[] = {
    {"dray_queue_depth", "gauge", "Requests waiting to be admitted.", STAT(waiting)},
    {"dray_running_sequences", "gauge", "Sequences admitted (prefilling or decoding).", STAT(running)},
    {"dray_max_sequences", "gauge", "Sequences one step can hold (max_seqs).", STAT(max_seqs)},
    {"dray_kv_blocks_used", "gauge", "KV cache blocks in use, all layer groups.", STAT(kv_blocks_used)},
    {"dray_kv_blocks_total", "gauge", "KV cache blocks in the pool, all layer groups.",
     STAT(kv_blocks_total)},
    {"dray_preemptions_total", "counter", "Sequences preempted (blocks freed, recomputed later).",
     STAT(preemptions)},
    {"dray_scheduler_steps_total", "counter", "Batches the scheduler ran.", STAT(steps)},
    {"dray_sampled_tokens_total", "counter", "Tokens the scheduler sampled.", STAT(sampled_tokens)},
    {"dray_sample_microseconds_total", "counter", "Scheduler time drawing them.", STAT(sample_us)},
    {"dray_grammar_tokens_total", "counter", "Of them, tokens sampled under a grammar (structured "
     "output, tools).", STAT(grammar_tokens)},
    {"dray_grammar_microseconds_total", "counter",
     "Scheduler time drawing those (the grammar's tests and masks included) and advancing their "
     "grammars.", STAT(grammar_us)},
    {"dray_scheduler_prompt_tokens_total", "counter",
     "Prompt tokens of the sequences the scheduler admitted (a request of n choices has n, plus "
     "its prompt pass).", STAT(prompt_tokens)},
    {"dray_scheduler_prompt_tokens_cached_total", "counter",
     "Of them, taken from the prefix cache rather than computed.", STAT(prompt_tokens_cached)},
    {"dray_prefix_cache_lookup_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.",
     STAT(cache_lookup_tokens)},
    {"dray_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
     STAT(cache_hit_tokens)},
    {"dray_prefix_cache_device_blocks", "gauge",
     "KV block references the prefix cache holds on the device.", STAT(cache_blocks)},
    {"dray_prefix_cache_host_bytes", "gauge", "Bytes of KV the prefix cache holds in host memory.",
     STAT(cache_host_bytes)},
    {"dray_prefix_cache_evictions_total", "counter", "Cached prefixes and checkpoints dropped.",
     STAT(cache_evictions)},
    {"dray_prefix_cache_spills_total", "counter", "Cached blocks moved from the device to host memory.",
     STAT(cache_spills)},
    {"dray_prefix_cache_restores_total", "counter",
     "Cached blocks moved back from host memory to the device.", STAT(cache_restores)},
    {"dray_prefix_cache_microseconds_total", "counter",
     "Time spent in prefix-cache lookups, inserts and copies on write.", STAT(cache_us)},
    {"dray_prefix_cache_assembled_hits_total", "counter",
     "Hits that diverged inside a cached prefix, their window-layer blocks taken from the checkpoints "
     "around the divergence.", STAT(cache_assembled)},
    {"dray_prefix_cache_cow_copies_total", "counter",
     "Shared partial KV blocks copied before a request wrote into them.", STAT(cache_cow_copies)},
};

static int print_sched(struct dray_srv_buf *b, const struct dray_sched_stats *st, uint32_t n,
                       unsigned long long *v)
{
    int rc = print_outcomes(b, st, n);
    for (size_t i = 0; !rc && i < sizeof(stat_families) / sizeof(stat_families[0]); i++)
        rc = print_stat(b, stat_families[i].name, stat_families[i].type, stat_families[i].help, st, n, v,
                        stat_families[i].off, stat_families[i].size);
    return rc;
}

/* Tokens and latency histograms of each replica, read under its lock. */
static int print_served(struct dray_srv_buf *b, struct dray_srv_metrics *const *rep, uint32_t n,
                        unsigned long long *v)
{
    const struct dray_srv_hist *ttft[n], *itl[n], *e2e[n];
    for (uint32_t r = 0; r < n; r++) {
        pthread_mutex_lock(&rep[r]->mu);
        ttft[r] = &rep[r]->ttft;
        itl[r] = &rep[r]->itl;
        e2e[r] = &rep[r]->e2e;
    }
    unsigned long long cached[n], completion[n];
    for (uint32_t r = 0; r < n; r++) {
        v[r] = rep[r]->prompt_tokens;
        cached[r] = rep[r]->cached_tokens;
        completion[r] = rep[r]->completion_tokens;
    }
    int rc = print_family(b, "dray_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                          v, n) ||
             print_family(b, "dray_prompt_tokens_cached_total", "counter",
                          "Prompt tokens served from cached KV (not recomputed).", cached, n) ||
             print_family(b, "dray_completion_tokens_total", "counter", "Tokens generated.", completion, n) ||
             print_hist(b, "dray_time_to_first_token_seconds",
                        "Time from submit to the first generated token.", ttft, n) ||
             print_hist(b, "dray_inter_token_latency_seconds",
                        "Time between consecutive generated tokens of a request.", itl, n) ||
             print_hist(b, "dray_request_duration_seconds", "Time from submit to the last token.", e2e, n);
    for (uint32_t r = 0; r < n; r++)
        pthread_mutex_unlock(&rep[r]->mu);
    return rc;
}

int dray_srv_metrics_format(struct dray_srv_metrics *http, struct dray_srv_metrics *const *rep,
                            const struct dray_sched_stats *st, uint32_t n, struct dray_srv_buf *out)
{
    unsigned long long v[n ? n : 1];
    pthread_mutex_lock(&http->mu);
    int rc = print_requests(out, http);
    pthread_mutex_unlock(&http->mu);
    if (!rc)
        rc = print_served(out, rep, n, v) || print_sched(out, st, n, v);
    return rc ? DRAY_ENOMEM : 0;
}
