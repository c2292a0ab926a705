/* Options shared by the commands that load a model (run, chat, bench model):
 * --config FILE first, then flags that override single keys. */
#ifndef DRAY_TOOLS_CLI_H
#define DRAY_TOOLS_CLI_H

#include <stdbool.h>

#include "dray/dray.h"

/* Parse argv into cfg. Flags the caller handles itself are returned in rest
 * (rest[0] = argv[0]); *n_rest their count. Returns 0, or 2 (usage error, message
 * printed). Model paths relative to a config file are resolved against its folder. */
int dray_cli_parse(int argc, char **argv, struct dray_config *cfg, char **rest, int *n_rest);
/* The same for a command that needs only `seqs` sequences at once (run and
 * perplexity: 1), so the KV is sized for those unless the config file or
 * --set max_seqs asks for more; seqs 0 keeps the config's default. */
int dray_cli_parse_seqs(int argc, char **argv, struct dray_config *cfg, char **rest, int *n_rest,
                        uint32_t seqs);
/* The option lines dray_cli_parse understands, for -h. */
void dray_cli_help(void);
/* Open an engine and print what was loaded (to stderr). Returns NULL on failure
 * (message printed). */
struct dray_engine *dray_cli_open_engine(const struct dray_config *cfg, bool quiet);

#endif
