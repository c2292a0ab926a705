/* A rank other than 0 (core/dist.h): open this rank's device, then answer
 * rank 0's requests until it says goodbye. Every buffer rank 0 names is
 * checked against what this rank allocated for it, so a bad message is an
 * error answer, never a stray write. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "dist_beat.h"
#include "dist_proto.h"
#include "error.h"
#include "log.h"

#define MAX_BUFS 4096

struct worker {
    struct dray_dist *t;
    struct dist_beat *beat; /* alive messages while a request runs */
    double timeout_s;       /* distributed_timeout: for sends to rank 0 */
    struct dray_device dev;
    struct dray_gguf *g;
    const struct dray_arch *arch;
    struct dray_model *model;
    struct dray_kv *view;
    struct {
        struct dray_buf *buf;
        size_t size;
    } bufs[MAX_BUFS];
    uint32_t n_bufs;
    float *x_out;
    size_t x_cap;
};

/* The buffer at address a if this rank allocated it and [off, off+n) fits. */
static struct dray_buf *known(const struct worker *w, uint64_t a, uint64_t off, uint64_t n)
{
    for (uint32_t i = 0; i < w->n_bufs; i++)
        if ((uint64_t)(uintptr_t)w->bufs[i].buf == a)
            return off <= w->bufs[i].size && n <= w->bufs[i].size - off ? w->bufs[i].buf : NULL;
    return NULL;
}

static bool known_view(const struct worker *w, struct dray_view v)
{
    return !v.buf || known(w, (uint64_t)(uintptr_t)v.buf, v.offset, 0);
}

static int answer(struct worker *w, int rc, const char *err, struct dist_ans a, const void *pay, size_t n,
                  char *why, size_t whylen)
{
    struct dist_msg m = {0};
    a.rc = rc;
    a.err_len = rc ? (uint32_t)strlen(err) : 0;
    dist_put(&m, &a, sizeof(a));
    dist_put(&m, err, a.err_len);
    if (!rc)
        dist_put(&m, pay, n);
    if (m.oom) {
        free(m.p);
        return dray_fail(why, whylen, DRAY_ENOMEM, "out of memory for an answer");
    }
    dist_beat_idle(w->beat);
    int trc = w->t->send(w->t->self, 0, m.p, m.n, w->timeout_s, why, whylen);
    if (!trc) /* a failed send may still read it: rank 0 is gone, and this rank ends */
        free(m.p);
    return trc ? DRAY_EIO : 0;
}

/* This rank's all-reduce (model opts allreduce): the ranks meet in every
 * layer, so a wait past distributed_timeout means a lost rank. */
static int allreduce(void *user, float *buf, size_t n, char *err, size_t errlen)
{
    const struct worker *w = user;
    return w->t->allreduce_f32(w->t->self, buf, n, w->timeout_s, err, errlen);
}

static void unload(struct worker *w)
{
    if (w->model)
        dray_model_free(w->model);
    w->model = NULL;
    dray_gguf_close(w->g);
    w->g = NULL;
    dray_kv_free(w->view);
    w->view = NULL;
}

static int do_load(struct worker *w, struct dist_rd *rd, const struct dist_req *q, char *err, size_t errlen,
                   struct dist_ans *a)
{
    const struct dray_model_opts *o = dist_take(rd, sizeof(*o));
    const char *path = o ? dist_take(rd, q->a) : NULL;
    const float *scores = path ? dist_take(rd, q->b * sizeof(float)) : NULL;
    if (!o || !path || (q->b && !scores) || q->a > 4095)
        return dray_fail(err, errlen, DRAY_EINVAL, "a malformed load request");
    char file[4096];
    snprintf(file, sizeof(file), "%.*s", (int)q->a, path);
    struct dray_model_opts mo = *o;
    mo.calib_scores = q->b ? scores : NULL;
    mo.n_calib_scores = q->b;
    mo.allreduce = NULL; /* rank 0's pointers mean nothing here: this rank's transport sums */
    mo.allreduce_user = NULL;
    if (mo.tp_size > 1 && !w->t->allreduce_f32)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor parallel: transport %s has no all-reduce",
                         w->t->name);
    if (mo.tp_size > 1) {
        mo.allreduce = allreduce;
        mo.allreduce_user = w;
    }
    unload(w);
    int rc = dray_gguf_open(file, &w->g, err, errlen);
    if (!rc)
        rc = dray_model_load(w->g, &w->dev, &mo, &w->arch, &w->model, err, errlen);
    const struct dray_model_info *mi = rc ? NULL : dray_model_info(w->model);
    if (mi && (rc = dray_kv_view_new(mi->n_layer, &w->view)))
        dray_fail(err, errlen, rc, "out of memory");
    if (rc) {
        unload(w);
        return rc;
    }
    a->a = mi->weight_bytes;
    a->b = mi->step_weight_bytes;
    a->c = mi->n_params;
    dray_info("rank %u: layers %u..%u of %s on %s (%s)%s", w->t->rank, mo.layer_begin,
              mo.layer_end ? mo.layer_end - 1 : 0, file, w->dev.plugin->name, w->dev.props.name,
              mo.tp_size > 1 ? ", a tensor parallel slice" : "");
    return 0;
}

static int do_forward(struct worker *w, struct dist_rd *rd, const struct dist_req *q, uint64_t *compute_ns,
                      char *err, size_t errlen)
{
    uint32_t l0 = (uint32_t)q->a, l1 = (uint32_t)q->b, n_tok = (uint32_t)q->c, n_embd = (uint32_t)q->d;
    if (!w->model)
        return dray_fail(err, errlen, DRAY_EINVAL, "no model loaded");
    const struct dray_model_info *mi = dray_model_info(w->model);
    if (l0 >= l1 || l1 > mi->n_layer || n_embd != mi->n_embd || !n_tok || n_tok > (1u << 20))
        return dray_fail(err, errlen, DRAY_EINVAL, "forward of layers %u..%u, %u tokens of %u: not this part "
                         "(%u layers of %u)", l0, l1, n_tok, n_embd, mi->n_layer, mi->n_embd);
    const int32_t *pos = dist_take(rd, (size_t)n_tok * sizeof(int32_t));
    for (uint32_t il = l0; pos && il < l1; il++) {
        const struct dray_kv_layer_step *st = dist_take(rd, sizeof(*st));
        const struct dray_kv_pool *pool = st ? dist_take(rd, sizeof(*pool)) : NULL;
        if (!pool)
            return dray_fail(err, errlen, DRAY_EINVAL, "a short forward request");
        struct dray_kv_layer_step s = *st;
        bool ok = known_view(w, s.slots) && known_view(w, s.seqs) && known_view(w, s.block_table);
        if (s.pool)
            ok = ok && known_view(w, pool->k) && known_view(w, pool->v) && known_view(w, pool->k_scale) &&
                 known_view(w, pool->v_scale);
        if (!ok)
            return dray_fail(err, errlen, DRAY_EINVAL, "layer %u: a KV view names a buffer this rank does not "
                             "hold", il);
        dray_kv_view_set(w->view, il, &s, s.pool ? pool : NULL);
    }
    size_t x_bytes = (size_t)n_tok * n_embd * sizeof(float);
    const float *x_in = pos ? dist_take(rd, x_bytes) : NULL;
    if (!x_in)
        return dray_fail(err, errlen, DRAY_EINVAL, "a short forward request");
    if (x_bytes > w->x_cap) {
        free(w->x_out);
        w->x_cap = 0;
        if (!(w->x_out = malloc(x_bytes)))
            return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
        w->x_cap = x_bytes;
    }
    struct dray_batch_part p = {.mb = 0, .layer_begin = l0, .layer_end = l1, .x_in = x_in, .x_out = w->x_out};
    struct dray_batch b = {.n_tok = n_tok, .pos = pos, .part = &p};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = dray_model_forward(w->model, w->view, &b, err, errlen);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *compute_ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)t1.tv_nsec - (uint64_t)t0.tv_nsec;
    return rc;
}

/* One request; *bye when it was the goodbye. A failed answer ends the loop. */
static int serve_one(struct worker *w, const void *msg, size_t n, bool *bye, char *why, size_t whylen)
{
    struct dist_rd rd = {msg, n, 0};
    const struct dist_req *q = dist_take(&rd, sizeof(*q));
    struct dist_ans a = {0};
    char err[1024] = "";
    const void *pay = NULL;
    size_t pay_n = 0;
    int rc = 0;
    struct dray_buf *b = NULL;
    const struct dray_ops *ops = w->dev.ops;
    struct dist_hello hello;
    void *tmp = NULL;
    if (!q)
        return answer(w, dray_fail(err, sizeof(err), DRAY_EINVAL, "a message of %zu bytes", n), err, a, NULL,
                      0, why, whylen);
    switch (q->op) {
    case DIST_HELLO:
        memset(&hello, 0, sizeof(hello));
        snprintf(hello.plugin, sizeof(hello.plugin), "%s", w->dev.plugin->name);
        snprintf(hello.host, sizeof(hello.host), "%s", w->t->host);
        hello.props = w->dev.props;
        hello.caps = w->dev.caps;
        hello.abi = w->dev.plugin->abi ? w->dev.plugin->abi : w->dev.ops->version;
        a.a = DIST_BUILD;
        pay = &hello;
        pay_n = sizeof(hello);
        break;
    case DIST_ALLOC:
        if (w->n_bufs == MAX_BUFS)
            rc = dray_fail(err, sizeof(err), DRAY_ENOMEM, "more than %d buffers", MAX_BUFS);
        else if ((rc = ops->alloc(w->dev.ctx, q->a, &b)))
            dray_fail(err, sizeof(err), rc, "%s: allocating %llu bytes: %s", w->dev.plugin->name,
                      (unsigned long long)q->a, dray_strerror(rc));
        else {
            w->bufs[w->n_bufs].buf = b;
            w->bufs[w->n_bufs++].size = q->a;
            a.a = (uint64_t)(uintptr_t)b;
        }
        break;
    case DIST_FREE:
        for (uint32_t i = 0; i < w->n_bufs; i++)
            if ((uint64_t)(uintptr_t)w->bufs[i].buf == q->a) {
                ops->free(w->dev.ctx, w->bufs[i].buf);
                w->bufs[i] = w->bufs[--w->n_bufs];
                break;
            }
        return 0; /* no answer */
    case DIST_UPLOAD:
        if (!(b = known(w, q->a, q->b, rd.n - rd.at)))
            rc = dray_fail(err, sizeof(err), DRAY_EINVAL, "upload to an unknown buffer or past its end");
        else if ((rc = ops->upload(w->dev.ctx, (struct dray_view){b, q->b}, rd.p + rd.at, rd.n - rd.at)))
            dray_fail(err, sizeof(err), rc, "%s: upload: %s", w->dev.plugin->name, dray_strerror(rc));
        break;
    case DIST_DOWNLOAD:
        if (!(b = known(w, q->a, q->b, q->c)))
            rc = dray_fail(err, sizeof(err), DRAY_EINVAL, "download from an unknown buffer or past its end");
        else if (!(tmp = malloc(q->c ? q->c : 1)))
            rc = dray_fail(err, sizeof(err), DRAY_ENOMEM, "out of memory");
        else if ((rc = ops->download(w->dev.ctx, tmp, (struct dray_view){b, q->b}, q->c)))
            dray_fail(err, sizeof(err), rc, "%s: download: %s", w->dev.plugin->name, dray_strerror(rc));
        pay = tmp;
        pay_n = q->c;
        break;
    case DIST_COPY: {
        struct dray_buf *src = known(w, q->c, q->d, q->e);
        if (!(b = known(w, q->a, q->b, q->e)) || !src)
            rc = dray_fail(err, sizeof(err), DRAY_EINVAL, "copy between unknown buffers or past their ends");
        else if (ops->copy)
            rc = ops->copy(w->dev.ctx, (struct dray_view){b, q->b}, (struct dray_view){src, q->d}, q->e);
        else if (!(tmp = malloc(q->e ? q->e : 1)))
            rc = DRAY_ENOMEM;
        else
            rc = ops->download(w->dev.ctx, tmp, (struct dray_view){src, q->d}, q->e) ||
                 ops->upload(w->dev.ctx, (struct dray_view){b, q->b}, tmp, q->e) ||
                 (ops->synchronize && ops->synchronize(w->dev.ctx)) ? DRAY_EBACKEND : 0;
        if (rc && !err[0])
            dray_fail(err, sizeof(err), rc, "%s: copy: %s", w->dev.plugin->name, dray_strerror(rc));
        break;
    }
    case DIST_SYNC:
        if (ops->synchronize && (rc = ops->synchronize(w->dev.ctx)))
            dray_fail(err, sizeof(err), rc, "%s: synchronize: %s", w->dev.plugin->name, dray_strerror(rc));
        break;
    case DIST_LOAD:
        rc = do_load(w, &rd, q, err, sizeof(err), &a);
        break;
    case DIST_UNLOAD:
        unload(w);
        break;
    case DIST_FORWARD:
        rc = do_forward(w, &rd, q, &a.a, err, sizeof(err));
        pay = w->x_out;
        pay_n = q->e ? 0 : (size_t)q->c * q->d * sizeof(float); /* e: tensor parallel, rank 0 has x */
        break;
    case DIST_CALIB_BEGIN:
        if (!w->model)
            rc = dray_fail(err, sizeof(err), DRAY_EINVAL, "no model to calibrate");
        else
            rc = dray_model_calib_begin(w->model, (uint32_t)q->a, (uint32_t)q->b, q->c != 0, err, sizeof(err));
        break;
    case DIST_CALIB_END:
        if (!w->model)
            rc = dray_fail(err, sizeof(err), DRAY_EINVAL, "no model to calibrate");
        else
            rc = dray_model_calib_end(w->model, q->a != 0, err, sizeof(err));
        break;
    case DIST_CALIB_SCORES: {
        const float *sc = NULL;
        a.a = w->model ? dray_model_calib_scores(w->model, &sc) : 0;
        pay = sc;
        pay_n = a.a * sizeof(float);
        break;
    }
    case DIST_BYE:
        *bye = true;
        return 0;
    default:
        rc = dray_fail(err, sizeof(err), DRAY_EINVAL, "unknown request %u", q->op);
    }
    int arc = answer(w, rc, err, a, pay, pay_n, why, whylen);
    free(tmp);
    return arc;
}

int dray_dist_worker(struct dray_dist *t, const struct dray_config *cfg, char *err, size_t errlen)
{
    struct worker *w = calloc(1, sizeof(*w));
    struct dray_registry *reg = NULL;
    if (!w)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    w->t = t;
    w->timeout_s = cfg->distributed_timeout;
    if (dist_beat_start(t, w->timeout_s, &w->beat)) {
        free(w);
        return dray_fail(err, errlen, DRAY_ENOMEM, "rank %u: no heartbeat thread", t->rank);
    }
    char open_err[1024] = "";
    int open_rc = dray_registry_open(cfg->plugin_path[0] ? cfg->plugin_path : NULL, &reg, open_err,
                                     sizeof(open_err));
    if (!open_rc)
        open_rc = dray_device_open_config(reg, cfg, &w->dev, open_err, sizeof(open_err));
    bool opened = !open_rc;
    if (opened)
        dray_info("rank %u of %u on %s: %s (%s), waiting for rank 0", t->rank, t->size, t->host,
                  w->dev.plugin->name, w->dev.props.name);
    else /* rank 0 still asks: every answer then says why, so it names this rank */
        dray_error("rank %u: %s", t->rank, open_err);
    int rc = 0;
    for (bool bye = false; !rc && !bye;) {
        void *msg = NULL;
        size_t n = 0;
        rc = t->recv(t->self, 0, 0, &msg, &n, err, errlen) ? DRAY_EIO : 0;
        const struct dist_req *q = !rc && n >= sizeof(*q) ? msg : NULL;
        if (!rc && (!q || (q->op != DIST_FREE && q->op != DIST_BYE))) /* it answers: beat till then */
            dist_beat_busy(w->beat);
        if (!rc && opened)
            rc = serve_one(w, msg, n, &bye, err, errlen);
        else if (q && q->op == DIST_BYE)
            bye = true;
        else if (!rc && (!q || q->op != DIST_FREE))
            rc = answer(w, open_rc, open_err, (struct dist_ans){0}, NULL, 0, err, errlen);
        free(msg);
    }
    dist_beat_stop(w->beat);
    unload(w);
    for (uint32_t i = 0; opened && i < w->n_bufs; i++)
        w->dev.ops->free(w->dev.ctx, w->bufs[i].buf);
    if (opened)
        dray_device_close(&w->dev);
    dray_registry_close(reg);
    free(w->x_out);
    free(w);
    return rc;
}
