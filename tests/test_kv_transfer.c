/* KV blocks in the host tier's vendor-neutral layout (kv.h): written by one
 * plugin, loaded by another. The CPU plugin computes a prompt's KV; its blocks
 * are downloaded to host memory, uploaded into an OpenCL engine (PoCL here), and
 * the OpenCL engine continues from them with the tokens it computes cold. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "engine_internal.h"
#include "kv.h"
#include "greedy.h"
#include "testutil.h"
#include "tiny_gemma.h"

#define N_PROMPT 30 /* crosses the tiny model's window (8) several times */
#define L_REUSE 28  /* block-aligned prefix moved between plugins (block size 4) */
#define N_GEN 10

static struct dray_engine *open_on(const char *backend, const char *kv_dtype, const char *path,
                                   char *err, size_t errlen)
{
    struct dray_config c;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", path);
    snprintf(c.backend, sizeof(c.backend), "%s", backend);
    assert_int_equal(dray_config_set(&c, "kv_dtype", kv_dtype, err, errlen), 0);
    c.precision = DRAY_PRECISION_INT8; /* the weights both plugins run */
    c.context = 64;
    c.max_seqs = 2;
    c.chunk = 16;
    c.kv_block = 4;
    c.threads = 2;
    struct dray_engine *e = NULL;
    return dray_engine_open(&c, &e, err, errlen) ? NULL : e;
}

static void generate(struct dray_session *s, const int32_t *ids, size_t n, struct dray_test_tokens *out)
{
    char err[512];
    if (dray_test_generate(s, ids, n, N_GEN, out, err, sizeof(err)))
        fail_msg("generate: %s", err);
}

/* Host copies of every live block of the first L_REUSE tokens of seq, per group. */
struct host_copy {
    struct dray_kv_layout layout;
    uint32_t n_group;
    unsigned char *data[DRAY_KV_MAX_GROUPS][L_REUSE / 4];
};

static void download(struct dray_kv *kv, uint32_t seq, struct host_copy *h)
{
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    dray_kv_get_layout(kv, &h->layout);
    h->n_group = p->n_group;
    for (uint32_t g = 0; g < p->n_group; g++)
        for (uint32_t k = dray_kv_live_from(kv, g, L_REUSE); k < L_REUSE / 4; k++) {
            int32_t b = dray_kv_seq_block(kv, seq, g, k);
            assert_true(b >= 0);
            h->data[g][k] = malloc(dray_kv_block_host_bytes(kv, g));
            assert_int_equal(dray_kv_block_download(kv, g, (uint32_t)b, h->data[g][k]), 0);
        }
}

static void upload_and_attach(struct dray_kv *kv, uint32_t seq, const struct host_copy *h)
{
    struct dray_kv_layout l;
    dray_kv_get_layout(kv, &l);
    assert_memory_equal(&l, &h->layout, sizeof(l)); /* same model, same KV dtype */
    int32_t rows[DRAY_KV_MAX_GROUPS][L_REUSE / 4];
    const int32_t *rp[DRAY_KV_MAX_GROUPS];
    for (uint32_t g = 0; g < h->n_group; g++) {
        rp[g] = rows[g];
        for (uint32_t k = dray_kv_live_from(kv, g, L_REUSE); k < L_REUSE / 4; k++) {
            uint32_t b;
            assert_int_equal(dray_kv_block_alloc(kv, g, &b), 0);
            assert_int_equal(dray_kv_block_upload(kv, g, b, h->data[g][k]), 0);
            rows[g][k] = (int32_t)b;
        }
    }
    assert_int_equal(dray_kv_seq_attach(kv, seq, L_REUSE, rp), 0);
    /* the sequence now holds the blocks: drop the allocation's own reference */
    for (uint32_t g = 0; g < h->n_group; g++)
        for (uint32_t k = dray_kv_live_from(kv, g, L_REUSE); k < L_REUSE / 4; k++)
            dray_kv_block_unref(kv, g, (uint32_t)rows[g][k]);
}

static void cpu_state_continues_on(const char *backend, const char *kv_dtype)
{
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    const char *path = dray_test_path("tiny_transfer.gguf");
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    char err[1024];
    int32_t ids[N_PROMPT];
    dray_test_tiny_prompt(ids, N_PROMPT);

    struct dray_engine *cpu = open_on("cpu", kv_dtype, path, err, sizeof(err));
    if (!cpu)
        fail_msg("cpu: %s", err);
    struct dray_engine *other = open_on(backend, kv_dtype, path, err, sizeof(err));
    if (!other) {
        dray_engine_close(cpu);
        printf("# %s: not run here: %s\n", backend, err);
        skip();
    }
    struct dray_session *s;
    struct host_copy h = {0};
    assert_int_equal(dray_session_new(cpu, &s, err, sizeof(err)), 0);
    assert_int_equal(dray_session_prefill(s, ids, L_REUSE, err, sizeof(err)), 0);
    download(cpu->kv, s->seq, &h);
    dray_session_free(s);
    dray_engine_close(cpu);

    struct dray_test_tokens cold, warm;
    assert_int_equal(dray_session_new(other, &s, err, sizeof(err)), 0);
    generate(s, ids, N_PROMPT, &cold);
    dray_session_free(s);
    assert_int_equal(dray_session_new(other, &s, err, sizeof(err)), 0);
    upload_and_attach(other->kv, s->seq, &h);
    assert_int_equal(dray_session_adopt(s, ids, L_REUSE), 0);
    generate(s, ids + L_REUSE, N_PROMPT - L_REUSE, &warm);
    dray_session_free(s);
    assert_int_equal(warm.n, cold.n);
    assert_memory_equal(warm.ids, cold.ids, cold.n * sizeof(int32_t));
    printf("# %s (%s KV): %zu tokens continued from CPU-written blocks\n", backend, kv_dtype, warm.n);
    for (uint32_t g = 0; g < DRAY_KV_MAX_GROUPS; g++)
        for (uint32_t k = 0; k < L_REUSE / 4; k++)
            free(h.data[g][k]);
    dray_engine_close(other);
}

static void test_cpu_kv_continues_on_opencl_int8(void **state)
{
    (void)state;
    cpu_state_continues_on("opencl", "int8");
}

static void test_cpu_kv_continues_on_opencl_f16(void **state)
{
    (void)state;
    cpu_state_continues_on("opencl", "f16");
}

static void test_cpu_kv_continues_on_cpu(void **state)
{
    (void)state;
    cpu_state_continues_on("cpu", "int8");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_kv_continues_on_cpu),
        cmocka_unit_test(test_cpu_kv_continues_on_opencl_int8),
        cmocka_unit_test(test_cpu_kv_continues_on_opencl_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
