/* A persistent pool of worker threads for one CPU context. run() hands the same
 * task to every thread (the caller is thread 0) and returns when all are done.
 * Workers spin for a short while after each task, because decode issues many
 * small ops back to back and a futex wake-up costs tens of microseconds; after
 * that they sleep on a condition variable so an idle engine burns no CPU. */
#ifndef DRAY_CPU_POOL_H
#define DRAY_CPU_POOL_H

#include <stdint.h>

struct dray_cpu_pool;
typedef void (*dray_cpu_task_fn)(void *arg, uint32_t ith, uint32_t nth);

/* n_threads >= 1 (1: no worker threads, run() calls fn directly). */
int dray_cpu_pool_create(uint32_t n_threads, struct dray_cpu_pool **out);
void dray_cpu_pool_destroy(struct dray_cpu_pool *pool);
uint32_t dray_cpu_pool_size(const struct dray_cpu_pool *pool);
void dray_cpu_pool_run(struct dray_cpu_pool *pool, dray_cpu_task_fn fn, void *arg);
/* What a worker does after its share of each task, while the caller goes on
 * alone (cpu_ops.c: fetch the next matmul's weights): fn(arg, pool, gen), to
 * return soon after dray_cpu_pool_gen(pool) moves past gen (a new task). */
typedef void (*dray_cpu_idle_fn)(void *arg, const struct dray_cpu_pool *pool, unsigned gen);
void dray_cpu_pool_set_idle(struct dray_cpu_pool *pool, dray_cpu_idle_fn fn, void *arg);
unsigned dray_cpu_pool_gen(const struct dray_cpu_pool *pool);

#endif
