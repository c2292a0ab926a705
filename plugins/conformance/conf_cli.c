/* The conformance kit's command line, shared by `dray conformance` and the
 * standalone `dray-conformance` (which needs no engine): certify a plugin's ops
 * against the CPU reference kernels. Exit 0 when every mandatory op passes, 1 on
 * any failure, 2 on usage errors. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "dray/backend.h"

static void usage(FILE *f, const char *prog)
{
    fprintf(f, "usage: %s --plugin NAME|PATH [--device D] [--seed N] [--reps N]\n", prog);
    fprintf(f,
            "                        [--op OP] [--time-reps N] [--no-timing] [-t N] [-v]\n"
            "  Run every op of the plugin on random shapes and compare with the CPU plugin's\n"
            "  scalar reference kernels, within the tolerances of backend.h; also time each op.\n"
            "  --plugin NAME|PATH  plugin to check: a name (cpu, opencl, ...) or a .so file;\n"
            "                      cpu means the CPU plugin's fast kernels\n"
            "  --device D          device index or part of its name (default: the first)\n"
            "  --seed N            random seed (default 1); each case is reproducible\n"
            "  --reps N            random cases per op and dtype (default 12)\n"
            "  --op OP             only this op: embed rmsnorm matmul weight_create rope\n"
            "                      kv_store attention gated_act add (packed weights, ABI 3:\n"
            "                      a row per format the plugin declares, and per pass count;\n"
            "                      the two-level formats Q4_K/Q5_K/Q6_K from ABI 4)\n"
            "  --time-reps N       timed runs per op, median reported (default 9)\n"
            "  --no-timing         skip timing\n"
            "  -t, --threads N     host threads for CPU plugins (default: all)\n"
            "  --plugin-path DIRS  extra ':'-separated plugin folders\n"
            "  -v                  one line per case\n");
}

static int parse_u64(const char *prog, const char *flag, const char *s, uint64_t max, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v = 0;
    errno = 0;
    if (isdigit((unsigned char)s[0])) /* strtoull takes signs and leading spaces */
        v = strtoull(s, &end, 10);
    if (!end || errno || *end || v > max) {
        fprintf(stderr, "%s: %s expects an integer 0..%llu, got '%s'\n", prog, flag,
                (unsigned long long)max, s);
        return -1;
    }
    *out = v;
    return 0;
}

int dray_conformance_parse(int argc, char **argv, const char *prog, struct dray_conformance_opts *op)
{
    struct dray_conformance_opts o;
    memset(&o, 0, sizeof(o));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout, prog);
            return 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o.verbose = 1;
        } else if (!strcmp(a, "--no-timing")) {
            o.no_timing = 1;
        } else if (!val) {
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            usage(stderr, prog);
            return 2;
        } else if (!strcmp(a, "--plugin")) {
            o.plugin = argv[++i];
        } else if (!strcmp(a, "--device")) {
            o.device = argv[++i];
        } else if (!strcmp(a, "--op")) {
            o.op = argv[++i];
        } else if (!strcmp(a, "--plugin-path")) {
            o.plugin_path = argv[++i];
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(prog, a, argv[++i], UINT64_MAX, &u))
                return 2;
            o.seed = u;
        } else if (!strcmp(a, "--reps") || !strcmp(a, "--time-reps")) {
            if (parse_u64(prog, a, argv[++i], 100000, &u) || u == 0) {
                if (u == 0)
                    fprintf(stderr, "%s: %s must be at least 1\n", prog, a);
                return 2;
            }
            if (!strcmp(a, "--reps"))
                o.reps = (uint32_t)u;
            else
                o.time_reps = (uint32_t)u;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (parse_u64(prog, a, argv[++i], 1024, &u))
                return 2;
            o.n_threads = (uint32_t)u;
        } else {
            fprintf(stderr, "%s: unexpected argument '%s'\n", prog, a);
            usage(stderr, prog);
            return 2;
        }
    }
    if (!o.plugin) {
        fprintf(stderr, "%s: --plugin is required\n", prog);
        usage(stderr, prog);
        return 2;
    }
    *op = o;
    return -1;
}

int dray_conformance_main(int argc, char **argv, const char *prog)
{
    struct dray_conformance_opts o;
    int st = dray_conformance_parse(argc, argv, prog, &o);
    if (st >= 0)
        return st;
    int rc = dray_conformance_run(&o, stdout);
    if (rc < 0)
        return o.op && rc == DRAY_EINVAL ? 2 : 1;
    return rc;
}
