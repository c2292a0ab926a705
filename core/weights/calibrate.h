/* Outlier-channel calibration of an int8 model: a fixed text, run once at load in
 * a KV cache of its own, so the channels chosen (and so every int8 weight) depend
 * only on the model file and the outlier count, never on run-time settings such
 * as the context length or the prefill chunk. */
#ifndef DRAY_CORE_CALIBRATE_H
#define DRAY_CORE_CALIBRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "model.h"
#include "tokenizer.h"

/* Most tokens of the calibration text that are used: the whole text fits in this
 * for every tokenizer dray supports; a longer tokenization is cut here (fixed). */
#define DRAY_CALIB_MAX_TOKENS 512u

/* The calibration text's tokens (BOS first, at most DRAY_CALIB_MAX_TOKENS);
 * *ids is malloc'd. For a model split over devices (core/split.c). */
int dray_calibration_ids(const struct dray_tokenizer *tok, int32_t **ids, size_t *n, char *err, size_t errlen);

/* The calibration KV: one sequence of exactly n tokens taken in one step, f16
 * whatever the engine's kv_dtype (the activations calibration sees are the
 * model's, as close to exact as the cache allows, the same for every
 * configuration). layer_dev: each layer's device for a split, or NULL. */
struct dray_kv_desc dray_calibration_kv_desc(const struct dray_model_info *mi, uint32_t n,
                                             const uint8_t *layer_dev);

/* Tokenize the calibration text with tok (BOS first), run it through
 * dray_model_calibrate in one step over a fresh f16 KV sized for exactly that
 * text, and free the KV. n_outlier: f32 input channels per int8 matmul (0:
 * none); smooth_k: the KV cache will be int8, rescale K channels for it. With
 * nothing to do the model is left as it is. */
int dray_calibrate(struct dray_model *model, struct dray_device *dev,
                   const struct dray_tokenizer *tok, uint32_t n_outlier, bool smooth_k, char *err,
                   size_t errlen);

#endif
