/* Options shared by the commands that load a model (run, chat, bench model):
 * --config FILE first, then flags that override single keys. */
#ifndef DRAY_TOOLS_CLI_H
#define DRAY_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "dray/dray.h"

/* Parse argv into cfg. Flags the caller handles itself are returned in rest
 * (rest[0] = argv[0]); *n_rest their count. Returns 0, or 2 (usage error, message
 * printed). Model paths relative to a config file are resolved against its folder. */
int dray_cli_parse(int argc, char **argv, struct dray_config *cfg, char **rest, int *n_rest);
/* The option lines dray_cli_parse understands, for -h. */
void dray_cli_help(void);
/* Open an engine and print what was loaded (to stderr). Returns NULL on failure
 * (message printed). */
struct dray_engine *dray_cli_open_engine(const struct dray_config *cfg, bool quiet);

/* Strict numbers for command-line flags: the whole text must be the number (digits
 * only for integers: no sign, space, suffix or empty string) and lie in [lo, hi].
 * Otherwise print "dray: FLAG expects ..., got 'TEXT'" and return -1. */
int dray_cli_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
int dray_cli_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* A finite decimal number ("22", "0.5", "1e3") in [lo, hi]. */
int dray_cli_f64(const char *flag, const char *s, double lo, double hi, double *out);

#endif
