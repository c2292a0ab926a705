/* dray bench model: prefill and decode speed of a model end to end, next to the
 * memory roofline of decode (every weight byte is read once per decode step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h" /* compiled into the dray command, beside tools/ */
#include "dray/dray.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(void)
{
    printf("usage: dray bench model [options]\n"
           "  --prefill N      prompt tokens (default 512)\n"
           "  --decode N       generated tokens per sequence (default 128)\n"
           "  --batch B        sequences decoded together (default 1)\n"
           "  --mem-bw GBPS    memory bandwidth for the roofline (default 22)\n"
           "  --json FILE      append one JSON line with the results\n");
    dray_cli_help();
}

/* Tokens cycle through a fixed pseudo-random stream so runs are comparable. */
static int32_t token_at(uint32_t i, uint32_t n_vocab)
{
    return (int32_t)(1000 + (i * 2654435761u) % (n_vocab - 2000));
}

int dray_bench_model(int argc, char **argv)
{
    struct dray_config cfg;
    char *rest[argc + 1], err[2048];
    int n_rest;
    if (dray_cli_parse(argc, argv, &cfg, rest, &n_rest))
        return 2;
    uint32_t n_prefill = 512, n_decode = 128, batch = 1;
    double bw = 22.0;
    const char *json = NULL;
    for (int i = 1; i < n_rest; i++) {
        bool has = i + 1 < n_rest;
        const char *a = rest[i];
        /* token counts are capped at 2^20 so that prefill + decode + 16 stays a sane context */
        if (!strcmp(a, "--prefill") && has) {
            if (dray_cli_u32(a, rest[++i], 1, 1u << 20, &n_prefill))
                return 2;
        } else if (!strcmp(a, "--decode") && has) {
            if (dray_cli_u32(a, rest[++i], 1, 1u << 20, &n_decode))
                return 2;
        } else if (!strcmp(a, "--batch") && has) {
            if (dray_cli_u32(a, rest[++i], 1, 256, &batch))
                return 2;
        } else if (!strcmp(a, "--mem-bw") && has) {
            if (dray_cli_f64(a, rest[++i], 0.001, 1e6, &bw)) /* GB/s */
                return 2;
        }
        else if (!strcmp(a, "--json") && has) json = rest[++i];
        else if (!strcmp(rest[i], "-h") || !strcmp(rest[i], "--help")) { usage(); return 0; }
        else {
            fprintf(stderr, "dray bench model: unknown or incomplete option '%s'\n", rest[i]);
            return 2;
        }
    }
    if (cfg.max_seqs < batch)
        cfg.max_seqs = batch;
    if (!cfg.context)
        cfg.context = n_prefill + n_decode + 16;
    struct dray_engine *e = dray_cli_open_engine(&cfg, false);
    if (!e)
        return 1;
    const struct dray_engine_info *in = dray_engine_get_info(e);
    struct dray_session **ss = calloc(batch, sizeof(*ss));
    int32_t *ids = malloc((n_prefill > batch ? n_prefill : batch) * sizeof(int32_t));
    int rc = 1;
    double prefill_s = 0, decode_s = 0;
    if (!ss || !ids)
        goto out;
    for (uint32_t b = 0; b < batch; b++) {
        if (dray_session_new(e, &ss[b], err, sizeof(err)))
            goto fail;
        for (uint32_t i = 0; i < n_prefill; i++)
            ids[i] = token_at(i + b * 7919, in->n_vocab);
        double t0 = now_s();
        if (dray_session_prefill(ss[b], ids, n_prefill, err, sizeof(err)))
            goto fail;
        if (b == 0)
            prefill_s = now_s() - t0;
    }
    double t0 = now_s();
    for (uint32_t step = 0; step < n_decode; step++) {
        for (uint32_t b = 0; b < batch; b++)
            ids[b] = token_at(n_prefill + step + b, in->n_vocab);
        if (dray_sessions_decode(ss, batch, ids, NULL, err, sizeof(err)))
            goto fail;
    }
    decode_s = now_s() - t0;
    double pre_tps = n_prefill / prefill_s, dec_tps = n_decode / decode_s;
    double roof = bw * 1e9 / (double)in->weight_bytes;
    printf("model   %s (%s), weights %s %.1f MB, KV %s, plugin %s on %s, threads %u\n", in->model_name,
           in->arch, in->precision, in->weight_bytes / 1e6, in->kv_dtype, in->plugin, in->device,
           cfg.threads);
    printf("prefill %u tokens: %8.1f tok/s  (%.3f s)\n", n_prefill, pre_tps, prefill_s);
    printf("decode  %u steps x batch %u: %8.1f steps/s, %8.1f tok/s  (%.3f s)\n", n_decode, batch,
           dec_tps, dec_tps * batch, decode_s);
    printf("roofline decode at %.0f GB/s reading %.1f MB per step: %.1f steps/s -> %.0f%% of it\n", bw,
           in->weight_bytes / 1e6, roof, 100.0 * dec_tps / roof);
    if (json) {
        FILE *f = fopen(json, "a");
        if (f) {
            fprintf(f, "{\"bench\":\"model\",\"model\":\"%s\",\"precision\":\"%s\",\"kv\":\"%s\",\"plugin\":\"%s\","
                    "\"threads\":%u,\"prefill_tokens\":%u,\"prefill_tps\":%.2f,\"decode_steps\":%u,\"batch\":%u,"
                    "\"decode_tps\":%.2f,\"roofline_steps_per_s\":%.2f}\n",
                    in->model_name, in->precision, in->kv_dtype, in->plugin, cfg.threads, n_prefill, pre_tps,
                    n_decode, batch, dec_tps * batch, roof);
            fclose(f);
        }
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "dray: %s\n", err);
out:
    for (uint32_t b = 0; ss && b < batch; b++)
        dray_session_free(ss[b]);
    free(ss);
    free(ids);
    dray_engine_close(e);
    return rc;
}
