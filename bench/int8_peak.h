/* The machine's int8 dot-product peak, measured: the compute side of the
 * benchmarks' rooflines, as read_bw.h is the memory side. */
#ifndef DRAY_BENCH_INT8_PEAK_H
#define DRAY_BENCH_INT8_PEAK_H

#include <stdint.h>

/* int8 GOPS (2 ops per multiply-add) of one thread running independent dot
 * products with the widest instruction this CPU has (AVX-512 VNNI, AVX-VNNI,
 * AVX2 maddubs added in int16, as the grouped kernels do), best of a few
 * passes; *isa names it. 0 where none of them
 * exists (not x86-64): the caller then has no compute limit to print. */
double dray_bench_int8_peak(const char **isa);

#endif
