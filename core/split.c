/* One model over several devices: opening the stages, loading their parts, and
 * running a step as chains of tasks, pipelined over micro-batches. See split.h. */
#include "split_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "calibrate.h"
#include "dist.h"
#include "error.h"
#include "gguf.h"
#include "log.h"

/* Seconds on the monotonic clock. */
double split_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------- open */

/* Stages 2.. are the transport's other ranks, greeted in order. */
static int open_ranks(struct dray_split *s, const struct dray_config *cfg, char *err, size_t errlen)
{
    struct dray_dist *t = NULL;
    int rc = dray_dist_open(cfg, &t, err, errlen);
    if (!rc && (t->size < 2 || t->size > DRAY_SPLIT_MAX))
        rc = dray_fail(err, errlen, DRAY_EINVAL, "distributed '%s': %u ranks, a split takes 2..%u (mpirun -np N)",
                       cfg->distributed, t->size, DRAY_SPLIT_MAX);
    if (!rc)
        rc = split_tp_check(s, cfg, t->size, err, errlen);
    for (uint32_t r = 1; !rc && t && r < t->size; r++) {
        struct dray_split_stage *st = &s->st[r];
        rc = dray_remote_open(t, r, &st->remote, &st->dev, err, errlen);
        if (!rc) {
            dray_remote_set_timeout(st->remote, cfg->distributed_timeout);
            s->n_stage = r + 1;
        }
    }
    return rc;
}

int dray_split_open(struct dray_registry *reg, const struct dray_config *cfg, struct dray_split **out,
                    char *err, size_t errlen)
{
    uint32_t n = dray_config_list_len(cfg->backend), n_devs = dray_config_list_len(cfg->device);
    bool dist = cfg->distributed[0] != 0;
    *out = NULL;
    if (dist && n != 1)
        return dray_fail(err, errlen, DRAY_EINVAL, "backend '%s': with distributed, each rank names one plugin "
                         "(its own config or --set)", cfg->backend);
    if (!dist && (n < 2 || n > DRAY_SPLIT_MAX))
        return dray_fail(err, errlen, DRAY_EINVAL, "backend '%s': a split takes 2..%u plugins", cfg->backend,
                         DRAY_SPLIT_MAX);
    if (n_devs > 1 && n_devs != n)
        return dray_fail(err, errlen, DRAY_EINVAL, "device '%s' names %u devices for the %u plugins of "
                         "backend '%s': give one per plugin (or one for all)", cfg->device, n_devs, n,
                         cfg->backend);
    struct dray_split *s = calloc(1, sizeof(*s));
    if (!s)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    s->micro_batches = cfg->micro_batches;
    for (uint32_t i = 0; i < n; i++) {
        struct dray_config c = *cfg;
        dray_config_list_entry(cfg->backend, i, c.backend, sizeof(c.backend));
        dray_config_list_entry(cfg->device, n_devs > 1 ? i : 0, c.device, sizeof(c.device));
        char why[1024];
        int rc = c.backend[0] ? dray_device_open_config(reg, &c, &s->st[i].dev, why, sizeof(why))
                              : dray_fail(why, sizeof(why), DRAY_EINVAL, "empty entry");
        if (rc) {
            dray_split_free(s);
            return dray_fail(err, errlen, rc, "backend '%s', device %u of the split: %s", cfg->backend,
                             i + 1, why);
        }
        s->n_stage = i + 1;
    }
    int rc = dist ? open_ranks(s, cfg, err, errlen) : 0;
    if (rc) {
        dray_split_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void dray_split_free(struct dray_split *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; i < s->n_stage; i++) {
        if (s->st[i].model)
            dray_model_free(s->st[i].model);
        if (s->st[i].remote)
            dray_remote_close(s->st[i].remote);
        else
            dray_device_close(&s->st[i].dev);
    }
    for (uint32_t m = 0; m < DRAY_KV_MAX_MB; m++)
        free(s->x[m]);
    free(s->rows);
    free(s);
}

uint32_t dray_split_n(const struct dray_split *s) { return s->n_stage; }
uint32_t dray_split_head(const struct dray_split *s) { return s->head; }
struct dray_split_stage *dray_split_stage_at(struct dray_split *s, uint32_t i) { return &s->st[i]; }
const struct dray_split_stage *dray_split_stage_c(const struct dray_split *s, uint32_t i) { return &s->st[i]; }

/* ------------------------------------------------------------------- load */

/* Comma-separated numbers of a config key, one per device. */
int split_parse_list(const char *key, const char *text, uint32_t n, bool bytes, double *out, char *err,
                      size_t errlen)
{
    if (dray_config_list_len(text) != n)
        return dray_fail(err, errlen, DRAY_EINVAL, "%s '%s': %u entries for %u devices", key, text,
                         dray_config_list_len(text), n);
    for (uint32_t i = 0; i < n; i++) {
        char e[64], *end;
        dray_config_list_entry(text, i, e, sizeof(e));
        double v = strtod(e, &end);
        double mul = !bytes ? 1 : *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
                     : *end == 'G' || *end == 'g' ? 1073741824.0 : 1;
        if (mul != 1)
            end++;
        if (bytes && *end == 'i')
            end++;
        if (bytes && (*end == 'B' || *end == 'b'))
            end++;
        if (end == e || *end || v < 0)
            return dray_fail(err, errlen, DRAY_EINVAL, "%s entry %u: expected a number%s >= 0, got '%s'", key,
                             i + 1, bytes ? " of bytes (K, M, G suffixes)" : "", e);
        out[i] = v * mul;
    }
    return 0;
}

/* Each layer's bytes in the file (blk.N.*) plus its KV, and the head's. */
static int file_bytes(struct dray_gguf *g, uint32_t n_layer, uint64_t kv_layer, uint64_t *layer,
                      uint64_t *head)
{
    *head = 0;
    for (uint32_t il = 0; il < n_layer; il++)
        layer[il] = kv_layer;
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++) {
        const struct dray_gguf_tensor *t = dray_gguf_tensor_at(g, i);
        unsigned il;
        if (sscanf(t->name, "blk.%u.", &il) == 1) {
            if (il >= n_layer)
                return DRAY_EFORMAT;
            layer[il] += t->nbytes;
        } else {
            *head += t->nbytes; /* token_embd, output, output_norm */
        }
    }
    return 0;
}

/* The chain of tasks of one micro-batch: embed on the head's stage, each
 * stage's layers in order, the head; consecutive tasks of one stage merge. */
static void build_tasks(struct dray_split *s)
{
    struct split_task t[MAX_TASK];
    uint32_t n = 0;
    t[n++] = (struct split_task){.stage = s->head, .l0 = s->st[s->head].l0, .l1 = s->st[s->head].l0,
                                 .embed = true};
    for (uint32_t d = 0; d < s->n_stage; d++)
        if (s->st[d].l1 > s->st[d].l0)
            t[n++] = (struct split_task){.stage = d, .l0 = s->st[d].l0, .l1 = s->st[d].l1};
    t[n++] = (struct split_task){.stage = s->head, .l0 = s->st[s->head].l1, .l1 = s->st[s->head].l1,
                                 .logits = true};
    s->n_task = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct split_task *last = s->n_task ? &s->task[s->n_task - 1] : NULL;
        if (last && last->stage == t[i].stage) {
            if (t[i].l1 > t[i].l0) {
                last->l0 = last->l1 > last->l0 ? last->l0 : t[i].l0;
                last->l1 = t[i].l1;
            }
            last->logits = last->logits || t[i].logits;
        } else {
            s->task[s->n_task++] = t[i];
        }
    }
}

int dray_split_load(struct dray_split *s, const struct dray_config *cfg, struct dray_gguf *g,
                    const struct dray_model_opts *mo, uint64_t kv_layer_bytes,
                    const struct dray_arch **arch, char *err, size_t errlen)
{
    const struct dray_arch *a = dray_model_arch_of(g);
    uint32_t n_layer = 0;
    if (!a)
        return dray_model_load(g, &s->st[0].dev, mo, arch, &s->st[0].model, err, errlen); /* names it */
    if (s->tp)
        return split_tp_load(s, g, cfg, mo, arch, err, errlen);
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++) {
        unsigned il;
        if (sscanf(dray_gguf_tensor_at(g, i)->name, "blk.%u.", &il) == 1 && il < 4096 && il + 1 > n_layer)
            n_layer = il + 1;
    }
    if (n_layer == 0)
        return dray_fail(err, errlen, DRAY_EFORMAT, "split: the model file has no layers (blk.N.*)");
    uint64_t *lb = calloc(n_layer, sizeof(*lb)), head = 0;
    double ratio[DRAY_SPLIT_MAX], budget[DRAY_SPLIT_MAX];
    uint64_t budget_b[DRAY_SPLIT_MAX], mem[DRAY_SPLIT_MAX];
    int rc = lb ? file_bytes(g, n_layer, kv_layer_bytes, lb, &head) : DRAY_ENOMEM;
    if (rc)
        rc = dray_fail(err, errlen, rc, "split: reading the layers' sizes: %s", dray_strerror(rc));
    if (!rc && cfg->layer_split[0])
        rc = split_parse_list("layer_split", cfg->layer_split, s->n_stage, false, ratio, err, errlen);
    if (!rc && cfg->device_memory[0])
        rc = split_parse_list("device_memory", cfg->device_memory, s->n_stage, true, budget, err, errlen);
    for (uint32_t d = 0; d < s->n_stage; d++) {
        budget_b[d] = (uint64_t)budget[d];
        mem[d] = s->st[d].dev.props.mem_free ? s->st[d].dev.props.mem_free : s->st[d].dev.props.mem_total;
    }
    struct dray_split_need need = {.n_layer = n_layer, .layer_bytes = lb, .head_bytes = head};
    struct dray_split_ask ask = {.n_dev = s->n_stage, .ratio = cfg->layer_split[0] ? ratio : NULL,
                                 .budget = cfg->device_memory[0] ? budget_b : NULL, .mem = mem,
                                 .head_dev = cfg->head_device};
    if (cfg->distributed[0]) { /* rank 0 keeps the tokens and the logits: no vocabulary crosses */
        if (cfg->head_device > 1)
            rc = rc ? rc : dray_fail(err, errlen, DRAY_EINVAL, "head_device %u: with distributed the "
                                     "embedding and head stay on rank 0 (head_device 1)", cfg->head_device);
        ask.head_dev = 1;
    }
    struct dray_split_place pl;
    if (!rc)
        rc = dray_split_place(&need, &ask, &pl, err, errlen);
    free(lb);
    if (rc)
        return rc;
    s->arch = a;
    s->head = pl.head;
    for (uint32_t d = 0; d < s->n_stage && !rc; d++) {
        struct dray_split_stage *st = &s->st[d];
        st->l0 = d ? pl.layer_end[d - 1] : 0;
        st->l1 = pl.layer_end[d];
        st->head = d == pl.head;
        if (st->l1 == st->l0 && !st->head) {
            dray_warn("split: device %u (%s) gets no layers", d + 1, st->dev.plugin->name);
            continue;
        }
        struct dray_model_opts o = *mo;
        o.part = true;
        o.layer_begin = st->l0;
        o.layer_end = st->l1;
        o.no_head = !st->head;
        char why[1024];
        if (st->remote) {
            rc = dray_remote_load(st->remote, cfg->model, &o, &st->weight_bytes, &st->step_weight_bytes,
                                  &st->n_params, why, sizeof(why));
        } else if (!(rc = dray_model_load(g, &st->dev, &o, arch, &st->model, why, sizeof(why)))) {
            const struct dray_model_info *pi = dray_model_info(st->model);
            st->weight_bytes = pi->weight_bytes;
            st->step_weight_bytes = pi->step_weight_bytes;
            st->n_params = pi->n_params;
        }
        st->loaded = rc == 0;
        if (rc)
            dray_fail(err, errlen, rc, "device %u (%s, %s) layers %u-%u%s: %s", d + 1, st->dev.plugin->name,
                      st->dev.props.name, st->l0, st->l1 ? st->l1 - 1 : 0, st->head ? " and the head" : "", why);
        else
            dray_info("split: device %u (%s, %s): layers %u..%u%s", d + 1, st->dev.plugin->name,
                      st->dev.props.name, st->l0, st->l1 ? st->l1 - 1 : 0, st->head ? " and the head" : "");
    }
    if (rc) { /* a retry (engine.c, on stale cached scores) starts clean */
        for (uint32_t d = 0; d < s->n_stage; d++) {
            if (s->st[d].model)
                dray_model_free(s->st[d].model);
            else if (s->st[d].remote && s->st[d].loaded)
                dray_remote_unload(s->st[d].remote);
            s->st[d].model = NULL;
            s->st[d].loaded = false;
        }
        return rc;
    }
    const struct dray_model_info *mi = dray_model_info(s->st[s->head].model);
    s->n_embd = mi->n_embd;
    s->n_vocab = mi->n_vocab;
    build_tasks(s);
    return 0;
}

void dray_split_kv_devices(const struct dray_split *s, struct dray_kv_device *devs, uint8_t *layer_dev)
{
    for (uint32_t d = 0; d < s->n_stage; d++) {
        devs[d] = (struct dray_kv_device){s->st[d].dev.ops, s->st[d].dev.ctx};
        for (uint32_t il = s->st[d].l0; il < s->st[d].l1; il++)
            layer_dev[il] = (uint8_t)d;
    }
}

int dray_split_kv_create(const struct dray_split *s, const struct dray_kv_desc *d, struct dray_kv **out,
                         char *err, size_t errlen)
{
    if (s->tp)
        return split_tp_kv_create(s, d, out, err, errlen);
    struct dray_kv_device devs[DRAY_SPLIT_MAX];
    uint8_t layer_dev[DRAY_MAX_LAYERS];
    if (d->n_layer > DRAY_MAX_LAYERS)
        return dray_fail(err, errlen, DRAY_ERANGE, "split: %u layers, at most %d", d->n_layer, DRAY_MAX_LAYERS);
    dray_split_kv_devices(s, devs, layer_dev);
    struct dray_kv_desc dd = *d;
    dd.layer_dev = layer_dev;
    return dray_kv_create_on(devs, s->n_stage, &dd, out, err, errlen);
}

/* ---------------------------------------------------------------- forward */

/* Micro-batches for a step, balanced by tokens; mb_end as the KV wants it. */
static uint32_t pick_mbs(const struct dray_split *s, uint32_t n_seq, const uint32_t *n_new,
                         const struct dray_batch *b, uint32_t *mb_end)
{
    uint32_t busy = 0, want, T = 0;
    for (uint32_t d = 0; d < s->n_stage; d++)
        busy += s->st[d].loaded;
    want = s->micro_batches ? s->micro_batches : busy;
    want = want < n_seq ? want : n_seq;
    want = want < DRAY_KV_MAX_MB ? want : DRAY_KV_MAX_MB;
    for (uint32_t i = 1; i < b->n_logits; i++)
        if (b->logit_rows[i] <= b->logit_rows[i - 1])
            want = 1; /* each micro-batch's logits must be one slice of the output */
    if (s->n_task < 2 || want < 2) {
        mb_end[0] = n_seq;
        return 1;
    }
    for (uint32_t i = 0; i < n_seq; i++)
        T += n_new[i];
    uint32_t k = 0;
    uint64_t cum = 0;
    for (uint32_t i = 0; i < n_seq && k + 1 < want; i++) {
        cum += n_new[i];
        /* cut after sequence i once its share is reached, leaving one per later micro-batch */
        if (cum * want >= (uint64_t)T * (k + 1) || n_seq - (i + 1) == want - (k + 1))
            mb_end[k++] = i + 1;
    }
    mb_end[k++] = n_seq;
    return k;
}

struct split_run {
    struct dray_split *s;
    struct dray_kv *kv;
    const struct dray_batch *b;
    struct split_mb mb[DRAY_KV_MAX_MB];
    uint32_t n_mb;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t started[DRAY_KV_MAX_MB][MAX_TASK], done[DRAY_KV_MAX_MB][MAX_TASK];
    double t0[DRAY_KV_MAX_MB][MAX_TASK], t1[DRAY_KV_MAX_MB][MAX_TASK];
    int rc;
    char *err;
    size_t errlen;
};

static int run_task(struct split_run *r, uint32_t m, uint32_t ti, char *err, size_t errlen)
{
    struct dray_split *s = r->s;
    const struct split_task *t = &s->task[ti];
    const struct split_mb *mb = &r->mb[m];
    struct dray_split_stage *st = &s->st[t->stage];
    struct dray_batch_part p = {.mb = m, .layer_begin = t->l0, .layer_end = t->l1,
                                .x_in = t->embed ? NULL : s->x[m], .x_out = t->logits ? NULL : s->x[m]};
    struct dray_batch b = {.n_tok = mb->n_tok, .ids = r->b->ids + mb->tok0, .pos = r->b->pos + mb->tok0,
                           .n_logits = t->logits ? mb->n_row : 0, .logit_rows = s->rows + mb->row0,
                           .logits = r->b->logits ? r->b->logits + (size_t)mb->row0 * s->n_vocab : NULL,
                           .part = &p};
    char why[1024], what[64];
    int rc;
    if (st->remote) { /* one stage, one worker: its counters need no lock */
        double t0 = split_now_s(), compute = 0;
        rc = dray_remote_forward(st->remote, r->kv, s->n_embd, &b, &compute, why, sizeof(why));
        st->remote_calls++;
        st->wire_s += split_now_s() - t0 - compute;
    } else {
        rc = dray_model_forward(st->model, r->kv, &b, why, sizeof(why));
    }
    if (!rc)
        return 0;
    if (t->l1 > t->l0)
        snprintf(what, sizeof(what), "layers %u-%u%s", t->l0, t->l1 - 1, t->logits ? " and the head" : "");
    else
        snprintf(what, sizeof(what), "%s", t->embed ? "the embedding" : "the head");
    return dray_fail(err, errlen, rc, "device %u (%s, %s) %s: %s", t->stage + 1, st->dev.plugin->name,
                     st->dev.props.name, what, why);
}

/* The earliest (micro-batch, task) of stage d whose predecessor is done, or -1;
 * *left says whether d has tasks not started. Called with r->mu held. */
static int next_task(struct split_run *r, uint32_t d, uint32_t *m_out, bool *left)
{
    *left = false;
    for (uint32_t m = 0; m < r->n_mb; m++)
        for (uint32_t t = 0; t < r->s->n_task; t++) {
            if (r->s->task[t].stage != d || r->started[m][t])
                continue;
            *left = true;
            if (t == 0 || r->done[m][t - 1]) {
                *m_out = m;
                return (int)t;
            }
        }
    return -1;
}

struct split_worker {
    struct split_run *r;
    uint32_t stage;
};

static void *worker(void *arg)
{
    struct split_worker *w = arg;
    struct split_run *r = w->r;
    char why[1024];
    pthread_mutex_lock(&r->mu);
    for (;;) {
        uint32_t m = 0;
        bool left;
        int t = r->rc ? -1 : next_task(r, w->stage, &m, &left);
        if (t < 0) {
            if (r->rc || !left)
                break;
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        r->started[m][t] = 1;
        pthread_mutex_unlock(&r->mu);
        r->t0[m][t] = split_now_s();
        int rc = run_task(r, m, (uint32_t)t, why, sizeof(why));
        r->t1[m][t] = split_now_s();
        pthread_mutex_lock(&r->mu);
        if (rc && !r->rc) {
            r->rc = rc;
            snprintf(r->err, r->errlen, "%s", why);
        }
        r->done[m][t] = 1;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static int run_pipelined(struct split_run *r)
{
    struct dray_split *s = r->s;
    pthread_t th[DRAY_SPLIT_MAX];
    struct split_worker w[DRAY_SPLIT_MAX];
    bool started[DRAY_SPLIT_MAX] = {0};
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    for (uint32_t d = 0; d < s->n_stage; d++) {
        if (!s->st[d].loaded)
            continue;
        w[d] = (struct split_worker){r, d};
        started[d] = pthread_create(&th[d], NULL, worker, &w[d]) == 0;
        if (!started[d]) { /* run it here instead, after the others */
            worker(&w[d]);
        }
    }
    for (uint32_t d = 0; d < s->n_stage; d++)
        if (started[d])
            pthread_join(th[d], NULL);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    return r->rc;
}

/* Time two or more tasks ran at once: their summed time less their union. */
static double overlap(const struct split_run *r)
{
    double sum = 0, uni = 0, a[DRAY_KV_MAX_MB * MAX_TASK][2];
    uint32_t n = 0;
    for (uint32_t m = 0; m < r->n_mb; m++)
        for (uint32_t t = 0; t < r->s->n_task; t++) {
            a[n][0] = r->t0[m][t];
            a[n][1] = r->t1[m][t];
            sum += a[n][1] - a[n][0];
            n++;
        }
    for (uint32_t i = 1; i < n; i++) /* insertion sort by start: a few dozen entries */
        for (uint32_t j = i; j > 0 && a[j][0] < a[j - 1][0]; j--) {
            double x0 = a[j][0], x1 = a[j][1];
            a[j][0] = a[j - 1][0], a[j][1] = a[j - 1][1];
            a[j - 1][0] = x0, a[j - 1][1] = x1;
        }
    double lo = 0, hi = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (a[i][0] > hi) {
            uni += hi > lo ? hi - lo : 0;
            lo = a[i][0];
            hi = a[i][1];
        } else if (a[i][1] > hi) {
            hi = a[i][1];
        }
    }
    uni += hi > lo ? hi - lo : 0;
    return sum > uni ? sum - uni : 0;
}

/* Host hidden states for n_mb micro-batches of up to n tokens, and the rows. */
int split_reserve(struct dray_split *s, uint32_t n_mb, size_t n, size_t n_rows)
{
    if (n > s->x_cap) {
        for (uint32_t m = 0; m < DRAY_KV_MAX_MB; m++) {
            free(s->x[m]);
            s->x[m] = NULL;
        }
        s->x_cap = n;
    }
    for (uint32_t m = 0; m < n_mb; m++)
        if (!s->x[m] && !(s->x[m] = malloc(s->x_cap * s->n_embd * sizeof(float))))
            return DRAY_ENOMEM;
    if (n_rows > s->rows_cap) {
        uint32_t *p = realloc(s->rows, n_rows * sizeof(*p));
        if (!p)
            return DRAY_ENOMEM;
        s->rows = p;
        s->rows_cap = n_rows;
    }
    return 0;
}

int dray_split_forward(struct dray_split *s, struct dray_kv *kv, uint32_t n_seq, const uint32_t *seq_ids,
                       const uint32_t *n_new, const struct dray_batch *b, char *err, size_t errlen)
{
    if (s->tp)
        return split_tp_forward(s, kv, n_seq, seq_ids, n_new, b, err, errlen);
    double t_start = split_now_s();
    struct split_run *r = calloc(1, sizeof(*r));
    uint32_t mb_end[DRAY_KV_MAX_MB];
    if (!r)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    *r = (struct split_run){.s = s, .kv = kv, .b = b, .err = err, .errlen = errlen};
    r->n_mb = pick_mbs(s, n_seq, n_new, b, mb_end);
    size_t most = 0;
    for (uint32_t m = 0, i = 0, tok = 0, row = 0; m < r->n_mb; m++) {
        struct split_mb *mb = &r->mb[m];
        mb->tok0 = tok;
        for (; i < mb_end[m]; i++)
            tok += n_new[i];
        mb->n_tok = tok - mb->tok0;
        mb->row0 = row;
        while (row < b->n_logits && (r->n_mb == 1 || b->logit_rows[row] < tok))
            row++;
        mb->n_row = row - mb->row0;
        most = mb->n_tok > most ? mb->n_tok : most;
    }
    int rc = split_reserve(s, r->n_mb, most, b->n_logits) ? dray_fail(err, errlen, DRAY_ENOMEM, "out of memory")
                                                     : 0;
    for (uint32_t m = 0; !rc && m < r->n_mb; m++)
        for (uint32_t i = 0; i < r->mb[m].n_row; i++)
            s->rows[r->mb[m].row0 + i] = b->logit_rows[r->mb[m].row0 + i] - r->mb[m].tok0;
    if (!rc)
        rc = dray_kv_step_begin_split(kv, n_seq, seq_ids, n_new, r->n_mb, mb_end, err, errlen);
    if (rc) {
        free(r);
        return rc;
    }
    if (r->n_mb > 1) {
        rc = run_pipelined(r);
    } else {
        for (uint32_t t = 0; !rc && t < s->n_task; t++) {
            r->t0[0][t] = split_now_s();
            rc = run_task(r, 0, t, err, errlen);
            r->t1[0][t] = split_now_s();
        }
    }
    if (rc)
        dray_kv_step_abort(kv);
    else
        dray_kv_step_end(kv);
    for (uint32_t m = 0; m < r->n_mb; m++)
        for (uint32_t t = 0; t < s->n_task; t++)
            if (r->t1[m][t] > r->t0[m][t])
                s->st[s->task[t].stage].busy_s += r->t1[m][t] - r->t0[m][t];
    s->stats.steps++;
    s->stats.pipelined_steps += r->n_mb > 1;
    s->stats.hops += (uint64_t)r->n_mb * (s->n_task - 1);
    for (uint32_t m = 0; m < r->n_mb; m++)
        s->stats.hop_bytes += (uint64_t)(s->n_task - 1) * r->mb[m].n_tok * s->n_embd * sizeof(float);
    s->stats.overlap_s += overlap(r);
    s->stats.wall_s += split_now_s() - t_start;
    free(r);
    return rc;
}

void dray_split_get_stats(const struct dray_split *s, struct dray_split_stats *st)
{
    *st = s->stats;
}

/* ------------------------------------------------------------ calibration */

int dray_split_calibrate(struct dray_split *s, const int32_t *ids, uint32_t n, uint32_t n_outlier,
                         bool smooth_k, float **scores, size_t *n_scores, char *err, size_t errlen)
{
    *scores = NULL;
    *n_scores = 0;
    const struct dray_model_info *mi = dray_model_info(s->st[s->head].model);
    struct dray_kv_desc d = dray_calibration_kv_desc(mi, n, NULL);
    struct dray_kv *kv = NULL;
    int rc = dray_split_kv_create(s, &d, &kv, err, errlen);
    uint32_t begun = 0;
    for (; !rc && begun < s->n_stage; begun++)
        if (s->st[begun].remote && s->st[begun].loaded)
            rc = dray_remote_calib_begin(s->st[begun].remote, n, n_outlier, smooth_k, err, errlen);
        else if (s->st[begun].model)
            rc = dray_model_calib_begin(s->st[begun].model, n, n_outlier, smooth_k, err, errlen);
    /* the head sees the last rows only: their logits are computed and dropped */
    uint32_t n_rows = n < 16 ? n : 16, rows[16], seq = 0;
    float *logits = malloc((size_t)n_rows * s->n_vocab * sizeof(float));
    int32_t *pos = malloc(n * sizeof(int32_t));
    if (!rc && (!logits || !pos))
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "calibration: out of memory");
    if (!rc)
        rc = dray_kv_seq_new(kv, &seq);
    for (uint32_t i = 0; !rc && i < n; i++)
        pos[i] = (int32_t)i;
    for (uint32_t i = 0; i < n_rows; i++)
        rows[i] = n - n_rows + i;
    struct dray_batch b = {.n_tok = n, .ids = ids, .pos = pos, .n_logits = n_rows, .logit_rows = rows,
                           .logits = logits};
    if (!rc)
        rc = dray_split_forward(s, kv, 1, &seq, &n, &b, err, errlen);
    /* each part filled its own layers' rows (the head's part the head's); the
     * rest are 0, and scores are maxima of |x| >= 0: the elementwise max merges
     * (a tensor parallel slice's at their place in the whole row: the same).
     * Taken before the parts' calib_end, which keeps them as they are. */
    for (uint32_t d = 0; !rc && d < s->n_stage; d++) {
        const float *sc = NULL;
        float *theirs = NULL;
        size_t k = 0;
        if (s->st[d].remote && s->st[d].loaded) {
            if ((rc = dray_remote_calib_scores(s->st[d].remote, &theirs, &k, err, errlen)))
                break;
            sc = theirs;
        } else if (s->st[d].model) {
            k = dray_model_calib_scores(s->st[d].model, &sc);
        }
        if (!k)
            continue;
        if (!*scores && !(*scores = calloc(k, sizeof(float))))
            rc = dray_fail(err, errlen, DRAY_ENOMEM, "calibration: out of memory");
        else if (*n_scores && k != *n_scores)
            rc = dray_fail(err, errlen, DRAY_EFORMAT, "calibration: parts give %zu and %zu scores", *n_scores, k);
        *n_scores = rc ? *n_scores : k;
        for (size_t i = 0; !rc && i < k; i++)
            (*scores)[i] = sc[i] > (*scores)[i] ? sc[i] : (*scores)[i];
        free(theirs);
    }
    for (uint32_t d = 0; !s->tp && d < begun; d++) { /* tensor parallel: reloaded below */
        char why[1024];
        int rc2 = 0;
        if (s->st[d].remote && s->st[d].loaded)
            rc2 = dray_remote_calib_end(s->st[d].remote, rc == 0, why, sizeof(why));
        else if (s->st[d].model)
            rc2 = dray_model_calib_end(s->st[d].model, rc == 0, why, sizeof(why));
        if (rc2 && !rc)
            rc = dray_fail(err, errlen, rc2, "%s", why);
    }
    /* tensor parallel: every slice is prepared again from the merged scores, as
     * from the cache, so each picks its share of the one-process outliers */
    if (!rc && s->tp)
        rc = split_tp_reload(s, *scores, *n_scores, err, errlen);
    if (rc) {
        free(*scores);
        *scores = NULL;
        *n_scores = 0;
    }
    free(logits);
    free(pos);
    dray_kv_free(kv);
    return rc;
}
