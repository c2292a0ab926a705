/* The rescored output head (models/head_rescore.c, config head_precision and
 * head_rescore): a 4-bit copy of a tied head computes every logit, and its most
 * likely tokens of each row are computed again from the 8-bit embedding table. On a
 * tiny Gemma whose vocabulary is whole 16-row blocks (304 tokens) with a Q8_0
 * table, so the grouped head engages, three engines on the same file:
 *   8-bit  head_precision int8g: the table itself is the head
 *   4-bit  head_precision w4a8, head_rescore 0: the 4-bit logits as they are
 *   rescored  head_precision w4a8 (head_rescore and its tail at their defaults) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "ref_naive.h"
#include "testutil.h"
#include "tiny_gemma.h"

#define VOCAB 304u /* 19 blocks of 16 rows */

static const char *model_path(void)
{
    static const char *path;
    if (!path) {
        struct tiny_gemma t;
        tiny_gemma_defaults(&t);
        t.n_vocab = VOCAB;
        t.weight_type = DRAY_GGML_Q8_0;
        path = dray_test_path("tiny_rescore.gguf");
        assert_int_equal(tiny_gemma_write(&t, path), 0);
    }
    return path;
}

/* head: "int8g" / "w4a8" / "auto"; rescore: most candidates per row, or -1 for the
 * default; activations: "auto" (this Gemma's: one pass) or "int8x2" */
static struct dray_engine *open_engine_with(const char *head, int rescore, const char *activations)
{
    struct dray_config c;
    struct dray_engine *e = NULL;
    char err[1024], k[16];
    dray_config_defaults(&c);
    snprintf(c.backend, sizeof(c.backend), "cpu");
    snprintf(c.model, sizeof(c.model), "%s", model_path());
    snprintf(k, sizeof(k), "%d", rescore);
    assert_int_equal(dray_config_set(&c, "precision", "int8g", err, sizeof(err)), 0);
    assert_int_equal(dray_config_set(&c, "head_precision", head, err, sizeof(err)), 0);
    if (rescore >= 0)
        assert_int_equal(dray_config_set(&c, "head_rescore", k, err, sizeof(err)), 0);
    assert_int_equal(dray_config_set(&c, "activations", activations, err, sizeof(err)), 0);
    c.context = 64;
    c.max_seqs = 2;
    c.chunk = 16;
    c.kv_block = 4;
    c.threads = 2;
    if (dray_engine_open(&c, &e, err, sizeof(err)))
        fail_msg("engine (head %s, rescore %d): %s", head, rescore, err);
    return e;
}

static struct dray_engine *open_engine(const char *head, int rescore)
{
    return open_engine_with(head, rescore, "auto");
}

static struct dray_engine *open_engine_x2(const char *head)
{
    return open_engine_with(head, -1, "int8x2");
}

static int32_t *prompt(uint32_t n)
{
    int32_t *ids = malloc(n * sizeof(int32_t));
    ids[0] = 2; /* <bos> */
    for (uint32_t i = 1; i < n; i++)
        ids[i] = (int32_t)(6 + (i * 37) % (VOCAB - 6));
    return ids;
}

/* Over the 24 positions of a prompt (two prefill chunks, one slab of logits
 * rows): the tokens rescored are the 4-bit head's most likely ones (every one
 * above every token left alone), at least 16, and those left hold at most the
 * default head_rescore_tail (0.005) of the 4-bit probability (1.3x for the
 * selection's quarter-nat buckets); the rest are the 4-bit logits bit for bit.
 * The rescored ones are the 8-bit head's to within the rounding of its int8
 * activations (the rescore multiplies the same 8-bit weights by f32 ones), far
 * closer than the 4-bit values were. Greedy picks are the 8-bit head's. */
static void test_rescore_replaces_the_likely_tokens_with_8bit_logits(void **state)
{
    (void)state;
    const uint32_t n = 24;
    int32_t *ids = prompt(n);
    struct dray_engine *e8 = open_engine("int8g", -1), *e4 = open_engine("w4a8", 0),
                       *ek = open_engine("w4a8", -1);
    float *l8 = ref_engine_logits(e8, ids, n, VOCAB), *l4 = ref_engine_logits(e4, ids, n, VOCAB),
          *lk = ref_engine_logits(ek, ids, n, VOCAB);
    uint64_t rows, cands;
    dray_engine_rescore_stats(ek, &rows, &cands);
    assert_int_equal(rows, n);
    double err_k = 0, err_4 = 0, spread = 0;
    uint32_t total = 0;
    for (uint32_t p = 0; p < n; p++) {
        const float *a = l8 + p * VOCAB, *b = l4 + p * VOCAB, *c = lk + p * VOCAB;
        float lo_changed = INFINITY, hi_kept = -INFINITY, top = -INFINITY;
        double z = 0, left = 0;
        uint32_t changed = 0;
        for (uint32_t v = 0; v < VOCAB; v++)
            top = fmaxf(top, b[v]);
        for (uint32_t v = 0; v < VOCAB; v++) {
            spread = fmax(spread, fabs(a[v]));
            z += exp(b[v] - top);
            if (c[v] == b[v]) {
                hi_kept = fmaxf(hi_kept, b[v]);
                left += exp(b[v] - top);
                continue;
            }
            changed++;
            lo_changed = fminf(lo_changed, b[v]);
            err_k = fmax(err_k, fabs(c[v] - a[v]));
            err_4 = fmax(err_4, fabs(b[v] - a[v]));
        }
        assert_true(hi_kept < lo_changed);
        assert_true(changed >= 16);
        assert_true(left <= 1.3 * 0.005 * z);
        assert_int_equal(ref_argmax_f(c, VOCAB), ref_argmax_f(a, VOCAB));
        total += changed;
    }
    assert_int_equal(cands, total);
    printf("# %.1f of %u tokens rescored per row; vs the 8-bit head: rescored %.5f, 4-bit %.5f "
           "(largest |logit| %.3f)\n", (double)total / n, VOCAB, err_k, err_4, spread);
    /* measured: 111 tokens a row (a random model's rows are flat); rescored
     * 0.0002 with two-pass activations (0.055 with one pass), 4-bit 0.53,
     * largest 13.7 */
    assert_true(err_k < 0.01 * spread);
    assert_true(err_k < 0.25 * err_4);
    free(l8);
    free(l4);
    free(lk);
    free(ids);
    dray_engine_close(e8);
    dray_engine_close(e4);
    dray_engine_close(ek);
}

/* Two sessions decoded in lockstep (one forward step, two rows of logits, as the
 * scheduler runs them) pick the 8-bit head's greedy tokens for 12 steps. */
static void test_rescore_batched_greedy_decode_follows_the_8bit_head(void **state)
{
    (void)state;
    struct dray_engine *e[2] = {open_engine("int8g", -1), open_engine("w4a8", -1)};
    int32_t got[2][12][2];
    char err[512];
    float *logits = malloc(2 * VOCAB * sizeof(float));
    for (int m = 0; m < 2; m++) {
        struct dray_session *s[2];
        int32_t a[6] = {2, 40, 41, 42, 43, 44}, b[4] = {2, 270, 271, 272}, next[2] = {45, 273};
        assert_int_equal(dray_session_new(e[m], &s[0], err, sizeof(err)), 0);
        assert_int_equal(dray_session_new(e[m], &s[1], err, sizeof(err)), 0);
        assert_int_equal(dray_session_prefill(s[0], a, 6, err, sizeof(err)), 0);
        assert_int_equal(dray_session_prefill(s[1], b, 4, err, sizeof(err)), 0);
        for (int step = 0; step < 12; step++) {
            if (dray_sessions_decode(s, 2, next, logits, err, sizeof(err)))
                fail_msg("decode: %s", err);
            for (int i = 0; i < 2; i++)
                got[m][step][i] = next[i] = (int32_t)ref_argmax_f(logits + i * VOCAB, VOCAB);
        }
        dray_session_free(s[0]);
        dray_session_free(s[1]);
    }
    assert_memory_equal(got[0], got[1], sizeof(got[0]));
    free(logits);
    dray_engine_close(e[0]);
    dray_engine_close(e[1]);
}

/* A decode step reads the 4-bit head, and per candidate rescored its 8-bit row
 * as group rows (64 codes, 2 f32 scales, 2 group-row ids) and its f32 copy,
 * written and read back (2 x 64 x 4 bytes): the roofline counts both. auto is
 * the rescored head under one-pass activations (this Gemma's own) and the 8-bit
 * head under two-pass ones. */
static void test_rescore_step_bytes_count_both_heads(void **state)
{
    (void)state;
    struct dray_engine *e8 = open_engine("int8g", -1), *e4 = open_engine("w4a8", 0),
                       *ek = open_engine("w4a8", -1), *ed = open_engine("auto", -1),
                       *e2 = open_engine_x2("auto");
    const struct dray_engine_info *i8 = dray_engine_get_info(e8), *i4 = dray_engine_get_info(e4),
                                  *ik = dray_engine_get_info(ek), *id = dray_engine_get_info(ed),
                                  *i2 = dray_engine_get_info(e2);
    assert_true(i4->step_weight_bytes < i8->step_weight_bytes);
    assert_int_equal(ik->step_weight_bytes, i4->step_weight_bytes);
    assert_int_equal(ik->rescore_bytes, 64 + 2 * 4 + 2 * 4 + 2 * 64 * 4);
    assert_int_equal(i4->rescore_bytes, 0);
    assert_int_equal(i8->rescore_bytes, 0);
    assert_int_equal(id->step_weight_bytes, ik->step_weight_bytes);
    assert_int_equal(id->rescore_bytes, ik->rescore_bytes);
    assert_true(i2->rescore_bytes == 0 && i2->step_weight_bytes > ik->step_weight_bytes);
    dray_engine_close(e8);
    dray_engine_close(e4);
    dray_engine_close(ek);
    dray_engine_close(ed);
    dray_engine_close(e2);
}

/* A separate output.weight has no 8-bit table beside it to rescore from: w4a8
 * makes it plain 4-bit (fewer bytes than int8g, nothing rescored), auto keeps
 * it 8-bit. */
static void test_rescore_needs_a_tied_head(void **state)
{
    (void)state;
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    t.n_vocab = VOCAB;
    t.weight_type = DRAY_GGML_Q8_0;
    t.arch = "llama";
    t.output_head = 1;
    const char *path = dray_test_path("tiny_rescore_untied.gguf");
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    static const char *const head[] = {"auto", "int8g", "w4a8"};
    uint64_t bytes[3];
    for (int i = 0; i < 3; i++) {
        struct dray_config c;
        struct dray_engine *e = NULL;
        char err[1024];
        dray_config_defaults(&c);
        snprintf(c.backend, sizeof(c.backend), "cpu");
        snprintf(c.model, sizeof(c.model), "%s", path);
        assert_int_equal(dray_config_set(&c, "precision", "int8g", err, sizeof(err)), 0);
        assert_int_equal(dray_config_set(&c, "head_precision", head[i], err, sizeof(err)), 0);
        c.context = 64;
        c.max_seqs = 1;
        c.threads = 2;
        if (dray_engine_open(&c, &e, err, sizeof(err)))
            fail_msg("engine: %s", err);
        assert_int_equal(dray_engine_get_info(e)->rescore_bytes, 0);
        bytes[i] = dray_engine_get_info(e)->step_weight_bytes;
        dray_engine_close(e);
    }
    assert_int_equal(bytes[0], bytes[1]);
    assert_true(bytes[2] < bytes[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rescore_replaces_the_likely_tokens_with_8bit_logits),
        cmocka_unit_test(test_rescore_batched_greedy_decode_follows_the_8bit_head),
        cmocka_unit_test(test_rescore_step_bytes_count_both_heads),
        cmocka_unit_test(test_rescore_needs_a_tied_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
