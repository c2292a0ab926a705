/* Log-probability files in llama.cpp's `.kld` layout (written by
 * `llama-perplexity --kl-divergence-base FILE`), so a base made by either program
 * can be read by the other. All values little-endian, as written on x86/ARM:
 *
 *   char    magic[8] = "_logits_"
 *   int32   n_ctx, n_vocab, n_chunk
 *   int32   tokens[n_chunk * n_ctx]     the text as tokenized (BOS first); the
 *                                       first token of each chunk is evaluated as BOS
 *   then per chunk, n_ctx - 1 - n_ctx/2 rows (positions n_ctx/2 .. n_ctx-2, each
 *   predicting the next token), each row DRAY_KLD_ROW_WORDS(n_vocab) uint16:
 *     float   scale, min_log_prob       (the first 4 uint16 words)
 *     uint16  q[n_vocab] (+ one zero word when n_vocab is odd)
 *   log p[i] = scale * q[i] + min_log_prob. The row's logits are mapped onto
 *   0..65535 between max(min logit, max logit - 16) and the max logit, rounded to
 *   nearest; logits at or below that floor get q = 0. */
#ifndef DRAY_TOOLS_KLD_H
#define DRAY_TOOLS_KLD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define DRAY_KLD_ROW_WORDS(n_vocab) (2 * (((size_t)(n_vocab) + 1) / 2) + 4)

struct dray_kld_header {
    int32_t n_ctx, n_vocab, n_chunk;
    int32_t *tokens;          /* [n_chunk * n_ctx], malloc'd by dray_kld_read_header */
};

/* Scored rows per chunk of n_ctx tokens (the second half, as llama-perplexity). */
static inline uint32_t dray_kld_rows(uint32_t n_ctx)
{
    return n_ctx - 1 - n_ctx / 2;
}

/* 0, or 1 with a message naming path on stderr. */
int dray_kld_write_header(FILE *f, const char *path, const struct dray_kld_header *h);
int dray_kld_read_header(FILE *f, const char *path, struct dray_kld_header *h);
/* Encode one row of logits into row [DRAY_KLD_ROW_WORDS(n_vocab)]; returns the
 * negative log-likelihood of token tok under those logits. */
double dray_kld_encode(const float *logits, uint32_t n_vocab, int32_t tok, uint16_t *row);

/* One scored position compared with its base row. */
struct dray_kld_pos {
    double nll, nll_base;     /* -log p(tok): this run, the base */
    double kl;                /* sum over base p_i of p_i (log p_i - log q_i) */
    bool same_top;            /* argmax of the logits == argmax of the base row */
};
void dray_kld_compare(const float *logits, uint32_t n_vocab, const uint16_t *row, int32_t tok,
                      struct dray_kld_pos *out);

/* log(sum exp(x)) over n values, with the largest value and its first index. */
double dray_log_sum_exp(const float *x, uint32_t n, float *max, uint32_t *imax);

#endif
