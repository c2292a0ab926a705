/*
 * dray/dray.h — the engine API for applications that embed dray (and for the
 * dray command itself). Depends on libc only.
 *
 * Errors: functions return 0 or a negative DRAY_E* code (see dray/backend.h);
 * where they take (err, errlen) a one-line reason is written there.
 */
#ifndef DRAY_DRAY_H
#define DRAY_DRAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

const char *dray_strerror(int rc);
const char *dray_version(void);

/* ------------------------------------------------------------------ config */

enum dray_precision { DRAY_PRECISION_INT8 = 0, DRAY_PRECISION_F32 = 1 };

/* Everything a config file can say; README.md has the table of keys.
 * dray_config_defaults() fills the documented defaults. Strings are NUL-terminated. */
struct dray_config {
    char source[1024];        /* file it came from, "" for defaults */

    /* model */
    char model[1024];         /* GGUF path; "" = the model the README's set-up installs */
    uint32_t context;         /* max tokens per sequence; 0 = the model's training context */

    /* backend */
    char backend[64];         /* plugin name ("cpu", "opencl", ...) or a path to a .so */
    char fallback[64];        /* plugin to use when backend fails; "" = none (error) */
    char device[128];         /* device index ("0") or a name substring; "" = first */
    char plugin_path[1024];   /* extra ':'-separated folders searched before the defaults */
    uint32_t threads;         /* host threads for the CPU plugin; 0 = all cores */
    bool reference_kernels;   /* force the portable scalar kernels */

    /* precision */
    enum dray_precision precision; /* weights and matmuls */
    uint32_t kv_dtype;        /* DRAY_I8 or DRAY_F16 */
    uint32_t outlier_channels;/* input channels per matmul kept in f32; 0 = off */

    /* memory */
    uint64_t kv_budget;       /* bytes of device memory for the KV cache; 0 = auto */
    uint64_t host_cache;      /* bytes of host memory for the prefix cache's host tier */
    uint32_t kv_block;        /* tokens per KV block */
    bool prefix_cache;        /* reuse KV across requests/turns */

    /* scheduler */
    uint32_t max_seqs;        /* sequences decoded together */
    uint32_t chunk;           /* prefill chunk, tokens per step */

    /* sampling defaults (a request may override) */
    float temperature;        /* 0 = greedy */
    uint32_t top_k;           /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repeat_penalty;     /* 1 = off */
    uint64_t seed;
    uint32_t max_tokens;

    /* server */
    char host[128];
    uint32_t port;
    uint32_t replicas;

    int log_level;            /* enum dray_log_level */
};

void dray_config_defaults(struct dray_config *cfg);
/* Parse a YAML config file over the defaults. Unknown keys and bad values are
 * errors: err gets "FILE:LINE: key 'x': expected ..., got ...". */
int dray_config_load(const char *path, struct dray_config *cfg, char *err, size_t errlen);
/* Set one key from a string ("threads", "4"), as the file would. For CLI overrides. */
int dray_config_set(struct dray_config *cfg, const char *key, const char *value, char *err, size_t errlen);
/* Print every key and its value as YAML (for `dray config`). */
void dray_config_print(const struct dray_config *cfg, void *file /* FILE* */);

#ifdef __cplusplus
}
#endif
#endif /* DRAY_DRAY_H */
