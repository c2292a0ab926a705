/* Thread pool: a generation counter announces a task, a done counter collects
 * the workers. Sleeping workers are counted so the caller only takes the mutex
 * when someone actually sleeps (both counters are seq_cst, see run()). */
#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "dray/backend.h"

#define SPIN_NS 200000L /* how long an idle worker spins before it sleeps */

struct worker {
    struct dray_cpu_pool *pool;
    uint32_t ith;
    pthread_t th;
};

struct dray_cpu_pool {
    uint32_t n;
    struct worker *w;       /* [n - 1]: threads 1 .. n-1 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;        /* bumped once per task */
    atomic_uint done;       /* workers finished with the current task */
    atomic_uint sleepers;   /* workers inside (or entering) cond_wait */
    atomic_int stop;
    dray_cpu_task_fn fn;    /* written before gen is bumped, read after */
    void *arg;
    dray_cpu_idle_fn idle;  /* set before the first task */
    void *idle_arg;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Wait for gen to move past seen (or stop); returns the new gen. */
static unsigned wait_task(struct dray_cpu_pool *p, unsigned seen)
{
    long t0 = now_ns();
    for (unsigned i = 1;; i++) {
        unsigned g = atomic_load(&p->gen);
        if (g != seen || atomic_load(&p->stop))
            return g;
        cpu_relax();
        if ((i & 255) == 0 && now_ns() - t0 > SPIN_NS) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            t0 = now_ns();
        }
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct dray_cpu_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_task(p, seen);
        if (atomic_load(&p->stop))
            break;
        p->fn(p->arg, w->ith, p->n);
        atomic_fetch_add(&p->done, 1);
        if (p->idle)
            p->idle(p->idle_arg, p, seen);
    }
    return NULL;
}

int dray_cpu_pool_create(uint32_t n_threads, struct dray_cpu_pool **out)
{
    *out = NULL;
    if (n_threads < 1)
        n_threads = 1;
    struct dray_cpu_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return DRAY_ENOMEM;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->w = calloc(n_threads - 1, sizeof(*p->w));
        if (!p->w) {
            dray_cpu_pool_destroy(p);
            return DRAY_ENOMEM;
        }
    }
    /* Workers start with every signal blocked (they inherit the creator's mask):
     * a process signal such as the Ctrl-C of `dray chat` then always reaches a
     * thread of the application, which is where its handler expects to run. */
    sigset_t all, old_mask;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old_mask);
    for (uint32_t i = 1; i < n_threads; i++) {
        struct worker *w = &p->w[i - 1];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->th, NULL, worker_main, w) != 0) {
            p->n = i; /* only threads 1..i-1 exist; destroy joins exactly those */
            pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
            dray_cpu_pool_destroy(p);
            return DRAY_ENOMEM;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    *out = p;
    return 0;
}

void dray_cpu_pool_destroy(struct dray_cpu_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n && p->w; i++)
        pthread_join(p->w[i - 1].th, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->w);
    free(p);
}

void dray_cpu_pool_set_idle(struct dray_cpu_pool *p, dray_cpu_idle_fn fn, void *arg)
{
    p->idle = fn;
    p->idle_arg = arg;
}

unsigned dray_cpu_pool_gen(const struct dray_cpu_pool *p)
{
    return atomic_load_explicit(&p->gen, memory_order_relaxed);
}

uint32_t dray_cpu_pool_size(const struct dray_cpu_pool *p)
{
    return p->n;
}

void dray_cpu_pool_run(struct dray_cpu_pool *p, dray_cpu_task_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->done, 0);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: orders fn/arg/done before, sleepers after */
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n);
    /* A worker may be descheduled on a busy machine: yield now and then. */
    for (unsigned i = 1; atomic_load(&p->done) != p->n - 1; i++) {
        cpu_relax();
        if ((i & 1023) == 0)
            sched_yield();
    }
}
