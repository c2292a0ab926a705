/* What the decoder's files share beyond decoder.h (the families' interface):
 * decoder.c: hyper-parameters, load, free, activations, accounting;
 * decoder_weights.c: tensors into device weights; decoder_head.c: the embedding
 * table and the head's precision; decoder_blocks.c: a layer's building blocks;
 * decoder_forward.c: embedding, layers, logits; decoder_calib.c: calibration
 * scores, outlier picks and the calibration pass. The decoder's files only. */
#ifndef DRAY_MODELS_DECODER_INTERNAL_H
#define DRAY_MODELS_DECODER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "decoder.h"

/* decoder.c */
/* Activations for steps of up to m->max_batch tokens (any held before are freed). */
int dec_alloc_acts(struct dray_model *m, char *err, size_t errlen);
/* Parameter count and device bytes of the prepared weights. */
void dec_account(struct dray_model *m);

/* decoder_rope.c */
/* RoPE scaling from the file's keys and tensors (rope_scale of the layers the
 * family left at 0, rope_ff, rope_mscale); n_ctx picks LongRoPE's factors. */
int dec_rope_scaling(struct dray_model *m, uint32_t n_ctx, char *err, size_t errlen);

/* decoder_weights.c */
/* The length of a vector slot's tensor in this model. */
uint32_t dec_vec_len(const struct dray_model *m, const struct dec_slot *s);
/* The file's rows of each part of layer matmul `which` (MM_*) and its input
 * width; the number of parts. */
uint32_t dec_matrix_shape(const struct dray_model *m, int which, uint32_t *rows, uint32_t *k);
/* Every claimed tensor of the file has the shape its slot gives in this model
 * (no device needed); else an error naming the tensor and both shapes. */
int dec_check_shapes(const struct dray_model *m, char *err, size_t errlen);
/* Tensor "<what>.<suffix>" (il < 0) or "blk.<il>.<what>.<suffix>"; NULL (and, when
 * required, the error) if the file has none. */
const struct dray_gguf_tensor *dec_find_tensor(struct dray_gguf *g, int il, const char *what,
                                               const char *suffix, bool required, char *err,
                                               size_t errlen);
int dec_check_shape(struct dray_gguf *g, const struct dray_gguf_tensor *t, uint64_t ne0,
                    uint64_t ne1, char *err, size_t errlen);
int dec_load_vector(struct dray_model *m, int il, const char *what, uint32_t n,
                    struct dray_buf **out, char *err, size_t errlen);
/* The precision whose weights dtype stands for. */
enum dray_precision dec_precision_of(uint32_t dtype);
/* Layer matmul `which` (MM_*) of L. */
struct dray_weight *dec_layer_matrix(struct dec_layer *L, int which);
/* Layer matmul `which` of layer il, with its outlier channels when there are
 * scores to pick them from. */
int dec_load_layer_matrix_picked(struct dray_model *m, uint32_t il, int which, uint32_t dtype,
                                 char *err, size_t errlen);
/* Every tensor of layer il. */
int dec_load_layer(struct dray_model *m, uint32_t il, uint32_t dtype, char *err, size_t errlen);
/* Device bytes of a prepared weight. */
uint64_t dec_weight_bytes(const struct dray_weight *w);

/* decoder_head.c */
/* Two-pass activations in the output head too (see its definition). */
bool dec_head_two_pass(const struct dray_model *m);
/* token_embd, and output.weight when the family uses a separate head. */
int dec_load_embeddings(struct dray_model *m, uint32_t dtype, const struct dray_model_opts *o,
                        char *err, size_t errlen);
/* Only the vocabulary size from token_embd, for a part without the head. */
int dec_read_vocab(struct dray_model *m, char *err, size_t errlen);

/* decoder_blocks.c: one op each, also used by the forward pass's head */
int dec_matmul(struct dray_model *m, struct dray_view x, uint32_t stride_x,
               const struct dray_weight *w, struct dray_view out, uint32_t stride_out, uint32_t n_tok);
/* While calibrating, the largest |x| of every input channel of a matmul. */
int dec_observe(struct dray_model *m, uint32_t il, int which, struct dray_buf *x, uint32_t stride,
                uint32_t k, uint32_t T);
int dec_rmsnorm(struct dray_model *m, struct dray_view x, uint32_t stride_x, struct dray_buf *w,
                struct dray_view out, uint32_t stride_out, uint32_t n_tok, uint32_t n_head, uint32_t n);

/* decoder_tp.c: tensor parallel slices (a no-op without) */
/* Rows [r0, r0 + n) of t: the same bytes, fewer rows. */
void dec_cut_rows(const struct dray_gguf_tensor *t, uint64_t r0, uint64_t n, struct dray_gguf_tensor *out);
/* This rank's slice (m->tp, ff_dim) from the opts; the whole model without. */
int dec_tp_setup(struct dray_model *m, const struct dray_model_opts *o, char *err, size_t errlen);
/* Part `part` of layer matmul `which` cut to this rank's slice into *out: rows
 * (heads, FFN columns) point into the file; input columns are copied into *buf
 * (the caller frees it after preparing). Without tensor parallel *out = *t. */
int dec_tp_cut(struct dray_model *m, int which, uint32_t part, const struct dray_gguf_tensor *t,
               struct dray_gguf_tensor *out, void **buf, char *err, size_t errlen);
/* First input channel of this rank's slice of matmul `which` in the whole
 * model's score row (calibration scores keep the one-process layout). */
uint32_t dec_tp_k0(const struct dray_model *m, int which);
/* Of the n picks in m->pick (channels of the whole row), those inside this
 * rank's input slice of `which`, renumbered from its start; their count. */
uint32_t dec_tp_local_picks(struct dray_model *m, int which, uint32_t n);
/* o = the sum of every rank's o (after a row-split matmul); no-op without. */
int dec_tp_reduce(struct dray_model *m, uint32_t T);

/* decoder_calib.c */
/* Input width of each layer matmul. */
uint32_t dec_mm_k(const struct dray_model *m, int which);
/* Where the calibration score row of layer il's matmul `which` starts (il =
 * n_layer: the head's), keyed by (layer, slot) rather than a padded stride. */
size_t dec_calib_row(const struct dray_model *m, uint32_t il, int which);
/* The loudest n input channels of the score row of (il, which), k wide, into m->pick. */
int dec_pick_outliers(struct dray_model *m, uint32_t il, int which, uint32_t k, uint32_t n, char *err,
                      size_t errlen);
/* Scores from the calibration cache (dray_model_opts.calib_scores). */
int dec_adopt_scores(struct dray_model *m, const struct dray_model_opts *o, char *err,
                     size_t errlen);
/* The head's outlier channels, from the scores. */
int dec_calib_head(struct dray_model *m, uint32_t n_outlier, char *err, size_t errlen);

#endif
