/* The machine's read bandwidth for a working set of a given size: what a
 * memory-bound step can reach at best, for the benchmarks' rooflines. */
#ifndef DRAY_BENCH_READ_BW_H
#define DRAY_BENCH_READ_BW_H

#include <stddef.h>
#include <stdint.h>

/* GB/s of `threads` threads reading a buffer of `bytes` (each its own slice),
 * best of `reps` passes after one that faults the pages in; 0 if out of memory.
 * A working set near the size of the last-level cache reads partly from it and
 * so runs faster than DRAM (the CI machine: 105 MB L3; a 100 MB set reads at
 * ~28-36 GB/s on 2 cores, a 194 MB one at ~23-25, 1 GB at ~24). */
double dray_bench_read_bw(size_t bytes, uint32_t threads, int reps);

#endif
