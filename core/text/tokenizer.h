/* Tokenizer and streaming detokenizer, built from GGUF metadata (tokenizer.ggml.*).
 * Supported: tokenizer.ggml.model = "llama" (SentencePiece vocabulary, merged by
 * score as llama.cpp's SPM tokenizer does). Facts and the algorithm:
 * docs/reference/gemma3-gguf.md §6.
 *
 * Tokenizing is two passes:
 *  1. special-token partition: tokens of type CONTROL, UNKNOWN (only when
 *     parse_special) and USER_DEFINED (always) are cut out of the raw text wherever
 *     their exact text occurs, longest token first (ties: lower id first), each
 *     token's occurrences left to right without overlap;
 *  2. every remaining raw fragment: (a space is prepended if add_space_prefix and
 *     the fragment starts the text or follows a special token,) each ' ' becomes
 *     U+2581 "▁", the text is cut
 *     into UTF-8 characters, and adjacent symbols are merged best-score first while
 *     the merge is a vocabulary token; a final symbol that is not a token is
 *     emitted as byte tokens "<0xXX>" (or the 1-byte token, or unknown_token_id).
 * No Unicode normalization is applied. */
/* The calls a tool needs without an engine (load, tokenize, token text,
 * detokenize) are public in dray/tokenizer.h; the rest is core's. */
#ifndef DRAY_CORE_TOKENIZER_H
#define DRAY_CORE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/tokenizer.h"

/* GGUF token types (tokenizer.ggml.token_type). */
enum dray_token_type {
    DRAY_TOKEN_NORMAL = 1,
    DRAY_TOKEN_UNKNOWN = 2,
    DRAY_TOKEN_CONTROL = 3,
    DRAY_TOKEN_USER_DEFINED = 4,
    DRAY_TOKEN_UNUSED = 5,
    DRAY_TOKEN_BYTE = 6,
};

uint32_t dray_tokenizer_n_vocab(const struct dray_tokenizer *t);
int32_t dray_tokenizer_bos(const struct dray_tokenizer *t); /* -1 if none */
int32_t dray_tokenizer_eos(const struct dray_tokenizer *t); /* -1 if none */
/* tokenizer.ggml.eot_token_id, else the id of "<end_of_turn>", else -1. */
int32_t dray_tokenizer_eot(const struct dray_tokenizer *t);
/* End of generation: eos, eot, and tokenizer.ggml.eom_token_id if present. (Text
 * heuristics such as "</s>" are deliberately not used: in Gemma 3 "</s>" is a
 * user-defined HTML strike-through tag, id 212, not an end marker.) */
bool dray_tokenizer_is_eog(const struct dray_tokenizer *t, int32_t id);
/* The distinct end-of-generation ids into out; returns how many (0..3). */
size_t dray_tokenizer_eog_ids(const struct dray_tokenizer *t, int32_t out[3]);
/* Token type (enum dray_token_type), 0 for an id out of range. */
int dray_tokenizer_type(const struct dray_tokenizer *t, int32_t id);
/* Id of exactly this token text, or -1. */
int32_t dray_tokenizer_find(const struct dray_tokenizer *t, const char *text, size_t len);

/* ---------------------------------------------------------------- detokenizer */
/* Streaming detokenizer. Each token's piece: NORMAL -> text with "▁" as ' ';
 * BYTE -> its one byte; USER_DEFINED -> text verbatim; CONTROL, UNKNOWN, UNUSED ->
 * nothing. The bytes are then passed through a UTF-8 gate: only complete
 * well-formed characters come out; a character split across tokens (byte
 * fallback) is held back until complete; an ill-formed sequence becomes one
 * U+FFFD per maximal subpart instead of being dropped. State is this small struct,
 * owned by the caller; no allocation. */
struct dray_detok {
    uint8_t pend[4]; /* bytes of an incomplete character, pend[0..n) */
    uint8_t n;
};

void dray_detok_init(struct dray_detok *d);
/* Append token id's piece. Writes the complete text now ready into out and returns
 * its length. If that length exceeds cap, nothing is written, the state is
 * unchanged and the (larger than cap) needed size is returned, like snprintf: grow
 * out and push the same id again. An out of dray_tokenizer_max_piece(t) bytes is
 * always enough. An id out of range yields U+FFFD. */
size_t dray_detok_push(struct dray_detok *d, const struct dray_tokenizer *t, int32_t id, char *out,
                       size_t cap);
/* One token's piece as raw bytes (no UTF-8 gate): snprintf's contract, nothing
 * for an id out of range. */
size_t dray_tokenizer_token_bytes(const struct dray_tokenizer *t, int32_t id, char *out, size_t cap);
/* End of stream: an incomplete held-back character becomes U+FFFD. Needs at most
 * 3 bytes (same return contract as push). */
size_t dray_detok_flush(struct dray_detok *d, char *out, size_t cap);
/* Most input bytes one token can stand for: a text longer than n tokens times this
 * cannot fit in n tokens, so callers can refuse it before tokenizing. */
uint32_t dray_tokenizer_max_token_bytes(const struct dray_tokenizer *t);
/* Upper bound of one push's output for this vocabulary. */
size_t dray_tokenizer_max_piece(const struct dray_tokenizer *t);

#endif
