/* Sampler and stop-string tests. Draw counts are checked with a chi-square
 * statistic at a fixed seed against the probabilities the filters must leave. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "dray/dray.h"
#include "sampler.h"
#include "stop.h"
#include "testutil.h"

static char err[256];

static struct dray_sampler_params off(float temp, uint64_t seed)
{
    struct dray_sampler_params p = {
        .temperature = temp, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1,
        .repeat_last_n = 0, .seed = seed,
    };
    return p;
}

static struct dray_sampler *make(const struct dray_sampler_params *p)
{
    struct dray_sampler *s = NULL;
    assert_int_equal(dray_sampler_create(p, &s, err, sizeof(err)), 0);
    return s;
}

/* Draw n times; counts[id]++. */
static void draw_counts(struct dray_sampler *s, const float *l, uint32_t nv, int n, int *counts)
{
    memset(counts, 0, sizeof(int) * nv);
    for (int i = 0; i < n; i++) {
        int32_t id = dray_sampler_sample(s, l, nv, NULL, 0);
        assert_true(id >= 0 && (uint32_t)id < nv);
        counts[id]++;
    }
}

/* Pearson chi-square of counts against probabilities want (0 = must never occur). */
static double chi2(const int *counts, const double *want, uint32_t nv, int n)
{
    double x = 0;
    for (uint32_t i = 0; i < nv; i++) {
        if (want[i] == 0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double e = want[i] * n;
        x += (counts[i] - e) * (counts[i] - e) / e;
    }
    return x;
}

/* softmax(l / t) restricted to keep[] (NULL = all), renormalized */
static void softmax(const float *l, uint32_t nv, float t, const int *keep, double *out)
{
    double m = -INFINITY, z = 0;
    for (uint32_t i = 0; i < nv; i++)
        if ((!keep || keep[i]) && l[i] > m)
            m = l[i];
    for (uint32_t i = 0; i < nv; i++) {
        out[i] = !keep || keep[i] ? exp((l[i] - m) / t) : 0;
        z += out[i];
    }
    for (uint32_t i = 0; i < nv; i++)
        out[i] /= z;
}

/* chi-square critical values at p = 0.001 for df = 1..5 */
static const double crit[6] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};

/* ------------------------------------------------------------------- tests */

static void test_sampler_greedy_is_argmax_with_lowest_id_on_ties(void **state)
{
    (void)state;
    struct dray_sampler_params p = off(0, 1);
    struct dray_sampler *s = make(&p);
    float l[6] = {1, 3, 2, 3, -5, 3};
    assert_int_equal(dray_sampler_sample(s, l, 6, NULL, 0), 1);
    float neg[3] = {-INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(dray_sampler_sample(s, neg, 3, NULL, 0), 0);
    float nan_first[3] = {NAN, -1, 0.5f};
    assert_int_equal(dray_sampler_sample(s, nan_first, 3, NULL, 0), 2);
    /* large vocab: the max sits at the end */
    float *big = malloc(sizeof(float) * 262144);
    for (uint32_t i = 0; i < 262144; i++)
        big[i] = (float)(i % 1000) * 0.01f;
    big[262143] = 11.0f;
    big[7] = 11.0f;
    assert_int_equal(dray_sampler_sample(s, big, 262144, NULL, 0), 7);
    free(big);
    assert_int_equal(dray_sampler_sample(s, l, 0, NULL, 0), DRAY_EINVAL);
    dray_sampler_free(s);
}

/* dray_greedy_token (the public pick that bench model times) and dray_max_f32
 * over every length up to two blocks of 16 and every place of the maximum:
 * the vectorized blocks and the scalar tail agree, NaN never wins. */
static void test_greedy_token_is_the_lowest_id_of_the_largest_at_every_length(void **state)
{
    (void)state;
    float x[40];
    for (uint32_t n = 1; n <= 40; n++)
        for (uint32_t at = 0; at < n; at++) {
            for (uint32_t i = 0; i < n; i++)
                x[i] = i % 3 ? (float)i * -0.5f : NAN;
            x[at] = 7.0f;
            if (at + 1 < n)
                x[n - 1] = 7.0f; /* a tie after it: the lower id */
            assert_int_equal(dray_greedy_token(x, n), (int32_t)at);
            assert_true(dray_max_f32(x, n) == 7.0f);
        }
    float nan3[3] = {NAN, NAN, NAN};
    assert_int_equal(dray_greedy_token(nan3, 3), 0);
    assert_true(dray_max_f32(nan3, 3) == -INFINITY);
    float neg[20];
    for (int i = 0; i < 20; i++)
        neg[i] = -INFINITY;
    assert_int_equal(dray_greedy_token(neg, 20), 0);
}

static void test_sampler_draws_follow_softmax_at_two_temperatures(void **state)
{
    (void)state;
    float l[5] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
    int counts[5];
    double want[5];
    const float temps[2] = {1.0f, 0.5f};
    for (int t = 0; t < 2; t++) {
        struct dray_sampler_params p = off(temps[t], 12345);
        struct dray_sampler *s = make(&p);
        draw_counts(s, l, 5, 100000, counts);
        softmax(l, 5, temps[t], NULL, want);
        double x = chi2(counts, want, 5, 100000);
        assert_true(x < crit[4]);
        dray_sampler_free(s);
    }
    /* a wrong temperature is detected: counts at T=0.5 vs softmax at T=1 */
    struct dray_sampler_params p = off(0.5f, 12345);
    struct dray_sampler *s = make(&p);
    draw_counts(s, l, 5, 100000, counts);
    softmax(l, 5, 1.0f, NULL, want);
    assert_true(chi2(counts, want, 5, 100000) > 100 * crit[4]);
    dray_sampler_free(s);
}

static void test_sampler_top_k_keeps_only_k_best(void **state)
{
    (void)state;
    struct dray_sampler_params p = off(1.0f, 7);
    p.top_k = 3;
    struct dray_sampler *s = make(&p);
    float l[6] = {0.1f, 1.5f, 0.2f, 1.0f, 1.2f, 0.9f}; /* best: 1, 4, 3 */
    int counts[6], keep[6] = {0, 1, 0, 1, 1, 0};
    double want[6];
    draw_counts(s, l, 6, 60000, counts);
    softmax(l, 6, 1.0f, keep, want);
    assert_true(chi2(counts, want, 6, 60000) < crit[2]);
    dray_sampler_free(s);

    /* ties at the cut: the lower id stays */
    p.top_k = 2;
    s = make(&p);
    float t[4] = {1.0f, 2.0f, 1.0f, 1.0f};
    draw_counts(s, t, 4, 20000, counts);
    assert_int_equal(counts[2] + counts[3], 0);
    assert_true(counts[0] > 0 && counts[1] > 0);
    dray_sampler_free(s);
}

static void test_sampler_top_p_keeps_smallest_prefix_reaching_p(void **state)
{
    (void)state;
    /* probabilities 0.5, 0.3, 0.15, 0.05 */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int counts[4], keep[4] = {1, 1, 0, 0};
    double want[4];
    struct dray_sampler_params p = off(1.0f, 99);
    p.top_p = 0.75f; /* 0.5 < 0.75 <= 0.8: two tokens */
    struct dray_sampler *s = make(&p);
    draw_counts(s, l, 4, 40000, counts);
    softmax(l, 4, 1.0f, keep, want);
    assert_true(chi2(counts, want, 4, 40000) < crit[1]);
    dray_sampler_free(s);

    p.top_p = 0.9f; /* needs the third token too */
    s = make(&p);
    draw_counts(s, l, 4, 40000, counts);
    keep[2] = 1;
    softmax(l, 4, 1.0f, keep, want);
    assert_true(chi2(counts, want, 4, 40000) < crit[2]);
    dray_sampler_free(s);

    /* top_p 0 keeps only the most likely token, as OpenAI reads it */
    p.top_p = 0.0f;
    s = make(&p);
    float l2[4] = {logf(0.3f), logf(0.5f), logf(0.15f), logf(0.05f)};
    draw_counts(s, l2, 4, 1000, counts);
    assert_int_equal(counts[1], 1000);
    dray_sampler_free(s);
}

static void test_sampler_min_p_drops_tokens_below_fraction_of_max(void **state)
{
    (void)state;
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int counts[4], keep[4] = {1, 1, 1, 0};
    double want[4];
    struct dray_sampler_params p = off(1.0f, 5);
    p.min_p = 0.2f; /* floor 0.1: 0.05 goes */
    struct dray_sampler *s = make(&p);
    draw_counts(s, l, 4, 40000, counts);
    softmax(l, 4, 1.0f, keep, want);
    assert_true(chi2(counts, want, 4, 40000) < crit[2]);
    dray_sampler_free(s);

    /* min-p after top-k: the max of the survivors is the reference */
    p.top_k = 2;
    p.min_p = 0.7f; /* 0.3 / 0.5 = 0.6 < 0.7: only token 0 */
    s = make(&p);
    draw_counts(s, l, 4, 1000, counts);
    assert_int_equal(counts[0], 1000);
    dray_sampler_free(s);
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_sampler_large_vocab_top_p_matches_brute_force_nucleus(void **state)
{
    (void)state;
    const uint32_t nv = 262144;
    float *l = malloc(sizeof(float) * nv), *sorted = malloc(sizeof(float) * nv);
    dray_test_seed(3);
    for (uint32_t i = 0; i < nv; i++) /* a long tail plus a few strong tokens */
        l[i] = dray_test_randf(-4, 4) + (i % 9973 == 0 ? 6.0f : 0.0f);
    /* brute force: sort all, find the cut logit of the 0.9 nucleus at T = 0.8 */
    memcpy(sorted, l, sizeof(float) * nv);
    qsort(sorted, nv, sizeof(float), cmp_desc);
    double z = 0, cum = 0;
    for (uint32_t i = 0; i < nv; i++)
        z += exp((sorted[i] - sorted[0]) / 0.8);
    uint32_t cut = 0;
    while (cum < 0.9 * z)
        cum += exp((sorted[cut++] - sorted[0]) / 0.8);
    float cut_logit = sorted[cut - 1];
    assert_true(cut > 1000); /* the tail matters: a real threshold search */

    struct dray_sampler_params p = off(0.8f, 2024);
    p.top_p = 0.9f;
    struct dray_sampler *s = make(&p);
    int below = 0, strong = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 200; i++) {
        int32_t id = dray_sampler_sample(s, l, nv, NULL, 0);
        assert_true(id >= 0);
        below += l[id] < cut_logit;
        strong += id % 9973 == 0; /* ~16% of the mass */
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(below, 0);
    assert_true(strong > 0 && strong < 200);
    double ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6) / 200;
    print_message("top_p 0.9 over 262144 logits: %.2f ms per sample\n", ms);
    dray_sampler_free(s);

    p.top_p = 1;
    p.top_k = 40;
    s = make(&p);
    float kth = sorted[39];
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 200; i++) {
        int32_t id = dray_sampler_sample(s, l, nv, NULL, 0);
        assert_true(l[id] >= kth);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6) / 200;
    print_message("top_k 40 over 262144 logits: %.2f ms per sample\n", ms);
    dray_sampler_free(s);
    free(l);
    free(sorted);
}

static void test_sampler_repeat_penalty_divides_positive_multiplies_negative(void **state)
{
    (void)state;
    struct dray_sampler_params p = off(0, 1);
    p.repeat_penalty = 2.0f;
    struct dray_sampler *s = make(&p);
    float l[4] = {2.0f, 1.9f, -1.0f, -1.5f};
    int32_t h1[2] = {0, 0}; /* repeated id penalized once: 2 -> 1 */
    assert_int_equal(dray_sampler_sample(s, l, 4, h1, 2), 1);
    float n[2] = {-1.0f, -1.5f};
    int32_t h2[1] = {0}; /* -1 -> -2 < -1.5 */
    assert_int_equal(dray_sampler_sample(s, n, 2, h2, 1), 1);
    int32_t h3[3] = {-7, 99, 1}; /* out-of-range ids ignored */
    assert_int_equal(dray_sampler_sample(s, l, 4, h3, 3), 0);
    dray_sampler_free(s);

    /* repeat_last_n: only the newest ids count */
    p.repeat_last_n = 1;
    s = make(&p);
    int32_t h4[2] = {0, 1};
    assert_int_equal(dray_sampler_sample(s, l, 4, h4, 2), 0);
    dray_sampler_free(s);
}

/* OpenAI's penalties: an id generated c times loses c * frequency + presence; the
 * prompt's tokens (the first n_prompt of the history) do not count. */
static void test_sampler_frequency_and_presence_penalties_count_generated_tokens(void **state)
{
    (void)state;
    float l[2] = {1.0f, 1.4f};
    int32_t twice[2] = {1, 1}, four[4] = {1, 1, 1, 1};
    struct dray_sampler_params p = off(0, 1);
    p.frequency_penalty = 0.15f; /* 1.4 - 2 * 0.15 = 1.1 > 1.0 */
    struct dray_sampler *s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 2, twice, 2), 1);
    dray_sampler_free(s);
    p.frequency_penalty = 0.25f; /* 1.4 - 2 * 0.25 = 0.9 < 1.0: the count scales it */
    s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 2, twice, 2), 0);
    assert_int_equal(dray_sampler_sample(s, l, 2, NULL, 0), 1); /* counts start again at 0 */
    dray_sampler_free(s);
    p.n_prompt = 2; /* the same two tokens as the prompt: not penalized */
    s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 2, twice, 2), 1);
    dray_sampler_free(s);

    p = off(0, 1);
    p.presence_penalty = 0.3f; /* once, however often: 1.4 - 0.3 = 1.1 */
    s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 2, twice, 2), 1);
    assert_int_equal(dray_sampler_sample(s, l, 2, four, 4), 1);
    dray_sampler_free(s);
    p.presence_penalty = 0.5f; /* 0.9 */
    s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 2, twice, 2), 0);
    dray_sampler_free(s);

    p = off(0, 1);
    p.frequency_penalty = -0.5f; /* negative: encourages; id 0 once: 1.5 > 1.4 */
    s = make(&p);
    int32_t zero[1] = {0};
    assert_int_equal(dray_sampler_sample(s, l, 2, zero, 1), 0);
    dray_sampler_free(s);
}

/* logit_bias is added to its id's logit; -inf bans the id at any temperature;
 * ids outside the vocabulary are ignored. */
static void test_sampler_logit_bias_adds_to_the_logit(void **state)
{
    (void)state;
    float l[3] = {1.0f, 1.4f, 0.5f};
    struct dray_logit_bias up[2] = {{0, 0.5f}, {7, 100.0f}}, down[1] = {{1, -100.0f}};
    struct dray_logit_bias ban[2] = {{1, -INFINITY}, {0, -INFINITY}};
    struct dray_sampler_params p = off(0, 1);
    p.bias = up;
    p.n_bias = 2;
    struct dray_sampler *s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 3, NULL, 0), 0); /* 1.5 > 1.4 */
    dray_sampler_free(s);
    p.bias = down;
    p.n_bias = 1;
    s = make(&p);
    down[0].bias = 0; /* the sampler keeps its own copy */
    assert_int_equal(dray_sampler_sample(s, l, 3, NULL, 0), 0);
    dray_sampler_free(s);
    p.bias = ban;
    p.n_bias = 2;
    s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 3, NULL, 0), 2);
    dray_sampler_free(s);

    /* temperature 1: a banned id is never drawn, the others keep their odds */
    p = off(1.0f, 5);
    p.bias = ban;
    p.n_bias = 1;
    s = make(&p);
    int counts[3], n = 20000;
    double want[3];
    int keep[3] = {1, 0, 1};
    softmax(l, 3, 1.0f, keep, want);
    draw_counts(s, l, 3, n, counts);
    assert_int_equal(counts[1], 0);
    assert_true(chi2(counts, want, 3, n) < crit[1]);
    dray_sampler_free(s);

    struct dray_logit_bias bad[1] = {{0, INFINITY}};
    p.bias = bad;
    struct dray_sampler *none = NULL;
    assert_int_equal(dray_sampler_create(&p, &none, err, sizeof(err)), DRAY_EINVAL);
    bad[0].bias = NAN;
    assert_int_equal(dray_sampler_create(&p, &none, err, sizeof(err)), DRAY_EINVAL);
    assert_null(none);
}

/* The hold ids (end of generation, stop ids) cannot be sampled before
 * min_tokens tokens were generated; the prompt does not count. */
static void test_sampler_hold_waits_for_min_tokens(void **state)
{
    (void)state;
    float l[2] = {1.0f, 3.0f};
    int32_t hold[1] = {1}, hist[3] = {1, 0, 0};
    struct dray_sampler_params p = off(0, 1);
    p.hold = hold;
    p.n_hold = 1;
    p.min_tokens = 2;
    p.n_prompt = 1;
    struct dray_sampler *s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 2, hist, 1), 0); /* none generated */
    assert_int_equal(dray_sampler_sample(s, l, 2, hist, 2), 0); /* one */
    assert_int_equal(dray_sampler_sample(s, l, 2, hist, 3), 1); /* two: free again */
    dray_sampler_free(s);
    p.min_tokens = 0; /* no minimum: held ids are free from the start */
    s = make(&p);
    assert_int_equal(dray_sampler_sample(s, l, 2, hist, 1), 1);
    dray_sampler_free(s);
}

static void test_sampler_same_seed_same_stream(void **state)
{
    (void)state;
    float l[8] = {0.1f, 0.3f, 0.2f, 0.0f, 0.5f, 0.4f, 0.25f, 0.15f};
    struct dray_sampler_params p = off(1.0f, 42);
    struct dray_sampler *a = make(&p), *b = make(&p);
    p.seed = 43;
    struct dray_sampler *c = make(&p);
    int diff = 0;
    int32_t first[500];
    for (int i = 0; i < 500; i++) {
        first[i] = dray_sampler_sample(a, l, 8, NULL, 0);
        assert_int_equal(first[i], dray_sampler_sample(b, l, 8, NULL, 0));
        diff += first[i] != dray_sampler_sample(c, l, 8, NULL, 0);
    }
    assert_true(diff > 100);
    dray_sampler_reseed(a, 42);
    for (int i = 0; i < 500; i++)
        assert_int_equal(first[i], dray_sampler_sample(a, l, 8, NULL, 0));
    dray_sampler_free(a);
    dray_sampler_free(b);
    dray_sampler_free(c);
}

static void test_sampler_uniform_is_in_unit_interval_and_even(void **state)
{
    (void)state;
    struct dray_sampler_params p = off(1.0f, 8);
    struct dray_sampler *s = make(&p);
    int bins[10] = {0};
    for (int i = 0; i < 100000; i++) {
        double u = dray_sampler_uniform(s);
        assert_true(u >= 0 && u < 1);
        bins[(int)(u * 10)]++;
    }
    double x = 0;
    for (int i = 0; i < 10; i++)
        x += (bins[i] - 10000.0) * (bins[i] - 10000.0) / 10000.0;
    assert_true(x < 27.88); /* df 9, p = 0.001 */
    dray_sampler_free(s);
}

static void test_sampler_rejects_bad_params(void **state)
{
    (void)state;
    struct dray_sampler *s = NULL;
    struct dray_sampler_params p = off(-1, 1);
    assert_int_equal(dray_sampler_create(&p, &s, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "temperature"));
    p = off(1, 1);
    p.top_p = -0.1f; /* 0 is valid: the most likely token only */
    assert_int_equal(dray_sampler_create(&p, &s, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "top_p"));
    p.top_p = 1;
    p.min_p = 1.5f;
    assert_int_equal(dray_sampler_create(&p, &s, err, sizeof(err)), DRAY_EINVAL);
    p.min_p = 0;
    p.repeat_penalty = 0;
    assert_int_equal(dray_sampler_create(&p, &s, err, sizeof(err)), DRAY_EINVAL);
    assert_null(s);
    /* the defaults are the config's (its key table is their one source), and valid */
    struct dray_config c;
    dray_config_defaults(&c);
    p = (struct dray_sampler_params){.temperature = c.temperature, .top_k = c.top_k, .top_p = c.top_p,
                                     .min_p = c.min_p, .repeat_penalty = c.repeat_penalty,
                                     .repeat_last_n = 64, .seed = c.seed};
    assert_int_equal(dray_sampler_create(&p, &s, err, sizeof(err)), 0);
    dray_sampler_free(s);
}

/* ------------------------------------------------------------- stop strings */

/* Feed pieces; collect emitted text into out; return the feed result of the last piece. */
static int feed_all(struct dray_stop *st, const char *const *pieces, int n, char *out)
{
    int rc = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        const char *e;
        size_t el;
        rc = dray_stop_feed(st, pieces[i], strlen(pieces[i]), &e, &el);
        strncat(out, e, el);
        if (rc)
            break;
    }
    return rc;
}

static void test_stop_matches_across_token_boundaries_and_holds_back(void **state)
{
    (void)state;
    const char *stops[2] = {"###", "\nUser:"};
    struct dray_stop st;
    assert_int_equal(dray_stop_init(&st, stops, 2, err, sizeof(err)), 0);
    const char *e;
    size_t el;
    assert_int_equal(dray_stop_feed(&st, "Hel", 3, &e, &el), 0);
    assert_int_equal(el, 3);
    assert_int_equal(dray_stop_feed(&st, "lo#", 3, &e, &el), 0);
    assert_int_equal(el, 2); /* "#" held: it may start "###" */
    assert_memory_equal(e, "lo", 2);
    assert_int_equal(dray_stop_feed(&st, "#", 1, &e, &el), 0);
    assert_int_equal(el, 0);
    assert_int_equal(dray_stop_feed(&st, "#tail", 5, &e, &el), 1);
    assert_int_equal(el, 0);
    assert_int_equal(st.matched, 0);
    assert_int_equal(dray_stop_feed(&st, "more", 4, &e, &el), 1); /* stays stopped */
    assert_int_equal(el, 0);
    dray_stop_free(&st);

    /* text before the stop inside the same piece is emitted */
    char out[128];
    assert_int_equal(dray_stop_init(&st, stops, 2, err, sizeof(err)), 0);
    const char *p2[3] = {"Sure.", "\nUs", "er: hi"};
    assert_int_equal(feed_all(&st, p2, 3, out), 1);
    assert_string_equal(out, "Sure.");
    assert_int_equal(st.matched, 1);
    dray_stop_free(&st);
}

/* A token whose text is empty (a control token, an incomplete UTF-8 sequence)
 * may come first, before anything was buffered: nothing is emitted and nothing
 * is read or written (the UBSan build caught a memcpy to the NULL buffer here). */
static void test_stop_takes_an_empty_piece_first(void **state)
{
    (void)state;
    const char *stops[1] = {"###"};
    struct dray_stop st;
    assert_int_equal(dray_stop_init(&st, stops, 1, err, sizeof(err)), 0);
    const char *e;
    size_t el;
    assert_int_equal(dray_stop_feed(&st, "", 0, &e, &el), 0);
    assert_int_equal(el, 0);
    assert_int_equal(dray_stop_feed(&st, NULL, 0, &e, &el), 0);
    assert_int_equal(el, 0);
    assert_int_equal(dray_stop_feed(&st, "ab", 2, &e, &el), 0);
    assert_int_equal(el, 2);
    assert_memory_equal(e, "ab", 2);
    dray_stop_free(&st);
}

static void test_stop_releases_false_starts_and_flushes_at_end(void **state)
{
    (void)state;
    const char *stops[1] = {"abc"};
    struct dray_stop st;
    char out[128];
    assert_int_equal(dray_stop_init(&st, stops, 1, err, sizeof(err)), 0);
    const char *p[4] = {"xa", "b", "d", "ab"};
    assert_int_equal(feed_all(&st, p, 4, out), 0);
    assert_string_equal(out, "xabd"); /* "ab" at the end is held */
    const char *e;
    size_t el;
    dray_stop_flush(&st, &e, &el);
    assert_int_equal(el, 2);
    assert_memory_equal(e, "ab", 2);
    dray_stop_free(&st);

    /* overlapping prefix: "aab" + "c" must stop ("abc" starts at the second a) */
    assert_int_equal(dray_stop_init(&st, stops, 1, err, sizeof(err)), 0);
    const char *q[2] = {"aab", "c"};
    assert_int_equal(feed_all(&st, q, 2, out), 1);
    assert_string_equal(out, "a");
    dray_stop_free(&st);

    /* no stop strings: everything passes through */
    assert_int_equal(dray_stop_init(&st, NULL, 0, err, sizeof(err)), 0);
    assert_int_equal(dray_stop_feed(&st, "abc", 3, &e, &el), 0);
    assert_int_equal(el, 3);
    dray_stop_free(&st);

    const char *bad[2] = {"ok", ""};
    assert_int_equal(dray_stop_init(&st, bad, 2, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "stop string 1"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_sampler_greedy_is_argmax_with_lowest_id_on_ties),
    cmocka_unit_test(test_greedy_token_is_the_lowest_id_of_the_largest_at_every_length),
    cmocka_unit_test(test_sampler_draws_follow_softmax_at_two_temperatures),
    cmocka_unit_test(test_sampler_top_k_keeps_only_k_best),
    cmocka_unit_test(test_sampler_top_p_keeps_smallest_prefix_reaching_p),
    cmocka_unit_test(test_sampler_min_p_drops_tokens_below_fraction_of_max),
    cmocka_unit_test(test_sampler_large_vocab_top_p_matches_brute_force_nucleus),
    cmocka_unit_test(test_sampler_repeat_penalty_divides_positive_multiplies_negative),
    cmocka_unit_test(test_sampler_frequency_and_presence_penalties_count_generated_tokens),
    cmocka_unit_test(test_sampler_logit_bias_adds_to_the_logit),
    cmocka_unit_test(test_sampler_hold_waits_for_min_tokens),
    cmocka_unit_test(test_sampler_same_seed_same_stream),
    cmocka_unit_test(test_sampler_uniform_is_in_unit_interval_and_even),
    cmocka_unit_test(test_sampler_rejects_bad_params),
    cmocka_unit_test(test_stop_matches_across_token_boundaries_and_holds_back),
    cmocka_unit_test(test_stop_releases_false_starts_and_flushes_at_end),
    cmocka_unit_test(test_stop_takes_an_empty_piece_first),
};

int main(void) { return cmocka_run_group_tests(tests, NULL, NULL); }
