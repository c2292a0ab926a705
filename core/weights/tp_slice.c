/* Tensor parallel: which heads and FFN columns each rank holds (model.h
 * dray_tp_slice). Pure functions: rank 0 sizes every rank's slice and sends
 * each its own (model opts tp_slice), which the rank's decoder checks. */
#include "model.h"

#include "error.h"

/* Part i of n of `total` items: the first total % n parts get one more. */
static void share(uint32_t total, uint32_t i, uint32_t n, uint32_t *start, uint32_t *count)
{
    uint32_t base = total / n, extra = total % n;
    *start = i * base + (i < extra ? i : extra);
    *count = base + (i < extra);
}

/* Part i of n of `total` items in proportion to w (at least one each). */
static void share_by(uint32_t total, const double *w, uint32_t i, uint32_t n, uint32_t *start, uint32_t *count)
{
    double sum = 0, cum = 0;
    for (uint32_t r = 0; r < n; r++)
        sum += w[r];
    uint32_t end = 0, prev = 0;
    for (uint32_t r = 0; r <= i; r++) {
        cum += w[r];
        uint32_t e = (uint32_t)(cum / sum * total + 0.5);
        uint32_t lo = end + 1, hi = total - (n - 1 - r);
        prev = end;
        end = e < lo ? lo : e > hi ? hi : e;
    }
    *start = prev;
    *count = end - prev;
}

bool dray_tp_slice_ok(const struct dray_model_info *mi, const struct dray_tp_slice *s)
{
    uint32_t group = mi->n_head / mi->n_kv_head;
    if (!s->n_head || !s->n_kv || !s->n_ff || s->head0 + s->n_head > mi->n_head ||
        s->kv0 + s->n_kv > mi->n_kv_head || s->ff0 + s->n_ff > mi->n_ff)
        return false;
    if (s->n_kv == 1) /* every head reads the one KV head */
        return s->head0 / group == s->kv0 && (s->head0 + s->n_head - 1) / group == s->kv0;
    return s->head0 == s->kv0 * group && s->n_head == s->n_kv * group;
}

int dray_tp_slice(const struct dray_model_info *mi, uint32_t ff_block, const double *ff_share, uint32_t rank,
                  uint32_t size, struct dray_tp_slice *out, char *err, size_t errlen)
{
    uint32_t H = mi->n_head, KV = mi->n_kv_head, group = H / KV;
    *out = (struct dray_tp_slice){0};
    if (size < 1 || rank >= size)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor parallel: rank %u of %u", rank, size);
    if (size > H)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor_parallel %u: more ranks than the model's %u "
                         "attention heads (each rank needs one)", size, H);
    if (!ff_block || mi->n_ff % ff_block || mi->n_ff / ff_block < size)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor_parallel %u: the FFN's %u columns are not %u "
                         "whole blocks of %u (ffn_down's type) to share out", size, mi->n_ff, size, ff_block);
    if (KV % size == 0) { /* whole KV groups each */
        out->n_kv = KV / size;
        out->kv0 = rank * out->n_kv;
        out->head0 = out->kv0 * group;
        out->n_head = out->n_kv * group;
    } else {
        share(H, rank, size, &out->head0, &out->n_head);
        out->kv0 = out->head0 / group;
        out->n_kv = 1;
        for (uint32_t r = 0; r < size; r++) { /* every rank's heads must read one KV head */
            uint32_t h0, n;
            share(H, r, size, &h0, &n);
            if (h0 / group != (h0 + n - 1) / group)
                return dray_fail(err, errlen, DRAY_EINVAL, "tensor_parallel %u: %u attention heads over %u "
                                 "KV heads do not split evenly (rank %u would read KV heads %u-%u, and every "
                                 "rank must hold as many KV heads); use a tensor_parallel that divides %u, "
                                 "or one that gives every rank heads of a single KV head", size, H, KV, r,
                                 h0 / group, (h0 + n - 1) / group, KV);
        }
    }
    uint32_t b0, nb;
    double sum = 0;
    for (uint32_t r = 0; ff_share && r < size; r++)
        sum += ff_share[r] > 0 ? ff_share[r] : 0;
    if (ff_share && !(sum > 0))
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor_parallel %u: layer_split gives no rank a share", size);
    if (ff_share)
        share_by(mi->n_ff / ff_block, ff_share, rank, size, &b0, &nb);
    else
        share(mi->n_ff / ff_block, rank, size, &b0, &nb);
    out->ff0 = b0 * ff_block;
    out->n_ff = nb * ff_block;
    return 0;
}
