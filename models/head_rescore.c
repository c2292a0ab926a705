/* The rescored output head (see decoder.h, struct dec_rescore): a 4-bit head
 * (DRAY_Q4G32, 6 bits a weight with its scale and min, against the 8-bit
 * table's 9) computes every logit of a row, then its most likely tokens are
 * computed again from the 8-bit table the embedding gather keeps anyway, and
 * replace the 4-bit values.
 *
 * How many: a token left with 4-bit noise e costs about p e^2 / 2 of KL
 * divergence, so what the 4-bit logits cost is the probability left to them. So
 * the candidates are the 4-bit head's most likely tokens until what is left holds
 * at most `tail` of its probability (at least DEC_RESCORE_MIN, at most `max`): a
 * peaked row takes a few dozen, a flat one thousands. The 8-bit table is stored
 * as group rows (DRAY_WROLE_GROUP_ROWS), so a candidate reads only its own row
 * (rescore_bytes in decoder.c). The numbers: docs/performance.md, "The output
 * head's precision".
 *
 * The device work is ops of the operator table, so every plugin that runs the
 * 4-bit head runs this too: EMBED gathers the candidates' rows of the 8-bit table
 * as F32 (dec_embed; scale 1: the table itself, not Gemma's sqrt(d) input
 * scaling), and an F32 MATMUL multiplies them by the row's normed hidden state
 * (unquantized: these logits are the 8-bit weights' exact ones). The selection
 * runs on the host over the downloaded logits, which the caller reads there. */
#include "decoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "host_clones.h"
#include "log.h"
#include "sampler.h"

/* The selection's histogram: buckets of 1/4 nat below the row's largest logit,
 * 32 nats deep (262144 tokens 32 nats down hold 3e-9 of the probability). */
#define BUCKETS_PER_NAT 4.0f
#define N_BUCKETS 128u

int dec_rescore_init(struct dray_model *m, uint32_t max, float tail, char *err, size_t errlen)
{
    struct dec_rescore *r = &m->rescore;
    const struct dray_ops *ops = m->dev->ops;
    const struct dray_model_info *in = &m->info;
    r->max = max < DEC_RESCORE_MIN ? DEC_RESCORE_MIN : max;
    r->max = r->max < in->n_vocab ? r->max : in->n_vocab;
    r->tail = tail;
    struct { struct dray_buf **buf; size_t bytes; } want[] = {
        {&r->rows, (size_t)r->max * in->n_embd * 4}, {&r->out, (size_t)r->max * 4}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        int rc = ops->alloc(m->dev->ctx, want[i].bytes, want[i].buf);
        if (rc)
            return dray_fail(err, errlen, rc, "device memory for the rescored head (%zu bytes) on %s: %s",
                             want[i].bytes, ops->name, ops->last_error(m->dev->ctx));
    }
    r->ids_host = malloc((size_t)r->max * sizeof(int32_t));
    r->out_host = malloc((size_t)r->max * sizeof(float));
    r->bucket = malloc(in->n_vocab);
    if (!r->ids_host || !r->out_host || !r->bucket)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    return 0;
}

void dec_rescore_free(struct dray_model *m)
{
    struct dec_rescore *r = &m->rescore;
    if (m->info.rescore_rows)
        dray_debug("rescored head: %llu rows of logits, %.1f candidates a row",
                   (unsigned long long)m->info.rescore_rows,
                   (double)m->info.rescore_candidates / (double)m->info.rescore_rows);
    struct dray_buf *bufs[] = {r->rows, r->out};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            m->dev->ops->free(m->dev->ctx, bufs[i]);
    free(r->ids_host);
    free(r->out_host);
    free(r->bucket);
    memset(r, 0, sizeof(*r));
}

/* Each token's bucket into bk (N_BUCKETS: none, for NaN and -inf too) and
 * their counts into cnt[0..N_BUCKETS). */
DRAY_HOST_CLONES static void bucket_counts(const float *x, uint32_t n, float top, uint8_t *bk, uint32_t *cnt)
{
    uint32_t i;
    for (i = 0; i < n; i++) {
        float t = (top - x[i]) * BUCKETS_PER_NAT;
        bk[i] = t < (float)N_BUCKETS ? (uint8_t)t : (uint8_t)N_BUCKETS;
    }
    uint32_t cnt4[4][N_BUCKETS + 1] = {{0}}; /* four tables: no store-to-load chains */
    for (i = 0; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            cnt4[j][bk[i + j]]++;
    for (; i < n; i++)
        cnt4[0][bk[i]]++;
    for (uint32_t b = 0; b < N_BUCKETS; b++)
        cnt[b] = cnt4[0][b] + cnt4[1][b] + cnt4[2][b] + cnt4[3][b];
}

/* The first (at most max) tokens whose bucket is below B, into idx; returns
 * how many. Most are not: a block of 32 is skipped after one vectorized min. */
DRAY_HOST_CLONES static uint32_t below(const uint8_t *bk, uint32_t n, uint8_t B, uint32_t max, int32_t *idx)
{
    uint32_t k = 0, t = 0;
    for (; t + 32 <= n && k < max; t += 32) {
        const uint8_t *b = bk + t; /* the block's smallest bucket: a byte min, which vectorizes */
        uint8_t lo = UINT8_MAX;
        for (int j = 0; j < 32; j++)
            lo = b[j] < lo ? b[j] : lo;
        if (lo >= B)
            continue;
        for (uint32_t j = t; j < t + 32 && k < max; j++)
            if (bk[j] < B)
                idx[k++] = (int32_t)j;
    }
    for (; t < n && k < max; t++)
        if (bk[t] < B)
            idx[k++] = (int32_t)t;
    return k;
}

/* The candidates of one row x[0..n): every token whose logit is less than B/4
 * nats below the largest, B the fewest buckets that leave at most `tail` of the
 * probability outside (from bucket counts, each bucket's tokens taken at its
 * middle: within e^(1/8) of the truth), widened to at least DEC_RESCORE_MIN
 * tokens and narrowed to at most max. NaN logits are never candidates. Returns
 * the count written to idx. Each token's bucket is computed once into bk (one
 * byte each, N_BUCKETS meaning none): the passes over the row then vectorize. */
static uint32_t candidates(const float *x, uint32_t n, float tail, uint32_t max, uint8_t *bk,
                           int32_t *idx)
{
    uint32_t cnt[N_BUCKETS];
    bucket_counts(x, n, dray_max_f32(x, n), bk, cnt);
    double w[N_BUCKETS], z = 0, left = 0;
    for (uint32_t b = 0; b < N_BUCKETS; b++)
        z += w[b] = cnt[b] * exp(-(b + 0.5) / BUCKETS_PER_NAT);
    uint32_t B = N_BUCKETS, count = 0;
    while (B > 1 && left + w[B - 1] <= tail * z)
        left += w[--B];
    for (uint32_t b = 0; b < B; b++)
        count += cnt[b];
    while (count < DEC_RESCORE_MIN && B < N_BUCKETS)
        count += cnt[B++];
    while (count > max && B > 1)
        count -= cnt[--B];
    return below(bk, n, (uint8_t)B, max, idx);
}

int dec_rescore(struct dray_model *m, uint32_t n, float *logits)
{
    struct dec_rescore *r = &m->rescore;
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const uint32_t V = m->info.n_vocab, d = m->info.n_embd;
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        float *row = logits + (size_t)i * V;
        uint32_t k = candidates(row, V, r->tail, r->max, r->bucket, r->ids_host);
        if (k == 0)
            continue; /* a row of NaN: nothing to rescore */
        /* rows[j] = table[ids[j]] as f32: exactly the 8-bit head's weights */
        rc = dec_embed(m, r->ids_host, (struct dray_view){0}, k, dec_at(r->rows, 0), 1.0f);
        /* out[j] = rows[j] . xl[i] in f32 */
        struct dray_matmul_args a = {
            .x = dec_at(m->a.xl, (size_t)i * d), .w = dec_at(r->rows, 0), .out = dec_at(r->out, 0),
            .n_tok = 1, .n_out = k, .k = d, .stride_x = d, .stride_out = k, .wdtype = DRAY_F32,
        };
        if (!rc)
            rc = ops->matmul(ctx, &a);
        if (!rc)
            rc = ops->download(ctx, r->out_host, dec_at(r->out, 0), (size_t)k * 4);
        for (uint32_t j = 0; j < k && !rc; j++)
            row[r->ids_host[j]] = r->out_host[j];
        m->info.rescore_rows++;
        m->info.rescore_candidates += k;
    }
    return rc;
}
