/* libFuzzer target: tokenizer encode and streaming decode (core/text/tokenizer*.c)
 * on two built-in vocabularies shaped like the real ones:
 *  - SPM like Gemma 3: control tokens, 256 byte-fallback tokens, user-defined runs
 *    of 1..31 "\n" and "\t" and HTML tags (shapes that once blew up memory), words;
 *  - byte-level BPE like SmolLM2: the 256-character byte alphabet, merges.
 * Input byte 0 picks the vocabulary (bit 0), parse_special (bit 1) and add_bos
 * (bit 2); the rest is the text. Inputs of several MiB are allowed (ci/fuzz.sh
 * sets -max_len) so size-dependent blow-ups are reachable. Invariants:
 *  - every id is inside the vocabulary;
 *  - the text needs at least len / max_token_bytes ids (the engine refuses long
 *    prompts before tokenizing on that bound);
 *  - decoding id by id (dray_detok_push with a max_piece buffer, then flush) gives
 *    exactly dray_detokenize's text, and no push needs more than max_piece bytes.
 * Build and run: ci/fuzz.sh tokenizer SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_write.h"
#include "tokenizer.h"

static struct dray_tokenizer *spm, *bpe;

static struct dray_tokenizer *load(struct dray_gguf_writer *w)
{
    void *mem;
    size_t size;
    char err[512];
    struct dray_gguf *g = NULL;
    struct dray_tokenizer *t = NULL;
    if (dray_gguf_writer_to_mem(w, &mem, &size) ||
        dray_gguf_open_mem(mem, size, "vocab.gguf", &g, err, sizeof(err)) ||
        dray_tokenizer_load(g, &t, err, sizeof(err))) {
        fprintf(stderr, "fuzz_tokenizer: cannot build a vocabulary\n");
        abort();
    }
    dray_gguf_close(g);
    free(mem);
    dray_gguf_writer_free(w);
    return t;
}

#define SPM_MAX 400
static struct dray_tokenizer *build_spm(void)
{
    static char texts[SPM_MAX][40];
    const char *tok[SPM_MAX];
    float score[SPM_MAX];
    int32_t type[SPM_MAX];
    uint32_t n = 0;
    static const char *const control[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",
                                          "<end_of_turn>"};
    static const char *const words[] = {"\xE2\x96\x81", "a", "b", "e", "h", "l", "o", "t",
        "he", "ll", "hell", "hello", "\xE2\x96\x81hello", "\xE2\x96\x81the", "th", "the",
        "\xE2\x96\x81\xE2\x96\x81", "<", ">", "/", "\xE4\xB8\xAD", "\xC3\xA9"};
    static const char *const tags[] = {"<b>", "</b>", "<table>", "<td>", "</td>", "<br>"};
    for (size_t i = 0; i < 6; i++, n++)
        tok[n] = control[i], score[n] = 0, type[n] = i == 3 ? 2 : 3;
    for (int b = 0; b < 256; b++, n++) {
        snprintf(texts[n], sizeof(texts[n]), "<0x%02X>", b);
        tok[n] = texts[n], score[n] = 0, type[n] = 6;
    }
    for (int r = 1; r <= 31; r++)
        for (int c = 0; c < 2; c++, n++) {
            memset(texts[n], c ? '\t' : '\n', (size_t)r);
            texts[n][r] = 0;
            tok[n] = texts[n], score[n] = 0, type[n] = 4;
        }
    for (size_t i = 0; i < sizeof(tags) / sizeof(*tags); i++, n++)
        tok[n] = tags[i], score[n] = 0, type[n] = 4;
    for (size_t i = 0; i < sizeof(words) / sizeof(*words); i++, n++)
        tok[n] = words[i], score[n] = -(float)i, type[n] = 1;
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    dray_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    dray_gguf_add_arr_str(w, "tokenizer.ggml.tokens", tok, n);
    dray_gguf_add_arr(w, "tokenizer.ggml.scores", DRAY_GGUF_FLOAT32, score, n);
    dray_gguf_add_arr(w, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, type, n);
    dray_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 2);
    dray_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 1);
    dray_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 3);
    dray_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", true);
    dray_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", false);
    return load(w);
}

/* GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the others
 * for U+0100 upwards in byte order; written as UTF-8 into out. */
static void byte_char(int b, char *out)
{
    static int next_extra = 0;
    static int map[256];
    if (!next_extra) {
        for (int i = 0; i < 256; i++) {
            bool keep = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
            map[i] = keep ? i : 256 + next_extra++;
        }
    }
    int cp = map[b];
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

static struct dray_tokenizer *build_bpe(void)
{
    static char alpha[256][4];
    const char *tok[300];
    int32_t type[300];
    uint32_t n = 0;
    static const char *const control[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    /* merges over the alphabet: "Ġ" is space, "Ċ" newline */
    static const char *const merged[] = {"ab", "abc", "\xC4\xA0\x61", "\xC4\xA0\xC4\xA0",
                                         "\xC4\x8A\xC4\x8A", "th", "the", "\xC4\xA0the"};
    static const char *const merges[] = {"a b", "ab c", "\xC4\xA0 a", "\xC4\xA0 \xC4\xA0",
                                         "\xC4\x8A \xC4\x8A", "t h", "th e", "\xC4\xA0 the"};
    for (size_t i = 0; i < 3; i++, n++)
        tok[n] = control[i], type[n] = 3;
    for (int b = 0; b < 256; b++, n++) {
        byte_char(b, alpha[b]);
        tok[n] = alpha[b], type[n] = 1;
    }
    for (size_t i = 0; i < sizeof(merged) / sizeof(*merged); i++, n++)
        tok[n] = merged[i], type[n] = 1;
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    dray_gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
    dray_gguf_add_str(w, "tokenizer.ggml.pre", "gpt2");
    dray_gguf_add_arr_str(w, "tokenizer.ggml.tokens", tok, n);
    dray_gguf_add_arr(w, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, type, n);
    dray_gguf_add_arr_str(w, "tokenizer.ggml.merges", merges, sizeof(merges) / sizeof(*merges));
    dray_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 0);
    return load(w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    spm = build_spm();
    bpe = build_bpe();
    return 0;
}

/* Streams ids through dray_detok_push and compares with dray_detokenize. */
static void check_decode(const struct dray_tokenizer *t, const int32_t *ids, size_t n)
{
    char *whole = NULL;
    size_t whole_len = 0, max = dray_tokenizer_max_piece(t), at = 0;
    if (dray_detokenize(t, ids, n, &whole, &whole_len))
        return; /* out of memory */
    char *piece = malloc(max);
    struct dray_detok d;
    dray_detok_init(&d);
    for (size_t i = 0; piece && i <= n; i++) {
        size_t k = i < n ? dray_detok_push(&d, t, ids[i], piece, max) : dray_detok_flush(&d, piece, max);
        if (k > max || at + k > whole_len || memcmp(whole + at, piece, k)) {
            fprintf(stderr, "streamed text differs from dray_detokenize at id %zu\n", i);
            abort();
        }
        at += k;
    }
    if (piece && at != whole_len)
        abort();
    free(piece);
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const struct dray_tokenizer *t = data[0] & 1 ? bpe : spm;
    bool special = data[0] & 2, bos = data[0] & 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, n_ids = 0;
    int32_t *ids = NULL;
    if (dray_tokenize(t, text, len, bos, special, &ids, &n_ids))
        return 0; /* out of memory or over the size limit: refused, not a finding */
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= dray_tokenizer_n_vocab(t))
            abort();
    /* ids the flags add for no text (BOS, EOS): those of the empty text */
    int32_t *none = NULL;
    size_t n_added = 0;
    if (dray_tokenize(t, "", 0, bos, special, &none, &n_added) || n_added > n_ids)
        abort();
    free(none);
    size_t n_text = n_ids - n_added;
    if ((uint64_t)n_text * dray_tokenizer_max_token_bytes(t) < len) {
        fprintf(stderr, "%zu bytes in %zu ids of at most %u bytes\n", len, n_text,
                dray_tokenizer_max_token_bytes(t));
        abort();
    }
    check_decode(t, ids, n_ids);
    free(ids);
    return 0;
}
