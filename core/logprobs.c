/* Log-softmax of one row for one token and its top alternatives. See logprobs.h. */
#include "logprobs.h"

#include <math.h>

#include "sampler.h"

/* log(sum exp(row)) in double around the row's maximum m (finite). */
static double log_sum_exp(const float *row, uint32_t n, float m)
{
    double z = 0;
    for (uint32_t i = 0; i < n; i++)
        if (row[i] > -INFINITY) /* NaN and -inf weigh nothing */
            z += exp((double)row[i] - m);
    return (double)m + log(z);
}

static float lp_of(float l, double lse, float m)
{
    if (isnan(l) || l == -INFINITY)
        return -INFINITY;
    if (isinf(m)) /* an +inf logit: it takes all the mass */
        return l == m ? 0.0f : -INFINITY;
    return (float)((double)l - lse);
}

void dray_logprobs_of(const float *row, uint32_t n, int32_t id, uint32_t n_top,
                      struct dray_token_logprob *out)
{
    float m = dray_max_f32(row, n);
    double lse = isinf(m) ? 0 : log_sum_exp(row, n, m);
    out->id = id;
    out->logprob = id >= 0 && (uint32_t)id < n ? lp_of(row[id], lse, m) : -INFINITY;
    if (n_top > DRAY_MAX_TOP_LOGPROBS)
        n_top = DRAY_MAX_TOP_LOGPROBS;
    if (n_top > n)
        n_top = n;
    /* the n_top largest logits by insertion into a sorted list: n_top <= 20,
     * and after the first few hundred logits almost every one fails the first test */
    int32_t best[DRAY_MAX_TOP_LOGPROBS];
    float val[DRAY_MAX_TOP_LOGPROBS];
    uint32_t k = 0;
    for (uint32_t i = 0; n_top && i < n; i++) {
        float v = isnan(row[i]) ? -INFINITY : row[i];
        if (k == n_top && !(v > val[k - 1]))
            continue; /* equal: the lower id already there wins */
        uint32_t j = k < n_top ? k++ : k - 1;
        for (; j > 0 && v > val[j - 1]; j--) {
            val[j] = val[j - 1];
            best[j] = best[j - 1];
        }
        val[j] = v;
        best[j] = (int32_t)i;
    }
    out->n_top = k;
    for (uint32_t j = 0; j < k; j++) {
        out->top[j].id = best[j];
        out->top[j].logprob = lp_of(val[j], lse, m);
    }
}
