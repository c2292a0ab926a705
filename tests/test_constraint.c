/* A generation's grammar in the decode loop (core/constraint.h) on a tiny
 * Gemma 3's vocabulary: the draw that tests only the sampler's best candidates
 * is the draw under the whole mask, id for id, for greedy and top-k sampling;
 * a plain-temperature draw is always allowed; and generation under a grammar
 * writes a sentence of it and ends where nothing can follow. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "constraint.h"
#include "dray/dray.h"
#include "engine_internal.h"
#include "grammar.h"
#include "sampler.h"
#include "testutil.h"
#include "tiny_gemma.h"

/* Words and bytes the tiny vocabulary has: digits come as byte tokens. */
static const char GRAMMAR[] = "root ::= \"[\" item (\",\" item)* \"]\"\nitem ::= [0-9] [0-9]?\n";

static struct dray_engine *engine;

static int setup(void **state)
{
    (void)state;
    struct tiny_gemma t;
    struct dray_config c;
    char err[512];
    tiny_gemma_defaults(&t);
    const char *path = dray_test_path("constraint_tiny.gguf");
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", path);
    c.precision = DRAY_PRECISION_F32;
    c.max_seqs = 1;
    c.threads = 1;
    if (dray_engine_open(&c, &engine, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dray_engine_close(engine);
    return 0;
}

static struct dray_sampler *sampler(float temperature, uint32_t top_k, float top_p, uint64_t seed)
{
    struct dray_sampler_params p = {.temperature = temperature, .top_k = top_k, .top_p = top_p,
                                    .repeat_penalty = 1, .seed = seed};
    struct dray_sampler *s;
    char err[256];
    assert_int_equal(dray_sampler_create(&p, &s, err, sizeof(err)), 0);
    return s;
}

static struct dray_constraint *constraint_of(const char *grammar)
{
    struct dray_gen_params g = {.grammar = grammar};
    struct dray_constraint *c;
    char err[256];
    assert_int_equal(dray_constraint_new(engine, &g, &c, err, sizeof(err)), 0);
    assert_non_null(c);
    return c;
}

static struct dray_constraint *constraint(void)
{
    return constraint_of(GRAMMAR);
}

static void random_row(float *row, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        row[i] = dray_test_randf(-6, 6);
}

struct text {
    char s[512];
    size_t n;
};

static int collect(void *user, const char *text, size_t len, int32_t id)
{
    (void)id;
    struct text *o = user;
    if (o->n + len < sizeof(o->s)) {
        memcpy(o->s + o->n, text, len);
        o->n += len;
    }
    return 0;
}

/* The reference: the whole mask applied, then the same sampler. */
static int32_t masked_draw(struct dray_constraint *c, struct dray_sampler *s, const float *row, uint32_t n)
{
    long k;
    int rc;
    const uint32_t *allow = dray_constraint_mask(c, &k, &rc);
    assert_non_null(allow);
    return dray_sampler_sample_allowed(s, row, n, NULL, 0, allow);
}

/* Greedy and top-k (with top-p among the k) draws test only the best
 * candidates, and equal the whole mask's draw with the same random stream,
 * at every step of a walk through the grammar. */
static void test_best_candidates_equal_the_whole_mask(void **state)
{
    (void)state;
    uint32_t n = engine->info.n_vocab;
    float *row = malloc(n * sizeof(*row));
    static const struct { float t; uint32_t k; float p; } cases[] = {{0, 0, 1}, {0.8f, 5, 1}, {1.2f, 40, 0.9f}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        struct dray_constraint *c = constraint(), *ref = constraint();
        struct dray_sampler *a = sampler(cases[ci].t, cases[ci].k, cases[ci].p, 42);
        struct dray_sampler *b = sampler(cases[ci].t, cases[ci].k, cases[ci].p, 42);
        dray_test_seed(7 + ci);
        for (int step = 0; step < 40 && !dray_constraint_must_end(c); step++) {
            random_row(row, n);
            bool dead;
            int32_t got = dray_constraint_sample(c, a, row, n, NULL, 0, false, &dead);
            int32_t want = masked_draw(ref, b, row, n);
            assert_false(dead);
            assert_int_equal(got, want);
            assert_int_equal(dray_constraint_accept(c, got), 0);
            assert_int_equal(dray_constraint_accept(ref, want), 0);
        }
        dray_sampler_free(a);
        dray_sampler_free(b);
        dray_constraint_free(c);
        dray_constraint_free(ref);
    }
    free(row);
}

/* Where the grammar allows most tokens, a greedy or top-k draw never computes
 * the whole mask: its best candidates settle it. */
static void test_loose_grammar_needs_no_whole_mask(void **state)
{
    (void)state;
    uint32_t n = engine->info.n_vocab;
    float *row = malloc(n * sizeof(*row));
    static const char loose[] = "root ::= [a-z0-9 ]*";
    struct dray_constraint *c = constraint_of(loose);
    struct dray_sampler *s = sampler(0.7f, 20, 1, 1);
    struct dray_grammar *g;
    struct dray_grammar_matcher *m; /* the same grammar, to find what it allows */
    char err[256];
    assert_int_equal(dray_grammar_parse(loose, strlen(loose), &g, err, sizeof(err)), 0);
    assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
    const struct dray_grammar_vocab *v = dray_engine_grammar_vocab(engine);
    dray_test_seed(5);
    for (int step = 0; step < 30; step++) {
        random_row(row, n);
        for (uint32_t i = 0; i < n; i++) /* the letters and digits lead */
            if (!dray_grammar_peek_token(m, v, (int32_t)i))
                row[i] += 8;
        bool dead;
        int32_t id = dray_constraint_sample(c, s, row, n, NULL, 0, false, &dead);
        assert_false(dead);
        assert_int_equal(dray_constraint_accept(c, id), 0);
        assert_int_equal(dray_grammar_accept_token(m, v, id), 0);
    }
    assert_int_equal(dray_constraint_full_masks(c), 0);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    dray_sampler_free(s);
    dray_constraint_free(c);
    free(row);
}

/* Temperature alone keeps a free draw the grammar allows and redraws under the
 * mask otherwise: every token drawn is allowed. */
static void test_plain_temperature_draws_are_allowed(void **state)
{
    (void)state;
    uint32_t n = engine->info.n_vocab;
    float *row = malloc(n * sizeof(*row));
    struct dray_constraint *c = constraint();
    struct dray_sampler *s = sampler(1.0f, 0, 1, 3);
    dray_test_seed(99);
    int steps = 0;
    for (; steps < 60 && !dray_constraint_must_end(c); steps++) {
        random_row(row, n);
        bool dead;
        int32_t id = dray_constraint_sample(c, s, row, n, NULL, 0, false, &dead);
        assert_false(dead);
        assert_int_equal(dray_constraint_accept(c, id), 0);
    }
    assert_true(steps > 1);
    dray_sampler_free(s);
    dray_constraint_free(c);
    free(row);
}

/* Generation under a grammar writes one of its sentences and stops where
 * nothing may follow. */
static void test_generation_follows_the_grammar(void **state)
{
    (void)state;
    struct dray_session *sess;
    struct dray_gen_params g;
    struct dray_gen_stats st = {0};
    char err[512];
    struct dray_config c;
    dray_config_defaults(&c);
    dray_gen_params_from_config(&c, &g);
    g.grammar = "root ::= \"[\" [0-9] (\",\" [0-9])* \"]\"";
    g.max_tokens = 200;
    g.seed = 5;
    assert_int_equal(dray_session_new(engine, &sess, err, sizeof(err)), 0);
    int32_t prompt[] = {2, 10, 11};
    struct text out = {0};
    assert_int_equal(dray_session_generate(sess, prompt, 3, &g, collect, &out, &st, err, sizeof(err)), 0);
    struct dray_grammar *gr;
    struct dray_grammar_matcher *m;
    assert_int_equal(dray_grammar_parse(g.grammar, strlen(g.grammar), &gr, err, sizeof(err)), 0);
    assert_int_equal(dray_grammar_matcher_new(gr, &m), 0);
    if (!strcmp(st.stop_reason, "grammar") || !strcmp(st.stop_reason, "eog")) {
        assert_int_equal(dray_grammar_accept_bytes(m, out.s, out.n), 0);
        assert_true(dray_grammar_can_end(m));
    } else {
        assert_string_equal(st.stop_reason, "max tokens");
        assert_int_equal(dray_grammar_accept_bytes(m, out.s, out.n), 0); /* a prefix of one */
    }
    dray_grammar_matcher_free(m);
    dray_grammar_free(gr);
    dray_session_free(sess);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_best_candidates_equal_the_whole_mask),
        cmocka_unit_test(test_loose_grammar_needs_no_whole_mask),
        cmocka_unit_test(test_plain_temperature_draws_are_allowed),
        cmocka_unit_test(test_generation_follows_the_grammar),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
