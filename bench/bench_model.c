/* dray bench model: prefill and decode speed of a model end to end, measured the
 * way `dray run` works: every decode step computes the logits of every sequence
 * (the output head included) and picks the next token from them (greedy), next
 * to the memory roofline of that step (every byte it must read). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "flags.h"
#include "read_bw.h"

/* Most prompt tokens and decode steps a run may ask for (the KV is sized for them). */
#define MAX_TOKENS 131072u

struct model_opts {
    uint32_t prefill, decode, batch;
    double bw;                /* GB/s for the roofline; 0 = measure it (read_bw.h) */
    const char *json;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void dray_bench_model_help(void)
{
    printf("usage: dray bench model [options]\n"
           "  --prefill N      prompt tokens per sequence (default 512, 1..131072)\n"
           "  --decode N       decode steps (default 128, 0..131072): each computes the logits\n"
           "                   of every sequence and picks the next token greedily, as dray run\n"
           "  --batch B        B sequences decoded in lockstep, one forward step for all B per\n"
           "                   token (default 1, 1..256); tok/s counts the tokens of all B\n"
           "  --mem-bw GBPS    memory bandwidth for the roofline (default: measured, a read of\n"
           "                   the step's bytes with the bench's threads)\n"
           "  --json FILE      append one JSON line with the results\n");
}

static int parse(int argc, char **argv, struct model_opts *o)
{
    static const char *const flags[] = {"--prefill", "--decode", "--batch", "--mem-bw", "--json"};
    *o = (struct model_opts){.prefill = 512, .decode = 128, .batch = 1, .bw = 0}; /* 0: measure */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        size_t f = 0;
        while (f < 5 && strcmp(a, flags[f]))
            f++;
        if (f == 5 || i + 1 >= argc) {
            fprintf(stderr, "dray bench model: %s '%s' (dray bench model -h lists the options)\n",
                    f == 5 ? "unknown option" : "no value after", a);
            return 2;
        }
        const char *v = argv[++i];
        int rc = f == 0 ? dray_flag_u32(a, v, 1, MAX_TOKENS, &o->prefill)
               : f == 1 ? dray_flag_u32(a, v, 0, MAX_TOKENS, &o->decode)
               : f == 2 ? dray_flag_u32(a, v, 1, 256, &o->batch)
               : f == 3 ? dray_flag_f64(a, v, 0.001, 1e6, &o->bw) /* GB/s */
               : (o->json = v, 0);
        if (rc)
            return 2;
    }
    return 0;
}

/* Tokens cycle through a fixed pseudo-random stream so runs are comparable. */
static int32_t token_at(uint32_t i, uint32_t n_vocab)
{
    uint32_t span = n_vocab > 3000 ? n_vocab - 2000 : n_vocab - 1;
    return (int32_t)((n_vocab > 3000 ? 1000 : 1) + (i * 2654435761u) % span);
}

struct result {
    double prefill_s, decode_s, bytes;
    double rescore_per_step; /* candidates a rescored head rescored per decode step */
};

/* Weight bytes of a step: the prepared weights a step reads, and a rescored
 * head's candidate rows (8-bit row read, f32 copy written and read back). */
static double step_weights(const struct dray_engine_info *in, const struct result *r)
{
    return (double)in->step_weight_bytes + r->rescore_per_step * (double)in->rescore_bytes;
}

/* Bytes one decode step must move, for the roofline: every prepared weight byte
 * once (the output head reads its whole int8 table, row scales and outlier
 * columns), and per sequence the KV it attends over at average length len and
 * its logits row (written by the head, read by the pick). Sliding-window layers
 * read at most their per-sequence pool. */
static double step_bytes(const struct dray_engine_info *in, const struct result *r, uint32_t batch, double len)
{
    bool i8 = !strcmp(in->kv_dtype, "int8");
    double per_layer_tok = in->n_kv_head * (2.0 * in->head_dim * (i8 ? 1 : 2) + (i8 ? 8 : 0));
    double n_global = per_layer_tok > 0 ? (double)in->kv_bytes_per_token / per_layer_tok : 0;
    double window = (in->n_layer - n_global) * per_layer_tok * len;
    if (window > (double)in->kv_bytes_per_seq_fixed)
        window = (double)in->kv_bytes_per_seq_fixed;
    double kv = (double)in->kv_bytes_per_token * len + window;
    return step_weights(in, r) + batch * (kv + 2.0 * in->n_vocab * sizeof(float));
}

static int prefill_all(struct dray_engine *e, const struct model_opts *o, struct dray_session **ss,
                       struct result *r, char *err, size_t errlen)
{
    const struct dray_engine_info *in = dray_engine_get_info(e);
    int32_t *ids = malloc(o->prefill * sizeof(int32_t));
    int rc = ids ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "out of memory");
    for (uint32_t b = 0; !rc && b < o->batch; b++) {
        rc = dray_session_new(e, &ss[b], err, errlen);
        for (uint32_t i = 0; !rc && i < o->prefill; i++)
            ids[i] = token_at(i + b * 7919, in->n_vocab);
        double t0 = now_s();
        if (!rc)
            rc = dray_session_prefill(ss[b], ids, o->prefill, err, errlen);
        if (b == 0)
            r->prefill_s = now_s() - t0;
    }
    free(ids);
    return rc;
}

/* o->decode steps of all sequences in lockstep: logits of every sequence, then
 * each one's greedy next token is what it decodes at the next step. */
static int decode_all(struct dray_engine *e, const struct model_opts *o, struct dray_session **ss,
                      struct result *r, char *err, size_t errlen)
{
    const struct dray_engine_info *in = dray_engine_get_info(e);
    int32_t *ids = malloc(o->batch * sizeof(int32_t));
    float *logits = malloc((size_t)o->batch * in->n_vocab * sizeof(float));
    int rc = ids && logits ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "out of memory for %u rows of logits", o->batch);
    for (uint32_t b = 0; ids && b < o->batch; b++)
        ids[b] = token_at(o->prefill + b, in->n_vocab); /* as if sampled after the prefill */
    uint64_t rows0, cand0, rows1, cand1;
    dray_engine_rescore_stats(e, &rows0, &cand0);
    double t0 = now_s();
    for (uint32_t step = 0; !rc && step < o->decode; step++) {
        rc = dray_sessions_decode(ss, o->batch, ids, logits, err, errlen);
        for (uint32_t b = 0; !rc && b < o->batch; b++)
            /* dray run's pick at temperature 0 */
            ids[b] = dray_greedy_token(logits + (size_t)b * in->n_vocab, in->n_vocab);
    }
    r->decode_s = now_s() - t0;
    dray_engine_rescore_stats(e, &rows1, &cand1);
    r->rescore_per_step = o->decode ? (double)(cand1 - cand0) / o->decode : 0;
    free(ids);
    free(logits);
    return rc;
}

static void report(const struct dray_config *cfg, const struct dray_engine_info *in,
                   const struct model_opts *o, const struct result *r)
{
    double pre_tps = o->prefill / r->prefill_s, steps = o->decode / (r->decode_s > 0 ? r->decode_s : 1e-9);
    /* The roofline's bandwidth: what reading this step's bytes with the bench's
     * threads reaches here (a step whose bytes about fit the last-level cache
     * reads faster than DRAM), unless --mem-bw gives one. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t nt = cfg->threads ? cfg->threads : cores > 0 ? (uint32_t)cores : 1;
    double bw = o->bw > 0 ? o->bw : dray_bench_read_bw((size_t)r->bytes, nt, 10);
    double roof = bw * 1e9 / r->bytes;
    printf("model   %s (%s), weights %s %.1f MB (activations %s, head %s), KV %s, plugin %s on %s, threads %u\n",
           in->model_name, in->arch, in->precision, in->weight_bytes / 1e6, in->activations, in->head, in->kv_dtype,
           in->plugin, in->device, cfg->threads);
    printf("prefill %u tokens (logits of the last): %8.1f tok/s  (%.3f s)\n", o->prefill, pre_tps, r->prefill_s);
    printf("decode  %u steps, %u sequence%s in lockstep, logits + greedy pick each step: %.1f steps/s, "
           "%.1f tok/s  (%.3f s)\n", o->decode, o->batch, o->batch > 1 ? "s" : "", steps, steps * o->batch,
           r->decode_s);
    double w = step_weights(in, r);
    if (in->rescore_bytes)
        printf("rescored head: %.0f candidates per step, %.1f MB of its step's weights\n",
               r->rescore_per_step, r->rescore_per_step * (double)in->rescore_bytes / 1e6);
    printf("roofline: a step reads %.1f MB (weights %.1f incl. output head and outlier columns, "
           "KV and logits %.1f); at %.1f GB/s (%s): %.1f steps/s -> %.0f%% of it\n", r->bytes / 1e6,
           w / 1e6, (r->bytes - w) / 1e6, bw, o->bw > 0 ? "--mem-bw" : "measured: a read of as many bytes here",
           roof, 100.0 * steps / roof);
    FILE *f = o->json ? fopen(o->json, "a") : NULL;
    if (o->json && !f)
        fprintf(stderr, "dray bench model: cannot append to %s: %s\n", o->json, strerror(errno));
    if (f) {
        fprintf(f, "{\"bench\":\"model\",\"model\":\"%s\",\"precision\":\"%s\",\"activations\":\"%s\",\"head\":\"%s\",\"kv\":\"%s\",\"plugin\":\"%s\","
                "\"threads\":%u,\"prefill_tokens\":%u,\"prefill_tps\":%.2f,\"decode_steps\":%u,\"batch\":%u,"
                "\"decode_tps\":%.2f,\"step_bytes\":%.0f,\"roofline_steps_per_s\":%.2f,\"n_vocab\":%u}\n",
                in->model_name, in->precision, in->activations, in->head, in->kv_dtype, in->plugin, cfg->threads, o->prefill,
                pre_tps,
                o->decode, o->batch, steps * o->batch, r->bytes, roof, in->n_vocab);
        fclose(f);
    }
}

/* A split's decode: hops, each device's busy time and the time they overlapped. */
static void report_split(const struct dray_split_report *a, const struct dray_split_report *b)
{
    uint64_t steps = b->steps - a->steps;
    if (!b->n_dev || !steps)
        return;
    uint64_t hops = b->hops - a->hops;
    printf("split   decode over %u devices: %llu steps (%llu in micro-batches), %.1f hops of %.1f KB per step\n",
           b->n_dev, (unsigned long long)steps, (unsigned long long)(b->pipelined_steps - a->pipelined_steps),
           (double)hops / steps, hops ? (double)(b->hop_bytes - a->hop_bytes) / hops / 1e3 : 0.0);
    printf("        busy");
    for (uint32_t d = 0; d < b->n_dev; d++)
        printf(" device %u %.3f s", d + 1, b->busy_s[d] - a->busy_s[d]);
    printf("; two or more busy at once %.3f s of %.3f s\n", b->overlap_s - a->overlap_s, b->wall_s - a->wall_s);
    uint64_t calls = b->remote_calls - a->remote_calls;
    if (calls) /* each call: hidden states there and back, less the rank's compute */
        printf("        other ranks: %llu calls, %.1f us each on the wire (there and back)\n",
               (unsigned long long)calls, (b->wire_s - a->wire_s) / (double)calls * 1e6);
    uint64_t reduces = b->allreduces - a->allreduces;
    if (reduces) /* device to host, the sum over the ranks (waiting for the slowest), back */
        printf("        tensor parallel: %.1f all-reduces per step, %.1f us each, %.2f ms per step\n",
               (double)reduces / steps, (b->allreduce_s - a->allreduce_s) / (double)reduces * 1e6,
               (b->allreduce_s - a->allreduce_s) / (double)steps * 1e3);
}

int dray_bench_model(const struct dray_config *cfg_in, int argc, char **argv)
{
    struct dray_config cfg = *cfg_in;
    struct model_opts o;
    struct result r = {0};
    char err[2048];
    if (parse(argc, argv, &o))
        return 2;
    if (cfg.max_seqs < o.batch)
        cfg.max_seqs = o.batch;
    if (!cfg.context)
        cfg.context = o.prefill + o.decode + 16;
    struct dray_engine *e = NULL;
    if (dray_engine_open(&cfg, &e, err, sizeof(err))) {
        fprintf(stderr, "dray: %s\n", err);
        return 1;
    }
    struct dray_session **ss = calloc(o.batch, sizeof(*ss));
    struct dray_split_report s0, s1;
    int rc = ss ? prefill_all(e, &o, ss, &r, err, sizeof(err)) : -1;
    dray_engine_split_report(e, &s0);
    if (!rc)
        rc = decode_all(e, &o, ss, &r, err, sizeof(err));
    dray_engine_split_report(e, &s1);
    if (!rc) {
        r.bytes = step_bytes(dray_engine_get_info(e), &r, o.batch, o.prefill + o.decode / 2.0);
        report(&cfg, dray_engine_get_info(e), &o, &r);
        report_split(&s0, &s1);
    } else {
        fprintf(stderr, "dray: %s\n", ss ? err : "out of memory");
    }
    for (uint32_t b = 0; ss && b < o.batch; b++)
        dray_session_free(ss[b]);
    free(ss);
    dray_engine_close(e);
    return rc ? 1 : 0;
}
