/* A generation's sampler from its parameters. See gen_sampler.h. */
#include "gen_sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

int dray_gen_check_ids(const struct dray_gen_params *g, uint32_t n_vocab, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < g->n_logit_bias; i++)
        if (g->logit_bias[i].id < 0 || (uint32_t)g->logit_bias[i].id >= n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL, "logit_bias: token id %d is outside the "
                             "vocabulary (0..%u)", g->logit_bias[i].id, n_vocab - 1);
    for (uint32_t i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] < 0 || (uint32_t)g->stop_ids[i] >= n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL, "stop_ids: token id %d is outside the "
                             "vocabulary (0..%u)", g->stop_ids[i], n_vocab - 1);
    return 0;
}

int dray_gen_sampler(const struct dray_gen_params *g, const struct dray_tokenizer *tok,
                     size_t n_prompt, struct dray_sampler **out, char *err, size_t errlen)
{
    int32_t eog[3];
    size_t n_eog = dray_tokenizer_eog_ids(tok, eog);
    /* ignore_eos: the request's biases plus a ban on each end-of-generation id */
    size_t n_bias = g->n_logit_bias + (g->ignore_eos ? n_eog : 0);
    /* min_tokens: the end-of-generation ids and the stop ids wait */
    size_t n_hold = g->min_tokens ? n_eog + g->n_stop_ids : 0;
    struct dray_logit_bias *bias = n_bias ? malloc(sizeof(*bias) * n_bias) : NULL;
    int32_t *hold = n_hold ? malloc(sizeof(*hold) * n_hold) : NULL;
    int rc = 0;
    if ((n_bias && !bias) || (n_hold && !hold)) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for the sampler");
        goto out;
    }
    if (g->n_logit_bias)
        memcpy(bias, g->logit_bias, sizeof(*bias) * g->n_logit_bias);
    for (size_t i = g->n_logit_bias; i < n_bias; i++)
        bias[i] = (struct dray_logit_bias){eog[i - g->n_logit_bias], -INFINITY};
    if (n_hold) {
        memcpy(hold, eog, sizeof(*hold) * n_eog);
        if (g->n_stop_ids)
            memcpy(hold + n_eog, g->stop_ids, sizeof(*hold) * g->n_stop_ids);
    }
    struct dray_sampler_params sp = {
        .temperature = g->temperature, .top_k = g->top_k, .top_p = g->top_p, .min_p = g->min_p,
        .repeat_penalty = g->repeat_penalty, .repeat_last_n = g->repeat_last_n, .seed = g->seed,
        .frequency_penalty = g->frequency_penalty, .presence_penalty = g->presence_penalty,
        .n_prompt = n_prompt, .bias = bias, .n_bias = n_bias, .hold = hold, .n_hold = n_hold,
        .min_tokens = g->min_tokens,
    };
    rc = dray_sampler_create(&sp, out, err, errlen); /* copies bias and hold */
out:
    free(bias);
    free(hold);
    return rc;
}

bool dray_gen_is_stop_id(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}
