/* Tokenizer and streaming detokenizer over tiny vocabularies written with the GGUF
 * writer, plus (when the file is present) the real Gemma 3 270M vocabulary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "gguf.h"
#include "gguf_write.h"
#include "testutil.h"
#include "tokenizer.h"

#define SP "\xE2\x96\x81" /* "▁" */

struct vtok {
    const char *text;
    float score;
    int32_t type;
};

/* ids 0..6 special, 7..262 byte tokens <0x00>..<0xFF>, then the normal tokens. */
static const struct vtok base_specials[] = {
    {"<pad>", -1000, 3}, {"<eos>", -1000, 3}, {"<bos>", -1000, 3}, {"<unk>", -1000, 2},
    {"<start_of_turn>", -1000, 3}, {"<end_of_turn>", -1000, 3}, {"\n", -1000, 4},
};
#define N_SPEC 7
#define BYTE0 7
#define NORM0 (BYTE0 + 256)

static const struct vtok base_normal[] = {
    {SP, -1, 1},     {"a", -2, 1},       {"b", -3, 1},          {"c", -4, 1},
    {"ab", -20, 1},  {"bc", -10, 1},     {"h", -5, 1},          {"e", -6, 1},
    {"l", -7, 1},    {"o", -8, 1},       {"he", -11, 1},        {"ll", -12, 1},
    {"hell", -13, 1}, {"hello", -14, 1}, {SP "hello", -15, 1},  {"aa", -30, 1},
    {"x", -9, 1},    {"  ", -1000, 4},  {"abc!", -1000, 4},    {"xa", -1000, 4},
    {"\xE4\xB8\xAD", -40, 1},           /* 中 */
};
enum { T_SP = NORM0, T_A, T_B, T_C, T_AB, T_BC, T_H, T_E, T_L, T_O, T_HE, T_LL, T_HELL, T_HELLO,
       T_SPHELLO, T_AA, T_X, T_2SP, T_ABC_BANG, T_XA, T_ZHONG, N_TOK };

struct vocab_opts {
    const char *model;   /* tokenizer.ggml.model; NULL = "llama" */
    int add_bos;         /* -1 = key absent */
    int add_space_prefix;
    bool no_bytes;       /* replace byte tokens by "<unusedN>" */
    int bad_scores;      /* scores array one short */
    int64_t bos_id;      /* -1 = key absent */
};

static const struct vocab_opts DEFAULT_OPTS = {NULL, 1, 0, false, 0, 2};

/* Write the vocabulary to a GGUF in memory and load a tokenizer from it. */
static int load_vocab(const struct vocab_opts *o, struct dray_tokenizer **t, char *err, size_t errlen)
{
    const char *texts[N_TOK];
    float scores[N_TOK];
    int32_t types[N_TOK];
    char names[256][16];
    for (int i = 0; i < N_TOK; i++) {
        const struct vtok *v = NULL;
        if (i < N_SPEC) {
            v = &base_specials[i];
        } else if (i < NORM0) {
            int b = i - BYTE0;
            snprintf(names[b], sizeof(names[b]), o->no_bytes ? "<unused%d>" : "<0x%02X>", b);
            texts[i] = names[b];
            scores[i] = 0;
            types[i] = o->no_bytes ? 5 : 6;
            continue;
        } else {
            v = &base_normal[i - NORM0];
        }
        texts[i] = v->text;
        scores[i] = v->score;
        types[i] = v->type;
    }
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    assert_non_null(w);
    dray_gguf_add_str(w, "general.architecture", "gemma3");
    dray_gguf_add_str(w, "tokenizer.ggml.model", o->model ? o->model : "llama");
    dray_gguf_add_arr_str(w, "tokenizer.ggml.tokens", texts, N_TOK);
    dray_gguf_add_arr(w, "tokenizer.ggml.scores", DRAY_GGUF_FLOAT32, scores, N_TOK - o->bad_scores);
    dray_gguf_add_arr(w, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, types, N_TOK);
    if (o->bos_id >= 0)
        dray_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)o->bos_id);
    dray_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 1);
    dray_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 3);
    if (o->add_bos >= 0)
        dray_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", o->add_bos);
    if (o->add_space_prefix >= 0)
        dray_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", o->add_space_prefix);
    void *mem;
    size_t size;
    assert_int_equal(dray_gguf_writer_to_mem(w, &mem, &size), 0);
    dray_gguf_writer_free(w);
    struct dray_gguf *g;
    int rc = dray_gguf_open_mem(mem, size, "tiny.gguf", &g, err, errlen);
    assert_int_equal(rc, 0);
    rc = dray_tokenizer_load(g, t, err, errlen);
    dray_gguf_close(g); /* the tokenizer must not keep pointers into the file */
    memset(mem, 0xAB, size);
    free(mem);
    return rc;
}

static struct dray_tokenizer *tiny(void)
{
    struct dray_tokenizer *t = NULL;
    char err[256] = "";
    int rc = load_vocab(&DEFAULT_OPTS, &t, err, sizeof(err));
    if (rc)
        fprintf(stderr, "load: %s\n", err);
    assert_int_equal(rc, 0);
    return t;
}

/* Tokenize s and compare with the expected ids (terminated by -1). */
static void expect_ids(const struct dray_tokenizer *t, const char *s, bool bos, bool special,
                       const int32_t *want)
{
    int32_t *ids = NULL;
    size_t n = 0, nw = 0;
    assert_int_equal(dray_tokenize(t, s, strlen(s), bos, special, &ids, &n), 0);
    while (want[nw] >= 0)
        nw++;
    if (n != nw) {
        fprintf(stderr, "'%s': got", s);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(n, nw);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], want[i]);
    free(ids);
}
#define IDS(...) ((const int32_t[]){__VA_ARGS__, -1})
#define NONE ((const int32_t[]){-1})

/* ---------------------------------------------------------------- loading */

static void test_tokenizer_loads_ids_and_flags(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    assert_int_equal(dray_tokenizer_n_vocab(t), N_TOK);
    assert_int_equal(dray_tokenizer_bos(t), 2);
    assert_int_equal(dray_tokenizer_eos(t), 1);
    assert_int_equal(dray_tokenizer_eot(t), 5); /* found by its text "<end_of_turn>" */
    assert_true(dray_tokenizer_is_eog(t, 1));
    assert_true(dray_tokenizer_is_eog(t, 5));
    assert_false(dray_tokenizer_is_eog(t, 2));
    assert_false(dray_tokenizer_is_eog(t, -1));
    size_t len;
    const char *s = dray_tokenizer_text(t, T_SPHELLO, &len);
    assert_int_equal(len, 8);
    assert_memory_equal(s, SP "hello", 8);
    assert_null(dray_tokenizer_text(t, N_TOK, &len));
    assert_int_equal(dray_tokenizer_find(t, "<0x41>", 6), BYTE0 + 0x41);
    assert_int_equal(dray_tokenizer_type(t, BYTE0), DRAY_TOKEN_BYTE);
    dray_tokenizer_free(t);
}

static void test_tokenizer_rejects_unsupported_model_by_name(void **state)
{
    (void)state;
    struct vocab_opts o = DEFAULT_OPTS;
    o.model = "bert"; /* WordPiece ("gpt2" is byte-level BPE: test_tokenizer_bpe) */
    struct dray_tokenizer *t = (void *)1;
    char err[256] = "";
    assert_int_equal(load_vocab(&o, &t, err, sizeof(err)), DRAY_ENOTSUP);
    assert_null(t);
    assert_non_null(strstr(err, "bert"));
    assert_non_null(strstr(err, "tokenizer.ggml.model"));
}

static void test_tokenizer_rejects_scores_of_wrong_length(void **state)
{
    (void)state;
    struct vocab_opts o = DEFAULT_OPTS;
    o.bad_scores = 1;
    struct dray_tokenizer *t = NULL;
    char err[256] = "";
    assert_int_equal(load_vocab(&o, &t, err, sizeof(err)), DRAY_EFORMAT);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer.ggml.scores"));
}

static void test_tokenizer_rejects_bos_id_out_of_range(void **state)
{
    (void)state;
    struct vocab_opts o = DEFAULT_OPTS;
    o.bos_id = 100000;
    struct dray_tokenizer *t = NULL;
    char err[256] = "";
    assert_int_equal(load_vocab(&o, &t, err, sizeof(err)), DRAY_EFORMAT);
    assert_non_null(strstr(err, "bos_token_id"));
}

/* ---------------------------------------------------------------- merging */

static void test_tokenizer_merges_best_score_first(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    /* "bc" (-10) beats "ab" (-20) */
    expect_ids(t, "abc", false, false, IDS(T_A, T_BC));
    expect_ids(t, "ab", false, false, IDS(T_AB));
    /* h e l l o -> he, ll -> hell -> hello; the space becomes "▁" and merges in */
    expect_ids(t, "hello", false, false, IDS(T_HELLO));
    expect_ids(t, " hello", false, false, IDS(T_SPHELLO));
    expect_ids(t, "hello hello", false, false, IDS(T_HELLO, T_SPHELLO));
    dray_tokenizer_free(t);
}

static void test_tokenizer_equal_scores_merge_leftmost_first(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    expect_ids(t, "aaa", false, false, IDS(T_AA, T_A));
    expect_ids(t, "aaaaa", false, false, IDS(T_AA, T_AA, T_A));
    dray_tokenizer_free(t);
}

static void test_tokenizer_byte_fallback_uses_uppercase_hex_tokens(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    /* 'é' is not in the vocabulary: its two bytes; '中' is */
    expect_ids(t, "\xC3\xA9", false, false, IDS(BYTE0 + 0xC3, BYTE0 + 0xA9));
    expect_ids(t, "a\xE4\xB8\xAD" "b", false, false, IDS(T_A, T_ZHONG, T_B));
    /* tab and 'Z' are unknown single characters */
    expect_ids(t, "\tZ", false, false, IDS(BYTE0 + 0x09, BYTE0 + 0x5A));
    /* ill-formed UTF-8 goes through byte by byte */
    expect_ids(t, "\xFF\xE4\xB8", false, false, IDS(BYTE0 + 0xFF, BYTE0 + 0xE4, BYTE0 + 0xB8));
    dray_tokenizer_free(t);
}

static void test_tokenizer_without_byte_tokens_falls_back_to_unk(void **state)
{
    (void)state;
    struct vocab_opts o = DEFAULT_OPTS;
    o.no_bytes = true;
    struct dray_tokenizer *t = NULL;
    char err[256];
    assert_int_equal(load_vocab(&o, &t, err, sizeof(err)), 0);
    expect_ids(t, "aZ", false, false, IDS(T_A, 3));
    dray_tokenizer_free(t);
}

/* ---------------------------------------------------------------- specials */

static void test_tokenizer_control_tokens_only_with_parse_special(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    expect_ids(t, "<start_of_turn>ab<end_of_turn>", false, true, IDS(4, T_AB, 5));
    /* without parse_special the text is text: '<' '_' etc. are byte fallback */
    int32_t *ids;
    size_t n;
    const char *s = "<bos>";
    assert_int_equal(dray_tokenize(t, s, strlen(s), false, false, &ids, &n), 0);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], BYTE0 + '<');
    assert_int_equal(ids[1], T_B);
    free(ids);
    dray_tokenizer_free(t);
}

static void test_tokenizer_user_defined_tokens_always_match(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    /* "\n" and "  " (two real spaces) are user-defined: matched before "▁" escaping */
    expect_ids(t, "a\nb", false, false, IDS(T_A, 6, T_B));
    expect_ids(t, "a   b", false, false, IDS(T_A, T_2SP, T_SP, T_B));
    dray_tokenizer_free(t);
}

static void test_tokenizer_special_partition_longest_token_first(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    /* "xa" starts first, but the longer "abc!" is cut out first (llama.cpp order) */
    expect_ids(t, "xabc!", false, false, IDS(T_X, T_ABC_BANG));
    expect_ids(t, "xab", false, false, IDS(T_XA, T_B));
    dray_tokenizer_free(t);
}

/* A tokenizer whose vocabulary is exactly texts[0..n), all USER_DEFINED, so every
 * byte of a text over their alphabet ends up in the special partition. */
static struct dray_tokenizer *all_user_defined(const char *const *texts, uint32_t n)
{
    float *scores = calloc(n, sizeof(float));
    int32_t *types = malloc(n * sizeof(int32_t));
    assert_true(scores && types);
    for (uint32_t i = 0; i < n; i++)
        types[i] = 4;
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    dray_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    dray_gguf_add_arr_str(w, "tokenizer.ggml.tokens", texts, n);
    dray_gguf_add_arr(w, "tokenizer.ggml.scores", DRAY_GGUF_FLOAT32, scores, n);
    dray_gguf_add_arr(w, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, types, n);
    dray_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", false);
    dray_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", false);
    void *mem;
    size_t size;
    char err[256] = "";
    struct dray_gguf *g;
    struct dray_tokenizer *t = NULL;
    assert_int_equal(dray_gguf_writer_to_mem(w, &mem, &size), 0);
    dray_gguf_writer_free(w);
    assert_int_equal(dray_gguf_open_mem(mem, size, "udef.gguf", &g, err, sizeof(err)), 0);
    int rc = dray_tokenizer_load(g, &t, err, sizeof(err));
    if (rc)
        fprintf(stderr, "load: %s\n", err);
    assert_int_equal(rc, 0);
    dray_gguf_close(g);
    free(mem);
    free(scores);
    free(types);
    return t;
}

/* llama.cpp's partition written the obvious way: candidates longest first (ties
 * lower id), each one's occurrences left to right, taken where the span is still
 * raw. out[k] = ids in text order; returns their count. */
static size_t reference_partition(const char *const *texts, uint32_t n_tok, const char *s,
                                  int32_t *out)
{
    size_t n = strlen(s), cnt = 0;
    int32_t mark[128]; /* id + 1 at a token start, -1 inside, 0 raw */
    memset(mark, 0, sizeof(mark));
    for (size_t len = 8; len >= 1; len--)
        for (uint32_t id = 0; id < n_tok; id++) {
            if (strlen(texts[id]) != len)
                continue;
            for (size_t p = 0; p + len <= n; p++) {
                size_t i = 0;
                while (i < len && mark[p + i] == 0 && s[p + i] == texts[id][i])
                    i++;
                if (i < len)
                    continue;
                mark[p] = (int32_t)id + 1;
                for (i = 1; i < len; i++)
                    mark[p + i] = -1;
                p += len - 1;
            }
        }
    for (size_t p = 0; p < n; p++)
        if (mark[p] > 0)
            out[cnt++] = mark[p] - 1;
    return cnt;
}

/* The bucketed partition against the obvious one on random texts over
 * "abc" with random overlapping candidates, so blocked matches, moves to shorter
 * matches and out-of-order buckets all happen. */
static void test_tokenizer_partition_matches_reference(void **state)
{
    (void)state;
    dray_test_seed(18);
    for (int round = 0; round < 40; round++) {
        char pool[24][9];
        const char *texts[24] = {"a", "b", "c"};
        uint32_t n_tok = 3;
        while (n_tok < 24) {
            uint32_t len = 2 + dray_test_rand() % 4, i;
            for (i = 0; i < len; i++)
                pool[n_tok][i] = (char)('a' + dray_test_rand() % 3);
            pool[n_tok][len] = 0;
            for (i = 0; i < n_tok && strcmp(texts[i], pool[n_tok]); i++)
                ;
            if (i == n_tok) { /* texts are unique in a vocabulary */
                texts[n_tok] = pool[n_tok];
                n_tok++;
            }
        }
        struct dray_tokenizer *t = all_user_defined(texts, n_tok);
        for (int k = 0; k < 50; k++) {
            char s[100];
            size_t n = 1 + dray_test_rand() % 90, n_ids, n_ref;
            for (size_t i = 0; i < n; i++)
                s[i] = (char)('a' + dray_test_rand() % 3);
            s[n] = 0;
            int32_t *ids, ref[100];
            n_ref = reference_partition(texts, n_tok, s, ref);
            assert_int_equal(dray_tokenize(t, s, n, false, false, &ids, &n_ids), 0);
            assert_int_equal(n_ids, n_ref);
            for (size_t i = 0; i < n_ids; i++)
                if (ids[i] != ref[i]) {
                    fprintf(stderr, "text %s: id %zu is %d, expected %d\n", s, i, ids[i], ref[i]);
                    fail();
                }
            free(ids);
        }
        dray_tokenizer_free(t);
    }
}

/* Resident set now, KiB (ru_maxrss's unit). */
static long rss_now_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Gemma 3's user-defined runs of 1..31 "\n" and "\t" made the partition
 * record every match at every byte; 8 MiB of "\n" needed 4 GB. Peak growth is
 * measured from the resident set just before (the peak so far can only make the
 * figure larger, never hide growth). Runs first, while the process is small. */
static void test_tokenizer_newline_runs_use_bounded_memory(void **state)
{
    (void)state;
    static char runs[62][32];
    const char *texts[62];
    for (int i = 0; i < 31; i++) {
        memset(runs[i], '\n', (size_t)i + 1);
        memset(runs[31 + i], '\t', (size_t)i + 1);
        texts[i] = runs[i];
        texts[31 + i] = runs[31 + i];
    }
    struct dray_tokenizer *t = all_user_defined(texts, 62);
    size_t n = (size_t)8 << 20, n_ids;
    char *s = malloc(n);
    assert_non_null(s);
    memset(s, '\n', n);
    int32_t *ids;
    struct rusage ru;
    long before = rss_now_kib();
    assert_int_equal(dray_tokenize(t, s, n, false, false, &ids, &n_ids), 0);
    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    long grew_kib = ru.ru_maxrss - before;
    print_message("8 MiB of \\n: %zu ids, peak RSS growth %.1f MiB\n", n_ids, grew_kib / 1024.0);
    assert_true(before > 0);
    assert_true(grew_kib < 64 * 1000); /* 64 MB */
    /* greedy runs of 31, then the rest */
    assert_int_equal(n_ids, n / 31 + (n % 31 != 0));
    assert_int_equal(ids[0], 30);
    assert_int_equal(ids[n_ids - 1], (int32_t)(n % 31) - 1);
    free(ids);
    free(s);
    dray_tokenizer_free(t);
}

static void test_tokenizer_bos_follows_metadata(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    expect_ids(t, "ab", true, false, IDS(2, T_AB));
    expect_ids(t, "ab", false, false, IDS(T_AB));
    expect_ids(t, "", true, false, IDS(2));
    expect_ids(t, "", false, false, NONE);
    dray_tokenizer_free(t);

    struct vocab_opts o = DEFAULT_OPTS;
    o.add_bos = 0;
    char err[256];
    assert_int_equal(load_vocab(&o, &t, err, sizeof(err)), 0);
    expect_ids(t, "ab", true, false, IDS(T_AB));
    dray_tokenizer_free(t);
}

static void test_tokenizer_space_prefix_after_start_and_specials(void **state)
{
    (void)state;
    struct vocab_opts o = DEFAULT_OPTS;
    o.add_space_prefix = -1; /* absent: SentencePiece default true */
    struct dray_tokenizer *t = NULL;
    char err[256];
    assert_int_equal(load_vocab(&o, &t, err, sizeof(err)), 0);
    expect_ids(t, "hello", false, false, IDS(T_SPHELLO));
    expect_ids(t, "<bos>hello", false, true, IDS(2, T_SPHELLO));
    dray_tokenizer_free(t);
}

static void test_tokenizer_empty_input_gives_empty_array(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    int32_t *ids = NULL;
    size_t n = 99;
    assert_int_equal(dray_tokenize(t, "", 0, false, true, &ids, &n), 0);
    assert_int_equal(n, 0);
    assert_non_null(ids);
    free(ids);
    assert_int_equal(dray_tokenize(t, NULL, 0, false, true, &ids, &n), 0);
    free(ids);
    assert_int_equal(dray_tokenize(t, NULL, 3, false, true, &ids, &n), DRAY_EINVAL);
    dray_tokenizer_free(t);
}

/* ---------------------------------------------------------------- reference merge */

/* Naive O(n^2) SentencePiece merge: repeatedly merge the best adjacent pair
 * (highest score, leftmost on ties) whose concatenation is a token. */
static size_t naive_tokenize(const struct dray_tokenizer *t, const char *s, size_t n, int32_t *out)
{
    char esc[1024];
    size_t k = 0, ns = 0, no = 0;
    size_t start[1024], len[1024];
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(esc + k, SP, 3);
            start[ns] = k, len[ns++] = 3, k += 3;
        } else {
            start[ns] = k, len[ns++] = 1, esc[k++] = s[i];
        }
    }
    for (;;) {
        float best = 0;
        long bi = -1;
        for (size_t i = 0; i + 1 < ns; i++) {
            int32_t id = dray_tokenizer_find(t, esc + start[i], len[i] + len[i + 1]);
            if (id < 0)
                continue;
            /* scores are not exposed: take them from the vocabulary table */
            float sc = 0;
            for (size_t j = 0; j < sizeof(base_normal) / sizeof(base_normal[0]); j++)
                if (NORM0 + (int)j == id)
                    sc = base_normal[j].score;
            if (bi < 0 || sc > best)
                best = sc, bi = (long)i;
        }
        if (bi < 0)
            break;
        len[bi] += len[bi + 1];
        memmove(&start[bi + 1], &start[bi + 2], (ns - bi - 2) * sizeof(size_t));
        memmove(&len[bi + 1], &len[bi + 2], (ns - bi - 2) * sizeof(size_t));
        ns--;
    }
    for (size_t i = 0; i < ns; i++) {
        int32_t id = dray_tokenizer_find(t, esc + start[i], len[i]);
        if (id >= 0) {
            out[no++] = id;
        } else {
            for (size_t j = 0; j < len[i]; j++)
                out[no++] = BYTE0 + (uint8_t)esc[start[i] + j];
        }
    }
    return no;
}

static void test_tokenizer_matches_naive_merge_on_random_text(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    static const char alphabet[] = "abchelOq "; /* no x: "xa" is user-defined */
    dray_test_seed(7);
    for (int trial = 0; trial < 500; trial++) {
        char s[120];
        size_t n = 1 + dray_test_rand() % 100;
        for (size_t i = 0; i < n; i++) {
            s[i] = alphabet[dray_test_rand() % (sizeof(alphabet) - 1)];
            if (s[i] == ' ' && i > 0 && s[i - 1] == ' ')
                s[i] = 'a'; /* "  " is a user-defined token: keep to single spaces */
        }
        int32_t want[400], *ids;
        size_t nw = naive_tokenize(t, s, n, want), got;
        assert_int_equal(dray_tokenize(t, s, n, false, false, &ids, &got), 0);
        assert_int_equal(got, nw);
        assert_memory_equal(ids, want, nw * sizeof(int32_t));
        free(ids);
    }
    dray_tokenizer_free(t);
}

/* CPU time of this process, for the timings these tests print (speed is
 * measured by `dray tokenize --time`, never asserted). */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_tokenizer_long_input_is_fast(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    size_t n = 100000;
    char *s = malloc(n);
    for (size_t i = 0; i < n; i++)
        s[i] = "hello abc "[i % 10];
    int32_t *ids;
    size_t got;
    double t0 = now_s();
    assert_int_equal(dray_tokenize(t, s, n, false, false, &ids, &got), 0);
    double dt = now_s() - t0;
    /* hello ▁ a bc, then ▁hello ▁ a bc per 10 chars, and the final ▁ */
    assert_int_equal(got, 4 * (n / 10) + 1);
    free(ids);
    /* one long run of the same letter: the merge queue must not go quadratic */
    memset(s, 'a', n);
    t0 = now_s();
    assert_int_equal(dray_tokenize(t, s, n, false, false, &ids, &got), 0);
    dt += now_s() - t0;
    assert_int_equal(got, n / 2);
    free(ids);
    fprintf(stderr, "100k chars x2: %.1f ms\n", dt * 1e3);
    /* speed is measured (dray tokenize --time), not asserted: printed only */
    free(s);
    dray_tokenizer_free(t);
}

static void test_tokenizer_loads_262144_tokens_quickly(void **state)
{
    (void)state;
    enum { N = 262144 };
    char **texts = malloc(sizeof(char *) * N);
    float *scores = malloc(sizeof(float) * N);
    int32_t *types = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) {
        texts[i] = malloc(16);
        snprintf(texts[i], 16, i < 6000 ? "<unused%d>" : SP "w%d", i);
        scores[i] = -(float)i;
        types[i] = i < 6000 ? 3 : 1;
    }
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    dray_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    dray_gguf_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)texts, N);
    dray_gguf_add_arr(w, "tokenizer.ggml.scores", DRAY_GGUF_FLOAT32, scores, N);
    dray_gguf_add_arr(w, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, types, N);
    void *mem;
    size_t size;
    assert_int_equal(dray_gguf_writer_to_mem(w, &mem, &size), 0);
    dray_gguf_writer_free(w);
    struct dray_gguf *g;
    char err[256];
    assert_int_equal(dray_gguf_open_mem(mem, size, "big.gguf", &g, err, sizeof(err)), 0);
    struct dray_tokenizer *t;
    double t0 = now_s();
    assert_int_equal(dray_tokenizer_load(g, &t, err, sizeof(err)), 0);
    double dt = now_s() - t0;
    fprintf(stderr, "load of %d tokens: %.1f ms\n", N, dt * 1e3);
    assert_int_equal(dray_tokenizer_find(t, SP "w200000", 10), 200000);
    assert_int_equal(dray_tokenizer_find(t, "<unused5999>", 12), 5999);
    dray_tokenizer_free(t);
    dray_gguf_close(g);
    free(mem);
    for (int i = 0; i < N; i++)
        free(texts[i]);
    free(texts);
    free(scores);
    free(types);
}

/* ---------------------------------------------------------------- detokenizer */

static size_t push_all(const struct dray_tokenizer *t, const int32_t *ids, size_t n, char *out,
                       size_t *per_push)
{
    struct dray_detok d;
    size_t used = 0;
    dray_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        size_t k = dray_detok_push(&d, t, ids[i], out + used, 64);
        assert_true(k <= 64);
        if (per_push)
            per_push[i] = k;
        used += k;
    }
    return used + dray_detok_flush(&d, out + used, 64);
}

static void test_detok_renders_spaces_and_hides_control(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    char out[512];
    const int32_t ids[] = {2, T_HELLO, T_SPHELLO, 6, T_2SP, 4, T_A};
    size_t n = push_all(t, ids, 7, out, NULL);
    assert_int_equal(n, strlen("hello hello\n  a"));
    assert_memory_equal(out, "hello hello\n  a", n);
    dray_tokenizer_free(t);
}

static void test_detok_holds_split_emoji_until_complete(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    /* 😀 = F0 9F 98 80 as four byte tokens, then '中' split as E4 B8 AD */
    const int32_t ids[] = {BYTE0 + 0xF0, BYTE0 + 0x9F, BYTE0 + 0x98, BYTE0 + 0x80,
                           BYTE0 + 0xE4, BYTE0 + 0xB8, BYTE0 + 0xAD, T_A};
    size_t per[8];
    char out[512];
    size_t n = push_all(t, ids, 8, out, per);
    assert_int_equal(per[0], 0);
    assert_int_equal(per[1], 0);
    assert_int_equal(per[2], 0);
    assert_int_equal(per[3], 4);
    assert_int_equal(per[4] + per[5], 0);
    assert_int_equal(per[6], 3);
    assert_int_equal(per[7], 1);
    assert_int_equal(n, 8);
    assert_memory_equal(out, "\xF0\x9F\x98\x80\xE4\xB8\xAD" "a", 8);
    dray_tokenizer_free(t);
}

static void test_detok_replaces_invalid_sequences_instead_of_dropping(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    char out[512];
    /* E4 B8 then 'a': one U+FFFD for the maximal subpart, then 'a';
     * a lone FF: U+FFFD; a dangling E4 at the end: U+FFFD from flush */
    const int32_t ids[] = {BYTE0 + 0xE4, BYTE0 + 0xB8, T_A, BYTE0 + 0xFF, BYTE0 + 0xE4};
    size_t n = push_all(t, ids, 5, out, NULL);
    const char want[] = "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD" "\xEF\xBF\xBD";
    assert_int_equal(n, sizeof(want) - 1);
    assert_memory_equal(out, want, n);
    dray_tokenizer_free(t);
}

static void test_detok_small_buffer_reports_size_and_keeps_state(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    struct dray_detok d;
    char out[16];
    dray_detok_init(&d);
    assert_int_equal(dray_detok_push(&d, t, BYTE0 + 0xE4, out, sizeof(out)), 0);
    /* pending E4 + "hello": needs U+FFFD + "hello" = 8 bytes */
    assert_int_equal(dray_detok_push(&d, t, T_HELLO, out, 4), 8);
    assert_int_equal(d.n, 1);
    assert_int_equal(dray_detok_push(&d, t, T_HELLO, out, sizeof(out)), 8);
    assert_memory_equal(out, "\xEF\xBF\xBD" "hello", 8);
    assert_true(dray_tokenizer_max_piece(t) >= 8);
    /* an id out of range renders as U+FFFD, not a crash */
    assert_int_equal(dray_detok_push(&d, t, -5, out, sizeof(out)), 3);
    dray_tokenizer_free(t);
}

static void test_detok_roundtrips_tokenized_text(void **state)
{
    (void)state;
    struct dray_tokenizer *t = tiny();
    const char *texts[] = {"hello abc", "  a\n\nb  ", "\xE4\xB8\xAD\xC3\xA9 \xF0\x9F\x98\x80!",
                           "<start_of_turn>x", ""};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        int32_t *ids;
        size_t n, len;
        char *back;
        assert_int_equal(dray_tokenize(t, texts[i], strlen(texts[i]), true, false, &ids, &n), 0);
        assert_int_equal(dray_detokenize(t, ids, n, &back, &len), 0);
        assert_string_equal(back, texts[i]);
        free(ids);
        free(back);
    }
    dray_tokenizer_free(t);
}

/* ---------------------------------------------------------------- real model */

static const char *real_model(void)
{
    /* the model ci/setup.sh installs under the source root; a skip shows in CI's
     * closing line (ci/summarize.py counts cmocka's skipped cases) */
    static char path[1024];
    const char *p = getenv("DRAY_TEST_MODEL"), *root = getenv("DRAY_SOURCE_ROOT");
    if (!p) {
        snprintf(path, sizeof(path), "%s/.models/gemma-3-270m-q4_k_m.gguf", root ? root : ".");
        p = path;
    }
    FILE *f = fopen(p, "rb");
    if (!f) {
        print_message("SKIP: no model at %s (ci/setup.sh installs it)\n", p);
        return NULL;
    }
    fclose(f);
    return p;
}

static void test_tokenizer_gemma3_reference_chat_ids(void **state)
{
    (void)state;
    const char *path = real_model();
    if (!path)
        skip();
    struct dray_gguf *g;
    struct dray_tokenizer *t;
    char err[256];
    assert_int_equal(dray_gguf_open(path, &g, err, sizeof(err)), 0);
    double t0 = now_s();
    assert_int_equal(dray_tokenizer_load(g, &t, err, sizeof(err)), 0);
    double dt = now_s() - t0;
    fprintf(stderr, "gemma3 tokenizer load: %.1f ms\n", dt * 1e3);
    dray_gguf_close(g);
    assert_int_equal(dray_tokenizer_n_vocab(t), 262144);
    assert_int_equal(dray_tokenizer_bos(t), 2);
    assert_int_equal(dray_tokenizer_eos(t), 1);
    assert_int_equal(dray_tokenizer_eot(t), 106);
    assert_false(dray_tokenizer_is_eog(t, 212)); /* "</s>" is an HTML tag here */
    /* docs/reference/gemma3-gguf.md §7.1 (llama.cpp --verbose-prompt) */
    expect_ids(t, "<bos><start_of_turn>user\nTest<end_of_turn>\n<start_of_turn>model\n", false, true,
               IDS(2, 105, 2364, 107, 3694, 106, 107, 105, 4368, 107));
    dray_tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_newline_runs_use_bounded_memory),
        cmocka_unit_test(test_tokenizer_loads_ids_and_flags),
        cmocka_unit_test(test_tokenizer_rejects_unsupported_model_by_name),
        cmocka_unit_test(test_tokenizer_rejects_scores_of_wrong_length),
        cmocka_unit_test(test_tokenizer_rejects_bos_id_out_of_range),
        cmocka_unit_test(test_tokenizer_merges_best_score_first),
        cmocka_unit_test(test_tokenizer_equal_scores_merge_leftmost_first),
        cmocka_unit_test(test_tokenizer_byte_fallback_uses_uppercase_hex_tokens),
        cmocka_unit_test(test_tokenizer_without_byte_tokens_falls_back_to_unk),
        cmocka_unit_test(test_tokenizer_control_tokens_only_with_parse_special),
        cmocka_unit_test(test_tokenizer_user_defined_tokens_always_match),
        cmocka_unit_test(test_tokenizer_special_partition_longest_token_first),
        cmocka_unit_test(test_tokenizer_partition_matches_reference),
        cmocka_unit_test(test_tokenizer_bos_follows_metadata),
        cmocka_unit_test(test_tokenizer_space_prefix_after_start_and_specials),
        cmocka_unit_test(test_tokenizer_empty_input_gives_empty_array),
        cmocka_unit_test(test_tokenizer_matches_naive_merge_on_random_text),
        cmocka_unit_test(test_tokenizer_long_input_is_fast),
        cmocka_unit_test(test_tokenizer_loads_262144_tokens_quickly),
        cmocka_unit_test(test_detok_renders_spaces_and_hides_control),
        cmocka_unit_test(test_detok_holds_split_emoji_until_complete),
        cmocka_unit_test(test_detok_replaces_invalid_sequences_instead_of_dropping),
        cmocka_unit_test(test_detok_small_buffer_reports_size_and_keeps_state),
        cmocka_unit_test(test_detok_roundtrips_tokenized_text),
        cmocka_unit_test(test_tokenizer_gemma3_reference_chat_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
