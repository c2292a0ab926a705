/* The .kld log-probability format and the per-position math of perplexity and
 * KL divergence (kld.h). */
#include "kld.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char magic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};

/* Below this log-probability the base row stores 0 and KL ignores the token:
 * e^-16 is 1e-7 of the top probability. */
#define LOGIT_RANGE 16.0f

int dray_kld_write_header(FILE *f, const char *path, const struct dray_kld_header *h)
{
    int32_t dims[3] = {h->n_ctx, h->n_vocab, h->n_chunk};
    size_t n_tok = (size_t)h->n_ctx * (size_t)h->n_chunk;
    if (fwrite(magic, 1, 8, f) != 8 || fwrite(dims, sizeof(int32_t), 3, f) != 3 ||
        fwrite(h->tokens, sizeof(int32_t), n_tok, f) != n_tok) {
        fprintf(stderr, "dray: writing %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

int dray_kld_read_header(FILE *f, const char *path, struct dray_kld_header *h)
{
    char m[8];
    int32_t dims[3];
    memset(h, 0, sizeof(*h));
    if (fread(m, 1, 8, f) != 8 || memcmp(m, magic, 8)) {
        fprintf(stderr, "dray: %s is not a log-probability file (no \"_logits_\" at the start)\n", path);
        return 1;
    }
    if (fread(dims, sizeof(int32_t), 3, f) != 3) {
        fprintf(stderr, "dray: %s: truncated header (n_ctx, n_vocab, n_chunk)\n", path);
        return 1;
    }
    /* n_ctx >= 4 leaves at least one scored row; the caps keep the token array
     * (n_chunk * n_ctx int32) below 1 GiB whatever the file says */
    if (dims[0] < 4 || dims[0] > (1 << 24) || dims[1] < 2 || dims[1] > (1 << 24) || dims[2] < 1 ||
        (int64_t)dims[0] * dims[2] > (1 << 28)) {
        fprintf(stderr, "dray: %s: implausible header: n_ctx %d, n_vocab %d, n_chunk %d\n", path,
                dims[0], dims[1], dims[2]);
        return 1;
    }
    h->n_ctx = dims[0];
    h->n_vocab = dims[1];
    h->n_chunk = dims[2];
    size_t n_tok = (size_t)h->n_ctx * (size_t)h->n_chunk;
    h->tokens = malloc(n_tok * sizeof(int32_t));
    if (!h->tokens || fread(h->tokens, sizeof(int32_t), n_tok, f) != n_tok) {
        fprintf(stderr, "dray: %s: %s reading %zu tokens\n", path, h->tokens ? "file ends" : "out of memory", n_tok);
        free(h->tokens);
        h->tokens = NULL;
        return 1;
    }
    return 0;
}

double dray_log_sum_exp(const float *x, uint32_t n, float *max, uint32_t *imax)
{
    uint32_t im = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[im])
            im = i;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - x[im]);
    if (max)
        *max = x[im];
    if (imax)
        *imax = im;
    return x[im] + log(sum);
}

double dray_kld_encode(const float *logits, uint32_t n_vocab, int32_t tok, uint16_t *row)
{
    float max, lo = logits[0];
    double lse = dray_log_sum_exp(logits, n_vocab, &max, NULL);
    for (uint32_t i = 1; i < n_vocab; i++)
        lo = logits[i] < lo ? logits[i] : lo;
    lo = lo > max - LOGIT_RANGE ? lo : max - LOGIT_RANGE;
    float head[2] = {(max - lo) / 65535.0f, (float)(lo - lse)}; /* scale, min_log_prob */
    memcpy(row, head, sizeof(head));
    uint16_t *q = row + 4;
    memset(q, 0, (DRAY_KLD_ROW_WORDS(n_vocab) - 4) * sizeof(uint16_t));
    if (head[0] > 0) {
        float inv = 1.0f / head[0];
        for (uint32_t i = 0; i < n_vocab; i++)
            if (logits[i] > lo) {
                long v = lrintf(inv * (logits[i] - lo));
                q[i] = (uint16_t)(v > 65535 ? 65535 : v);
            }
    }
    return lse - logits[tok];
}

void dray_kld_compare(const float *logits, uint32_t n_vocab, const uint16_t *row, int32_t tok,
                      struct dray_kld_pos *out)
{
    float head[2];
    memcpy(head, row, sizeof(head));
    const uint16_t *q = row + 4;
    uint32_t imax, ibase = 0;
    double lse = dray_log_sum_exp(logits, n_vocab, NULL, &imax), kl = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        double lpb = (double)head[0] * q[i] + head[1];
        if (q[i] > q[ibase])
            ibase = i;
        if (lpb > -LOGIT_RANGE)
            kl += exp(lpb) * (lpb - (logits[i] - lse));
    }
    out->nll = lse - logits[tok];
    out->nll_base = -((double)head[0] * q[tok] + head[1]);
    out->kl = kl;
    out->same_top = imax == ibase;
}
