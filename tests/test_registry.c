/* Plugin registry: search path, ABI negotiation, skip reasons, device open and
 * fallback. Fake plugins come from tests/plugins (DRAY_FAKE_PLUGIN_DIR); each
 * misbehaves in one way and must be skipped with a sentence that names the file,
 * both versions where relevant, and the remedy, while the good one loads. */
#include <dlfcn.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/plugins.h"
#include "testutil.h"

static const char *fake_dir(void)
{
    const char *d = getenv("DRAY_FAKE_PLUGIN_DIR");
    return d ? d : "tests/plugins";
}

static struct dray_registry *open_fakes(void)
{
    struct dray_registry *reg = NULL;
    char err[512] = "";
    int rc = dray_registry_open(fake_dir(), &reg, err, sizeof(err));
    if (rc != 0)
        fail_msg("registry_open: %s", err);
    assert_non_null(reg);
    return reg;
}

/* The skip reason recorded for tests/plugins/libdray-<name>.so, or NULL. */
static const char *skip_reason(const struct dray_registry *reg, const char *name)
{
    char want[128];
    snprintf(want, sizeof(want), "/libdray-%s.so", name);
    for (size_t i = 0; i < dray_registry_n_skipped(reg); i++) {
        const struct dray_skipped *s = dray_registry_skipped_at(reg, i);
        size_t n = strlen(s->path), w = strlen(want);
        if (n >= w && !strcmp(s->path + n - w, want))
            return s->reason;
    }
    return NULL;
}

static void assert_contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle))
        fail_msg("expected \"%s\" in \"%s\"", needle, hay ? hay : "(null)");
}

static void assert_skipped_with(const char *plugin, const char *needle)
{
    struct dray_registry *reg = open_fakes();
    const char *why = skip_reason(reg, plugin);
    if (!why)
        fail_msg("libdray-%s.so was not skipped", plugin);
    char file[128];
    snprintf(file, sizeof(file), "libdray-%s.so", plugin);
    assert_contains(why, file);
    assert_contains(why, needle);
    assert_null(dray_registry_find(reg, plugin, NULL, 0));
    /* the good one still loads next to it */
    assert_non_null(dray_registry_find(reg, "fakegood", NULL, 0));
    dray_registry_close(reg);
}

static void test_registry_loads_good_fake_plugin(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    char err[512] = "";
    const struct dray_plugin *p = dray_registry_find(reg, "fakegood", err, sizeof(err));
    if (!p)
        fail_msg("fakegood not found: %s", err);
    assert_string_equal(p->name, "fakegood");
    assert_int_equal(p->abi, 1); /* the fakes are version-1 plugins */
    assert_int_equal(p->n_devices, 1);
    assert_string_equal(p->nodev, "");
    assert_contains(p->path, "/libdray-fakegood.so");
    assert_non_null(p->handle);
    assert_string_equal(p->ops->describe, "fake plugin for tests (fakegood)");
    dray_registry_close(reg);
}

/* A zero-byte or non-ELF file in the plugin folder was skipped with advice to install
 * missing libraries (see ldd); the reason must quote dlopen and say what is wrong. */
static void test_registry_skips_empty_and_non_elf_files_with_dlopen_reason(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/junkplugins", dray_test_tmpdir());
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
    assert_int_equal(system(cmd), 0);
    char empty[600], text[600];
    snprintf(empty, sizeof(empty), "%s/libdray-empty.so", dir);
    snprintf(text, sizeof(text), "%s/libdray-text.so", dir);
    assert_int_equal(dray_test_write_file(empty, "", 0), 0);
    assert_int_equal(dray_test_write_file(text, "just some text\n", 15), 0);
    struct dray_registry *reg = NULL;
    assert_int_equal(dray_registry_open(dir, &reg, NULL, 0), 0);
    const char *why = skip_reason(reg, "empty");
    assert_contains(why, "dlopen said \"");
    assert_contains(why, "file too short");
    assert_contains(why, "the file is empty (0 bytes)");
    assert_null(strstr(why, "ldd"));
    why = skip_reason(reg, "text");
    assert_contains(why, "dlopen said \"");
    assert_contains(why, "not an ELF shared library (it starts with 6a 75 73 74)");
    assert_null(strstr(why, "ldd"));
    dray_registry_close(reg);
}

static void test_registry_skips_too_new_abi(void **state)
{
    (void)state;
    char want[256];
    snprintf(want, sizeof(want),
             "libdray-fakenew.so speaks ABI 7, this dray speaks %u..%u: upgrade dray to a "
             "version that speaks it, or use a build of the plugin for this dray's ABI",
             DRAY_ABI_VERSION_MIN, DRAY_ABI_VERSION);
    assert_skipped_with("fakenew", want);
}

static void test_registry_skips_too_old_abi(void **state)
{
    (void)state;
    char want[256];
    snprintf(want, sizeof(want),
             "libdray-fakeold.so speaks ABI 0, this dray speaks %u..%u: rebuild the plugin "
             "against this dray's backend.h",
             DRAY_ABI_VERSION_MIN, DRAY_ABI_VERSION);
    assert_skipped_with("fakeold", want);
}

static void test_registry_skips_plugin_without_negotiate_symbol(void **state)
{
    (void)state;
    assert_skipped_with("fakenosym", "exports no symbol dray_plugin_negotiate");
}

static void test_registry_skips_null_mandatory_member_naming_it(void **state)
{
    (void)state;
    assert_skipped_with("fakenull", "mandatory member 'attention' NULL");
}

static void test_registry_skips_plugin_that_refuses_with_its_reason(void **state)
{
    (void)state;
    assert_skipped_with("fakerefuse", "needs ABI 9 features (matrix cores)");
    assert_skipped_with("fakerefuse", "rebuild the plugin against this dray's backend.h");
}

static void test_registry_skips_table_version_disagreeing_with_negotiated(void **state)
{
    (void)state;
    assert_skipped_with("fakemismatch", "negotiated ABI 1 but its table says version 2");
}

/* A plugin named by the engine is loaded from its own file alone: the others
 * (and the runtimes they start) load only when the registry is listed. */
static void test_registry_loads_a_named_plugin_alone_until_listed(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    char other[PATH_MAX];
    snprintf(other, sizeof(other), "%s/libdray-fakenodev.so", fake_dir());
    assert_non_null(dray_registry_find(reg, "fakegood", NULL, 0));
    assert_null(dlopen(other, RTLD_NOW | RTLD_NOLOAD));
    assert_true(dray_registry_count(reg) > 1);
    void *h = dlopen(other, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    dlclose(h);
    dray_registry_close(reg);
}

static void test_registry_keeps_first_of_duplicate_names(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    const struct dray_plugin *p = dray_registry_find(reg, "fakegood", NULL, 0);
    assert_non_null(p);
    assert_contains(p->path, "/libdray-fakegood.so"); /* sorted first, so loaded first */
    const char *why = skip_reason(reg, "fakegooddup");
    assert_non_null(why);
    assert_contains(why, "libdray-fakegooddup.so is named 'fakegood'");
    assert_contains(why, p->path);
    size_t named = 0;
    for (size_t i = 0; i < dray_registry_count(reg); i++)
        named += !strcmp(dray_registry_at(reg, i)->name, "fakegood");
    assert_int_equal(named, 1);
    dray_registry_close(reg);
}

static void test_registry_lists_plugin_without_device_with_reason(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    const struct dray_plugin *p = dray_registry_find(reg, "fakenodev", NULL, 0);
    assert_non_null(p);
    assert_int_equal(p->n_devices, 0);
    assert_string_equal(p->nodev, "no FAKE driver");
    assert_null(skip_reason(reg, "fakenodev"));

    struct dray_device dev;
    char err[512] = "";
    int rc = dray_device_open(reg, "fakenodev", "", NULL, &dev, err, sizeof(err));
    assert_int_equal(rc, DRAY_ENODEV);
    assert_string_equal(err, "fakenodev: no device: no FAKE driver");
    dray_registry_close(reg);
}

static void test_registry_scans_a_folder_once_even_if_listed_twice(void **state)
{
    (void)state;
    char path[2 * PATH_MAX];
    snprintf(path, sizeof(path), "%s:%s", fake_dir(), fake_dir());
    struct dray_registry *reg = NULL;
    assert_int_equal(dray_registry_open(path, &reg, NULL, 0), 0);
    size_t good = 0, skipped_new = 0;
    for (size_t i = 0; i < dray_registry_count(reg); i++)
        good += !strcmp(dray_registry_at(reg, i)->name, "fakegood");
    for (size_t i = 0; i < dray_registry_n_skipped(reg); i++)
        skipped_new += strstr(dray_registry_skipped_at(reg, i)->path, "/libdray-fakenew.so") != NULL;
    assert_int_equal(good, 1);
    assert_int_equal(skipped_new, 1);
    dray_registry_close(reg);
}

static void test_registry_find_reports_skip_reason_and_unknown_names(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    char err[512] = "";
    assert_null(dray_registry_find(reg, "fakenew", err, sizeof(err)));
    assert_contains(err, "plugin 'fakenew' was skipped");
    assert_contains(err, "speaks ABI 7");
    assert_null(dray_registry_find(reg, "nosuchplugin", err, sizeof(err)));
    assert_contains(err, "no plugin named 'nosuchplugin'");
    assert_contains(err, "fakegood");
    dray_registry_close(reg);
}

static void test_registry_find_by_path_reuses_or_loads(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    char path[PATH_MAX], err[512] = "";
    snprintf(path, sizeof(path), "%s/libdray-fakegood.so", fake_dir());
    const struct dray_plugin *byname = dray_registry_find(reg, "fakegood", NULL, 0);
    assert_ptr_equal(dray_registry_find(reg, path, err, sizeof(err)), byname);

    /* a file skipped as a duplicate on the search path loads when named explicitly */
    snprintf(path, sizeof(path), "%s/libdray-fakegooddup.so", fake_dir());
    size_t skipped_before = dray_registry_n_skipped(reg);
    const struct dray_plugin *dup = dray_registry_find(reg, path, err, sizeof(err));
    if (!dup)
        fail_msg("explicit duplicate: %s", err);
    assert_ptr_not_equal(dup, byname);
    assert_string_equal(dup->name, "fakegood");
    assert_contains(dup->path, "/libdray-fakegooddup.so");
    assert_null(skip_reason(reg, "fakegooddup"));
    assert_int_equal(dray_registry_n_skipped(reg), skipped_before - 1);
    assert_ptr_equal(dray_registry_find(reg, "fakegood", NULL, 0), byname); /* first still wins */
    snprintf(path, sizeof(path), "%s/libdray-missing.so", fake_dir());
    assert_null(dray_registry_find(reg, path, err, sizeof(err)));
    assert_contains(err, "libdray-missing.so");
    snprintf(path, sizeof(path), "%s/libdray-fakenew.so", fake_dir());
    assert_null(dray_registry_find(reg, path, err, sizeof(err)));
    assert_contains(err, "speaks ABI 7");
    dray_registry_close(reg);
}

static void test_registry_find_by_path_loads_file_off_the_search_path(void **state)
{
    (void)state;
    /* no extra folder: the fakes are not on any search path */
    struct dray_registry *reg = NULL;
    assert_int_equal(dray_registry_open(NULL, &reg, NULL, 0), 0);
    assert_null(dray_registry_find(reg, "fakegood", NULL, 0));
    char path[PATH_MAX], err[512] = "";
    snprintf(path, sizeof(path), "%s/libdray-fakegood.so", fake_dir());
    const struct dray_plugin *p = dray_registry_find(reg, path, err, sizeof(err));
    if (!p)
        fail_msg("load by path: %s", err);
    assert_string_equal(p->name, "fakegood");
    assert_ptr_equal(dray_registry_find(reg, "fakegood", NULL, 0), p);
    dray_registry_close(reg);
}

static void test_device_open_selects_by_index_or_name(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    struct dray_device dev;
    char err[512] = "";
    assert_int_equal(dray_device_open(reg, "fakegood", "0", NULL, &dev, err, sizeof(err)), 0);
    assert_string_equal(dev.props.name, "Fake Device (fakegood)");
    assert_non_null(dev.ctx);
    dray_device_close(&dev);
    assert_null(dev.ctx);
    assert_int_equal(dray_device_open(reg, "fakegood", "FAKE dev", NULL, &dev, err, sizeof(err)), 0);
    assert_int_equal(dev.index, 0);
    dray_device_close(&dev);
    assert_int_equal(dray_device_open(reg, "fakegood", "1", NULL, &dev, err, sizeof(err)),
                     DRAY_ENOTFOUND);
    assert_contains(err, "has no device 1 (it has 1)");
    assert_int_equal(dray_device_open(reg, "fakegood", "h200", NULL, &dev, err, sizeof(err)),
                     DRAY_ENOTFOUND);
    assert_contains(err, "no device whose name contains 'h200'");
    dray_registry_close(reg);
}

static void test_device_open_failure_carries_plugin_reason(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    struct dray_device dev;
    char err[512] = "";
    int rc = dray_device_open(reg, "fakebadopen", "", NULL, &dev, err, sizeof(err));
    assert_int_equal(rc, DRAY_EBACKEND);
    assert_contains(err, "fakebadopen: cannot open device 0");
    assert_contains(err, "fake device 0 is on fire");
    assert_null(dev.ctx);
    dray_registry_close(reg);
}

static void config_for(struct dray_config *cfg, const char *backend, const char *fallback)
{
    dray_config_defaults(cfg); /* int8 weights, int8 KV: what the capability check asks */
    snprintf(cfg->backend, sizeof(cfg->backend), "%s", backend);
    snprintf(cfg->fallback, sizeof(cfg->fallback), "%s", fallback);
}

static void test_device_open_config_falls_back_to_working_backend(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    struct dray_config cfg;
    struct dray_device dev;
    char err[512] = "";
    const char *failing[] = {"fakebadopen", "fakenodev", "fakenew", "nosuchplugin"};
    for (size_t i = 0; i < sizeof(failing) / sizeof(failing[0]); i++) {
        config_for(&cfg, failing[i], "tplv1");
        int rc = dray_device_open_config(reg, &cfg, &dev, err, sizeof(err));
        if (rc != 0)
            fail_msg("fallback from %s: %s", failing[i], err);
        assert_string_equal(dev.plugin->name, "tplv1");
        dray_device_close(&dev);
    }
    dray_registry_close(reg);
}

static void test_device_open_config_without_fallback_explains(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    struct dray_config cfg;
    struct dray_device dev;
    char err[512] = "";
    config_for(&cfg, "fakebadopen", "");
    assert_int_equal(dray_device_open_config(reg, &cfg, &dev, err, sizeof(err)), DRAY_EBACKEND);
    assert_contains(err, "backend 'fakebadopen' failed");
    assert_contains(err, "fake device 0 is on fire");
    assert_contains(err, "no fallback configured");

    config_for(&cfg, "fakebadopen", "fakenodev");
    assert_int_equal(dray_device_open_config(reg, &cfg, &dev, err, sizeof(err)), DRAY_EBACKEND);
    assert_contains(err, "fake device 0 is on fire");
    assert_contains(err, "fallback 'fakenodev' failed too: fakenodev: no device: no FAKE driver");
    dray_registry_close(reg);
}

static void test_registry_finds_real_cpu_plugin_when_built(void **state)
{
    (void)state;
    const char *root = getenv("DRAY_BUILD_ROOT");
    char so[PATH_MAX], real[PATH_MAX];
    snprintf(so, sizeof(so), "%s/backends/cpu/libdray-cpu.so", root ? root : ".");
    if (access(so, R_OK) != 0) {
        print_message("SKIP: %s is not built yet\n", so);
        skip();
    }
    assert_non_null(realpath(so, real));
    struct dray_registry *reg = NULL;
    assert_int_equal(dray_registry_open(NULL, &reg, NULL, 0), 0);
    char err[512] = "";
    const struct dray_plugin *p = dray_registry_find(reg, "cpu", err, sizeof(err));
    if (!p)
        fail_msg("cpu plugin not usable: %s", err);
    assert_string_equal(p->path, real);
    assert_true(p->n_devices >= 1);
    struct dray_device dev;
    if (dray_device_open(reg, "cpu", "", NULL, &dev, err, sizeof(err)) != 0)
        fail_msg("cpu device open: %s", err);
    assert_true(dev.props.name[0] != '\0');
    dray_device_close(&dev);
    dray_registry_close(reg);
}

/* The vendor template built as a version-1 plugin (no op_caps) and as the
 * version-2 plugin it is: this version-2 host loads both, and reads the
 * capabilities of each (the version-1 one's from its props, without limits). */
static void test_registry_loads_version_1_and_2_templates(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    char err[512] = "";
    const struct dray_plugin *v1 = dray_registry_find(reg, "tplv1", err, sizeof(err));
    if (!v1)
        fail_msg("tplv1: %s", err);
    const struct dray_plugin *v2 = dray_registry_find(reg, "tplv2", err, sizeof(err));
    if (!v2)
        fail_msg("tplv2: %s", err);
    assert_int_equal(v1->abi, 1);
    assert_int_equal(v2->abi, 2);
    struct dray_op_caps c1, c2;
    assert_int_equal(dray_plugin_caps(v1, 0, &c1, err, sizeof(err)), 0);
    assert_int_equal(dray_plugin_caps(v2, 0, &c2, err, sizeof(err)), 0);
    assert_int_equal(c1.n_ops, DRAY_OP_COUNT_V1);
    assert_int_equal(c1.max_k, 0); /* a version-1 plugin declares no limits */
    assert_int_equal(c1.rope_partial, 1);
    assert_int_equal(c2.n_ops, DRAY_OP_COUNT);
    assert_int_equal(c2.max_k, 65536);
    assert_memory_equal(c1.op_dtypes, c2.op_dtypes, DRAY_OP_COUNT_V1 * sizeof(uint32_t));
    struct dray_device dev;
    struct dray_config cfg;
    config_for(&cfg, "tplv1", "");
    assert_int_equal(dray_device_open_config(reg, &cfg, &dev, err, sizeof(err)), 0);
    assert_int_equal(dev.caps.op_dtypes[DRAY_OP_ATTENTION], c1.op_dtypes[DRAY_OP_ATTENTION]);
    dray_device_close(&dev);
    dray_registry_close(reg);
}

/* A device that opens but does not run the configured dtypes counts as failed
 * at open: the fallback is used, or the refusal names the op and the dtype. */
static void test_device_open_config_checks_capabilities(void **state)
{
    (void)state;
    struct dray_registry *reg = open_fakes();
    struct dray_config cfg;
    struct dray_device dev;
    char err[512] = "";
    config_for(&cfg, "fakegood", ""); /* runs add only */
    assert_int_equal(dray_device_open_config(reg, &cfg, &dev, err, sizeof(err)), DRAY_ENOTSUP);
    assert_contains(err, "fakegood device 0");
    assert_contains(err, "does not run embed in int8 (config precision)");
    assert_contains(err, "no fallback configured");
    config_for(&cfg, "fakegood", "tplv1");
    assert_int_equal(dray_device_open_config(reg, &cfg, &dev, err, sizeof(err)), 0);
    assert_string_equal(dev.plugin->name, "tplv1");
    dray_device_close(&dev);
    dray_registry_close(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_loads_good_fake_plugin),
        cmocka_unit_test(test_registry_loads_version_1_and_2_templates),
        cmocka_unit_test(test_device_open_config_checks_capabilities),
        cmocka_unit_test(test_registry_skips_too_new_abi),
        cmocka_unit_test(test_registry_skips_too_old_abi),
        cmocka_unit_test(test_registry_skips_plugin_without_negotiate_symbol),
        cmocka_unit_test(test_registry_skips_null_mandatory_member_naming_it),
        cmocka_unit_test(test_registry_skips_plugin_that_refuses_with_its_reason),
        cmocka_unit_test(test_registry_skips_table_version_disagreeing_with_negotiated),
        cmocka_unit_test(test_registry_keeps_first_of_duplicate_names),
        cmocka_unit_test(test_registry_lists_plugin_without_device_with_reason),
        cmocka_unit_test(test_registry_scans_a_folder_once_even_if_listed_twice),
        cmocka_unit_test(test_registry_find_reports_skip_reason_and_unknown_names),
        cmocka_unit_test(test_registry_find_by_path_reuses_or_loads),
        cmocka_unit_test(test_registry_find_by_path_loads_file_off_the_search_path),
        cmocka_unit_test(test_device_open_selects_by_index_or_name),
        cmocka_unit_test(test_device_open_failure_carries_plugin_reason),
        cmocka_unit_test(test_device_open_config_falls_back_to_working_backend),
        cmocka_unit_test(test_device_open_config_without_fallback_explains),
        cmocka_unit_test(test_registry_finds_real_cpu_plugin_when_built),
        cmocka_unit_test(test_registry_loads_a_named_plugin_alone_until_listed),
        cmocka_unit_test(test_registry_skips_empty_and_non_elf_files_with_dlopen_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
