/* The model interface: one implementation per architecture family in models/,
 * chosen by general.architecture. A model reads its hyper-parameters from GGUF
 * metadata, prepares its weights on the device (int8 per output channel, or f32
 * for checking), and runs a forward step over a batch of tokens from several
 * sequences through the operator table only. */
#ifndef DRAY_CORE_MODEL_H
#define DRAY_CORE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/dray.h"
#include "gguf.h"
#include "kv.h"
#include "wformat.h"
#include "dray/plugins.h"

#define DRAY_MAX_LAYERS 256

/* What the engine needs to know about a loaded model. */
struct dray_model_info {
    const char *arch;          /* "gemma3" */
    char name[128];            /* general.name */
    uint32_t n_layer, n_embd, n_ff, n_head, n_kv_head, head_dim, n_vocab;
    uint32_t n_rot;            /* dimensions of a head RoPE turns (head_dim unless partial) */
    uint32_t n_ctx_train;
    uint32_t window[DRAY_MAX_LAYERS]; /* per layer, 0 = global attention */
    int32_t share_kv[DRAY_MAX_LAYERS]; /* per layer: earlier layer whose KV it reads, or -1 */
    uint64_t n_params;
    uint64_t weight_bytes;     /* device bytes of prepared weights */
    uint64_t step_weight_bytes; /* of those, the ones a decode step reads: all but the
                                 * embedding table when the head is a matrix of its own */
    /* A rescored head (models/head_rescore.c) reads, per candidate of a row of
     * logits, its row of the 8-bit table and writes and reads it as f32: bytes
     * per candidate (0 = no rescored head), and the rows and candidates so far. */
    uint64_t rescore_bytes;
    const char *head;          /* the output head as prepared: "8-bit groups", "4-bit rescored", ... */
    uint64_t rescore_rows, rescore_candidates;
    uint64_t tp_reduces;       /* tensor parallel: all-reduces so far and their time */
    double tp_reduce_s;
};

/* One rank's slice of every layer under tensor parallel: query heads [head0,
 * head0 + n_head), KV heads [kv0, kv0 + n_kv) (a KV head is held by every rank
 * whose query heads read it), FFN columns [ff0, ff0 + n_ff). */
struct dray_tp_slice {
    uint32_t head0, n_head, kv0, n_kv, ff0, n_ff;
};

struct dray_model_opts {
    enum dray_precision precision;
    uint32_t outlier_channels; /* per matmul input, chosen by dray_model_calibrate; 0 = off */
    uint32_t max_batch;        /* most tokens in one forward step (sizes the activations) */
    uint32_t max_logits;       /* most rows of logits in one step */
    uint32_t n_ctx;            /* the context it will run at (LongRoPE picks its factors by it); 0 = trained */
    bool progress;             /* print weight preparation progress to stderr */
    /* Scores of an earlier calibration of the same file (calibrate.h's cache): the
     * layers are prepared in int8 with their outlier channels at once, and the
     * dray_model_calibrate must not follow. NULL = calibrate after loading. */
    const float *calib_scores;
    size_t n_calib_scores;
    /* The KV cache will be int8: K channels rescaled from the calibration (the
     * given scores, or dray_model_calibrate's smooth_k), see models/kv_smooth.c. */
    bool smooth_k;
    /* Grouped precisions: the output head in 4-bit groups even where the file's
     * head is wider (DRAY_WROLE_HEAD4); a head tied to the embedding gets its own
     * 4-bit copy, so the embedding gather keeps the file's precision, and the
     * most likely tokens of each row are computed again from that 8-bit table
     * (models/head_rescore.c). */
    enum dray_head_precision head_precision;
    uint32_t head_rescore;     /* most candidates per row; 0 = the 4-bit logits as they are */
    float head_rescore_tail;   /* 4-bit probability a row may leave unrescored */
    /* Grouped precisions: matmuls with two-pass activations (DRAY_Q8G32_X2 /
     * DRAY_Q4G32_X2: config activations int8x2, on a device that declares them);
     * the output head keeps one pass when it outweighs the layers (decoder_head.c). */
    bool two_pass;
    /* A part of the model, for one device of a split (core/split.h): when part,
     * layers [layer_begin, layer_end) only (maybe none), and the embedding and
     * output head unless no_head. */
    bool part, no_head;
    uint32_t layer_begin, layer_end;
    /* Tensor parallel (core/split.h): with tp_size > 1 this part holds slice
     * tp_rank of every layer it holds (tp_slice, from dray_tp_slice: its query
     * and KV heads, its FFN columns), and allreduce sums the partial outputs of the attention
     * output and FFN down projections over the ranks (n floats in place). */
    uint32_t tp_rank, tp_size;
    struct dray_tp_slice tp_slice;
    int (*allreduce)(void *user, float *buf, size_t n, char *err, size_t errlen);
    void *allreduce_user;
};

/* Slice `rank` of `size` for a model of mi's heads and FFN width. Heads go by
 * whole KV groups when the KV heads divide among the ranks, else each rank's
 * heads must read one KV head; every rank then holds the same number of KV
 * heads (one KV pool layout for all). FFN columns go in whole blocks of
 * ff_block (the file's block of ffn_down: a row split cuts only there), in
 * proportion to ff_share[size] when given (at least one block each), else
 * evenly. Uneven shares go to the first ranks. DRAY_EINVAL saying why a split
 * cannot be made. Only mi's n_head, n_kv_head and n_ff are read. */
int dray_tp_slice(const struct dray_model_info *mi, uint32_t ff_block, const double *ff_share, uint32_t rank,
                  uint32_t size, struct dray_tp_slice *out, char *err, size_t errlen);
/* Whether s is a slice the decoder can run for mi: inside the model, and its
 * query heads read exactly its KV heads in the attention op's GQA order. */
bool dray_tp_slice_ok(const struct dray_model_info *mi, const struct dray_tp_slice *s);

/* One forward step. Tokens are grouped by sequence in the same order as the
 * kv step that was begun for them (dray_kv_step_begin). */
struct dray_batch {
    uint32_t n_tok;
    const int32_t *ids;        /* host [n_tok] */
    const int32_t *pos;        /* host [n_tok]: position of each token in its sequence */
    uint32_t n_logits;
    const uint32_t *logit_rows; /* host [n_logits]: batch rows whose logits are wanted */
    float *logits;             /* host out [n_logits][n_vocab] */
    const struct dray_batch_part *part; /* NULL = the whole step: embed, every layer, logits */
};

/* One device's share of a step of a split model (core/split.c): micro-batch mb
 * of the KV step (dray_kv_layer_mb), layers [layer_begin, layer_end) of this
 * part, entered from x_in or from the embedding, left into x_out or to logits. */
struct dray_batch_part {
    uint32_t mb;
    uint32_t layer_begin, layer_end;
    const float *x_in;         /* host [n_tok][n_embd] hidden states; NULL = embed the ids */
    float *x_out;              /* host [n_tok][n_embd] out, no logits; NULL = the logits */
};

struct dray_model;

/* The engine's handle on one architecture family: its name, its table (the
 * family file's, models/family.h, which only models/ reads) and what config
 * `activations: auto` means for it. Every family is run by the one shared
 * decoder, whose functions below are the model interface. */
struct dray_arch {
    const char *name;          /* general.architecture */
    const void *family;        /* the family's table (models/family.h) */
    /* INT8X2 where one int8 pass per group loses too much of the family's
     * activations (measured, in the family's file), INT8 where one pass is
     * close enough and the second would only cost prefill time. */
    enum dray_activations activations;
};

/* One forward step over a batch (tokens grouped by sequence as kv's step). */
int dray_model_forward(struct dray_model *m, struct dray_kv *kv, const struct dray_batch *b, char *err,
                       size_t errlen);
void dray_model_free(struct dray_model *m);
const struct dray_model_info *dray_model_info(const struct dray_model *m);
/* Run ids as one new sequence of kv in one step (n may exceed max_batch: the
 * model sizes that step itself; kv is the caller's, sized for n tokens, see
 * calibrate.h) while recording the largest |activation| of every matmul input
 * channel, then re-prepare the int8 weights keeping the n_outlier loudest input
 * channels of each matmul in f32 (0: none). smooth_k: also rescale K channels
 * for an int8 KV cache where the model can do it at no cost
 * (models/kv_smooth.c); the scores q.k stay the same. */
int dray_model_calibrate(struct dray_model *m, struct dray_kv *kv, const int32_t *ids, uint32_t n,
                         uint32_t n_outlier, bool smooth_k, char *err, size_t errlen);
/* The per-channel scores the outlier channels were picked from, by calibrate
 * or given at load; their count, 0 when there are none. They depend only on
 * the file and the calibration text, so they can be cached. */
size_t dray_model_calib_scores(const struct dray_model *m, const float **scores);
/* calibrate in three moves, for a model split over devices (core/split.c):
 * begin records while the caller runs the parts' forward passes over ids (n
 * tokens, one step), end re-prepares the part's weights; calibrate is begin,
 * one forward pass, end. */
int dray_model_calib_begin(struct dray_model *m, uint32_t n, uint32_t n_outlier, bool smooth_k, char *err,
                           size_t errlen);
int dray_model_calib_end(struct dray_model *m, bool ok, char *err, size_t errlen);

/* The architectures, one per file in models/, listed by models/meson.build into
 * a generated table (models/arch_table.c). */
extern const struct dray_arch *const dray_archs[];
extern const size_t dray_n_archs;

/* Picks the architecture from the file; "architecture X is not supported
 * (supported: gemma3, llama, ...)" otherwise. */
int dray_model_load(struct dray_gguf *g, struct dray_device *dev, const struct dray_model_opts *o,
                    const struct dray_arch **arch, struct dray_model **out, char *err, size_t errlen);
/* The shared decoder's load and file check for one family (models/decoder.c);
 * dray_model_load and dray_model_check pick the family and call them. */
int dray_model_load_family(const struct dray_arch *a, struct dray_gguf *g, struct dray_device *dev,
                           const struct dray_model_opts *o, struct dray_model **out, char *err, size_t errlen);
int dray_model_check_family(const struct dray_arch *a, struct dray_gguf *g, char *err, size_t errlen);
/* The architecture of the file (general.architecture), or NULL when it is not
 * one of dray_archs (dray_model_load then says why). */
const struct dray_arch *dray_model_arch_of(struct dray_gguf *g);
/* Comma-separated list of supported architectures. */
const char *dray_model_supported(void);
/* dray_model_check (dray.h): whether the file would load, without a device. */

/* Helpers for model files: prepare one 2-D GGUF weight (or several stacked along
 * the output dimension, e.g. Q|K|V) on the device. */
struct dray_weight {
    struct dray_buf *w;        /* I8 [n_out][k] or F32 [n_out][k] */
    struct dray_buf *scale;    /* F32 [n_out] (I8 only) */
    uint32_t n_out, k, dtype;  /* dtype: DRAY_I8, DRAY_F32, or a grouped format by
                                * its host name (wformat.h) */
    /* Grouped: the device's packed copy (ABI v3 weight_create) and its bytes. */
    struct dray_packed *packed;
    uint64_t packed_bytes;
    /* Mixed precision (I8 only): input channels kept out of the int8 path, whose
     * weight columns are zero in w and live in f32 here (backend.h, matmul). */
    struct dray_buf *outlier_idx; /* I32 [n_outlier], increasing */
    struct dray_buf *outlier_w;   /* F32 [n_out][n_outlier] */
    uint32_t n_outlier;
    /* Parts of different formats (Q|K|V with V in Q6_K and Q, K in Q4_K): each
     * its own weight, their outputs side by side (dray_weight_matmul). */
    struct dray_weight *split;
    uint32_t n_split;
};
/* Prepare parts under precision for role: the format is the weight policy's
 * (wformat.h: dray_wformat_pick); grouped formats are packed by the device
 * (ABI v3 weight_create). outliers: n_outlier increasing input channels to
 * keep in f32 (I8 only), or NULL. */
int dray_weight_prepare(struct dray_device *dev, const struct dray_gguf_tensor *const *parts,
                        uint32_t n_parts, enum dray_precision precision, enum dray_wrole role,
                        const int32_t *outliers, uint32_t n_outlier, struct dray_weight *out, char *err,
                        size_t errlen);
/* The same, with pair_hd[i] (NULL = all 0) = head_dim when part i's rows are
 * stored for adjacent-pair RoPE (x0,x1),(x2,x3)... and must be reordered per head
 * into the NEOX halves (x0..x_{d/2-1} | x_{d/2}..) the rope op rotates; 0 = as is. */
int dray_weight_prepare_pairs(struct dray_device *dev, const struct dray_gguf_tensor *const *parts,
                              uint32_t n_parts, const uint32_t *pair_hd, enum dray_precision precision,
                              enum dray_wrole role, const int32_t *outliers, uint32_t n_outlier,
                              struct dray_weight *out, char *err, size_t errlen);
/* Stored row of NEOX-ordered row r under that reordering (head_dim 0: r). */
uint64_t dray_rope_pair_row(uint64_t r, uint32_t head_dim);
/* Give an already prepared int8 weight (one tensor) outlier channels without
 * touching its int8 table: the int8 path ignores w at outlier channels, so a table
 * shared with the embedding gather keeps its values. */
int dray_weight_set_outliers(struct dray_device *dev, const struct dray_gguf_tensor *t,
                             const int32_t *outliers, uint32_t n_outlier, struct dray_weight *w,
                             char *err, size_t errlen);
/* The n largest of score[0..k) as increasing channel indices (n <= k); 0 or DRAY_ENOMEM. */
int dray_pick_outliers(const float *score, uint32_t k, uint32_t n, int32_t *out);
void dray_weight_release(struct dray_device *dev, struct dray_weight *w);
/* The matmul args a (x, out, strides, n_tok and passes set) on w: one op, or
 * one per part of a split weight, each into its columns of out. */
int dray_weight_matmul(struct dray_device *dev, const struct dray_weight *w, struct dray_matmul_args a);
/* The end of a load on this thread: the staging dray_weight_prepare kept from
 * one weight to the next is freed. */
void dray_weight_scratch_free(void);
/* Where this thread's weight preparation spent its time since the last call
 * (then reset): the file's rows read and converted to the form handed over,
 * and the plugin packing them (weight_create, or upload). Seconds. */
/* Loads on this thread import prepared weights from c and store what they
 * prepare into it (prep_cache.h; NULL: neither). */
struct dray_prep_cache;
void dray_weight_use_prepared(struct dray_prep_cache *c);
struct dray_load_times {
    double convert_s, pack_s, store_s; /* store: into the prepared-layout cache */
};
void dray_weight_load_times(struct dray_load_times *out);
/* A 1-D f32 tensor (norm weights) uploaded as F32. */
int dray_vector_prepare(struct dray_device *dev, const struct dray_gguf_tensor *t, uint32_t n,
                        struct dray_buf **out, char *err, size_t errlen);

#endif
