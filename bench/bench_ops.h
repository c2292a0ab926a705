/* dray bench ops (bench_ops.c): op speed of one plugin, through backend.h and
 * the conformance kit's loader only, so this header needs nothing from dray.h. */
#ifndef DRAY_BENCH_OPS_H
#define DRAY_BENCH_OPS_H

/* argv[0] is "ops"; returns the exit status (0, 1 failure, 2 usage). */
int dray_bench_ops(int argc, char **argv);

#endif
