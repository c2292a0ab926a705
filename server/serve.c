/* The server's lifecycle: the scheduler and the HTTP daemon up, wait for a
 * signal, drain, cancel what is left, tear down. */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "server.h"

void dray_serve_block_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* a client that hangs up must cost a failed write, not the process */
    signal(SIGPIPE, SIG_IGN);
}

/* The id clients name the model by: the GGUF file name without ".gguf". */
static void model_id(const struct dray_engine_info *info, char *out, size_t len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s", info->model_path ? info->model_path : "model");
    const char *base = basename(path);
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf"))
        n -= 5;
    snprintf(out, len, "%.*s", (int)n, base);
}

/* Wait up to ms for SIGINT/SIGTERM; returns the signal or 0. ms < 0: forever. */
static int wait_signal(int ms)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (ms < 0) {
        int sig = 0;
        return sigwait(&set, &sig) ? 0 : sig;
    }
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    int sig = sigtimedwait(&set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

/* Seconds the teardown may take once the grace is over: cancelled requests
 * end at their next step (a grammar's step is bounded by grammar_step_ms), so
 * this is only reached when something does not let go; then the process ends
 * anyway. */
#define DRAY_SRV_STOP_S 15

static void *force_exit(void *arg)
{
    (void)arg;
    sleep(DRAY_SRV_STOP_S);
    fprintf(stderr, "dray serve: still stopping %d s after the grace: exiting now\n", DRAY_SRV_STOP_S);
    _exit(1);
    return NULL;
}

/* Shutdown always wins: a detached timer ends the process if the teardown
 * hangs. */
static void arm_force_exit(void)
{
    pthread_t t;
    if (!pthread_create(&t, NULL, force_exit, NULL))
        pthread_detach(t);
}

/* Stop accepting; in-flight requests get shutdown_grace seconds, then are
 * cancelled at their next step; a second signal cancels at once. */
static void drain(struct dray_srv *s, int sig)
{
    fprintf(stderr, "dray serve: %s: no new requests; %u in flight get %u s to finish\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", dray_srv_in_flight(s), s->cfg->shutdown_grace);
    atomic_store(&s->draining, true);
    MHD_socket listen_fd = MHD_quiesce_daemon(s->daemon);
    if (listen_fd != MHD_INVALID_SOCKET)
        close(listen_fd);
    for (uint32_t i = 0; i < s->n_rep; i++)
        dray_sched_drain(s->rep[i].sched);
    double until = dray_srv_now() + s->cfg->shutdown_grace;
    while (dray_srv_in_flight(s) && dray_srv_now() < until)
        if (wait_signal(100)) {
            fprintf(stderr, "dray serve: second signal: cancelling now\n");
            break;
        }
    arm_force_exit();
    if (dray_srv_in_flight(s))
        fprintf(stderr, "dray serve: cancelling %u requests\n", dray_srv_in_flight(s));
    /* cancelled requests end at the scheduler's next step; their handlers then
     * write the final event and let go */
    for (int i = 0; i < 100 && dray_srv_in_flight(s); i++) {
        dray_srv_cancel_all(s);
        wait_signal(100);
    }
}

/* Start a scheduler per replica; they must all serve the same model. */
static int start_replicas(struct dray_srv *s, struct dray_engine *const *engines, char *err, size_t errlen)
{
    const struct dray_engine_info *first = dray_engine_get_info(engines[0]);
    for (uint32_t i = 0; i < s->n_rep; i++) {
        struct dray_srv_replica *r = &s->rep[i];
        const struct dray_engine_info *in = dray_engine_get_info(engines[i]);
        r->engine = engines[i];
        dray_srv_metrics_init(&r->metrics);
        if (in->context != first->context || in->n_vocab != first->n_vocab ||
            strcmp(in->model_path ? in->model_path : "", first->model_path ? first->model_path : "")) {
            snprintf(err, errlen, "replica %u (%s, context %u) differs from replica 0 (%s, context %u): "
                     "replicas serve one model", i, in->model_path, in->context, first->model_path,
                     first->context);
            return DRAY_EINVAL;
        }
        char why[1024];
        int rc = dray_sched_create(engines[i], s->cfg->max_queue, &r->sched, why, sizeof(why));
        if (rc) {
            snprintf(err, errlen, "replica %u: %s", i, why);
            return rc;
        }
    }
    return 0;
}

static void stop_replicas(struct dray_srv *s)
{
    for (uint32_t i = 0; s->rep && i < s->n_rep; i++) {
        if (s->rep[i].sched)
            dray_sched_destroy(s->rep[i].sched);
        if (s->rep[i].engine)
            dray_srv_metrics_destroy(&s->rep[i].metrics);
    }
    free(s->rep);
}

int dray_serve(struct dray_engine *const *engines, uint32_t n, const struct dray_config *cfg,
               char *err, size_t errlen)
{
    static struct dray_srv srv; /* one server per process: signals are per process too */
    struct dray_srv *s = &srv;
    if (!n) {
        snprintf(err, errlen, "no engine to serve");
        return DRAY_EINVAL;
    }
    const struct dray_engine_info *info = dray_engine_get_info(engines[0]);
    *s = (struct dray_srv){.n_rep = n, .cfg = cfg, .context = info->context,
                           .started = (int64_t)time(NULL)};
    char file[DRAY_SRV_NAME_LEN];
    model_id(info, file, sizeof(file));
    if (dray_srv_models_init(&s->models, cfg->served_model_name, file, info->context, s->started,
                             err, errlen))
        return DRAY_EINVAL;
    if (!dray_engine_chat_template(engines[0])) {
        snprintf(err, errlen, "%s has no chat template dray implements: set the config key "
                 "chat_template (a name in docs/config.md, Chat templates)", info->model_path);
        return DRAY_EINVAL;
    }
    if (!(s->rep = calloc(n, sizeof(*s->rep)))) {
        snprintf(err, errlen, "out of memory");
        return DRAY_ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    dray_srv_metrics_init(&s->metrics);
    int rc = start_replicas(s, engines, err, errlen);
    if (!rc)
        rc = dray_srv_http_start(s, err, errlen);
    if (rc)
        goto out;
    fprintf(stderr, "dray serve: listening on http://%s%s%s:%u/v1 (model '%s', %u replica%s of %u "
            "sequences, queue %u%s)\n", strchr(cfg->host, ':') ? "[" : "", cfg->host,
            strchr(cfg->host, ':') ? "]" : "", cfg->port, s->models.name[0], n, n == 1 ? "" : "s",
            info->max_seqs, cfg->max_queue, cfg->api_key[0] ? ", API key required" : "");
    if (s->models.n > 1 || strcmp(s->models.name[0], s->models.file))
        fprintf(stderr, "dray serve: model names: %s (and the file's, '%s')\n", cfg->served_model_name,
                s->models.file);
    int sig = wait_signal(-1);
    drain(s, sig);
    MHD_stop_daemon(s->daemon);
    fprintf(stderr, "dray serve: stopped\n");
out:
    stop_replicas(s);
    dray_srv_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->mu);
    return rc;
}
