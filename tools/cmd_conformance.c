/* dray conformance: the conformance kit's command line (plugins/conformance),
 * also built alone as dray-conformance for vendors who do not build the engine,
 * plus what needs the engine: --model runs the serving path on the plugin
 * against the CPU plugin (tools/certify.c), and --certify writes the JSON
 * certificate (tools/cert_json.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd.h"
#include "certify.h"
#include "conformance.h"
#include "flags.h"

#define PROG "dray conformance"

static void usage_model(FILE *f)
{
    fprintf(f,
            "\n  the serving path (needs the engine: `dray conformance`, not dray-conformance):\n"
            "  --model FILE        also run this GGUF on the plugin and on the CPU plugin:\n"
            "                      logits, greedy tokens through the scheduler, batched =\n"
            "                      single-sequence decode, prefix-cache reuse\n"
            "  --tokens N          new tokens per request (default 16)\n"
            "  --set KEY=VALUE     a configuration key for both engines (repeatable)\n"
            "  --certify OUT.json  write the certificate (ops, model checks, versions, date)\n");
}

int dray_cmd_conformance(int argc, char **argv)
{
    const char *model = NULL, *cert = NULL;
    uint32_t tokens = 16;
    struct dray_config cfg;
    char err[2048];
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    int n = 0, help = 0;
    if (!rest) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    dray_config_defaults(&cfg);
    /* take the engine's flags out; the kit parses the rest */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int takes = !strcmp(a, "--model") || !strcmp(a, "--certify") || !strcmp(a, "--tokens") ||
                    !strcmp(a, "--set");
        help |= i > 0 && (!strcmp(a, "-h") || !strcmp(a, "--help"));
        if (!takes || i == 0) {
            rest[n++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, PROG ": %s needs a value\n", a);
            free(rest);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) {
            model = v;
        } else if (!strcmp(a, "--certify")) {
            cert = v;
        } else if (!strcmp(a, "--tokens")) {
            if (dray_flag_u32("--tokens", v, 1, 4096, &tokens)) {
                free(rest);
                return 2;
            }
        } else {
            const char *eq = strchr(v, '=');
            char key[128];
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof(key)) {
                fprintf(stderr, PROG ": --set expects KEY=VALUE, got '%s'\n", v);
                free(rest);
                return 2;
            }
            snprintf(key, sizeof(key), "%.*s", (int)(eq - v), v);
            if (dray_config_set(&cfg, key, eq + 1, err, sizeof(err))) {
                fprintf(stderr, PROG ": --set %s: %s\n", v, err);
                free(rest);
                return 2;
            }
        }
    }
    struct dray_conformance_opts o;
    int st = dray_conformance_parse(n, rest, PROG, &o);
    free(rest);
    if (help)
        usage_model(stdout);
    if (st >= 0)
        return st;

    struct dray_conformance_report rep;
    memset(&rep, 0, sizeof(rep));
    o.report = &rep;
    int rc = dray_conformance_run(&o, stdout);
    if (rc < 0) /* the subject or the reference did not open: nothing to certify */
        return o.op && rc == DRAY_EINVAL ? 2 : 1;

    struct dray_cert_model m;
    int mrc = 0;
    if (model) {
        snprintf(cfg.model, sizeof(cfg.model), "%s", model);
        if (o.plugin_path)
            snprintf(cfg.plugin_path, sizeof(cfg.plugin_path), "%s", o.plugin_path);
        if (o.n_threads)
            cfg.threads = o.n_threads;
        mrc = dray_certify_model(&cfg, o.plugin, o.device, tokens, &m, stdout);
    }
    if (cert) {
        if (dray_cert_write(cert, &rep, rc, model ? &m : NULL, mrc, err, sizeof(err))) {
            fprintf(stderr, PROG ": %s\n", err);
            return 1;
        }
        printf("\ncertificate: %s (%s)\n", cert, rc == 0 && mrc == 0 ? "pass" : "fail");
    }
    return rc || mrc ? 1 : 0;
}
