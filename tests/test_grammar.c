/* Grammar-constrained decoding (core/text/grammar.h), read as a specification: the
 * GBNF dialect and its errors, what a matcher accepts byte by byte (UTF-8 split
 * across tokens, atomic failure, clones, the end), and the allowed-token mask,
 * which must equal the brute force "a clone accepts the token's bytes". */
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
#include "dray/gguf.h"
#include "grammar.h"
#include "testutil.h"
#include "tokenizer.h"

static char err[256];

/* JSON, written for these tests: objects, arrays, strings with escapes,
 * numbers, literals, whitespace. */
static const char json_gbnf[] =
    "# JSON (RFC 8259), whitespace between every token\n"
    "root    ::= ws value ws\n"
    "value   ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object  ::= \"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"\n"
    "member  ::= string ws \":\" ws value\n"
    "array   ::= \"[\" ws ( value ( ws \",\" ws value )*\n"
    "              ws )? \"]\"          # a newline inside parentheses\n"
    "string  ::= \"\\\"\" char* \"\\\"\"\n"
    "char    ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number  ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws      ::= [ \\t\\n\\r]*\n";

static struct dray_grammar *parse(const char *text)
{
    struct dray_grammar *g = NULL;
    int rc = dray_grammar_parse(text, strlen(text), &g, err, sizeof(err));
    if (rc)
        print_message("parse failed: %s\n", err);
    assert_int_equal(rc, 0);
    assert_non_null(g);
    return g;
}

/* The text must fail to parse with a message containing want. */
static void parse_fails(const char *text, const char *want)
{
    struct dray_grammar *g = (struct dray_grammar *)1;
    err[0] = 0;
    assert_int_equal(dray_grammar_parse(text, strlen(text), &g, err, sizeof(err)), DRAY_EINVAL);
    assert_null(g);
    if (!strstr(err, want))
        print_message("error '%s' lacks '%s'\n", err, want);
    assert_non_null(strstr(err, want));
}

static struct dray_grammar_matcher *matcher(const struct dray_grammar *g)
{
    struct dray_grammar_matcher *m = NULL;
    assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
    return m;
}

/* Feed s byte by byte: the index of the first byte refused, or -1 when all are
 * taken; *end says whether the matcher can end there. */
static long first_refused(const struct dray_grammar *g, const char *s, size_t n, bool *end)
{
    struct dray_grammar_matcher *m = matcher(g);
    long at = -1;
    for (size_t i = 0; i < n && at < 0; i++)
        if (dray_grammar_accept_bytes(m, s + i, 1) != 0)
            at = (long)i;
    if (end)
        *end = dray_grammar_can_end(m);
    dray_grammar_matcher_free(m);
    return at;
}

/* The whole of s is a sentence of g. */
static bool sentence(const struct dray_grammar *g, const char *s)
{
    bool end;
    return first_refused(g, s, strlen(s), &end) < 0 && end;
}

/* ---------------------------------------------------------------- parse errors */

static void test_grammar_parse_errors_name_line_and_column(void **state)
{
    (void)state;
    parse_fails("root ::= \"a\"\nfoo ::= [a-", "line 2, column 9: unterminated character class");
    parse_fails("root ::= a b\na ::= \"x\"\n", "line 1, column 12: undefined rule 'b'");
    parse_fails("a ::= \"x\"\n", "no rule named 'root'");
    parse_fails("", "no rule named 'root'");
    parse_fails("root ::= \"abc\n", "line 1, column 10: unterminated literal");
    parse_fails("root ::= \"\\q\"", "line 1, column 11: unknown escape '\\q'");
    parse_fails("root ::= \"\\x4\"", "escape needs 2 hex digits");
    parse_fails("root ::= \"\\uD800\"", "not a Unicode scalar value");
    parse_fails("root ::= [z-a]", "line 1, column 11: range U+7A-U+61 is reversed");
    parse_fails("root ::= []", "empty character class");
    parse_fails("root ::= [^\\x00-\\U0010FFFF]", "matches no character");
    parse_fails("root ::= * \"a\"", "line 1, column 10: '*' has nothing to repeat");
    parse_fails("root ::= \"a\" | +", "line 1, column 16: '+' has nothing to repeat");
    parse_fails("root ::= \"a\"{3,2}", "max below min");
    parse_fails("root ::= \"a\"{x}", "expected a number");
    parse_fails("root ::= \"a\"{2", "expected '}'");
    parse_fails("root ::= \"a\"{99999}", "repetition count over 65535");
    parse_fails("root = \"a\"", "line 1, column 6: expected '::='");
    parse_fails("root ::= \"a\" )", "line 1, column 14: unbalanced ')'");
    parse_fails("root ::= ( \"a\"\n\n", "line 1, column 10: unclosed '('");
    parse_fails("root ::= \"a\" ; \"b\"", "line 1, column 14: unexpected ';'");
    parse_fails("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is already "
                "defined at line 1");
    parse_fails("root ::= <foo>", "token references");
    parse_fails("root ::= \"\xC3\"", "ill-formed UTF-8");
    /* a newline ends a rule: the next line must start another */
    parse_fails("root ::= \"a\"\n  | \"b\"", "line 2, column 3: expected a rule name");
}

static void test_grammar_parse_rejects_left_recursion(void **state)
{
    (void)state;
    parse_fails("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n",
                "line 2, column 1: rule 'expr' can reach itself without consuming a character "
                "(left recursion)");
    /* through a rule that can be empty, and through a group */
    parse_fails("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"\n", "rule 'a' can reach itself");
    parse_fails("root ::= ( ws root \"x\" ) | \"y\"\nws ::= \" \"*\n", "rule 'root' can reach");
    parse_fails("root ::= root\n", "left recursion");
    /* recursion after a character is fine */
    struct dray_grammar *g = parse("root ::= \"(\" root \")\" | \"x\"\n");
    assert_true(sentence(g, "((x))"));
    assert_false(sentence(g, "((x)"));
    dray_grammar_free(g);
}

static void test_grammar_parse_refuses_huge_grammars(void **state)
{
    (void)state;
    parse_fails("root ::= \"ab\"{40000}", "grammar too large: over 65536 elements (config key grammar_max_elements)");
    parse_fails("root ::= [a-z]{0,60000}", "grammar too large");
    size_t n = (1u << 20) + 1;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, ' ', n);
    big[n] = 0;
    struct dray_grammar *g = NULL;
    assert_int_equal(dray_grammar_parse(big, n, &g, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "over the limit"));
    free(big);
}

/* ---------------------------------------------------------------- what matches */

static void test_grammar_literals_and_escapes(void **state)
{
    (void)state;
    struct dray_grammar *g =
        parse("root ::= \"a\\n\\t\\r\\\"\\\\\\x41\\u00e9\\U0001F600\" \"日本\"  # comment\n");
    assert_true(sentence(g, "a\n\t\r\"\\A\xC3\xA9\xF0\x9F\x98\x80日本"));
    assert_false(sentence(g, "a\n\t\r\"\\A"));
    bool end;
    assert_int_equal(first_refused(g, "ab", 2, &end), 1);
    dray_grammar_free(g);
    /* the empty literal matches the empty string */
    g = parse("root ::= \"\"");
    assert_true(sentence(g, ""));
    assert_int_equal(first_refused(g, "a", 1, &end), 0);
    dray_grammar_free(g);
}

static void test_grammar_classes_negation_and_escapes(void **state)
{
    (void)state;
    struct dray_grammar *g = parse("root ::= [a-z0-9_]+");
    assert_true(sentence(g, "abc_09z"));
    assert_false(sentence(g, ""));
    assert_int_equal(first_refused(g, "ab-c", 4, NULL), 2);
    dray_grammar_free(g);
    g = parse("root ::= \"\\\"\" [^\"\\\\]* \"\\\"\"");
    assert_true(sentence(g, "\"hé 日 😀 '\""));
    assert_int_equal(first_refused(g, "\"a\\b\"", 5, NULL), 2);
    dray_grammar_free(g);
    /* escapes inside a class, and '-' at the end is itself */
    g = parse("root ::= [\\]\\-\\\\\\x41-\\x43\\u00e9a-]*");
    assert_true(sentence(g, "]-\\ABC\xC3\xA9" "a-"));
    assert_int_equal(first_refused(g, "D", 1, NULL), 0);
    dray_grammar_free(g);
    /* '.' is any code point, one of any length */
    g = parse("root ::= \"x\" . \"y\"");
    assert_true(sentence(g, "xay"));
    assert_true(sentence(g, "x\xC3\xA9y"));
    assert_true(sentence(g, "x\xF0\x9F\x98\x80y"));
    assert_false(sentence(g, "xy"));
    assert_false(sentence(g, "xaay"));
    dray_grammar_free(g);
}

static void test_grammar_repetition_bounds(void **state)
{
    (void)state;
    struct dray_grammar *g = parse("root ::= \"a\"{2,4} \"b\"");
    assert_false(sentence(g, "ab"));
    assert_true(sentence(g, "aab"));
    assert_true(sentence(g, "aaab"));
    assert_true(sentence(g, "aaaab"));
    assert_int_equal(first_refused(g, "aaaaab", 6, NULL), 4);
    dray_grammar_free(g);
    g = parse("root ::= \"ab\"{3}");
    assert_true(sentence(g, "ababab"));
    assert_false(sentence(g, "abab"));
    assert_int_equal(first_refused(g, "abababa", 7, NULL), 6);
    dray_grammar_free(g);
    g = parse("root ::= \"x\"{2,} \"y\"? \"z\"*");
    assert_false(sentence(g, "x"));
    assert_true(sentence(g, "xx"));
    assert_true(sentence(g, "xxxxxxy"));
    assert_true(sentence(g, "xxyzzz"));
    assert_true(sentence(g, "xxzz"));
    assert_int_equal(first_refused(g, "xxyy", 4, NULL), 3);
    dray_grammar_free(g);
    g = parse("root ::= \"a\" \"b\"{0} \"c\"{0,0} [0-9]{1,3}");
    assert_true(sentence(g, "a1"));
    assert_true(sentence(g, "a123"));
    assert_int_equal(first_refused(g, "ab", 2, NULL), 1);
    assert_int_equal(first_refused(g, "a1234", 5, NULL), 4);
    dray_grammar_free(g);
    /* a repeated group, and a repetition of a repetition */
    g = parse("root ::= ( \"a\" | \"bc\" )+ ( \"d\"{2} ){2}");
    assert_true(sentence(g, "abcadddd"));
    assert_false(sentence(g, "abcaddd"));
    dray_grammar_free(g);
}

static void test_grammar_alternation_and_nested_rules(void **state)
{
    (void)state;
    struct dray_grammar *g = parse(
        "root  ::= greet ( \", \" name )?\n"
        "greet ::= \"hello\" | \"hi\" | \"hey\"   # three ways\n"
        "name  ::= (\n"
        "    \"world\"\n"
        "  | [A-Z] [a-z]*\n"
        ")\n");
    assert_true(sentence(g, "hello"));
    assert_true(sentence(g, "hi, world"));
    assert_true(sentence(g, "hey, Ann"));
    assert_false(sentence(g, "hey, "));
    assert_int_equal(first_refused(g, "hx", 2, NULL), 1);
    assert_int_equal(first_refused(g, "hi, ann", 7, NULL), 4);
    dray_grammar_free(g);
    /* rule names with digits, '-' and '_'; CRLF line ends */
    g = parse("root ::= a-1 b_2\r\na-1 ::= \"x\"\r\nb_2 ::= \"y\"\r\n");
    assert_true(sentence(g, "xy"));
    dray_grammar_free(g);
}

static void test_grammar_json_accepts_and_rejects_at_the_right_byte(void **state)
{
    (void)state;
    struct dray_grammar *g = parse(json_gbnf);
    const char *good[] = {
        "{}", " [ ] ", "0", "-0.5e+10", "true", "null",
        "{\"a\": 1, \"b\": [true, false, null, \"x\\n\\u00e9\"], \"c\": {\"d\": -12.25E3}}",
        "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]",
        "\"h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80\"",
        "{\n  \"k\": [1,\n 2 ,3]\n}\n",
    };
    for (size_t k = 0; k < sizeof(good) / sizeof(good[0]); k++) {
        if (!sentence(g, good[k]))
            print_message("refused: %s\n", good[k]);
        assert_true(sentence(g, good[k]));
    }
    struct {
        const char *doc;
        long at;
    } bad[] = {
        {"{\"a\":1,}", 7}, {"[1 2]", 3}, {"{\"a\" 1}", 5}, {"01", 1}, {"\"\x01\"", 1},
        {"tru e", 3}, {"{\"a\":1}}", 7}, {"[1,]", 3}, {"{a:1}", 1}, {"\"\\x\"", 2},
        {"\"\\u12G4\"", 5}, {"1.e5", 2}, {"--1", 1},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        long at = first_refused(g, bad[k].doc, strlen(bad[k].doc), NULL);
        if (at != bad[k].at)
            print_message("%s: refused at %ld, want %ld\n", bad[k].doc, at, bad[k].at);
        assert_int_equal(at, bad[k].at);
    }
    bool end;
    assert_int_equal(first_refused(g, "{\"a\": [1", 8, &end), -1);
    assert_false(end); /* a prefix, not a document */
    dray_grammar_free(g);
}

static void test_grammar_deep_nesting_stays_correct(void **state)
{
    (void)state;
    /* 4000 levels: each depth is a new state, so the DFA outgrows its budget and
     * is rebuilt many times on the way */
    struct dray_grammar *g = parse(json_gbnf);
    size_t depth = 4000, n = 2 * depth + 1;
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, '[', depth);
    s[depth] = '1';
    memset(s + depth + 1, ']', depth);
    s[n] = 0;
    struct dray_grammar_matcher *m = matcher(g);
    assert_int_equal(dray_grammar_accept_bytes(m, s, n - 1), 0);
    assert_false(dray_grammar_can_end(m));
    assert_int_equal(dray_grammar_accept_bytes(m, "]]", 2), DRAY_EINVAL);
    assert_int_equal(dray_grammar_accept_bytes(m, "]", 1), 0);
    assert_true(dray_grammar_can_end(m));
    dray_grammar_matcher_free(m);
    free(s);
    dray_grammar_free(g);
}

/* ---------------------------------------------------------------- the matcher */

static void test_grammar_utf8_split_across_tokens(void **state)
{
    (void)state;
    struct dray_grammar *g = parse("root ::= \"é\" \"日\" [😀-😂]");
    struct dray_grammar_matcher *m = matcher(g);
    assert_int_equal(dray_grammar_accept_bytes(m, "\xC3", 1), 0);
    assert_false(dray_grammar_can_end(m));
    assert_int_equal(dray_grammar_accept_bytes(m, "\xA9\xE6", 2), 0);
    assert_int_equal(dray_grammar_accept_bytes(m, "\x97", 1), 0);
    assert_int_equal(dray_grammar_accept_bytes(m, "\xA5\xF0\x9F", 3), 0);
    assert_int_equal(dray_grammar_accept_bytes(m, "\x98", 1), 0);
    assert_false(dray_grammar_can_end(m)); /* one byte still due */
    assert_int_equal(dray_grammar_accept_bytes(m, "\x83", 1), DRAY_EINVAL); /* U+1F603 */
    assert_int_equal(dray_grammar_accept_bytes(m, "\x81", 1), 0);           /* U+1F601 */
    assert_true(dray_grammar_must_end(m));
    dray_grammar_matcher_free(m);
    /* a lead byte no allowed character starts is refused at once */
    m = matcher(g);
    assert_int_equal(dray_grammar_accept_bytes(m, "\xC4", 1), DRAY_EINVAL);
    assert_int_equal(dray_grammar_accept_bytes(m, "\xC3\xA8", 2), DRAY_EINVAL); /* è */
    assert_int_equal(dray_grammar_accept_bytes(m, "\xC3\xA9", 2), 0);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    /* ill-formed UTF-8 never matches, not even '.' */
    g = parse("root ::= .*");
    const char *bad[] = {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xFF",
                         "\xE6\x41"};
    long want[] = {0, 1, 1, 0, 0, 1};
    for (size_t k = 0; k < 6; k++)
        assert_int_equal(first_refused(g, bad[k], strlen(bad[k]), NULL), want[k]);
    assert_true(sentence(g, "\xED\x9F\xBF\xEE\x80\x80\xF4\x8F\xBF\xBF")); /* D7FF E000 10FFFF */
    dray_grammar_free(g);
}

static void test_grammar_accept_bytes_is_atomic(void **state)
{
    (void)state;
    struct dray_grammar *g = parse("root ::= \"abc\" \"é\"?");
    struct dray_grammar_matcher *m = matcher(g);
    assert_int_equal(dray_grammar_accept_bytes(m, "ab", 2), 0);
    assert_int_equal(dray_grammar_accept_bytes(m, "cX", 2), DRAY_EINVAL);
    assert_int_equal(dray_grammar_accept_bytes(m, "c\xC3\xA8", 3), DRAY_EINVAL);
    assert_int_equal(dray_grammar_accept_bytes(m, "", 0), 0);
    assert_int_equal(dray_grammar_accept_bytes(m, "c", 1), 0); /* still right after "ab" */
    assert_true(dray_grammar_can_end(m));
    assert_int_equal(dray_grammar_accept_bytes(m, "\xC3", 1), 0);
    assert_int_equal(dray_grammar_accept_bytes(m, "\xA9x", 2), DRAY_EINVAL);
    assert_false(dray_grammar_can_end(m)); /* still inside é */
    assert_int_equal(dray_grammar_accept_bytes(m, "\xA9", 1), 0);
    assert_true(dray_grammar_must_end(m));
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
}

/* A peek answers as accept would and never moves the matcher. */
static void test_grammar_peek_answers_like_accept_and_stays(void **state)
{
    (void)state;
    struct dray_grammar *g = parse("root ::= \"ab\" [0-9]+ \"é\"");
    struct dray_grammar_matcher *m = matcher(g);
    const char *tries[] = {"a", "ab", "ab1", "abx", "ab12\xC3", "ab12\xC3\xA9", "b"};
    for (size_t i = 0; i < 7; i++) {
        struct dray_grammar_matcher *c;
        assert_int_equal(dray_grammar_matcher_clone(m, &c), 0);
        assert_int_equal(dray_grammar_peek_bytes(m, tries[i], strlen(tries[i])),
                         dray_grammar_accept_bytes(c, tries[i], strlen(tries[i])));
        dray_grammar_matcher_free(c);
    }
    assert_int_equal(dray_grammar_accept_bytes(m, "ab1", 3), 0); /* m is still at the start */
    assert_int_equal(dray_grammar_peek_bytes(m, "2\xC3", 2), 0);
    assert_int_equal(dray_grammar_peek_bytes(m, "\xA9", 1), DRAY_EINVAL); /* not inside é */
    assert_int_equal(dray_grammar_accept_bytes(m, "\xC3\xA9", 2), 0);
    assert_true(dray_grammar_must_end(m));
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
}

static void test_grammar_clone_is_independent(void **state)
{
    (void)state;
    struct dray_grammar *g = parse(json_gbnf);
    struct dray_grammar_matcher *a = matcher(g), *b = NULL;
    assert_int_equal(dray_grammar_accept_bytes(a, "{\"k\": \"\xE6", 8), 0);
    assert_int_equal(dray_grammar_matcher_clone(a, &b), 0);
    assert_int_equal(dray_grammar_accept_bytes(a, "\x97\xA5\"}", 4), 0);
    assert_true(dray_grammar_can_end(a));
    assert_false(dray_grammar_can_end(b));
    assert_int_equal(dray_grammar_accept_bytes(b, "}", 1), DRAY_EINVAL); /* mid-character */
    assert_int_equal(dray_grammar_accept_bytes(b, "\x9C\xAC\", \"n\": 1}", 12), 0);
    assert_true(dray_grammar_can_end(b));
    dray_grammar_matcher_free(a);
    assert_int_equal(dray_grammar_accept_bytes(b, " ", 1), 0); /* b outlives a */
    dray_grammar_matcher_free(b);
    dray_grammar_free(g);
}

static void test_grammar_can_end_and_must_end(void **state)
{
    (void)state;
    struct dray_grammar *g = parse("root ::= \"a\" \"b\"?");
    struct dray_grammar_matcher *m = matcher(g);
    assert_false(dray_grammar_can_end(m));
    assert_false(dray_grammar_must_end(m));
    assert_int_equal(dray_grammar_accept_bytes(m, "a", 1), 0);
    assert_true(dray_grammar_can_end(m));
    assert_false(dray_grammar_must_end(m));
    assert_int_equal(dray_grammar_accept_bytes(m, "b", 1), 0);
    assert_true(dray_grammar_must_end(m));
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    g = parse("root ::= [a-z]*");
    m = matcher(g);
    assert_true(dray_grammar_can_end(m)); /* the empty output is a sentence */
    assert_int_equal(dray_grammar_accept_bytes(m, "zzz", 3), 0);
    assert_true(dray_grammar_can_end(m));
    assert_false(dray_grammar_must_end(m)); /* more letters may always follow */
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
}

/* ---------------------------------------------------------------- the mask */

/* Bit id of a mask. */
static bool bit(const uint32_t *mask, uint32_t id)
{
    return mask[id >> 5] >> (id & 31) & 1;
}

/* Every token's bit equals the brute force: eog ids when the matcher can end, an
 * empty piece never, any other when a clone accepts its bytes. */
static void mask_is_brute_force(struct dray_grammar_matcher *m,
                                const struct dray_grammar_vocab *v, char **pieces,
                                const uint32_t *lens, const int32_t *eog, size_t n_eog)
{
    uint32_t nv = dray_grammar_vocab_size(v);
    uint32_t *mask = calloc((nv + 31) / 32, sizeof(*mask));
    assert_non_null(mask);
    long count = dray_grammar_allowed(m, v, mask), want_count = 0;
    assert_true(count >= 0);
    for (uint32_t id = 0; id < nv; id++) {
        bool want = false, is_eog = false;
        for (size_t k = 0; k < n_eog; k++)
            is_eog |= eog[k] == (int32_t)id;
        if (is_eog) {
            want = dray_grammar_can_end(m);
        } else if (lens[id] > 0) {
            struct dray_grammar_matcher *c = NULL;
            assert_int_equal(dray_grammar_matcher_clone(m, &c), 0);
            want = dray_grammar_accept_bytes(c, pieces[id], lens[id]) == 0;
            dray_grammar_matcher_free(c);
        }
        if (bit(mask, id) != want)
            print_message("token %u (%u bytes): mask %d, brute force %d\n", id, lens[id],
                          bit(mask, id), want);
        assert_int_equal(bit(mask, id), want);
        want_count += want;
    }
    assert_int_equal(count, want_count);
    for (uint32_t id = nv; id < (nv + 31) / 32 * 32; id++)
        assert_false(bit(mask, id));
    free(mask);
}

/* A random vocabulary over the bytes JSON cares about, whole and split UTF-8
 * characters, stray bytes, empty (control) tokens and duplicates. */
static uint32_t random_vocab(uint32_t n, char ***pieces, uint32_t **lens)
{
    static const char *atoms[] = {
        "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\t", "\\", "u", "0", "1", "9", "-", "+",
        ".", "e", "E", "a", "k", "n", "x", "true", "false", "null", "tr", "ue", "ul", "\\n",
        "\\u00", "e9", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\xC3", "\xA9", "\xE6",
        "\xE6\x97", "\x97\xA5", "\xF0\x9F", "\x98\x80", "\x80", "\xFF", "\xC0", "\xED\xA0",
        "\x01", "\": ", "\", \"", "}, {",
    };
    size_t n_atoms = sizeof(atoms) / sizeof(atoms[0]);
    *pieces = calloc(n, sizeof(**pieces));
    *lens = calloc(n, sizeof(**lens));
    assert_non_null(*pieces);
    assert_non_null(*lens);
    for (uint32_t id = 0; id < n; id++) {
        char buf[64];
        size_t len = 0;
        uint32_t r = dray_test_rand() % 100;
        uint32_t parts = r < 3 ? 0 : 1 + dray_test_rand() % 4; /* 3%: empty (control) */
        if (id > 10 && r >= 97) { /* 3%: a duplicate of an earlier token */
            uint32_t o = dray_test_rand() % id;
            memcpy(buf, (*pieces)[o], (*lens)[o]);
            len = (*lens)[o];
            parts = 0;
        }
        for (uint32_t k = 0; k < parts; k++) {
            const char *a = atoms[dray_test_rand() % n_atoms];
            memcpy(buf + len, a, strlen(a));
            len += strlen(a);
        }
        (*pieces)[id] = malloc(len ? len : 1);
        memcpy((*pieces)[id], buf, len);
        (*lens)[id] = (uint32_t)len;
    }
    return n;
}

static void free_vocab_pieces(char **pieces, uint32_t n, uint32_t *lens)
{
    for (uint32_t id = 0; id < n; id++)
        free(pieces[id]);
    free(pieces);
    free(lens);
}

static void test_grammar_mask_equals_brute_force(void **state)
{
    (void)state;
    dray_test_seed(42);
    char **pieces;
    uint32_t *lens;
    uint32_t n = random_vocab(1500, &pieces, &lens);
    lens[3] = 0; /* eog ids: one empty, one with bytes that the mask must not use */
    const int32_t eog[] = {3, 7};
    struct dray_grammar_vocab *v = NULL;
    assert_int_equal(dray_grammar_vocab_new(n, (const char *const *)pieces, lens, eog, 2, &v, err,
                                            sizeof(err)),
                     0);
    assert_int_equal(dray_grammar_vocab_size(v), n);
    struct dray_grammar *g = parse(json_gbnf);
    struct dray_grammar_matcher *m = matcher(g);
    /* a document fed byte by byte: states inside strings, escapes, numbers,
     * between members, and in the middle of multi-byte characters */
    const char doc[] = "{\"k\": [1, -2.5e3, \"h\\u00e9 \\\"\xE6\x97\xA5\xF0\x9F\x98\x80\", true], "
                       "\"n\": {}}";
    for (size_t i = 0; i <= strlen(doc); i++) {
        mask_is_brute_force(m, v, pieces, lens, eog, 2);
        if (i < strlen(doc))
            assert_int_equal(dray_grammar_accept_bytes(m, doc + i, 1), 0);
    }
    assert_true(dray_grammar_can_end(m));
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    /* a grammar of non-ASCII classes and '.' */
    g = parse("root ::= ( [\xC3\xA0-\xC3\xBF] | [^a-z\\x00-\\x7F\xE6\x97\xA5] | \"k\" . )+");
    m = matcher(g);
    const char doc2[] = "\xC3\xA9k\xE6\x97\xA5\xF0\x9F\x98\x80k\xC3\xA9";
    for (size_t i = 0; i <= strlen(doc2); i++) {
        mask_is_brute_force(m, v, pieces, lens, eog, 2);
        if (i < strlen(doc2))
            assert_int_equal(dray_grammar_accept_bytes(m, doc2 + i, 1), 0);
    }
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    dray_grammar_vocab_free(v);
    free_vocab_pieces(pieces, n, lens);
}

static void test_grammar_mask_deep_in_nesting_equals_brute_force(void **state)
{
    (void)state;
    /* 3000 levels deep the DFA is near its budget, and tokens of many '[' make
     * new, deeper states during the walk: it is rebuilt mid-walk */
    dray_test_seed(3);
    static const char *atoms[] = {"[", "[[[[", "]", "]]", "1", ", ", " ", "[1", "\"", "x"};
    uint32_t n = 200;
    char **pieces = calloc(n, sizeof(*pieces));
    uint32_t *lens = calloc(n, sizeof(*lens));
    for (uint32_t id = 0; id < n; id++) {
        char buf[64];
        size_t len = 0;
        for (uint32_t k = 0, parts = 1 + dray_test_rand() % 6; k < parts; k++) {
            const char *a = atoms[dray_test_rand() % 10];
            memcpy(buf + len, a, strlen(a));
            len += strlen(a);
        }
        pieces[id] = malloc(len);
        memcpy(pieces[id], buf, len);
        lens[id] = (uint32_t)len;
    }
    const int32_t eog[] = {0};
    struct dray_grammar_vocab *v = NULL;
    assert_int_equal(dray_grammar_vocab_new(n, (const char *const *)pieces, lens, eog, 1, &v, err,
                                            sizeof(err)),
                     0);
    struct dray_grammar *g = parse(json_gbnf);
    struct dray_grammar_matcher *m = matcher(g);
    char *deep = malloc(3000);
    memset(deep, '[', 3000);
    assert_int_equal(dray_grammar_accept_bytes(m, deep, 3000), 0);
    for (int k = 0; k < 3; k++) {
        mask_is_brute_force(m, v, pieces, lens, eog, 1);
        assert_int_equal(dray_grammar_accept_bytes(m, "[[", 2), 0);
    }
    free(deep);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    dray_grammar_vocab_free(v);
    free_vocab_pieces(pieces, n, lens);
}

static void test_grammar_cached_mask_equals_fresh(void **state)
{
    (void)state;
    dray_test_seed(7);
    char **pieces;
    uint32_t *lens;
    uint32_t n = random_vocab(2000, &pieces, &lens);
    const int32_t eog[] = {0};
    struct dray_grammar_vocab *v = NULL;
    assert_int_equal(dray_grammar_vocab_new(n, (const char *const *)pieces, lens, eog, 1, &v, err,
                                            sizeof(err)),
                     0);
    struct dray_grammar *g = parse(json_gbnf);
    struct dray_grammar_matcher *m = matcher(g), *fresh = NULL;
    size_t words = (n + 31) / 32;
    uint32_t *a = calloc(words, 4), *b = calloc(words, 4);
    /* inside a string, the state after each letter is the same: masks 2.. are hits */
    assert_int_equal(dray_grammar_accept_bytes(m, "[\"", 2), 0);
    long first = dray_grammar_allowed(m, v, a);
    for (int k = 0; k < 20; k++) {
        assert_int_equal(dray_grammar_accept_bytes(m, "x", 1), 0);
        assert_int_equal(dray_grammar_allowed(m, v, b), first);
        assert_memory_equal(a, b, words * 4);
    }
    /* and a cached mask equals a fresh matcher's cold one at the same point */
    assert_int_equal(dray_grammar_matcher_new(g, &fresh), 0);
    assert_int_equal(dray_grammar_accept_bytes(fresh, "[\"xxxxx", 7), 0);
    memset(a, 0xA5, words * 4); /* the mask overwrites what was there */
    assert_int_equal(dray_grammar_allowed(fresh, v, a), first);
    assert_memory_equal(a, b, words * 4);
    /* a clone carries the cache and answers the same */
    struct dray_grammar_matcher *c = NULL;
    assert_int_equal(dray_grammar_matcher_clone(m, &c), 0);
    assert_int_equal(dray_grammar_allowed(c, v, a), first);
    assert_memory_equal(a, b, words * 4);
    dray_grammar_matcher_free(c);
    dray_grammar_matcher_free(fresh);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    dray_grammar_vocab_free(v);
    free_vocab_pieces(pieces, n, lens);
    free(a);
    free(b);
}

static void test_grammar_accept_token(void **state)
{
    (void)state;
    const char *pieces[] = {"", "{", "}", "\"a\"", "\xC3", "\xA9", "", "x"};
    const uint32_t lens[] = {0, 1, 1, 3, 1, 1, 0, 1};
    const int32_t eog[] = {0};
    struct dray_grammar_vocab *v = NULL;
    assert_int_equal(dray_grammar_vocab_new(8, pieces, lens, eog, 1, &v, err, sizeof(err)), 0);
    struct dray_grammar *g = parse("root ::= \"{\" ( \"\\\"a\\\"\" | \"é\" )* \"}\"");
    struct dray_grammar_matcher *m = matcher(g);
    uint32_t mask[1];
    assert_int_equal(dray_grammar_allowed(m, v, mask), 1);
    assert_int_equal(mask[0], 1u << 1);
    assert_int_equal(dray_grammar_accept_token(m, v, 0), DRAY_EINVAL); /* can't end yet */
    assert_int_equal(dray_grammar_accept_token(m, v, 1), 0);
    assert_int_equal(dray_grammar_accept_token(m, v, 6), DRAY_EINVAL); /* empty: never */
    assert_int_equal(dray_grammar_accept_token(m, v, 7), DRAY_EINVAL);
    assert_int_equal(dray_grammar_accept_token(m, v, 8), DRAY_EINVAL); /* out of range */
    assert_int_equal(dray_grammar_accept_token(m, v, -1), DRAY_EINVAL);
    assert_int_equal(dray_grammar_accept_token(m, v, 4), 0); /* half of é */
    assert_int_equal(dray_grammar_allowed(m, v, mask), 1);
    assert_int_equal(mask[0], 1u << 5);
    assert_int_equal(dray_grammar_accept_token(m, v, 5), 0);
    assert_int_equal(dray_grammar_accept_token(m, v, 3), 0);
    assert_int_equal(dray_grammar_accept_token(m, v, 2), 0);
    assert_int_equal(dray_grammar_allowed(m, v, mask), 1);
    assert_int_equal(mask[0], 1u << 0); /* only eog */
    assert_int_equal(dray_grammar_accept_token(m, v, 0), 0);
    assert_true(dray_grammar_must_end(m));
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    dray_grammar_vocab_free(v);
    /* a vocabulary's arguments are checked */
    const int32_t bad_eog[] = {8};
    assert_int_equal(dray_grammar_vocab_new(8, pieces, lens, bad_eog, 1, &v, err, sizeof(err)),
                     DRAY_EINVAL);
    assert_null(v);
}

/* ---------------------------------------------------------------- a real vocabulary */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *real_model(void)
{
    static char path[1024];
    const char *p = getenv("DRAY_TEST_MODEL"), *root = getenv("DRAY_SOURCE_ROOT");
    if (!p) {
        snprintf(path, sizeof(path), "%s/.models/gemma-3-270m-q4_k_m.gguf", root ? root : ".");
        p = path;
    }
    FILE *f = fopen(p, "rb");
    if (!f) {
        print_message("SKIP: no model at %s (ci/setup.sh installs it)\n", p);
        return NULL;
    }
    fclose(f);
    return p;
}

static void test_grammar_gemma_vocab_mask(void **state)
{
    (void)state;
    const char *path = real_model();
    if (!path)
        skip();
    struct dray_gguf *gg;
    struct dray_tokenizer *t;
    assert_int_equal(dray_gguf_open(path, &gg, err, sizeof(err)), 0);
    assert_int_equal(dray_tokenizer_load(gg, &t, err, sizeof(err)), 0);
    dray_gguf_close(gg);
    uint32_t n = dray_tokenizer_n_vocab(t);
    char **pieces = calloc(n, sizeof(*pieces));
    uint32_t *lens = calloc(n, sizeof(*lens));
    for (uint32_t id = 0; id < n; id++) {
        lens[id] = (uint32_t)dray_tokenizer_token_bytes(t, (int32_t)id, NULL, 0);
        pieces[id] = malloc(lens[id] + 1);
        dray_tokenizer_token_bytes(t, (int32_t)id, pieces[id], lens[id]);
    }
    int32_t eog[3];
    size_t n_eog = dray_tokenizer_eog_ids(t, eog);
    double t0 = now_s();
    struct dray_grammar_vocab *v = NULL;
    assert_int_equal(dray_grammar_vocab_new(n, (const char *const *)pieces, lens, eog, n_eog, &v,
                                            err, sizeof(err)),
                     0);
    double t_vocab = now_s() - t0;
    struct dray_grammar *g = parse(json_gbnf);
    struct dray_grammar_matcher *m = matcher(g);
    uint32_t *mask = calloc((n + 31) / 32, 4);
    assert_int_equal(dray_grammar_accept_bytes(m, "{\"name\": \"", 10), 0);
    t0 = now_s();
    long count = dray_grammar_allowed(m, v, mask);
    double cold = now_s() - t0;
    t0 = now_s();
    assert_int_equal(dray_grammar_allowed(m, v, mask), count);
    double warm = now_s() - t0;
    print_message("gemma: vocab %.1f ms, string mask %ld tokens, cold %.2f ms, warm %.3f ms\n",
                  t_vocab * 1e3, count, cold * 1e3, warm * 1e3);
    assert_true(count > 200000); /* inside a string almost anything goes */
    /* a sample of tokens against the brute force */
    for (uint32_t id = 0; id < n; id += 97) {
        bool want = false;
        if (lens[id] && !dray_tokenizer_is_eog(t, (int32_t)id)) {
            struct dray_grammar_matcher *c = NULL;
            assert_int_equal(dray_grammar_matcher_clone(m, &c), 0);
            want = dray_grammar_accept_bytes(c, pieces[id], lens[id]) == 0;
            dray_grammar_matcher_free(c);
        }
        assert_int_equal(bit(mask, id), want);
    }
    /* after the string, the tokens that close it or go on */
    assert_int_equal(dray_grammar_accept_bytes(m, "Ann\"", 4), 0);
    count = dray_grammar_allowed(m, v, mask);
    assert_true(count > 0 && count < 1000);
    int32_t id = dray_tokenizer_find(t, "}", 1);
    assert_true(id >= 0 && bit(mask, (uint32_t)id));
    free(mask);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    dray_grammar_vocab_free(v);
    free_vocab_pieces(pieces, n, lens);
    dray_tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar_parse_errors_name_line_and_column),
        cmocka_unit_test(test_grammar_parse_rejects_left_recursion),
        cmocka_unit_test(test_grammar_parse_refuses_huge_grammars),
        cmocka_unit_test(test_grammar_literals_and_escapes),
        cmocka_unit_test(test_grammar_classes_negation_and_escapes),
        cmocka_unit_test(test_grammar_repetition_bounds),
        cmocka_unit_test(test_grammar_alternation_and_nested_rules),
        cmocka_unit_test(test_grammar_json_accepts_and_rejects_at_the_right_byte),
        cmocka_unit_test(test_grammar_deep_nesting_stays_correct),
        cmocka_unit_test(test_grammar_utf8_split_across_tokens),
        cmocka_unit_test(test_grammar_accept_bytes_is_atomic),
        cmocka_unit_test(test_grammar_peek_answers_like_accept_and_stays),
        cmocka_unit_test(test_grammar_clone_is_independent),
        cmocka_unit_test(test_grammar_can_end_and_must_end),
        cmocka_unit_test(test_grammar_mask_equals_brute_force),
        cmocka_unit_test(test_grammar_mask_deep_in_nesting_equals_brute_force),
        cmocka_unit_test(test_grammar_cached_mask_equals_fresh),
        cmocka_unit_test(test_grammar_accept_token),
        cmocka_unit_test(test_grammar_gemma_vocab_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
