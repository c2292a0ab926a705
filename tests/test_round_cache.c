/* The rounded-weights cache (core/weights/round_cache.h): the first start of a model
 * whose rescored head is a 4-bit rounding of its 8-bit table writes the rounded
 * rows once; later starts read them (the file is not written again) and give
 * bit-identical logits; a corrupt file is detected, replaced and gives the same
 * logits again; with the cache off nothing is written. */
#include <setjmp.h>
#include <stdarg.h>
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

#define VOCAB 304u /* 19 blocks of 16 rows: a grouped head */
#define N_TOK 10

static char dir[1024], model[1024];

/* The logits of a fixed prompt under w4a8 with the rescored 4-bit head, which
 * rounds the Q8_0 token_embd to 4 bits. */
static void run(float *logits)
{
    struct dray_config c;
    struct dray_engine *e = NULL;
    char err[1024];
    dray_config_defaults(&c);
    snprintf(c.backend, sizeof(c.backend), "cpu");
    snprintf(c.model, sizeof(c.model), "%s", model);
    assert_int_equal(dray_config_set(&c, "head_precision", "w4a8", err, sizeof(err)), 0);
    c.prepared_layouts = false; /* the rounding is what is cached, not the packed head */
    c.context = 64;
    c.max_seqs = 1;
    c.threads = 2;
    if (dray_engine_open(&c, &e, err, sizeof(err)))
        fail_msg("engine: %s", err);
    int32_t ids[N_TOK];
    dray_test_tiny_prompt(ids, N_TOK);
    float *l = ref_engine_logits(e, ids, N_TOK, VOCAB);
    memcpy(logits, l, sizeof(float) * N_TOK * VOCAB);
    free(l);
    dray_engine_close(e);
}

/* The one round-*.bin file in dir: its path, and its inode (0: none). */
static ino_t round_file(char *path, size_t n)
{
    uint64_t ino;
    assert_true(dray_test_cache_files(dir, "round-*.bin", path, n, &ino) <= 1);
    return (ino_t)ino;
}

static int setup(void **state)
{
    (void)state;
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    t.n_vocab = VOCAB;
    t.weight_type = DRAY_GGML_Q8_0;
    snprintf(model, sizeof(model), "%s", dray_test_path("tiny_round.gguf"));
    if (tiny_gemma_write(&t, model))
        return -1;
    snprintf(dir, sizeof(dir), "%s", dray_test_path("round_cache"));
    char cmd[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_second_start_reads_the_rounded_rows_with_identical_logits(void **state)
{
    (void)state;
    static float first[N_TOK * VOCAB], again[N_TOK * VOCAB], off[N_TOK * VOCAB];
    char path[1200];
    setenv("DRAY_CACHE_DIR", dir, 1);
    assert_int_equal(round_file(path, sizeof(path)), 0);
    run(first);
    ino_t ino = round_file(path, sizeof(path));
    assert_true(ino != 0);
    assert_non_null(strstr(path, "token_embd.weight-q4gh-v"));
    run(again);
    assert_memory_equal(first, again, sizeof(first));
    assert_true(round_file(path, sizeof(path)) == ino); /* read, not written again */

    /* a flipped byte in the codes: reported, rounded again, replaced */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 100, SEEK_SET), 0);
    int b = fgetc(f);
    assert_int_equal(fseek(f, 100, SEEK_SET), 0);
    fputc(b ^ 0x5a, f);
    fclose(f);
    run(again);
    assert_memory_equal(first, again, sizeof(first));
    assert_true(round_file(path, sizeof(path)) != ino);

    /* a cut file too */
    assert_int_equal(truncate(path, 64), 0);
    run(again);
    assert_memory_equal(first, again, sizeof(first));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 64);

    /* the cache off: the same logits, nothing written */
    char cmd[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    setenv("DRAY_CACHE_DIR", "none", 1);
    run(off);
    assert_memory_equal(first, off, sizeof(first));
    setenv("DRAY_CACHE_DIR", dir, 1);
    assert_int_equal(round_file(path, sizeof(path)), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_start_reads_the_rounded_rows_with_identical_logits),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
