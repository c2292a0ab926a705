/* Huge-page backed allocations (cpu_mem.h). Below 2 MiB, or where mmap fails,
 * plain aligned heap memory: the advice is a hint and never a requirement. */
#include "cpu_mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE ((size_t)2 << 20)

/* The mapping of n bytes: whole huge pages. */
static size_t mapped_len(size_t n)
{
    return (n + HUGE - 1) & ~(HUGE - 1);
}

void *dray_cpu_big_alloc(size_t n)
{
    if (n < HUGE || mapped_len(n) < n)
        return aligned_alloc(64, (n + 63) & ~(size_t)63);
    size_t len = mapped_len(n);
    /* map one huge page more, then trim both ends to a 2 MiB aligned range */
    char *raw = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + len + HUGE > p + len)
        munmap(p + len, (size_t)(raw + len + HUGE - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    return p;
}

void dray_cpu_big_free(void *p, size_t n)
{
    if (!p)
        return;
    if (n < HUGE || mapped_len(n) < n)
        free(p);
    else
        munmap(p, mapped_len(n));
}
