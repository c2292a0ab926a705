/* One model over several devices in one process (config `backend: cpu,opencl`):
 * each device (a stage) holds a contiguous range of layers, their weights and
 * their KV; the embedding and the output head live on one of them. What crosses
 * between stages is each token's hidden state, through host memory.
 *
 * A step runs as a chain of tasks per micro-batch, e.g. for stages A (layers
 * 0..8) and B (9..17, the head): B embeds, A runs 0..8, B runs 9..17 and the
 * head. With one micro-batch the chain runs in the caller's thread; with more
 * (several sequences), each stage has a worker thread that takes the earliest
 * task whose predecessor is done, so A works on micro-batch i+1 while B works
 * on micro-batch i. The KV step is cut to match (dray_kv_step_begin_split).
 *
 * Placement (split_place.c) is a pure function of the layers' bytes, the head's
 * bytes and what the config and devices say. */
#ifndef DRAY_CORE_SPLIT_H
#define DRAY_CORE_SPLIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"
#include "dray/plugins.h"
#include "kv.h"
#include "model.h"

#define DRAY_SPLIT_MAX DRAY_KV_MAX_DEVICES

/* ---------------------------------------------------------------- placement */

struct dray_split_need {
    uint32_t n_layer;
    const uint64_t *layer_bytes; /* [n_layer] weights + KV share of each layer */
    uint64_t head_bytes;         /* embedding table and output head */
};

struct dray_split_ask {
    uint32_t n_dev;
    const double *ratio;    /* [n_dev] config layer_split, NULL = not given */
    const uint64_t *budget; /* [n_dev] config device_memory, 0 = no cap; NULL = not given */
    const uint64_t *mem;    /* [n_dev] the devices' free (else total) memory, 0 = unknown */
    uint32_t head_dev;      /* config head_device: 1-based, 0 = dray chooses */
};

struct dray_split_place {
    uint32_t layer_end[DRAY_SPLIT_MAX]; /* device d holds [layer_end[d-1], layer_end[d]) */
    uint32_t head;                      /* device of the embedding and head */
};

/* Layers by ratio when given (rounded cumulative shares, at least one layer
 * each); else by budget: the head on the capped device with the most room
 * (unless head_dev says), capped devices take layers from the end while they
 * fit, uncapped ones share the rest evenly ("CPU helps"); else in proportion to
 * mem (equal when unknown). The head goes with the last layers unless a budget
 * or head_dev places it. DRAY_EINVAL / DRAY_ERANGE with the reason. */
int dray_split_place(const struct dray_split_need *need, const struct dray_split_ask *ask,
                     struct dray_split_place *out, char *err, size_t errlen);

/* ---------------------------------------------------------------- the split */

struct dray_remote;

struct dray_split_stage {
    struct dray_device dev;   /* owned; another rank's proxy when remote */
    struct dray_model *model; /* layers [l0, l1); the embedding and head if head */
    struct dray_remote *remote; /* the stage is another rank (core/dist.h): model is NULL */
    bool loaded;              /* model, or the remote part, holds its layers */
    uint32_t l0, l1;
    bool head;
    uint64_t weight_bytes, step_weight_bytes, n_params; /* of its part */
    double busy_s;            /* time in this stage's tasks, all steps */
    uint64_t remote_calls;    /* remote: forward calls, and their time less the rank's compute */
    double wire_s;
    char slice[96];           /* tensor parallel: the heads and FFN columns it holds, else "" */
};

struct dray_split_stats {
    uint64_t steps, pipelined_steps; /* steps, those with more than one micro-batch */
    uint64_t hops, hop_bytes;        /* hidden states moved between devices */
    double wall_s;                   /* time inside dray_split_forward */
    double overlap_s;                /* time two or more stages were busy at once */
    uint64_t allreduces;             /* tensor parallel: rank 0's all-reduces, their time */
    double allreduce_s;
};

struct dray_split;

/* Open one device per comma-separated entry of cfg->backend (cfg->device: one
 * entry per backend, fallback as for one device). Errors name the entry. With
 * cfg->distributed, stage 1 is this process's device and stage r+1 is rank r
 * of the transport (the head stays on rank 0). */
int dray_split_open(struct dray_registry *reg, const struct dray_config *cfg, struct dray_split **out,
                    char *err, size_t errlen);
void dray_split_free(struct dray_split *s);
uint32_t dray_split_n(const struct dray_split *s);
struct dray_split_stage *dray_split_stage_at(struct dray_split *s, uint32_t i);
const struct dray_split_stage *dray_split_stage_c(const struct dray_split *s, uint32_t i);
/* The stage holding the embedding and head (valid after dray_split_load). */
uint32_t dray_split_head(const struct dray_split *s);

/* Place the layers (config layer_split, device_memory, head_device) and load
 * each stage's part of the model from g with mo (its layer range filled in).
 * kv_layer_bytes: KV bytes per layer the placement counts. */
int dray_split_load(struct dray_split *s, const struct dray_config *cfg, struct dray_gguf *g,
                    const struct dray_model_opts *mo, uint64_t kv_layer_bytes,
                    const struct dray_arch **arch, char *err, size_t errlen);

/* The KV's devices and each layer's device (for dray_kv_create_on). */
void dray_split_kv_devices(const struct dray_split *s, struct dray_kv_device *devs, uint8_t *layer_dev);
/* The KV of desc d (its layer_dev ignored) over the split's devices: each
 * layer's pools on its stage; under tensor parallel, one pool per rank and
 * layer, each for that rank's KV heads (split_tp.c). */
int dray_split_kv_create(const struct dray_split *s, const struct dray_kv_desc *d, struct dray_kv **out,
                         char *err, size_t errlen);

/* One step: n_seq sequences (seq_ids) appending n_new tokens each, in b (b->part
 * NULL). Begins, ends or aborts the KV step itself. Micro-batches: cfg
 * micro_batches (0 = one per stage when there are enough sequences); logit rows
 * must be ascending to cut the step, else it runs whole. */
int dray_split_forward(struct dray_split *s, struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                       const uint32_t *n_new, const struct dray_batch *b, char *err, size_t errlen);

/* Calibrate every stage on ids (one sequence of n tokens) in a fresh f16 KV over
 * the same devices; *scores (malloc'd, *n_scores floats) is the stages' scores
 * merged, the layout one device's model gives. */
int dray_split_calibrate(struct dray_split *s, const int32_t *ids, uint32_t n, uint32_t n_outlier,
                         bool smooth_k, float **scores, size_t *n_scores, char *err, size_t errlen);

void dray_split_get_stats(const struct dray_split *s, struct dray_split_stats *st);

#endif
