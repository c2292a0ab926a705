/* dray serve: the OpenAI-compatible HTTP server (server/). Thin: flags to
 * config keys, open the engine, hand over to dray_serve. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd.h"
#include "dray/dray.h"

#if DRAY_HAVE_SERVER
#include "server.h"

static void usage(void)
{
    printf("usage: dray serve [options]\n"
           "  --host H              address to listen on (default 127.0.0.1: this machine only)\n"
           "  --port P              TCP port (default 8080)\n"
           "  --api-key KEY         require 'Authorization: Bearer KEY' (config key api_key;\n"
           "                        or $DRAY_API_KEY, which keeps the key out of ps)\n"
           "Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,\n"
           "GET /health, GET /metrics. SIGINT/SIGTERM drain and exit 0.\n");
    dray_cli_help();
}

/* serve's own flags, each a config key */
static const struct {
    const char *flag, *key;
} flags[] = {{"--host", "host"}, {"--port", "port"}, {"--api-key", "api_key"}};

int dray_cmd_serve(int argc, char **argv)
{
    struct dray_config cfg;
    char *rest[argc + 1], err[2048];
    int n_rest;
    dray_serve_block_signals(); /* before any thread exists, so all of them inherit it */
    if (dray_cli_parse(argc, argv, &cfg, rest, &n_rest))
        return 2;
    const char *env_key = getenv("DRAY_API_KEY"); /* below a config file's key and the flag */
    if (env_key && env_key[0] && !cfg.api_key[0] &&
        dray_config_set(&cfg, "api_key", env_key, err, sizeof(err))) {
        fprintf(stderr, "dray serve: DRAY_API_KEY: %s\n", err);
        return 2;
    }
    for (int i = 1; i < n_rest; i++) {
        size_t j = 0;
        while (j < sizeof(flags) / sizeof(flags[0]) && strcmp(rest[i], flags[j].flag))
            j++;
        if (!strcmp(rest[i], "-h") || !strcmp(rest[i], "--help")) {
            usage();
            return 0;
        }
        if (j == sizeof(flags) / sizeof(flags[0]) || i + 1 >= n_rest) {
            fprintf(stderr, "dray serve: unknown or incomplete option '%s' (dray serve -h lists them)\n",
                    rest[i]);
            return 2;
        }
        if (dray_config_set(&cfg, flags[j].key, rest[++i], err, sizeof(err))) {
            fprintf(stderr, "dray serve: %s\n", err);
            return 2;
        }
    }
    struct dray_engine *e = dray_cli_open_engine(&cfg, false);
    if (!e)
        return 1;
    int rc = dray_serve(e, &cfg, err, sizeof(err));
    if (rc)
        fprintf(stderr, "dray serve: %s\n", err);
    dray_engine_close(e);
    return rc ? 1 : 0;
}
#else
int dray_cmd_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "dray serve: this dray was built without the server (meson found no "
            "libmicrohttpd or jansson; on Debian: apt-get install libmicrohttpd-dev libjansson-dev)\n");
    return 1;
}
#endif
