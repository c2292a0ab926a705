/* What split.c (the pipeline of layer ranges) and split_tp.c (tensor parallel
 * over ranks) share: the split's state. The split's files only. */
#ifndef DRAY_CORE_SPLIT_INTERNAL_H
#define DRAY_CORE_SPLIT_INTERNAL_H

#include "split.h"

#define MAX_TASK (2 * DRAY_SPLIT_MAX + 2)

/* A stage's piece of one micro-batch's chain: layers [l0, l1), entered from the
 * embedding or the host hidden state, left to the host or into the logits. */
struct split_task {
    uint32_t stage, l0, l1;
    bool embed, logits;
};

struct split_mb {
    uint32_t tok0, n_tok; /* its tokens in the step */
    uint32_t row0, n_row; /* its logit rows in the step's list */
};

struct dray_split {
    uint32_t n_stage, head;
    struct dray_split_stage st[DRAY_SPLIT_MAX];
    const struct dray_arch *arch;
    uint32_t n_embd, n_vocab;
    uint32_t micro_batches; /* config: 0 = one per busy stage */
    struct split_task task[MAX_TASK];
    uint32_t n_task;
    float *x[DRAY_KV_MAX_MB]; /* host hidden states of each micro-batch */
    size_t x_cap;             /* tokens each holds */
    uint32_t *rows;           /* logit rows relative to their micro-batch */
    size_t rows_cap;
    struct dray_split_stats stats;
    /* tensor parallel (config tensor_parallel, split_tp.c): tp ranks, each
     * holding slice[r] of every layer; stage r is rank r */
    uint32_t tp;
    struct dray_tp_slice slice[DRAY_SPLIT_MAX];
    uint32_t n_layer;
    struct dray_gguf *tp_g;           /* what split_tp_load loaded, for split_tp_reload */
    const struct dray_config *tp_cfg;
    struct dray_model_opts tp_mo;
    double tp_timeout_s;              /* config distributed_timeout: an all-reduce's longest wait */
};

/* Host hidden states for n_mb micro-batches of up to n tokens, and the rows. */
int split_reserve(struct dray_split *s, uint32_t n_mb, size_t n, size_t n_rows);
double split_now_s(void);
/* Comma-separated numbers of config key `key` (text), n of them; bytes: with
 * K, M, G suffixes. */
int split_parse_list(const char *key, const char *text, uint32_t n, bool bytes, double *out, char *err,
                     size_t errlen);

/* split_tp.c */
/* Check cfg's tensor_parallel against the n ranks of the job (stages 1.. are
 * ranks 1..); s->tp set when it asks for it. */
int split_tp_check(struct dray_split *s, const struct dray_config *cfg, uint32_t n, char *err, size_t errlen);
/* Every rank's slice of every layer; rank 0 also the embedding and head. */
int split_tp_load(struct dray_split *s, struct dray_gguf *g, const struct dray_config *cfg,
                  const struct dray_model_opts *mo, const struct dray_arch **arch, char *err, size_t errlen);
/* One step: rank 0 embeds, sends the hidden states to the others and runs its
 * slice with them (they meet in the all-reduces), then the head. */
int split_tp_forward(struct dray_split *s, struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                     const uint32_t *n_new, const struct dray_batch *b, char *err, size_t errlen);
/* Load every slice again, prepared from calibration scores (n floats). */
int split_tp_reload(struct dray_split *s, const float *scores, size_t n, char *err, size_t errlen);
/* The KV of every rank's slice (see dray_split_kv_create). */
int split_tp_kv_create(const struct dray_split *s, const struct dray_kv_desc *d, struct dray_kv **out,
                       char *err, size_t errlen);

#endif
