/* dray tokenize -m GGUF [--ids] [--no-bos] [--special] [-0] [--detok] [--time] < text
 * Tokenizes stdin with the model's tokenizer (core/text/tokenizer.h) and prints the
 * tokens: by default one per line ("id<TAB>text" with the raw token text, C
 * escapes for control bytes); --ids prints the ids space-separated on one line.
 * -0 treats stdin as NUL-separated records and prints one result line per record
 * (tests/reference/test_tokenizer_ref.py uses it to check a whole corpus with one
 * model load). --detok adds a line "hex:<bytes>" per record: the streaming
 * detokenizer's output for those ids, hex-encoded. --time prints load and
 * tokenization times to stderr. Uses the core directly (core/ is on the include
 * path). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd.h"
#include "dray/dray.h"
#include "dray/gguf.h"
#include "dray/tokenizer.h"

struct tok_opts {
    const char *model;
    bool ids, bos, special, nul, detok, time;
};

static void tok_usage(FILE *f)
{
    fprintf(f, "usage: dray tokenize -m MODEL.gguf [options] < text\n"
               "  -m, --model FILE   GGUF file whose tokenizer.ggml.* metadata is used\n"
               "  --ids              print only the ids, space-separated, one line\n"
               "  --no-bos           do not add BOS (otherwise added if the model says so)\n"
               "  --special          parse control tokens such as <start_of_turn> in the text\n"
               "  -0                 stdin holds NUL-separated texts: one output line each\n"
               "  --detok            also print \"hex:\" + the detokenized bytes in hex\n"
               "  --time             print load and tokenization times to stderr\n");
}

static int parse_opts(int argc, char **argv, struct tok_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->bos = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tok_usage(stdout);
            return 1;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            o->model = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            o->ids = true;
        } else if (!strcmp(a, "--no-bos")) {
            o->bos = false;
        } else if (!strcmp(a, "--special")) {
            o->special = true;
        } else if (!strcmp(a, "-0")) {
            o->nul = true;
        } else if (!strcmp(a, "--detok")) {
            o->detok = true;
        } else if (!strcmp(a, "--time")) {
            o->time = true;
        } else {
            fprintf(stderr, "dray tokenize: unexpected argument '%s'\n", a);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "dray tokenize: no model (-m FILE)\n");
        return -1;
    }
    return 0;
}

static char *read_all(FILE *f, size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    while (s) {
        len += fread(s + len, 1, cap - len, f);
        if (len < cap)
            break;
        char *ns = realloc(s, cap * 2);
        if (!ns)
            free(s);
        s = ns;
        cap *= 2;
    }
    *n = len;
    return s;
}

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
/* CPU time too: on a shared machine wall time mostly measures the others. */
static double cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

static void print_text(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\\')
            fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7F)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static int print_detok(const struct dray_tokenizer *t, const int32_t *ids, size_t n)
{
    char *text;
    size_t len;
    if (dray_detokenize(t, ids, n, &text, &len))
        return 1;
    fputs("hex:", stdout);
    for (size_t i = 0; i < len; i++)
        printf("%02x", (unsigned char)text[i]);
    putchar('\n');
    free(text);
    return 0;
}

/* Tokenize one record and print it; adds the time spent tokenizing to *dt. */
static int one(const struct dray_tokenizer *t, const struct tok_opts *o, const char *s, size_t n,
               double dt[2])
{
    int32_t *ids;
    size_t n_ids;
    double t0 = now_s(), c0 = cpu_s();
    int rc = dray_tokenize(t, s, n, o->bos, o->special, &ids, &n_ids);
    dt[0] += now_s() - t0;
    dt[1] += cpu_s() - c0;
    if (rc) {
        fprintf(stderr, "dray tokenize: %s\n", dray_strerror(rc));
        return 1;
    }
    for (size_t i = 0; i < n_ids; i++) {
        if (o->ids) {
            printf(i ? " %d" : "%d", ids[i]);
        } else {
            size_t len;
            const char *txt = dray_tokenizer_text(t, ids[i], &len);
            printf("%d\t", ids[i]);
            print_text(txt, len);
            putchar('\n');
        }
    }
    if (o->ids)
        putchar('\n');
    rc = o->detok ? print_detok(t, ids, n_ids) : 0;
    free(ids);
    return rc;
}

int dray_cmd_tokenize(int argc, char **argv)
{
    struct tok_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc > 0 ? 0 : 2;
    char err[512];
    struct dray_gguf *g;
    struct dray_tokenizer *t;
    double t0 = now_s(), c0 = cpu_s();
    rc = dray_gguf_open(o.model, &g, err, sizeof(err));
    if (!rc) {
        rc = dray_tokenizer_load(g, &t, err, sizeof(err));
        dray_gguf_close(g); /* the tokenizer keeps its own copy */
    }
    if (rc) {
        fprintf(stderr, "dray tokenize: %s\n", err);
        return 1;
    }
    double t_load = now_s() - t0, c_load = cpu_s() - c0, t_tok[2] = {0, 0};
    size_t n;
    char *in = read_all(stdin, &n);
    if (!in) {
        fprintf(stderr, "dray tokenize: out of memory reading stdin\n");
        dray_tokenizer_free(t);
        return 1;
    }
    rc = 0;
    if (o.nul) {
        size_t a = 0;
        for (size_t i = 0; i <= n && !rc; i++) {
            if (i == n && a == n && n > 0)
                break; /* a final NUL ends the last record */
            if (i == n || in[i] == 0) {
                rc = one(t, &o, in + a, i - a, t_tok);
                a = i + 1;
            }
        }
    } else {
        rc = one(t, &o, in, n, t_tok);
    }
    if (o.time)
        fprintf(stderr, "gguf open + tokenizer load %.1f ms (cpu %.1f ms); tokenize %zu bytes in "
                "%.2f ms (cpu %.2f ms, %.1f MB/s)\n", t_load * 1e3, c_load * 1e3, n, t_tok[0] * 1e3,
                t_tok[1] * 1e3, t_tok[1] > 0 ? (double)n / t_tok[1] / 1e6 : 0.0);
    free(in);
    dray_tokenizer_free(t);
    return rc;
}
