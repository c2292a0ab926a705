/* The engine: wires config → registry/device → GGUF → model + tokenizer → KV,
 * and runs sessions (one sequence each): chunked prefill, then decode with the
 * sampler, streaming detokenized text. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "calib_cache.h"
#include "calibrate.h"
#include "chat.h"
#include "chat_tokenize.h"
#include "dray/dray.h"
#include "engine_internal.h"
#include "emitter.h"
#include "error.h"
#include "gguf.h"
#include "kv.h"
#include "caps.h"
#include "log.h"
#include "model.h"
#include "dray/plugins.h"
#include "sampler.h"
#include "tokenizer.h"

double dray_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ open */

/* The model, prepared straight into int8 with its outlier channels when the
 * calibration cache has this file's scores (calib_cache.h). */
static int load_model(struct dray_engine *e, char *err, size_t errlen)
{
    struct dray_model_opts mo = {.precision = e->cfg.precision, .max_batch = e->chunk, .progress = true,
                                 .smooth_k = e->cfg.kv_dtype == DRAY_I8};
    float *scores = NULL;
    size_t n = 0;
    e->calib_cache[0] = 0;
    e->info.calibration = "none";
    if (e->cfg.precision == DRAY_PRECISION_INT8 && e->cfg.outlier_channels) {
        mo.outlier_channels = e->cfg.outlier_channels; /* calibrate() follows */
        dray_calib_cache_lookup(e->gguf, e->calib_cache, sizeof(e->calib_cache), &scores, &n);
        mo.calib_scores = scores;
        mo.n_calib_scores = n;
    }
    int rc = dray_model_load(e->gguf, &e->dev, &mo, &e->arch, &e->model, err, errlen);
    if (rc && scores) { /* scores that do not fit this model: calibrate instead */
        dray_warn("calibration cache %s does not fit the model (%s); calibrating again",
                  e->calib_cache, err);
        mo.calib_scores = NULL;
        mo.n_calib_scores = 0;
        free(scores);
        scores = NULL;
        rc = dray_model_load(e->gguf, &e->dev, &mo, &e->arch, &e->model, err, errlen);
    }
    if (!rc && scores) {
        e->info.calibration = "cached";
        dray_info("outlier channels from the calibration cache %s", e->calib_cache);
    }
    free(scores);
    return rc;
}

/* Calibrate when the cache had nothing, then store the scores for next time.
 * An int8 KV cache wants calibration too (K smoothing), even with f32 weights;
 * those runs have no outlier scores, so nothing is cached for them. */
static int calibrate(struct dray_engine *e, char *err, size_t errlen)
{
    bool outliers = e->cfg.precision == DRAY_PRECISION_INT8 && e->cfg.outlier_channels;
    bool smooth_k = e->cfg.kv_dtype == DRAY_I8;
    if ((!outliers && !smooth_k) || !strcmp(e->info.calibration, "cached"))
        return 0;
    int rc = dray_calibrate(e->arch, e->model, &e->dev, e->tok, outliers ? e->cfg.outlier_channels : 0,
                            smooth_k, err, errlen);
    const float *scores = NULL;
    size_t n = rc || !e->arch->calib_scores ? 0 : e->arch->calib_scores(e->model, &scores);
    if (rc || !n)
        return rc;
    e->info.calibration = "computed";
    char why[512];
    if (e->calib_cache[0] && dray_calib_cache_store(e->calib_cache, e->gguf, scores, n, why, sizeof(why)))
        dray_warn("%s (the next start calibrates again)", why);
    return 0;
}

static int open_kv(struct dray_engine *e, char *err, size_t errlen)
{
    const struct dray_model_info *mi = e->arch->info(e->model);
    const struct dray_config *c = &e->cfg;
    struct dray_kv_desc d = {
        .n_layer = mi->n_layer, .window = mi->window, .share_with = mi->share_kv,
        .n_kv_head = mi->n_kv_head, .head_dim = mi->head_dim, .dtype = c->kv_dtype,
        .block_size = c->kv_block ? c->kv_block : 16, .max_seqs = c->max_seqs ? c->max_seqs : 1,
        .max_ctx = e->info.context, .max_chunk = e->chunk, .budget_bytes = c->kv_budget,
    };
    int rc = dray_kv_create(e->dev.ops, e->dev.ctx, &d, &e->kv, err, errlen);
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
 * DRAY_ENOTSUP from an op mid-generation. Models rotate whole heads (n_rot =
 * head_dim); a family that rotates part of a head adds its n_rot here. */
static int check_shapes(struct dray_engine *e, char *err, size_t errlen)
{
    const struct dray_model_info *mi = e->arch->info(e->model);
    uint32_t q = mi->n_head * mi->head_dim;
    struct dray_caps_shape sh = {.head_dim = mi->head_dim, .n_rot = mi->head_dim,
                                 .n_head = mi->n_head};
    sh.max_k = mi->n_embd > mi->n_ff ? mi->n_embd : mi->n_ff;
    sh.max_k = q > sh.max_k ? q : sh.max_k;
    char why[256];
    int rc = dray_caps_check_shape(&e->dev.caps, &sh, why, sizeof(why));
    if (rc)
        return dray_fail(err, errlen, rc, "%s on %s device %u (%s): %s: use another backend (config "
                         "backend/fallback)", e->cfg.model, e->dev.plugin->name, e->dev.index,
                         e->dev.props.name, why);
    return 0;
}

static void fill_info(struct dray_engine *e)
{
    const struct dray_model_info *mi = e->arch->info(e->model);
    struct dray_engine_info *in = &e->info;
    in->model_path = e->cfg.model;
    in->model_name = mi->name;
    in->arch = mi->arch;
    in->plugin = e->dev.plugin->name;
    in->device = e->dev.props.name;
    in->n_layer = mi->n_layer;
    in->n_embd = mi->n_embd;
    in->n_head = mi->n_head;
    in->n_kv_head = mi->n_kv_head;
    in->head_dim = mi->head_dim;
    in->n_vocab = mi->n_vocab;
    in->n_ctx_train = mi->n_ctx_train;
    in->n_params = mi->n_params;
    in->weight_bytes = mi->weight_bytes;
    static const char *const prec[] = {"int8", "f32", "int8g", "w4a8"};
    in->precision = prec[e->cfg.precision <= DRAY_PRECISION_W4A8 ? e->cfg.precision : 0];
    in->kv_dtype = e->cfg.kv_dtype == DRAY_F16 ? "f16" : "int8";
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
    int rc = dray_registry_open(e->cfg.plugin_path[0] ? e->cfg.plugin_path : NULL, &e->reg, err, errlen);
    if (!rc)
        rc = dray_device_open_config(e->reg, cfg, &e->dev, err, errlen);
    e->dev_open = rc == 0;
    if (!rc) {
        char why[256];
        e->cfg.precision = dray_caps_precision(&e->dev.caps, e->cfg.precision, why, sizeof(why));
        if (why[0])
            dray_warn("%s", why);
    }
    if (!rc)
        rc = dray_gguf_open(e->cfg.model, &e->gguf, err, errlen);
    if (!rc)
        rc = dray_tokenizer_load(e->gguf, &e->tok, err, errlen);
    if (!rc)
        rc = dray_chat_template_pick(e->gguf, e->cfg.chat_template, &e->chat, err, errlen);
    if (rc)
        goto fail;
    e->chunk = e->cfg.chunk ? e->cfg.chunk : 512;
    rc = load_model(e, err, errlen);
    if (!rc)
        rc = check_shapes(e, err, errlen);
    if (rc)
        goto fail;
    fill_info(e);
    e->info.context = e->cfg.context ? e->cfg.context : e->info.n_ctx_train;
    if (e->info.context > e->info.n_ctx_train)
        dray_warn("context %u is longer than the model was trained for (%u)", e->info.context,
                  e->info.n_ctx_train);
    rc = open_kv(e, err, errlen);
    if (!rc)
        rc = calibrate(e, err, errlen);
    if (rc)
        goto fail;
    /* calibration re-prepared the layers (f32 -> int8 with outlier channels) */
    e->info.weight_bytes = e->arch->info(e->model)->weight_bytes;
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
    if (e->kv)
        dray_kv_free(e->kv);
    if (e->model)
        e->arch->free(e->model);
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

const struct dray_engine_info *dray_engine_get_info(const struct dray_engine *e)
{
    return &e->info;
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

void dray_gen_params_from_config(const struct dray_config *cfg, struct dray_gen_params *p)
{
    memset(p, 0, sizeof(*p));
    p->temperature = cfg->temperature;
    p->top_k = cfg->top_k;
    p->top_p = cfg->top_p;
    p->min_p = cfg->min_p;
    p->repeat_penalty = cfg->repeat_penalty;
    p->repeat_last_n = 64;
    p->seed = cfg->seed;
    p->max_tokens = cfg->max_tokens;
}

/* --------------------------------------------------------------- sessions */

int dray_session_new(struct dray_engine *e, struct dray_session **out, char *err, size_t errlen)
{
    struct dray_session *s = calloc(1, sizeof(*s));
    *out = NULL;
    if (!s)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    int rc = dray_kv_seq_new(e->kv, &s->seq);
    if (rc) {
        free(s);
        return dray_fail(err, errlen, rc, "no free sequence slot (max_seqs = %u)", e->info.max_seqs);
    }
    s->e = e;
    *out = s;
    return 0;
}

void dray_session_free(struct dray_session *s)
{
    if (!s)
        return;
    dray_kv_seq_free(s->e->kv, s->seq);
    free(s->hist);
    free(s);
}

uint32_t dray_session_len(const struct dray_session *s)
{
    return (uint32_t)s->n_hist;
}

static int hist_push(struct dray_session *s, const int32_t *ids, size_t n)
{
    if (s->n_hist + n > s->cap_hist) {
        size_t cap = s->cap_hist ? s->cap_hist : 256;
        while (cap < s->n_hist + n)
            cap *= 2;
        int32_t *h = realloc(s->hist, cap * sizeof(*h));
        if (!h)
            return DRAY_ENOMEM;
        s->hist = h;
        s->cap_hist = cap;
    }
    memcpy(s->hist + s->n_hist, ids, n * sizeof(*ids));
    s->n_hist += n;
    return 0;
}

int dray_session_adopt(struct dray_session *s, const int32_t *ids, size_t n)
{
    return hist_push(s, ids, n);
}

static int check_fits(struct dray_session *s, size_t n, char *err, size_t errlen);
static int prefill(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen);

/* One forward step over several sessions: session i appends n[i] tokens (ids are
 * concatenated in session order). The logits of the listed batch rows go to logits. */
int dray_engine_step(struct dray_session *const *ss, uint32_t n_seq, const uint32_t *n,
                     const int32_t *ids, const uint32_t *logit_rows, uint32_t n_logits,
                     float *logits, char *err, size_t errlen)
{
    struct dray_engine *e = ss[0]->e;
    uint32_t T = 0, seq_ids[n_seq];
    for (uint32_t i = 0; i < n_seq; i++) {
        seq_ids[i] = ss[i]->seq;
        T += n[i];
    }
    int32_t *pos = malloc(T * sizeof(int32_t));
    if (!pos)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    for (uint32_t i = 0, t = 0; i < n_seq; i++)
        for (uint32_t j = 0; j < n[i]; j++)
            pos[t++] = (int32_t)(ss[i]->n_hist + j);
    int rc = dray_kv_step_begin(e->kv, n_seq, seq_ids, n, err, errlen);
    if (!rc) {
        struct dray_batch b = {.n_tok = T, .ids = ids, .pos = pos, .n_logits = n_logits,
                               .logit_rows = logit_rows, .logits = logits};
        rc = e->arch->forward(e->model, e->kv, &b, err, errlen);
        if (rc)
            dray_kv_step_abort(e->kv);
        else
            dray_kv_step_end(e->kv);
    }
    for (uint32_t i = 0, t = 0; !rc && i < n_seq; t += n[i], i++)
        if (hist_push(ss[i], ids + t, n[i]))
            rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    free(pos);
    return rc;
}

static int step(struct dray_session *s, const int32_t *ids, uint32_t n, const uint32_t *logit_rows,
                uint32_t n_logits, float *logits, char *err, size_t errlen)
{
    return dray_engine_step(&s, 1, &n, ids, logit_rows, n_logits, logits, err, errlen);
}

int dray_sessions_decode(struct dray_session *const *ss, uint32_t n_seq, const int32_t *ids,
                         float *logits, char *err, size_t errlen)
{
    uint32_t ones[n_seq], rows[n_seq];
    if (n_seq == 0 || n_seq > ss[0]->e->chunk)
        return dray_fail(err, errlen, DRAY_EINVAL, "decode step of %u sequences (1..%u)", n_seq,
                         ss[0]->e->chunk);
    for (uint32_t i = 0; i < n_seq; i++) {
        if (ss[i]->e != ss[0]->e || ss[i]->n_hist + 1 > ss[i]->e->info.context)
            return dray_fail(err, errlen, DRAY_ERANGE, "session %u cannot take another token", i);
        ones[i] = 1;
        rows[i] = i;
    }
    return dray_engine_step(ss, n_seq, ones, ids, rows, logits ? n_seq : 0, logits, err, errlen);
}

int dray_session_prefill(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen)
{
    int rc = check_fits(s, n, err, errlen);
    return rc ? rc : prefill(s, ids, n, err, errlen);
}

static int check_fits(struct dray_session *s, size_t n, char *err, size_t errlen)
{
    uint32_t ctx = s->e->info.context;
    if (s->n_hist + n > ctx)
        return dray_fail(err, errlen, DRAY_ERANGE,
                         "the prompt is %zu tokens and the session already holds %zu, but the "
                         "context is %u tokens: shorten the prompt or raise 'context' (-c)",
                         n, s->n_hist, ctx);
    return 0;
}

/* Prefill in chunks; the logits of the last token land in e->logits. */
static int prefill(struct dray_session *s, const int32_t *ids, size_t n, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    for (size_t i = 0; i < n; i += e->chunk) {
        uint32_t m = (uint32_t)(n - i < e->chunk ? n - i : e->chunk);
        uint32_t last = m - 1;
        bool final = i + m == n;
        int rc = step(s, ids + i, m, &last, final ? 1 : 0, e->logits, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int dray_session_dump_logits(struct dray_session *s, const int32_t *ids, size_t n, void *logits_out,
                             char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    int rc = check_fits(s, n, err, errlen);
    uint32_t *rows = malloc(e->chunk * sizeof(uint32_t));
    float *buf = malloc((size_t)e->chunk * e->info.n_vocab * sizeof(float));
    if (!rows || !buf)
        rc = rc ? rc : dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for %u rows of logits", e->chunk);
    for (uint32_t i = 0; rows && i < e->chunk; i++)
        rows[i] = i;
    for (size_t i = 0; !rc && i < n; i += e->chunk) {
        uint32_t m = (uint32_t)(n - i < e->chunk ? n - i : e->chunk);
        rc = step(s, ids + i, m, rows, m, buf, err, errlen);
        if (!rc && fwrite(buf, sizeof(float) * e->info.n_vocab, m, logits_out) != m)
            rc = dray_fail(err, errlen, DRAY_EIO, "writing logits failed: %s", strerror(errno));
    }
    free(rows);
    free(buf);
    return rc;
}

static int decode(struct dray_session *s, const struct dray_gen_params *p, struct dray_emitter *em,
                  struct dray_gen_stats *st, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    struct dray_sampler_params sp = {
        .temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p,
        .repeat_penalty = p->repeat_penalty, .repeat_last_n = p->repeat_last_n, .seed = p->seed,
    };
    struct dray_sampler *smp = NULL;
    int rc = dray_sampler_create(&sp, &smp, err, errlen);
    if (rc)
        return rc;
    double t0 = dray_now_s();
    st->stop_reason = "max tokens";
    for (uint32_t i = 0; i < p->max_tokens; i++) {
        int32_t id = dray_sampler_sample(smp, e->logits, e->info.n_vocab, s->hist, s->n_hist);
        if (id < 0) {
            rc = dray_fail(err, errlen, id, "sampling failed: %s", dray_strerror(id));
            break;
        }
        if (dray_tokenizer_is_eog(e->tok, id)) {
            st->stop_reason = "eog";
            break;
        }
        st->n_generated++;
        bool stopped;
        if (dray_emitter_token(em, id, &stopped)) {
            st->stop_reason = "caller";
            rc = step(s, &id, 1, NULL, 0, NULL, err, errlen);
            break;
        }
        if (stopped) {
            st->stop_reason = "stop string";
            rc = step(s, &id, 1, NULL, 0, NULL, err, errlen);
            break;
        }
        if (s->n_hist + 1 > e->info.context) {
            st->stop_reason = "context full";
            break;
        }
        uint32_t row = 0;
        /* the last token of max_tokens still goes into the KV so the session can go on */
        bool want = i + 1 < p->max_tokens;
        rc = step(s, &id, 1, &row, want ? 1 : 0, e->logits, err, errlen);
        if (rc)
            break;
    }
    st->decode_s = dray_now_s() - t0;
    dray_sampler_free(smp);
    if (!rc)
        dray_emitter_flush(em);
    return rc;
}

int dray_session_generate(struct dray_session *s, const int32_t *ids, size_t n,
                          const struct dray_gen_params *p, dray_emit_fn emit, void *user,
                          struct dray_gen_stats *st, char *err, size_t errlen)
{
    struct dray_engine *e = s->e;
    memset(st, 0, sizeof(*st));
    st->n_prompt = (uint32_t)n;
    st->n_reused = (uint32_t)s->n_hist;
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "empty prompt");
    int rc = check_fits(s, n, err, errlen);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= e->info.n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL, "token id %d at %zu is outside the vocabulary (0..%u)",
                             ids[i], i, e->info.n_vocab - 1);
    double t0 = dray_now_s();
    rc = prefill(s, ids, n, err, errlen);
    st->prefill_s = dray_now_s() - t0;
    st->n_prefilled = (uint32_t)n;
    if (rc)
        return rc;
    struct dray_emitter em;
    rc = dray_emitter_init(&em, e->tok, p->stop, p->n_stop, emit, user, err, errlen);
    if (rc)
        return rc;
    rc = decode(s, p, &em, st, err, errlen);
    dray_emitter_free(&em);
    return rc;
}

int dray_chat_turn(struct dray_session *s, const char *system, const char *user_text,
                   const struct dray_gen_params *p, dray_emit_fn emit, void *user,
                   struct dray_gen_stats *st, char *err, size_t errlen)
{
    struct dray_chat_msg msgs[2];
    size_t n_msgs = 0, n = 0;
    int32_t *ids = NULL;
    /* later turns continue the KV: the reply ended at the end-of-turn marker,
     * which was sampled but not fed */
    bool cont = s->chatted || s->n_hist > 0;
    if (!cont && system && system[0])
        msgs[n_msgs++] = (struct dray_chat_msg){"system", system};
    msgs[n_msgs++] = (struct dray_chat_msg){"user", user_text};
    int rc = dray_chat_tokenize(s->e->tok, &s->e->chat, msgs, n_msgs, cont, false, true, &ids, &n,
                                err, errlen);
    if (!rc) {
        rc = dray_session_generate(s, ids, n, p, emit, user, st, err, errlen);
        if (!rc)
            s->chatted = true;
    }
    free(ids);
    return rc;
}

const char *dray_engine_chat_template(const struct dray_engine *e)
{
    return e->chat.name;
}

int dray_engine_chat_tokenize(const struct dray_engine *e, const struct dray_chat_message *msgs,
                              size_t n, bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                              char *err, size_t errlen)
{
    struct dray_chat_msg *m = malloc((n ? n : 1) * sizeof(*m));
    if (!m)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        m[i] = (struct dray_chat_msg){msgs[i].role, msgs[i].content};
    int rc = dray_chat_tokenize(e->tok, &e->chat, m, n, false, false, add_generation_prompt, ids,
                                n_ids, err, errlen);
    free(m);
    return rc;
}
