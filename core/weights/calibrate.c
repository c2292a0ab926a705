/* Calibration of the int8 outlier channels and of the int8 KV's K smoothing
 * (calibrate.h): the text, its own KV, and the call into the model's hook. */
#include <stdlib.h>
#include <time.h>

#include "calibrate.h"
#include "error.h"
#include "kv.h"
#include "log.h"

/* A little of everything a chat model sees: prose, code, numbers, dialogue. The
 * outlier channels it reveals are properties of the weights, not of this text.
 * Changing it changes every int8 model's weights: re-measure accuracy after. */
static const char calibration_text[] =
    "The history of science is the study of how people came to understand the natural world. "
    "In 1687, Isaac Newton published the laws of motion; two centuries later, Maxwell unified "
    "electricity and magnetism. Today, a single laptop performs 10^11 operations per second.\n\n"
    "def mean(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n\n"
    "Q: What is the capital of Japan?\nA: Tokyo, a city of about 14 million people.\n"
    "<start_of_turn>user\nCan you summarize this in one sentence?<end_of_turn>\n"
    "<start_of_turn>model\nScience grew from careful observation into a shared method.\n"
    "Les mathématiques sont le langage de la nature. 数学は自然の言語である。";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct dray_kv_desc dray_calibration_kv_desc(const struct dray_model_info *mi, uint32_t n,
                                             const uint8_t *layer_dev)
{
    return (struct dray_kv_desc){
        .n_layer = mi->n_layer, .window = mi->window, .share_with = mi->share_kv,
        .layer_dev = layer_dev, .n_kv_head = mi->n_kv_head, .head_dim = mi->head_dim,
        .dtype = DRAY_F16, .block_size = 16, .max_seqs = 1, .max_ctx = n, .max_chunk = n,
    };
}

static int calib_kv(struct dray_device *dev, const struct dray_model_info *mi, uint32_t n,
                    struct dray_kv **kv, char *err, size_t errlen)
{
    struct dray_kv_desc d = dray_calibration_kv_desc(mi, n, NULL);
    char why[256];
    int rc = dray_kv_create(dev->ops, dev->ctx, &d, kv, why, sizeof(why));
    if (rc)
        dray_fail(err, errlen, rc, "calibration KV for %u tokens: %s", n, why);
    return rc;
}

int dray_calibration_ids(const struct dray_tokenizer *tok, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    int rc = dray_tokenize(tok, calibration_text, sizeof(calibration_text) - 1, true, true, ids, n);
    if (rc)
        return dray_fail(err, errlen, rc, "calibration text: %s", dray_strerror(rc));
    if (*n > DRAY_CALIB_MAX_TOKENS)
        *n = DRAY_CALIB_MAX_TOKENS;
    return 0;
}

int dray_calibrate(struct dray_model *model, struct dray_device *dev,
                   const struct dray_tokenizer *tok, uint32_t n_outlier, bool smooth_k, char *err,
                   size_t errlen)
{
    if (!n_outlier && !smooth_k)
        return 0;
    double t0 = now_s();
    int32_t *ids = NULL;
    size_t n = 0;
    struct dray_kv *kv = NULL;
    int rc = dray_calibration_ids(tok, &ids, &n, err, errlen);
    if (!rc)
        rc = calib_kv(dev, dray_model_info(model), (uint32_t)n, &kv, err, errlen);
    if (!rc)
        rc = dray_model_calibrate(model, kv, ids, (uint32_t)n, n_outlier, smooth_k, err, errlen);
    if (!rc)
        dray_info("calibrated %u outlier channels per matmul%s on %zu tokens in %.2f s", n_outlier,
                  smooth_k ? " and K smoothing for the int8 KV" : "", n, now_s() - t0);
    if (kv)
        dray_kv_free(kv);
    free(ids);
    return rc;
}
