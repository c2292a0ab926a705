/* Rank 0's side of another rank (core/dist.h): the greeting, the proxy
 * device's memory ops, and the stage calls (load, forward, calibration). One
 * request is in flight per rank at a time; ranks are called from several
 * threads at once (the split's stage workers). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "dist_proto.h"
#include "error.h"
#include "log.h"

struct dray_remote {
    struct dray_dist *t;
    uint32_t rank;
    pthread_mutex_t mu;
    struct dray_plugin plugin; /* name "<plugin>@rank<r>": what messages show */
    struct dray_ops ops;       /* the proxy: memory ops run on the rank */
    char host[64];
    double timeout_s;
    char lost[512]; /* why the rank stopped answering; every later call fails at once */
};

/* A silent or broken rank is not asked again: its step state is unknown
 * (r->mu held). */
static int lose(struct dray_remote *r, const char *why, char *err, size_t errlen)
{
    snprintf(r->lost, sizeof(r->lost), "%s", why);
    dray_dist_lost(r->rank);
    dray_error("rank %u (%s, %s) is lost: %s", r->rank, r->host, r->plugin.name, why);
    return dray_fail(err, errlen, DRAY_EIO, "rank %u (%s, %s): %s", r->rank, r->host, r->plugin.name, why);
}

/* Send m (a request) holding r->mu, and keep it held when the send went out:
 * the caller drops it once it has the answer (recv_answer), so one request is
 * in flight per rank. m is freed unless the send failed (the transport may
 * still read it, dray/dist.h). */
static int send_request(struct dray_remote *r, struct dist_msg *m, char *err, size_t errlen)
{
    char why[512];
    if (m->oom || dray_remote_lost(r, err, errlen)) {
        free(m->p);
        return m->oom ? dray_fail(err, errlen, DRAY_ENOMEM, "rank %u: out of memory for a message", r->rank)
                      : DRAY_EIO;
    }
    pthread_mutex_lock(&r->mu);
    if (r->t->send(r->t->self, r->rank, m->p, m->n, r->timeout_s, why, sizeof(why))) {
        int rc = lose(r, why, err, errlen);
        pthread_mutex_unlock(&r->mu);
        return rc;
    }
    free(m->p);
    return 0;
}

/* The rank's answer (r->mu held), past its heartbeats: its rc, its error text
 * into err, its payload in *rd (*buf to free). */
static int recv_answer(struct dray_remote *r, struct dist_ans *ans, void **buf, struct dist_rd *rd, char *err,
                       size_t errlen)
{
    char why[512];
    size_t n = 0;
    for (*buf = NULL;;) {
        if (r->t->recv(r->t->self, r->rank, r->timeout_s, buf, &n, why, sizeof(why)))
            return lose(r, why, err, errlen);
        const struct dist_ans *beat = *buf;
        if (n < sizeof(*beat) || beat->kind != DIST_ALIVE)
            break;
        free(*buf);
    }
    *rd = (struct dist_rd){*buf, n, 0};
    const struct dist_ans *a = dist_take(rd, sizeof(*a));
    const char *text = a ? dist_take(rd, a->err_len) : NULL;
    int rc = 0;
    if (!a || !text)
        rc = dray_fail(err, errlen, DRAY_EIO, "rank %u (%s): a short answer (%zu bytes)", r->rank, r->host, n);
    else if ((*ans = *a).rc)
        rc = dray_fail(err, errlen, ans->rc, "rank %u (%s, %s): %.*s", r->rank, r->host, r->plugin.name,
                       (int)ans->err_len, text);
    if (rc) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* Send m (a request) and, when answer, wait for the rank's answer (recv_answer). */
static int exchange(struct dray_remote *r, struct dist_msg *m, bool answer, struct dist_ans *ans, void **buf,
                    struct dist_rd *rd, char *err, size_t errlen)
{
    *buf = NULL;
    int rc = send_request(r, m, err, errlen);
    if (rc)
        return rc;
    if (answer)
        rc = recv_answer(r, ans, buf, rd, err, errlen);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* A request with no payload beyond what put adds; the answer's payload is
 * copied to out (out_n bytes exactly) when out. */
static int simple(struct dray_remote *r, struct dist_req q, const void *put, size_t put_n, void *out,
                  size_t out_n, struct dist_ans *ans, char *err, size_t errlen)
{
    struct dist_msg m = {0};
    struct dist_ans a_local;
    struct dist_rd rd;
    void *buf;
    dist_put(&m, &q, sizeof(q));
    dist_put(&m, put, put_n);
    int rc = exchange(r, &m, true, ans ? ans : &a_local, &buf, &rd, err, errlen);
    if (!rc && out) {
        const void *p = dist_take(&rd, out_n);
        if (p)
            memcpy(out, p, out_n);
        else
            rc = dray_fail(err, errlen, DRAY_EIO, "rank %u: %zu bytes expected, %zu came", r->rank, out_n,
                           rd.n - rd.at);
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------- the proxy device */

static struct dray_remote *of(struct dray_ctx *ctx)
{
    return (struct dray_remote *)ctx;
}

static uint64_t addr(const struct dray_buf *b)
{
    return (uint64_t)(uintptr_t)b;
}

/* The ops table returns codes: the rank-named reason is the calling thread's
 * last_error (several stage threads call at once). */
static __thread char proxy_err[768];

static int proxy_fail(int rc, const char *why)
{
    snprintf(proxy_err, sizeof(proxy_err), "%s", why);
    return rc;
}

static const char *p_last_error(struct dray_ctx *ctx)
{
    (void)ctx;
    return proxy_err;
}

static int p_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    struct dist_ans a;
    char why[768];
    int rc = simple(of(ctx), (struct dist_req){.op = DIST_ALLOC, .a = nbytes}, NULL, 0, NULL, 0, &a, why,
                    sizeof(why));
    *out = rc ? NULL : (struct dray_buf *)(uintptr_t)a.a;
    return rc ? proxy_fail(rc, why) : 0;
}

static void p_free(struct dray_ctx *ctx, struct dray_buf *buf)
{
    struct dist_msg m = {0};
    struct dist_req q = {.op = DIST_FREE, .a = addr(buf)};
    struct dist_ans a;
    struct dist_rd rd;
    void *b;
    char why[768];
    if (dray_remote_lost(of(ctx), why, sizeof(why))) /* its memory went with it */
        return;
    dist_put(&m, &q, sizeof(q));
    if (exchange(of(ctx), &m, false, &a, &b, &rd, why, sizeof(why)))
        dray_warn("%s", why);
}

static int p_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    char why[768];
    int rc = simple(of(ctx), (struct dist_req){.op = DIST_UPLOAD, .a = addr(dst.buf), .b = dst.offset}, src,
                    nbytes, NULL, 0, NULL, why, sizeof(why));
    return rc ? proxy_fail(rc, why) : 0;
}

static int p_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    char why[768];
    int rc = simple(of(ctx),
                    (struct dist_req){.op = DIST_DOWNLOAD, .a = addr(src.buf), .b = src.offset, .c = nbytes},
                    NULL, 0, dst, nbytes, NULL, why, sizeof(why));
    return rc ? proxy_fail(rc, why) : 0;
}

static int p_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    char why[768];
    int rc = simple(of(ctx),
                    (struct dist_req){.op = DIST_COPY, .a = addr(dst.buf), .b = dst.offset, .c = addr(src.buf),
                                      .d = src.offset, .e = nbytes},
                    NULL, 0, NULL, 0, NULL, why, sizeof(why));
    return rc ? proxy_fail(rc, why) : 0;
}

static int p_sync(struct dray_ctx *ctx)
{
    char why[768];
    int rc = simple(of(ctx), (struct dist_req){.op = DIST_SYNC}, NULL, 0, NULL, 0, NULL, why, sizeof(why));
    return rc ? proxy_fail(rc, why) : 0;
}

/* --------------------------------------------------------------- greeting */

int dray_remote_open(struct dray_dist *t, uint32_t rank, struct dray_remote **out, struct dray_device *dev,
                     char *err, size_t errlen)
{
    struct dray_remote *r = calloc(1, sizeof(*r));
    *out = NULL;
    if (!r)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    *r = (struct dray_remote){.t = t, .rank = rank, .timeout_s = 0};
    pthread_mutex_init(&r->mu, NULL);
    snprintf(r->host, sizeof(r->host), "?");
    snprintf(r->plugin.name, sizeof(r->plugin.name), "rank%u", rank);
    struct dist_hello hello;
    struct dist_ans a;
    int rc = simple(r, (struct dist_req){.op = DIST_HELLO, .a = DIST_BUILD}, NULL, 0, &hello, sizeof(hello), &a,
                    err, errlen);
    if (!rc && a.a != DIST_BUILD)
        rc = dray_fail(err, errlen, DRAY_EINVAL, "rank %u runs another dray build (layout %llx, here %llx): "
                       "run the same dray on every rank", rank, (unsigned long long)a.a,
                       (unsigned long long)DIST_BUILD);
    if (rc) {
        dray_remote_close(r);
        return rc;
    }
    hello.plugin[sizeof(hello.plugin) - 1] = hello.host[sizeof(hello.host) - 1] = 0;
    snprintf(r->host, sizeof(r->host), "%s", hello.host);
    snprintf(r->plugin.name, sizeof(r->plugin.name), "%.40s@rank%u", hello.plugin, rank);
    /* the rank's plugin's ABI (its memory ops exist in every version) */
    uint32_t abi = hello.abi >= DRAY_ABI_VERSION_MIN && hello.abi <= DRAY_ABI_VERSION ? hello.abi : DRAY_ABI_VERSION;
    r->plugin.abi = abi;
    r->ops = (struct dray_ops){.version = abi, .name = r->plugin.name, .alloc = p_alloc,
                               .free = p_free, .upload = p_upload, .download = p_download, .copy = p_copy,
                               .synchronize = p_sync, .last_error = p_last_error};
    r->plugin.ops = &r->ops;
    r->plugin.n_devices = 1;
    *dev = (struct dray_device){.plugin = &r->plugin, .ops = &r->ops, .ctx = (struct dray_ctx *)r,
                                .props = hello.props, .caps = hello.caps};
    snprintf(dev->props.name, sizeof(dev->props.name), "%.80s on %.40s", hello.props.name, hello.host);
    *out = r;
    return 0;
}

void dray_remote_set_timeout(struct dray_remote *r, uint32_t seconds)
{
    r->timeout_s = seconds;
}

bool dray_remote_lost(struct dray_remote *r, char *why, size_t whylen)
{
    pthread_mutex_lock(&r->mu);
    bool lost = r->lost[0] != 0;
    if (lost)
        snprintf(why, whylen, "rank %u (%s, %s) is lost: %s", r->rank, r->host, r->plugin.name, r->lost);
    pthread_mutex_unlock(&r->mu);
    return lost;
}

void dray_remote_close(struct dray_remote *r)
{
    if (!r)
        return;
    dray_dist_bye(r->t, r->rank);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* ------------------------------------------------------------ stage calls */

int dray_remote_load(struct dray_remote *r, const char *path, const struct dray_model_opts *mo,
                     uint64_t *weight_bytes, uint64_t *step_weight_bytes, uint64_t *n_params, char *err,
                     size_t errlen)
{
    struct dray_model_opts o = *mo;
    o.calib_scores = NULL; /* the scores follow the path */
    o.progress = false;
    struct dist_req q = {.op = DIST_LOAD, .a = strlen(path), .b = mo->calib_scores ? mo->n_calib_scores : 0};
    struct dist_msg m = {0};
    dist_put(&m, &q, sizeof(q));
    dist_put(&m, &o, sizeof(o));
    dist_put(&m, path, q.a);
    if (q.b)
        dist_put(&m, mo->calib_scores, q.b * sizeof(float));
    struct dist_ans a;
    struct dist_rd rd;
    void *buf;
    int rc = exchange(r, &m, true, &a, &buf, &rd, err, errlen);
    free(buf);
    if (!rc) {
        *weight_bytes = a.a;
        *step_weight_bytes = a.b;
        *n_params = a.c;
    }
    return rc;
}

void dray_remote_unload(struct dray_remote *r)
{
    char why[512];
    if (simple(r, (struct dist_req){.op = DIST_UNLOAD}, NULL, 0, NULL, 0, NULL, why, sizeof(why)))
        dray_warn("%s", why);
}

/* The DIST_FORWARD request for b->part's layers into *m: positions, each
 * layer's KV view (kv's layers il + kv_offset, micro-batch mb) and x_in; tp:
 * the rank sends no hidden states back. */
static int forward_request(struct dray_remote *r, const struct dray_kv *kv, uint32_t kv_offset, uint32_t mb,
                           uint32_t n_embd, const struct dray_batch *b, bool tp, struct dist_msg *m, char *err,
                           size_t errlen)
{
    const struct dray_batch_part *p = b->part;
    struct dist_req q = {.op = DIST_FORWARD, .a = p->layer_begin, .b = p->layer_end, .c = b->n_tok,
                         .d = n_embd, .e = tp};
    dist_put(m, &q, sizeof(q));
    dist_put(m, b->pos, (size_t)b->n_tok * sizeof(int32_t));
    for (uint32_t il = p->layer_begin; il < p->layer_end; il++) {
        const struct dray_kv_layer_step *st = dray_kv_layer_mb(kv, il + kv_offset, mb);
        struct dray_kv_pool none = {0};
        if (!st) {
            free(m->p);
            return dray_fail(err, errlen, DRAY_EINVAL, "rank %u: layer %u has no KV view in this step", r->rank,
                             il);
        }
        dist_put(m, st, sizeof(*st));
        dist_put(m, st->pool ? st->pool : &none, sizeof(none));
    }
    dist_put(m, p->x_in, (size_t)b->n_tok * n_embd * sizeof(float));
    return 0;
}

int dray_remote_forward(struct dray_remote *r, const struct dray_kv *kv, uint32_t n_embd,
                        const struct dray_batch *b, double *compute_s, char *err, size_t errlen)
{
    const struct dray_batch_part *p = b->part;
    if (!p || !p->x_in || !p->x_out)
        return dray_fail(err, errlen, DRAY_EINVAL, "rank %u: only layers run on another rank (the "
                         "embedding and head stay on rank 0)", r->rank);
    size_t x_bytes = (size_t)b->n_tok * n_embd * sizeof(float);
    struct dist_msg m = {0};
    int rc = forward_request(r, kv, 0, p->mb, n_embd, b, false, &m, err, errlen);
    if (rc)
        return rc;
    struct dist_ans a;
    struct dist_rd rd;
    void *buf;
    rc = exchange(r, &m, true, &a, &buf, &rd, err, errlen);
    const void *x = rc ? NULL : dist_take(&rd, x_bytes);
    if (!rc && !x)
        rc = dray_fail(err, errlen, DRAY_EIO, "rank %u: the hidden states came short", r->rank);
    if (x)
        memcpy(p->x_out, x, x_bytes);
    *compute_s = rc ? 0 : (double)a.a * 1e-9;
    free(buf);
    return rc;
}

int dray_remote_calib_begin(struct dray_remote *r, uint32_t n, uint32_t n_outlier, bool smooth_k, char *err,
                            size_t errlen)
{
    return simple(r, (struct dist_req){.op = DIST_CALIB_BEGIN, .a = n, .b = n_outlier, .c = smooth_k}, NULL, 0,
                  NULL, 0, NULL, err, errlen);
}

int dray_remote_calib_end(struct dray_remote *r, bool ok, char *err, size_t errlen)
{
    return simple(r, (struct dist_req){.op = DIST_CALIB_END, .a = ok}, NULL, 0, NULL, 0, NULL, err, errlen);
}

int dray_remote_calib_scores(struct dray_remote *r, float **scores, size_t *n, char *err, size_t errlen)
{
    struct dist_msg m = {0};
    struct dist_req q = {.op = DIST_CALIB_SCORES};
    struct dist_ans a;
    struct dist_rd rd;
    void *buf;
    dist_put(&m, &q, sizeof(q));
    *scores = NULL;
    *n = 0;
    int rc = exchange(r, &m, true, &a, &buf, &rd, err, errlen);
    const void *p = rc ? NULL : dist_take(&rd, a.a * sizeof(float));
    if (!rc && !p)
        rc = dray_fail(err, errlen, DRAY_EIO, "rank %u: the calibration scores came short", r->rank);
    if (p && a.a) {
        if ((*scores = malloc(a.a * sizeof(float)))) {
            memcpy(*scores, p, a.a * sizeof(float));
            *n = a.a;
        } else {
            rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
        }
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------- tensor parallel */

int dray_remote_forward_send(struct dray_remote *r, const struct dray_kv *kv, uint32_t kv_offset,
                             uint32_t n_embd, const struct dray_batch *b, char *err, size_t errlen)
{
    struct dist_msg m = {0};
    int rc = forward_request(r, kv, kv_offset, 0, n_embd, b, true, &m, err, errlen);
    return rc ? rc : send_request(r, &m, err, errlen); /* r->mu held until dray_remote_forward_wait */
}

int dray_remote_forward_wait(struct dray_remote *r, double *compute_s, char *err, size_t errlen)
{
    struct dist_ans a;
    struct dist_rd rd;
    void *buf;
    int rc = recv_answer(r, &a, &buf, &rd, err, errlen);
    pthread_mutex_unlock(&r->mu);
    *compute_s = rc ? 0 : (double)a.a * 1e-9;
    free(buf);
    return rc;
}
