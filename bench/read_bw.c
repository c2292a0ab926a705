/* See read_bw.h. The loop is plain C with eight independent accumulators; built
 * for the baseline x86-64 (SSE2) it stays below the memory's speed on this class
 * of machine (18 GB/s against 23-25 on 2 cores), so where the CPU has AVX-512 or
 * AVX2 the same loop is compiled for it as well and chosen at run time. */
#include "read_bw.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slice {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

#define READ_LOOP                                                                                  \
    {                                                                                              \
        struct slice *s = arg;                                                                     \
        uint64_t acc[8] = {0};                                                                     \
        for (size_t i = 0; i + 8 <= s->n; i += 8)                                                  \
            for (int j = 0; j < 8; j++)                                                            \
                acc[j] ^= s->p[i + j];                                                             \
        for (int j = 1; j < 8; j++)                                                                \
            acc[0] ^= acc[j];                                                                      \
        s->sum = acc[0];                                                                           \
        return NULL;                                                                               \
    }

static void *read_plain(void *arg) READ_LOOP
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void *read_avx2(void *arg) READ_LOOP
__attribute__((target("avx512f"))) static void *read_avx512(void *arg) READ_LOOP
#endif

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double dray_bench_read_bw(size_t bytes, uint32_t threads, int reps)
{
    enum { MAX_THREADS = 64 };
    void *(*fn)(void *) = read_plain;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        fn = read_avx512;
    else if (__builtin_cpu_supports("avx2"))
        fn = read_avx2;
#endif
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    size_t n = bytes / 8 / threads * threads; /* whole words, whole slices */
    uint64_t *p = n ? malloc(n * 8) : NULL;
    if (!p)
        return 0;
    memset(p, 1, n * 8);
    double best = 0;
    for (int rep = 0; rep <= reps; rep++) { /* pass 0 warms the pages and caches */
        struct slice sl[MAX_THREADS];
        pthread_t th[MAX_THREADS];
        int started[MAX_THREADS];
        double t0 = now_s();
        for (uint32_t i = 0; i < threads; i++) {
            sl[i] = (struct slice){p + i * (n / threads), n / threads, 0};
            started[i] = i > 0 && pthread_create(&th[i], NULL, fn, &sl[i]) == 0;
        }
        fn(&sl[0]);
        for (uint32_t i = 1; i < threads; i++) {
            if (started[i])
                pthread_join(th[i], NULL);
            else
                fn(&sl[i]);
        }
        double gbs = (double)(n * 8) / (now_s() - t0) / 1e9;
        if (rep > 0 && gbs > best)
            best = gbs;
    }
    free(p);
    return best;
}
