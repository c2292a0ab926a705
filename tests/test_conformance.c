/* Conformance runner: the CPU plugin's fast kernels pass against its reference
 * kernels; the template passes as ABI 1, 2, 3 and 4 (packed weights: a row per
 * declared format and pass count, the undeclared ones skipped and refused by
 * weight_create; version 4's two-level formats only from an ABI-4 plugin); a
 * plugin with a wrong op, or without mandatory ops, fails;
 * results are reproducible from the seed; each op is timed. Needs libdray-cpu.so (the
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
    snprintf(key, sizeof(key), "\n%-13s %-13s ", op, dtype);
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
                            {"gated_act", "f32"}, {"add", "f32"}, {"rope", "f32-ff-mscale"},
                            {"attention", "i8-softcap"}, {"attention", "f16-softcap"}};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        const char *row = row_of(text, ops[i][0], ops[i][1]);
        const char *eol = strchr(row, '\n');
        const char *pass = strstr(row, " pass ");
        if (!pass || pass > eol)
            fail_msg("%s %s did not pass:\n%s", ops[i][0], ops[i][1], text);
    }
    /* the packed formats it declares (if any) pass too: nothing failed */
    assert_contains(text, "\nPASS: ");
    free(text);
}

/* A row says verdict (" pass ", " not supported "). */
static void assert_row(const char *text, const char *op, const char *dtype, const char *verdict)
{
    const char *row = row_of(text, op, dtype);
    const char *eol = strchr(row, '\n');
    const char *v = strstr(row, verdict);
    if (!v || (eol && v > eol))
        fail_msg("%s %s is not '%s':\n%s", op, dtype, verdict, text);
}

/* The vendor template, built as a version-1 and a version-2 plugin: both
 * certify under this version-3 kit, the report names the ABI each negotiated,
 * and the packed-weight rows are skipped (a version-2 table has no
 * weight_create). */
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
        assert_row(text, "matmul", "q4-f32-min", " not supported ");
        assert_row(text, "matmul", "q5-f16-min-x2", " not supported ");
        assert_row(text, "embed", "q8-f32", " not supported ");
        assert_row(text, "weight_create", "refusals", " not supported ");
        assert_row(text, "attention", "i8-softcap", " not supported "); /* a version-4 argument */
        assert_row(text, "matmul", "q4-k", " not supported ");             /* a version-4 format */
        assert_row(text, "weight_create", "refusals-k", " not supported ");
        assert_contains(text, "PASS: 12 of 62 op variants ran, 12 passed");
        free(text);
    }
}

/* The template as a version-3 plugin: every packed format, for matmul (one
 * pass and two) and embed, through weight_create, and its refusals; the
 * version-4 rows (rope factors, softcap) are not its ABI's and are skipped. */
static void test_conformance_certifies_the_version_3_template(void **state)
{
    (void)state;
    need_cpu_plugin();
    char path[1024];
    fake_path(path, sizeof(path), "tplv3");
    struct dray_conformance_opts o = {.plugin = path, .seed = 5, .reps = 4, .no_timing = 1};
    char *text = NULL;
    int rc = run(&o, &text);
    if (rc != 0)
        fail_msg("tplv3 failed conformance (rc %d):\n%s", rc, text);
    assert_contains(text, "ABI 3)");
    assert_row(text, "rope", "f32-ff-mscale", " not supported ");
    assert_row(text, "attention", "i8-softcap", " not supported ");
    assert_row(text, "attention", "f16-softcap", " not supported ");
    const char *fmts[] = {"q4-f32", "q4-f32-min", "q4-f16", "q4-f16-min", "q5-f32", "q5-f32-min",
                          "q5-f16", "q5-f16-min", "q8-f32", "q8-f32-min", "q8-f16", "q8-f16-min"};
    for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
        char x2[32];
        snprintf(x2, sizeof(x2), "%s-x2", fmts[i]);
        assert_row(text, "embed", fmts[i], " pass ");
        assert_row(text, "matmul", fmts[i], " pass ");
        assert_row(text, "matmul", x2, " pass ");
    }
    assert_row(text, "weight_create", "refusals", " pass ");
    assert_row(text, "embed", "q6-k", " not supported ");
    assert_row(text, "matmul", "q5-k-x2", " not supported ");
    assert_row(text, "weight_create", "refusals-k", " not supported ");
    assert_contains(text, "PASS: 49 of 62 op variants ran, 49 passed");
    free(text);
}

/* A version-3 plugin that declares version 4's two-level formats as well
 * (bits its ABI does not have; its weight_create refuses them): the kit runs
 * only what version 3 defines, and it passes. */
static void test_conformance_ignores_two_level_formats_below_version_4(void **state)
{
    (void)state;
    need_cpu_plugin();
    char path[1024];
    fake_path(path, sizeof(path), "tplv3k");
    struct dray_conformance_opts o = {.plugin = path, .op = "matmul", .seed = 5, .reps = 2, .no_timing = 1};
    char *text = NULL;
    int rc = run(&o, &text);
    if (rc != 0)
        fail_msg("tplv3k failed conformance (rc %d):\n%s", rc, text);
    assert_contains(text, "ABI 3)");
    assert_row(text, "matmul", "q4-f16-min", " pass ");
    assert_row(text, "matmul", "q4-k", " not supported ");
    assert_row(text, "matmul", "q6-k-x2", " not supported ");
    free(text);
    o.op = "weight_create";
    assert_int_equal(run(&o, &text), 0);
    assert_row(text, "weight_create", "refusals", " pass ");
    assert_row(text, "weight_create", "refusals-k", " not supported ");
    free(text);
}

/* The template as the version-4 plugin it is: rope with frequency factors and
 * attn_factor (some with a partial n_rot), attention with a softcap over
 * prefill and decode batches, windows and GQA, I8 and F16 KV, each against
 * the CPU plugin's scalar reference; the two-level formats (GGUF's Q4_K, Q5_K,
 * Q6_K shapes) for embed and matmul, one pass and two, and their refusals;
 * every other row as in version 3. */
static void test_conformance_certifies_the_version_4_template(void **state)
{
    (void)state;
    need_cpu_plugin();
    char path[1024];
    fake_path(path, sizeof(path), "tplv4");
    struct dray_conformance_opts o = {.plugin = path, .seed = 9, .reps = 16, .no_timing = 1};
    char *text = NULL;
    int rc = run(&o, &text);
    if (rc != 0)
        fail_msg("tplv4 failed conformance (rc %d):\n%s", rc, text);
    assert_contains(text, "ABI 4)");
    assert_row(text, "rope", "f32-ff-mscale", " pass ");
    assert_row(text, "attention", "i8-softcap", " pass ");
    assert_row(text, "attention", "f16-softcap", " pass ");
    const char *fmts[] = {"q4-k", "q5-k", "q6-k"};
    for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
        char x2[32];
        snprintf(x2, sizeof(x2), "%s-x2", fmts[i]);
        assert_row(text, "embed", fmts[i], " pass ");
        assert_row(text, "matmul", fmts[i], " pass ");
        assert_row(text, "matmul", x2, " pass ");
    }
    assert_row(text, "weight_create", "refusals-k", " pass ");
    assert_contains(text, "PASS: 62 of 62 op variants ran, 62 passed");
    free(text);
}

/* A version-3 plugin that declares a few formats (tplpart: q4 f32 with and
 * without a min for matmul, one pass; q4 f32 for embed): those run, the others
 * are skipped, and weight_create refuses the undeclared ones (the refusal
 * cases ask for them). */
static void test_conformance_skips_undeclared_packed_formats(void **state)
{
    (void)state;
    need_cpu_plugin();
    char path[1024];
    fake_path(path, sizeof(path), "tplpart");
    struct dray_conformance_opts o = {.plugin = path, .seed = 11, .reps = 12, .no_timing = 1,
                                      .verbose = 1};
    char *text = NULL;
    int rc = run(&o, &text);
    if (rc != 0)
        fail_msg("tplpart failed conformance (rc %d):\n%s", rc, text);
    assert_row(text, "matmul", "q4-f32", " pass ");
    assert_row(text, "matmul", "q4-f32-min", " pass ");
    assert_row(text, "matmul", "q4-f32-x2", " not supported ");
    assert_row(text, "matmul", "q8-f16", " not supported ");
    assert_row(text, "embed", "q4-f32", " pass ");
    assert_row(text, "embed", "q4-f32-min", " not supported ");
    assert_row(text, "weight_create", "refusals", " pass ");
    assert_contains(text, "refused undeclared format");
    assert_row(text, "matmul", "q4-k", " not supported ");
    assert_contains(text, "PASS: 16 of 62 op variants ran, 16 passed");
    free(text);
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
    assert_contains(text, "FAIL: 1 of 62 op variants ran, 1 passed");
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
    char shape[64];
    snprintf(shape, sizeof(shape), "  %-13s %-13s n=73728", "add", "f32");
    assert_contains(text, shape);
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
        cmocka_unit_test(test_conformance_certifies_the_version_3_template),
        cmocka_unit_test(test_conformance_certifies_the_version_4_template),
        cmocka_unit_test(test_conformance_ignores_two_level_formats_below_version_4),
        cmocka_unit_test(test_conformance_skips_undeclared_packed_formats),
        cmocka_unit_test(test_conformance_detects_a_wrong_op),
        cmocka_unit_test(test_conformance_fails_plugin_missing_mandatory_ops),
        cmocka_unit_test(test_conformance_is_reproducible_from_the_seed),
        cmocka_unit_test(test_conformance_times_each_op),
        cmocka_unit_test(test_conformance_rejects_unknown_op_and_missing_plugin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
