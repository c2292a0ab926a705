/* Which layers, and which head, go on which device of a split (split.h): a pure
 * function of the bytes and what the config and devices say. */
#include <math.h>
#include <string.h>

#include "error.h"
#include "split.h"

/* Contiguous ranges in device order from shares w (sum > 0): rounded cumulative
 * shares, so the counts differ from the exact shares by less than one layer. */
static void by_shares(uint32_t n_layer, uint32_t n_dev, const double *w, uint32_t *end)
{
    double total = 0, cum = 0;
    for (uint32_t d = 0; d < n_dev; d++)
        total += w[d];
    for (uint32_t d = 0; d < n_dev; d++) {
        cum += w[d];
        end[d] = d + 1 == n_dev ? n_layer : (uint32_t)llround(n_layer * cum / total);
        if (d && end[d] < end[d - 1])
            end[d] = end[d - 1];
    }
}

/* The device with the most room among the capped ones whose room holds bytes,
 * or n_dev when none does. */
static uint32_t roomiest(const struct dray_split_ask *a, uint64_t bytes)
{
    uint32_t best = a->n_dev;
    for (uint32_t d = 0; d < a->n_dev; d++)
        if (a->budget[d] && a->budget[d] >= bytes && (best == a->n_dev || a->budget[d] > a->budget[best]))
            best = d;
    return best;
}

/* "CPU helps": capped devices take the layers their budget holds (after the
 * head where it lives there), uncapped devices share the rest evenly. */
static int by_budget(const struct dray_split_need *n, const struct dray_split_ask *a,
                     struct dray_split_place *out, char *err, size_t errlen)
{
    uint64_t biggest = 0;
    uint32_t n_free = 0, count[DRAY_SPLIT_MAX] = {0}, left = n->n_layer;
    for (uint32_t il = 0; il < n->n_layer; il++)
        biggest = n->layer_bytes[il] > biggest ? n->layer_bytes[il] : biggest;
    if (!a->head_dev) {
        out->head = roomiest(a, n->head_bytes);
        for (uint32_t d = 0; out->head == a->n_dev && d < a->n_dev; d++)
            if (!a->budget[d])
                out->head = d;
        if (out->head == a->n_dev)
            return dray_fail(err, errlen, DRAY_ERANGE, "split: the embedding and head (%llu bytes) fit "
                             "in no device_memory budget and no device is uncapped",
                             (unsigned long long)n->head_bytes);
    }
    for (uint32_t d = 0; d < a->n_dev; d++) {
        if (!a->budget[d]) {
            n_free++;
            continue;
        }
        uint64_t room = a->budget[d];
        if (d == out->head) {
            if (room < n->head_bytes)
                return dray_fail(err, errlen, DRAY_ERANGE, "split: device %u holds the head (%llu bytes), "
                                 "more than its device_memory %llu", d + 1,
                                 (unsigned long long)n->head_bytes, (unsigned long long)room);
            room -= n->head_bytes;
        }
        uint64_t fit = biggest ? room / biggest : left;
        count[d] = fit < left ? (uint32_t)fit : left;
        left -= count[d];
    }
    if (left && !n_free)
        return dray_fail(err, errlen, DRAY_ERANGE, "split: %u of %u layers fit in no device_memory "
                         "budget (a layer is up to %llu bytes): raise a budget or add an uncapped "
                         "device such as cpu", left, n->n_layer, (unsigned long long)biggest);
    for (uint32_t d = 0, k = 0; d < a->n_dev; d++)
        if (!a->budget[d]) {
            count[d] = left / n_free + (k < left % n_free);
            k++;
        }
    for (uint32_t d = 0, e = 0; d < a->n_dev; d++)
        out->layer_end[d] = e += count[d];
    return 0;
}

int dray_split_place(const struct dray_split_need *need, const struct dray_split_ask *ask,
                     struct dray_split_place *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (ask->n_dev < 1 || ask->n_dev > DRAY_SPLIT_MAX)
        return dray_fail(err, errlen, DRAY_EINVAL, "split: %u devices, expected 1..%u", ask->n_dev,
                         DRAY_SPLIT_MAX);
    if (ask->head_dev > ask->n_dev)
        return dray_fail(err, errlen, DRAY_EINVAL, "split: head_device %u, but backend names %u devices",
                         ask->head_dev, ask->n_dev);
    out->head = ask->head_dev ? ask->head_dev - 1 : ask->n_dev;
    if (ask->ratio) {
        double sum = 0;
        for (uint32_t d = 0; d < ask->n_dev; d++) {
            if (!(ask->ratio[d] >= 0) || !isfinite(ask->ratio[d]))
                return dray_fail(err, errlen, DRAY_EINVAL, "split: layer_split entry %u is %g, expected a "
                                 "share >= 0", d + 1, ask->ratio[d]);
            sum += ask->ratio[d];
        }
        if (!(sum > 0))
            return dray_fail(err, errlen, DRAY_EINVAL, "split: layer_split gives no device a layer");
        by_shares(need->n_layer, ask->n_dev, ask->ratio, out->layer_end);
    } else if (ask->budget) {
        int rc = by_budget(need, ask, out, err, errlen);
        if (rc)
            return rc;
    } else {
        double w[DRAY_SPLIT_MAX];
        bool known = true;
        for (uint32_t d = 0; d < ask->n_dev; d++)
            known = known && ask->mem && ask->mem[d];
        for (uint32_t d = 0; d < ask->n_dev; d++)
            w[d] = known ? (double)ask->mem[d] : 1.0;
        by_shares(need->n_layer, ask->n_dev, w, out->layer_end);
    }
    if (out->head == ask->n_dev) /* with the last layers: their output goes straight in */
        for (uint32_t d = 0; d < ask->n_dev; d++)
            if (out->layer_end[d] == need->n_layer && (d == 0 || out->layer_end[d - 1] < need->n_layer)) {
                out->head = d;
                break;
            }
    return 0;
}
