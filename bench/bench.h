/* The benchmark drivers of `dray bench` (tools/cmd_bench.c dispatches to them).
 * bench/ sees the engine through dray/dray.h only (bench_ops, which measures
 * plugins without a model, through the installed dray/backend.h). */
#ifndef DRAY_BENCH_H
#define DRAY_BENCH_H

#include <stdint.h>

#include "dray/dray.h"

/* dray bench ops: argv[0] is "ops". */
int dray_bench_ops(int argc, char **argv);
/* dray bench model: cfg holds the common options (config file, -m, -t, ...),
 * already parsed; argv[1..argc) are the benchmark's own flags. */
int dray_bench_model(const struct dray_config *cfg, int argc, char **argv);
void dray_bench_model_help(void);

/* Strict flag values: 0, or -1 after printing "dray: FLAG expects ..., got 'S'". */
int dray_bench_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
int dray_bench_f64(const char *flag, const char *s, double lo, double hi, double *out);

#endif
