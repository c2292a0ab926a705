#include "cli.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* flag → config key; value flags only */
static const struct {
    const char *flag, *key;
} overrides[] = {
    {"-m", "model"}, {"--model", "model"}, {"-c", "context"}, {"--ctx", "context"},
    {"-n", "max_tokens"}, {"--temp", "temperature"}, {"--seed", "seed"}, {"--top-k", "top_k"},
    {"--top-p", "top_p"}, {"--min-p", "min_p"}, {"--repeat-penalty", "repeat_penalty"},
    {"--precision", "precision"}, {"--backend", "backend"}, {"--fallback", "fallback"},
    {"--device", "device"}, {"-t", "threads"}, {"--threads", "threads"}, {"--kv-dtype", "kv_dtype"},
    {"--chunk", "chunk"}, {"--kv-budget", "kv_budget"}, {"--kv-block", "kv_block"},
    {"--log", "log_level"},
};
#define N_OVERRIDES (sizeof(overrides) / sizeof(overrides[0]))

void dray_cli_help(void)
{
    printf("  --config FILE         YAML config (see README: configuration)\n"
           "  -m, --model FILE      GGUF model file\n"
           "  -c, --ctx N           context length in tokens (0 = the model's)\n"
           "  -n N                  most new tokens\n"
           "  --temp T              temperature (0 = greedy)\n"
           "  --top-k K --top-p P --min-p P --repeat-penalty R --seed S\n"
           "  --precision int8|int8g|w4a8|f32  weights and matmuls\n"
           "  --kv-dtype int8|f16   KV cache\n"
           "  --backend NAME --fallback NAME --device D -t, --threads N\n"
           "  --chunk N             prefill tokens per step\n"
           "  --set KEY=VALUE       any config key\n");
}

static int set(struct dray_config *cfg, const char *flag, const char *key, const char *val)
{
    char err[512];
    if (dray_config_set(cfg, key, val, err, sizeof(err))) {
        fprintf(stderr, "dray: %s: %s\n", flag, err);
        return 2;
    }
    return 0;
}

static void resolve_model_path(struct dray_config *cfg, const char *config_path)
{
    if (!cfg->model[0] || cfg->model[0] == '/' || !config_path)
        return;
    char dir[1024], joined[2048];
    snprintf(dir, sizeof(dir), "%s", config_path);
    int n = snprintf(joined, sizeof(joined), "%s/%s", dirname(dir), cfg->model);
    if (n > 0 && (size_t)n < sizeof(cfg->model))
        memcpy(cfg->model, joined, (size_t)n + 1);
}

int dray_cli_parse(int argc, char **argv, struct dray_config *cfg, char **rest, int *n_rest)
{
    return dray_cli_parse_seqs(argc, argv, cfg, rest, n_rest, 0);
}

int dray_cli_parse_seqs(int argc, char **argv, struct dray_config *cfg, char **rest, int *n_rest,
                        uint32_t seqs)
{
    char err[1024];
    const char *config_path = NULL;
    dray_config_defaults(cfg);
    int default_log_level = cfg->log_level;
    uint32_t default_seqs = seqs ? seqs : cfg->max_seqs;
    cfg->log_level = -1; /* set by the config file, --set or --log only if still -1 below */
    cfg->max_seqs = 0;   /* likewise: the command's own default below */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config_path = argv[++i];
    if (config_path) {
        if (dray_config_load(config_path, cfg, err, sizeof(err))) {
            fprintf(stderr, "dray: %s\n", err);
            return 2;
        }
        resolve_model_path(cfg, config_path);
    }
    *n_rest = 0;
    rest[(*n_rest)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            char kv[1024], *eq;
            snprintf(kv, sizeof(kv), "%s", argv[++i]);
            if (!(eq = strchr(kv, '='))) {
                fprintf(stderr, "dray: --set expects KEY=VALUE, got '%s'\n", kv);
                return 2;
            }
            *eq = 0;
            if (set(cfg, "--set", kv, eq + 1))
                return 2;
            continue;
        }
        size_t j = 0;
        while (j < N_OVERRIDES && strcmp(argv[i], overrides[j].flag))
            j++;
        if (j == N_OVERRIDES) {
            rest[(*n_rest)++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dray: %s needs a value\n", argv[i]);
            return 2;
        }
        if (set(cfg, argv[i], overrides[j].key, argv[i + 1]))
            return 2;
        i++;
    }
    rest[*n_rest] = NULL;
    /* log_level applies to every command that takes a config, from here on; left
     * unset, $DRAY_LOG (or the default) stays in force */
    if (cfg->log_level < 0)
        cfg->log_level = default_log_level;
    else
        dray_log_set_level(cfg->log_level);
    if (!cfg->max_seqs)
        cfg->max_seqs = default_seqs;
    return 0;
}

struct dray_engine *dray_cli_open_engine(const struct dray_config *cfg, bool quiet)
{
    char err[2048];
    struct dray_engine *e = NULL;
    int rc = dray_engine_open(cfg, &e, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "dray: %s\n", err);
        return NULL;
    }
    if (quiet)
        return e;
    const struct dray_engine_info *in = dray_engine_get_info(e);
    fprintf(stderr,
            "dray: model %s (%s, %.1fM params, %u layers, %u/%u heads, vocab %u, trained context %u)\n"
            "dray: weights %s (activations %s, head %s): %.1f MiB on %s [%s]; KV %s: %.1f MiB for %u seq x %u tokens "
            "(%llu B/token global + %.1f KiB/seq window); ready in %.2f s\n",
            in->model_name, in->arch, in->n_params / 1e6, in->n_layer, in->n_head, in->n_kv_head,
            in->n_vocab, in->n_ctx_train, in->precision, in->activations, in->head, in->weight_bytes / 1048576.0, in->plugin,
            in->device, in->kv_dtype, in->kv_bytes / 1048576.0, in->max_seqs, in->context,
            (unsigned long long)in->kv_bytes_per_token, in->kv_bytes_per_seq_fixed / 1024.0, in->load_s);
    for (const char *l = in->placement; l && *l;) { /* a split: one line per device */
        size_t n = strcspn(l, "\n");
        fprintf(stderr, "dray: split: %.*s\n", (int)n, l);
        l += n + (l[n] == '\n');
    }
    return e;
}
