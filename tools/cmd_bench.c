/* dray bench: dispatches to the benchmark drivers in bench/. Each driver is a
 * row of the table; a driver whose file is not built (weak symbol) is not listed. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"

__attribute__((weak)) int dray_bench_ops(int argc, char **argv);
__attribute__((weak)) int dray_bench_model(int argc, char **argv);

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} drivers[] = {
    {"ops", dray_bench_ops, "operator speed (matmul GOPS/GB/s, attention, small ops) vs machine limits"},
    {"model", dray_bench_model, "end-to-end prefill and decode speed of a model"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dray bench <what> [options]   (dray bench <what> -h for its options)\n\n");
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        if (drivers[i].fn)
            fprintf(f, "  %-8s %s\n", drivers[i].name, drivers[i].help);
}

int dray_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        if (drivers[i].fn && !strcmp(argv[1], drivers[i].name))
            return drivers[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dray bench: unknown benchmark '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
