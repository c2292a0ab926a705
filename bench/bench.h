/* dray bench model, the end-to-end driver of `dray bench` (tools/cmd_bench.c
 * dispatches to it). It sees the engine through dray/dray.h only; its flag
 * numbers come from the flags library (tools/flags/flags.h). */
#ifndef DRAY_BENCH_H
#define DRAY_BENCH_H

#include "dray/dray.h"

/* dray bench model: cfg holds the common options (config file, -m, -t, ...),
 * already parsed; argv[1..argc) are the benchmark's own flags. */
int dray_bench_model(const struct dray_config *cfg, int argc, char **argv);
void dray_bench_model_help(void);

#endif
