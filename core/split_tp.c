/* Tensor parallel over the ranks of the job (config tensor_parallel, see
 * split.h): every rank holds a slice of every layer (its heads, its FFN
 * columns; dray_tp_slice), rank 0 also the embedding and head. A step is one
 * chain: rank 0 embeds, sends the hidden states and each rank's KV views, runs
 * its own slice while the others run theirs, and the ranks meet in two
 * all-reduces per layer; then rank 0 alone computes the logits.
 *
 * The KV of every slice is one dray_kv on rank 0 with one layer per (rank,
 * layer): layer r * n_layer + il is rank r's pool of layer il, on rank r's
 * proxy device. They share the block structure (same windows, same groups),
 * so block ids, copy on write, the prefix cache and host copies work for all
 * ranks at once, as they do across a pipeline's stages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "error.h"
#include "gguf.h"
#include "hparams.h"
#include "log.h"
#include "split_internal.h"

int split_tp_check(struct dray_split *s, const struct dray_config *cfg, uint32_t n, char *err, size_t errlen)
{
    s->tp = 0;
    if (cfg->tensor_parallel <= 1)
        return 0;
    if (cfg->tensor_parallel != n)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor_parallel %u with %u ranks: tensor parallel spans "
                         "every rank of the job (mpirun -np %u); with pipeline stages beside it is not "
                         "supported yet", cfg->tensor_parallel, n, cfg->tensor_parallel);
    struct dray_dist *t = dray_dist_get();
    if (!t || !t->allreduce_f32)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor_parallel %u: transport '%s' has no all-reduce",
                         cfg->tensor_parallel, cfg->distributed);
    s->tp = n;
    s->tp_timeout_s = cfg->distributed_timeout;
    return 0;
}

/* Rank 0's all-reduce (model opts allreduce): the transport's, waiting at most
 * distributed_timeout for the other ranks, so a rank that fails mid-step fails
 * the step instead of hanging it. */
static int allreduce(void *user, float *buf, size_t n, char *err, size_t errlen)
{
    const struct dray_split *s = user;
    struct dray_dist *t = dray_dist_get();
    return t->allreduce_f32(t->self, buf, n, s->tp_timeout_s, err, errlen);
}

/* Unload every rank's part (before a reload, or after a failed load). */
static void unload_all(struct dray_split *s)
{
    for (uint32_t d = 0; d < s->n_stage; d++) {
        if (s->st[d].model)
            dray_model_free(s->st[d].model);
        else if (s->st[d].remote && s->st[d].loaded)
            dray_remote_unload(s->st[d].remote);
        s->st[d].model = NULL;
        s->st[d].loaded = false;
    }
}

/* "heads 0-1 (KV 0), ff 0-767" */
static void describe(const struct dray_tp_slice *sl, char *out, size_t n)
{
    snprintf(out, n, "heads %u-%u (KV %u-%u), ff %u-%u of each", sl->head0, sl->head0 + sl->n_head - 1, sl->kv0,
             sl->kv0 + sl->n_kv - 1, sl->ff0, sl->ff0 + sl->n_ff - 1);
}

/* Every rank's slice, from the file's head counts and FFN width and config
 * layer_split (each rank's share of the FFN columns, for ranks of unequal
 * speed; it cannot offset rank 0's head, which runs after the layers, while
 * the other ranks wait for the next step). */
static int plan_slices(struct dray_split *s, struct dray_gguf *g, const struct dray_config *cfg, char *err,
                       size_t errlen)
{
    const struct dray_arch *a = dray_model_arch_of(g);
    const struct dray_gguf_tensor *down = dray_gguf_find_tensor(g, "blk.0.ffn_down.weight");
    struct dray_model_info hp = {0};
    double share[DRAY_SPLIT_MAX];
    if (!a || !down)
        return dray_fail(err, errlen, DRAY_EFORMAT, "tensor parallel: %s is not a model dray can slice "
                         "(%s)", dray_gguf_name(g), a ? "no blk.0.ffn_down.weight" : "unknown architecture");
    int rc = dray_hparam_u32(g, a->name, "attention.head_count", 1, 65536, NULL, &hp.n_head, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, a->name, "attention.head_count_kv", 1, hp.n_head, NULL, &hp.n_kv_head, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, a->name, "feed_forward_length", 1, 1u << 20, NULL, &hp.n_ff, err, errlen);
    if (!rc && hp.n_head % hp.n_kv_head)
        rc = dray_fail(err, errlen, DRAY_EFORMAT, "tensor parallel: %u heads over %u KV heads", hp.n_head,
                       hp.n_kv_head);
    if (!rc && cfg->layer_split[0])
        rc = split_parse_list("layer_split", cfg->layer_split, s->tp, false, share, err, errlen);
    for (uint32_t r = 0; !rc && r < s->tp; r++)
        rc = dray_tp_slice(&hp, dray_ggml_block_elems(down->type), cfg->layer_split[0] ? share : NULL, r, s->tp,
                           &s->slice[r], err, errlen);
    return rc;
}

int split_tp_load(struct dray_split *s, struct dray_gguf *g, const struct dray_config *cfg,
                  const struct dray_model_opts *mo, const struct dray_arch **arch, char *err, size_t errlen)
{
    char why[1024], line[1024];
    unload_all(s);
    int rc = plan_slices(s, g, cfg, err, errlen);
    if (rc)
        return rc;
    struct dray_split_stage *st0 = &s->st[0];
    struct dray_model_opts o = *mo;
    o.part = false;
    o.tp_rank = 0;
    o.tp_size = s->tp;
    o.tp_slice = s->slice[0];
    o.allreduce = allreduce;
    o.allreduce_user = s;
    rc = dray_model_load(g, &st0->dev, &o, arch, &st0->model, why, sizeof(why));
    if (rc)
        return dray_fail(err, errlen, rc, "tensor parallel rank 0 (%s): %s", st0->dev.plugin->name, why);
    s->arch = *arch;
    const struct dray_model_info *mi = dray_model_info(st0->model);
    s->n_layer = mi->n_layer;
    s->n_embd = mi->n_embd;
    s->n_vocab = mi->n_vocab;
    s->head = 0;
    size_t at = (size_t)snprintf(line, sizeof(line), "tensor parallel: %u ranks, layers 0-%u on each:", s->tp,
                                 mi->n_layer - 1);
    for (uint32_t r = 0; !rc && r < s->tp; r++) {
        struct dray_split_stage *st = &s->st[r];
        st->l0 = 0;
        st->l1 = mi->n_layer;
        st->head = r == 0;
        if (!rc && r) {
            o = *mo;
            o.part = o.no_head = true;
            o.layer_begin = 0;
            o.layer_end = mi->n_layer;
            o.tp_rank = r;
            o.tp_size = s->tp;
            o.tp_slice = s->slice[r];
            rc = dray_remote_load(st->remote, cfg->model, &o, &st->weight_bytes, &st->step_weight_bytes,
                                  &st->n_params, why, sizeof(why));
            if (rc)
                dray_fail(err, errlen, rc, "tensor parallel rank %u (%s): %s", r, st->dev.plugin->name, why);
        } else if (!rc) {
            st->weight_bytes = mi->weight_bytes;
            st->step_weight_bytes = mi->step_weight_bytes;
            st->n_params = mi->n_params;
        }
        st->loaded = rc == 0;
        if (!rc) {
            describe(&s->slice[r], st->slice, sizeof(st->slice));
            at += (size_t)snprintf(line + at, at < sizeof(line) ? sizeof(line) - at : 0, "%s rank %u %s",
                                   r ? ";" : "", r, st->slice);
        }
    }
    if (rc) {
        unload_all(s);
        return rc;
    }
    s->tp_g = g;
    s->tp_cfg = cfg;
    s->tp_mo = *mo;
    s->tp_mo.calib_scores = NULL; /* the caller's, gone after the load */
    s->tp_mo.n_calib_scores = 0;
    dray_info("%s", line);
    return 0;
}

int split_tp_reload(struct dray_split *s, const float *scores, size_t n, char *err, size_t errlen)
{
    struct dray_model_opts o = s->tp_mo;
    const struct dray_arch *a = s->arch;
    o.calib_scores = scores;
    o.n_calib_scores = n;
    o.progress = false;
    return split_tp_load(s, s->tp_g, s->tp_cfg, &o, &a, err, errlen);
}

int split_tp_kv_create(const struct dray_split *s, const struct dray_kv_desc *d, struct dray_kv **out,
                       char *err, size_t errlen)
{
    uint32_t n = s->tp * d->n_layer;
    struct dray_kv_device devs[DRAY_SPLIT_MAX];
    uint32_t *window = malloc(n * sizeof(*window));
    int32_t *share = malloc(n * sizeof(*share));
    uint8_t *layer_dev = malloc(n);
    int rc = window && share && layer_dev ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    for (uint32_t r = 0; !rc && r < s->tp; r++) {
        devs[r] = (struct dray_kv_device){s->st[r].dev.ops, s->st[r].dev.ctx};
        for (uint32_t il = 0; il < d->n_layer; il++) { /* rank r's layer il: one more layer of its group */
            uint32_t v = r * d->n_layer + il;
            window[v] = d->window[il];
            share[v] = d->share_with && d->share_with[il] >= 0 ? (int32_t)(r * d->n_layer) + d->share_with[il]
                                                               : -1;
            layer_dev[v] = (uint8_t)r;
        }
    }
    struct dray_kv_desc dd = *d;
    dd.n_layer = n;
    dd.window = window;
    dd.share_with = share;
    dd.layer_dev = layer_dev;
    dd.n_kv_head = s->slice[0].n_kv; /* the same on every rank (dray_tp_slice) */
    if (!rc)
        rc = dray_kv_create_on(devs, s->tp, &dd, out, err, errlen);
    free(window);
    free(share);
    free(layer_dev);
    return rc;
}

int split_tp_forward(struct dray_split *s, struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                     const uint32_t *n_new, const struct dray_batch *b, char *err, size_t errlen)
{
    double t_start = split_now_s();
    struct dray_split_stage *st0 = &s->st[0];
    int rc = split_reserve(s, 1, b->n_tok, 0) ? dray_fail(err, errlen, DRAY_ENOMEM, "out of memory") : 0;
    if (!rc)
        rc = dray_kv_step_begin(kv, n_seq, seq_ids, n_new, err, errlen);
    if (rc)
        return rc;
    char why[1024];
    /* x = the embedding, on rank 0 */
    struct dray_batch_part pe = {.x_out = s->x[0]};
    struct dray_batch be = {.n_tok = b->n_tok, .ids = b->ids, .pos = b->pos, .part = &pe};
    rc = dray_model_forward(st0->model, kv, &be, why, sizeof(why));
    if (rc)
        dray_fail(err, errlen, rc, "tensor parallel rank 0 (%s), the embedding: %s", st0->dev.plugin->name, why);
    /* every rank's slice of every layer, at once */
    struct dray_batch_part pl = {.layer_begin = 0, .layer_end = s->n_layer, .x_in = s->x[0]};
    struct dray_batch bl = *b;
    bl.part = &pl;
    uint32_t n_sent = 1;
    for (; !rc && n_sent < s->tp; n_sent++) {
        rc = dray_remote_forward_send(s->st[n_sent].remote, kv, n_sent * s->n_layer, s->n_embd, &bl, err,
                                      errlen);
        if (rc)
            break;
    }
    double t0 = split_now_s();
    if (!rc && (rc = dray_model_forward(st0->model, kv, &bl, why, sizeof(why))))
        dray_fail(err, errlen, rc, "tensor parallel rank 0 (%s): %s", st0->dev.plugin->name, why);
    st0->busy_s += split_now_s() - t0;
    /* every request sent gets its answer taken; the time between the ranks is
     * the all-reduces' (stats.allreduce_s), not a call's wire time: a rank's
     * answer waits while rank 0 computes the head */
    for (uint32_t r = 1; r < n_sent; r++) {
        double compute = 0;
        char rwhy[768];
        int rc2 = dray_remote_forward_wait(s->st[r].remote, &compute, rwhy, sizeof(rwhy));
        /* a lost rank is why rank 0's own all-reduce failed: name it */
        if (rc2 && (!rc || dray_remote_lost(s->st[r].remote, rwhy, sizeof(rwhy))))
            dray_fail(err, errlen, rc2, "%s", rwhy);
        rc = rc ? rc : rc2;
        s->st[r].busy_s += compute;
    }
    if (rc)
        dray_kv_step_abort(kv);
    else
        dray_kv_step_end(kv);
    const struct dray_model_info *mi = dray_model_info(st0->model);
    s->stats.allreduces = mi->tp_reduces;
    s->stats.allreduce_s = mi->tp_reduce_s;
    s->stats.steps++;
    s->stats.wall_s += split_now_s() - t_start;
    return rc;
}
