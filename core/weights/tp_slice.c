/* Tensor parallel: which heads and FFN columns each rank holds (model.h
 * dray_tp_slice). A pure function, so rank 0 can describe every rank's slice
 * and each rank computes its own the same way. */
#include "model.h"

#include "error.h"

/* Part i of n of `total` items: the first total % n parts get one more. */
static void share(uint32_t total, uint32_t i, uint32_t n, uint32_t *start, uint32_t *count)
{
    uint32_t base = total / n, extra = total % n;
    *start = i * base + (i < extra ? i : extra);
    *count = base + (i < extra);
}

int dray_tp_slice(const struct dray_model_info *mi, uint32_t ff_block, uint32_t rank, uint32_t size,
                  struct dray_tp_slice *out, char *err, size_t errlen)
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
    share(mi->n_ff / ff_block, rank, size, &b0, &nb);
    out->ff0 = b0 * ff_block;
    out->n_ff = nb * ff_block;
    return 0;
}
