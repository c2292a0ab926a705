/* dray bench ops: speed of the operator table of one plugin (default: cpu) at
 * the shapes of Gemma 3 270M, next to the machine's limits.
 *   int8 matmul: GOPS (2 ops per multiply-add) and GB/s of weights streamed, for
 *   1 token (decode: memory bound) and 64 tokens (prefill: compute bound), on 1
 *   and 2 threads. Decode cycles through enough copies of the weights (>= 256 MB)
 *   that they come from memory, as in a real forward pass, not from cache.
 *   Attention (MQA 4:1, head_dim 256, int8 and f16 KV) and the small ops in us.
 * Limits printed next to them are measured here: the read bandwidth of 1 and 2
 * threads and one core's int8 dot-product peak (--bw, --gops to set them).
 * A plugin-level tool, like the conformance kit: there is no model, so it sees
 * the plugin through backend.h and the kit's loader only, never the engine
 * (docs/design.md, rooms; the `rooms` test holds it to that). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_ops.h"
#include "int8_peak.h"
#include "read_bw.h"
#include "conf_loader.h" /* the conformance kit's loader: backend.h and dlopen only */
#include "dray/backend.h"
#include "flags.h"

struct opts {
    const char *plugin;
    uint32_t threads;      /* 0: 1 and 2 */
    int reference;
    double bw, gops;       /* GB/s for all cores, int8 GOPS per core (0: measured) */
    double bw1;            /* GB/s of one core (measured, or bw x 13/22 when bw is given) */
    const char *only;      /* NULL, "matmul", "attention" or "small" */
    FILE *json;
};

struct bench {
    const struct dray_ops *ops;
    struct dray_ctx *ctx;
    struct opts *o;
    uint32_t threads;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static struct dray_buf *mkbuf(struct bench *b, size_t n, int kind)
{
    struct dray_buf *buf = NULL;
    if (b->ops->alloc(b->ctx, n, &buf))
        return NULL;
    void *host = malloc(n);
    if (!host) {
        b->ops->free(b->ctx, buf);
        return NULL;
    }
    for (size_t i = 0; i < n / 4; i++) { /* 0: random int8 bytes, 1: floats in [-1, 1], 2: small ints */
        uint32_t r = rnd();
        if (kind == 1) {
            float f = (float)(r & 0xffff) / 32768.0f - 1.0f;
            memcpy((char *)host + 4 * i, &f, 4);
        } else if (kind == 2) {
            int32_t v = (int32_t)(r % 64);
            memcpy((char *)host + 4 * i, &v, 4);
        } else {
            memcpy((char *)host + 4 * i, &r, 4);
        }
    }
    b->ops->upload(b->ctx, (struct dray_view){buf, 0}, host, n & ~(size_t)3);
    free(host);
    return buf;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds per call per thread of the last timeit(): on a machine shared with
 * other jobs wall time stretches while CPU time stays close to the quiet-machine
 * wall time (toolchains.md, "benchmark only when ..."). */
static double last_cpu;

/* Wall seconds per call of fn(arg, i) (i counts calls), measured for >= min_s. */
static double timeit(int (*fn)(struct bench *, void *, uint32_t), struct bench *b, void *arg, double min_s)
{
    if (fn(b, arg, 0))
        return -1;
    uint32_t n = 0;
    double t0 = now_s(), c0 = cpu_s(), t;
    do {
        if (fn(b, arg, ++n))
            return -1;
        t = now_s() - t0;
    } while (t < min_s && n < 100000);
    last_cpu = (cpu_s() - c0) / n / b->threads;
    return t / n;
}

static void emit_json(struct bench *b, const char *what, const char *fmt_fields)
{
    if (b->o->json)
        fprintf(b->o->json, "{\"bench\":\"ops\",\"op\":\"%s\",\"plugin\":\"%s\",\"threads\":%u,\"reference\":%d,%s}\n",
                what, b->o->plugin, b->threads, b->o->reference, fmt_fields);
}

/* ---------------------------------------------------------------- matmul */

struct mm {
    struct dray_buf *x, *w, *ws, *out;
    struct dray_packed **pk; /* packed weights: one handle per copy */
    uint32_t n_tok, n_out, k, copies, wdtype, passes;
    size_t wbytes, sbytes; /* one copy of the weights and of their scales */
};

static int mm_call(struct bench *b, void *arg, uint32_t i)
{
    struct mm *m = arg;
    struct dray_matmul_args a = {.x = {m->x, 0}, .w = {m->w, (i % m->copies) * m->wbytes},
                                 .wscale = {m->ws, 0}, .out = {m->out, 0}, .n_tok = m->n_tok,
                                 .n_out = m->n_out, .k = m->k, .stride_x = m->k, .stride_out = m->n_out,
                                 .wdtype = m->pk ? DRAY_PACKED : m->wdtype,
                                 .packed = m->pk ? m->pk[i % m->copies] : NULL, .passes = m->passes};
    return b->ops->matmul(b->ctx, &a);
}

/* The packed format (backend.h) the host prepares for a grouped dtype name. */
static struct dray_wformat wformat_of(uint32_t wdtype)
{
    return wdtype == DRAY_Q8G32   ? (struct dray_wformat){8, DRAY_WSCALE_F32, 0, 0}
           : wdtype == DRAY_Q4G32 ? (struct dray_wformat){4, DRAY_WSCALE_F32, 1, 0}
           : wdtype == DRAY_Q5G32 ? (struct dray_wformat){5, DRAY_WSCALE_F16, 1, 0}
                                  : (struct dray_wformat){4, DRAY_WSCALE_F16, 1, 0};
}

static const char *wdtype_name(uint32_t wdtype)
{
    return wdtype == DRAY_Q8G32    ? "q8"
           : wdtype == DRAY_Q4G32  ? "q4m"
           : wdtype == DRAY_Q5G32  ? "q5hm"
           : wdtype == DRAY_Q4G32H ? "q4hm"
                                   : "i8";
}

/* copies handles of one random matrix in format f: codes any byte, d and m a
 * plausible weight step (2^-7; random bits would be NaNs and subnormals, which
 * time differently). 0, or -1 when the plugin does not take the format. */
static int mkpacked(struct bench *b, struct mm *m, struct dray_wformat f)
{
    size_t groups = (size_t)m->n_out * (m->k / 32), sb = f.scale == DRAY_WSCALE_F16 ? 2 : 4;
    size_t cb = f.bits == 4 ? 16 : f.bits == 5 ? 20 : 32;
    uint8_t *codes = malloc(groups * cb), *dm = malloc(groups * sb);
    m->pk = calloc(m->copies, sizeof(*m->pk));
    int rc = codes && dm && m->pk ? 0 : -1;
    for (size_t i = 0; !rc && i < groups * cb; i++)
        codes[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t i = 0; !rc && i < groups; i++)
        if (sb == 2)
            ((uint16_t *)(void *)dm)[i] = 0x2000;
        else
            ((float *)(void *)dm)[i] = 1.0f / 128;
    struct dray_weight_desc d = {.size = sizeof(d), .format = f, .n_out = m->n_out, .k = m->k,
                                 .uses = DRAY_WUSE_MATMUL, .codes = codes, .d = dm, .m = f.has_min ? dm : NULL};
    for (uint32_t c = 0; !rc && c < m->copies; c++)
        rc = DRAY_HAS(b->ops, weight_create, 3) && !b->ops->weight_create(b->ctx, &d, &m->pk[c], NULL) ? 0 : -1;
    free(codes);
    free(dm);
    return rc;
}

static void free_packed(struct bench *b, struct mm *m)
{
    for (uint32_t c = 0; m->pk && c < m->copies; c++)
        if (m->pk[c])
            b->ops->weight_free(b->ctx, m->pk[c]);
    free(m->pk);
}

/* wdtype: DRAY_I8 (per-row int8), or a grouped one, packed by the plugin (then
 * the GB/s count the scales too: they are read with the weights). passes 2:
 * two-pass activations (backend.h), named "x2"; GOPS count the op's
 * multiply-adds once, so a second pass shows as the rate it costs. */
static void bench_matmul(struct bench *b, uint32_t k, uint32_t n_out, uint32_t n_tok, uint32_t wdtype,
                         uint32_t passes)
{
    struct mm m = {.n_tok = n_tok, .n_out = n_out, .k = k, .wdtype = wdtype, .passes = passes};
    size_t wbytes = (size_t)n_out * k, sbytes = (size_t)n_out * 4;
    struct dray_wformat wf = wformat_of(wdtype);
    if (wdtype != DRAY_I8) {
        size_t sb = wf.scale == DRAY_WSCALE_F16 ? 2 : 4;
        wbytes = (size_t)n_out * (k / 32) * (wf.bits == 4 ? 16 : wf.bits == 5 ? 20 : 32);
        sbytes = (size_t)n_out * (k / 32) * sb * (wf.has_min ? 2 : 1);
    }
    m.wbytes = wbytes;
    m.sbytes = wdtype == DRAY_I8 ? 0 : sbytes; /* I8: one scale table for every copy */
    /* decode: stream from memory like a forward pass does; prefill: one copy */
    m.copies = n_tok == 1 ? (uint32_t)((256u << 20) / (wbytes + m.sbytes) + 1) : 1;
    if (m.copies > 1024)
        m.copies = 1024;
    m.x = mkbuf(b, (size_t)n_tok * k * 4, 1);
    m.out = mkbuf(b, (size_t)n_tok * n_out * 4, 1);
    char name[16];
    snprintf(name, sizeof(name), "%s%s", wdtype_name(wdtype), passes == 2 ? "x2" : "");
    int packed_rc = 0;
    if (wdtype == DRAY_I8) {
        m.w = mkbuf(b, wbytes * m.copies, 0);
        m.ws = mkbuf(b, sbytes, 1);
    } else {
        packed_rc = mkpacked(b, &m, wf);
    }
    if (!m.x || !m.out || (wdtype == DRAY_I8 && (!m.w || !m.ws))) {
        printf("  matmul %-6s %5u -> %6u  n_tok %2u: out of memory\n", name, k, n_out, n_tok);
        goto out;
    }
    double t = packed_rc ? -1 : timeit(mm_call, b, &m, b->o->reference ? 0.05 : 0.3);
    if (t < 0) { /* a packed format the plugin does not run */
        printf("  matmul %-6s %5u -> %6u  n_tok %2u: not run by this plugin\n", name, k, n_out, n_tok);
        goto out;
    }
    size_t read = wbytes + m.sbytes; /* per call, as a forward pass streams them */
    double gops = 2.0 * n_tok * n_out * k / t / 1e9, gbs = (double)read / t / 1e9;
    double c = last_cpu, cgops = 2.0 * n_tok * n_out * k / c / 1e9, cgbs = (double)read / c / 1e9;
    double bw_lim = b->threads >= 2 ? b->o->bw : b->o->bw1;
    double op_lim = b->o->gops * b->threads, pct_ops = op_lim > 0 ? 100 * gops / op_lim : 0; /* 0: no peak known */
    printf("  matmul %-6s %5u -> %6u  n_tok %2u  %9.3f ms %9.3f cpu-ms  %6.1f GOPS (%3.0f%% of %3.0f)  %5.1f GB/s (%3.0f%% of %2.0f)"
           "  cpu-time rates: %6.1f GOPS %5.1f GB/s\n",
           name, k, n_out, n_tok, t * 1e3, c * 1e3, gops, pct_ops, op_lim, gbs, 100 * gbs / bw_lim, bw_lim, cgops, cgbs);
    char f[320], what[32];
    snprintf(f, sizeof(f), "\"k\":%u,\"n\":%u,\"n_tok\":%u,\"ms\":%.4f,\"cpu_ms\":%.4f,\"gops\":%.2f,\"gbs\":%.2f,"
             "\"pct_bw\":%.1f,\"pct_ops\":%.1f",
             k, n_out, n_tok, t * 1e3, c * 1e3, gops, gbs, 100 * gbs / bw_lim, pct_ops);
    snprintf(what, sizeof(what), "matmul_%s", name);
    emit_json(b, what, f);
out:
    free_packed(b, &m);
    b->ops->free(b->ctx, m.x), b->ops->free(b->ctx, m.out);
    if (m.w)
        b->ops->free(b->ctx, m.w);
    if (m.ws)
        b->ops->free(b->ctx, m.ws);
}

/* ---------------------------------------------------------------- attention */

struct att {
    struct dray_buf *k, *v, *ks, *vs, *q, *out, *seqs, *bt;
    struct dray_kv_pool pool;
    struct dray_attention_args a;
};

static int att_call(struct bench *b, void *arg, uint32_t i)
{
    (void)i;
    struct att *at = arg;
    return b->ops->attention(b->ctx, &at->a);
}

/* n_seq sequences, each n_q new queries at the end of kv_len positions, n_head
 * query heads on n_kv kv heads of hd dimensions (Gemma 3 270M: 4:1, 256;
 * SmolLM2: 9:3, 64), their blocks shuffled through one pool as a server's are.
 * 16 sequences of 4096 positions hold 32 MiB of int8 KV, more than this
 * machine's L3, so that row reads from memory as a batched decode step does. */
static void bench_attention(struct bench *b, uint32_t dtype, uint32_t n_seq, uint32_t n_q, uint32_t kv_len,
                            uint32_t window, uint32_t n_head, uint32_t n_kv, uint32_t hd)
{
    const uint32_t bs = 16;
    struct att at;
    memset(&at, 0, sizeof(at));
    uint32_t per_seq = (kv_len + bs - 1) / bs, n_blocks = per_seq * n_seq, n_slots = n_blocks * bs;
    size_t el = dtype == DRAY_I8 ? 1 : 2;
    at.k = mkbuf(b, (size_t)n_slots * n_kv * hd * el, dtype == DRAY_I8 ? 0 : 3);
    at.v = mkbuf(b, (size_t)n_slots * n_kv * hd * el, dtype == DRAY_I8 ? 0 : 3);
    at.ks = mkbuf(b, (size_t)n_slots * n_kv * 4, 1);
    at.vs = mkbuf(b, (size_t)n_slots * n_kv * 4, 1);
    at.q = mkbuf(b, (size_t)n_seq * n_q * n_head * hd * 4, 1);
    at.out = mkbuf(b, (size_t)n_seq * n_q * n_head * hd * 4, 1);
    at.seqs = mkbuf(b, (size_t)n_seq * 16, 2);
    at.bt = mkbuf(b, (size_t)n_blocks * 4, 2);
    if (!at.k || !at.v || !at.ks || !at.vs || !at.q || !at.out || !at.seqs || !at.bt)
        goto out;
    if (dtype == DRAY_F16) { /* random bits would be NaNs: fill with 0x3c00 (1.0) - ish values */
        b->ops->fill(b->ctx, (struct dray_view){at.k, 0}, 0x3a003c00u, (size_t)n_slots * n_kv * hd * 2);
        b->ops->fill(b->ctx, (struct dray_view){at.v, 0}, 0xb8003400u, (size_t)n_slots * n_kv * hd * 2);
    }
    int32_t *seq = malloc((size_t)n_seq * 16), *bt = malloc((size_t)n_blocks * 4);
    if (!seq || !bt) {
        free(seq), free(bt);
        goto out;
    }
    for (uint32_t i = 0; i < n_seq; i++) {
        int32_t row[4] = {(int32_t)(i * n_q), (int32_t)n_q, (int32_t)kv_len, (int32_t)(i * per_seq)};
        memcpy(seq + 4 * i, row, sizeof(row));
    }
    for (uint32_t i = 0; i < n_blocks; i++)
        bt[i] = (int32_t)(n_blocks - 1 - i); /* scattered, not identity */
    for (uint32_t i = n_blocks; n_seq > 1 && i > 1; i--) { /* and interleaved across sequences */
        uint32_t j = rnd() % i;
        int32_t x = bt[i - 1];
        bt[i - 1] = bt[j], bt[j] = x;
    }
    b->ops->upload(b->ctx, (struct dray_view){at.seqs, 0}, seq, (size_t)n_seq * 16);
    b->ops->upload(b->ctx, (struct dray_view){at.bt, 0}, bt, (size_t)n_blocks * 4);
    free(seq), free(bt);
    at.pool = (struct dray_kv_pool){{at.k, 0}, {at.v, 0}, {at.ks, 0}, {at.vs, 0}, dtype, n_kv, hd, bs, n_slots};
    at.a = (struct dray_attention_args){{at.q, 0}, {at.out, 0}, {at.seqs, 0}, {at.bt, 0}, &at.pool, n_seq * n_q, n_seq, n_head,
                                        kv_len, n_head * hd, n_head * hd, window, 0.0625f, 0.0f};
    double t = timeit(att_call, b, &at, b->o->reference ? 0.05 : 0.2);
    uint32_t span = window && window < kv_len ? window : kv_len;
    double gbs = 2.0 * n_seq * span * n_kv * hd * el / t / 1e9; /* K and V bytes read (once per kv head) */
    printf("  attention %s %u:%u x %3u n_seq %2u n_q %3u kv_len %5u window %4u  %9.1f us %9.1f cpu-us  %6.1f GB/s of KV\n",
           dtype == DRAY_I8 ? "i8 " : "f16", n_head, n_kv, hd, n_seq, n_q, kv_len, window, t * 1e6, last_cpu * 1e6,
           gbs);
    char f[220];
    snprintf(f, sizeof(f), "\"kv\":\"%s\",\"heads\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"n_seq\":%u,\"n_q\":%u,"
             "\"kv_len\":%u,\"window\":%u,\"us\":%.2f", dtype == DRAY_I8 ? "i8" : "f16", n_head, n_kv, hd, n_seq, n_q,
             kv_len, window, t * 1e6);
    emit_json(b, "attention", f);
out:
    b->ops->free(b->ctx, at.k), b->ops->free(b->ctx, at.v), b->ops->free(b->ctx, at.ks), b->ops->free(b->ctx, at.vs);
    b->ops->free(b->ctx, at.q), b->ops->free(b->ctx, at.out), b->ops->free(b->ctx, at.seqs), b->ops->free(b->ctx, at.bt);
}

/* ---------------------------------------------------------------- small ops */

struct small {
    int op;
    uint32_t n_tok;
    struct dray_buf *a, *b2, *c, *ids, *pos, *tab, *rs;
};

static int small_call(struct bench *b, void *arg, uint32_t i)
{
    (void)i;
    struct small *s = arg;
    uint32_t n = s->n_tok;
    switch (s->op) {
    case 0: {
        struct dray_rmsnorm_args a = {{s->a, 0}, {s->b2, 0}, {s->c, 0}, n, 1, 640, 640, 640, 1e-6f};
        return b->ops->rmsnorm(b->ctx, &a);
    }
    case 1: {
        struct dray_rope_args a = {{s->a, 0}, {s->pos, 0}, n, 4, 256, 256, 1024, 1e6f, 1.0f, {NULL, 0}, 0.0f};
        return b->ops->rope(b->ctx, &a);
    }
    case 2: {
        struct dray_gated_act_args a = {{s->a, 0}, {s->b2, 0}, {s->c, 0}, n, 2048, 2048, 2048, 2048, DRAY_ACT_GELU_TANH};
        return b->ops->gated_act(b->ctx, &a);
    }
    case 3: {
        struct dray_add_args a = {{s->a, 0}, {s->b2, 0}, {s->c, 0}, (uint64_t)n * 640};
        return b->ops->add(b->ctx, &a);
    }
    default: {
        struct dray_embed_args a = {{s->ids, 0}, {s->tab, 0}, {s->rs, 0}, {s->c, 0}, DRAY_I8, n, 640, 4096, 25.3f, NULL};
        return b->ops->embed(b->ctx, &a);
    }
    }
}

static void bench_small(struct bench *b, uint32_t n_tok)
{
    static const char *names[] = {"rmsnorm 640", "rope 4x256", "gated_act gelu 2048", "add 640", "embed i8 640"};
    struct small s = {.n_tok = n_tok};
    size_t nb = (size_t)n_tok * 2048 * 4;
    s.a = mkbuf(b, nb, 1), s.b2 = mkbuf(b, nb, 1), s.c = mkbuf(b, nb, 1);
    s.ids = mkbuf(b, (size_t)n_tok * 4, 2), s.pos = mkbuf(b, (size_t)n_tok * 4, 2);
    s.tab = mkbuf(b, 4096u * 640, 0), s.rs = mkbuf(b, 4096u * 4, 1);
    for (int op = 0; op < 5; op++) {
        s.op = op;
        double t = timeit(small_call, b, &s, 0.1);
        printf("  %-22s n_tok %2u  %9.2f us %9.2f cpu-us\n", names[op], n_tok, t * 1e6, last_cpu * 1e6);
        char f[160];
        snprintf(f, sizeof(f), "\"name\":\"%s\",\"n_tok\":%u,\"us\":%.3f", names[op], n_tok, t * 1e6);
        emit_json(b, "small", f);
    }
    b->ops->free(b->ctx, s.a), b->ops->free(b->ctx, s.b2), b->ops->free(b->ctx, s.c), b->ops->free(b->ctx, s.ids);
    b->ops->free(b->ctx, s.pos), b->ops->free(b->ctx, s.tab), b->ops->free(b->ctx, s.rs);
}

/* ---------------------------------------------------------------- machine */

/* ---------------------------------------------------------------- driver */

static void usage(void)
{
    printf("usage: dray bench ops [options]\n"
           "  --threads N    host threads (default: 1 and 2)\n"
           "  --reference    run the portable scalar reference kernels\n"
           "  --only WHAT    matmul, attention or small (default: all)\n"
           "  --plugin NAME  plugin to measure (default cpu)\n"
           "  --bw GBPS      memory bandwidth of all cores for the roofline (default: measured)\n"
           "  --gops G       int8 GOPS per core for the roofline (default: measured)\n"
           "  --json FILE    append one JSON line per measurement\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.plugin = "cpu"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 1;
        } else if (!strcmp(a, "--reference")) {
            o->reference = 1;
        } else if (v && !strcmp(a, "--threads")) {
            if (dray_flag_u32(a, v, 0, 4096, &o->threads))
                return 2;
            i++;
        } else if (v && !strcmp(a, "--only")) {
            o->only = v, i++;
        } else if (v && !strcmp(a, "--plugin")) {
            o->plugin = v, i++;
        } else if (v && !strcmp(a, "--bw")) {
            if (dray_flag_f64(a, v, 0.001, 1e6, &o->bw)) /* GB/s */
                return 2;
            i++;
        } else if (v && !strcmp(a, "--gops")) {
            if (dray_flag_f64(a, v, 0.001, 1e6, &o->gops)) /* int8 GOPS per core */
                return 2;
            i++;
        } else if (v && !strcmp(a, "--json")) {
            o->json = fopen(v, "a"), i++;
            if (!o->json) {
                fprintf(stderr, "dray bench ops: cannot open %s\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "dray bench ops: unknown or incomplete option '%s'\n", a);
            usage();
            return 2;
        }
    }
    return 0;
}

static void run_all(struct bench *b)
{
    static const uint32_t shapes[][2] = {{640, 1024}, {640, 256}, {1024, 640}, {640, 2048},
                                         {640, 4096}, {2048, 640}, {640, 262144}};
    static const uint32_t toks[] = {1, 64};
    const char *only = b->o->only;
    for (size_t t = 0; t < 2 && (!only || !strcmp(only, "matmul")); t++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            if (b->o->reference && toks[t] == 64 && shapes[s][1] == 262144) {
                printf("  matmul %5u -> %6u  n_tok %2u  skipped with --reference (minutes)\n", shapes[s][0],
                       shapes[s][1], toks[t]);
                continue;
            }
            bench_matmul(b, shapes[s][0], shapes[s][1], toks[t], DRAY_I8, 1);
        }
    /* grouped weights (version 2) at the layer shapes the default (w4a8) gives
     * them on Gemma 3 270M Q4_K_M: gate/up and q 5-bit, down and o 4- or 6->8-bit */
    static const uint32_t gshapes[][2] = {{640, 2048}, {640, 1024}, {2048, 640}};
    static const uint32_t gtypes[] = {DRAY_Q8G32, DRAY_Q5G32, DRAY_Q4G32, DRAY_Q4G32H};
    for (size_t t = 0; t < 2 && (!only || !strcmp(only, "matmul")); t++)
        for (size_t s = 0; s < sizeof(gshapes) / sizeof(gshapes[0]); s++)
            for (size_t d = 0; d < sizeof(gtypes) / sizeof(gtypes[0]); d++)
                bench_matmul(b, gshapes[s][0], gshapes[s][1], toks[t], gtypes[d], 1);
    /* the rescored head's 4-bit copy (640 -> 262144, one decode token): f32 or
     * f16 d and m, most of a decode step's bytes */
    for (uint32_t d = 0; !b->o->reference && d < 2 && (!only || !strcmp(only, "matmul")); d++)
        bench_matmul(b, 640, 262144, 1, d ? DRAY_Q4G32H : DRAY_Q4G32, 1);
    /* ... and at 16 tokens, a batch-16 decode step's candidate pass (compute-bound) */
    if (!b->o->reference && (!only || !strcmp(only, "matmul")))
        bench_matmul(b, 640, 262144, 16, DRAY_Q4G32H, 1);
    /* SmolLM2-135M Q4_1's layers (q/o, gate/up, down) with its default two-pass
     * activations: the kernel a SmolLM2 prefill spends most of its time in */
    static const uint32_t sshapes[][2] = {{576, 576}, {576, 1536}, {1536, 576}};
    for (size_t t = 0; t < 2 && (!only || !strcmp(only, "matmul")); t++)
        for (size_t s = 0; s < sizeof(sshapes) / sizeof(sshapes[0]); s++)
            bench_matmul(b, sshapes[s][0], sshapes[s][1], toks[t], DRAY_Q4G32, 2);
    /* ... and its 8-bit head (tied Q8_0, 576 -> 49152), two passes, one decode token */
    if (!only || !strcmp(only, "matmul"))
        bench_matmul(b, 576, 49152, 1, DRAY_Q8G32, 2);
    if (!only || !strcmp(only, "attention")) {
        bench_attention(b, DRAY_I8, 1, 1, 128, 0, 4, 1, 256); /* a tg128 step's layer */
        bench_attention(b, DRAY_I8, 1, 1, 512, 0, 4, 1, 256);
        bench_attention(b, DRAY_I8, 1, 1, 4096, 0, 4, 1, 256);
        bench_attention(b, DRAY_F16, 1, 1, 4096, 0, 4, 1, 256);
        bench_attention(b, DRAY_I8, 1, 1, 4096, 512, 4, 1, 256);
        bench_attention(b, DRAY_I8, 1, 64, 512, 0, 4, 1, 256);
        bench_attention(b, DRAY_I8, 1, 512, 512, 0, 4, 1, 256); /* a whole pp512 */
        bench_attention(b, DRAY_F16, 1, 64, 512, 0, 4, 1, 256);
        bench_attention(b, DRAY_I8, 1, 1, 128, 0, 9, 3, 64);
        bench_attention(b, DRAY_I8, 1, 1, 512, 0, 9, 3, 64);
        bench_attention(b, DRAY_F16, 1, 1, 512, 0, 9, 3, 64);
        bench_attention(b, DRAY_I8, 1, 64, 512, 0, 9, 3, 64);
        bench_attention(b, DRAY_I8, 1, 512, 512, 0, 9, 3, 64);
        bench_attention(b, DRAY_I8, 16, 1, 4096, 0, 4, 1, 256); /* a batch-16 decode step's layer */
        bench_attention(b, DRAY_I8, 16, 1, 4096, 0, 9, 3, 64);
    }
    if (!only || !strcmp(only, "small")) {
        bench_small(b, 1);
        bench_small(b, 64);
    }
}

int dray_bench_ops(int argc, char **argv)
{
    struct opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    char err[1024] = "";
    struct conf_plugin plugin, *pl = &plugin;
    if (conf_plugin_load(o.plugin, NULL, pl, err, sizeof(err))) {
        fprintf(stderr, "dray bench ops: %s\n", err);
        return 1;
    }
    struct dray_device_props props;
    if (pl->ops->device_props(0, &props) == 0)
        printf("device: %s (%s)%s\n", props.name, pl->path, o.reference ? "  [reference kernels]" : "");
    const char *isa = "--gops";
    int bw_given = o.bw > 0, gops_given = o.gops > 0;
    o.bw1 = bw_given ? o.bw * 13.0 / 22.0 : dray_bench_read_bw(512u << 20, 1, 3);
    o.bw = bw_given ? o.bw : dray_bench_read_bw(512u << 20, 2, 3);
    o.gops = gops_given ? o.gops : dray_bench_int8_peak(&isa);
    printf("machine limits: %.1f GB/s 2 threads, %.1f GB/s 1 thread (%s), %.0f int8 GOPS per core (%s)\n",
           o.bw, o.bw1, bw_given ? "--bw" : "measured: reads of 512 MB", o.gops,
           gops_given ? "--gops" : isa);
    uint32_t tlist[2] = {1, 2}, nt = 2;
    if (o.threads)
        tlist[0] = o.threads, nt = 1;
    for (uint32_t i = 0; i < nt && !rc; i++) {
        struct dray_open_options oo = {.size = sizeof(oo), .n_threads = tlist[i], .reference = (uint32_t)o.reference};
        struct bench b = {pl->ops, NULL, &o, tlist[i]};
        if (pl->ops->open(0, &oo, &b.ctx, err, sizeof(err))) {
            fprintf(stderr, "dray bench ops: open: %s\n", err);
            rc = 1;
            break;
        }
        printf("\n== %u thread%s ==\n", tlist[i], tlist[i] > 1 ? "s" : "");
        run_all(&b);
        pl->ops->close(b.ctx);
    }
    if (o.json)
        fclose(o.json);
    conf_plugin_unload(pl);
    return rc;
}
