/* grammar_mask: how long the allowed-token mask of a JSON grammar takes over a
 * real vocabulary, cold (the first mask of a state, the matcher's DFA built on
 * the way) and warm (the same state again: a cache hit), and what accepting a
 * token costs. A core-level benchmark (the grammar is not public API yet), so
 * it sees core's headers, like the tests; ci/check-includes.sh has its row.
 * Usage: grammar_mask [MODEL.gguf ...] (default: the models under .models/) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dray/gguf.h"
#include "grammar.h"
#include "tokenizer.h"

#define REPS 5

static const char json_gbnf[] =
    "root   ::= ws value ws\n"
    "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array  ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* "
    "\"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws     ::= [ \\t\\n\\r]*\n";

/* Where the masks are taken: prefixes of a JSON document. */
static const char *const states[][2] = {
    {"start", ""},
    {"in object", "{"},
    {"in key", "{\""},
    {"in string", "{\"name\": \"An"},
    {"after value", "{\"name\": \"Ann\""},
    {"in number", "{\"name\": \"Ann\", \"age\": 4"},
    {"in array", "{\"name\": \"Ann\", \"tags\": [1, "},
};

static const char doc[] =
    "{\"name\": \"Ann Lee\", \"age\": 42, \"tags\": [\"a\", \"b c\", 3.5e-2, true, null],\n"
    " \"address\": {\"city\": \"Zürich\", \"zip\": \"8001\", \"note\": \"日本語 ok\"}}";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The grammar's view of tokenizer t's vocabulary. */
static struct dray_grammar_vocab *vocab_of(const struct dray_tokenizer *t, double *secs)
{
    uint32_t n = dray_tokenizer_n_vocab(t);
    char **pieces = calloc(n, sizeof(*pieces));
    uint32_t *lens = calloc(n, sizeof(*lens));
    struct dray_grammar_vocab *v = NULL;
    char err[256];
    for (uint32_t id = 0; pieces && lens && id < n; id++) {
        lens[id] = (uint32_t)dray_tokenizer_token_bytes(t, (int32_t)id, NULL, 0);
        if (!(pieces[id] = malloc(lens[id] + 1)))
            break;
        dray_tokenizer_token_bytes(t, (int32_t)id, pieces[id], lens[id]);
    }
    int32_t eog[3];
    size_t n_eog = dray_tokenizer_eog_ids(t, eog);
    double t0 = now_s();
    if (pieces && lens &&
        dray_grammar_vocab_new(n, (const char *const *)pieces, lens, eog, n_eog, &v, err,
                               sizeof(err)))
        fprintf(stderr, "grammar_mask: %s\n", err);
    *secs = now_s() - t0;
    for (uint32_t id = 0; pieces && id < n; id++)
        free(pieces[id]);
    free(pieces);
    free(lens);
    return v;
}

/* Median cold and warm mask times (ms) at prefix s; *allowed its token count. */
static int time_state(const struct dray_grammar *g, const struct dray_grammar_vocab *v,
                      uint32_t *mask, const char *s, double *cold, double *warm, long *allowed)
{
    double c[REPS], w[REPS];
    for (int r = 0; r < REPS; r++) {
        struct dray_grammar_matcher *m = NULL;
        if (dray_grammar_matcher_new(g, &m) || dray_grammar_accept_bytes(m, s, strlen(s))) {
            dray_grammar_matcher_free(m);
            return -1;
        }
        double t0 = now_s();
        *allowed = dray_grammar_allowed(m, v, mask);
        double t1 = now_s();
        dray_grammar_allowed(m, v, mask);
        double t2 = now_s();
        c[r] = (t1 - t0) * 1e3;
        w[r] = (t2 - t1) * 1e3;
        dray_grammar_matcher_free(m);
    }
    qsort(c, REPS, sizeof(*c), cmp_double);
    qsort(w, REPS, sizeof(*w), cmp_double);
    *cold = c[REPS / 2];
    *warm = w[REPS / 2];
    return 0;
}

/* Tokenize the document, then accept its tokens one by one (a mask before each,
 * as a sampler would): the mean cost of accept_token and of the masks. */
static void time_document(const struct dray_tokenizer *t, const struct dray_grammar *g,
                          const struct dray_grammar_vocab *v, uint32_t *mask)
{
    int32_t *ids = NULL;
    size_t n = 0;
    struct dray_grammar_matcher *m = NULL;
    if (dray_tokenize(t, doc, strlen(doc), false, false, &ids, &n) ||
        dray_grammar_matcher_new(g, &m)) {
        free(ids);
        return;
    }
    double t_acc = 0, t_mask = 0;
    size_t k = 0;
    for (; k < n; k++) {
        double t0 = now_s();
        long a = dray_grammar_allowed(m, v, mask);
        double t1 = now_s();
        int rc = dray_grammar_accept_token(m, v, ids[k]);
        t_acc += now_s() - t1;
        t_mask += t1 - t0;
        if (a <= 0 || rc)
            break;
    }
    printf("  document: %zu tokens%s, mask %.3f ms/token (cold and warm mixed), "
           "accept_token %.2f us/token\n", n, k < n ? " (stopped: refused)" : "",
           t_mask * 1e3 / (double)(k ? k : 1), t_acc * 1e6 / (double)(k ? k : 1));
    dray_grammar_matcher_free(m);
    free(ids);
}

static int bench_model(const char *path, const struct dray_grammar *g)
{
    char err[256];
    struct dray_gguf *gg = NULL;
    struct dray_tokenizer *t = NULL;
    if (dray_gguf_open(path, &gg, err, sizeof(err)) || dray_tokenizer_load(gg, &t, err, sizeof(err))) {
        fprintf(stderr, "grammar_mask: %s: %s\n", path, err);
        dray_gguf_close(gg);
        return 1;
    }
    dray_gguf_close(gg);
    double secs;
    struct dray_grammar_vocab *v = vocab_of(t, &secs);
    uint32_t *mask = v ? calloc((dray_grammar_vocab_size(v) + 31) / 32, 4) : NULL;
    if (!mask) {
        dray_tokenizer_free(t);
        dray_grammar_vocab_free(v);
        return 1;
    }
    printf("%s: %u tokens, vocab trie built in %.1f ms\n", path, dray_grammar_vocab_size(v),
           secs * 1e3);
    printf("  %-12s %9s %10s %10s\n", "state", "allowed", "cold ms", "warm ms");
    for (size_t k = 0; k < sizeof(states) / sizeof(states[0]); k++) {
        double cold, warm;
        long allowed;
        if (time_state(g, v, mask, states[k][1], &cold, &warm, &allowed) == 0)
            printf("  %-12s %9ld %10.3f %10.4f\n", states[k][0], allowed, cold, warm);
    }
    time_document(t, g, v, mask);
    free(mask);
    dray_grammar_vocab_free(v);
    dray_tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    static const char *const dflt[] = {".models/gemma-3-270m-q4_k_m.gguf",
                                       ".models/smollm2-135m-instruct-q4_1.gguf"};
    char err[256];
    struct dray_grammar *g = NULL;
    if (dray_grammar_parse(json_gbnf, strlen(json_gbnf), &g, err, sizeof(err))) {
        fprintf(stderr, "grammar_mask: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (argc > 1)
        for (int k = 1; k < argc; k++)
            rc |= bench_model(argv[k], g);
    else
        for (size_t k = 0; k < 2; k++)
            rc |= bench_model(dflt[k], g);
    dray_grammar_free(g);
    return rc;
}
