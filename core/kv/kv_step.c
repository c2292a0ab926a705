/* KV manager: steps, each reserving blocks for its new tokens and uploading
 * its metadata (slots, seqs, block tables) in one transfer. See kv.h. */
#include "kv_internal.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

/* ------------------------------------------------------------------ steps */

static int step_check(struct dray_kv *kv, uint32_t n_seq, const uint32_t *ids, const uint32_t *n_new,
                      uint32_t n_mb, const uint32_t *mb_end, char *err, size_t errlen)
{
    if (n_mb < 1 || n_mb > DRAY_KV_MAX_MB || n_mb > n_seq || !mb_end || mb_end[n_mb - 1] != n_seq)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: %u micro-batches of %u sequences (1..%u, the "
                         "last ending at the last sequence)", n_mb, n_seq, DRAY_KV_MAX_MB);
    for (uint32_t m = 0; m < n_mb; m++)
        if (mb_end[m] <= (m ? mb_end[m - 1] : 0))
            return dray_fail(err, errlen, DRAY_EINVAL, "kv: micro-batch %u is empty (ends must ascend)", m);
    if (kv->in_step)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: step_begin inside a step (call step_end)");
    if (n_seq == 0 || n_seq > kv->d.max_seqs || !ids || !n_new)
        return dray_fail(err, errlen, DRAY_EINVAL, "kv: step of %u sequences, expected 1..%u",
                         n_seq, kv->d.max_seqs);
    int rc = 0;
    uint64_t n_tok = 0;
    for (uint32_t i = 0; i < n_seq; i++)
        n_tok += n_new[i];
    if (n_tok > INT32_MAX)
        return dray_fail(err, errlen, DRAY_ERANGE, "kv: step of %llu tokens is too large",
                         (unsigned long long)n_tok);
    for (uint32_t i = 0; i < n_seq && !rc; i++) {
        if (!seq_ok(kv, ids[i]))
            rc = dray_fail(err, errlen, DRAY_EINVAL, "kv: step entry %u: no sequence %u", i, ids[i]);
        else if (kv->mark[ids[i]])
            rc = dray_fail(err, errlen, DRAY_EINVAL, "kv: sequence %u appears twice in a step",
                           ids[i]);
        else if (n_new[i] == 0)
            rc = dray_fail(err, errlen, DRAY_EINVAL, "kv: sequence %u: n_new is 0", ids[i]);
        else if ((uint64_t)kv->seq_len[ids[i]] + n_new[i] > kv->d.max_ctx)
            rc = dray_fail(err, errlen, DRAY_ERANGE,
                           "kv: sequence %u: %u + %u tokens exceed max_ctx %u", ids[i],
                           kv->seq_len[ids[i]], n_new[i], kv->d.max_ctx);
        else
            kv->mark[ids[i]] = 1;
    }
    for (uint32_t i = 0; i < n_seq; i++)
        if (ids[i] < kv->d.max_seqs)
            kv->mark[ids[i]] = 0;
    return rc;
}

/* First sequence of micro-batch m of the step. */
static uint32_t mb_begin(const struct dray_kv *kv, uint32_t m)
{
    return m ? kv->step_mb_end[m - 1] : 0;
}

/* Lay out the metadata of every group and micro-batch (step_ids, step_new and
 * the micro-batches are set); returns total bytes. */
static size_t meta_layout(struct dray_kv *kv)
{
    size_t off = 0;
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        for (uint32_t m = 0; m < kv->step_n_mb; m++) {
            struct kv_group *gr = &kv->group[g];
            uint32_t n_tok = 0, n_bt = 0, i0 = mb_begin(kv, m), i1 = kv->step_mb_end[m];
            for (uint32_t i = i0; i < i1; i++) {
                n_tok += kv->step_new[i];
                n_bt += div_up(kv->seq_len[kv->step_ids[i]] + kv->step_new[i], kv->d.block_size);
            }
            gr->off_slots[m] = off;
            off = align_up(off + (size_t)n_tok * 4, META_ALIGN);
            gr->off_seqs[m] = off;
            off = align_up(off + (size_t)(i1 - i0) * 16, META_ALIGN);
            gr->off_bt[m] = off;
            off = align_up(off + (size_t)n_bt * 4, META_ALIGN);
            gr->n_bt[m] = n_bt;
        }
    return off;
}

/* Device d's metadata buffer of at least n bytes. It is only replaced after the
 * queue drained, since earlier steps' ops may still read it. */
static int meta_reserve_dev(struct dray_kv *kv, uint32_t d, size_t n, char *err, size_t errlen)
{
    const struct dray_ops *o = kv->dev[d].ops;
    struct dray_ctx *c = kv->dev[d].ctx;
    if (n <= kv->meta_buf_cap[d])
        return 0;
    size_t cap = kv->meta_buf_cap[d] * 2 > n ? kv->meta_buf_cap[d] * 2 : n;
    if (kv->meta_buf[d]) {
        /* a queued op may still read the old metadata: free it only once idle */
        if (o->synchronize && o->synchronize(c))
            return dray_fail(err, errlen, DRAY_EBACKEND, "kv: waiting for %s (device %u) before growing "
                             "the step metadata failed: %s", o->name, d, why(kv, d));
        o->free(c, kv->meta_buf[d]);
        kv->meta_buf[d] = NULL;
        kv->meta_buf_cap[d] = 0;
    }
    if (o->alloc(c, cap, &kv->meta_buf[d]) || !kv->meta_buf[d]) {
        kv->meta_buf[d] = NULL;
        return dray_fail(err, errlen, DRAY_ENOMEM, "kv: device allocation of %zu bytes for step "
                         "metadata on %s (device %u) failed: %s", cap, o->name, d, why(kv, d));
    }
    kv->meta_buf_cap[d] = cap;
    return 0;
}

/* Host staging of at least n bytes, and each device's buffer. */
static int meta_reserve(struct dray_kv *kv, size_t n, char *err, size_t errlen)
{
    if (n > kv->meta_host_cap) {
        void *p = realloc(kv->meta_host, n);
        if (!p)
            return dray_fail(err, errlen, DRAY_ENOMEM, "kv: out of host memory (%zu bytes)", n);
        kv->meta_host = p;
        kv->meta_host_cap = n;
    }
    for (uint32_t d = 0; d < kv->n_dev; d++) {
        int rc = kv->dev_used[d] ? meta_reserve_dev(kv, d, n, err, errlen) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

/* Take blocks for the new tokens' table entries of every sequence in group g. */
static void reserve_group(struct dray_kv *kv, uint32_t g)
{
    struct kv_group *gr = &kv->group[g];
    for (uint32_t i = 0; i < kv->step_n_seq; i++) {
        uint32_t s = kv->step_ids[i], len = kv->seq_len[s];
        int32_t *t = table_of(kv, g, s);
        uint32_t to = div_up(len + kv->step_new[i], kv->d.block_size);
        for (uint32_t e = div_up(len, kv->d.block_size); e < to; e++) {
            t[e] = (int32_t)gr->free_list[--gr->n_free];
            gr->ref[t[e]] = 1;
            gr->held[s]++;
        }
    }
}

/* Fill group g's slots, seqs and block_table of micro-batch m in the host
 * staging area; q_start and bt_start count from the micro-batch's start. */
static void build_group(struct dray_kv *kv, uint32_t g, uint32_t m)
{
    struct kv_group *gr = &kv->group[g];
    uint32_t bs = kv->d.block_size, q = 0, bt = 0, i0 = mb_begin(kv, m);
    int32_t *slots = (int32_t *)(kv->meta_host + gr->off_slots[m]);
    int32_t *seqs = (int32_t *)(kv->meta_host + gr->off_seqs[m]);
    int32_t *tab = (int32_t *)(kv->meta_host + gr->off_bt[m]);
    for (uint32_t i = i0; i < kv->step_mb_end[m]; i++) {
        uint32_t s = kv->step_ids[i], len = kv->seq_len[s], n = kv->step_new[i];
        const int32_t *t = table_of(kv, g, s);
        for (uint32_t p = len; p < len + n; p++)
            slots[q + p - len] = t[p / bs] * (int32_t)bs + (int32_t)(p % bs);
        seqs[4 * (i - i0) + 0] = (int32_t)q;
        seqs[4 * (i - i0) + 1] = (int32_t)n;
        seqs[4 * (i - i0) + 2] = (int32_t)(len + n);
        seqs[4 * (i - i0) + 3] = (int32_t)bt;
        uint32_t n_ent = div_up(len + n, bs);
        memcpy(tab + bt, t, n_ent * sizeof(*t)); /* recycled window entries are -1 */
        bt += n_ent;
        q += n;
    }
}

static void fill_layer_steps(struct dray_kv *kv)
{
    for (uint32_t m = 0; m < kv->step_n_mb; m++) {
        uint32_t n_tok = 0, max_kv = 0, i0 = mb_begin(kv, m);
        for (uint32_t i = i0; i < kv->step_mb_end[m]; i++) {
            uint32_t len = kv->seq_len[kv->step_ids[i]] + kv->step_new[i];
            n_tok += kv->step_new[i];
            max_kv = len > max_kv ? len : max_kv;
        }
        for (uint32_t il = 0; il < kv->d.n_layer; il++) {
            uint32_t g = kv->layer_group[il];
            const struct kv_group *gr = &kv->group[g];
            struct dray_buf *meta = kv->meta_buf[kv->layer_dev[il]];
            struct dray_kv_layer_step *ls = &kv->lsteps[(size_t)m * kv->d.n_layer + il];
            ls->pool = &gr->pools[kv->layer_index[il]];
            ls->slots = view_at(meta, gr->off_slots[m]);
            ls->seqs = view_at(meta, gr->off_seqs[m]);
            ls->block_table = view_at(meta, gr->off_bt[m]);
            ls->n_tok = n_tok;
            ls->n_seq = kv->step_mb_end[m] - i0;
            ls->max_kv_len = max_kv;
            ls->window = kv->plan.group[g].window;
            ls->store = kv->layer_store[il] != 0;
        }
    }
}

static void unreserve(struct dray_kv *kv)
{
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        for (uint32_t i = kv->step_n_seq; i-- > 0;) {
            uint32_t s = kv->step_ids[i], len = kv->seq_len[s];
            kv_release_entries(kv, g, s, div_up(len, kv->d.block_size),
                            div_up(len + kv->step_new[i], kv->d.block_size));
        }
}

int dray_kv_step_begin(struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                       const uint32_t *n_new, char *err, size_t errlen)
{
    return dray_kv_step_begin_split(kv, n_seq, seq_ids, n_new, 1, &n_seq, err, errlen);
}

/* Upload the staged metadata to every device that holds a layer. */
static int meta_upload(struct dray_kv *kv, size_t total, char *err, size_t errlen)
{
    for (uint32_t d = 0; d < kv->n_dev; d++) {
        if (!kv->dev_used[d])
            continue;
        int rc = kv->dev[d].ops->upload(kv->dev[d].ctx, view_at(kv->meta_buf[d], 0), kv->meta_host, total);
        if (rc)
            return dray_fail(err, errlen, rc < 0 ? rc : DRAY_EBACKEND, "kv: upload of %zu bytes of step "
                             "metadata to %s (device %u) failed: %s", total, kv->dev[d].ops->name, d,
                             why(kv, d));
    }
    return 0;
}

int dray_kv_step_begin_split(struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                             const uint32_t *n_new, uint32_t n_mb, const uint32_t *mb_end, char *err,
                             size_t errlen)
{
    int rc = step_check(kv, n_seq, seq_ids, n_new, n_mb, mb_end, err, errlen);
    if (rc)
        return rc;
    uint32_t n_tok = 0, max_kv = 0, need = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        uint32_t len = kv->seq_len[seq_ids[i]];
        n_tok += n_new[i];
        need += div_up(len + n_new[i], kv->d.block_size) - div_up(len, kv->d.block_size);
        if (len + n_new[i] > max_kv)
            max_kv = len + n_new[i];
    }
    /* every group gives each new table entry one block, plus one per shared
     * partial block this step writes into (copy on write) */
    uint32_t need_g[DRAY_KV_MAX_GROUPS];
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        need_g[g] = need;
        for (uint32_t i = 0; i < n_seq; i++)
            need_g[g] += kv_shared_tail(kv, g, seq_ids[i]) >= 0;
        if (need_g[g] > kv->group[g].n_free && kv->reclaim)
            kv->reclaim(kv->reclaim_user, g, need_g[g] - kv->group[g].n_free);
    }
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        if (need_g[g] > kv->group[g].n_free)
            return dray_fail(err, errlen, DRAY_ENOMEM,
                             "kv: step needs %u blocks in the window-%u group, %u free", need_g[g],
                             kv->plan.group[g].window, kv->group[g].n_free);
    for (uint32_t g = 0; g < kv->plan.n_group; g++)
        for (uint32_t i = 0; i < n_seq; i++)
            if ((rc = kv_unshare_tail(kv, g, seq_ids[i])))
                return dray_fail(err, errlen, rc,
                                 "kv: copy of a shared block before writing failed: %s",
                                 why(kv, 0));
    kv->step_n_seq = n_seq;
    kv->step_n_tok = n_tok;
    kv->step_max_kv = max_kv;
    kv->step_n_mb = n_mb;
    memcpy(kv->step_mb_end, mb_end, n_mb * sizeof(*mb_end));
    memcpy(kv->step_ids, seq_ids, n_seq * sizeof(*seq_ids));
    memcpy(kv->step_new, n_new, n_seq * sizeof(*n_new));
    size_t total = meta_layout(kv);
    rc = meta_reserve(kv, total, err, errlen);
    if (rc)
        return rc;
    for (uint32_t g = 0; g < kv->plan.n_group; g++) {
        reserve_group(kv, g);
        for (uint32_t m = 0; m < n_mb; m++)
            build_group(kv, g, m);
    }
    rc = meta_upload(kv, total, err, errlen);
    if (rc) {
        unreserve(kv);
        return rc;
    }
    fill_layer_steps(kv);
    kv->in_step = true;
    return 0;
}

const struct dray_kv_layer_step *dray_kv_layer(const struct dray_kv *kv, uint32_t il)
{
    return dray_kv_layer_mb(kv, il, 0);
}

const struct dray_kv_layer_step *dray_kv_layer_mb(const struct dray_kv *kv, uint32_t il, uint32_t mb)
{
    return kv->in_step && il < kv->d.n_layer && mb < kv->step_n_mb
               ? &kv->lsteps[(size_t)mb * kv->d.n_layer + il] : NULL;
}

uint32_t dray_kv_step_mbs(const struct dray_kv *kv)
{
    return kv->in_step ? kv->step_n_mb : 0;
}

const int32_t *dray_kv_step_host_mb(const struct dray_kv *kv, uint32_t g, uint32_t mb, const int32_t **seqs,
                                    const int32_t **block_table, uint32_t *n_bt)
{
    if (!kv->in_step || g >= kv->plan.n_group || mb >= kv->step_n_mb)
        return NULL;
    const struct kv_group *gr = &kv->group[g];
    if (seqs)
        *seqs = (const int32_t *)(kv->meta_host + gr->off_seqs[mb]);
    if (block_table)
        *block_table = (const int32_t *)(kv->meta_host + gr->off_bt[mb]);
    if (n_bt)
        *n_bt = gr->n_bt[mb];
    return (const int32_t *)(kv->meta_host + gr->off_slots[mb]);
}

const int32_t *dray_kv_step_host(const struct dray_kv *kv, uint32_t g, const int32_t **seqs,
                                 const int32_t **block_table, uint32_t *n_bt)
{
    return dray_kv_step_host_mb(kv, g, 0, seqs, block_table, n_bt);
}

void dray_kv_step_end(struct dray_kv *kv)
{
    if (!kv->in_step)
        return;
    for (uint32_t i = 0; i < kv->step_n_seq; i++) {
        uint32_t s = kv->step_ids[i];
        kv->seq_len[s] += kv->step_new[i];
        for (uint32_t g = 0; g < kv->plan.n_group; g++) {
            uint32_t *fl = &kv->group[g].first_live[s];
            /* measured from the last block boundary, so the blocks a query at that
             * boundary sees stay alive: the prefix cache checkpoints there */
            uint32_t dead = kept_from(kv, g, kv->seq_len[s]);
            if (dead > *fl) {
                kv_release_entries(kv, g, s, *fl, dead);
                *fl = dead;
            }
        }
    }
    kv->in_step = false;
}

void dray_kv_step_abort(struct dray_kv *kv)
{
    if (!kv->in_step)
        return;
    unreserve(kv);
    kv->in_step = false;
}
