/* dray config: print the effective configuration (defaults, then --config FILE,
 * then --set overrides) as YAML that `dray ... --config` reads back unchanged. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "dray/dray.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dray config [--config FILE] [--set KEY=VALUE]...\n"
               "       dray config --markdown\n"
               "  Print every configuration key and its effective value as YAML.\n"
               "  --markdown        print the table of keys (docs/config.md) instead\n"
               "  --config FILE     YAML config read over the defaults (docs/config.md)\n"
               "  --set KEY=VALUE   override one key, e.g. --set threads=4 or memory.kv_budget=2GiB\n");
}

int dray_cmd_config(int argc, char **argv)
{
    struct dray_config cfg;
    char err[1024];
    dray_config_defaults(&cfg);
    /* the file first, wherever it stands, so that --set always wins */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--markdown") && argc == 2) {
            dray_config_print_markdown(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--config"))
            continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "dray config: --config needs a file\n");
            return 2;
        }
        if (dray_config_load(argv[++i], &cfg, err, sizeof(err))) {
            fprintf(stderr, "dray: %s\n", err);
            return 1;
        }
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        if (strcmp(argv[i], "--set") || i + 1 >= argc) {
            fprintf(stderr, "dray config: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        char kv[1024];
        snprintf(kv, sizeof(kv), "%s", argv[++i]);
        char *eq = strchr(kv, '=');
        if (!eq) {
            fprintf(stderr, "dray config: --set expects KEY=VALUE, got '%s'\n", kv);
            return 2;
        }
        *eq = '\0';
        if (dray_config_set(&cfg, kv, eq + 1, err, sizeof(err))) {
            fprintf(stderr, "dray: --set %s: %s\n", argv[i], err);
            return 1;
        }
    }
    dray_config_print(&cfg, stdout);
    return 0;
}
