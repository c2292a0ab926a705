/* The engine's private state, shared by the files that make up the engine
 * (engine.c: wiring, open and close; session.c: sessions, forward steps, prefill;
 * session_generate.c: the decode loop; session_eval.c: logits of every position;
 * engine_chat.c: chat turns; scheduler.c and sched_finisher.c: many requests
 * over one engine).
 * Core only: nothing outside core/ includes this. */
#ifndef DRAY_CORE_ENGINE_INTERNAL_H
#define DRAY_CORE_ENGINE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "dray/dray.h"
#include "dray/plugins.h"

struct dray_gguf;
struct dray_tokenizer;
struct dray_arch;
struct dray_model;
struct dray_kv;
struct dray_split;

struct dray_engine {
    struct dray_config cfg;
    struct dray_registry *reg;
    struct dray_device dev;    /* with a split: a copy of the head's stage device */
    bool dev_open;
    struct dray_split *split;  /* backend lists several plugins: owns devices and parts */
    char split_plugins[256], split_devices[512]; /* info's plugin and device with a split */
    char placement[1024];      /* info's placement text, "" without a split */
    struct dray_gguf *gguf;
    struct dray_tokenizer *tok;
    const struct dray_arch *arch;
    struct dray_model *model;  /* with a split: the head's part (the split owns it) */
    struct dray_kv *kv;
    struct dray_engine_info info;
    uint32_t chunk;     /* most tokens in one forward step */
    float *logits;      /* host [n_vocab] for the one row a session samples from */
    struct dray_chat_template chat; /* style NONE when the model has none dray knows */
    char calib_cache[4200];    /* this model's calibration cache file, "" = none */
    struct dray_prep_cache *prep; /* prepared layouts mapped or stored (prep_cache.h), or NULL */
    struct dray_grammar_vocab *gvocab; /* the tokens' bytes for grammars (constraint.h):
                                        * built on the first constrained request */
};

struct dray_session {
    struct dray_engine *e;
    uint32_t seq;
    int32_t *hist;      /* tokens in the KV, in order */
    size_t n_hist, cap_hist;
    bool chatted;       /* a chat turn has been rendered into this session */
};

/* Seconds on the monotonic clock. */
double dray_now_s(void);

/* One forward step over several sessions: session i appends n[i] tokens (ids are
 * concatenated in session order); the logits of the listed batch rows go to
 * logits [n_logits][n_vocab]. On success every session's history grows by its
 * tokens; on failure nothing changes (DRAY_ENOMEM from the KV manager means the
 * pool ran out of blocks: preempt a sequence and retry). */
int dray_engine_step(struct dray_session *const *ss, uint32_t n_seq, const uint32_t *n,
                     const int32_t *ids, const uint32_t *logit_rows, uint32_t n_logits,
                     float *logits, char *err, size_t errlen);

/* Drop the session's tokens from len on (KV and history): DRAY_ERANGE when len
 * is past its end or a sliding window already let go of a block len needs. */
int dray_session_truncate(struct dray_session *s, size_t len);

/* One session's forward step: dray_engine_step over just s. */
int dray_session_step(struct dray_session *s, const int32_t *ids, uint32_t n, const uint32_t *logit_rows,
                      uint32_t n_logits, float *logits, char *err, size_t errlen);

/* 0 when n more tokens fit in s's context, else DRAY_ERANGE with the reason. */
int dray_session_check_fits(struct dray_session *s, size_t n, char *err, size_t errlen);

/* Prefill n tokens in chunks of the engine's chunk; the logits of the last token
 * land in e->logits. The caller checked they fit (dray_session_check_fits). */
int dray_session_feed(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen);

/* The session's KV already holds ids (attached from the prefix cache): record
 * them as its history. 0 or DRAY_ENOMEM. */
int dray_session_adopt(struct dray_session *s, const int32_t *ids, size_t n);

#endif
