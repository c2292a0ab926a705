/* Byte-level BPE (GPT-2 style, tokenizer.ggml.model = "gpt2"), the part of the
 * tokenizer that turns one raw text fragment (no special tokens in it: the
 * special-token partition in tokenizer.c ran first) into ids:
 *
 *  1. pre-tokenize: the regexes tokenizer.ggml.pre names (PCRE2, UTF + Unicode
 *     properties) cut the fragment into words; each regex splits every piece of
 *     the previous one, and both matches and the text between matches are kept
 *     as pieces (what llama.cpp's unicode_regex_split does);
 *  2. each word's bytes are mapped to GPT-2's printable code points (byte b ->
 *     itself when printable, else 256 + n for the n-th unprintable byte);
 *  3. the word's characters are merged pairwise, lowest merge rank first
 *     (tokenizer.ggml.merges: "left right", rank = index), leftmost first on
 *     ties; pre-tokenizers with ignore_merges (llama-bpe) take a whole word
 *     that is a vocabulary token as is;
 *  4. each final symbol is its vocabulary id; one that is not (cannot happen in
 *     a consistent vocabulary) is emitted character by character.
 * Supported pre-tokenizers: "gpt2", "smollm" (also "refact", "starcoder"),
 * "llama-bpe" (also "llama3", "llama-v3"), "dbrx" and "smaug-bpe" (Llama 3's
 * regex without ignore_merges), "qwen2"; any other is a DRAY_ENOTSUP error
 * naming it. */
#ifndef DRAY_CORE_TOKENIZER_BPE_H
#define DRAY_CORE_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

struct dray_gguf;
struct dray_tokenizer;
struct dray_bpe;

/* Build from g's tokenizer.ggml.pre and tokenizer.ggml.merges; ids come from
 * t (its vocabulary must be loaded). */
int dray_bpe_load(const struct dray_gguf *g, const struct dray_tokenizer *t, struct dray_bpe **out,
                  char *err, size_t errlen);
void dray_bpe_free(struct dray_bpe *b);

/* Tokenize s[0..n) (any bytes), calling push(user, id) for each id in order.
 * Returns 0, DRAY_ENOMEM, or push's first non-zero return. */
int dray_bpe_encode(const struct dray_bpe *b, const char *s, size_t n,
                    int (*push)(void *user, int32_t id), void *user);

/* A token text in GPT-2's byte alphabet back to raw bytes: out[0..return) (out
 * holds at least n bytes; characters outside the alphabet are copied as is). */
size_t dray_bpe_decode(const char *s, size_t n, uint8_t *out);

#endif
