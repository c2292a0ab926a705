/* dray bench: dispatches to the benchmark drivers in bench/. The model driver
 * gets the common options (config, model, threads, precision...) parsed here, so
 * bench/ needs nothing from tools/. */
#include <stdio.h>
#include <string.h>

#include "bench.h" /* bench/ (bench_dep) */
#include "bench_ops.h"
#include "cli.h"
#include "cmd.h"

static int bench_model(int argc, char **argv)
{
    struct dray_config cfg;
    char *rest[argc + 1];
    int n_rest;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            dray_bench_model_help();
            dray_cli_help();
            return 0;
        }
    if (dray_cli_parse(argc, argv, &cfg, rest, &n_rest))
        return 2;
    return dray_bench_model(&cfg, n_rest, rest);
}

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} drivers[] = {
    {"ops", dray_bench_ops, "operator speed (matmul GOPS/GB/s, attention, small ops) vs machine limits"},
    {"model", bench_model, "end-to-end prefill and decode (logits and greedy pick every step, as dray run)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dray bench <what> [options]   (dray bench <what> -h for its options)\n\n");
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        fprintf(f, "  %-8s %s\n", drivers[i].name, drivers[i].help);
}

int dray_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        if (!strcmp(argv[1], drivers[i].name))
            return drivers[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dray bench: unknown benchmark '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
