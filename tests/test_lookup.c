/* Prompt-lookup drafts (core/lookup.h): the tokens after the latest earlier
 * occurrence of the longest suffix, and the back-off while drafts fail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lookup.h"

static void test_draft_follows_the_latest_occurrence(void **state)
{
    (void)state;
    /* ... 1 2 3 [4 5] ... 1 2 3 [7 8] ... 1 2 + next 3: the latest "1 2 3" was followed by 7 8 */
    const int32_t hist[] = {1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 9, 1, 2};
    int32_t d[8];
    size_t n = sizeof(hist) / sizeof(hist[0]);
    assert_int_equal(dray_lookup_draft(hist, n, 3, d, 2), 2);
    assert_int_equal(d[0], 7);
    assert_int_equal(d[1], 8);
    /* the continuation runs on through the end of the text, next included */
    assert_int_equal(dray_lookup_draft(hist, n, 3, d, 8), 6);
    assert_int_equal(d[2], 9);
    assert_int_equal(d[3], 1);
    assert_int_equal(d[5], 3);
}

static void test_draft_prefers_the_longest_suffix(void **state)
{
    (void)state;
    /* "5 6" alone last came before 0, but "4 5 6" came before 7 */
    const int32_t hist[] = {4, 5, 6, 7, 2, 5, 6, 0, 3, 4, 5};
    int32_t d[4];
    assert_int_equal(dray_lookup_draft(hist, 11, 6, d, 1), 1);
    assert_int_equal(d[0], 7);
}

static void test_no_draft_without_a_match(void **state)
{
    (void)state;
    const int32_t hist[] = {1, 2, 3, 4, 5};
    int32_t d[4];
    assert_int_equal(dray_lookup_draft(hist, 5, 6, d, 4), 0);
    assert_int_equal(dray_lookup_draft(hist, 0, 6, d, 4), 0);
    assert_int_equal(dray_lookup_draft(hist, 1, 1, d, 4), 0); /* "1 1" never came */
}

static void test_policy_backs_off_while_drafts_fail(void **state)
{
    (void)state;
    struct dray_lookup_policy p = {0};
    assert_int_equal(dray_lookup_try(&p, 8), 8); /* the first try: the longest */
    dray_lookup_kept(&p, 8, 0); /* waits 1, then 2, then 4 tokens */
    int tries = 0;
    for (int t = 0; t < 3; t++)
        tries += dray_lookup_try(&p, 8) > 0;
    assert_int_equal(tries, 2); /* one token waited */
    dray_lookup_kept(&p, 1, 0);
    assert_int_equal(dray_lookup_try(&p, 8), 0);
    assert_int_equal(dray_lookup_try(&p, 8), 0);
    assert_int_equal(dray_lookup_try(&p, 8), 1); /* after failures: short drafts */
    dray_lookup_kept(&p, 1, 1); /* a kept token: no more waiting */
    dray_lookup_kept(&p, 2, 0);
    assert_int_equal(dray_lookup_try(&p, 8), 0);
    assert_true(dray_lookup_try(&p, 8) > 0);
    for (int f = 0; f < 20; f++)
        dray_lookup_kept(&p, 1, 0);
    assert_true(p.wait <= 64);
}

/* The length follows what drafts keep: doubled when all is kept, else one
 * more than was kept, never over the maximum. */
static void test_policy_length_follows_what_is_kept(void **state)
{
    (void)state;
    struct dray_lookup_policy p = {0};
    assert_int_equal(dray_lookup_try(&p, 8), 8);
    dray_lookup_kept(&p, 8, 2);
    assert_int_equal(dray_lookup_try(&p, 8), 3);
    dray_lookup_kept(&p, 3, 3);
    assert_int_equal(dray_lookup_try(&p, 8), 6);
    dray_lookup_kept(&p, 6, 6);
    assert_int_equal(dray_lookup_try(&p, 8), 8);
    assert_int_equal(dray_lookup_try(&p, 4), 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_follows_the_latest_occurrence),
        cmocka_unit_test(test_draft_prefers_the_longest_suffix),
        cmocka_unit_test(test_no_draft_without_a_match),
        cmocka_unit_test(test_policy_backs_off_while_drafts_fail),
        cmocka_unit_test(test_policy_length_follows_what_is_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
