/* The prefix cache (core/kv/prefix_cache.h) on a tiny real KV manager over the
 * in-memory op table (fake_ops.h): insert and lookup, a match that ends inside a
 * block, tenants, least-recently-used eviction, and the host tier (spill and
 * restore of global blocks and of window checkpoints, content included). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fake_ops.h"
#include "kv.h"
#include "prefix_cache.h"

#define BS 4 /* tokens per block */

static char err[256];
static uint32_t win[2];

/* Two layers of one tiny head: layer 0 global, layer 1 global too (window 0:
 * one group) or with that window (group 1). */
static struct dray_kv *make_kv(uint32_t window)
{
    win[0] = 0;
    win[1] = window;
    struct dray_kv_desc d = {
        .n_layer = 2, .window = win, .n_kv_head = 1, .head_dim = 4, .dtype = DRAY_F16,
        .block_size = BS, .max_seqs = 4, .max_ctx = 64, .max_chunk = 16,
    };
    struct dray_kv *kv = NULL;
    if (dray_kv_create(&fake_ops, NULL, &d, &kv, err, sizeof(err)))
        fail_msg("dray_kv_create: %s", err);
    return kv;
}

static struct dray_pcache *make_pc(struct dray_kv *kv, uint64_t host_bytes)
{
    struct dray_pcache *pc = NULL;
    assert_int_equal(dray_pcache_create(kv, host_bytes, &pc), 0);
    return pc;
}

/* A new sequence holding n computed tokens (n <= max_chunk). */
static uint32_t seq_of(struct dray_kv *kv, uint32_t n)
{
    uint32_t s;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    assert_int_equal(dray_kv_step_begin(kv, 1, &s, &n, err, sizeof(err)), 0);
    dray_kv_step_end(kv);
    return s;
}

/* A new, empty sequence. */
static uint32_t empty_seq(struct dray_kv *kv)
{
    uint32_t s;
    assert_int_equal(dray_kv_seq_new(kv, &s), 0);
    return s;
}

static unsigned char pattern(unsigned char tag, uint32_t g, uint32_t e, uint64_t j)
{
    return (unsigned char)(tag + 16 * g + 4 * e + j);
}

/* Write a known pattern into every block seq holds (entries 0 .. n_ent-1). */
static void stamp(struct dray_kv *kv, uint32_t seq, uint32_t n_ent, unsigned char tag)
{
    for (uint32_t g = 0; g < dray_kv_get_plan(kv)->n_group; g++) {
        uint64_t n = dray_kv_block_host_bytes(kv, g);
        unsigned char *h = malloc(n);
        assert_non_null(h);
        for (uint32_t e = 0; e < n_ent; e++) {
            int32_t b = dray_kv_seq_block(kv, seq, g, e);
            if (b < 0)
                continue;
            for (uint64_t j = 0; j < n; j++)
                h[j] = pattern(tag, g, e, j);
            assert_int_equal(dray_kv_block_upload(kv, g, (uint32_t)b, h), 0);
        }
        free(h);
    }
}

/* seq's blocks of entries 0 .. n_ent-1 (those it holds) hold stamp's pattern;
 * returns how many blocks were compared. */
static uint32_t check_stamp(struct dray_kv *kv, uint32_t seq, uint32_t n_ent, unsigned char tag)
{
    uint32_t seen = 0;
    for (uint32_t g = 0; g < dray_kv_get_plan(kv)->n_group; g++) {
        uint64_t n = dray_kv_block_host_bytes(kv, g);
        unsigned char *h = malloc(n);
        assert_non_null(h);
        for (uint32_t e = 0; e < n_ent; e++) {
            int32_t b = dray_kv_seq_block(kv, seq, g, e);
            if (b < 0)
                continue;
            assert_int_equal(dray_kv_block_download(kv, g, (uint32_t)b, h), 0);
            for (uint64_t j = 0; j < n; j++)
                if (h[j] != pattern(tag, g, e, j))
                    fail_msg("group %u entry %u byte %llu: %u, expected %u", g, e,
                             (unsigned long long)j, h[j], pattern(tag, g, e, j));
            seen++;
        }
        free(h);
    }
    return seen;
}

static struct dray_pcache_stats stats(const struct dray_pcache *pc)
{
    struct dray_pcache_stats st;
    dray_pcache_get_stats(pc, &st);
    return st;
}

/* Free the cache and the KV: once the cache is gone every block is free again. */
static void done(struct dray_kv *kv, struct dray_pcache *pc)
{
    dray_pcache_free(pc);
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    for (uint32_t g = 0; g < p->n_group; g++)
        assert_int_equal(dray_kv_group_free_blocks(kv, g), p->group[g].n_blocks);
    dray_kv_free(kv);
}

/* ids[i] = first + i */
static void run_of(int32_t *ids, size_t n, int32_t first)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = first + (int32_t)i;
}

/* ------------------------------------------------------------------ tests */

static void test_pcache_insert_then_lookup_shares_blocks(void **state)
{
    (void)state;
    struct dray_kv *kv = make_kv(0);
    struct dray_pcache *pc = make_pc(kv, 0);
    int32_t a[12];
    run_of(a, 12, 1);
    uint32_t sa = seq_of(kv, 12);
    dray_pcache_insert(pc, 0, a, 12, sa);
    struct dray_pcache_stats st = stats(pc);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.blocks, 3);
    assert_int_equal(st.checkpoints, 0); /* no window group: no checkpoints */
    assert_int_equal(dray_kv_block_refs(kv, 0, (uint32_t)dray_kv_seq_block(kv, sa, 0, 0)), 2);

    /* the next request resends the prefix; its last token is left to compute */
    uint32_t sb = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, a, 11, sb), 11);
    assert_int_equal(dray_kv_seq_len(kv, sb), 11);
    for (uint32_t e = 0; e < 3; e++) {
        assert_int_equal(dray_kv_seq_block(kv, sb, 0, e), dray_kv_seq_block(kv, sa, 0, e));
        assert_int_equal(dray_kv_block_refs(kv, 0, (uint32_t)dray_kv_seq_block(kv, sb, 0, e)), 3);
    }
    /* a different first token misses */
    int32_t other[12];
    run_of(other, 12, 100);
    uint32_t sc = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, other, 11, sc), 0);
    assert_int_equal(dray_kv_seq_len(kv, sc), 0);
    st = stats(pc);
    assert_int_equal(st.lookups, 2);
    assert_int_equal(st.lookup_tokens, 22);
    assert_int_equal(st.hit_tokens, 11);
    /* inserting the same tokens again adds nothing */
    dray_pcache_insert(pc, 0, a, 12, sb);
    assert_int_equal(stats(pc).entries, 3);
    dray_kv_seq_free(kv, sa);
    dray_kv_seq_free(kv, sb);
    dray_kv_seq_free(kv, sc);
    done(kv, pc);
}

static void test_pcache_match_ends_inside_a_block(void **state)
{
    (void)state;
    struct dray_kv *kv = make_kv(0);
    struct dray_pcache *pc = make_pc(kv, 0);
    int32_t a[10];
    run_of(a, 10, 1);
    uint32_t sa = seq_of(kv, 10);
    dray_pcache_insert(pc, 0, a, 10, sa);
    assert_int_equal(stats(pc).entries, 3); /* two full blocks and a tail of 2 */

    /* diverges inside the tail: 8 tokens of full blocks, 1 of the tail */
    int32_t q[12];
    memcpy(q, a, 9 * sizeof(int32_t));
    q[9] = 77, q[10] = 78, q[11] = 79;
    uint32_t sb = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, q, 11, sb), 9);
    int32_t tail = dray_kv_seq_block(kv, sb, 0, 2);
    assert_int_equal(tail, dray_kv_seq_block(kv, sa, 0, 2));
    /* writing position 9 copies the shared block first */
    uint64_t copies;
    double secs;
    dray_kv_cow_stats(kv, &copies, &secs);
    assert_int_equal(copies, 0);
    uint32_t one = 1;
    assert_int_equal(dray_kv_step_begin(kv, 1, &sb, &one, err, sizeof(err)), 0);
    dray_kv_step_end(kv);
    dray_kv_cow_stats(kv, &copies, &secs);
    assert_int_equal(copies, 1);
    assert_int_not_equal(dray_kv_seq_block(kv, sb, 0, 2), tail);
    assert_int_equal(dray_kv_block_refs(kv, 0, (uint32_t)tail), 2); /* a and the cache */

    /* diverges inside a full block: its first 2 tokens are used */
    int32_t r[10];
    memcpy(r, a, 6 * sizeof(int32_t));
    run_of(r + 6, 4, 55);
    uint32_t sc = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, r, 10, sc), 6);
    dray_kv_seq_free(kv, sa);
    dray_kv_seq_free(kv, sb);
    dray_kv_seq_free(kv, sc);
    done(kv, pc);
}

static void test_pcache_tenants_never_share(void **state)
{
    (void)state;
    assert_int_equal(dray_pcache_salt(NULL), 0);
    assert_int_equal(dray_pcache_salt(""), 0);
    uint64_t alice = dray_pcache_salt("alice"), bob = dray_pcache_salt("bob");
    assert_true(alice != 0 && bob != 0 && alice != bob);
    assert_true(dray_pcache_salt("alice") == alice);

    struct dray_kv *kv = make_kv(0);
    struct dray_pcache *pc = make_pc(kv, 0);
    int32_t a[10];
    run_of(a, 10, 1);
    uint32_t sa = seq_of(kv, 10);
    dray_pcache_insert(pc, alice, a, 10, sa);
    uint32_t s = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, bob, a, 9, s), 0);
    assert_int_equal(dray_pcache_attach(pc, 0, a, 9, s), 0);
    assert_int_equal(dray_pcache_attach(pc, alice, a, 9, s), 9);
    /* the same tokens for bob are an entry of their own */
    dray_pcache_insert(pc, bob, a, 10, sa);
    assert_int_equal(stats(pc).entries, 6);
    dray_kv_seq_free(kv, sa);
    dray_kv_seq_free(kv, s);
    done(kv, pc);
}

static void test_pcache_evicts_least_recently_used_first(void **state)
{
    (void)state;
    struct dray_kv *kv = make_kv(0);
    struct dray_pcache *pc = make_pc(kv, 0); /* no host tier: evicted blocks are dropped */
    int32_t p[3][8];
    for (int i = 0; i < 3; i++) { /* three prefixes of two blocks, only the cache holds them */
        run_of(p[i], 8, 100 * (i + 1));
        uint32_t s = seq_of(kv, 8);
        dray_pcache_insert(pc, 0, p[i], 8, s);
        dray_kv_seq_free(kv, s);
    }
    assert_int_equal(stats(pc).blocks, 6);
    uint32_t s = empty_seq(kv); /* a hit makes p[0] the newest */
    assert_int_equal(dray_pcache_attach(pc, 0, p[0], 7, s), 7);
    dray_kv_seq_free(kv, s);

    uint32_t free0 = dray_kv_group_free_blocks(kv, 0);
    assert_int_equal(dray_kv_make_free(kv, 0, free0 + 2), free0 + 2);
    struct dray_pcache_stats st = stats(pc);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.entries, 4);
    assert_int_equal(st.spills, 0);
    uint32_t s1 = empty_seq(kv), s2 = empty_seq(kv), s3 = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, p[1], 7, s1), 0); /* the oldest went */
    assert_int_equal(dray_pcache_attach(pc, 0, p[2], 7, s2), 7);
    assert_int_equal(dray_pcache_attach(pc, 0, p[0], 7, s3), 7);
    dray_kv_seq_free(kv, s1);
    dray_kv_seq_free(kv, s3);

    /* blocks a running sequence uses are never taken: p[2] (s2) stays */
    free0 = dray_kv_group_free_blocks(kv, 0);
    assert_int_equal(dray_kv_make_free(kv, 0, free0 + 4), free0 + 2);
    assert_int_equal(stats(pc).entries, 2);
    uint32_t s4 = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, p[0], 7, s4), 0);
    assert_int_equal(dray_pcache_attach(pc, 0, p[2], 7, s4), 7);
    dray_kv_seq_free(kv, s2);
    dray_kv_seq_free(kv, s4);
    done(kv, pc);
}

static void test_pcache_spills_global_blocks_and_restores_them(void **state)
{
    (void)state;
    struct dray_kv *kv = make_kv(0);
    struct dray_pcache *pc = make_pc(kv, 1 << 20);
    int32_t a[8];
    run_of(a, 8, 1);
    uint32_t sa = seq_of(kv, 8);
    stamp(kv, sa, 2, 0x10);
    dray_pcache_insert(pc, 0, a, 8, sa);
    dray_kv_seq_free(kv, sa);

    uint32_t free0 = dray_kv_group_free_blocks(kv, 0);
    assert_int_equal(dray_kv_make_free(kv, 0, free0 + 2), free0 + 2);
    struct dray_pcache_stats st = stats(pc);
    assert_int_equal(st.spills, 2);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.host_bytes, 2 * dray_kv_block_host_bytes(kv, 0));

    uint32_t sb = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, a, 7, sb), 7);
    st = stats(pc);
    assert_int_equal(st.restores, 2);
    assert_int_equal(st.host_bytes, 0);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(check_stamp(kv, sb, 2, 0x10), 2); /* the KV came back as it was */
    dray_kv_seq_free(kv, sb);
    done(kv, pc);
}

static void test_pcache_spills_a_window_checkpoint_and_restores_it(void **state)
{
    (void)state;
    struct dray_kv *kv = make_kv(8); /* group 0 global, group 1 window 8 */
    assert_int_equal(dray_kv_get_plan(kv)->n_group, 2);
    struct dray_pcache *pc = make_pc(kv, 1 << 20);
    int32_t a[12];
    run_of(a, 12, 1);
    uint32_t sa = seq_of(kv, 12);
    /* a query at 12 sees positions 5..12: window entries 1 and 2 */
    assert_int_equal(dray_kv_seq_block(kv, sa, 1, 0), -1);
    stamp(kv, sa, 3, 0x40);
    dray_pcache_insert(pc, 0, a, 12, sa);
    struct dray_pcache_stats st = stats(pc);
    assert_int_equal(st.checkpoints, 1);
    assert_int_equal(st.blocks, 3 + 2);
    dray_kv_seq_free(kv, sa);

    uint32_t free1 = dray_kv_group_free_blocks(kv, 1);
    assert_int_equal(dray_kv_make_free(kv, 1, free1 + 2), free1 + 2);
    st = stats(pc);
    assert_int_equal(st.spills, 1);
    assert_int_equal(st.checkpoints, 1); /* on the host now */
    assert_int_equal(st.blocks, 3);
    assert_int_equal(st.host_bytes, 2 * dray_kv_block_host_bytes(kv, 1));

    uint32_t sb = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, a, 12, sb), 12);
    st = stats(pc);
    assert_int_equal(st.restores, 1);
    assert_int_equal(st.host_bytes, 0);
    assert_int_equal(st.blocks, 3 + 2);
    assert_int_equal(dray_kv_seq_block(kv, sb, 1, 0), -1);
    assert_int_equal(check_stamp(kv, sb, 3, 0x40), 3 + 2); /* global and window blocks */
    dray_kv_seq_free(kv, sb);
    done(kv, pc);
}

static void test_pcache_without_host_tier_drops_the_checkpoint(void **state)
{
    (void)state;
    struct dray_kv *kv = make_kv(8);
    struct dray_pcache *pc = make_pc(kv, 0);
    int32_t a[12];
    run_of(a, 12, 1);
    uint32_t sa = seq_of(kv, 12);
    dray_pcache_insert(pc, 0, a, 12, sa);
    dray_kv_seq_free(kv, sa);
    uint32_t free1 = dray_kv_group_free_blocks(kv, 1);
    assert_int_equal(dray_kv_make_free(kv, 1, free1 + 2), free1 + 2);
    struct dray_pcache_stats st = stats(pc);
    assert_int_equal(st.checkpoints, 0);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.entries, 3); /* the global blocks stay */
    /* without a checkpoint nothing serves a window layer's query */
    uint32_t sb = empty_seq(kv);
    assert_int_equal(dray_pcache_attach(pc, 0, a, 12, sb), 0);
    dray_kv_seq_free(kv, sb);
    done(kv, pc);
}

#define T(f) cmocka_unit_test_setup_teardown(f, fake_ops_setup, fake_ops_teardown)
static const struct CMUnitTest tests[] = {
    T(test_pcache_insert_then_lookup_shares_blocks),
    T(test_pcache_match_ends_inside_a_block),
    T(test_pcache_tenants_never_share),
    T(test_pcache_evicts_least_recently_used_first),
    T(test_pcache_spills_global_blocks_and_restores_them),
    T(test_pcache_spills_a_window_checkpoint_and_restores_it),
    T(test_pcache_without_host_tier_drops_the_checkpoint),
};

int main(void) { return cmocka_run_group_tests(tests, NULL, NULL); }
