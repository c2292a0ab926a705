/* The serving-path checks of a certificate: one model opened twice, on the
 * plugin under test (the subject) and on the CPU plugin (the reference), with the
 * same configuration otherwise, and compared through the public API only:
 *
 *   logits        prefill logits of one prompt, every position: mean KL(cpu ||
 *                 subject) and argmax agreement (LOGIT_KL_TOL, LOGIT_TOP1_MIN);
 *   greedy        one greedy request through each scheduler: the same tokens, or a
 *                 first divergence at a near-tie of the reference (margin within
 *                 twice the largest RMS logit error measured: two correct devices
 *                 may round it either way);
 *   batched       three requests decoded together by the subject's scheduler give
 *                 the tokens each gives alone;
 *   prefix_cache  a chat's second turn on the subject reuses the first turn's
 *                 cached KV (n_cached > 0) and gives the tokens of the same turn run
 *                 cold;
 *   kv_spill      the same with a KV pool so small that turn 1's blocks are
 *                 spilled to the host tier (the plugin's downloads) and restored
 *                 (its uploads) for turn 2;
 *   kv_transfer   a prompt's KV computed by the subject, exported to host memory
 *                 (dray_session_kv_export) and imported into a CPU session, which
 *                 continues with its own cold tokens; and CPU -> subject likewise
 *                 (a difference is allowed at a near-tie, as for greedy).
 *
 * Requests carry distinct cache salts so that only the prefix_cache check shares
 * KV between requests. */
#include "certify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPTS 3
static const char *const prompts[N_PROMPTS] = {
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog, and then",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 4, 5, 6, 7,",
};

/* The logits check's bounds, those of the real-model plugin test
 * (tests/reference/test_plugins_gemma.py): int8 paths are not bit-identical by
 * design (a value within an ulp of a rounding boundary may take the neighbouring
 * int8 code on another device, and 18 layers carry it on), so the check is
 * distributional: mean KL(cpu || subject) over the positions, and the share of
 * positions whose argmax agrees. A wrong op moves both by orders of magnitude. */
#define LOGIT_KL_TOL 0.02
#define LOGIT_TOP1_MIN 0.8
/* A greedy divergence is a near-tie when the CPU's margin between the two tokens
 * is at most this times the largest RMS logit error the logits check measured. */
#define TIE_FACTOR 2.0

struct side {
    struct dray_engine *e;
    struct dray_sched *s;
    const struct dray_engine_info *in;
};

struct prompt {
    int32_t *ids;
    size_t n;
};

static struct dray_cert_check *add_check(struct dray_cert_model *m, const char *name,
                                         const char *unit, double tol)
{
    struct dray_cert_check *c = &m->checks[m->n_checks++];
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "%s", name);
    snprintf(c->unit, sizeof(c->unit), "%s", unit);
    c->tolerance = tol;
    return c;
}

static void report(const struct dray_cert_check *c, FILE *log)
{
    fprintf(log, "  %-13s %-9s %s\n", c->name, !c->ran ? "not run" : c->passed ? "pass" : "FAIL",
            c->detail);
}

/* ------------------------------------------------------------ logits */

struct rows {
    float *v;     /* [n][vocab] */
    size_t n, vocab;
};

static int keep_row(void *user, size_t pos, const float *logits)
{
    struct rows *r = user;
    memcpy(r->v + pos * r->vocab, logits, r->vocab * sizeof(float));
    return 0;
}

static int eval_rows(struct dray_engine *e, const struct prompt *p, struct rows *r, char *err,
                     size_t errlen)
{
    struct dray_session *s = NULL;
    int rc = dray_session_new(e, &s, err, errlen);
    if (rc == 0)
        rc = dray_session_eval(s, p->ids, p->n, 0, keep_row, r, err, errlen);
    dray_session_free(s);
    return rc;
}

static size_t argmax(const float *v, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* KL(p || q) of the softmaxes of logits a (p) and b (q), in nats, in double. */
static double kl_logits(const float *a, const float *b, size_t n)
{
    double ma = a[0], mb = b[0], za = 0, zb = 0, kl = 0;
    for (size_t k = 1; k < n; k++) {
        ma = a[k] > ma ? a[k] : ma;
        mb = b[k] > mb ? b[k] : mb;
    }
    for (size_t k = 0; k < n; k++) {
        za += exp(a[k] - ma);
        zb += exp(b[k] - mb);
    }
    double la = ma + log(za), lb = mb + log(zb); /* log-sum-exp */
    for (size_t k = 0; k < n; k++) {
        double lpa = a[k] - la, lpb = b[k] - lb;
        kl += exp(lpa) * (lpa - lpb);
    }
    return kl > 0 ? kl : 0;
}

/* Returns the largest RMS logit error of any position (the near-tie scale of the
 * greedy check), < 0 on failure. */
static double check_logits(struct side *sub, struct side *ref, const struct prompt *p,
                           struct dray_cert_model *m, FILE *log)
{
    struct dray_cert_check *c = add_check(m, "logits", "mean KL(cpu || subject) per position, nats",
                                          LOGIT_KL_TOL);
    char err[1024] = "";
    size_t vocab = ref->in->n_vocab;
    struct rows a = {calloc(p->n * vocab, sizeof(float)), p->n, vocab};
    struct rows b = {calloc(p->n * vocab, sizeof(float)), p->n, vocab};
    double worst_rel = 0, worst_rms = 0, kl_sum = 0;
    int rc = a.v && b.v ? 0 : DRAY_ENOMEM;
    if (rc == 0 && (rc = eval_rows(ref->e, p, &a, err, sizeof(err))))
        snprintf(c->detail, sizeof(c->detail), "the CPU plugin failed: %s", err);
    else if (rc == 0 && (rc = eval_rows(sub->e, p, &b, err, sizeof(err))))
        snprintf(c->detail, sizeof(c->detail), "the subject failed: %s", err);
    else if (rc)
        snprintf(c->detail, sizeof(c->detail), "out of memory for %zu x %zu logits", p->n, vocab);
    size_t same = 0;
    int finite = 1;
    for (size_t i = 0; rc == 0 && i < p->n; i++) {
        const float *r = a.v + i * vocab, *s = b.v + i * vocab;
        double dmax = 0, rmax = 0, d2 = 0;
        for (size_t k = 0; k < vocab; k++) {
            double d = fabs((double)s[k] - r[k]);
            finite &= isfinite(s[k]) != 0;
            dmax = d > dmax ? d : dmax;
            d2 += d * d;
            rmax = fabs(r[k]) > rmax ? fabs(r[k]) : rmax;
        }
        double rel = rmax > 0 ? dmax / rmax : dmax, rms = sqrt(d2 / (double)vocab);
        worst_rel = rel > worst_rel ? rel : worst_rel;
        worst_rms = rms > worst_rms ? rms : worst_rms;
        if (finite)
            kl_sum += kl_logits(r, s, vocab);
        same += argmax(r, vocab) == argmax(s, vocab);
    }
    if (rc == 0) {
        double kl = finite ? kl_sum / (double)p->n : INFINITY, top1 = (double)same / (double)p->n;
        c->ran = 1;
        c->measured = kl;
        c->passed = finite && kl < LOGIT_KL_TOL && top1 >= LOGIT_TOP1_MIN;
        snprintf(c->detail, sizeof(c->detail),
                 "%zu positions x %zu logits: mean KL %.3g (< %g), same argmax at %zu/%zu (>= %.0f%%); "
                 "max |error| / max |cpu| %.3g, largest RMS error %.3g%s", p->n, vocab, kl,
                 LOGIT_KL_TOL, same, p->n, 100 * LOGIT_TOP1_MIN, worst_rel, worst_rms,
                 finite ? "" : "; NaN or Inf in the subject's logits");
    }
    report(c, log);
    free(a.v);
    free(b.v);
    return rc == 0 ? worst_rms : -1;
}

/* ------------------------------------------------------------ requests */

struct result {
    int32_t *ids;
    size_t n;
    uint32_t n_cached;
    int rc;
    char error[512];
};

static void result_free(struct result *r)
{
    free(r->ids);
    memset(r, 0, sizeof(*r));
}

/* Submit n requests at once (prompts p[i], salts salt[i]), wait for all. */
static int run_requests(struct dray_sched *s, const struct prompt *const *p, const char *const *salt,
                        size_t n, uint32_t gen, struct result *out, char *err, size_t errlen)
{
    struct dray_request *req[N_PROMPTS] = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct dray_request_params rp;
        memset(&rp, 0, sizeof(rp));
        rp.ids = p[i]->ids;
        rp.n_ids = p[i]->n;
        rp.gen.temperature = 0; /* greedy */
        rp.gen.top_p = 1;
        rp.gen.repeat_penalty = 1;
        rp.gen.seed = 1;
        rp.gen.max_tokens = gen;
        rp.cache_salt = salt[i];
        memset(&out[i], 0, sizeof(out[i]));
        rc = dray_sched_submit(s, &rp, &req[i], err, errlen);
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct dray_request_output o;
        do {
            dray_request_poll(req[i], &o, -1);
            int32_t *g = realloc(out[i].ids, (out[i].n + o.n_ids + 1) * sizeof(int32_t));
            if (!g) {
                rc = DRAY_ENOMEM;
                snprintf(err, errlen, "out of memory for generated tokens");
                break;
            }
            out[i].ids = g;
            memcpy(g + out[i].n, o.ids, o.n_ids * sizeof(int32_t));
            out[i].n += o.n_ids;
        } while (!o.done);
        if (rc == 0) {
            out[i].n_cached = o.n_cached;
            out[i].rc = o.rc;
            if (o.rc) {
                snprintf(out[i].error, sizeof(out[i].error), "%s", o.error ? o.error : "failed");
                snprintf(err, errlen, "request %zu: %s", i, out[i].error);
                rc = o.rc;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (req[i])
            dray_request_free(req[i]);
    return rc;
}

static size_t first_diff(const struct result *a, const struct result *b)
{
    size_t i = 0;
    while (i < a->n && i < b->n && a->ids[i] == b->ids[i])
        i++;
    return i;
}

/* The reference's margin logit[a] - logit[b] after prompt + toks[0..d). */
static int ref_margin(struct side *ref, const struct prompt *p, const int32_t *toks, size_t d,
                      int32_t a, int32_t b, double *margin, char *err, size_t errlen)
{
    struct prompt q = {malloc((p->n + d) * sizeof(int32_t)), p->n + d};
    size_t vocab = ref->in->n_vocab;
    struct rows r = {calloc(q.n * vocab, sizeof(float)), q.n, vocab};
    int rc = q.ids && r.v ? 0 : DRAY_ENOMEM;
    if (rc == 0) {
        memcpy(q.ids, p->ids, p->n * sizeof(int32_t));
        memcpy(q.ids + p->n, toks, d * sizeof(int32_t));
        rc = eval_rows(ref->e, &q, &r, err, errlen);
    }
    if (rc == 0) {
        const float *last = r.v + (q.n - 1) * vocab;
        *margin = (double)last[a] - last[b];
    }
    free(q.ids);
    free(r.v);
    return rc;
}

static int open_side(const struct dray_config *cfg, struct side *sd, char *err, size_t errlen)
{
    int rc = dray_engine_open(cfg, &sd->e, err, errlen);
    if (rc == 0)
        sd->in = dray_engine_get_info(sd->e);
    return rc;
}

static void close_side(struct side *sd)
{
    if (sd->s)
        dray_sched_destroy(sd->s);
    if (sd->e)
        dray_engine_close(sd->e);
    memset(sd, 0, sizeof(*sd));
}

/* The host tier of the prefix cache on the subject: a third engine whose KV pool
 * holds little more than turn 2, so that turn 2 run under another salt pushes
 * turn 1's blocks off the device; the cache spills them to host memory (the plugin's
 * download) and turn 2 restores them (its upload), and must give the tokens of
 * turn 2 run cold. */
static void check_spill(const struct dray_config *cs, const struct prompt *const *pp,
                        const struct prompt *t2, const struct result *cold, uint32_t gen,
                        struct dray_cert_check *c)
{
    static const char *const salt_t1[1] = {"cert-spill"};
    static const char *const salt_press[1] = {"cert-press"};
    const struct prompt *pt2[1] = {t2};
    struct dray_config cfg = *cs;
    struct side sp = {0};
    struct result r1 = {0}, rp = {0}, r2 = {0};
    char err[1024] = "";
    /* N_PROMPTS sequences of at most turn 2's length, in a pool with room for the
     * window layers of each and for little more than turn 2 in the global ones;
     * the per-sequence and per-token costs depend on context and max_seqs, so a
     * probe engine with those settings measures them first */
    uint64_t tokens = t2->n + gen + (uint64_t)cfg.kv_block;
    cfg.max_seqs = N_PROMPTS;
    cfg.context = (uint32_t)tokens;
    if (cfg.host_cache == 0) {
        snprintf(c->detail, sizeof(c->detail), "host_cache is 0 in the configuration: no host tier");
        return;
    }
    c->ran = 1;
    int rc = open_side(&cfg, &sp, err, sizeof(err));
    if (rc == 0) {
        cfg.kv_budget = N_PROMPTS * sp.in->kv_bytes_per_seq_fixed +
                        sp.in->kv_bytes_per_token * (tokens + (uint64_t)cfg.kv_block);
        close_side(&sp);
    }
    if (rc || open_side(&cfg, &sp, err, sizeof(err)) || dray_sched_create(sp.e, 0, &sp.s, err, sizeof(err)) ||
        run_requests(sp.s, pp, salt_t1, 1, gen, &r1, err, sizeof(err)) ||
        run_requests(sp.s, pt2, salt_press, 1, gen, &rp, err, sizeof(err)) ||
        run_requests(sp.s, pt2, salt_t1, 1, gen, &r2, err, sizeof(err))) {
        snprintf(c->detail, sizeof(c->detail), "the subject failed with a %llu-byte KV pool: %s",
                 (unsigned long long)cfg.kv_budget, err);
    } else {
        struct dray_sched_stats st;
        dray_sched_get_stats(sp.s, &st);
        size_t d = first_diff(cold, &r2);
        int same = d == cold->n && d == r2.n;
        c->measured = r2.n_cached;
        c->passed = same && st.cache_spills > 0 && st.cache_restores > 0 && r2.n_cached >= 1;
        snprintf(c->detail, sizeof(c->detail), "KV pool of %llu tokens: %llu blocks spilled to the "
                 "host, %llu restored (%llu evictions, pool %llu blocks); turn 2 reused %u tokens and its tokens %s the cold run's",
                 (unsigned long long)tokens, (unsigned long long)st.cache_spills,
                 (unsigned long long)st.cache_restores, (unsigned long long)st.cache_evictions,
                 (unsigned long long)st.kv_blocks_total, r2.n_cached, same ? "equal" : "differ from");
    }
    close_side(&sp);
    result_free(&r1);
    result_free(&r2);
    result_free(&rp);
}

/* ------------------------------------------------------------ kv_transfer */

struct transfer {
    size_t bytes;
    uint32_t moved;    /* tokens whose KV was moved */
    struct result warm, cold;
};

static int collect_id(void *user, const char *text, size_t len, int32_t id)
{
    (void)text;
    (void)len;
    struct result *r = user;
    if (id < 0)
        return 0;
    int32_t *g = realloc(r->ids, (r->n + 1) * sizeof(int32_t));
    if (!g)
        return 1;
    r->ids = g;
    r->ids[r->n++] = id;
    return 0;
}

static int greedy_session(struct dray_session *s, const int32_t *ids, size_t n, uint32_t gen,
                          struct result *out, char *err, size_t errlen)
{
    struct dray_gen_params g;
    struct dray_gen_stats st;
    memset(&g, 0, sizeof(g)); /* temperature 0: greedy */
    g.top_p = 1;
    g.repeat_penalty = 1;
    g.seed = 1;
    g.max_tokens = gen;
    return dray_session_generate(s, ids, n, &g, collect_id, out, &st, err, errlen);
}

/* `from` computes the KV of q without its last token, exports it; `to` imports it
 * into a fresh session and generates from there (warm), then runs q cold. */
static int transfer_once(struct dray_engine *from, struct dray_engine *to, const struct prompt *q,
                         uint32_t gen, struct transfer *t, char *err, size_t errlen)
{
    struct dray_session *s = NULL;
    void *data = NULL;
    int rc = dray_session_new(from, &s, err, errlen);
    if (!rc)
        rc = dray_session_prefill(s, q->ids, q->n - 1, err, errlen);
    if (!rc)
        rc = dray_session_kv_export(s, &data, &t->bytes, err, errlen);
    dray_session_free(s);
    s = NULL;
    if (!rc)
        rc = dray_session_new(to, &s, err, errlen);
    if (!rc)
        rc = dray_session_kv_import(s, data, t->bytes, err, errlen);
    free(data);
    if (!rc) {
        t->moved = dray_session_len(s);
        rc = greedy_session(s, q->ids + t->moved, q->n - t->moved, gen, &t->warm, err, errlen);
    }
    dray_session_free(s);
    s = NULL;
    if (!rc)
        rc = dray_session_new(to, &s, err, errlen);
    if (!rc)
        rc = greedy_session(s, q->ids, q->n, gen, &t->cold, err, errlen);
    dray_session_free(s);
    return rc;
}

/* Both directions, subject -> cpu and cpu -> subject. Each receiving side must
 * continue with the tokens it computes cold, or part from them at a near-tie (the
 * CPU's margin within TIE_FACTOR x the logits check's largest RMS error, as the
 * greedy check: the two plugins' KV of one prompt agree only to rounding on int8). */
static void check_transfer(struct side *sub, struct side *ref, const struct prompt *q, uint32_t gen,
                           double rms_err, const char *plugin, struct dray_cert_check *ck)
{
    struct side *from[2] = {sub, ref}, *to[2] = {ref, sub};
    const char *name[2] = {"cpu", plugin}, *fname[2] = {plugin, "cpu"};
    char err[1024];
    ck->ran = 1;
    ck->passed = 1;
    ck->measured = (double)gen;
    ck->tolerance = (double)gen;
    for (int i = 0; i < 2; i++) {
        struct transfer t = {0};
        size_t w = strlen(ck->detail);
        char *dst = ck->detail + w;
        size_t room = sizeof(ck->detail) - w;
        if (transfer_once(from[i]->e, to[i]->e, q, gen, &t, err, sizeof(err))) {
            ck->passed = 0;
            snprintf(dst, room, "%s%s -> %s failed: %s", i ? "; " : "", fname[i], name[i], err);
        } else {
            size_t d = first_diff(&t.cold, &t.warm);
            int same = d == t.cold.n && d == t.warm.n;
            double margin = 0;
            int tie = 0;
            if (!same && d < t.cold.n && d < t.warm.n && rms_err >= 0 &&
                ref_margin(ref, q, t.cold.ids, d, t.cold.ids[d], t.warm.ids[d], &margin, err,
                           sizeof(err)) == 0)
                tie = margin <= TIE_FACTOR * rms_err;
            ck->passed &= same || tie;
            if ((double)d < ck->measured)
                ck->measured = (double)d;
            snprintf(dst, room, "%s%s -> %s: %u tokens' KV (%zu bytes) moved, %s continued with "
                     "%zu of %zu tokens equal to its cold run", i ? "; " : "", fname[i], name[i],
                     t.moved, t.bytes, name[i], d, t.cold.n);
            if (!same && tie)
                snprintf(dst + strlen(dst), room - strlen(dst), " (a near-tie: CPU margin %.3g)",
                         margin);
        }
        result_free(&t.warm);
        result_free(&t.cold);
    }
}

/* ------------------------------------------------------------ the run */

int dray_certify_model(const struct dray_config *base, const char *plugin, const char *device,
                       uint32_t gen, struct dray_cert_model *m, FILE *log)
{
    struct dray_config cs = *base, cr = *base; /* subject, reference */
    struct side sub = {0}, ref = {0};
    struct prompt p[N_PROMPTS] = {{0}}, t2 = {0}; /* t2: a chat's second turn */
    struct result one[N_PROMPTS] = {{0}}, many[N_PROMPTS] = {{0}}, cold = {0}, warm = {0}, turn2 = {0},
                  rg = {0};
    char err[2048] = "";
    int rc;

    memset(m, 0, sizeof(*m));
    snprintf(m->model, sizeof(m->model), "%s", base->model);
    snprintf(cs.backend, sizeof(cs.backend), "%s", plugin);
    snprintf(cs.device, sizeof(cs.device), "%s", device ? device : "");
    cs.fallback[0] = cr.fallback[0] = '\0'; /* certify exactly the plugin named */
    snprintf(cr.backend, sizeof(cr.backend), "cpu");
    cr.device[0] = '\0';
    if (cs.max_seqs < N_PROMPTS)
        cs.max_seqs = cr.max_seqs = N_PROMPTS;

    fprintf(log, "\nserving path: %s on %s against cpu\n", base->model, plugin);
    if ((rc = open_side(&cr, &ref, err, sizeof(err)))) {
        snprintf(m->error, sizeof(m->error), "the model does not open on the CPU plugin: %s", err);
        goto done;
    }
    if ((rc = open_side(&cs, &sub, err, sizeof(err)))) {
        snprintf(m->error, sizeof(m->error), "the model does not open on %s: %s", plugin, err);
        goto done;
    }
    snprintf(m->model_name, sizeof(m->model_name), "%s", sub.in->model_name ? sub.in->model_name : "");
    snprintf(m->arch, sizeof(m->arch), "%s", sub.in->arch ? sub.in->arch : "");
    snprintf(m->plugin, sizeof(m->plugin), "%s", sub.in->plugin);
    snprintf(m->device, sizeof(m->device), "%s", sub.in->device);
    snprintf(m->precision, sizeof(m->precision), "%s", sub.in->precision);
    snprintf(m->kv_dtype, sizeof(m->kv_dtype), "%s", sub.in->kv_dtype);
    fprintf(log, "  model %s (%s), %s weights, %s KV; subject %s on %s\n", m->model_name, m->arch,
            m->precision, m->kv_dtype, m->plugin, m->device);
    for (size_t i = 0; i < N_PROMPTS; i++) {
        if ((rc = dray_engine_tokenize(sub.e, prompts[i], true, false, &p[i].ids, &p[i].n, err,
                                       sizeof(err)))) {
            snprintf(m->error, sizeof(m->error), "tokenizing prompt %zu: %s", i, err);
            goto done;
        }
        m->prompt_tokens += (uint32_t)p[i].n;
    }
    m->n_prompts = N_PROMPTS;
    m->gen_tokens = gen;
    m->ran = 1;

    double rms_err = check_logits(&sub, &ref, &p[0], m, log);

    /* the schedulers: from here on no sessions but the reference's margin probe,
     * which runs after the reference scheduler is gone */
    struct dray_cert_check *cg = add_check(m, "greedy", "tokens before the first difference", 0);
    struct dray_cert_check *cb = add_check(m, "batched", "requests whose tokens differ", 0);
    struct dray_cert_check *cp = add_check(m, "prefix_cache", "turn-2 tokens served from cached KV", 1);
    t2.ids = malloc((p[0].n + gen + p[1].n) * sizeof(int32_t));
    const struct prompt *pp[N_PROMPTS] = {&p[0], &p[1], &p[2]};
    static const char *const salt_one[N_PROMPTS] = {"cert-one-0", "cert-one-1", "cert-one-2"};
    static const char *const salt_many[N_PROMPTS] = {"cert-many-0", "cert-many-1", "cert-many-2"};
    static const char *const salt_ref[1] = {"cert-ref"}, *const salt_pc[1] = {"cert-prefix"};
    int sched_ok = dray_sched_create(sub.e, 0, &sub.s, err, sizeof(err)) == 0 &&
                   dray_sched_create(ref.e, 0, &ref.s, err, sizeof(err)) == 0;
    if (!sched_ok)
        snprintf(cg->detail, sizeof(cg->detail), "no scheduler: %s", err);
    if (sched_ok && run_requests(ref.s, pp, salt_ref, 1, gen, &rg, err, sizeof(err)))
        snprintf(cg->detail, sizeof(cg->detail), "the CPU plugin failed: %s", err), sched_ok = 0;
    int singles_ok = sched_ok;
    for (size_t i = 0; singles_ok && i < N_PROMPTS; i++)
        if (run_requests(sub.s, &pp[i], &salt_one[i], 1, gen, &one[i], err, sizeof(err))) {
            snprintf(cg->detail, sizeof(cg->detail), "the subject failed: %s", err);
            singles_ok = 0;
        }
    /* batched: all three at once */
    if (singles_ok) {
        cb->ran = 1;
        if (run_requests(sub.s, pp, salt_many, N_PROMPTS, gen, many, err, sizeof(err))) {
            snprintf(cb->detail, sizeof(cb->detail), "the subject failed: %s", err);
        } else {
            size_t differ = 0;
            char where[256] = "";
            for (size_t i = 0; i < N_PROMPTS; i++) {
                size_t d = first_diff(&one[i], &many[i]);
                if (d < one[i].n || d < many[i].n) {
                    size_t w = strlen(where);
                    snprintf(where + w, sizeof(where) - w, "; request %zu differs at token %zu", i, d);
                    differ++;
                }
            }
            cb->measured = (double)differ;
            cb->passed = differ == 0;
            snprintf(cb->detail, sizeof(cb->detail), "%d requests decoded together: %zu of %d "
                     "give other tokens than alone (%zu, %zu, %zu tokens)%s", N_PROMPTS, differ,
                     N_PROMPTS, one[0].n, one[1].n, one[2].n, where);
        }
    }
    /* prefix cache, as a chat's second turn uses it: turn 1 (prompt 0 and its
     * reply), then turn 2 = turn 1 + reply + prompt 1 under the same salt, which
     * must reuse turn 1's KV and give the tokens of the same turn 2 run cold */
    if (singles_ok && !base->prefix_cache) {
        snprintf(cp->detail, sizeof(cp->detail), "prefix_cache is off in the configuration");
    } else if (singles_ok) {
        static const char *const salt_cold[1] = {"cert-prefix-cold"};
        const struct prompt *pt2[1] = {&t2};
        cp->ran = 1;
        if (t2.ids) {
            memcpy(t2.ids, p[0].ids, p[0].n * sizeof(int32_t));
            memcpy(t2.ids + p[0].n, one[0].ids, one[0].n * sizeof(int32_t));
            memcpy(t2.ids + p[0].n + one[0].n, p[1].ids + 1, (p[1].n - 1) * sizeof(int32_t));
            t2.n = p[0].n + one[0].n + p[1].n - 1; /* prompt 1 without its BOS */
        }
        if (!t2.ids) {
            snprintf(cp->detail, sizeof(cp->detail), "out of memory for turn 2");
        } else if (run_requests(sub.s, pp, salt_pc, 1, gen, &cold, err, sizeof(err)) ||
                   run_requests(sub.s, pt2, salt_pc, 1, gen, &warm, err, sizeof(err)) ||
                   run_requests(sub.s, pt2, salt_cold, 1, gen, &turn2, err, sizeof(err))) {
            snprintf(cp->detail, sizeof(cp->detail), "the subject failed: %s", err);
        } else {
            size_t d = first_diff(&turn2, &warm);
            int same = d == turn2.n && d == warm.n;
            cp->measured = warm.n_cached;
            cp->passed = same && warm.n_cached >= 1;
            snprintf(cp->detail, sizeof(cp->detail), "turn 2 (%zu tokens) reused %u tokens of "
                     "turn 1 from cached KV; its tokens %s the cold run's", t2.n, warm.n_cached,
                     same ? "equal" : "differ from");
            if (!same)
                snprintf(cp->detail + strlen(cp->detail), sizeof(cp->detail) - strlen(cp->detail),
                         " at token %zu", d);
        }
    }
    dray_sched_destroy(ref.s);
    ref.s = NULL;
    struct dray_cert_check *cs2 = add_check(m, "kv_spill", "turn-1 tokens restored from the host tier", 1);
    if (cp->ran && cp->passed)
        check_spill(&cs, pp, &t2, &turn2, gen, cs2);
    else
        snprintf(cs2->detail, sizeof(cs2->detail), "needs the prefix_cache check to pass first");
    /* greedy: the subject's single run of prompt 0 against the reference's */
    if (singles_ok) {
        size_t d = first_diff(&rg, &one[0]);
        cg->ran = 1;
        cg->measured = (double)d;
        cg->tolerance = (double)rg.n;
        if (d == rg.n && d == one[0].n) {
            cg->passed = 1;
            snprintf(cg->detail, sizeof(cg->detail), "%zu greedy tokens through the scheduler, "
                     "identical to the CPU plugin's", d);
        } else if (d < rg.n && d < one[0].n && rms_err >= 0) {
            double margin = 0;
            if (ref_margin(&ref, &p[0], rg.ids, d, rg.ids[d], one[0].ids[d], &margin, err, sizeof(err)))
                snprintf(cg->detail, sizeof(cg->detail), "differs at token %zu; the CPU plugin's "
                         "margin could not be measured: %s", d, err);
            else {
                cg->passed = margin <= TIE_FACTOR * rms_err;
                snprintf(cg->detail, sizeof(cg->detail), "differs at token %zu of %zu (cpu %d, "
                         "subject %d): the CPU plugin's margin %.3g is %s %.0fx the largest RMS "
                         "logit error %.3g%s", d, rg.n, rg.ids[d], one[0].ids[d], margin,
                         cg->passed ? "within" : "beyond", TIE_FACTOR, rms_err,
                         cg->passed ? " (a near-tie)" : "");
            }
        } else {
            snprintf(cg->detail, sizeof(cg->detail), "one side stopped early: cpu %zu tokens, "
                     "subject %zu, identical for %zu", rg.n, one[0].n, d);
        }
    }
    report(cg, log);
    report(cb, log);
    report(cp, log);
    report(cs2, log);
    /* kv_transfer: sessions from here on, so the subject's scheduler goes first
     * (one thread drives an engine's KV) */
    dray_sched_destroy(sub.s);
    sub.s = NULL;
    struct dray_cert_check *ck = add_check(m, "kv_transfer",
                                           "tokens equal to the cold run (worse direction)", gen);
    struct prompt q = {malloc((p[0].n + p[1].n) * sizeof(int32_t)), p[0].n + p[1].n - 1};
    if (q.ids) { /* prompt 0, then prompt 1 without its BOS: more than one KV block */
        memcpy(q.ids, p[0].ids, p[0].n * sizeof(int32_t));
        memcpy(q.ids + p[0].n, p[1].ids + 1, (p[1].n - 1) * sizeof(int32_t));
        check_transfer(&sub, &ref, &q, gen, rms_err, m->plugin, ck);
    } else {
        snprintf(ck->detail, sizeof(ck->detail), "out of memory for the prompt");
    }
    free(q.ids);
    report(ck, log);
done:
    if (m->error[0])
        fprintf(log, "  FAIL: %s\n", m->error);
    close_side(&sub);
    close_side(&ref);
    for (size_t i = 0; i < N_PROMPTS; i++) {
        free(p[i].ids);
        result_free(&one[i]);
        result_free(&many[i]);
    }
    result_free(&cold);
    result_free(&warm);
    result_free(&turn2);
    free(t2.ids);
    result_free(&rg);
    int pass = m->ran;
    for (size_t i = 0; i < m->n_checks; i++)
        pass &= !m->checks[i].ran || m->checks[i].passed;
    /* logits, greedy and batched must have run; prefix_cache unless the
     * configuration turned the cache off, kv_spill unless it turned the cache or
     * its host tier off */
    for (size_t i = 0; i < m->n_checks; i++) {
        const char *n = m->checks[i].name;
        int required = strcmp(n, "prefix_cache") && strcmp(n, "kv_spill");
        required |= !strcmp(n, "prefix_cache") && base->prefix_cache;
        required |= !strcmp(n, "kv_spill") && base->prefix_cache && base->host_cache;
        pass &= m->checks[i].ran || !required;
    }
    fprintf(log, "%s: serving path on %s\n", pass ? "PASS" : "FAIL", plugin);
    return pass ? 0 : 1;
}
