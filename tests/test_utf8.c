/* UTF-8 decoding, U+FFFD maximal-subpart rule, trimming as Python's str.strip(). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "utf8.h"

#define U8(s) ((const uint8_t *)(s))

static void test_utf8_lead_len_uses_top_nibble(void **state)
{
    (void)state;
    assert_int_equal(dray_utf8_lead_len('a'), 1);
    assert_int_equal(dray_utf8_lead_len(0x80), 1); /* stray continuation: 1 */
    assert_int_equal(dray_utf8_lead_len(0xC3), 2);
    assert_int_equal(dray_utf8_lead_len(0xE4), 3);
    assert_int_equal(dray_utf8_lead_len(0xF0), 4);
    assert_int_equal(dray_utf8_lead_len(0xFF), 4);
}

static void test_utf8_decodes_each_length(void **state)
{
    (void)state;
    uint32_t cp = 0;
    assert_int_equal(dray_utf8_next(U8("A"), 1, &cp), 1);
    assert_int_equal(cp, 0x41);
    assert_int_equal(dray_utf8_next(U8("\xC3\xA9"), 2, &cp), 2);
    assert_int_equal(cp, 0xE9);
    assert_int_equal(dray_utf8_next(U8("\xE4\xB8\xAD"), 3, &cp), 3);
    assert_int_equal(cp, 0x4E2D);
    assert_int_equal(dray_utf8_next(U8("\xF0\x9F\x98\x80"), 4, &cp), 4);
    assert_int_equal(cp, 0x1F600);
}

static void test_utf8_reports_incomplete_prefix(void **state)
{
    (void)state;
    assert_int_equal(dray_utf8_next(U8("\xF0\x9F\x98"), 3, NULL), 0);
    assert_int_equal(dray_utf8_next(U8("\xE4"), 1, NULL), 0);
    assert_int_equal(dray_utf8_next(U8(""), 0, NULL), 0);
}

static void test_utf8_rejects_overlong_surrogate_and_out_of_range(void **state)
{
    (void)state;
    assert_int_equal(dray_utf8_next(U8("\xC0\xAF"), 2, NULL), -1);         /* overlong '/' */
    assert_int_equal(dray_utf8_next(U8("\xE0\x80\xAF"), 3, NULL), -1);     /* overlong */
    assert_int_equal(dray_utf8_next(U8("\xED\xA0\x80"), 3, NULL), -1);     /* U+D800 */
    assert_int_equal(dray_utf8_next(U8("\xF4\x90\x80\x80"), 4, NULL), -1); /* > U+10FFFF */
    assert_int_equal(dray_utf8_next(U8("\xF5\x80"), 2, NULL), -1);
    assert_int_equal(dray_utf8_next(U8("\x80"), 1, NULL), -1);
}

static void test_utf8_maximal_subpart_length(void **state)
{
    (void)state;
    /* E4 B8 then 'A': the subpart "E4 B8" is one replacement */
    assert_int_equal(dray_utf8_next(U8("\xE4\xB8" "A"), 3, NULL), -2);
    assert_int_equal(dray_utf8_next(U8("\xF0\x9F\x98" "A"), 4, NULL), -3);
    assert_int_equal(dray_utf8_next(U8("\xE4" "A"), 2, NULL), -1);
}

static void test_utf8_encode_roundtrips(void **state)
{
    (void)state;
    const uint32_t cps[] = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFD, 0x10000, 0x10FFFF};
    for (size_t i = 0; i < sizeof(cps) / sizeof(cps[0]); i++) {
        char b[4];
        uint32_t back = 0;
        size_t n = dray_utf8_encode(cps[i], b);
        assert_true(n > 0);
        assert_int_equal(dray_utf8_next(U8(b), n, &back), (int)n);
        assert_int_equal(back, cps[i]);
    }
    char b[4];
    assert_int_equal(dray_utf8_encode(0xD800, b), 0);
    assert_int_equal(dray_utf8_encode(0x110000, b), 0);
}

static void test_utf8_valid_whole_strings(void **state)
{
    (void)state;
    assert_true(dray_utf8_valid("", 0));
    assert_true(dray_utf8_valid("h\xC3\xA9llo \xF0\x9F\x91\x8B", 11));
    assert_false(dray_utf8_valid("ab\xE4\xB8", 4));
    assert_false(dray_utf8_valid("\xFF", 1));
}

static void test_utf8_trim_strips_unicode_spaces_like_python(void **state)
{
    (void)state;
    size_t start;
    const char *s = " \t\n\xE3\x80\x80" "a b" "\xC2\xA0\r\x1F";
    size_t n = dray_utf8_trim(s, strlen(s), &start);
    assert_int_equal(n, 3);
    assert_memory_equal(s + start, "a b", 3);
    /* all spaces: empty */
    n = dray_utf8_trim("  \n ", 4, &start);
    assert_int_equal(n, 0);
    /* U+200B (zero width space) is not whitespace in Python */
    n = dray_utf8_trim("\xE2\x80\x8B" "x", 4, &start);
    assert_int_equal(n, 4);
    /* ill-formed bytes are kept */
    n = dray_utf8_trim(" \xA0 ", 3, &start);
    assert_int_equal(n, 1);
    assert_int_equal(start, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_lead_len_uses_top_nibble),
        cmocka_unit_test(test_utf8_decodes_each_length),
        cmocka_unit_test(test_utf8_reports_incomplete_prefix),
        cmocka_unit_test(test_utf8_rejects_overlong_surrogate_and_out_of_range),
        cmocka_unit_test(test_utf8_maximal_subpart_length),
        cmocka_unit_test(test_utf8_encode_roundtrips),
        cmocka_unit_test(test_utf8_valid_whole_strings),
        cmocka_unit_test(test_utf8_trim_strips_unicode_spaces_like_python),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
