/* dray perplexity: perplexity of a text in chunks, and KL divergence against a
 * base run, with llama-perplexity's protocol so the numbers compare: the text is
 * tokenized once (BOS first) and cut into chunks of -c tokens; each chunk is a
 * fresh sequence whose first token is replaced by BOS; the second half of each
 * chunk is scored (positions n_ctx/2 .. n_ctx-2, each predicting the next token).
 * The base file is llama.cpp's .kld layout (kld.h). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cmd.h"
#include "dray/dray.h"
#include "dray/gguf.h"
#include "dray/tokenizer.h"
#include "flags.h"
#include "kld.h"

#define DEFAULT_CTX 512u
/* Largest text scored: tokenizing takes memory in proportion to its bytes. */
#define MAX_TEXT_BYTES (256ll << 20)

enum mode { PLAIN, WRITE_BASE, COMPARE };

struct ppl_opts {
    const char *text_path, *base_path;
    enum mode mode;
    uint32_t max_chunks;      /* 0 = every whole chunk */
    bool quiet;
};

/* Running sums over scored positions. */
struct ppl_sums {
    size_t n, n_same_top;
    double nll, nll2;         /* -log p(next token) */
    double nll_base, nll_base2;
    double dnll, dnll2;       /* nll - nll_base */
    double kl, kl2;
    float *kl_values;         /* [every scored position], for the percentiles */
};

/* What the per-row callback needs. */
struct ppl_run {
    const struct ppl_opts *o;
    const int32_t *next;      /* next[r]: the token row r predicts */
    uint32_t first, n_vocab;
    FILE *base;               /* written (WRITE_BASE) or read (COMPARE) */
    uint16_t *row;            /* [DRAY_KLD_ROW_WORDS(n_vocab)] */
    struct ppl_sums *sum;
    int failed;
};

static void usage(void)
{
    printf("usage: dray perplexity [options] -f FILE\n"
           "       dray perplexity [options] --kl-divergence --kl-divergence-base BASE.kld\n"
           "  -f, --file FILE             text to score (tokenized once, BOS first)\n"
           "  -c, --ctx N                 tokens per chunk (default %u); each chunk starts\n"
           "                              with BOS and its second half is scored\n"
           "  --chunks N                  score at most the first N chunks\n"
           "  --kl-divergence-base FILE   with -f: also write the scored positions' log-probs\n"
           "                              to FILE (llama.cpp's .kld layout); with\n"
           "                              --kl-divergence: the base to compare with\n"
           "  --kl-divergence             compare this run with the base: mean KL, its\n"
           "                              percentiles, same top token, PPL of both\n"
           "  -q, --quiet                 no model report on stderr\n", DEFAULT_CTX);
    dray_cli_help();
}

static int parse_args(int n_rest, char **rest, struct ppl_opts *o)
{
    bool compare = false;
    for (int i = 1; i < n_rest; i++) {
        const char *a = rest[i];
        bool has = i + 1 < n_rest;
        if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && has) o->text_path = rest[++i];
        else if (!strcmp(a, "--kl-divergence-base") && has) o->base_path = rest[++i];
        else if (!strcmp(a, "--kl-divergence")) compare = true;
        else if (!strcmp(a, "--chunks") && has) {
            if (dray_flag_u32(a, rest[++i], 1, UINT32_MAX, &o->max_chunks))
                return 2;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = true;
        else {
            fprintf(stderr, "dray perplexity: unknown or incomplete option '%s' (dray perplexity -h lists them)\n", a);
            return 2;
        }
    }
    if (compare && !o->base_path) {
        fprintf(stderr, "dray perplexity: --kl-divergence needs --kl-divergence-base FILE (the base to compare with)\n");
        return 2;
    }
    if (compare && o->text_path) {
        fprintf(stderr, "dray perplexity: --kl-divergence takes its tokens from the base file: drop -f\n");
        return 2;
    }
    if (!compare && !o->text_path) {
        fprintf(stderr, "dray perplexity: give -f FILE (or --kl-divergence with a base)\n");
        return 2;
    }
    o->mode = compare ? COMPARE : o->base_path ? WRITE_BASE : PLAIN;
    return 0;
}

/* The whole of a regular file as a string; NULL after printing why (not a
 * regular file, unreadable, empty, or holding a NUL byte that would cut it). */
static char *read_text(const char *path)
{
    struct stat st;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block the open */
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "dray: cannot read %s: %s\n", path, fd < 0 ? strerror(errno) : "not a regular file");
        goto out;
    }
    buf = st.st_size > 0 && st.st_size <= MAX_TEXT_BYTES ? malloc((size_t)st.st_size + 1) : NULL;
    if (!buf) {
        fprintf(stderr, "dray: %s: %s\n", path, !st.st_size ? "the file is empty"
                : st.st_size > MAX_TEXT_BYTES ? "larger than 256 MiB: score a part of it" : "out of memory");
        goto out;
    }
    if (read(fd, buf, (size_t)st.st_size) != (ssize_t)st.st_size) {
        fprintf(stderr, "dray: reading %s failed: %s\n", path, strerror(errno));
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[st.st_size] = 0;
    if (strlen(buf) != (size_t)st.st_size) {
        fprintf(stderr, "dray: %s has a NUL byte at offset %zu: not text\n", path, strlen(buf));
        free(buf);
        buf = NULL;
    }
out:
    if (fd >= 0)
        close(fd);
    return buf;
}

static int on_row(void *user, size_t pos, const float *logits)
{
    struct ppl_run *r = user;
    struct ppl_sums *s = r->sum;
    int32_t tok = r->next[pos - r->first];
    struct dray_kld_pos p = {0};
    if (r->o->mode == COMPARE) {
        size_t words = DRAY_KLD_ROW_WORDS(r->n_vocab);
        if (fread(r->row, sizeof(uint16_t), words, r->base) != words) {
            fprintf(stderr, "dray: %s ends before position %zu of chunk %zu\n", r->o->base_path, pos,
                    s->n / dray_kld_rows(2 * r->first) + 1);
            return r->failed = 1;
        }
        dray_kld_compare(logits, r->n_vocab, r->row, tok, &p);
    } else if (r->o->mode == WRITE_BASE) {
        p.nll = dray_kld_encode(logits, r->n_vocab, tok, r->row);
        if (fwrite(r->row, sizeof(uint16_t), DRAY_KLD_ROW_WORDS(r->n_vocab), r->base) !=
            DRAY_KLD_ROW_WORDS(r->n_vocab)) {
            fprintf(stderr, "dray: writing %s: %s\n", r->o->base_path, strerror(errno));
            return r->failed = 1;
        }
    } else {
        p.nll = dray_log_sum_exp(logits, r->n_vocab, NULL, NULL) - logits[tok];
    }
    s->nll += p.nll;
    s->nll2 += p.nll * p.nll;
    s->nll_base += p.nll_base;
    s->nll_base2 += p.nll_base * p.nll_base;
    s->dnll += p.nll - p.nll_base;
    s->dnll2 += (p.nll - p.nll_base) * (p.nll - p.nll_base);
    s->kl += p.kl;
    s->kl2 += p.kl * p.kl;
    s->kl_values[s->n] = (float)p.kl;
    s->n_same_top += p.same_top;
    s->n++;
    return 0;
}

/* One chunk: a fresh session over tokens[0..n_ctx-1) with BOS first (the last
 * token is only ever predicted, never fed). */
static int run_chunk(struct dray_engine *e, const int32_t *tokens, uint32_t n_ctx, int32_t bos,
                     struct ppl_run *r)
{
    char err[1024];
    struct dray_session *s = NULL;
    int32_t *ids = malloc(n_ctx * sizeof(int32_t));
    int rc = ids ? dray_session_new(e, &s, err, sizeof(err)) : -1;
    if (!rc) {
        memcpy(ids, tokens, n_ctx * sizeof(int32_t));
        if (bos >= 0)
            ids[0] = bos;
        r->next = tokens + r->first + 1;
        rc = dray_session_eval(s, ids, n_ctx - 1, r->first, on_row, r, err, sizeof(err));
    }
    if (rc && !r->failed)
        fprintf(stderr, "dray: %s\n", ids ? err : "out of memory");
    dray_session_free(s);
    free(ids);
    return rc ? 1 : 0;
}

static double mean_se(double sum, double sum2, size_t n, double *se)
{
    double m = sum / (double)n, var = sum2 / (double)n - m * m;
    *se = n > 1 && var > 0 ? sqrt(var / (double)(n - 1)) : 0;
    return m;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation between the closest ranks of sorted v[n]. */
static double percentile(const float *v, size_t n, double frac)
{
    double p = frac * (double)(n - 1);
    size_t i = (size_t)p;
    return i + 1 < n ? v[i] + (p - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

static void print_compare(struct ppl_sums *s)
{
    double se, se_base, se_d, se_kl;
    double lp = mean_se(s->nll, s->nll2, s->n, &se), lb = mean_se(s->nll_base, s->nll_base2, s->n, &se_base);
    double d = mean_se(s->dnll, s->dnll2, s->n, &se_d), kl = mean_se(s->kl, s->kl2, s->n, &se_kl);
    double top = (double)s->n_same_top / (double)s->n;
    static const double fr[] = {1.0, 0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01, 0.0};
    static const char *const name[] = {"max", "99.9%", "99%", "95%", "90%", "median", "10%", "5%", "1%", "min"};
    qsort(s->kl_values, s->n, sizeof(float), cmp_float);
    printf("positions scored     : %zu\n", s->n);
    printf("PPL                  : %.4f +/- %.4f\n", exp(lp), exp(lp) * se);
    printf("PPL(base)            : %.4f +/- %.4f\n", exp(lb), exp(lb) * se_base);
    printf("ln(PPL/PPL(base))    : %.6f +/- %.6f\n", d, se_d);
    printf("mean KL              : %.4g +/- %.2g\n", kl, se_kl); /* tiny KLs keep their digits */
    for (size_t i = 0; i < sizeof(fr) / sizeof(fr[0]); i++)
        printf("KL %-7s           : %.6f\n", name[i], percentile(s->kl_values, s->n, fr[i]));
    printf("same top token       : %.2f +/- %.2f %%\n", 100 * top,
           s->n > 1 ? 100 * sqrt(top * (1 - top) / (double)(s->n - 1)) : 0.0);
}

/* The token stream and chunk count: from the base file (COMPARE) or from the
 * text. Sets cfg->context to the chunk length before the engine opens. */
struct ppl_input {
    struct dray_kld_header h; /* n_ctx, n_vocab (0 until known), n_chunk, tokens */
    size_t n_tok;             /* tokens of the text (all of them, not only whole chunks) */
};

static int load_base(const struct ppl_opts *o, struct dray_config *cfg, struct ppl_input *in, FILE **base)
{
    *base = fopen(o->base_path, "rb");
    if (!*base) {
        fprintf(stderr, "dray: cannot read %s: %s\n", o->base_path, strerror(errno));
        return 1;
    }
    if (dray_kld_read_header(*base, o->base_path, &in->h))
        return 1;
    if (cfg->context && cfg->context != (uint32_t)in->h.n_ctx) {
        fprintf(stderr, "dray: %s was made with chunks of %d tokens: drop -c or pass -c %d\n",
                o->base_path, in->h.n_ctx, in->h.n_ctx);
        return 1;
    }
    cfg->context = (uint32_t)in->h.n_ctx;
    return 0;
}

/* The whole text is tokenized at once, as llama-perplexity does (cutting it first
 * would change the tokens at the cuts), with the model file's tokenizer: the
 * engine's refuses text longer than one context, and this text is many. */
static int tokenize_all(const char *model, const char *text, struct ppl_input *in)
{
    char err[1024];
    struct dray_gguf *g = NULL;
    struct dray_tokenizer *t = NULL;
    int rc = dray_gguf_open(model, &g, err, sizeof(err));
    if (!rc)
        rc = dray_tokenizer_load(g, &t, err, sizeof(err));
    dray_gguf_close(g);
    if (rc) {
        fprintf(stderr, "dray: %s\n", err);
        return 1;
    }
    rc = dray_tokenize(t, text, strlen(text), true, false, &in->h.tokens, &in->n_tok);
    if (rc)
        fprintf(stderr, "dray: tokenizing %s failed: %s\n", model, dray_strerror(rc));
    dray_tokenizer_free(t);
    return rc ? 1 : 0;
}

static int tokenize_text(struct dray_engine *e, const struct ppl_opts *o, uint32_t n_ctx, struct ppl_input *in)
{
    char *text = read_text(o->text_path);
    int rc = text ? tokenize_all(dray_engine_get_info(e)->model_path, text, in) : 1;
    free(text);
    if (rc)
        return 1;
    in->h.n_ctx = (int32_t)n_ctx;
    in->h.n_chunk = (int32_t)(in->n_tok / n_ctx);
    if (in->h.n_chunk == 0) {
        fprintf(stderr, "dray: %s is %zu tokens, less than one chunk of %u (lower -c)\n", o->text_path,
                in->n_tok, n_ctx);
        return 1;
    }
    return 0;
}

/* BOS id of the model, or -1 when it adds none. */
static int32_t bos_id(struct dray_engine *e)
{
    char err[256];
    int32_t *ids = NULL, bos = -1;
    size_t n = 0;
    if (!dray_engine_tokenize(e, "", true, false, &ids, &n, err, sizeof(err)) && n == 1)
        bos = ids[0];
    free(ids);
    return bos;
}

static int score(struct dray_engine *e, const struct ppl_opts *o, struct ppl_input *in, FILE *base)
{
    uint32_t n_ctx = (uint32_t)in->h.n_ctx, n_vocab = dray_engine_get_info(e)->n_vocab;
    uint32_t n_chunk = (uint32_t)in->h.n_chunk;
    struct ppl_sums sum = {0};
    struct ppl_run r = {.o = o, .first = n_ctx / 2, .n_vocab = n_vocab, .base = base, .sum = &sum};
    n_chunk = o->max_chunks && o->max_chunks < n_chunk ? o->max_chunks : n_chunk;
    sum.kl_values = malloc((size_t)n_chunk * dray_kld_rows(n_ctx) * sizeof(float));
    r.row = malloc(DRAY_KLD_ROW_WORDS(n_vocab) * sizeof(uint16_t));
    int rc = sum.kl_values && r.row ? 0 : 1;
    if (rc)
        fprintf(stderr, "dray: out of memory\n");
    int32_t bos = bos_id(e);
    printf("perplexity: %u chunks of %u tokens, %u scored per chunk\n", n_chunk, n_ctx, dray_kld_rows(n_ctx));
    for (uint32_t c = 0; !rc && c < n_chunk; c++) {
        rc = run_chunk(e, in->h.tokens + (size_t)c * n_ctx, n_ctx, bos, &r);
        if (!rc)
            printf("[%u] %.4f%s", c + 1, exp(sum.nll / (double)sum.n), c + 1 < n_chunk ? " " : "\n");
        fflush(stdout);
    }
    if (!rc && o->mode == COMPARE) {
        print_compare(&sum);
    } else if (!rc) {
        double se, m = mean_se(sum.nll, sum.nll2, sum.n, &se);
        printf("PPL = %.4f +/- %.4f over %zu positions\n", exp(m), exp(m) * se, sum.n);
    }
    free(sum.kl_values);
    free(r.row);
    return rc;
}

/* WRITE_BASE: the header goes first, with only the chunks that will be scored. */
static int open_base_out(const struct ppl_opts *o, struct ppl_input *in, uint32_t n_vocab, FILE **base)
{
    if (o->max_chunks && o->max_chunks < (uint32_t)in->h.n_chunk)
        in->h.n_chunk = (int32_t)o->max_chunks;
    in->h.n_vocab = (int32_t)n_vocab;
    *base = fopen(o->base_path, "wb");
    if (!*base) {
        fprintf(stderr, "dray: cannot write %s: %s\n", o->base_path, strerror(errno));
        return 1;
    }
    return dray_kld_write_header(*base, o->base_path, &in->h);
}

/* The base must be over this model's vocabulary, and its tokens inside it (the
 * last token of a chunk is only looked up, never fed, so check them all here). */
static int check_base(const struct ppl_opts *o, const struct ppl_input *in, uint32_t n_vocab)
{
    if ((uint32_t)in->h.n_vocab != n_vocab) {
        fprintf(stderr, "dray: %s holds log-probs over %d tokens, the model has %u: not the same vocabulary\n",
                o->base_path, in->h.n_vocab, n_vocab);
        return 1;
    }
    for (size_t i = 0; i < (size_t)in->h.n_ctx * (size_t)in->h.n_chunk; i++)
        if (in->h.tokens[i] < 0 || (uint32_t)in->h.tokens[i] >= n_vocab) {
            fprintf(stderr, "dray: %s: token %zu is %d, outside the vocabulary (0..%u)\n", o->base_path, i,
                    in->h.tokens[i], n_vocab - 1);
            return 1;
        }
    return 0;
}

int dray_cmd_perplexity(int argc, char **argv)
{
    struct dray_config cfg;
    struct ppl_opts o = {0};
    struct ppl_input in = {0};
    char *rest[argc + 1];
    int n_rest, rc = 1;
    FILE *base = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        }
    if (dray_cli_parse_seqs(argc, argv, &cfg, rest, &n_rest, 1) || parse_args(n_rest, rest, &o))
        return 2;
    if (o.mode == COMPARE && load_base(&o, &cfg, &in, &base))
        goto out;
    cfg.context = cfg.context ? cfg.context : DEFAULT_CTX;
    struct dray_engine *e = dray_cli_open_engine(&cfg, o.quiet);
    if (!e)
        goto out;
    uint32_t n_vocab = dray_engine_get_info(e)->n_vocab;
    if (o.mode == COMPARE)
        rc = check_base(&o, &in, n_vocab);
    else
        rc = tokenize_text(e, &o, cfg.context, &in);
    if (!rc && o.mode == WRITE_BASE)
        rc = open_base_out(&o, &in, n_vocab, &base);
    if (!rc)
        rc = score(e, &o, &in, base);
    dray_engine_close(e);
out:
    if (base && fclose(base) && o.mode == WRITE_BASE && !rc) {
        fprintf(stderr, "dray: writing %s: %s\n", o.base_path, strerror(errno));
        rc = 1;
    }
    free(in.h.tokens);
    return rc;
}
