/* The prepared-layout cache (core/weights/prep_cache.h, ABI v5): the first
 * start of a model stores what the plugin packed; a later start maps that file
 * (no weight is read from the model or packed again) and gives bit-identical
 * logits; a damaged blob is detected, prepared again with the same logits, and
 * the file made anew at the next start; a cut file is a miss and is written
 * again; with prepared_layouts off (or the cache off) nothing is written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "dray/gguf.h"
#include "greedy.h"
#include "ref_naive.h"
#include "testutil.h"
#include "tiny_gemma.h"

#define N_TOK 10

static char dir[1024], model[1024];
static uint32_t vocab;

/* Whether this process maps a prepared-layout file now. */
static bool maps_prepared(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    bool found = false;
    while (f && fgets(line, sizeof(line), f))
        found = found || strstr(line, "/prep-") != NULL;
    if (f)
        fclose(f);
    return found;
}

/* The logits of a fixed prompt under the default precision (w4a8: the 4-bit
 * weights packed by the plugin); *mapped: the engine ran on a mapped file. */
static void run(float *logits, bool prepared, bool *mapped)
{
    struct dray_config c;
    struct dray_engine *e = NULL;
    char err[1024];
    dray_config_defaults(&c);
    snprintf(c.backend, sizeof(c.backend), "cpu");
    snprintf(c.model, sizeof(c.model), "%s", model);
    c.context = 64;
    c.max_seqs = 1;
    c.threads = 2;
    c.prepared_layouts = prepared;
    if (dray_engine_open(&c, &e, err, sizeof(err)))
        fail_msg("engine: %s", err);
    *mapped = maps_prepared();
    int32_t ids[N_TOK];
    dray_test_tiny_prompt(ids, N_TOK);
    float *l = ref_engine_logits(e, ids, N_TOK, vocab);
    memcpy(logits, l, sizeof(float) * N_TOK * vocab);
    free(l);
    dray_engine_close(e);
}

/* The one prep-*.bin file in dir: its path, and its inode (0: none). */
static ino_t prep_file(char *path, size_t n)
{
    uint64_t ino;
    assert_true(dray_test_cache_files(dir, "prep-*.bin", path, n, &ino) <= 1);
    return (ino_t)ino;
}

static int setup(void **state)
{
    (void)state;
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    t.weight_type = DRAY_GGML_Q4_0;
    vocab = t.n_vocab ? t.n_vocab : TINY_GEMMA_VOCAB;
    snprintf(model, sizeof(model), "%s", dray_test_path("tiny_prep.gguf"));
    if (tiny_gemma_write(&t, model))
        return -1;
    snprintf(dir, sizeof(dir), "%s", dray_test_path("prep_cache"));
    char cmd[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_a_second_start_maps_the_prepared_layouts_with_identical_logits(void **state)
{
    (void)state;
    float *first = malloc(sizeof(float) * N_TOK * vocab), *again = malloc(sizeof(float) * N_TOK * vocab);
    char path[1200];
    bool mapped;
    setenv("DRAY_CACHE_DIR", dir, 1);
    run(first, true, &mapped);
    assert_false(mapped); /* the first start prepares and stores */
    ino_t ino = prep_file(path, sizeof(path));
    assert_true(ino != 0);
    assert_non_null(strstr(path, "-cpu-1-w4a8-v1.bin"));
    run(again, true, &mapped);
    assert_true(mapped);
    assert_memory_equal(first, again, sizeof(float) * N_TOK * vocab);
    assert_true(prep_file(path, sizeof(path)) == ino); /* mapped, not written again */

    /* a flipped byte in the last blob (before the index): prepared again, same
     * logits, the file removed, and made anew at the next start */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    uint64_t index_at;
    assert_int_equal(fseek(f, 16, SEEK_SET), 0);
    assert_int_equal(fread(&index_at, 8, 1, f), 1);
    assert_int_equal(fseek(f, (long)index_at - 4096 + 100, SEEK_SET), 0);
    int b = fgetc(f);
    assert_int_equal(fseek(f, (long)index_at - 4096 + 100, SEEK_SET), 0);
    fputc(b ^ 0x5a, f);
    fclose(f);
    run(again, true, &mapped);
    assert_memory_equal(first, again, sizeof(float) * N_TOK * vocab);
    assert_int_equal(prep_file(path, sizeof(path)), 0);
    run(again, true, &mapped);
    assert_false(mapped);
    assert_memory_equal(first, again, sizeof(float) * N_TOK * vocab);
    ino = prep_file(path, sizeof(path));
    assert_true(ino != 0);

    /* a cut file: a miss, written again */
    assert_int_equal(truncate(path, 4096 + 64), 0);
    run(again, true, &mapped);
    assert_false(mapped);
    assert_memory_equal(first, again, sizeof(float) * N_TOK * vocab);
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 4096 + 64);

    /* prepared_layouts off, or the cache off: the same logits, nothing written */
    char cmd[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    run(again, false, &mapped);
    assert_memory_equal(first, again, sizeof(float) * N_TOK * vocab);
    assert_int_equal(prep_file(path, sizeof(path)), 0);
    setenv("DRAY_CACHE_DIR", "none", 1);
    run(again, true, &mapped);
    assert_false(mapped);
    assert_memory_equal(first, again, sizeof(float) * N_TOK * vocab);
    setenv("DRAY_CACHE_DIR", dir, 1);
    assert_int_equal(prep_file(path, sizeof(path)), 0);
    free(first);
    free(again);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_second_start_maps_the_prepared_layouts_with_identical_logits),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
