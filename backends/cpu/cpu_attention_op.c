/* KV store and paged attention: argument checks (pool layout, sequence table,
 * block table entries the mask reaches) and the split into work items. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_internal.h"

/* The pool, checked by the shared validator: its four views are p[0..3]. */
static void pool_of(const struct dray_kv_pool *p, void *const *v, struct dray_cpu_kv *out)
{
    memset(out, 0, sizeof(*out));
    out->k = v[0];
    out->v = v[1];
    out->k_scale = v[2];
    out->v_scale = v[3];
    out->is_i8 = p->dtype == DRAY_I8;
    out->n_kv_head = p->n_kv_head;
    out->head_dim = p->head_dim;
    out->block_size = p->block_size;
    out->n_slots = p->n_slots;
}

/* ---------------------------------------------------------------- kv store */

struct store_job {
    struct dray_ctx *ctx;
    struct dray_cpu_kv_store k;
};

static void store_body(void *arg, uint32_t i0, uint32_t i1, uint32_t ith)
{
    (void)ith;
    struct store_job *j = arg;
    j->ctx->k.kv_store(&j->k, i0, i1);
}

int dray_cpu_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "kv_store: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    CHECK(dray_cpu_args(ctx, dray_util_check_kv_store(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    struct dray_cpu_kv pool;
    pool_of(a->pool, p, &pool);
    uint64_t row = (uint64_t)pool.n_kv_head * pool.head_dim;
    void *k = p[4], *v = p[5];
    const int32_t *s = p[6];
    CHECK(dray_util_check_slots(s, a->n_tok, pool.n_slots, ctx->err, sizeof(ctx->err)));
    struct store_job j = {ctx, {k, v, s, &pool, a->stride_k, a->stride_v}};
    dray_cpu_parallel(ctx, a->n_tok, 1, (double)a->n_tok * row * 8, store_body, &j);
    return 0;
}

/* ---------------------------------------------------------------- attention */

/* Check one sequence's entry and the block-table entries its mask reaches. */
static int check_seq(struct dray_ctx *ctx, const struct dray_attention_args *a, const struct dray_cpu_kv *p,
                     const int32_t *sq, uint32_t s)
{
    int32_t n_q = sq[1], kv_len = sq[2], bt_start = sq[3];
    CHECK(dray_util_check_seq(a, sq, s, ctx->err, sizeof(ctx->err)));
    if (n_q == 0)
        return 0;
    uint32_t first_pos = (uint32_t)(kv_len - n_q);
    uint32_t lo = dray_cpu_att_lo(first_pos, a->window);
    uint64_t b0 = lo / p->block_size, b1 = ((uint32_t)kv_len - 1) / p->block_size; /* blocks reached */
    uint64_t end = ((uint64_t)bt_start + b1 + 1) * 4;                              /* bytes of the table used */
    void *btp;
    CHECK(dray_cpu_view(ctx, "attention block_table", a->block_table, end, 4, &btp));
    const int32_t *bt = (const int32_t *)btp + bt_start;
    uint32_t n_blocks = p->n_slots / p->block_size;
    for (uint64_t b = b0; b <= b1; b++)
        if (bt[b] < 0 || (uint32_t)bt[b] >= n_blocks)
            return dray_cpu_fail(ctx, DRAY_EINVAL,
                                 "attention: seq %u block %llu (block_table[%llu] = %d) is reached by the mask "
                                 "but not in [0, %u)",
                                 s, (unsigned long long)b, (unsigned long long)(bt_start + b), bt[b], n_blocks);
    return 0;
}

struct att_job {
    struct dray_ctx *ctx;
    struct dray_cpu_attention k;
    char *scratch;       /* per-thread areas of per_thread bytes */
    size_t per_thread;
    atomic_uint next;    /* next work item to take */
};

static void att_task(void *arg, uint32_t ith, uint32_t nth)
{
    (void)nth;
    struct att_job *j = arg;
    void *scratch = j->scratch + ith * j->per_thread;
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->k.n_item)
            break;
        j->ctx->k.attention(&j->k, i, i + 1, scratch);
    }
}

/* A decode row's keys are cut into chunks of at least ATT_CHUNK_MIN keys, as
 * many as make ATT_ITEMS_PER_THREAD items a thread (flash decoding: MQA's one
 * kv head would otherwise run on one thread). */
#define ATT_ITEMS_PER_THREAD 2u
#define ATT_CHUNK_MIN 128u
#define ATT_MAX_CHUNKS 64u /* merge_chunks' weights array */
/* Sequences with at most this many new rows (a decode step, with lookup drafts
 * of up to 32 tokens verified in it) are decode rows: each row long enough to
 * be cut is an item of its own. */
#define ATT_DECODE_ROWS 33u

/* Key chunks of the decode row at position pos (cpu_kernels.h,
 * dray_cpu_att_chunk), from its own length, the model's kv heads and the
 * thread count only, never from the rows or sequences beside it: a row gives
 * the same bits alone, among lookup drafts or in a batch (a chunked row's
 * merge rounds differently from a whole one). */
static uint32_t row_chunks(uint32_t pos, uint32_t window, uint32_t n_kv_head, uint32_t n_threads)
{
    uint32_t want = (ATT_ITEMS_PER_THREAD * n_threads + n_kv_head - 1) / n_kv_head; /* a row's items */
    if (n_threads < 2 || want < 2)
        return 1;
    uint32_t len = pos + 1 - dray_cpu_att_lo(pos, window);
    uint32_t n = len / ATT_CHUNK_MIN < want ? len / ATT_CHUNK_MIN : want;
    n = n < ATT_MAX_CHUNKS ? n : ATT_MAX_CHUNKS;
    if (n < 2)
        return 1;
    uint32_t cs = dray_cpu_att_chunk_len(len, n);
    return (len + cs - 1) / cs;
}

/* Items (seq, query rows [r0, r1), kv head, key chunk c of n) into item, or
 * only counted when item is NULL; *cut tells whether any row is chunked. A
 * sequence's cut rows are its last ones (a row's keys grow with it): each
 * alone, largest first, then the rest in blocks of DRAY_CPU_ATT_QBLOCK rows,
 * last to first. Under the causal mask a later block sees more keys, so the
 * threads take the big items first and end on small ones (a single-sequence
 * prefill otherwise finishes on its most expensive item). The chunks of one
 * row and kv head are consecutive (merge_chunks). */
static uint64_t list_items(uint32_t (*item)[6], const int32_t *seqs, uint32_t n_seq, uint32_t n_kv_head,
                           uint32_t window, uint32_t n_threads, int *cut)
{
    uint64_t n = 0;
    *cut = 0;
    for (uint32_t s = 0; s < n_seq; s++) {
        uint32_t n_q = (uint32_t)seqs[4 * s + 1], first = (uint32_t)seqs[4 * s + 2] - n_q, whole = n_q;
        while (n_q <= ATT_DECODE_ROWS && whole > 0 && row_chunks(first + whole - 1, window, n_kv_head, n_threads) > 1)
            whole--;
        for (uint32_t r = n_q; r-- > whole;) {
            uint32_t nc = row_chunks(first + r, window, n_kv_head, n_threads);
            *cut = 1;
            for (uint32_t g = 0; g < n_kv_head; g++)
                for (uint32_t c = 0; c < nc; c++, n++)
                    if (item)
                        memcpy(item[n], (uint32_t[6]){s, r, r + 1, g, c, nc}, sizeof(item[n]));
        }
        for (uint32_t nb = (whole + DRAY_CPU_ATT_QBLOCK - 1) / DRAY_CPU_ATT_QBLOCK; nb-- > 0;) {
            uint32_t r = nb * DRAY_CPU_ATT_QBLOCK, r1 = r + DRAY_CPU_ATT_QBLOCK < whole ? r + DRAY_CPU_ATT_QBLOCK : whole;
            for (uint32_t g = 0; g < n_kv_head; g++, n++)
                if (item)
                    memcpy(item[n], (uint32_t[6]){s, r, r1, g, 0, 1}, sizeof(item[n]));
        }
    }
    return n;
}

/* out of each chunked row: sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c per
 * query head, M the largest m_c (a chunk with nothing visible has m = -inf). */
static void merge_chunks(const struct dray_cpu_attention *k, uint32_t group, uint32_t hd)
{
    for (uint32_t i = 0; i < k->n_item;) {
        uint32_t n = k->item[i][5];
        if (n == 1) {
            i++;
            continue;
        }
        const int32_t *sq = k->seqs + (size_t)k->item[i][0] * 4;
        size_t t = (size_t)sq[0] + k->item[i][1];
        for (uint32_t h = 0; h < group; h++) {
            float M = -INFINITY, L = 0.0f, w[ATT_MAX_CHUNKS];
            for (uint32_t c = 0; c < n; c++) {
                float m = k->part[(i + c) * k->part_stride + (size_t)group * hd + h];
                M = m > M ? m : M;
            }
            for (uint32_t c = 0; c < n; c++) {
                const float *pc = k->part + (i + c) * k->part_stride;
                float m = pc[(size_t)group * hd + h];
                w[c] = m == -INFINITY ? 0.0f : expf(m - M);
                L += w[c] * pc[(size_t)group * (hd + 1) + h];
            }
            float inv = L > 0.0f ? 1.0f / L : 0.0f;
            float *o = k->out + t * k->stride_out + (size_t)(k->item[i][3] * group + h) * hd;
            for (uint32_t d = 0; d < hd; d++) {
                float v = 0.0f;
                for (uint32_t c = 0; c < n; c++)
                    v += w[c] * k->part[(i + c) * k->part_stride + (size_t)h * hd + d];
                o[d] = v * inv;
            }
        }
        i += n;
    }
}

int dray_cpu_attention(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    ctx->err[0] = '\0';
    if (!a)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "attention: NULL args");
    struct dray_util_needs nd;
    void *p[DRAY_UTIL_MAX_NEEDS];
    CHECK(dray_cpu_args(ctx, dray_util_check_attention(a, &nd, ctx->err, sizeof(ctx->err)), &nd, p));
    struct dray_cpu_kv pool;
    pool_of(a->pool, p, &pool);
    void *q = p[4], *out = p[5], *seqs = p[6];
    const int32_t *sq = seqs;
    for (uint32_t s = 0; s < a->n_seq; s++)
        CHECK(check_seq(ctx, a, &pool, sq + 4 * s, s));
    if (!a->block_table.buf)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "attention block_table: NULL buffer");

    int cut;
    uint64_t n_all = list_items(NULL, sq, a->n_seq, pool.n_kv_head, a->window, ctx->n_threads, &cut);
    if (n_all == 0)
        return 0;
    if (n_all > UINT32_MAX / 64)
        return dray_cpu_fail(ctx, DRAY_ERANGE, "attention: %llu work items", (unsigned long long)n_all);
    uint32_t n_item = (uint32_t)n_all, group = a->n_head / pool.n_kv_head;
    size_t items_bytes = ((size_t)n_item * 24 + 63) & ~(size_t)63;
    size_t part_stride = (size_t)group * (pool.head_dim + 2);
    size_t part_bytes = cut ? ((size_t)n_item * part_stride * sizeof(float) + 63) & ~(size_t)63 : 0;
    size_t per = (dray_cpu_attention_scratch(a->max_kv_len, pool.head_dim, DRAY_CPU_ATT_QBLOCK * group) + 63) &
                 ~(size_t)63;
    char *s = dray_cpu_scratch(ctx, items_bytes + part_bytes + per * ctx->n_threads);
    if (!s)
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "attention: no memory for scratch");
    uint32_t(*item)[6] = (uint32_t(*)[6])s;
    list_items(item, sq, a->n_seq, pool.n_kv_head, a->window, ctx->n_threads, &cut);

    struct att_job j = {ctx, {0}, s + items_bytes + part_bytes, per, 0};
    j.k = (struct dray_cpu_attention){.q = q, .out = out, .seqs = sq,
                                      .block_table = (const int32_t *)((char *)a->block_table.buf->p + a->block_table.offset),
                                      .pool = &pool, .n_seq = a->n_seq, .n_head = a->n_head,
                                      .stride_q = a->stride_q, .stride_out = a->stride_out,
                                      .window = a->window, .scale = a->scale, .softcap = a->softcap,
                                      .item = (const uint32_t(*)[6])item, .n_item = n_item,
                                      .part = part_bytes ? (float *)(void *)(s + items_bytes) : NULL,
                                      .part_stride = part_stride};
    atomic_init(&j.next, 0);
    if (ctx->n_threads == 1 || n_item == 1)
        ctx->k.attention(&j.k, 0, n_item, j.scratch);
    else
        dray_cpu_pool_run(ctx->pool, att_task, &j);
    if (part_bytes)
        merge_chunks(&j.k, group, pool.head_dim);
    return 0;
}
