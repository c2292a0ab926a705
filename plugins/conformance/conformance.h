/* The conformance runner: checks every op of a plugin against the CPU plugin's
 * scalar reference kernels on randomized shapes, through the op table only
 * (alloc / upload / op / download), and times each op; packed weights
 * (version 3: weight_create, then matmul or embed on the handle) against the
 * kit's own reference, one row per declared format and pass count. A vendor's plugin passes
 * when every mandatory op passes within the tolerance backend.h states for it.
 * The kit needs backend.h only: it loads plugins itself (conf_loader.c). */
#ifndef DRAY_CONFORMANCE_H
#define DRAY_CONFORMANCE_H

#include <stdint.h>
#include <stdio.h>

struct dray_conformance_report;

struct dray_conformance_opts {
    const char *plugin;      /* subject: plugin name ("opencl") or path to a .so */
    const char *device;      /* subject's device: NULL/"" = first, index, or name part */
    const char *plugin_path; /* extra ':'-separated plugin folders; NULL = none */
    const char *op;          /* only this op ("matmul"); NULL/"" = every op */
    uint64_t seed;           /* random shapes and data; 0 = 1 */
    uint32_t reps;           /* randomized cases per op and dtype; 0 = 12 */
    uint32_t time_reps;      /* timed runs per op (median reported); 0 = 9 */
    uint32_t no_timing;      /* 1: skip timing */
    uint32_t n_threads;      /* host threads for CPU plugins; 0 = all */
    int verbose;             /* 1: a line per case */
    struct dray_conformance_report *report; /* filled when non-NULL (certificates) */
};

/* What a run found, for a machine-readable certificate (`dray conformance
 * --certify`): the subject as loaded, and one row per op variant checked. */
#define DRAY_CONF_MAX_ROWS 96 /* 62 variants in version 4 */
struct dray_conformance_row {
    char op[16];
    char dtype[16];          /* "i8", a packed format "q4-f16-min" (+ "-x2": two passes), "refusals" */
    char verdict[24];        /* "pass", "FAIL", "FAIL unsupported", "not supported", ... */
    int passed;              /* 1: ran and every case passed */
    uint32_t cases, failed;
    double max_abs, max_rel, nmse;
    char tolerance[48];
};
struct dray_conformance_report {
    char plugin[64], path[1024];  /* ops->name and the file loaded */
    uint32_t abi;                 /* negotiated ABI version */
    char device[128], vendor[64];
    uint32_t device_index;
    uint64_t seed;
    uint32_t reps;
    int opened;                   /* 1 when both sides were opened (rows are valid) */
    size_t n_rows, n_run, n_pass;
    struct dray_conformance_row rows[DRAY_CONF_MAX_ROWS];
};

/* Run the suite and print the per-op table to out. Returns 0 when every
 * mandatory op passed, 1 when anything failed, or a negative DRAY_E* code when
 * the run could not start (plugin or reference missing; reason printed to out). */
int dray_conformance_run(const struct dray_conformance_opts *o, FILE *out);

/* The command line (--plugin, --device, --op, ...): `dray conformance` and the
 * standalone dray-conformance both call this; prog names the command in
 * messages. Returns the exit status: 0 pass, 1 fail, 2 usage error. */
int dray_conformance_main(int argc, char **argv, const char *prog);
/* The same, with the parsed options handed back instead of run: returns -1 when
 * the options are good (then the caller runs dray_conformance_run with *o), or
 * the exit status (0 after -h, 2 on a usage error). Strings point into argv. */
int dray_conformance_parse(int argc, char **argv, const char *prog, struct dray_conformance_opts *o);

#endif
