/* Hostile grammars (core/text/grammar.h), read as a specification: what a
 * grammar may cost is judged when it is compiled (nesting, alternatives,
 * elements, stacked repetitions), each refusal naming its limit, its config
 * key and where in the text; what cannot be judged there is the step budget,
 * which fails the matcher for good with DRAY_ERANGE instead of pinning the
 * thread. The three inputs of issue 51 are pinned here. */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "grammar.h"

static char err[512];

/* text must fail to compile under lim (NULL: the defaults) with a message
 * holding every one of the NULL-ended wants. */
static void refused(const char *text, const struct dray_grammar_limits *lim, ...)
{
    struct dray_grammar *g = (struct dray_grammar *)1;
    err[0] = 0;
    assert_int_equal(dray_grammar_parse_limited(text, strlen(text), lim, &g, err, sizeof(err)),
                     DRAY_EINVAL);
    assert_null(g);
    va_list ap;
    va_start(ap, lim);
    for (const char *want; (want = va_arg(ap, const char *));) {
        if (!strstr(err, want))
            print_message("error '%s' lacks '%s'\n", err, want);
        assert_non_null(strstr(err, want));
    }
    va_end(ap);
}

static struct dray_grammar *compiled(const char *text, const struct dray_grammar_limits *lim)
{
    struct dray_grammar *g = NULL;
    int rc = dray_grammar_parse_limited(text, strlen(text), lim, &g, err, sizeof(err));
    if (rc)
        print_message("refused: %s\n", err);
    assert_int_equal(rc, 0);
    return g;
}

/* "root ::= " then n '(' , "x", n ')' */
static char *nested(size_t n)
{
    char *s = malloc(2 * n + 16);
    assert_non_null(s);
    size_t k = (size_t)sprintf(s, "root ::= ");
    memset(s + k, '(', n);
    k += n;
    s[k++] = '"', s[k++] = 'x', s[k++] = '"';
    memset(s + k, ')', n);
    s[k + n] = 0;
    return s;
}

/* Issue 51, input 1: 45,000 nested parentheses crashed the recursive parser. */
static void test_deep_nesting_is_refused_where_it_passes_the_limit(void **state)
{
    (void)state;
    char *s = nested(45000);
    /* the 1025th '(' is column 10 + 1024 */
    refused(s, NULL, "line 1, column 1034:", "nested deeper than 1024",
            "config key grammar_max_depth", NULL);
    free(s);
    s = nested(1024);
    dray_grammar_free(compiled(s, NULL));
    free(s);
    const struct dray_grammar_limits three = {.max_depth = 3};
    refused("root ::= \"a\" |\n  (((( \"b\" ))))", &three, "line 2, column 6:",
            "nested deeper than 3", NULL);
    dray_grammar_free(compiled("root ::= ((( \"b\" )))", &three));
}

/* Issue 51, input 2: stacked loops on '.' and a class made every character
 * multiply the matcher's stacks (no answer in 40 s). One loop around another
 * matches nothing one loop does not, so it is refused, wherever it hides. */
static void test_a_loop_around_a_loop_is_refused(void **state)
{
    (void)state;
    char hostile[400];
    int k = snprintf(hostile, sizeof(hostile), "root ::= .");
    for (int i = 0; i < 20; i++)
        k += snprintf(hostile + k, sizeof(hostile) - (size_t)k, "+");
    for (int i = 0; i < 20; i++)
        k += snprintf(hostile + k, sizeof(hostile) - (size_t)k, "?");
    k += snprintf(hostile + k, sizeof(hostile) - (size_t)k, " [a-z]");
    for (int i = 0; i < 20; i++)
        k += snprintf(hostile + k, sizeof(hostile) - (size_t)k, "+");
    refused(hostile, NULL, "line 1, column 12:", "unbounded repetition of an item that "
            "is already one", NULL);
    refused("root ::= \"a\"*+", NULL, "column 14:", NULL);
    refused("root ::= [a-z]{2,}*", NULL, "column 19:", NULL);
    refused("root ::= ( \"a\"+ )*", NULL, "column 18:", NULL);
    refused("root ::= ((( . + )))+", NULL, "column 21:", NULL);
    /* a bounded one around a loop, or a loop around a sequence, is fine */
    const char *fine[] = {"root ::= \"a\"+?", "root ::= ( \"a\"+ ){3}", "root ::= ( \"a\"+ \"b\" )+",
                          "root ::= ( \"a\"+ | \"b\" )*", "root ::= ( [a-z]+ \",\" )* [a-z]+"};
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++)
        dray_grammar_free(compiled(fine[i], NULL));
}

/* Issue 51, input 3: 12,000 alternatives made every token's mask cost 0.5 s. */
static void test_a_rule_over_the_alternatives_limit_is_refused(void **state)
{
    (void)state;
    size_t n = 12000, cap = 16 + n * 8;
    char *s = malloc(cap);
    assert_non_null(s);
    size_t k = (size_t)sprintf(s, "root ::= ");
    for (size_t i = 0; i < n; i++)
        k += (size_t)sprintf(s + k, "%s\"%c%c%c\"", i ? " | " : "", 'a' + (int)(i % 26),
                             'a' + (int)(i / 26 % 26), 'a' + (int)(i / 676 % 26));
    refused(s, NULL, "rule 'root' has 12000 alternatives, over the limit of 1024",
            "config key grammar_max_alternatives", NULL);
    /* a group is a rule too */
    const struct dray_grammar_limits two = {.max_alternatives = 2};
    refused("root ::= \"x\" ( \"a\" | \"b\" | \"c\" )", &two, "(a group in it) has 3 "
            "alternatives, over the limit of 2", NULL);
    dray_grammar_free(compiled("root ::= \"x\" ( \"a\" | \"b\" ) | \"y\"", &two));
    free(s);
}

static void test_the_element_limit_is_configurable_but_not_raised(void **state)
{
    (void)state;
    const struct dray_grammar_limits small = {.max_elements = 100};
    refused("root ::= \"ab\"{60}", &small, "over 100 elements (config key grammar_max_elements)",
            NULL);
    const struct dray_grammar_limits big = {.max_elements = 1u << 30};
    refused("root ::= \"ab\"{40000}", &big, "over 65536 elements", NULL);
}

/* A root of n alternatives, each "x" then a rule of n alternatives: one
 * transition past "q" builds n * n stacks. */
static char *square(int n)
{
    char *s = malloc((size_t)n * 24 + 64);
    assert_non_null(s);
    int k = sprintf(s, "root ::= \"q\" a\na ::= ");
    for (int i = 0; i < n; i++)
        k += sprintf(s + k, "%sb \"%c\"", i ? " | " : "", 'a' + i % 26);
    k += sprintf(s + k, "\nb ::= ");
    for (int i = 0; i < n; i++)
        k += sprintf(s + k, "%s\"%c\" \"z\"", i ? " | " : "", 'a' + i % 26);
    return s;
}

/* Over the stack budget, the matcher fails for good and says which budget;
 * the failed call leaves nothing half done. */
static void test_over_the_stack_budget_the_matcher_fails_for_good(void **state)
{
    (void)state;
    const struct dray_grammar_limits lim = {.step_stacks = 4096};
    char *s = square(200);
    struct dray_grammar *g = compiled(s, &lim);
    struct dray_grammar_matcher *m = NULL;
    assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
    assert_null(dray_grammar_matcher_error(m));
    assert_int_equal(dray_grammar_accept_bytes(m, "q", 1), DRAY_ERANGE);
    assert_non_null(strstr(dray_grammar_matcher_error(m), "config key grammar_step_stacks"));
    assert_int_equal(dray_grammar_peek_bytes(m, "q", 1), DRAY_ERANGE);
    assert_int_equal(dray_grammar_accept_bytes(m, "", 0), DRAY_ERANGE);
    assert_false(dray_grammar_can_end(m));
    struct dray_grammar_matcher *c = NULL;
    assert_int_equal(dray_grammar_matcher_clone(m, &c), 0);
    assert_int_equal(dray_grammar_peek_bytes(c, "q", 1), DRAY_ERANGE);
    dray_grammar_matcher_free(c);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    /* under the default budget the same grammar is followed */
    g = compiled(s, NULL);
    assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
    assert_int_equal(dray_grammar_accept_bytes(m, "qaza", 4), 0);
    assert_true(dray_grammar_can_end(m));
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    free(s);
}

/* A grammar whose start alone is over the budget cannot get a matcher, and
 * the check a server makes at admission says so. */
static void test_a_start_over_the_budget_is_refused_at_admission(void **state)
{
    (void)state;
    const struct dray_grammar_limits lim = {.step_stacks = 4096};
    char *s = square(200);
    memmove(s + 9, s + 13, strlen(s + 13) + 1); /* root ::= a */
    struct dray_grammar *g = compiled(s, &lim);
    struct dray_grammar_matcher *m = (struct dray_grammar_matcher *)1;
    assert_int_equal(dray_grammar_matcher_new(g, &m), DRAY_ERANGE);
    assert_null(m);
    dray_grammar_free(g);
    assert_int_equal(dray_grammar_check_limits(s, strlen(s), &lim, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "start state alone is over the step budget"));
    assert_int_equal(dray_grammar_check_limits(s, strlen(s), NULL, err, sizeof(err)), 0);
    free(s);
}

/* A step that runs past its time fails the matcher at the next check inside
 * the loops; a step within it does not. (The clock is made to have run out:
 * no timing is measured.) */
static void test_a_step_past_its_time_fails_the_matcher(void **state)
{
    (void)state;
    const struct dray_grammar_limits lim = {.step_ms = 1};
    char *s = square(60);
    struct dray_grammar *g = compiled(s, &lim);
    struct dray_grammar_matcher *m = NULL, *c = NULL;
    assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
    assert_int_equal(dray_grammar_matcher_clone(m, &c), 0);
    dray_grammar_step_begin(m);
    nanosleep(&(struct timespec){0, 5000000}, NULL); /* 5 ms: past the 1 ms */
    assert_int_equal(dray_grammar_accept_bytes(m, "q", 1), DRAY_ERANGE);
    assert_non_null(strstr(dray_grammar_matcher_error(m), "config key grammar_step_ms"));
    /* outside a step, no clock: the same transition goes through */
    assert_int_equal(dray_grammar_accept_bytes(c, "qaza", 4), 0);
    dray_grammar_matcher_free(c);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    free(s);
}

/* A watched stop flag ends the step from inside its loops, for good. */
static void test_a_set_stop_flag_ends_the_step(void **state)
{
    (void)state;
    char *s = square(200);
    struct dray_grammar *g = compiled(s, NULL);
    struct dray_grammar_matcher *m = NULL, *c = NULL;
    atomic_bool stop = false;
    assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
    dray_grammar_matcher_watch(m, &stop);
    assert_int_equal(dray_grammar_matcher_clone(m, &c), 0); /* a clone watches nothing */
    atomic_store(&stop, true);
    assert_int_equal(dray_grammar_accept_bytes(m, "q", 1), DRAY_ECANCELED);
    assert_non_null(strstr(dray_grammar_matcher_error(m), "cancelled"));
    assert_int_equal(dray_grammar_peek_bytes(m, "", 0), DRAY_ECANCELED);
    assert_int_equal(dray_grammar_accept_bytes(c, "qaza", 4), 0);
    dray_grammar_matcher_free(c);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deep_nesting_is_refused_where_it_passes_the_limit),
        cmocka_unit_test(test_a_loop_around_a_loop_is_refused),
        cmocka_unit_test(test_a_rule_over_the_alternatives_limit_is_refused),
        cmocka_unit_test(test_the_element_limit_is_configurable_but_not_raised),
        cmocka_unit_test(test_over_the_stack_budget_the_matcher_fails_for_good),
        cmocka_unit_test(test_a_start_over_the_budget_is_refused_at_admission),
        cmocka_unit_test(test_a_step_past_its_time_fails_the_matcher),
        cmocka_unit_test(test_a_set_stop_flag_ends_the_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
