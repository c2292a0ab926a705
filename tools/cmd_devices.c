/* dray devices: what the plugin registry found. Loaded plugins with their
 * devices (or why they have none), the skipped plugins with the reason and the
 * remedy, and with -v the capability matrix: one row per op, one column per
 * device, each cell the dtypes the device runs that op in. Exit 0 even when some
 * plugins were skipped: listing them is the point. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "dray/dray.h"
#include "dray/plugins.h"

static const char *const op_names[DRAY_OP_COUNT] = {
    [DRAY_OP_EMBED] = "embed",         [DRAY_OP_RMSNORM] = "rmsnorm",
    [DRAY_OP_MATMUL] = "matmul",       [DRAY_OP_ROPE] = "rope",
    [DRAY_OP_KV_STORE] = "kv_store",   [DRAY_OP_ATTENTION] = "attention",
    [DRAY_OP_GATED_ACT] = "gated_act", [DRAY_OP_ADD] = "add",
};

/* The dtypes an op names in op_dtypes; packed weights have rows of their own
 * (the host's names for the grouped formats it prepares are not shown). */
static const char *const dtype_names[DRAY_I32 + 1] = {
    [DRAY_F32] = "f32", [DRAY_F16] = "f16", [DRAY_I8] = "i8", [DRAY_I32] = "i32"};

static void usage(FILE *f)
{
    fprintf(f, "usage: dray devices [-v] [--config FILE] [--plugin-path DIRS] [--set KEY=VALUE]\n"
               "  List the plugins found on the search path, their devices, and the plugins\n"
               "  skipped with the reason.\n"
               "  -v              also print the capability matrix (ops x devices -> dtypes)\n"
               "  --config FILE   take plugin_path and log_level from this config\n"
               "  --plugin-path DIRS  extra ':'-separated plugin folders, searched first\n"
               "  --set KEY=VALUE     set a config key (plugin_path, log_level)\n"
               "  With a backend that lists several plugins (a split), also load the model\n"
               "  and print which layers run on which plugin and device, and their memory.\n");
}

/* "2.0 GiB" */
static const char *human(uint64_t bytes, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
    return buf;
}

static void flag_list(uint32_t flags, char *buf, size_t len)
{
    static const struct {
        uint32_t bit;
        const char *name;
    } names[] = {{DRAY_DEV_INT8_DOT, "int8-dot"},
                 {DRAY_DEV_FP16, "fp16"},
                 {DRAY_DEV_UNIFIED, "unified-memory"},
                 {DRAY_DEV_REFERENCE, "reference"}};
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && used < len; i++)
        if (flags & names[i].bit)
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "", names[i].name);
    if (!used)
        snprintf(buf, len, "none");
}

/* "i8,f16" or "-" */
static void dtype_list(uint32_t mask, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int t = 0; t <= DRAY_I32 && used < len; t++)
        if (mask & DRAY_DTYPE_BIT(t))
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? "," : "", dtype_names[t]);
    if (!used)
        snprintf(buf, len, "-");
}

/* Packed weight formats (ABI v3) as "q4,q4m,q4h,q4hm,q5h,q8": bits, h = f16
 * d (and m), m = with a min; then the two-level ones (v4) as q4k, q5k, q6k;
 * "-" for none. */
static void wformat_list(uint32_t mask, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    if ((mask & 0xfffu) == 0xfffu) /* every one-level format of backend.h */
        used = (size_t)snprintf(buf, len, "all 12");
    for (uint32_t i = 0; i < 12 && used < len && (mask & 0xfffu) != 0xfffu; i++)
        if (mask & (1u << i)) {
            unsigned bits = i / 4 == 0 ? 4 : i / 4 == 1 ? 5 : 8; /* DRAY_WFORMAT_BIT's order */
            used += (size_t)snprintf(buf + used, len - used, "%sq%u%s%s", used ? "," : "", bits,
                                     (i >> 1) & 1u ? "h" : "", i & 1u ? "m" : "");
        }
    for (uint32_t i = 12; i < 15 && used < len; i++)
        if (mask & (1u << i))
            used += (size_t)snprintf(buf + used, len - used, "%sq%uk", used ? "," : "", i - 8u);
    if (!used)
        snprintf(buf, len, "-");
}

static void print_device(const struct dray_plugin *p, uint32_t i)
{
    struct dray_device_props pr;
    memset(&pr, 0, sizeof(pr));
    int rc = p->ops->device_props(i, &pr);
    if (rc) {
        printf("    device %u: cannot read properties: %s\n", i, dray_strerror(rc));
        return;
    }
    pr.name[sizeof(pr.name) - 1] = pr.vendor[sizeof(pr.vendor) - 1] = '\0';
    char total[32], freeb[32], maxa[32], flags[128];
    human(pr.mem_total, total, sizeof(total));
    human(pr.max_alloc, maxa, sizeof(maxa));
    flag_list(pr.flags, flags, sizeof(flags));
    printf("    device %u: %s (%s)\n", i, pr.name, pr.vendor[0] ? pr.vendor : "unknown vendor");
    printf("      memory %s total, %s free, largest buffer %s; %u compute unit%s; flags: %s\n",
           total, pr.mem_free ? human(pr.mem_free, freeb, sizeof(freeb)) : "unknown", maxa,
           pr.compute_units, pr.compute_units == 1 ? "" : "s", flags);
}

/* Row `row` (1..5) of the limits under the matrix, for one device (ABI version
 * 2's op_caps; "-" = none declared). */
static const char *const limit_names[] = {"head_dim", "n_rot", "rope part", "matmul k",
                                          "heads"};

static void print_limits(const struct dray_op_caps *c, int row, int w)
{
    char cell[32];
    uint32_t v = 0;
    switch (row) {
    case 1: v = c->max_head_dim; break;
    case 2: v = c->max_n_rot; break;
    case 3: snprintf(cell, sizeof(cell), "%s", c->rope_partial ? "yes" : "no"); break;
    case 4: v = c->max_k; break;
    default: v = c->max_heads; break;
    }
    if (row != 3)
        snprintf(cell, sizeof(cell), v ? "%u" : "-", v);
    printf(" %-*s", w, cell);
}

/* Rows = ops, columns = every device of every plugin ("cpu:0"). */
static void print_matrix(const struct dray_registry *reg)
{
    struct col {
        char label[80];
        struct dray_op_caps caps;
        int w; /* the column's width: its longest cell */
    } *cols = NULL;
    size_t n = 0;
    for (size_t k = 0; k < dray_registry_count(reg); k++) {
        const struct dray_plugin *p = dray_registry_at(reg, k);
        for (uint32_t i = 0; i < p->n_devices; i++) {
            struct col *c = realloc(cols, (n + 1) * sizeof(*c));
            if (!c)
                break;
            cols = c;
            memset(&cols[n], 0, sizeof(cols[n]));
            char err[256];
            if (dray_plugin_caps(p, i, &cols[n].caps, err, sizeof(err)) != 0)
                continue; /* unreadable device: no column */
            snprintf(cols[n].label, sizeof(cols[n].label), "%s:%u", p->name, i);
            n++;
        }
    }
    printf("\ncapability matrix (dtypes each device runs each op in; - = not supported):\n");
    if (!n) {
        printf("  no device\n");
        free(cols);
        return;
    }
    char cell[128]; /* every dtype name, comma-separated, fits */
    for (size_t c = 0; c < n; c++) {
        cols[c].w = 11; /* "f32,f16,i8" */
        if ((int)strlen(cols[c].label) > cols[c].w)
            cols[c].w = (int)strlen(cols[c].label);
        for (int op = 0; op < DRAY_OP_COUNT; op++) { /* whole cells, never cut */
            dtype_list(op < (int)cols[c].caps.n_ops ? cols[c].caps.op_dtypes[op] : 0, cell, sizeof(cell));
            if ((int)strlen(cell) > cols[c].w)
                cols[c].w = (int)strlen(cell);
        }
        for (int r = 0; r < 2; r++) {
            wformat_list(r ? cols[c].caps.embed_wformats : cols[c].caps.matmul_wformats, cell, sizeof(cell));
            if ((int)strlen(cell) > cols[c].w)
                cols[c].w = (int)strlen(cell);
        }
    }
    printf("  %-10s", "op");
    for (size_t c = 0; c < n; c++)
        printf(" %-*s", cols[c].w, cols[c].label);
    printf("\n");
    for (int op = 0; op < DRAY_OP_COUNT; op++) {
        printf("  %-10s", op_names[op]);
        for (size_t c = 0; c < n; c++) {
            dtype_list(op < (int)cols[c].caps.n_ops ? cols[c].caps.op_dtypes[op] : 0, cell,
                       sizeof(cell));
            printf(" %-*s", cols[c].w, cell);
        }
        printf("\n");
    }
    printf("\npacked weights (ABI 3: qB = B-bit groups of 32, h = f16 scales, m = with a min):\n");
    static const char *const packed_rows[] = {"matmul", "embed", "passes"};
    for (int r = 0; r < 3; r++) {
        printf("  %-10s", packed_rows[r]);
        for (size_t c = 0; c < n; c++) {
            const struct dray_op_caps *k = &cols[c].caps;
            if (r < 2)
                wformat_list(r ? k->embed_wformats : k->matmul_wformats, cell, sizeof(cell));
            else
                snprintf(cell, sizeof(cell), "%s", (k->matmul_passes & 3u) == 3u ? "1,2"
                                                   : k->matmul_passes & 1u     ? "1"
                                                                               : "-");
            printf(" %-*s", cols[c].w, cell);
        }
        printf("\n");
    }
    printf("\nlimits (largest value each op accepts; - = none declared):\n");
    for (int l = 1; l <= 5; l++) {
        printf("  %-10s", limit_names[l - 1]);
        for (size_t c = 0; c < n; c++)
            print_limits(&cols[c].caps, l, cols[c].w);
        printf("\n");
    }
    free(cols);
}

/* backend lists several plugins: load the model as configured and say which
 * layers run on which plugin and device, with the memory each uses. */
static int print_split(const struct dray_config *cfg)
{
    char err[2048];
    struct dray_engine *e = NULL;
    if (dray_engine_open(cfg, &e, err, sizeof(err))) {
        fprintf(stderr, "dray: split over %s: %s\n", cfg->backend, err);
        return 1;
    }
    const struct dray_engine_info *in = dray_engine_get_info(e);
    printf("split of %s over %s:\n", in->model_name, cfg->backend);
    for (const char *l = in->placement; *l;) {
        size_t n = strcspn(l, "\n");
        printf("  %.*s\n", (int)n, l);
        l += n + (l[n] == '\n');
    }
    dray_engine_close(e);
    return 0;
}

int dray_cmd_devices(int argc, char **argv)
{
    int verbose = 0;
    struct dray_config cfg;
    char err[1024];
    dray_config_defaults(&cfg);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose")) {
            verbose = 1;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            if (dray_config_load(argv[++i], &cfg, err, sizeof(err))) {
                fprintf(stderr, "dray: %s\n", err);
                return 1;
            }
            dray_log_set_level(cfg.log_level);
        } else if (!strcmp(argv[i], "--plugin-path") && i + 1 < argc) {
            if (dray_config_set(&cfg, "plugin_path", argv[++i], err, sizeof(err))) {
                fprintf(stderr, "dray: --plugin-path: %s\n", err);
                return 2;
            }
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            char kv[2048], *eq;
            snprintf(kv, sizeof(kv), "%s", argv[++i]);
            if (!(eq = strchr(kv, '='))) {
                fprintf(stderr, "dray devices: --set takes KEY=VALUE, got '%s'\n", kv);
                return 2;
            }
            *eq = 0;
            if (dray_config_set(&cfg, kv, eq + 1, err, sizeof(err))) {
                fprintf(stderr, "dray: --set %s: %s\n", kv, err);
                return 2;
            }
            dray_log_set_level(cfg.log_level);
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "dray devices: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }

    struct dray_registry *reg = NULL;
    if (dray_registry_open(cfg.plugin_path[0] ? cfg.plugin_path : NULL, &reg, err, sizeof(err))) {
        fprintf(stderr, "dray: %s\n", err);
        return 1;
    }
    size_t n = dray_registry_count(reg);
    printf("plugins loaded: %zu\n", n);
    for (size_t k = 0; k < n; k++) {
        const struct dray_plugin *p = dray_registry_at(reg, k);
        printf("  %s  (ABI %u)  %s\n    %s\n", p->name, p->abi, p->path, p->ops->describe);
        if (!p->n_devices)
            printf("    %s: no device: %s\n", p->name, p->nodev);
        for (uint32_t i = 0; i < p->n_devices; i++)
            print_device(p, i);
    }
    size_t ns = dray_registry_n_skipped(reg);
    printf("plugins skipped: %zu\n", ns);
    for (size_t k = 0; k < ns; k++) {
        const struct dray_skipped *s = dray_registry_skipped_at(reg, k);
        printf("  %s\n    %s\n", s->path, s->reason);
    }
    if (verbose)
        print_matrix(reg);
    dray_registry_close(reg);
    return strchr(cfg.backend, ',') ? print_split(&cfg) : 0;
}
