/*
 * dray/tokenizer.h — a model's tokenizer without an engine: load it from a GGUF
 * file's metadata, tokenize, read token texts, detokenize. Public so that tools
 * (dray tokenize, reference checks) need neither a device nor the weights.
 * The algorithm and its facts are described in core/text/tokenizer.h.
 */
#ifndef DRAY_TOKENIZER_H
#define DRAY_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct dray_gguf;      /* dray/gguf.h */
struct dray_tokenizer;

/* Build a tokenizer from g's metadata. Everything needed is copied: g may be
 * closed afterwards. On failure *out is NULL and err names the key and problem
 * (DRAY_ENOTSUP for an unsupported tokenizer.ggml.model, DRAY_EFORMAT for
 * malformed arrays or ids out of range, DRAY_ENOTFOUND for missing tokens). */
int dray_tokenizer_load(const struct dray_gguf *g, struct dray_tokenizer **out, char *err,
                        size_t errlen);
void dray_tokenizer_free(struct dray_tokenizer *t);

/* Tokenize text[0..len) (any bytes; ill-formed UTF-8 goes through byte fallback).
 * add_bos: prepend BOS if the metadata says tokenizer.ggml.add_bos_token (default
 * true for "llama"); likewise EOS if add_eos_token. parse_special: match CONTROL and
 * UNKNOWN token texts such as "<start_of_turn>" (USER_DEFINED ones always match).
 * *ids is malloc'd (non-NULL even when *n_ids == 0); the caller frees it.
 * Returns 0, DRAY_EINVAL, DRAY_ENOMEM or DRAY_ERANGE (more than INT32_MAX bytes). */
int dray_tokenize(const struct dray_tokenizer *t, const char *text, size_t len, bool add_bos,
                  bool parse_special, int32_t **ids, size_t *n_ids);

/* Raw token text as stored (with "▁", "<0x41>", "<bos>"), NOT NUL-terminated;
 * NULL (and *len 0) for an id out of range. len may be NULL. */
const char *dray_tokenizer_text(const struct dray_tokenizer *t, int32_t id, size_t *len);

/* Convenience: detokenize a whole sequence into a malloc'd NUL-terminated string
 * (*len without the NUL). Returns 0 or DRAY_ENOMEM. */
int dray_detokenize(const struct dray_tokenizer *t, const int32_t *ids, size_t n, char **text,
                    size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* DRAY_TOKENIZER_H */
