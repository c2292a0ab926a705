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

/* ------------------------------------------------------------------ engine */

/* An engine is one model on one device: registry → plugin/device (with the
 * configured fallback) → GGUF → tokenizer → prepared weights → KV cache. */
struct dray_engine;

struct dray_engine_info {
    const char *model_path, *model_name, *arch;
    const char *plugin, *device;       /* plugin name and device name actually used */
    uint32_t n_layer, n_embd, n_head, n_kv_head, head_dim, n_vocab, n_ctx_train;
    uint32_t context;                  /* tokens per sequence this engine allows */
    uint64_t n_params, weight_bytes;
    uint64_t kv_bytes;                 /* device bytes of the KV pools */
    uint64_t kv_bytes_per_token;       /* growth per token of context (global layers) */
    uint64_t kv_bytes_per_seq_fixed;   /* fixed per-sequence cost of window layers */
    uint32_t max_seqs;
    const char *precision, *kv_dtype;  /* "int8"/"f32", "int8"/"f16" */
    double load_s;                     /* time to open, check and prepare everything */
};

int dray_engine_open(const struct dray_config *cfg, struct dray_engine **out, char *err, size_t errlen);
void dray_engine_close(struct dray_engine *e);
const struct dray_engine_info *dray_engine_get_info(const struct dray_engine *e);

/* Tokenize with the model's tokenizer. add_bos follows the model's metadata;
 * parse_special turns "<start_of_turn>" etc. into their ids. *ids is malloc'd. */
int dray_engine_tokenize(const struct dray_engine *e, const char *text, bool add_bos,
                         bool parse_special, int32_t **ids, size_t *n, char *err, size_t errlen);

struct dray_gen_params {
    float temperature;        /* 0 = greedy */
    uint32_t top_k;           /* 0 = off */
    float top_p, min_p;       /* 1, 0 = off */
    float repeat_penalty;     /* 1 = off */
    uint32_t repeat_last_n;   /* tokens the penalty looks back over */
    uint64_t seed;            /* 0 = from the clock */
    uint32_t max_tokens;      /* new tokens at most */
    const char *const *stop;  /* stop strings (not emitted), n_stop of them */
    uint32_t n_stop;
};
void dray_gen_params_from_config(const struct dray_config *cfg, struct dray_gen_params *p);

/* Streamed output: called with complete UTF-8 text as it is generated, and with
 * the id of each generated token (text may be empty for a token that completes
 * nothing yet). Return non-zero to stop generating. */
typedef int (*dray_emit_fn)(void *user, const char *text, size_t len, int32_t id);

struct dray_gen_stats {
    uint32_t n_prompt;        /* tokens given */
    uint32_t n_reused;        /* of them, already in the session's KV (not recomputed) */
    uint32_t n_prefilled;     /* computed in prefill */
    uint32_t n_generated;
    double prefill_s, decode_s;
    const char *stop_reason;  /* "eog", "stop string", "max tokens", "context full", "caller" */
};

/* A session is one sequence whose KV lives across calls: a chat keeps one
 * session so each turn prefills only its new tokens. */
struct dray_session;
int dray_session_new(struct dray_engine *e, struct dray_session **out, char *err, size_t errlen);
void dray_session_free(struct dray_session *s);
uint32_t dray_session_len(const struct dray_session *s); /* tokens in its KV */

/* Append ids to the session (prefill), then generate up to p->max_tokens tokens.
 * A prompt that does not fit the context is an error (nothing is truncated). */
int dray_session_generate(struct dray_session *s, const int32_t *ids, size_t n,
                          const struct dray_gen_params *p, dray_emit_fn emit, void *user,
                          struct dray_gen_stats *st, char *err, size_t errlen);
/* Prefill ids and write the logits of every one of them, f32 [n][n_vocab], to
 * logits_out (a stdio FILE*), for checking against a reference. */
int dray_session_dump_logits(struct dray_session *s, const int32_t *ids, size_t n,
                             void *logits_out, char *err, size_t errlen);
/* Prefill ids into the session without generating (benchmarks, schedulers). */
int dray_session_prefill(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen);
/* One decode step for n sessions of the same engine together (continuous
 * batching): session i takes ids[i]; logits (may be NULL) gets [n][n_vocab]. */
int dray_sessions_decode(struct dray_session *const *ss, uint32_t n, const int32_t *ids,
                         float *logits, char *err, size_t errlen);
/* One chat turn: renders the model's chat template for the new user message
 * (plus the system prompt on the first turn), prefills only the new tokens and
 * generates the reply, which stays in the session's KV for the next turn. */
int dray_chat_turn(struct dray_session *s, const char *system, const char *user_text,
                   const struct dray_gen_params *p, dray_emit_fn emit, void *user,
                   struct dray_gen_stats *st, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* DRAY_DRAY_H */
