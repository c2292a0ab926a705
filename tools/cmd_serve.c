/* dray serve: the OpenAI-compatible HTTP server (server/). Thin: flags to
 * config keys, open the engines (one per replica), hand over to dray_serve. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
           "  --replicas N          engines in this process, one per device (config key replicas;\n"
           "                        see docs/server.md)\n"
           "  --api-key KEY         require 'Authorization: Bearer KEY' (config key api_key;\n"
           "                        or $DRAY_API_KEY, which keeps the key out of ps)\n"
           "  --served-model-name N[,N...]  the model's names for clients (config key\n"
           "                        served_model_name; default the GGUF file's name)\n"
           "Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,\n"
           "GET /v1/models/{id}, POST /tokenize, POST /detokenize, GET /health, GET /metrics.\n"
           "SIGINT/SIGTERM drain and exit 0.\n");
    dray_cli_help();
}

/* Open one engine per replica (replicas: N), each on its device with its
 * threads (dray_serve_replica_config), then serve them all. A replica that
 * does not open stops the start: a server short of the replicas it was
 * configured with would hold each conversation on a different one than the
 * same config elsewhere (the hash is over the replicas). */
static int serve(const struct dray_config *cfg)
{
    char err[2048];
    uint32_t n = cfg->replicas ? cfg->replicas : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    struct dray_engine **engines = calloc(n, sizeof(*engines));
    int rc = engines ? 0 : 1;
    for (uint32_t i = 0; !rc && i < n; i++) {
        struct dray_config rc_cfg;
        if (dray_serve_replica_config(cfg, i, cores, &rc_cfg, err, sizeof(err))) {
            fprintf(stderr, "dray serve: %s\n", err);
            rc = 1;
            break;
        }
        if (n > 1)
            fprintf(stderr, "dray serve: replica %u of %u: plugin %s, device '%s', %u threads%s\n", i, n,
                    rc_cfg.backend, rc_cfg.device, rc_cfg.threads, rc_cfg.threads ? "" : " (all cores)");
        if (!(engines[i] = dray_cli_open_engine(&rc_cfg, false))) {
            fprintf(stderr, "dray serve: replica %u of %u (device '%s') did not open (the line above "
                    "says why); not serving\n", i, n, rc_cfg.device);
            rc = 1;
        }
    }
    if (!rc && dray_serve(engines, n, cfg, err, sizeof(err))) {
        fprintf(stderr, "dray serve: %s\n", err);
        rc = 1;
    }
    for (uint32_t i = 0; engines && i < n; i++)
        if (engines[i])
            dray_engine_close(engines[i]);
    free(engines);
    return rc;
}

/* serve's own flags, each a config key */
static const struct {
    const char *flag, *key;
} flags[] = {{"--host", "host"}, {"--port", "port"}, {"--replicas", "replicas"},
                 {"--api-key", "api_key"}, {"--served-model-name", "served_model_name"}};

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
    return serve(&cfg);
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
