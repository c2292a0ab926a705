/* The calibration cache (core/weights/calib_cache.h): the first int8 start of a model
 * calibrates and stores the scores; later starts prepare the weights from them
 * and compute exactly the same logits; a stale or corrupt file is detected and
 * replaced; another model file gets its own. W4A8 weights with an int8 KV
 * calibrate only the K smoothing, and cache that under their own key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "testutil.h"
#include "tiny_gemma.h"

#define N_TOK 12

static char cache_dir[1024];

static const char *model(uint64_t seed)
{
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    t.seed = seed;
    t.loud = 20; /* loud channels, so the picks matter */
    char name[64];
    snprintf(name, sizeof(name), "tiny_calib_%llu.gguf", (unsigned long long)seed);
    const char *path = dray_test_path(name);
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    return path;
}

/* Open path in `precision` (int8: with 4 outlier channels) and an int8 KV; the
 * logits of a fixed prompt, and how the engine calibrated. */
static const char *run_in(enum dray_precision precision, const char *path, float *logits)
{
    char err[1024];
    struct dray_config c;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", path);
    snprintf(c.backend, sizeof(c.backend), "cpu");
    c.context = 64;
    c.max_seqs = 1;
    c.precision = precision; /* outlier channels are an int8 matter */
    c.outlier_channels = 4;
    c.threads = 2;
    struct dray_engine *e = NULL;
    if (dray_engine_open(&c, &e, err, sizeof(err)))
        fail_msg("engine: %s", err);
    const char *how = dray_engine_get_info(e)->calibration;
    int32_t ids[N_TOK] = {2};
    for (int i = 1; i < N_TOK; i++)
        ids[i] = 6 + (i * 29) % (TINY_GEMMA_VOCAB - 6);
    struct dray_session *s;
    assert_int_equal(dray_session_new(e, &s, err, sizeof(err)), 0);
    FILE *f = tmpfile();
    assert_int_equal(dray_session_dump_logits(s, ids, N_TOK, f, err, sizeof(err)), 0);
    rewind(f);
    assert_int_equal(fread(logits, sizeof(float) * TINY_GEMMA_VOCAB, N_TOK, f), N_TOK);
    fclose(f);
    dray_session_free(s);
    dray_engine_close(e);
    return how;
}

static const char *run(const char *path, float *logits)
{
    return run_in(DRAY_PRECISION_INT8, path, logits);
}

static int count_files(void)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "ls %s/calib-*.bin 2>/dev/null | wc -l", cache_dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    assert_int_equal(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

static void flip_a_byte_of_the_cache(void)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "ls %s/calib-*.bin", cache_dir);
    FILE *p = popen(cmd, "r");
    char file[1100];
    assert_non_null(fgets(file, sizeof(file), p));
    pclose(p);
    file[strcspn(file, "\n")] = 0;
    FILE *f = fopen(file, "r+b");
    assert_non_null(f);
    fseek(f, 200, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(ch ^ 0x40, f);
    fclose(f);
}

static void test_second_start_uses_the_cache_with_identical_logits(void **state)
{
    (void)state;
    static float a[N_TOK * TINY_GEMMA_VOCAB], b[N_TOK * TINY_GEMMA_VOCAB];
    const char *path = model(11);
    assert_string_equal(run(path, a), "computed");
    assert_int_equal(count_files(), 1);
    assert_string_equal(run(path, b), "cached");
    assert_memory_equal(a, b, sizeof(a));

    flip_a_byte_of_the_cache(); /* detected by the checksum: calibrated again */
    assert_string_equal(run(path, b), "computed");
    assert_memory_equal(a, b, sizeof(a));
    assert_string_equal(run(path, b), "cached");
    assert_int_equal(count_files(), 1);

    run(model(12), b); /* another file, another entry */
    assert_int_equal(count_files(), 2);
}

static void test_w4a8_caches_its_k_smoothing_apart_from_int8(void **state)
{
    (void)state;
    static float a[N_TOK * TINY_GEMMA_VOCAB], b[N_TOK * TINY_GEMMA_VOCAB];
    const char *path = model(14);
    int before = count_files();
    assert_string_equal(run_in(DRAY_PRECISION_W4A8, path, a), "computed");
    assert_int_equal(count_files(), before + 1);
    assert_string_equal(run_in(DRAY_PRECISION_W4A8, path, b), "cached");
    assert_memory_equal(a, b, sizeof(a));
    /* int8 calibrates in f32, so its scores are not w4a8's: a file of its own */
    assert_string_equal(run(path, b), "computed");
    assert_int_equal(count_files(), before + 2);
    assert_string_equal(run_in(DRAY_PRECISION_W4A8, path, b), "cached");
    assert_memory_equal(a, b, sizeof(a));
}

static void test_cache_off(void **state)
{
    (void)state;
    static float a[N_TOK * TINY_GEMMA_VOCAB];
    const char *path = model(13);
    setenv("DRAY_CACHE_DIR", "none", 1);
    assert_string_equal(run(path, a), "computed");
    assert_string_equal(run(path, a), "computed");
    setenv("DRAY_CACHE_DIR", cache_dir, 1);
}

int main(void)
{
    snprintf(cache_dir, sizeof(cache_dir), "%s", dray_test_path("calib_cache"));
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", cache_dir);
    if (system(cmd) != 0)
        return 1;
    setenv("DRAY_CACHE_DIR", cache_dir, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_start_uses_the_cache_with_identical_logits),
        cmocka_unit_test(test_w4a8_caches_its_k_smoothing_apart_from_int8),
        cmocka_unit_test(test_cache_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
