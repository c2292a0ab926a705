/* The engine: wires config -> registry/device -> GGUF -> model + tokenizer -> KV
 * (with calibration and its cache), closes it again, and answers questions about
 * it (info, tokenize). Sessions run in session.c, generation in
 * session_generate.c, chat turns in engine_chat.c; all share struct dray_engine
 * from engine_internal.h. */
#include <inttypes.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "calib_cache.h"
#include "calibrate.h"
#include "caps.h"
#include "chat.h"
#include "dray/dray.h"
#include "dray/plugins.h"
#include "constraint.h"
#include "engine_internal.h"
#include "prep_cache.h"
#include "error.h"
#include "gguf.h"
#include "kv.h"
#include "log.h"
#include "model.h"
#include "dist.h"
#include "split.h"
#include "tokenizer.h"

double dray_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ open */

/* The config's name of a weight precision (the calibration cache keys on it). */
static const char *precision_name(enum dray_precision p)
{
    static const char *const name[] = {"int8", "f32", "int8g", "w4a8"};
    return name[p <= DRAY_PRECISION_W4A8 ? p : 0];
}

/* Whether this configuration calibrates: outlier channels of int8 weights, and
 * K smoothing of an int8 KV (whatever the weights). */
/* Whether any tensor is stored 5-bit (Q5_0, Q5_1): the ones W4A8 loads as Q5G32. */
static bool has_5bit(const struct dray_gguf *g)
{
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++)
        if (dray_ggml_is_5bit(dray_gguf_tensor_at(g, i)->type))
            return true;
    return false;
}

static bool wants_outliers(const struct dray_config *c)
{
    return c->precision == DRAY_PRECISION_INT8 && c->outlier_channels;
}

static bool wants_smooth_k(const struct dray_config *c)
{
    return c->kv_dtype == DRAY_I8;
}

/* The devices the engine runs on: one, or a split's stages. */
static uint32_t n_devices(const struct dray_engine *e)
{
    return e->split ? dray_split_n(e->split) : 1;
}

static const struct dray_device *device_at(const struct dray_engine *e, uint32_t i)
{
    return e->split ? &dray_split_stage_c(e->split, i)->dev : &e->dev;
}

/* The model on one device, or its parts on a split's stages; e->model is the
 * part with the head, e->dev that part's device. */
static int load_parts(struct dray_engine *e, const struct dray_model_opts *mo, char *err, size_t errlen)
{
    if (!e->split)
        return dray_model_load(e->gguf, &e->dev, mo, &e->arch, &e->model, err, errlen);
    int rc = dray_split_load(e->split, &e->cfg, e->gguf, mo, e->cfg.kv_budget, &e->arch, err, errlen);
    if (rc)
        return rc;
    const struct dray_split_stage *h = dray_split_stage_c(e->split, dray_split_head(e->split));
    e->model = h->model;
    e->dev = h->dev;
    return 0;
}

/* The model, prepared straight from the calibration cache's scores for this
 * file and precision when it has them (calib_cache.h): int8 with its outlier
 * channels, the K smoothing folded into the head norms. */
static int load_model(struct dray_engine *e, char *err, size_t errlen)
{
    struct dray_model_opts mo = {.precision = e->cfg.precision, .max_batch = e->chunk, .progress = true,
                                 .n_ctx = e->cfg.context,
                                 .smooth_k = wants_smooth_k(&e->cfg),
                                 .head_precision = e->cfg.head_precision,
                                 .head_rescore = e->cfg.head_rescore,
                                 .head_rescore_tail = e->cfg.head_rescore_tail,
                                 .two_pass = e->cfg.activations == DRAY_ACTIVATIONS_INT8X2};
    float *scores = NULL;
    size_t n = 0;
    e->calib_cache[0] = 0;
    e->info.calibration = "none";
    if (wants_outliers(&e->cfg))
        mo.outlier_channels = e->cfg.outlier_channels; /* calibrate() follows */
    if (wants_outliers(&e->cfg) || wants_smooth_k(&e->cfg)) {
        dray_calib_cache_lookup(e->gguf, precision_name(e->cfg.precision), e->calib_cache,
                                sizeof(e->calib_cache), &scores, &n);
        mo.calib_scores = scores;
        mo.n_calib_scores = n;
    }
    /* one device in one process: its prepared layouts from the cache, or into it */
    bool hit = false;
    if (e->cfg.prepared_layouts && !e->split && !e->cfg.distributed[0])
        e->prep = dray_prep_cache_open(e->gguf, &e->dev, precision_name(e->cfg.precision), &hit);
    if (hit)
        dray_info("prepared layouts mapped from the cache");
    dray_weight_use_prepared(e->prep);
    int rc = load_parts(e, &mo, err, errlen);
    /* scores that do not fit this model (DRAY_EFORMAT): calibrate instead. Any
     * other failure (the device's memory, an upload) is the load's error, not
     * the cache's, and retrying would only hide it. */
    if (rc == DRAY_EFORMAT && scores) {
        dray_warn("calibration cache %s does not fit the model (%s); calibrating again",
                  e->calib_cache, err);
        mo.calib_scores = NULL;
        mo.n_calib_scores = 0;
        free(scores);
        scores = NULL;
        rc = load_parts(e, &mo, err, errlen);
    }
    dray_weight_use_prepared(NULL);
    if (!rc)
        dray_prep_cache_commit(e->prep);
    if (!rc && scores) {
        e->info.calibration = "cached";
        dray_info("calibration from the cache %s", e->calib_cache);
    }
    free(scores);
    return rc;
}

/* Calibrate when the cache had nothing, then store the scores for next time.
 * An int8 KV cache wants calibration too (K smoothing), whatever the weights. */
static int calibrate(struct dray_engine *e, char *err, size_t errlen)
{
    bool outliers = wants_outliers(&e->cfg);
    bool smooth_k = wants_smooth_k(&e->cfg);
    if ((!outliers && !smooth_k) || !strcmp(e->info.calibration, "cached"))
        return 0;
    const float *scores = NULL;
    float *merged = NULL;
    size_t n = 0;
    int rc;
    if (e->split) { /* every stage records its layers in one pass over the devices */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        double t0 = dray_now_s();
        rc = dray_calibration_ids(e->tok, &ids, &n_ids, err, errlen);
        if (!rc)
            rc = dray_split_calibrate(e->split, ids, (uint32_t)n_ids, outliers ? e->cfg.outlier_channels : 0,
                                      smooth_k, &merged, &n, err, errlen);
        free(ids);
        scores = merged;
        /* tensor parallel prepares its slices again from the scores: a new model */
        e->model = dray_split_stage_c(e->split, dray_split_head(e->split))->model;
        if (!rc)
            dray_info("calibrated the split on %zu tokens in %.2f s", n_ids, dray_now_s() - t0);
    } else {
        rc = dray_calibrate(e->model, &e->dev, e->tok, outliers ? e->cfg.outlier_channels : 0,
                            smooth_k, err, errlen);
        n = rc ? 0 : dray_model_calib_scores(e->model, &scores);
    }
    if (rc || !n) {
        free(merged);
        return rc;
    }
    e->info.calibration = "computed";
    char why[512];
    if (e->calib_cache[0] && dray_calib_cache_store(e->calib_cache, e->gguf, scores, n, why, sizeof(why)))
        dray_warn("%s (the next start calibrates again)", why);
    free(merged);
    return 0;
}

static int open_kv(struct dray_engine *e, char *err, size_t errlen)
{
    const struct dray_model_info *mi = dray_model_info(e->model);
    const struct dray_config *c = &e->cfg;
    struct dray_kv_desc d = {
        .n_layer = mi->n_layer, .window = mi->window, .share_with = mi->share_kv,
        .n_kv_head = mi->n_kv_head, .head_dim = mi->head_dim, .dtype = c->kv_dtype,
        .block_size = c->kv_block ? c->kv_block : 16, .max_seqs = c->max_seqs ? c->max_seqs : 1,
        .max_ctx = e->info.context, .max_chunk = e->chunk, .budget_bytes = c->kv_budget,
    };
    int rc;
    if (e->split) {
        rc = dray_split_kv_create(e->split, &d, &e->kv, err, errlen);
    } else {
        rc = dray_kv_create(e->dev.ops, e->dev.ctx, &d, &e->kv, err, errlen);
    }
    if (rc)
        return rc;
    const struct dray_kv_plan *p = dray_kv_get_plan(e->kv);
    e->info.kv_bytes = p->total_bytes;
    e->info.kv_bytes_per_token = p->global_bytes_per_token;
    e->info.kv_bytes_per_seq_fixed = p->window_bytes_per_seq;
    e->info.max_seqs = d.max_seqs;
    return 0;
}

/* The model's shapes against the limits the device declared (ABI version 2),
 * before the first forward pass: a refusal here names the limit instead of a
 * DRAY_ENOTSUP from an op mid-generation. A family may rotate part of a head
 * (rope.dimension_count, mi->n_rot). */
static int check_shapes(struct dray_engine *e, char *err, size_t errlen)
{
    const struct dray_model_info *mi = dray_model_info(e->model);
    uint32_t q = mi->n_head * mi->head_dim;
    struct dray_caps_shape sh = {.head_dim = mi->head_dim, .n_rot = mi->n_rot ? mi->n_rot : mi->head_dim,
                                 .n_head = mi->n_head};
    sh.max_k = mi->n_embd > mi->n_ff ? mi->n_embd : mi->n_ff;
    sh.max_k = q > sh.max_k ? q : sh.max_k;
    char why[256];
    for (uint32_t i = 0; i < n_devices(e); i++) {
        const struct dray_device *dev = device_at(e, i);
        int rc = dray_caps_check_shape(&dev->caps, &sh, why, sizeof(why));
        if (rc)
            return dray_fail(err, errlen, rc, "%s on %s device %u (%s): %s: use another backend (config "
                             "backend/fallback)", e->cfg.model, dev->plugin->name, dev->index,
                             dev->props.name, why);
    }
    return 0;
}

static void fill_info(struct dray_engine *e)
{
    const struct dray_model_info *mi = dray_model_info(e->model);
    struct dray_engine_info *in = &e->info;
    in->model_path = e->cfg.model;
    in->model_name = mi->name;
    in->arch = mi->arch;
    in->plugin = e->dev.plugin->name;
    in->device = e->dev.props.name;
    in->placement = e->placement;
    if (e->split) {
        size_t a = 0, b = 0;
        for (uint32_t i = 0; i < n_devices(e); i++) {
            a += (size_t)snprintf(e->split_plugins + a, sizeof(e->split_plugins) - a, "%s%s", i ? "," : "",
                                  device_at(e, i)->plugin->name);
            b += (size_t)snprintf(e->split_devices + b, sizeof(e->split_devices) - b, "%s%s", i ? ", " : "",
                                  device_at(e, i)->props.name);
            a = a < sizeof(e->split_plugins) ? a : sizeof(e->split_plugins) - 1;
            b = b < sizeof(e->split_devices) ? b : sizeof(e->split_devices) - 1;
        }
        in->plugin = e->split_plugins;
        in->device = e->split_devices;
    }
    in->n_layer = mi->n_layer;
    in->n_embd = mi->n_embd;
    in->n_head = mi->n_head;
    in->n_kv_head = mi->n_kv_head;
    in->head_dim = mi->head_dim;
    in->n_vocab = mi->n_vocab;
    in->n_ctx_train = mi->n_ctx_train;
    in->n_params = mi->n_params;
    in->weight_bytes = mi->weight_bytes;
    in->step_weight_bytes = mi->step_weight_bytes;
    in->rescore_bytes = mi->rescore_bytes;
    in->head = mi->head;
    in->precision = precision_name(e->cfg.precision);
    in->kv_dtype = e->cfg.kv_dtype == DRAY_F16 ? "f16" : "int8";
    in->activations = e->cfg.activations == DRAY_ACTIVATIONS_INT8X2 ? "int8x2" : "int8";
}

/* Weights (and parameters) of every part: a split's head part holds its own only. */
static void sum_parts(struct dray_engine *e)
{
    struct dray_engine_info *in = &e->info;
    in->weight_bytes = in->step_weight_bytes = in->n_params = 0;
    for (uint32_t i = 0; e->split && i < n_devices(e); i++) {
        const struct dray_split_stage *st = dray_split_stage_c(e->split, i);
        in->weight_bytes += st->weight_bytes;
        in->step_weight_bytes += st->step_weight_bytes;
        in->n_params += st->n_params;
    }
    const struct dray_model_info *mi = e->split ? NULL : dray_model_info(e->model);
    if (mi) {
        in->weight_bytes = mi->weight_bytes;
        in->step_weight_bytes = mi->step_weight_bytes;
        in->n_params = mi->n_params;
    }
}

/* "device 1 cpu (name): layers 0-8, 40.1 MiB weights, 1.0 MiB KV" per stage. */
static void describe_split(struct dray_engine *e)
{
    size_t at = 0;
    e->placement[0] = 0;
    for (uint32_t i = 0; e->split && i < n_devices(e); i++) {
        const struct dray_split_stage *st = dray_split_stage_c(e->split, i);
        char layers[160] = "no layers";
        if (st->l1 > st->l0)
            snprintf(layers, sizeof(layers), "layers %u-%u%s%s", st->l0, st->l1 - 1, st->slice[0] ? ", " : "",
                     st->slice);
        at += (size_t)snprintf(e->placement + at, sizeof(e->placement) - at,
                               "%sdevice %u %s (%s): %s%s, %.1f MiB weights, %.1f MiB KV", i ? "\n" : "", i + 1,
                               st->dev.plugin->name, st->dev.props.name, layers,
                               st->head ? " + embedding and head" : "",
                               (double)st->weight_bytes / 1048576.0,
                               (double)dray_kv_device_bytes(e->kv, i) / 1048576.0);
        if (at >= sizeof(e->placement))
            break;
    }
}

/* distributed: join the transport. Rank 0 goes on to open the engine, its
 * split's later stages the other ranks; every other rank serves rank 0 from
 * here and exits when rank 0 says goodbye, so any command that opens an
 * engine (run, serve, bench, perplexity) works under mpirun unchanged. */
static int join_ranks(struct dray_config *cfg, char *err, size_t errlen)
{
    struct dray_dist *t = NULL;
    if (cfg->replicas > 1)
        return dray_fail(err, errlen, DRAY_EINVAL, "distributed '%s' with replicas %u: one engine spans the "
                         "ranks (replicas: 1)", cfg->distributed, cfg->replicas);
    bool first = !dray_dist_get();
    int rc = dray_dist_open(cfg, &t, err, errlen);
    if (rc)
        return rc;
    if (first)
        atexit(dray_dist_close);
    if (t->rank == 0 && t->size == 1) {
        dray_warn("distributed '%s': one rank, so one process runs it all (mpirun -np N for N ranks)",
                  cfg->distributed);
        cfg->distributed[0] = 0;
    }
    if (t->rank == 0)
        return 0;
    /* mpirun hands a Ctrl-C or SIGTERM to every rank: rank 0 shuts down and
     * says goodbye, the others must not die before that */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    rc = dray_dist_worker(t, cfg, err, errlen);
    if (rc)
        dray_error("rank %u: %s", t->rank, err);
    exit(rc ? 1 : 0);
}

int dray_engine_open(const struct dray_config *cfg, struct dray_engine **out, char *err, size_t errlen)
{
    double t0 = dray_now_s();
    struct dray_engine *e = calloc(1, sizeof(*e));
    *out = NULL;
    if (!e)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    e->cfg = *cfg;
    if (!e->cfg.model[0]) {
        const char *env = getenv("DRAY_MODEL");
        snprintf(e->cfg.model, sizeof(e->cfg.model), "%s", env && env[0] ? env : DRAY_DEFAULT_MODEL);
        if (access(e->cfg.model, R_OK)) {
            dray_fail(err, errlen, DRAY_ENOTFOUND,
                      "no model given and the default %s is not there: run ci/setup.sh, or pass "
                      "-m FILE (or 'model:' in the config, or DRAY_MODEL)", e->cfg.model);
            free(e);
            return DRAY_ENOTFOUND;
        }
    }
    int rc = e->cfg.distributed[0] ? join_ranks(&e->cfg, err, errlen) : 0;
    if (!rc && e->cfg.tensor_parallel > 1 && !e->cfg.distributed[0])
        rc = dray_fail(err, errlen, DRAY_EINVAL, "tensor_parallel %u needs distributed: mpi and as many ranks "
                       "(mpirun -np %u dray ... --set distributed=mpi)", e->cfg.tensor_parallel,
                       e->cfg.tensor_parallel);
    if (!rc)
        rc = dray_registry_open(e->cfg.plugin_path[0] ? e->cfg.plugin_path : NULL, &e->reg, err, errlen);
    if (!rc && (strchr(cfg->backend, ',') || e->cfg.distributed[0]))
        rc = dray_split_open(e->reg, &e->cfg, &e->split, err, errlen);
    else if (!rc)
        e->dev_open = (rc = dray_device_open_config(e->reg, cfg, &e->dev, err, errlen)) == 0;
    if (!rc && !e->split && (cfg->layer_split[0] || cfg->device_memory[0] || cfg->head_device))
        dray_warn("layer_split, device_memory and head_device place a split's layers; backend '%s' "
                  "names one plugin, so they do nothing (list plugins: backend: cpu,opencl)", cfg->backend);
    for (uint32_t i = 0; !rc && i < n_devices(e); i++) { /* what every device runs */
        char why[256];
        e->cfg.precision = dray_caps_precision(&device_at(e, i)->caps, e->cfg.precision, why, sizeof(why));
        if (why[0])
            dray_warn("%s", why);
    }
    if (!rc)
        rc = dray_gguf_open(e->cfg.model, &e->gguf, err, errlen);
    if (!rc) /* the architecture, tensors and keys first: a file dray cannot run says so */
        rc = dray_model_check(e->gguf, err, errlen);
    if (!rc) {
        char why[256];
        const struct dray_arch *arch = dray_model_arch_of(e->gguf);
        if (e->cfg.activations == DRAY_ACTIVATIONS_AUTO) /* an unknown arch fails at load */
            e->cfg.activations = arch ? arch->activations : DRAY_ACTIVATIONS_INT8;
        for (uint32_t i = 0; i < n_devices(e); i++) {
            e->cfg.activations = dray_caps_activations(&device_at(e, i)->caps, e->cfg.precision,
                                                       e->cfg.activations, why, sizeof(why));
            if (why[0])
                dray_warn("%s", why);
        }
        bool q5 = true;
        for (uint32_t i = 0; i < n_devices(e); i++)
            q5 = q5 && dray_caps_q5(&device_at(e, i)->caps);
        if (e->cfg.precision == DRAY_PRECISION_W4A8 && !q5 && has_5bit(e->gguf))
            dray_warn("precision w4a8: the device does not declare 5-bit grouped weights (q5g32); "
                      "the file's Q5_0/Q5_1 tensors use 8-bit groups");
    }
    if (!rc)
        rc = dray_tokenizer_load(e->gguf, &e->tok, err, errlen);
    if (!rc)
        rc = dray_chat_template_pick(e->gguf, e->cfg.chat_template, &e->chat, err, errlen);
    if (rc)
        goto fail;
    e->chunk = e->cfg.chunk ? e->cfg.chunk : 512;
    double t_load = dray_now_s();
    struct dray_load_times lt;
    dray_weight_load_times(&lt); /* from zero */
    rc = load_model(e, err, errlen);
    dray_weight_load_times(&lt);
    t_load = dray_now_s() - t_load;
    if (!rc)
        rc = check_shapes(e, err, errlen);
    if (rc)
        goto fail;
    fill_info(e);
    sum_parts(e);
    e->info.context = e->cfg.context ? e->cfg.context : e->info.n_ctx_train;
    if (e->info.context > e->info.n_ctx_train)
        dray_warn("context %u is longer than the model was trained for (%u)", e->info.context,
                  e->info.n_ctx_train);
    rc = open_kv(e, err, errlen);
    double t_cal = dray_now_s();
    if (!rc)
        rc = calibrate(e, err, errlen);
    if (rc)
        goto fail;
    t_cal = dray_now_s() - t_cal;
    /* the start-up's split (docs/performance.md): what a warm start costs */
    dray_info("load: weights %.2f s (file rows read and converted %.2f s, packed by the plugin %.2f s, "
              "stored as prepared layouts %.2f s), calibration %.2f s, the rest %.2f s", t_load, lt.convert_s,
              lt.pack_s, lt.store_s, t_cal, dray_now_s() - t0 - t_load - t_cal);
    /* calibration re-prepared the layers (f32 -> int8 with outlier channels;
     * under tensor parallel a new model, whose info the names point into) */
    fill_info(e);
    sum_parts(e);
    describe_split(e);
    e->logits = malloc((size_t)e->info.n_vocab * sizeof(float));
    if (!e->logits) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
        goto fail;
    }
    e->info.load_s = dray_now_s() - t0;
    *out = e;
    return 0;
fail:
    dray_engine_close(e);
    return rc;
}

void dray_engine_close(struct dray_engine *e)
{
    if (!e)
        return;
    free(e->logits);
    dray_engine_grammar_vocab_free(e);
    if (e->kv)
        dray_kv_free(e->kv);
    if (e->model && !e->split)
        dray_model_free(e->model);
    dray_prep_cache_close(e->prep); /* after every handle that points into it */
    dray_split_free(e->split);
    dray_tokenizer_free(e->tok);
    dray_chat_template_free(&e->chat);
    if (e->gguf)
        dray_gguf_close(e->gguf);
    if (e->dev_open)
        dray_device_close(&e->dev);
    if (e->reg)
        dray_registry_close(e->reg);
    free(e);
}

void dray_engine_split_report(const struct dray_engine *e, struct dray_split_report *r)
{
    struct dray_split_stats st;
    memset(r, 0, sizeof(*r));
    if (!e->split)
        return;
    dray_split_get_stats(e->split, &st);
    r->n_dev = dray_split_n(e->split);
    r->steps = st.steps;
    r->pipelined_steps = st.pipelined_steps;
    r->hops = st.hops;
    r->hop_bytes = st.hop_bytes;
    r->wall_s = st.wall_s;
    r->overlap_s = st.overlap_s;
    r->allreduces = st.allreduces;
    r->allreduce_s = st.allreduce_s;
    for (uint32_t i = 0; i < r->n_dev; i++) {
        const struct dray_split_stage *s = dray_split_stage_c(e->split, i);
        if (i < 8)
            r->busy_s[i] = s->busy_s;
        r->remote_calls += s->remote_calls;
        r->wire_s += s->wire_s;
        if (s->remote && !r->lost[0])
            dray_remote_lost(s->remote, r->lost, sizeof(r->lost));
    }
}

const struct dray_engine_info *dray_engine_get_info(const struct dray_engine *e)
{
    return &e->info;
}

void dray_engine_rescore_stats(const struct dray_engine *e, uint64_t *rows, uint64_t *candidates)
{
    const struct dray_model_info *mi = dray_model_info(e->model);
    *rows = mi->rescore_rows;
    *candidates = mi->rescore_candidates;
}

int dray_engine_tokenize(const struct dray_engine *e, const char *text, bool add_bos,
                         bool parse_special, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    /* Refuse, before tokenizing, text that cannot fit in the context even at the
     * longest token: tokenizing costs memory in proportion to the bytes. */
    size_t len = strlen(text);
    uint64_t most = (uint64_t)e->info.context * dray_tokenizer_max_token_bytes(e->tok);
    *ids = NULL;
    *n = 0;
    if (len > most)
        return dray_fail(err, errlen, DRAY_ERANGE, "the prompt is %zu bytes, more than a context "
                         "of %u tokens can hold (at most %" PRIu64 " bytes with this vocabulary, "
                         "whose longest token stands for %u bytes): shorten the prompt or raise "
                         "'context' (-c)", len, e->info.context, most,
                         dray_tokenizer_max_token_bytes(e->tok));
    int rc = dray_tokenize(e->tok, text, len, add_bos, parse_special, ids, n);
    if (rc)
        return dray_fail(err, errlen, rc, "tokenizing the prompt: %s", dray_strerror(rc));
    return 0;
}

size_t dray_engine_token_bytes(const struct dray_engine *e, int32_t id, char *out, size_t cap)
{
    return dray_tokenizer_token_bytes(e->tok, id, out, cap);
}

int dray_engine_detokenize(const struct dray_engine *e, const int32_t *ids, size_t n, char **text,
                           size_t *len, char *err, size_t errlen)
{
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= dray_tokenizer_n_vocab(e->tok))
            return dray_fail(err, errlen, DRAY_EINVAL, "token id %d at %zu is outside the vocabulary "
                             "(0..%u)", ids[i], i, dray_tokenizer_n_vocab(e->tok) - 1);
    int rc = dray_detokenize(e->tok, ids, n, text, len);
    return rc ? dray_fail(err, errlen, rc, "detokenizing: %s", dray_strerror(rc)) : 0;
}

