/* Host memory for the CPU plugin's large, long-lived arrays (packed weights):
 * 2 MiB aligned and advised for transparent huge pages, so that a decode
 * step's stream through them crosses no 4 KiB page boundary (where the
 * hardware prefetchers stop) and needs 512 times fewer TLB entries. */
#ifndef DRAY_CPU_MEM_H
#define DRAY_CPU_MEM_H

#include <stddef.h>

#include "cpu_isa.h"

/* n bytes, 64-byte aligned (2 MiB aligned from 2 MiB up); NULL when out of memory. */
DRAY_CPU_HIDDEN void *dray_cpu_big_alloc(size_t n);
/* Frees what dray_cpu_big_alloc(n) returned, with the same n (NULL: nothing). */
DRAY_CPU_HIDDEN void dray_cpu_big_free(void *p, size_t n);

#endif
