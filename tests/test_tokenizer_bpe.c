/* Byte-level BPE on a miniature GPT-2 vocabulary: merge ranks, the byte
 * alphabet, pre-tokenizer choice, special tokens, streaming detokenizing and the
 * errors for unsupported tokenizer names. (The real vocabulary is checked
 * against transformers by tests/reference/test_tokenizer_ref.py.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "gguf.h"
#include "gguf_write.h"
#include "tokenizer.h"

/* "Ġ" is the byte alphabet's space (U+0120), "Ċ" its newline (U+010A). */
enum { T_EOT, T_IM_START, T_A, T_B, T_C, T_SP, T_NL, T_1, T_2, T_AB, T_ABC, T_SPA, T_BC, T_E_ACUTE1,
       T_E_ACUTE2, T_SPSP, T_12, N_TOK };
static const char *const toks[N_TOK] = {
    "<|endoftext|>", "<|im_start|>", "a", "b", "c", "\xC4\xA0", "\xC4\x8A", "1", "2", "ab", "abc",
    "\xC4\xA0\x61" /* Ġa */, "bc", "\xC3\x83", "\xC2\xA9", "\xC4\xA0\xC4\xA0", "12",
};
/* rank order: "a b" first, so " ab" is Ġ + ab, never Ġa + b */
static const char *const merges[] = {"a b", "ab c", "\xC4\xA0 a", "b c", "\xC4\xA0 \xC4\xA0", "1 2"};

static struct dray_tokenizer *load(const char *model, const char *pre, bool with_merges, int *rc,
                                   char *err, size_t errlen)
{
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    int32_t types[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        types[i] = i < 2 ? 3 : 1; /* control, normal */
    dray_gguf_add_str(w, "tokenizer.ggml.model", model);
    if (pre)
        dray_gguf_add_str(w, "tokenizer.ggml.pre", pre);
    dray_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, N_TOK);
    dray_gguf_add_arr(w, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, types, N_TOK);
    if (with_merges)
        dray_gguf_add_arr_str(w, "tokenizer.ggml.merges", merges, sizeof(merges) / sizeof(*merges));
    dray_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", T_EOT);
    void *mem;
    size_t size;
    assert_int_equal(dray_gguf_writer_to_mem(w, &mem, &size), 0);
    dray_gguf_writer_free(w);
    struct dray_gguf *g = NULL;
    assert_int_equal(dray_gguf_open_mem(mem, size, "bpe.gguf", &g, err, errlen), 0);
    struct dray_tokenizer *t = NULL;
    *rc = dray_tokenizer_load(g, &t, err, errlen);
    dray_gguf_close(g);
    free(mem);
    return t;
}

static void expect(const struct dray_tokenizer *t, const char *text, bool special, const int32_t *want,
                   size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(dray_tokenize(t, text, strlen(text), true, special, &ids, &n), 0);
    if (n != n_want || memcmp(ids, want, n * sizeof(*ids))) {
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "%d ", ids[i]);
        fail_msg("\"%s\": got %zu ids (above), want %zu", text, n, n_want);
    }
    free(ids);
}
#define EXPECT(t, text, special, ...)                                                          \
    do {                                                                                       \
        const int32_t w_[] = {__VA_ARGS__};                                                    \
        expect(t, text, special, w_, sizeof(w_) / sizeof(*w_));                                \
    } while (0)

static void test_bpe_merges_by_rank(void **state)
{
    (void)state;
    char err[256];
    int rc;
    struct dray_tokenizer *t = load("gpt2", "gpt2", true, &rc, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    EXPECT(t, "abc", false, T_ABC);
    EXPECT(t, " ab", false, T_SP, T_AB);   /* "a b" (rank 0) beats "Ġ a" (rank 2) */
    EXPECT(t, " a", false, T_SPA);
    EXPECT(t, "cab", false, T_C, T_AB);    /* no "c a" merge */
    EXPECT(t, "a\nb", false, T_A, T_NL, T_B);
    EXPECT(t, "\xC3\xA9", false, T_E_ACUTE1, T_E_ACUTE2); /* é: bytes C3 A9 map to Ã © */
    /* add_bos defaults to false for gpt2; specials only when asked */
    EXPECT(t, "<|im_start|>a", true, T_IM_START, T_A);
    dray_tokenizer_free(t);
}

static void test_bpe_pre_tokenizers_differ(void **state)
{
    (void)state;
    char err[256];
    int rc;
    /* gpt2 keeps "12" one word (merged by "1 2"); smollm isolates each digit */
    struct dray_tokenizer *t = load("gpt2", "gpt2", true, &rc, err, sizeof(err));
    assert_int_equal(rc, 0);
    EXPECT(t, "12", false, T_12);
    dray_tokenizer_free(t);
    t = load("gpt2", "smollm", true, &rc, err, sizeof(err));
    assert_int_equal(rc, 0);
    EXPECT(t, "12", false, T_1, T_2);
    /* whitespace runs: "  a" is "Ġ" + "Ġa" under the GPT-2 regex */
    EXPECT(t, "  a", false, T_SP, T_SPA);
    dray_tokenizer_free(t);
}

static void test_bpe_detokenizes_the_byte_alphabet_streaming(void **state)
{
    (void)state;
    char err[256], out[64];
    int rc;
    struct dray_tokenizer *t = load("gpt2", "qwen2", true, &rc, err, sizeof(err));
    assert_int_equal(rc, 0);
    char *text;
    size_t len;
    const int32_t ids[] = {T_IM_START, T_SPA, T_NL, T_E_ACUTE1, T_E_ACUTE2, T_SPSP};
    assert_int_equal(dray_detokenize(t, ids, 6, &text, &len), 0);
    assert_string_equal(text, " a\n\xC3\xA9  ");
    free(text);
    /* half a character is held back until its second byte arrives */
    struct dray_detok d;
    dray_detok_init(&d);
    assert_int_equal(dray_detok_push(&d, t, T_E_ACUTE1, out, sizeof(out)), 0);
    assert_int_equal(dray_detok_push(&d, t, T_E_ACUTE2, out, sizeof(out)), 2);
    assert_memory_equal(out, "\xC3\xA9", 2);
    dray_tokenizer_free(t);
}

static void test_bpe_unsupported_names_are_errors(void **state)
{
    (void)state;
    char err[256] = "";
    int rc;
    assert_null(load("gpt2", "deepseek-coder", true, &rc, err, sizeof(err)));
    assert_int_equal(rc, DRAY_ENOTSUP);
    assert_non_null(strstr(err, "deepseek-coder"));
    assert_non_null(strstr(err, "smollm"));
    assert_null(load("bert", "gpt2", true, &rc, err, sizeof(err)));
    assert_int_equal(rc, DRAY_ENOTSUP);
    assert_non_null(strstr(err, "bert"));
    assert_null(load("gpt2", "gpt2", false, &rc, err, sizeof(err)));
    assert_int_equal(rc, DRAY_ENOTFOUND);
    assert_non_null(strstr(err, "tokenizer.ggml.merges"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_merges_by_rank),
        cmocka_unit_test(test_bpe_pre_tokenizers_differ),
        cmocka_unit_test(test_bpe_detokenizes_the_byte_alphabet_streaming),
        cmocka_unit_test(test_bpe_unsupported_names_are_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
