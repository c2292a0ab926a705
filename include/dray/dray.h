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

/* Engine-level codes beyond backend.h's (plugins never return these). */
enum dray_engine_status {
    DRAY_EBUSY = -20,     /* the request queue is full: try again later */
    DRAY_ECANCELED = -21, /* cancelled, or the scheduler is shutting down */
};

const char *dray_strerror(int rc);
const char *dray_version(void);
/* Messages below this level (enum dray_log_level in backend.h) are dropped; the
 * config key log_level and $DRAY_LOG set it too. */
void dray_log_set_level(int level);

/* ------------------------------------------------------------------ config */

/* INT8: int8 weights with a scale per output channel, activations per token (W8A8).
 * INT8G: int8 weights and activations with a scale per group of 32 inputs.
 * W4A8: 4-bit weights (scale and min per group of 32) where the file's weights
 *   are 4-bit, INT8G elsewhere. F32: the checking path.
 * INT8G and W4A8 need a device that declares the grouped dtypes; elsewhere the
 * engine uses INT8 and says so. */
enum dray_precision {
    DRAY_PRECISION_INT8 = 0,
    DRAY_PRECISION_F32 = 1,
    DRAY_PRECISION_INT8G = 2,
    DRAY_PRECISION_W4A8 = 3,
};

/* The output head under INT8G/W4A8 (other precisions ignore it). INT8G: the
 * head keeps int8 groups where the file's head is wider than 4 bits (Gemma's
 * Q8_0 head). W4A8: 4-bit groups whatever the file holds, rounding a wider head;
 * a head tied to an 8-bit embedding table gets its own 4-bit copy and the
 * logits of its most likely tokens are computed again from the table
 * (lossy without that). AUTO: dray's default choice (INT8G). */
enum dray_head_precision {
    DRAY_HEAD_AUTO = 0,
    DRAY_HEAD_INT8G = 1,
    DRAY_HEAD_W4A8 = 2,
};

/* The activations of the grouped matmuls (precision INT8G or W4A8; the output
 * head keeps one pass when it holds more weight bytes than all layers).
 * INT8: one int8 pass per group of 32 inputs.
 * INT8X2: two int8 passes, the second over the first's rounding error (about 15
 * bits; the weights are read once for both, so decoding costs about the same and
 * prefill matmuls about twice the int8 work).
 * INT8X2 needs a device that declares it; elsewhere the engine uses INT8 and
 * says so.
 * AUTO: what the model's architecture declares (models/: the family whose
 * activations need the second pass takes it; see docs/config.md). */
enum dray_activations {
    DRAY_ACTIVATIONS_INT8 = 0,
    DRAY_ACTIVATIONS_INT8X2 = 1,
    DRAY_ACTIVATIONS_AUTO = 2,
};

/* Everything a config file can say; README.md has the table of keys.
 * dray_config_defaults() fills the documented defaults. Strings are NUL-terminated. */
struct dray_config {
    char source[1024];        /* file it came from, "" for defaults */

    /* model */
    char model[1024];         /* GGUF path; "" = the model the README's set-up installs */
    uint32_t context;         /* max tokens per sequence; 0 = the model's training context */
    char chat_template[32];   /* "gemma", "chatml"; "" = recognised from the model */

    /* backend */
    char backend[256];        /* plugin name ("cpu", "opencl", ...) or a path to a .so;
                               * a comma-separated list splits the model's layers */
    char fallback[64];        /* plugin to use when backend fails; "" = none (error) */
    char device[128];         /* device index ("0") or a name substring; "" = first */
    char plugin_path[1024];   /* extra ':'-separated folders searched before the defaults */
    uint32_t threads;         /* host threads for the CPU plugin; 0 = all cores */
    bool reference_kernels;   /* force the portable scalar kernels */
    char layer_split[128];    /* split: share of the layers per backend entry ("3,1"); "" = by memory */
    char device_memory[256];  /* split: bytes each backend entry may hold ("8G,0", 0 = no cap) */
    uint32_t head_device;     /* split: backend entry (1-based) of the embedding and head; 0 = auto */
    uint32_t micro_batches;   /* split: micro-batches a step is cut into; 0 = one per device */
    char distributed[32];     /* "" = one process; "mpi" = ranks of mpirun hold layer ranges */
    uint32_t distributed_timeout; /* seconds rank 0 waits for another rank's answer; 0 = for ever */
    uint32_t tensor_parallel; /* distributed: ranks that split every layer's heads and FFN; 1 = none */

    /* precision */
    enum dray_precision precision; /* weights and matmuls */
    enum dray_head_precision head_precision; /* the output head under int8g/w4a8 */
    uint32_t head_rescore;    /* most 4-bit head logits per row recomputed from the 8-bit table */
    float head_rescore_tail;  /* 4-bit probability a row may leave unrescored */
    uint32_t kv_dtype;        /* DRAY_I8 or DRAY_F16 */
    uint32_t outlier_channels;/* input channels per matmul kept in f32; 0 = off */
    enum dray_activations activations; /* of grouped matmuls (int8g, w4a8) */

    /* memory */
    uint64_t kv_budget;       /* bytes of device memory for the KV cache; 0 = auto */
    uint64_t host_cache;      /* bytes of host memory for the prefix cache's host tier */
    uint32_t kv_block;        /* tokens per KV block */
    bool prefix_cache;        /* reuse KV across requests/turns */
    bool prepared_layouts;    /* packed weights kept in the cache folder, mapped at later starts */

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
    uint32_t lookup_draft;    /* speculative decoding by prompt lookup: tokens per draft, 0 = off */

    /* server */
    char host[128];
    uint32_t port;
    uint32_t replicas;
    char api_key[256];        /* "" = no key; else requests need Authorization: Bearer KEY */
    char served_model_name[1024]; /* "" = the GGUF file's name; else comma-separated names
                               * requests may use, the first the one responses report */
    uint64_t max_body;        /* bytes of a request body; larger -> 413 */
    uint32_t max_queue;       /* requests waiting beyond the running ones; more -> 429 */
    uint32_t max_messages;    /* messages per chat request */
    uint32_t max_prompt_tokens;     /* tokens of a rendered prompt; 0 = the context */
    uint32_t max_completion_tokens; /* largest max_tokens a request may ask for */
    uint32_t shutdown_grace;  /* seconds in-flight requests may finish after SIGTERM */
    uint32_t max_connections; /* open HTTP connections (a thread each); more are closed at accept */
    uint32_t max_connections_per_ip; /* open connections from one client address; 0 = no cap */
    uint32_t header_timeout;  /* seconds a connection may sit idle while no request is being answered */

    /* grammars (a request's GBNF, and what response_format and tools compile to) */
    uint32_t grammar_max_elements;     /* elements once repetitions are expanded */
    uint32_t grammar_max_alternatives; /* alternatives of one rule (groups count as rules) */
    uint32_t grammar_max_depth;        /* nesting of parentheses */
    uint32_t grammar_step_stacks;      /* parse-stack entries one transition may build */
    uint32_t grammar_step_ms;          /* milliseconds of grammar work one step may take */
    uint64_t grammar_cache;            /* bytes of a sequence's automaton (state cache) */

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
/* Print the table of keys (key, section, type, default, meaning) as Markdown:
 * docs/config.md's table is this output (`dray config --markdown`). */
void dray_config_print_markdown(void *file /* FILE* */);
/* List-valued keys (backend, device, layer_split, served_model_name, ...) are
 * comma-separated: the number of entries ("" has none) and entry i with its
 * spaces and tabs trimmed ("" past the end). */
uint32_t dray_config_list_len(const char *list);
void dray_config_list_entry(const char *list, uint32_t i, char *out, size_t cap);

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
    const char *calibration;           /* int8 outlier channels: "none", "computed" (and
                                        * stored in the calibration cache), "cached" */
    uint64_t step_weight_bytes;        /* weight bytes a decode step reads (weight_bytes
                                        * less an embedding table the head does not share) */
    uint64_t rescore_bytes;            /* a rescored 4-bit head (config head_rescore): bytes
                                        * read and written per candidate it rescores, on top of
                                        * step_weight_bytes; 0 = none */
    const char *activations;           /* of the grouped matmuls as run: "int8", "int8x2"
                                        * ("auto" resolved, device fallback applied) */
    const char *placement;             /* a split (backend lists plugins): one line per device,
                                        * its layers, weights and KV; "" on one device */
    const char *head;                  /* the output head as run: "8-bit groups", "4-bit
                                        * rescored", "4-bit groups", "int8" or "f32" */
};

int dray_engine_open(const struct dray_config *cfg, struct dray_engine **out, char *err, size_t errlen);
/* A split's work so far (backend lists plugins; core/split.h); n_dev = 0 on one
 * device. Busy: time in each device's tasks; overlap: time two or more were
 * busy at once (pipelining); hops: hidden states moved between devices. */
struct dray_split_report {
    uint32_t n_dev;
    uint64_t steps, pipelined_steps, hops, hop_bytes;
    double wall_s, overlap_s, busy_s[8];
    uint64_t remote_calls; /* distributed: stage calls to other ranks, and their time */
    double wire_s;         /* less the ranks' compute: messages and waits, both ways */
    uint64_t allreduces;   /* tensor parallel: rank 0's all-reduces (two a layer) and their time */
    double allreduce_s;
    char lost[512];        /* distributed: why a rank stopped answering ("" while all do) */
};
void dray_engine_split_report(const struct dray_engine *e, struct dray_split_report *r);
void dray_engine_close(struct dray_engine *e);
const struct dray_engine_info *dray_engine_get_info(const struct dray_engine *e);
/* A rescored head's work so far (rows of logits, candidates rescored in them),
 * for the bytes a step reads; 0 and 0 without one. */
void dray_engine_rescore_stats(const struct dray_engine *e, uint64_t *rows, uint64_t *candidates);

/* Tokenize with the model's tokenizer. add_bos follows the model's metadata;
 * parse_special turns "<start_of_turn>" etc. into their ids. *ids is malloc'd. */
int dray_engine_tokenize(const struct dray_engine *e, const char *text, bool add_bos,
                         bool parse_special, int32_t **ids, size_t *n, char *err, size_t errlen);
/* The bytes of one token's own piece (not UTF-8 checked: a byte-fallback token
 * is one byte of a character), like snprintf: the length is returned, at most
 * cap bytes are written (no NUL). Control tokens and ids outside the
 * vocabulary have none. For logprobs, whose tokens OpenAI gives as bytes. */
size_t dray_engine_token_bytes(const struct dray_engine *e, int32_t id, char *out, size_t cap);
/* The text of ids (control tokens such as BOS stand for no text), malloc'd and
 * NUL-terminated in *text, *len bytes. DRAY_EINVAL naming an id outside the
 * vocabulary. */
int dray_engine_detokenize(const struct dray_engine *e, const int32_t *ids, size_t n, char **text,
                           size_t *len, char *err, size_t errlen);

/* A bias added to one token's logit before sampling (OpenAI's logit_bias);
 * -INFINITY bans the token. */
struct dray_logit_bias {
    int32_t id;
    float bias;
};

/* What a grammar may cost; a field of 0 takes its default (docs/config.md). The
 * sizes are judged when the grammar is compiled; the step budget is enforced
 * inside the matcher's loops, and a sequence over it ends with DRAY_ERANGE. */
struct dray_grammar_limits {
    uint32_t max_elements;     /* default 65536 (also the most) */
    uint32_t max_alternatives; /* default 1024 */
    uint32_t max_depth;        /* default 1024 */
    uint32_t step_stacks;      /* default 4194304 (stack entries of one transition) */
    uint32_t step_ms;          /* default 200 */
    uint64_t cache;            /* default 8 MiB */
};

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
    /* OpenAI's penalties over the tokens generated so far (0 = off): a token's logit
     * loses count * frequency_penalty + (count > 0) * presence_penalty */
    float frequency_penalty, presence_penalty;
    const struct dray_logit_bias *logit_bias; /* n_logit_bias of them (copied); ids < n_vocab */
    uint32_t n_logit_bias;
    const int32_t *stop_ids;  /* tokens that end generation like end-of-generation does: finish
                               * "stop", not emitted (copied); n_stop_ids of them, ids < n_vocab */
    uint32_t n_stop_ids;
    bool ignore_eos;          /* the end-of-generation tokens are never sampled: generation runs
                               * to max_tokens (or a stop string / stop id) */
    uint32_t min_tokens;      /* end-of-generation and stop_ids are not sampled before this many
                               * tokens were generated */
    uint32_t lookup_draft;    /* at most this many tokens guessed from the context (core/lookup.h)
                               * and verified in one step; 0 = one token a step */
    const char *grammar;      /* GBNF (llama.cpp's dialect, start rule `root`) the generated
                               * text must follow, or NULL: each step samples only tokens whose
                               * bytes the grammar allows next, end-of-generation only where
                               * the text is complete, and generation ends where nothing can
                               * follow (finish "stop"). Compiled (copied) at submit */
    struct dray_grammar_limits grammar_limits; /* what the grammar may cost: over a size
                               * limit, submit says DRAY_EINVAL; over the step budget, the
                               * request ends with rc DRAY_ERANGE, finish "error" */
};

/* Whether dray runs the model in GGUF file g (dray/gguf.h): 0, or an error with
 * why (an architecture it does not run, a Mixture of Experts, a tensor missing,
 * unclaimed or misshapen, a hyper-parameter out of range). No device, no
 * weights read. */
struct dray_gguf;
int dray_model_check(const struct dray_gguf *g, char *why, size_t whylen);

/* Whether text[0..len) is a GBNF grammar dray can follow: 0, or DRAY_EINVAL with
 * "line L, column C: what" in err. */
int dray_grammar_check(const char *text, size_t len, char *err, size_t errlen);
/* The same under limits lim (NULL: the defaults): also DRAY_EINVAL naming the limit
 * (and its config key) for a grammar over a size limit, or whose start alone
 * costs more than a step may. */
int dray_grammar_check_limits(const char *text, size_t len, const struct dray_grammar_limits *lim,
                              char *err, size_t errlen);
void dray_grammar_limits_from_config(const struct dray_config *cfg, struct dray_grammar_limits *l);
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
    uint32_t n_drafted;       /* lookup_draft: tokens guessed from the context and verified */
    uint32_t n_draft_kept;    /* of them, kept (the sampler drew them too) */
    double prefill_s, decode_s;
    const char *stop_reason;  /* "eog", "stop id", "stop string", "max tokens", "context full",
                               * "caller", "grammar" (the text is complete: nothing may follow) */
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
/* Called by dray_session_eval with the logits (f32 [n_vocab]) of position pos of
 * the ids given; the row is valid during the call only. Non-zero stops the eval. */
typedef int (*dray_logits_fn)(void *user, size_t pos, const float *logits);
/* Append ids to the session and call fn, in order, with the logits of every
 * position first..n-1 (perplexity, KL divergence). Memory stays bounded: at most
 * 64 rows of logits are computed per step. */
int dray_session_eval(struct dray_session *s, const int32_t *ids, size_t n, size_t first,
                      dray_logits_fn fn, void *user, char *err, size_t errlen);
/* Prefill ids into the session without generating (benchmarks, schedulers). */
int dray_session_prefill(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen);
/* One decode step for n sessions of the same engine together (continuous
 * batching): session i takes ids[i]; logits (may be NULL) gets [n][n_vocab]. */
int dray_sessions_decode(struct dray_session *const *ss, uint32_t n, const int32_t *ids,
                         float *logits, char *err, size_t errlen);
/* The greedy pick of a row of logits: the lowest id of the largest, NaN never
 * (0 if every one is NaN); what the sampler takes at temperature 0. */
int32_t dray_greedy_token(const float *logits, uint32_t n_vocab);
/* A session's KV as one host buffer, so that another engine on the same model,
 * on any plugin, continues from it (moving a conversation between devices, and
 * the certification's kv_transfer check). The buffer holds the session's first
 * len - len % kv_block tokens (whole blocks): their ids and every layer's K and V
 * in the vendor-neutral host layout of the KV host tier (int8 with f32 scales, or
 * f16, as the engine's kv_dtype says), behind a header that names the layout.
 * Host byte order: for this machine's engines, not a file format. Neither call
 * may run while a scheduler (dray_sched) drives the same engine.
 * Export: *data is malloc'd, *bytes its size; DRAY_ERANGE when the session holds
 * less than one block. Import into an empty session of an engine with the same
 * layout (model, kv_dtype, kv_block): DRAY_EINVAL naming the mismatch otherwise,
 * DRAY_ENOMEM when its KV pool has no room; on failure the session stays empty. */
int dray_session_kv_export(struct dray_session *s, void **data, size_t *bytes, char *err,
                           size_t errlen);
int dray_session_kv_import(struct dray_session *s, const void *data, size_t bytes, char *err,
                           size_t errlen);
/* One chat turn: renders the model's chat template for the new user message
 * (plus the system prompt on the first turn), prefills only the new tokens and
 * generates the reply, which stays in the session's KV for the next turn. */
int dray_chat_turn(struct dray_session *s, const char *system, const char *user_text,
                   const struct dray_gen_params *p, dray_emit_fn emit, void *user,
                   struct dray_gen_stats *st, char *err, size_t errlen);


/* ------------------------------------------------------------------ chat */

/* One chat message. role: "system", "user" or "assistant". */
struct dray_chat_message {
    const char *role;
    const char *content;      /* UTF-8, NUL-terminated */
};

/* Name of the chat template this engine uses ("gemma", "chatml"), or NULL when
 * the model has none dray implements (config key chat_template chooses one). */
const char *dray_engine_chat_template(const struct dray_engine *e);

/* Render msgs with the engine's chat template and tokenize the result. The
 * template's own markers become control tokens; message contents are always
 * tokenized as plain text, so a user who types "<end_of_turn>" gets those
 * characters, not a forged turn. add_generation_prompt appends the header of the
 * assistant's turn. *ids is malloc'd. */
int dray_engine_chat_tokenize(const struct dray_engine *e, const struct dray_chat_message *msgs,
                              size_t n, bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                              char *err, size_t errlen);

/* ------------------------------------------------------------------ scheduler */

/* The scheduler serves many requests over one engine. One loop thread owns the
 * engine's device; each step builds one batch from the decode token of every
 * running sequence plus prefill chunks of admitted ones, up to `chunk` tokens and
 * `max_seqs` sequences (config), so decoding never stalls behind a long prompt.
 * A request is admitted when the KV pool has blocks for it; when the pool runs
 * out mid-generation the newest sequence is preempted (its blocks freed, its
 * tokens recomputed later) so every request completes. All functions below are
 * thread-safe; a request's output is read with dray_request_poll from any one
 * thread at a time. While a scheduler runs, do not use the engine's sessions. */
struct dray_sched;
struct dray_request;

/* The most alternatives a token's log-probability comes with (OpenAI's
 * top_logprobs limit). */
#define DRAY_MAX_TOP_LOGPROBS 20

/* One token's log-probability: the natural log of its probability under the
 * logits the sampler sees (after the penalties and logit_bias, before
 * temperature and truncation), and the n_top most likely tokens of that
 * distribution, most likely first. A token the penalties banned has -inf. */
struct dray_token_logprob {
    int32_t id;
    float logprob;
    uint32_t n_top;
    struct {
        int32_t id;
        float logprob;
    } top[DRAY_MAX_TOP_LOGPROBS];
};

struct dray_request_params {
    const int32_t *ids;       /* prompt tokens (copied); 1..context */
    size_t n_ids;
    struct dray_gen_params gen; /* sampling, max_tokens, stop strings (copied) */
    const char *cache_salt;   /* tenant key for the prefix cache; NULL = shared */
    bool logprobs;            /* report each generated token's dray_token_logprob */
    uint32_t top_logprobs;    /* with top_logprobs alternatives (0..DRAY_MAX_TOP_LOGPROBS) */
    bool prompt_logprobs;     /* also every prompt token's but the first (from the raw logits:
                               * no penalties apply to the prompt); its prefix is computed,
                               * never taken from the prefix cache */
    bool prompt_only;         /* prefill (and score) the prompt, generate nothing: it ends
                               * with finish_reason "length" and no tokens */
    bool chat;                /* ids are a conversation rendered by dray_engine_chat_tokenize
                               * with the generation prompt: when the reply ends on the
                               * template's turn end or on max_tokens, the prefix cache
                               * also gets the turn's closing and the next user turn's
                               * header, which the next turn's prompt contains */
};

/* What a request has produced since the last poll. Pointers stay valid until
 * the next poll or dray_request_free. */
struct dray_request_output {
    const char *text;         /* new UTF-8 text (stop strings removed) */
    size_t len;
    const int32_t *ids;       /* new token ids */
    size_t n_ids;
    const struct dray_token_logprob *logprobs; /* [n_ids] with params.logprobs, else NULL */
    const struct dray_token_logprob *prompt_logprobs; /* params.prompt_logprobs: the new
                               * ones, of prompt tokens 1.. in order (they come before any
                               * generated token's); n_prompt_logprobs of them */
    size_t n_prompt_logprobs;
    bool done;                /* no more output will come */
    int rc;                   /* when done: 0, or the DRAY_E* that ended it */
    const char *error;        /* when rc != 0: one line naming the problem */
    const char *finish_reason; /* when done: "stop" (eog or stop string), "length"
                                * (max_tokens or context full), "cancelled", "error" */
    uint32_t n_prompt;        /* prompt tokens */
    uint32_t n_cached;        /* of them, served from cached KV (not recomputed) */
    uint32_t n_generated;     /* completion tokens so far */
    uint32_t n_preempted;     /* times this request was preempted */
    double queue_s;           /* submit -> admitted */
    double ttft_s;            /* submit -> first token (0 until then) */
    double total_s;           /* submit -> done (0 until then) */
};

struct dray_sched_stats {
    uint32_t waiting;         /* requests queued, not yet admitted */
    uint32_t running;         /* sequences admitted (prefilling or decoding) */
    uint32_t max_seqs, max_waiting;
    uint64_t kv_blocks_used, kv_blocks_total; /* over all layer groups */
    uint64_t steps, preemptions;
    uint64_t prompt_tokens, prompt_tokens_cached, completion_tokens;
    uint64_t requests_done, requests_failed, requests_cancelled;
    /* prefix cache (all 0 when prefix_cache is off) */
    uint64_t cache_lookups, cache_lookup_tokens, cache_hit_tokens;
    uint64_t cache_entries, cache_checkpoints, cache_blocks, cache_evictions;
    uint64_t cache_host_bytes, cache_spills, cache_restores; /* host-memory tier */
    uint64_t cache_us;        /* loop-thread time in the cache's lookup+attach and insert
                               * (with the spills and restores they cause) and in the
                               * copies on write of shared partial blocks, microseconds */
    uint64_t cache_cow_copies; /* shared partial blocks copied before a write */
    uint64_t cache_fed_tokens; /* tokens fed into the KV after a response, so the next
                                * turn's prompt hits them: a finished reply's last sampled
                                * token, and for a chat request the turn's closing and the
                                * next user header */
    uint32_t finishing;        /* finished requests whose tokens are still to be fed */
    uint64_t cache_assembled;  /* hits that diverged inside a cached prefix and took the
                                * window layers' blocks from the checkpoints around it */
    uint64_t sampled_tokens;   /* tokens sampled */
    uint64_t sample_us;        /* loop-thread time drawing them, microseconds */
    uint64_t grammar_tokens;   /* of them, sampled under a grammar */
    uint64_t grammar_us;       /* loop-thread time drawing those (the grammar's tests and
                                * masks included) and advancing their grammars */
};

/* max_waiting: requests queued beyond the running ones before submit says
 * DRAY_EBUSY; 0 = 256. */
int dray_sched_create(struct dray_engine *e, uint32_t max_waiting, struct dray_sched **out,
                      char *err, size_t errlen);
/* Cancels what is still queued or running (each ends with finish_reason
 * "cancelled"), stops the loop thread and frees the scheduler. Requests not yet
 * freed stay readable until dray_request_free. */
void dray_sched_destroy(struct dray_sched *s);
/* Queue a request. DRAY_EINVAL (empty prompt, id outside the vocabulary, bad
 * sampling parameters), DRAY_ERANGE (prompt does not fit the context), DRAY_EBUSY
 * (queue full: try later), DRAY_ECANCELED (scheduler shutting down). */
int dray_sched_submit(struct dray_sched *s, const struct dray_request_params *p,
                      struct dray_request **out, char *err, size_t errlen);
/* Wait up to timeout_ms (-1 = forever, 0 = don't wait) for new output or the
 * end. Returns 1 when out holds something new or the end, 0 on timeout. */
int dray_request_poll(struct dray_request *r, struct dray_request_output *out, int timeout_ms);
/* Ask the scheduler to stop the request at its next step (client went away);
 * its blocks are freed there. Its output ends with finish_reason "cancelled". */
void dray_request_cancel(struct dray_request *r);
/* Cancel if still running, and release the request (after the last poll). */
void dray_request_free(struct dray_request *r);
void dray_sched_get_stats(struct dray_sched *s, struct dray_sched_stats *st);
/* Stop admitting new requests (submit gets DRAY_ECANCELED); running ones go on. */
void dray_sched_drain(struct dray_sched *s);

#ifdef __cplusplus
}
#endif
#endif /* DRAY_DRAY_H */
