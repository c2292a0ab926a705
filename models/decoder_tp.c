/* Tensor parallel slices of the decoder (model opts tp_size > 1): each rank
 * holds its query heads (with the KV heads they read) and its FFN columns of
 * every layer. QKV and gate|up are cut by output rows (column split), the
 * attention output and FFN down by input columns (row split), whose partial
 * sums the all-reduce adds. Everything else (norms, residual) is replicated. */
#include "decoder_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "log.h"

int dec_tp_setup(struct dray_model *m, const struct dray_model_opts *o, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    m->tp_rank = o->tp_size > 1 ? o->tp_rank : 0;
    m->tp_size = o->tp_size > 1 ? o->tp_size : 1;
    m->tp = (struct dray_tp_slice){0, in->n_head, 0, in->n_kv_head, 0, in->n_ff};
    if (m->tp_size > 1) {
        if (!o->allreduce)
            return dray_fail(err, errlen, DRAY_EINVAL, "tensor parallel: no all-reduce to sum the ranks with");
        m->tp = o->tp_slice; /* rank 0 sized every slice (core/split_tp.c) */
        const struct dray_tp_slice *s = &m->tp;
        if (!dray_tp_slice_ok(in, s))
            return dray_fail(err, errlen, DRAY_EINVAL, "tensor parallel rank %u: heads %u+%u, KV heads %u+%u, "
                             "ff %u+%u is not a slice of this model (%u heads, %u KV heads, ff %u)", m->tp_rank,
                             s->head0, s->n_head, s->kv0, s->n_kv, s->ff0, s->n_ff, in->n_head, in->n_kv_head,
                             in->n_ff);
        m->allreduce = o->allreduce;
        m->allreduce_user = o->allreduce_user;
    }
    m->ff_dim = m->tp.n_ff;
    return 0;
}

void dec_cut_rows(const struct dray_gguf_tensor *t, uint64_t r0, uint64_t n, struct dray_gguf_tensor *out)
{
    uint64_t row = t->ne[0] / dray_ggml_block_elems(t->type) * dray_ggml_block_bytes(t->type);
    *out = *t;
    out->ne[1] = n;
    out->data = (const unsigned char *)t->data + r0 * row;
    out->offset = t->offset + r0 * row;
    out->nbytes = n * row;
}

/* Input columns [k0, k0 + k) of every row of t, copied into *buf: whole
 * blocks of t's type only. */
static int cut_cols(const struct dray_gguf_tensor *t, uint64_t k0, uint64_t k, struct dray_gguf_tensor *out,
                    void **buf, char *err, size_t errlen)
{
    uint64_t be = dray_ggml_block_elems(t->type), bb = dray_ggml_block_bytes(t->type);
    if (!be || k0 % be || k % be)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor parallel: tensor %s cannot be cut at input "
                         "columns %llu..%llu: its type's blocks are %llu wide", t->name,
                         (unsigned long long)k0, (unsigned long long)(k0 + k - 1), (unsigned long long)be);
    uint64_t row = t->ne[0] / be * bb, part = k / be * bb, rows = t->ne[1];
    unsigned char *p = malloc(rows * part + 1);
    if (!(*buf = p))
        return dray_fail(err, errlen, DRAY_ENOMEM, "tensor parallel: out of host memory cutting %s", t->name);
    for (uint64_t r = 0; r < rows; r++)
        memcpy(p + r * part, (const unsigned char *)t->data + r * row + k0 / be * bb, part);
    *out = *t;
    out->ne[0] = k;
    out->data = p;
    out->nbytes = rows * part;
    return 0;
}

int dec_tp_cut(struct dray_model *m, int which, uint32_t part, const struct dray_gguf_tensor *t,
               struct dray_gguf_tensor *out, void **buf, char *err, size_t errlen)
{
    const struct dray_tp_slice *s = &m->tp;
    uint64_t hd = m->info.head_dim;
    int rc = 0;
    *buf = NULL;
    *out = *t;
    if (m->tp_size < 2)
        return 0;
    switch (which) {
    case MM_QKV: /* Q rows of its heads, K and V rows of its KV heads */
        dec_cut_rows(t, (part ? s->kv0 : s->head0) * hd, (part ? s->n_kv : s->n_head) * hd, out);
        break;
    case MM_GU:
        dec_cut_rows(t, s->ff0, s->n_ff, out);
        break;
    case MM_O:
        rc = cut_cols(t, s->head0 * hd, s->n_head * hd, out, buf, err, errlen);
        break;
    default:
        rc = cut_cols(t, s->ff0, s->n_ff, out, buf, err, errlen);
    }
    /* a name of its own: messages say which slice, and no cache keyed by the
     * name (round_cache.c skips names with '/') mistakes it for the whole */
    if (!rc)
        snprintf(out->name, sizeof(out->name), "%.40s/tp%u-of-%u", t->name, m->tp_rank, m->tp_size);
    return rc;
}

uint32_t dec_tp_k0(const struct dray_model *m, int which)
{
    return which == MM_O ? m->tp.head0 * m->info.head_dim : which == MM_DOWN ? m->tp.ff0 : 0;
}

uint32_t dec_tp_local_picks(struct dray_model *m, int which, uint32_t n)
{
    if (m->tp_size < 2 || (which != MM_O && which != MM_DOWN))
        return n;
    uint32_t k0 = dec_tp_k0(m, which), k = which == MM_O ? m->q_dim : m->ff_dim, kept = 0;
    for (uint32_t i = 0; i < n; i++)
        if ((uint32_t)m->pick[i] >= k0 && (uint32_t)m->pick[i] < k0 + k)
            m->pick[kept++] = m->pick[i] - (int32_t)k0;
    return kept;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int dec_tp_reduce(struct dray_model *m, uint32_t T)
{
    if (m->tp_size < 2)
        return 0;
    const struct dray_ops *ops = m->dev->ops;
    size_t n = (size_t)T * m->info.n_embd;
    double t0 = now_s();
    char why[512];
    int rc = ops->download(m->dev->ctx, m->tp_host, dec_at(m->a.o, 0), n * 4);
    if (!rc && (rc = m->allreduce(m->allreduce_user, m->tp_host, n, why, sizeof(why)))) {
        dray_error("tensor parallel rank %u: the all-reduce of %zu floats failed: %s", m->tp_rank, n, why);
        return DRAY_EIO;
    }
    if (!rc)
        rc = ops->upload(m->dev->ctx, dec_at(m->a.o, 0), m->tp_host, n * 4);
    m->info.tp_reduces++;
    m->info.tp_reduce_s += now_s() - t0;
    return rc;
}
