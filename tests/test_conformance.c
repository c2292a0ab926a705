/* Conformance runner: the CPU plugin's fast kernels pass against its reference
 * kernels; a plugin with a wrong op, or without mandatory ops, fails; results
 * are reproducible from the seed; each op is timed. Needs libdray-cpu.so (the
 * reference); each case skips with a message when it is not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "conformance.h"
#include "dray/dray.h"
#include "testutil.h"

static void need_cpu_plugin(void)
{
    const char *root = getenv("DRAY_BUILD_ROOT");
    char so[1024];
    snprintf(so, sizeof(so), "%s/backends/cpu/libdray-cpu.so", root ? root : ".");
    if (access(so, R_OK) != 0) {
        print_message("SKIP: %s is not built yet (it is the reference)\n", so);
        skip();
    }
}

static void fake_path(char *buf, size_t len, const char *name)
{
    const char *d = getenv("DRAY_FAKE_PLUGIN_DIR");
    snprintf(buf, len, "%s/libdray-%s.so", d ? d : "tests/plugins", name);
}

/* Run and capture the report. Caller frees *text. */
static int run(const struct dray_conformance_opts *o, char **text)
{
    size_t len = 0;
    FILE *f = open_memstream(text, &len);
    assert_non_null(f);
    int rc = dray_conformance_run(o, f);
    fclose(f);
    return rc;
}

static void assert_contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle))
        fail_msg("expected \"%s\" in:\n%s", needle, hay ? hay : "(null)");
}

/* The report line of one op and dtype ("add        f32 ..."). */
static const char *row_of(const char *text, const char *op, const char *dtype)
{
    char key[64];
    snprintf(key, sizeof(key), "\n%-10s %-5s", op, dtype);
    const char *p = strstr(text, key);
    if (!p)
        fail_msg("no row for %s %s in:\n%s", op, dtype, text);
    return p + 1;
}

static void test_conformance_cpu_fast_kernels_pass_against_reference(void **state)
{
    (void)state;
    need_cpu_plugin();
    struct dray_conformance_opts o = {.plugin = "cpu", .seed = 7, .reps = 6, .no_timing = 1};
    char *text = NULL;
    int rc = run(&o, &text);
    if (rc != 0)
        fail_msg("cpu plugin failed conformance (rc %d):\n%s", rc, text);
    const char *ops[][2] = {{"embed", "i8"}, {"embed", "f32"}, {"rmsnorm", "f32"}, {"matmul", "i8"},
                            {"matmul", "f32"}, {"rope", "f32"}, {"kv_store", "i8"},
                            {"kv_store", "f16"}, {"attention", "i8"}, {"attention", "f16"},
                            {"gated_act", "f32"}, {"add", "f32"},
                            {"embed", "q8g"}, {"embed", "q4g"}, {"matmul", "q8g"}, {"matmul", "q4g"},
                            {"matmul", "q5g"}, {"matmul", "q5gx2"}, {"matmul", "q4gh"}, {"matmul", "q4ghx2"}};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        const char *row = row_of(text, ops[i][0], ops[i][1]);
        const char *eol = strchr(row, '\n');
        const char *pass = strstr(row, " pass ");
        if (!pass || pass > eol)
            fail_msg("%s %s did not pass:\n%s", ops[i][0], ops[i][1], text);
    }
    assert_contains(text, "PASS: 22 of 22 op variants ran, 22 passed");
    free(text);
}

/* The vendor template, built as a version-1 plugin and as the version-2 plugin
 * it is: both certify under this version-2 kit, and the report names the ABI
 * each negotiated. */
static void test_conformance_certifies_version_1_and_2_templates(void **state)
{
    (void)state;
    need_cpu_plugin();
    for (int v = 1; v <= 2; v++) {
        char path[1024], name[16], abi[16];
        snprintf(name, sizeof(name), "tplv%d", v);
        snprintf(abi, sizeof(abi), "ABI %d)", v);
        fake_path(path, sizeof(path), name);
        struct dray_conformance_opts o = {.plugin = path, .seed = 3, .reps = 3, .no_timing = 1};
        char *text = NULL;
        int rc = run(&o, &text);
        if (rc != 0)
            fail_msg("%s failed conformance (rc %d):\n%s", name, rc, text);
        assert_contains(text, abi);
        /* the template declares the grouped weights absent: skipped, not failed */
        assert_contains(row_of(text, "matmul", "q4g"), "not supported");
        assert_contains(row_of(text, "matmul", "q5g"), "not supported");
        assert_contains(row_of(text, "matmul", "q4gh"), "not supported");
        assert_contains(text, "PASS: 12 of 22 op variants ran, 12 passed");
        free(text);
    }
}

static void test_conformance_detects_a_wrong_op(void **state)
{
    (void)state;
    need_cpu_plugin();
    char path[1024];
    fake_path(path, sizeof(path), "fakewrongadd");
    struct dray_conformance_opts o = {.plugin = path, .op = "add", .reps = 3, .no_timing = 1};
    char *text = NULL;
    assert_int_equal(run(&o, &text), 1);
    assert_contains(row_of(text, "add", "f32"), "FAIL");
    assert_contains(text, "3 of 3 cases failed; first:");
    assert_contains(text, "(allowed 0)");
    free(text);
}

static void test_conformance_fails_plugin_missing_mandatory_ops(void **state)
{
    (void)state;
    need_cpu_plugin();
    char path[1024];
    fake_path(path, sizeof(path), "fakegood");
    struct dray_conformance_opts o = {.plugin = path, .reps = 2, .no_timing = 1};
    char *text = NULL;
    assert_int_equal(run(&o, &text), 1);
    assert_contains(row_of(text, "add", "f32"), "pass");
    assert_contains(row_of(text, "matmul", "i8"), "FAIL unsupported");
    assert_contains(row_of(text, "matmul", "f32"), "not supported");
    assert_contains(text, "FAIL: 1 of 22 op variants ran, 1 passed");
    free(text);

    o.op = "add"; /* only add: the plugin passes what it was asked */
    assert_int_equal(run(&o, &text), 0);
    free(text);
}

static void test_conformance_is_reproducible_from_the_seed(void **state)
{
    (void)state;
    need_cpu_plugin();
    struct dray_conformance_opts o = {.plugin = "cpu", .op = "attention", .seed = 99, .reps = 3,
                                      .no_timing = 1, .verbose = 1};
    char *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(run(&o, &a), 0);
    assert_int_equal(run(&o, &b), 0);
    assert_string_equal(a, b);
    o.seed = 100;
    assert_int_equal(run(&o, &c), 0);
    assert_true(strcmp(a, c) != 0); /* other shapes */
    free(a);
    free(b);
    free(c);
}

static void test_conformance_times_each_op(void **state)
{
    (void)state;
    need_cpu_plugin();
    struct dray_conformance_opts o = {.plugin = "cpu", .op = "add", .reps = 1, .time_reps = 3};
    char *text = NULL;
    assert_int_equal(run(&o, &text), 0);
    const char *row = row_of(text, "add", "f32");
    double us_sub = -1, us_ref = -1;
    const char *pass = strstr(row, "pass");
    assert_non_null(pass);
    assert_int_equal(sscanf(pass + 4, "%lf %lf", &us_sub, &us_ref), 2);
    assert_true(us_sub > 0 && us_ref > 0);
    assert_contains(text, "timed shapes (median of 3 runs");
    assert_contains(text, "add        f32  n=73728");
    free(text);
}

static void test_conformance_rejects_unknown_op_and_missing_plugin(void **state)
{
    (void)state;
    struct dray_conformance_opts o = {.plugin = "cpu", .op = "conv2d", .no_timing = 1};
    char *text = NULL;
    assert_int_equal(run(&o, &text), DRAY_EINVAL);
    assert_contains(text, "unknown op");
    free(text);
    need_cpu_plugin();
    o.op = NULL;
    o.plugin = "nosuchplugin";
    assert_true(run(&o, &text) < 0);
    assert_contains(text, "cannot open the subject: no plugin named 'nosuchplugin'");
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conformance_cpu_fast_kernels_pass_against_reference),
        cmocka_unit_test(test_conformance_certifies_version_1_and_2_templates),
        cmocka_unit_test(test_conformance_detects_a_wrong_op),
        cmocka_unit_test(test_conformance_fails_plugin_missing_mandatory_ops),
        cmocka_unit_test(test_conformance_is_reproducible_from_the_seed),
        cmocka_unit_test(test_conformance_times_each_op),
        cmocka_unit_test(test_conformance_rejects_unknown_op_and_missing_plugin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
