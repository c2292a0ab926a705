/* Device failures, injected by the test plugin libdray-faulty.so (the CPU plugin
 * with the call DRAY_FAULT names failing, tests/plugins/faulty.c), on a tiny
 * random-weight Gemma. The specification: whichever call of the plugin fails,
 * at load, in a generation or in a scheduled request,
 *   - the error names the plugin and the call that failed;
 *   - nothing the engine held leaks (the ASan build's leak check runs this too);
 *   - the engine goes on: the next generation, or the scheduler's next request,
 *     gives exactly the tokens of a run without faults, and the failed request's
 *     KV blocks are back in the pool.
 * The sweeps fail every call of a whole generation in turn (and a stride of the
 * load and of a scheduled request): a path that ignores a failure, or reports
 * it without naming it, fails here. */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "greedy.h"
#include "testutil.h"
#include "tiny_gemma.h"

#define N_GEN 6
#define NEVER 1000000000ul /* a call number no run reaches */
static const int32_t PROMPT[] = {2, 17, 40, 93, 120, 7, 250};
#define N_PROMPT (sizeof(PROMPT) / sizeof(PROMPT[0]))

static const char *const KINDS[] = {"alloc", "upload", "download", "copy", "fill", "synchronize", "weight_create", "embed",
                                    "rmsnorm", "matmul", "rope", "kv_store", "attention", "gated_act", "add"};
#define N_KINDS (sizeof(KINDS) / sizeof(KINDS[0]))

static char g_model[1024], g_plugin[1100], g_plugin_dir[1024];
static int32_t g_clean[N_GEN]; /* the tokens without faults */
static unsigned long g_load_calls, g_gen_calls; /* plugin calls of a load, of one generation */

/* A function the loaded plugin exports for tests. */
static void *plugin_fn(const char *name)
{
    void *h = dlopen(g_plugin, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    void *sym = dlsym(h, name);
    assert_non_null(sym);
    dlclose(h); /* the engine holds it open */
    return sym;
}

/* The plugin's call counter (since its last open or arm) for kind. */
static unsigned long calls(const char *kind)
{
    void *sym = plugin_fn("dray_faulty_calls");
    unsigned long (*fn)(const char *);
    memcpy(&fn, &sym, sizeof(fn));
    return fn(kind);
}

/* Fail the Nth call of kind from now on (the plugin must be idle). */
static void arm(const char *kind, unsigned long n)
{
    char setting[64];
    snprintf(setting, sizeof(setting), "%s:%lu", kind, n);
    void *sym = plugin_fn("dray_faulty_arm");
    int (*fn)(const char *);
    memcpy(&fn, &sym, sizeof(fn));
    assert_int_equal(fn(setting), 0);
}

/* Opens the tiny model on the faulty plugin with DRAY_FAULT=fault (NULL: none).
 * Returns NULL with the reason in err when the open fails. */
static struct dray_engine *open_faulty(const char *fault, char *err, size_t errlen)
{
    if (fault)
        setenv("DRAY_FAULT", fault, 1);
    else
        unsetenv("DRAY_FAULT");
    struct dray_config c;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", g_model);
    snprintf(c.plugin_path, sizeof(c.plugin_path), "%s", g_plugin_dir);
    snprintf(c.backend, sizeof(c.backend), "faulty");
    c.fallback[0] = 0; /* a failure must not quietly move to the CPU plugin */
    c.context = 64;
    c.max_seqs = 2;
    c.kv_block = 4;
    c.threads = 1;
    c.prefix_cache = false; /* every block of a finished request goes back to the pool */
    struct dray_engine *e = NULL;
    int rc = dray_engine_open(&c, &e, err, errlen);
    unsetenv("DRAY_FAULT");
    return rc ? NULL : e;
}

/* One greedy generation in a fresh session: its rc, the tokens in out. */
static int generate(struct dray_engine *e, struct dray_test_tokens *out, char *err, size_t errlen)
{
    return dray_test_generate_fresh(e, PROMPT, N_PROMPT, N_GEN, out, err, errlen);
}

/* The error of an injected fault: the plugin by name, and which call failed. */
static void expect_named(const char *err, const char *what)
{
    if (!strstr(err, "faulty") || !strstr(err, "injected fault"))
        fail_msg("%s: the error does not name the plugin and the failed call: \"%s\"", what, err);
}

static int setup(void **state)
{
    (void)state;
    const char *dir = getenv("DRAY_FAKE_PLUGIN_DIR");
    if (!dir)
        return -1;
    /* a folder of its own (the fake plugins' folder holds misbehaving ones) */
    snprintf(g_plugin_dir, sizeof(g_plugin_dir), "%s", dray_test_path("faulty_plugin"));
    snprintf(g_plugin, sizeof(g_plugin), "%s/libdray-faulty.so", g_plugin_dir);
    char real[4200];
    snprintf(real, sizeof(real), "%s/libdray-faulty.so", dir);
    if ((mkdir(g_plugin_dir, 0755) && errno != EEXIST) || (symlink(real, g_plugin) && errno != EEXIST)) {
        fprintf(stderr, "%s: %s\n", g_plugin, strerror(errno));
        return -1;
    }
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    snprintf(g_model, sizeof(g_model), "%s", dray_test_path("tiny_fault.gguf"));
    if (tiny_gemma_write(&t, g_model))
        return -1;
    /* the clean run: its tokens, and how many calls a load and a generation make.
     * The first open calibrates and fills the calibration cache; every later one
     * (the sweeps') loads from it with fewer calls, so the count is taken then. */
    char err[1024];
    struct dray_engine *e = open_faulty(NULL, err, sizeof(err));
    dray_engine_close(e);
    e = open_faulty(NULL, err, sizeof(err));
    if (!e) {
        fprintf(stderr, "open: %s\n", err);
        return -1;
    }
    g_load_calls = calls("any");
    struct dray_test_tokens c;
    int rc = generate(e, &c, err, sizeof(err));
    g_gen_calls = calls("any") - g_load_calls;
    dray_engine_close(e);
    if (rc || c.n != N_GEN) {
        fprintf(stderr, "clean generation: %s\n", rc ? err : "too few tokens");
        return -1;
    }
    memcpy(g_clean, c.ids, sizeof(g_clean));
    fprintf(stderr, "clean run: %lu plugin calls to load, %lu to generate %d tokens\n", g_load_calls,
            g_gen_calls, N_GEN);
    return 0;
}

/* Every call of a generation fails in turn, on one engine: the generation
 * reports it, the next one gives the clean tokens (so does every later one:
 * the failures add up on the same engine and must leave nothing behind). */
static void test_every_call_of_a_generation(void **state)
{
    (void)state;
    char err[1024];
    struct dray_engine *e = open_faulty(NULL, err, sizeof(err));
    assert_non_null(e);
    unsigned long hit = 0;
    for (unsigned long n = 1; n <= g_gen_calls; n++) {
        struct dray_test_tokens c;
        arm("any", n);
        if (generate(e, &c, err, sizeof(err)) == 0) {
            /* a call whose failure the engine may absorb must still give the clean tokens */
            if (c.n != N_GEN || memcmp(c.ids, g_clean, sizeof(g_clean)))
                fail_msg("any:%lu: the generation succeeded with other tokens than the clean run", n);
        } else {
            expect_named(err, "a generation");
            hit++;
        }
        /* a call the first generation of an engine makes once (growing a buffer)
         * may not come again: a fault still pending must not hit the next one */
        arm("any", NEVER);
        if (generate(e, &c, err, sizeof(err)))
            fail_msg("any:%lu: the generation after the failed one failed too: %s", n, err);
        if (c.n != N_GEN || memcmp(c.ids, g_clean, sizeof(g_clean)))
            fail_msg("any:%lu: the generation after the failed one gave other tokens", n);
    }
    dray_engine_close(e);
    /* nearly every call is one whose failure must end the generation */
    assert_true(hit * 10 >= g_gen_calls * 9);
}

/* A stride of the load's calls fails (the calibration cache is warm, as after
 * the first start): the open fails with the plugin's reason, frees what it held
 * (the leak check), and the next open works. Before, a failure while preparing
 * the weights from the cache was taken for a cache that does not fit the model:
 * a warning blamed the cache and the load ran again. */
static void test_calls_of_the_load(void **state)
{
    (void)state;
    char err[1024], fault[64];
    unsigned long stride = g_load_calls / 97 + 1;
    for (unsigned long n = 1; n <= g_load_calls; n += stride) {
        snprintf(fault, sizeof(fault), "any:%lu", n);
        struct dray_engine *e = open_faulty(fault, err, sizeof(err));
        if (e)
            fail_msg("%s: the load went on as if the failed call had worked", fault);
        expect_named(err, fault);
    }
    struct dray_engine *e = open_faulty(NULL, err, sizeof(err));
    assert_non_null(e);
    dray_engine_close(e);
}

/* The first call of each kind within a generation, by kind (a stride could miss
 * a rare kind). */
static void test_first_call_of_each_kind_in_a_generation(void **state)
{
    (void)state;
    char err[1024], fault[64];
    struct dray_engine *e = open_faulty(NULL, err, sizeof(err));
    assert_non_null(e);
    unsigned long at_load[N_KINDS];
    for (size_t k = 0; k < N_KINDS; k++)
        at_load[k] = calls(KINDS[k]);
    struct dray_test_tokens c;
    assert_int_equal(generate(e, &c, err, sizeof(err)), 0);
    unsigned long in_gen[N_KINDS];
    for (size_t k = 0; k < N_KINDS; k++)
        in_gen[k] = calls(KINDS[k]) - at_load[k];
    dray_engine_close(e);
    e = open_faulty(NULL, err, sizeof(err));
    assert_non_null(e);
    for (size_t k = 0; k < N_KINDS; k++) {
        if (!in_gen[k])
            continue;
        snprintf(fault, sizeof(fault), "%s:1", KINDS[k]);
        arm(KINDS[k], 1);
        if (generate(e, &c, err, sizeof(err)) == 0)
            fail_msg("%s: a failed %s went unnoticed", fault, KINDS[k]);
        expect_named(err, fault);
        if (!strstr(err, KINDS[k]))
            fail_msg("%s: the error does not name %s: \"%s\"", fault, KINDS[k], err);
        assert_int_equal(generate(e, &c, err, sizeof(err)), 0);
        assert_memory_equal(c.ids, g_clean, sizeof(g_clean));
    }
    dray_engine_close(e);
}

/* One scheduled request to the end: its output, its ids in got. */
static struct dray_request_output run_request(struct dray_sched *s, struct dray_request **r,
                                              struct dray_test_tokens *got)
{
    char err[512];
    struct dray_request_params p = {.ids = PROMPT, .n_ids = N_PROMPT};
    dray_test_greedy_params(&p.gen, N_GEN);
    if (dray_sched_submit(s, &p, r, err, sizeof(err)))
        fail_msg("submit: %s", err);
    struct dray_request_output o;
    got->n = 0;
    do {
        assert_int_equal(dray_request_poll(*r, &o, -1), 1);
        for (size_t i = 0; i < o.n_ids && got->n < DRAY_TEST_MAX_GEN; i++)
            got->ids[got->n++] = o.ids[i];
    } while (!o.done);
    return o;
}

/* The scheduler, every call of a request failing in turn: the request ends with
 * an error naming the call, its blocks go back to the pool, and the next
 * request gives the clean tokens. */
static void test_scheduled_request(void **state)
{
    (void)state;
    char err[1024];
    struct dray_engine *e = open_faulty(NULL, err, sizeof(err));
    assert_non_null(e);
    struct dray_sched *s = NULL;
    if (dray_sched_create(e, 0, &s, err, sizeof(err)))
        fail_msg("scheduler: %s", err);
    struct dray_test_tokens got;
    struct dray_request *r = NULL;
    arm("any", NEVER); /* count the calls of a clean request */
    struct dray_request_output o = run_request(s, &r, &got);
    assert_int_equal(o.rc, 0);
    dray_request_free(r);
    unsigned long req_calls = calls("any");
    uint64_t failed = 0;
    for (unsigned long n = 1; n <= req_calls; n++) {
        arm("any", n);
        o = run_request(s, &r, &got);
        if (o.rc) {
            assert_string_equal(o.finish_reason, "error");
            expect_named(o.error, "a scheduled request");
            failed++;
        } else if (got.n != N_GEN || memcmp(got.ids, g_clean, sizeof(g_clean))) {
            fail_msg("any:%lu: the request succeeded with other tokens than the clean run", n);
        }
        dray_request_free(r);
        arm("any", NEVER);
        struct dray_sched_stats st;
        dray_sched_get_stats(s, &st);
        if (st.kv_blocks_used != 0)
            fail_msg("any:%lu: %llu KV blocks still held after the request ended", n,
                     (unsigned long long)st.kv_blocks_used);
        assert_int_equal(st.requests_failed, failed);
        o = run_request(s, &r, &got);
        if (o.rc)
            fail_msg("any:%lu: the request after the failed one failed too: %s", n, o.error);
        if (got.n != N_GEN || memcmp(got.ids, g_clean, sizeof(g_clean)))
            fail_msg("any:%lu: the request after the failed one gave other tokens", n);
        dray_request_free(r);
    }
    assert_true(failed * 10 >= req_calls * 9);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* A DRAY_FAULT the plugin cannot read fails the open with the reason. */
static void test_bad_setting_is_refused(void **state)
{
    (void)state;
    char err[1024];
    struct dray_engine *e = open_faulty("matmul:zero", err, sizeof(err));
    assert_null(e);
    if (!strstr(err, "DRAY_FAULT='matmul:zero'"))
        fail_msg("the error does not quote the setting: \"%s\"", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_call_of_a_generation),
        cmocka_unit_test(test_calls_of_the_load),
        cmocka_unit_test(test_first_call_of_each_kind_in_a_generation),
        cmocka_unit_test(test_scheduled_request),
        cmocka_unit_test(test_bad_setting_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
