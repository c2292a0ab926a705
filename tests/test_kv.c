/* KV manager tests, against a fake in-memory op table (no plugin). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fake_ops.h"
#include "kv.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

static char err[256];

/* Gemma 3 270M: 18 layers, local iff il % 6 < 5 with window 512, 1 kv head of 256. */
static uint32_t gemma_window[18];

static struct dray_kv_desc gemma_desc(void)
{
    for (uint32_t il = 0; il < 18; il++)
        gemma_window[il] = il % 6 < 5 ? 512 : 0;
    struct dray_kv_desc d = {
        .n_layer = 18, .window = gemma_window, .n_kv_head = 1, .head_dim = 256,
        .dtype = DRAY_I8, .block_size = 16, .max_seqs = 64, .max_ctx = 32768, .max_chunk = 512,
    };
    return d;
}

/* Two layers: 0 global, 1 window; tiny heads so buffers stay small. */
static uint32_t small_window[2] = {0, 0};

static struct dray_kv_desc small_desc(uint32_t window, uint32_t bs, uint32_t max_seqs,
                                      uint32_t max_ctx, uint32_t chunk)
{
    small_window[0] = 0;
    small_window[1] = window;
    struct dray_kv_desc d = {
        .n_layer = 2, .window = small_window, .n_kv_head = 1, .head_dim = 4, .dtype = DRAY_F16,
        .block_size = bs, .max_seqs = max_seqs, .max_ctx = max_ctx, .max_chunk = chunk,
    };
    return d;
}

static struct dray_kv *make(const struct dray_kv_desc *d)
{
    struct dray_kv *kv = NULL;
    int rc = dray_kv_create(&fake_ops, NULL, d, &kv, err, sizeof(err));
    if (rc)
        fail_msg("dray_kv_create: %d %s", rc, err);
    return kv;
}

static int step1(struct dray_kv *kv, uint32_t seq, uint32_t n)
{
    return dray_kv_step_begin(kv, 1, &seq, &n, err, sizeof(err));
}

/* Checks every invariant of the current step in group g: seqs rows, slots derived
 * from the table, table entries live exactly where some query's window reaches. */
static void check_step_group(struct dray_kv *kv, uint32_t g, uint32_t n_seq, const uint32_t *ids,
                             const uint32_t *n_new)
{
    const int32_t *seqs, *bt;
    uint32_t n_bt;
    const int32_t *slots = dray_kv_step_host(kv, g, &seqs, &bt, &n_bt);
    assert_non_null(slots);
    uint32_t bs = 16, w = dray_kv_get_plan(kv)->group[g].window;
    uint32_t q = 0, b0 = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        uint32_t len = dray_kv_seq_len(kv, ids[i]);
        assert_int_equal(seqs[4 * i], q);
        assert_int_equal(seqs[4 * i + 1], n_new[i]);
        assert_int_equal(seqs[4 * i + 2], len + n_new[i]);
        assert_int_equal(seqs[4 * i + 3], b0);
        for (uint32_t p = len; p < len + n_new[i]; p++) {
            int32_t blk = bt[b0 + p / bs];
            assert_true(blk >= 0);
            assert_int_equal(slots[q + p - len], blk * 16 + (int32_t)(p % bs));
        }
        /* the first query (position len) must reach back to len-w+1 */
        uint32_t lo = w && len + 1 > w ? len + 1 - w : 0;
        for (uint32_t p = lo; p < len + n_new[i]; p++)
            assert_true(bt[b0 + p / bs] >= 0);
        q += n_new[i];
        b0 += (len + n_new[i] + bs - 1) / bs;
    }
    assert_int_equal(n_bt, b0);
}

/* ------------------------------------------------------------------ tests */

static void test_kv_plan_gemma3_bytes_per_token_and_capacity(void **state)
{
    (void)state;
    struct dray_kv_desc d = gemma_desc();
    d.budget_bytes = 1ull << 30;
    struct dray_kv_plan p;
    assert_int_equal(dray_kv_plan(&d, &p, err, sizeof(err)), 0);
    assert_int_equal(p.n_group, 2);
    assert_int_equal(p.group[0].window, 512);
    assert_int_equal(p.group[0].n_layers, 15);
    assert_int_equal(p.group[1].window, 0);
    assert_int_equal(p.group[1].n_layers, 3);
    /* one token of one layer: 256 k + 256 v int8 bytes + 2 f32 scales */
    assert_int_equal(p.slot_bytes, 520);
    assert_int_equal(p.global_bytes_per_token, 3 * 520);
    /* window: ceil((512 + 512) / 16) + 2 = 66 blocks x 16 tokens x 15 layers x 520 */
    assert_int_equal(p.group[0].seq_blocks_max, 66);
    assert_int_equal(p.window_bytes_per_seq, 66ull * 16 * 15 * 520);
    /* budget: 64 x 8,236,800 to the window group, the rest (546,586,624) in global
     * blocks of 3 x 16 x 520 = 24,960 bytes -> 21,898 blocks */
    assert_int_equal(p.group[0].n_blocks, 64 * 66);
    assert_int_equal(p.group[1].n_blocks, 21898);
    assert_int_equal(dray_kv_plan_capacity(&p, &d, 32768), 10);  /* 21898 / 2048 */
    assert_int_equal(dray_kv_plan_capacity(&p, &d, 8192), 42);   /* 21898 / 512 */
    assert_int_equal(dray_kv_plan_capacity(&p, &d, 1000), 64);   /* capped at max_seqs */

    /* standard baseline: all 18 layers global, 4 kv heads (MHA), f16 */
    uint32_t all_global[18] = {0};
    struct dray_kv_desc b = d;
    b.window = all_global;
    b.n_kv_head = 4;
    b.dtype = DRAY_F16;
    b.budget_bytes = 0;
    struct dray_kv_plan pb;
    assert_int_equal(dray_kv_plan(&b, &pb, err, sizeof(err)), 0);
    assert_int_equal(pb.n_group, 1);
    assert_int_equal(pb.global_bytes_per_token, 18ull * 2 * 4 * 256 * 2); /* 73,728 */
    assert_int_equal(pb.window_bytes_per_seq, 0);
    /* at 32k tokens: 2,415,919,104 baseline vs 51,118,080 + 8,236,800 here (~40x) */
    uint64_t ours = 32768ull * p.global_bytes_per_token + p.window_bytes_per_seq;
    assert_true(32768ull * pb.global_bytes_per_token > 40 * ours);
}

static void test_kv_unlimited_budget_fits_max_seqs(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(32, 16, 4, 256, 16);
    struct dray_kv *kv = make(&d);
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    assert_int_equal(p->group[0].window, 0);
    assert_int_equal(p->group[0].n_blocks, 4 * 16);
    assert_int_equal(p->group[1].n_blocks, 4 * (3 + 2)); /* ceil(48/16)+2 */
    assert_int_equal(dray_kv_capacity(kv, 256), 4);
    dray_kv_free(kv);
}

static void test_kv_budget_too_small_for_one_sequence_fails(void **state)
{
    (void)state;
    struct dray_kv_desc d = gemma_desc();
    d.budget_bytes = 50000000; /* one 32k sequence needs 59,354,880 */
    struct dray_kv *kv = (struct dray_kv *)1;
    int rc = dray_kv_create(&fake_ops, NULL, &d, &kv, err, sizeof(err));
    assert_int_equal(rc, DRAY_ERANGE);
    assert_null(kv);
    assert_non_null(strstr(err, "cannot hold one sequence"));
    assert_non_null(strstr(err, "59354880"));
}

static void test_kv_tight_budget_shrinks_window_groups(void **state)
{
    (void)state;
    struct dray_kv_desc d = gemma_desc();
    d.budget_bytes = 200000000; /* 3 full sequences of 59,354,880 */
    struct dray_kv_plan p;
    assert_int_equal(dray_kv_plan(&d, &p, err, sizeof(err)), 0);
    assert_int_equal(p.group[0].n_blocks, 3 * 66);
    /* (200,000,000 - 3 x 8,236,800) / 24,960 = 7022 */
    assert_int_equal(p.group[1].n_blocks, 7022);
    assert_int_equal(dray_kv_plan_capacity(&p, &d, 32768), 3);
    assert_true(p.total_bytes <= 200000000ull + 18 * 4 * 256);
}

static void test_kv_f16_and_int8_pool_sizes_and_views(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(0, 16, 2, 64, 16); /* both layers global */
    d.n_kv_head = 2;
    d.head_dim = 8;
    struct dray_kv *kv = make(&d);
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    assert_int_equal(p->n_group, 1);
    assert_int_equal(p->slot_bytes, 2 * 2 * 8 * 2);
    assert_int_equal(p->group[0].n_blocks, 8);
    /* 128 slots x 16 halves x 2 bytes = 4096 per k and v */
    assert_int_equal(p->group[0].layer_bytes, 2 * 4096);
    assert_int_equal(p->total_bytes, 2 * 2 * 4096);
    uint32_t s, n = 1;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(dray_kv_step_begin(kv, 1, &s, &n, err, sizeof(err)), 0);
    const struct dray_kv_layer_step *l0 = dray_kv_layer(kv, 0), *l1 = dray_kv_layer(kv, 1);
    assert_int_equal(l0->pool->dtype, DRAY_F16);
    assert_int_equal(l0->pool->n_slots, 128);
    assert_ptr_equal(l0->pool->k.buf, l1->pool->k.buf);
    assert_int_equal(l0->pool->k.offset, 0);
    assert_int_equal(l0->pool->v.offset, 4096);
    assert_int_equal(l1->pool->k.offset, 8192);
    assert_null(l0->pool->k_scale.buf);
    dray_kv_step_end(kv);
    dray_kv_free(kv);

    d.dtype = DRAY_I8;
    kv = make(&d);
    p = dray_kv_get_plan(kv);
    assert_int_equal(p->slot_bytes, 2 * 2 * 8 + 2 * 2 * 4);
    /* k, v: 128 x 16 = 2048 each; scales: 128 x 2 x 4 = 1024 each */
    assert_int_equal(p->group[0].layer_bytes, 2 * 2048 + 2 * 1024);
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(dray_kv_step_begin(kv, 1, &s, &n, err, sizeof(err)), 0);
    l1 = dray_kv_layer(kv, 1);
    assert_int_equal(l1->pool->k.offset, 6144);
    assert_int_equal(l1->pool->v.offset, 6144 + 2048);
    assert_int_equal(l1->pool->k_scale.offset, 6144 + 4096);
    assert_int_equal(l1->pool->v_scale.offset, 6144 + 5120);
    assert_ptr_equal(l1->pool->v_scale.buf, l1->pool->k.buf);
    dray_kv_step_end(kv);
    dray_kv_free(kv);
}

static void test_kv_mixed_prefill_decode_tables_and_slots_exact(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(0, 16, 4, 256, 64); /* one global group */
    struct dray_kv *kv = make(&d);
    uint32_t a, b, c;
    assert_int_equal(dray_kv_seq_new(kv, &a), 0);
    assert_int_equal(dray_kv_seq_new(kv, &b), 0);
    assert_int_equal(dray_kv_seq_new(kv, &c), 0);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    assert_int_equal(c, 2);

    /* step 1: a prefills 20 tokens (blocks 0,1), b prefills 5 (block 2) */
    uint32_t ids1[2] = {a, b}, n1[2] = {20, 5};
    fake_uploads = 0;
    assert_int_equal(dray_kv_step_begin(kv, 2, ids1, n1, err, sizeof(err)), 0);
    assert_int_equal(fake_uploads, 1);
    const int32_t *seqs, *bt;
    uint32_t n_bt;
    const int32_t *slots = dray_kv_step_host(kv, 0, &seqs, &bt, &n_bt);
    for (int i = 0; i < 16; i++)
        assert_int_equal(slots[i], i);
    for (int i = 16; i < 20; i++)
        assert_int_equal(slots[i], 16 + (i - 16));
    for (int i = 0; i < 5; i++)
        assert_int_equal(slots[20 + i], 32 + i);
    const int32_t want_seqs1[8] = {0, 20, 20, 0, 20, 5, 5, 2};
    assert_memory_equal(seqs, want_seqs1, sizeof(want_seqs1));
    const int32_t want_bt1[3] = {0, 1, 2};
    assert_int_equal(n_bt, 3);
    assert_memory_equal(bt, want_bt1, sizeof(want_bt1));
    dray_kv_step_end(kv);

    /* step 2: a decodes (pos 20, block 1), b decodes (pos 5), c prefills 33 (blocks 3,4,5) */
    uint32_t ids2[3] = {a, b, c}, n2[3] = {1, 1, 33};
    fake_uploads = 0;
    assert_int_equal(dray_kv_step_begin(kv, 3, ids2, n2, err, sizeof(err)), 0);
    assert_int_equal(fake_uploads, 1);
    slots = dray_kv_step_host(kv, 0, &seqs, &bt, &n_bt);
    assert_int_equal(slots[0], 16 + 4);
    assert_int_equal(slots[1], 32 + 5);
    for (int i = 0; i < 33; i++)
        assert_int_equal(slots[2 + i], 48 + i);
    const int32_t want_seqs2[12] = {0, 1, 21, 0, 1, 1, 6, 2, 2, 33, 33, 3};
    assert_memory_equal(seqs, want_seqs2, sizeof(want_seqs2));
    const int32_t want_bt2[6] = {0, 1, 2, 3, 4, 5};
    assert_int_equal(n_bt, 6);
    assert_memory_equal(bt, want_bt2, sizeof(want_bt2));

    /* the device copy (what attention reads) matches the host arrays */
    const struct dray_kv_layer_step *ls = dray_kv_layer(kv, 1);
    assert_true(ls->store);
    assert_int_equal(ls->n_tok, 35);
    assert_int_equal(ls->n_seq, 3);
    assert_int_equal(ls->max_kv_len, 33);
    assert_int_equal(ls->window, 0);
    int32_t dev[64];
    assert_int_equal(fake_download(NULL, dev, ls->seqs, sizeof(want_seqs2)), 0);
    assert_memory_equal(dev, want_seqs2, sizeof(want_seqs2));
    assert_int_equal(fake_download(NULL, dev, ls->block_table, sizeof(want_bt2)), 0);
    assert_memory_equal(dev, want_bt2, sizeof(want_bt2));
    assert_int_equal(fake_download(NULL, dev, ls->slots, 35 * 4), 0);
    assert_memory_equal(dev, slots, 35 * 4);
    assert_int_equal(ls->slots.offset % 4, 0);
    dray_kv_step_end(kv);
    assert_null(dray_kv_layer(kv, 0)); /* no step, no view */
    assert_int_equal(dray_kv_seq_len(kv, a), 21);
    assert_int_equal(dray_kv_seq_len(kv, c), 33);
    dray_kv_free(kv);
}

static void test_kv_window_group_holds_bounded_blocks_over_10k_tokens(void **state)
{
    (void)state;
    const uint32_t chunk = 64, bound = (512 + 64 + 15) / 16 + 2; /* 38 */
    struct dray_kv_desc d = small_desc(512, 16, 2, 16384, chunk);
    struct dray_kv *kv = make(&d);
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    assert_int_equal(p->group[1].window, 512);
    assert_int_equal(p->group[1].seq_blocks_max, bound);
    uint32_t s, peak = 0;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    /* prefill 8192 in chunks of 64, then decode one token at a time to 10,000 */
    while (dray_kv_seq_len(kv, s) < 10000) {
        uint32_t len = dray_kv_seq_len(kv, s);
        uint32_t n = len < 8192 ? chunk : 1;
        assert_int_equal(step1(kv, s, n), 0);
        check_step_group(kv, 0, 1, &s, &n);
        check_step_group(kv, 1, 1, &s, &n);
        uint32_t held = dray_kv_seq_blocks(kv, s, 1);
        assert_true(held <= bound);
        if (held > peak)
            peak = held;
        /* global group grows with length */
        assert_int_equal(dray_kv_seq_blocks(kv, s, 0), (len + n + 15) / 16);
        dray_kv_step_end(kv);
    }
    /* the bound is tight, not vacuous: block-aligned chunks reach bound - 2; the
     * last block of the bound is for a chunk that starts mid-block */
    assert_true(peak >= bound - 2);
    /* after 10,000 tokens only blocks reaching positions >= 10000-511 remain */
    assert_int_equal(dray_kv_seq_blocks(kv, s, 1), 625 - (10000 + 1 - 512) / 16);
    assert_int_equal(dray_kv_group_free_blocks(kv, 1) + dray_kv_seq_blocks(kv, s, 1),
                     p->group[1].n_blocks);
    dray_kv_seq_free(kv, s);
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), p->group[0].n_blocks);
    assert_int_equal(dray_kv_group_free_blocks(kv, 1), p->group[1].n_blocks);
    dray_kv_free(kv);
}

static void test_kv_window_table_pads_recycled_entries_with_minus_one(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(32, 16, 1, 1024, 100);
    struct dray_kv *kv = make(&d);
    uint32_t s, n = 100;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(step1(kv, s, n), 0); /* 100 tokens, blocks 0..6 in both groups */
    dray_kv_step_end(kv);
    /* next query at 100 sees 69..100: blocks 4..6 live, 0..3 recycled */
    assert_int_equal(dray_kv_seq_blocks(kv, s, 1), 3);
    n = 1;
    assert_int_equal(step1(kv, s, n), 0);
    const int32_t *seqs, *bt;
    uint32_t n_bt;
    dray_kv_step_host(kv, 1, &seqs, &bt, &n_bt);
    assert_int_equal(n_bt, 7);
    assert_int_equal(seqs[3], 0);
    const int32_t want[7] = {-1, -1, -1, -1, 4, 5, 6};
    assert_memory_equal(bt, want, sizeof(want));
    dray_kv_step_end(kv);
    dray_kv_free(kv);
}

static void test_kv_enomem_changes_nothing_and_retry_works(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(0, 16, 4, 96, 16); /* 2 global layers */
    d.budget_bytes = 6 * 2 * 16 * (2 * 4 * 2);          /* 6 blocks of 512 bytes */
    struct dray_kv *kv = make(&d);
    assert_int_equal(dray_kv_get_plan(kv)->group[0].n_blocks, 6);
    uint32_t a, b;
    assert_int_equal(dray_kv_seq_new(kv, &a), 0);
    assert_int_equal(dray_kv_seq_new(kv, &b), 0);
    assert_int_equal(step1(kv, a, 64), 0); /* blocks 0..3 */
    dray_kv_step_end(kv);
    uint32_t ids[2] = {a, b}, nn[2] = {1, 40}; /* needs 1 + 3 blocks, 2 free */
    fake_uploads = 0;
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), DRAY_ENOMEM);
    assert_non_null(strstr(err, "needs 4 blocks"));
    assert_int_equal(fake_uploads, 0);
    assert_null(dray_kv_layer(kv, 0));
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), 2);
    assert_int_equal(dray_kv_seq_len(kv, a), 64);
    assert_int_equal(dray_kv_seq_len(kv, b), 0);
    assert_int_equal(dray_kv_seq_blocks(kv, a, 0), 4);
    assert_int_equal(dray_kv_seq_blocks(kv, b, 0), 0);
    /* the scheduler shrinks b's chunk and retries: exactly the 2 free blocks */
    nn[1] = 16;
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), 0);
    const int32_t *slots = dray_kv_step_host(kv, 0, NULL, NULL, NULL);
    assert_int_equal(slots[0], 64);
    for (int i = 0; i < 16; i++)
        assert_int_equal(slots[1 + i], 80 + i);
    dray_kv_step_end(kv);
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), 0);
    dray_kv_free(kv);
}

static void test_kv_step_rejects_bad_batches(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(0, 16, 4, 64, 16);
    struct dray_kv *kv = make(&d);
    uint32_t a, b;
    assert_int_equal(dray_kv_seq_new(kv, &a), 0);
    assert_int_equal(dray_kv_seq_new(kv, &b), 0);
    uint32_t ids[2] = {a, a}, nn[2] = {1, 1};
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "twice"));
    ids[1] = 3; /* never created */
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), DRAY_EINVAL);
    ids[1] = b;
    nn[1] = 0;
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), DRAY_EINVAL);
    nn[1] = 65;
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), DRAY_ERANGE);
    nn[1] = 1;
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), 0);
    assert_int_equal(dray_kv_step_begin(kv, 2, ids, nn, err, sizeof(err)), DRAY_EINVAL);
    dray_kv_step_end(kv);
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), 4 * 4 - 2);
    dray_kv_free(kv);
}

static void test_kv_failed_upload_and_abort_return_blocks(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(32, 16, 2, 256, 16);
    struct dray_kv *kv = make(&d);
    uint32_t s;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(step1(kv, s, 40), 0);
    dray_kv_step_end(kv);
    uint32_t f0 = dray_kv_group_free_blocks(kv, 0), f1 = dray_kv_group_free_blocks(kv, 1);
    fake_fail_upload = 1;
    assert_int_equal(step1(kv, s, 30), DRAY_EBACKEND);
    assert_non_null(strstr(err, "fake failure"));
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), f0);
    assert_int_equal(dray_kv_group_free_blocks(kv, 1), f1);
    assert_int_equal(step1(kv, s, 30), 0);
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), f0 - 2);
    dray_kv_step_abort(kv);
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), f0);
    assert_int_equal(dray_kv_group_free_blocks(kv, 1), f1);
    assert_int_equal(dray_kv_seq_len(kv, s), 40);
    dray_kv_free(kv);
}

static void test_kv_shared_layers_return_owner_pool_without_storage(void **state)
{
    (void)state;
    uint32_t win[5] = {0, 64, 0, 64, 64};
    int32_t share[5] = {-1, -1, 0, 1, 1};
    struct dray_kv_desc d = {
        .n_layer = 5, .window = win, .share_with = share, .n_kv_head = 1, .head_dim = 4,
        .dtype = DRAY_I8, .block_size = 16, .max_seqs = 2, .max_ctx = 128, .max_chunk = 16,
    };
    struct dray_kv *kv = make(&d);
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    assert_int_equal(p->n_group, 2);
    assert_int_equal(p->group[0].n_layers, 1);
    assert_int_equal(p->group[1].n_layers, 1);
    assert_int_equal(p->global_bytes_per_token, p->slot_bytes);
    assert_int_equal(fake_live, 2); /* one buffer per group, metadata comes with a step */
    uint32_t s, n = 3;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(dray_kv_step_begin(kv, 1, &s, &n, err, sizeof(err)), 0);
    assert_ptr_equal(dray_kv_layer(kv, 2)->pool, dray_kv_layer(kv, 0)->pool);
    assert_ptr_equal(dray_kv_layer(kv, 3)->pool, dray_kv_layer(kv, 1)->pool);
    assert_ptr_equal(dray_kv_layer(kv, 4)->pool, dray_kv_layer(kv, 1)->pool);
    assert_true(dray_kv_layer(kv, 0)->store);
    assert_true(dray_kv_layer(kv, 1)->store);
    assert_false(dray_kv_layer(kv, 2)->store);
    assert_false(dray_kv_layer(kv, 3)->store);
    assert_int_equal(dray_kv_layer(kv, 3)->window, 64);
    assert_int_equal(dray_kv_layer_group(kv, 4), 1);
    dray_kv_step_end(kv);
    dray_kv_free(kv);

    share[2] = 1; /* window 0 layer sharing a window-64 layer */
    assert_int_equal(dray_kv_create(&fake_ops, NULL, &d, &kv, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "windows must match"));
    share[2] = 3; /* a later layer */
    assert_int_equal(dray_kv_create(&fake_ops, NULL, &d, &kv, err, sizeof(err)), DRAY_EINVAL);
    share[2] = 0;
    share[4] = 3; /* a layer that itself shares */
    assert_int_equal(dray_kv_create(&fake_ops, NULL, &d, &kv, err, sizeof(err)), DRAY_EINVAL);
    share[4] = 1;
    d.dtype = DRAY_F32;
    assert_int_equal(dray_kv_create(&fake_ops, NULL, &d, &kv, err, sizeof(err)), DRAY_EINVAL);
    assert_null(kv);
}

static void test_kv_thousands_of_sequences_leave_no_leak(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(48, 16, 32, 512, 32);
    struct dray_kv *kv = make(&d);
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    uint32_t live[32], n_live = 0, created = 0;
    dray_test_seed(7);
    for (int it = 0; it < 6000; it++) {
        uint32_t r = dray_test_rand() % 8;
        if (r < 3 && n_live < 32) {
            assert_int_equal(dray_kv_seq_new(kv, &live[n_live]), 0);
            n_live++;
            created++;
        } else if (r < 4 && n_live) {
            uint32_t i = dray_test_rand() % n_live;
            dray_kv_seq_free(kv, live[i]);
            live[i] = live[--n_live];
        } else if (n_live) {
            uint32_t ids[32], nn[32], k = 0;
            for (uint32_t i = 0; i < n_live; i++) {
                uint32_t len = dray_kv_seq_len(kv, live[i]);
                uint32_t n = dray_test_rand() % 3 ? 1 : 1 + dray_test_rand() % 32;
                if (len + n <= 512) {
                    ids[k] = live[i];
                    nn[k++] = n;
                }
            }
            if (!k)
                continue;
            int rc = dray_kv_step_begin(kv, k, ids, nn, err, sizeof(err));
            if (rc == DRAY_ENOMEM)
                continue;
            assert_int_equal(rc, 0);
            check_step_group(kv, 0, k, ids, nn);
            check_step_group(kv, 1, k, ids, nn);
            dray_kv_step_end(kv);
        }
        /* accounting: free + held == total in every group */
        for (uint32_t g = 0; g < 2; g++) {
            uint32_t held = 0;
            for (uint32_t i = 0; i < n_live; i++)
                held += dray_kv_seq_blocks(kv, live[i], g);
            assert_int_equal(held + dray_kv_group_free_blocks(kv, g), p->group[g].n_blocks);
        }
    }
    assert_true(created > 1000);
    assert_int_equal(dray_kv_seq_new(kv, &live[n_live]), n_live < 32 ? 0 : DRAY_ENOMEM);
    if (n_live < 32)
        n_live++;
    while (n_live)
        dray_kv_seq_free(kv, live[--n_live]);
    assert_int_equal(dray_kv_group_free_blocks(kv, 0), p->group[0].n_blocks);
    assert_int_equal(dray_kv_group_free_blocks(kv, 1), p->group[1].n_blocks);
    /* all 32 ids are free again */
    for (uint32_t i = 0; i < 32; i++)
        assert_int_equal(dray_kv_seq_new(kv, &live[i]), 0);
    assert_int_equal(dray_kv_seq_new(kv, &live[0]), DRAY_ENOMEM);
    dray_kv_free(kv);
}

static void test_kv_truncate_frees_tail_and_guards_window(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(32, 16, 1, 1024, 100);
    struct dray_kv *kv = make(&d);
    uint32_t s;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(step1(kv, s, 100), 0);
    dray_kv_step_end(kv);
    /* window blocks 4..6 live (positions 64..111); global blocks 0..6 */
    assert_int_equal(dray_kv_seq_truncate(kv, s, 101), DRAY_ERANGE);
    /* at 90 the next query sees 59..90: block 3 was recycled */
    assert_int_equal(dray_kv_seq_truncate(kv, s, 90), DRAY_ERANGE);
    assert_int_equal(dray_kv_seq_len(kv, s), 100);
    /* at 95 the next query sees 64..95: blocks 4, 5 */
    assert_int_equal(dray_kv_seq_truncate(kv, s, 95), 0);
    assert_int_equal(dray_kv_seq_len(kv, s), 95);
    assert_int_equal(dray_kv_seq_blocks(kv, s, 0), 6);
    assert_int_equal(dray_kv_seq_blocks(kv, s, 1), 2);
    uint32_t n = 1;
    assert_int_equal(step1(kv, s, n), 0);
    check_step_group(kv, 0, 1, &s, &n);
    check_step_group(kv, 1, 1, &s, &n);
    dray_kv_step_end(kv);
    /* rewinding to 0 is always possible and frees everything */
    assert_int_equal(dray_kv_seq_truncate(kv, s, 0), 0);
    assert_int_equal(dray_kv_seq_blocks(kv, s, 0), 0);
    assert_int_equal(dray_kv_seq_blocks(kv, s, 1), 0);
    assert_int_equal(dray_kv_group_free_blocks(kv, 1), dray_kv_get_plan(kv)->group[1].n_blocks);
    assert_int_equal(step1(kv, s, 20), 0);
    check_step_group(kv, 1, 1, &s, &(uint32_t){20});
    dray_kv_step_end(kv);
    dray_kv_free(kv);
}

/* The window arithmetic of checkpoints: what a sequence keeps after a step is
 * exactly dray_kv_kept_from, and the checkpoint gap is window + block - 2. */
static void test_kv_kept_from_and_ckpt_gap(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(32, 16, 1, 1024, 100);
    struct dray_kv *kv = make(&d);
    uint32_t s;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(step1(kv, s, 100), 0);
    dray_kv_step_end(kv);
    /* from 96, the last block boundary: a query there sees 65..96, blocks 4.. */
    assert_int_equal(dray_kv_kept_from(kv, 1, 100), 4);
    assert_int_equal(dray_kv_kept_from(kv, 1, 100), dray_kv_live_from(kv, 1, 96));
    assert_int_equal(dray_kv_seq_block(kv, s, 1, 3), -1);
    assert_true(dray_kv_seq_block(kv, s, 1, 4) >= 0);
    assert_int_equal(dray_kv_kept_from(kv, 0, 100), 0); /* the global group keeps all */
    assert_int_equal(dray_kv_kept_from(kv, 7, 100), 0); /* no such group */
    assert_int_equal(dray_kv_ckpt_gap(kv), 32 + 16 - 2);
    dray_kv_free(kv);
    d = small_desc(0, 16, 1, 1024, 100);
    kv = make(&d);
    assert_int_equal(dray_kv_ckpt_gap(kv), 0); /* no window group */
    dray_kv_free(kv);
}

static void test_kv_create_survives_every_device_alloc_failure(void **state)
{
    (void)state;
    struct dray_kv_desc d = gemma_desc();
    d.max_seqs = 2;
    d.max_ctx = 2048;
    for (int n = 0;; n++) {
        fake_alloc_left = n;
        struct dray_kv *kv = (struct dray_kv *)1;
        int rc = dray_kv_create(&fake_ops, NULL, &d, &kv, err, sizeof(err));
        if (rc == 0) {
            assert_int_equal(n, 2);
            fake_alloc_left = -1;
            dray_kv_free(kv);
            break;
        }
        assert_int_equal(rc, DRAY_ENOMEM);
        assert_null(kv);
        assert_non_null(strstr(err, "device allocation"));
        assert_int_equal(fake_live, 0);
    }
}

static void test_kv_pools_start_zeroed(void **state)
{
    (void)state;
    struct dray_kv_desc d = small_desc(32, 16, 1, 64, 16);
    struct dray_kv *kv = make(&d);
    uint32_t s, n = 1;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(dray_kv_step_begin(kv, 1, &s, &n, err, sizeof(err)), 0);
    const struct dray_kv_pool *pool = dray_kv_layer(kv, 1)->pool;
    uint16_t v[8];
    assert_int_equal(fake_download(NULL, v, pool->v, sizeof(v)), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(v[i], 0);
    dray_kv_step_end(kv);
    dray_kv_free(kv);
}

/* Copy on write: a sequence attached to a shared partial block gets its own copy
 * (same bytes, another block) when a step writes into it, so the other holder's
 * block keeps what it had. Through the plugin's copy op, and through download +
 * upload for a plugin without one. */
static void test_kv_shared_partial_block_is_copied_before_write(void **state)
{
    (void)state;
    struct dray_ops no_copy = fake_ops;
    no_copy.copy = NULL;
    const struct dray_ops *tables[2] = {&fake_ops, &no_copy};
    for (int t = 0; t < 2; t++) {
        struct dray_kv_desc d = small_desc(32, 16, 2, 256, 64);
        struct dray_kv *kv = NULL;
        assert_int_equal(dray_kv_create(tables[t], NULL, &d, &kv, err, sizeof(err)), 0);
        uint32_t a, b, n = 20;
        assert_int_equal(dray_kv_seq_new(kv, &a), 0);
        assert_int_equal(step1(kv, a, n), 0);
        dray_kv_step_end(kv);
        /* A's blocks, a recognisable tail block, one extra holder (the cache) */
        int32_t blocks[2][2];
        const int32_t *rows[2] = {blocks[0], blocks[1]};
        unsigned char want[2][4096], got[4096];
        for (uint32_t g = 0; g < 2; g++) {
            uint64_t nb = dray_kv_block_host_bytes(kv, g);
            assert_true(nb <= sizeof(got));
            for (uint32_t e = 0; e < 2; e++)
                blocks[g][e] = dray_kv_seq_block(kv, a, g, e);
            for (uint64_t i = 0; i < nb; i++)
                want[g][i] = (unsigned char)(i * 7 + g + 1);
            assert_int_equal(dray_kv_block_upload(kv, g, (uint32_t)blocks[g][1], want[g]), 0);
            dray_kv_block_ref(kv, g, (uint32_t)blocks[g][0]);
            dray_kv_block_ref(kv, g, (uint32_t)blocks[g][1]);
        }
        dray_kv_seq_free(kv, a);
        assert_int_equal(dray_kv_seq_new(kv, &b), 0);
        assert_int_equal(dray_kv_seq_attach(kv, b, 18, rows), 0);
        assert_int_equal(dray_kv_seq_len(kv, b), 18);
        assert_int_equal(dray_kv_block_refs(kv, 0, (uint32_t)blocks[0][1]), 2);
        n = 3; /* positions 18..20: into the shared block */
        assert_int_equal(step1(kv, b, n), 0);
        for (uint32_t g = 0; g < 2; g++) {
            int32_t mine = dray_kv_seq_block(kv, b, g, 1);
            assert_true(mine >= 0);
            assert_int_not_equal(mine, blocks[g][1]);
            /* the full block stays shared; the partial one is B's own copy */
            assert_int_equal(dray_kv_seq_block(kv, b, g, 0), blocks[g][0]);
            assert_int_equal(dray_kv_block_refs(kv, g, (uint32_t)blocks[g][1]), 1);
            assert_int_equal(dray_kv_block_refs(kv, g, (uint32_t)mine), 1);
            uint64_t nb = dray_kv_block_host_bytes(kv, g);
            assert_int_equal(dray_kv_block_download(kv, g, (uint32_t)mine, got), 0);
            assert_memory_equal(got, want[g], nb);
            const int32_t *slots = dray_kv_step_host(kv, g, NULL, NULL, NULL);
            assert_int_equal(slots[0], mine * 16 + 2);
            check_step_group(kv, g, 1, &b, &n);
        }
        dray_kv_step_end(kv);
        uint64_t copies;
        double secs;
        dray_kv_cow_stats(kv, &copies, &secs);
        assert_int_equal(copies, 2); /* one block in each group */
        /* a second step writes into B's own block: no further copy */
        int32_t before = dray_kv_seq_block(kv, b, 0, 1);
        assert_int_equal(step1(kv, b, 1), 0);
        assert_int_equal(dray_kv_seq_block(kv, b, 0, 1), before);
        dray_kv_step_end(kv);
        dray_kv_cow_stats(kv, &copies, &secs);
        assert_int_equal(copies, 2);
        dray_kv_seq_free(kv, b);
        for (uint32_t g = 0; g < 2; g++) {
            assert_int_equal(dray_kv_block_download(kv, g, (uint32_t)blocks[g][1], got), 0);
            assert_memory_equal(got, want[g], dray_kv_block_host_bytes(kv, g));
            dray_kv_block_unref(kv, g, (uint32_t)blocks[g][0]);
            dray_kv_block_unref(kv, g, (uint32_t)blocks[g][1]);
            assert_int_equal(dray_kv_group_free_blocks(kv, g),
                             dray_kv_get_plan(kv)->group[g].n_blocks);
        }
        dray_kv_free(kv);
    }
}

#define T(f) cmocka_unit_test_setup_teardown(f, fake_ops_setup, fake_ops_teardown)
static const struct CMUnitTest tests[] = {
    T(test_kv_plan_gemma3_bytes_per_token_and_capacity),
    T(test_kv_unlimited_budget_fits_max_seqs),
    T(test_kv_budget_too_small_for_one_sequence_fails),
    T(test_kv_tight_budget_shrinks_window_groups),
    T(test_kv_f16_and_int8_pool_sizes_and_views),
    T(test_kv_mixed_prefill_decode_tables_and_slots_exact),
    T(test_kv_window_group_holds_bounded_blocks_over_10k_tokens),
    T(test_kv_window_table_pads_recycled_entries_with_minus_one),
    T(test_kv_enomem_changes_nothing_and_retry_works),
    T(test_kv_step_rejects_bad_batches),
    T(test_kv_failed_upload_and_abort_return_blocks),
    T(test_kv_shared_layers_return_owner_pool_without_storage),
    T(test_kv_thousands_of_sequences_leave_no_leak),
    T(test_kv_truncate_frees_tail_and_guards_window),
    T(test_kv_kept_from_and_ckpt_gap),
    T(test_kv_create_survives_every_device_alloc_failure),
    T(test_kv_pools_start_zeroed),
    T(test_kv_shared_partial_block_is_copied_before_write),
};

int main(void) { return cmocka_run_group_tests(tests, NULL, NULL); }
