/* One model over several devices (core/split.h): where the layers and the head
 * go, and that a split gives exactly the tokens of one device, a step cut into
 * micro-batches too, on a tiny random Gemma. OpenCL (PoCL) and Vulkan
 * (lavapipe) are the second device where they have one, else those cases skip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "error.h"
#include "greedy.h"
#include "split.h"
#include "testutil.h"
#include "tiny_gemma.h"

/* ---------------------------------------------------------------- placement */

static uint64_t layers18[18];

static struct dray_split_need need18(uint64_t each, uint64_t head)
{
    for (int i = 0; i < 18; i++)
        layers18[i] = each;
    return (struct dray_split_need){.n_layer = 18, .layer_bytes = layers18, .head_bytes = head};
}

static void layer_split_gives_rounded_shares_and_the_head_follows_the_last_layers(void **state)
{
    (void)state;
    struct dray_split_need n = need18(10, 100);
    struct dray_split_place p;
    char err[256];
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .ratio = (double[]){1, 1}}, &p,
                                      err, sizeof(err)), 0);
    assert_int_equal(p.layer_end[0], 9);
    assert_int_equal(p.layer_end[1], 18);
    assert_int_equal(p.head, 1);
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 3, .ratio = (double[]){3, 1, 0}},
                                      &p, err, sizeof(err)), 0);
    assert_int_equal(p.layer_end[0], 14); /* 13.5 rounds up */
    assert_int_equal(p.layer_end[1], 18);
    assert_int_equal(p.layer_end[2], 18); /* a share of 0: no layers */
    assert_int_equal(p.head, 1);
}

static void head_device_places_the_head_and_bad_entries_are_refused(void **state)
{
    (void)state;
    struct dray_split_need n = need18(10, 100);
    struct dray_split_place p;
    char err[256];
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .ratio = (double[]){1, 1},
                                                                   .head_dev = 1}, &p, err, sizeof(err)), 0);
    assert_int_equal(p.head, 0);
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .head_dev = 3}, &p, err,
                                      sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "head_device 3"));
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .ratio = (double[]){0, 0}}, &p,
                                      err, sizeof(err)), DRAY_EINVAL);
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .ratio = (double[]){1, -1}}, &p,
                                      err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "entry 2"));
}

/* "CPU helps": the accelerator's budget holds the head and what layers fit;
 * the uncapped CPU takes the rest. */
static void a_budget_keeps_the_head_on_the_accelerator_and_the_cpu_takes_the_rest(void **state)
{
    (void)state;
    struct dray_split_need n = need18(10, 100);
    struct dray_split_place p;
    char err[256];
    uint64_t budget[2] = {145, 0}; /* head 100 + 4 layers of 10 */
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .budget = budget}, &p, err,
                                      sizeof(err)), 0);
    assert_int_equal(p.head, 0);
    assert_int_equal(p.layer_end[0], 4);
    assert_int_equal(p.layer_end[1], 18);
    budget[0] = 50; /* the head does not fit: it goes to the CPU, 5 layers stay */
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .budget = budget}, &p, err,
                                      sizeof(err)), 0);
    assert_int_equal(p.head, 1);
    assert_int_equal(p.layer_end[0], 5);
    uint64_t tight[2] = {150, 60}; /* every device capped, 9 + 6 of 18 layers fit */
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .budget = tight}, &p, err,
                                      sizeof(err)), DRAY_ERANGE);
    assert_non_null(strstr(err, "7 of 18 layers"));
}

static void without_settings_layers_follow_the_devices_memory(void **state)
{
    (void)state;
    struct dray_split_need n = need18(10, 100);
    struct dray_split_place p;
    char err[256];
    uint64_t mem[2] = {3000, 1000};
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .mem = mem}, &p, err,
                                      sizeof(err)), 0);
    assert_int_equal(p.layer_end[0], 14);
    mem[1] = 0; /* unknown: equal shares */
    assert_int_equal(dray_split_place(&n, &(struct dray_split_ask){.n_dev = 2, .mem = mem}, &p, err,
                                      sizeof(err)), 0);
    assert_int_equal(p.layer_end[0], 9);
}

/* ------------------------------------------------------------ engine runs */

#define N_PROMPT 20
#define N_GEN 12
#define N_SEQ 4

static const char *model_path(void)
{
    static const char *path;
    if (!path) {
        struct tiny_gemma t;
        tiny_gemma_defaults(&t);
        path = dray_test_path("tiny_split.gguf");
        assert_int_equal(tiny_gemma_write(&t, path), 0);
    }
    return path;
}

/* An engine at f32 weights and an f16 KV (the exact path), or as `sets` say. */
static struct dray_engine *open_with(const char *backend, const char *const *sets, char *err, size_t errlen)
{
    struct dray_config c;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", model_path());
    snprintf(c.backend, sizeof(c.backend), "%s", backend);
    c.fallback[0] = '\0';
    c.context = 64;
    c.max_seqs = N_SEQ;
    c.chunk = 32;
    c.threads = 1;
    if (dray_config_set(&c, "precision", "f32", err, errlen) || dray_config_set(&c, "kv_dtype", "f16", err, errlen))
        fail_msg("config: %s", err);
    for (; sets && *sets; sets += 2)
        if (dray_config_set(&c, sets[0], sets[1], err, errlen))
            fail_msg("config %s: %s", sets[0], err);
    struct dray_engine *e = NULL;
    return dray_engine_open(&c, &e, err, errlen) ? NULL : e;
}

static void one_sequence(struct dray_engine *e, struct dray_test_tokens *out)
{
    int32_t ids[N_PROMPT];
    char err[512];
    dray_test_tiny_prompt(ids, N_PROMPT);
    if (dray_test_generate_fresh(e, ids, N_PROMPT, N_GEN, out, err, sizeof(err)))
        fail_msg("generate: %s", err);
}

/* N_SEQ sequences of different prompts decoded together, greedily: the
 * scheduler's batched step, which a split cuts into micro-batches. */
static void batched(struct dray_engine *e, int32_t out[N_SEQ][N_GEN])
{
    struct dray_session *ss[N_SEQ];
    uint32_t n_vocab = dray_engine_get_info(e)->n_vocab;
    float *logits = malloc((size_t)N_SEQ * n_vocab * sizeof(float));
    int32_t next[N_SEQ];
    char err[512];
    assert_non_null(logits);
    for (int i = 0; i < N_SEQ; i++) {
        int32_t ids[N_PROMPT];
        dray_test_tiny_prompt(ids, N_PROMPT);
        ids[1 + i] = 7 + 11 * i; /* a different prompt each */
        if (dray_session_new(e, &ss[i], err, sizeof(err)) ||
            dray_session_prefill(ss[i], ids, N_PROMPT - 1 - i, err, sizeof(err)))
            fail_msg("session %d: %s", i, err);
        next[i] = ids[N_PROMPT - 1 - i];
    }
    for (int t = 0; t < N_GEN; t++) {
        if (dray_sessions_decode(ss, N_SEQ, next, logits, err, sizeof(err)))
            fail_msg("decode step %d: %s", t, err);
        for (int i = 0; i < N_SEQ; i++) {
            const float *row = logits + (size_t)i * n_vocab;
            int32_t best = 0;
            for (uint32_t v = 1; v < n_vocab; v++)
                best = row[v] > row[best] ? (int32_t)v : best;
            out[i][t] = next[i] = best;
        }
    }
    for (int i = 0; i < N_SEQ; i++)
        dray_session_free(ss[i]);
    free(logits);
}

/* A plugin usable here, else the reason it is skipped. */
static bool have(const char *backend)
{
    char err[512];
    struct dray_engine *e = open_with(backend, NULL, err, sizeof(err));
    if (!e) {
        print_message("skip %s: %s\n", backend, err);
        return false;
    }
    dray_engine_close(e);
    return true;
}

/* The split (backend, sets) against one CPU (one_sets): placement listed, the
 * same greedy tokens for one sequence and for N_SEQ batched. */
static void compare(const char *const *one_sets, const char *backend, const char *const *sets, bool calibrated)
{
    char err[512];
    struct dray_engine *one = open_with("cpu", one_sets, err, sizeof(err));
    if (!one)
        fail_msg("cpu: %s", err);
    struct dray_engine *two = open_with(backend, sets, err, sizeof(err));
    if (!two)
        fail_msg("%s: %s", backend, err);
    const struct dray_engine_info *in = dray_engine_get_info(two);
    assert_non_null(strstr(in->placement, "device 2"));
    assert_non_null(strstr(in->placement, "embedding and head"));
    if (calibrated)
        assert_string_not_equal(in->calibration, "none");
    struct dray_test_tokens a, b;
    one_sequence(one, &a);
    one_sequence(two, &b);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, a.n * sizeof(a.ids[0]));
    int32_t x[N_SEQ][N_GEN], y[N_SEQ][N_GEN];
    batched(one, x);
    batched(two, y);
    assert_memory_equal(x, y, sizeof(x));
    dray_engine_close(two);
    dray_engine_close(one);
}

static void expect_same_tokens(const char *backend, const char *const *sets)
{
    compare(NULL, backend, sets, false);
}

static void cpu_cpu_split_gives_the_tokens_of_one_cpu(void **state)
{
    (void)state;
    expect_same_tokens("cpu,cpu", (const char *const[]){"layer_split", "3,4", NULL});
    /* the head on the device of the first layers: embed and head there, two hops */
    expect_same_tokens("cpu,cpu", (const char *const[]){"layer_split", "3,4", "head_device", "1", NULL});
}

static void micro_batches_give_the_tokens_of_the_whole_step(void **state)
{
    (void)state;
    expect_same_tokens("cpu,cpu", (const char *const[]){"layer_split", "1,1", "micro_batches", "2", NULL});
    expect_same_tokens("cpu,cpu,cpu",
                       (const char *const[]){"layer_split", "2,3,2", "micro_batches", "4", NULL});
}

static void cpu_opencl_split_gives_the_tokens_of_one_cpu(void **state)
{
    (void)state;
    if (!have("opencl"))
        skip();
    expect_same_tokens("cpu,opencl", (const char *const[]){"layer_split", "1,1", NULL});
}

static void cpu_vulkan_split_gives_the_tokens_of_one_cpu(void **state)
{
    (void)state;
    if (!have("vulkan"))
        skip();
    expect_same_tokens("cpu,vulkan", (const char *const[]){"layer_split", "1,1", "micro_batches", "2", NULL});
}

/* The default precision calibrates (int8 KV: K smoothing; int8 weights:
 * outlier channels) across the stages: the same scores as one device. */
static void a_split_calibrates_like_one_device(void **state)
{
    (void)state;
    const char *const q[] = {"precision", "int8", "kv_dtype", "int8", "outlier_channels", "8", NULL};
    const char *const qs[] = {"precision", "int8", "kv_dtype", "int8", "outlier_channels", "8",
                              "layer_split", "4,3", "micro_batches", "2", NULL};
    setenv("DRAY_CACHE_DIR", dray_test_path("split_cache_none"), 1); /* both calibrate */
    compare(q, "cpu,cpu", qs, true);
}

static void bad_split_settings_are_refused_with_the_reason(void **state)
{
    (void)state;
    char err[512];
    assert_null(open_with("cpu,cpu", (const char *const[]){"layer_split", "1,1,1", NULL}, err, sizeof(err)));
    assert_non_null(strstr(err, "layer_split"));
    assert_null(open_with("cpu,nosuchplugin", NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "device 2"));
    assert_null(open_with("cpu,cpu", (const char *const[]){"device", "0,0,0", NULL}, err, sizeof(err)));
    assert_non_null(strstr(err, "one per plugin"));
}

/* ------------------------------------------------------- tensor parallel */

static struct dray_model_info heads(uint32_t n_head, uint32_t n_kv, uint32_t n_ff)
{
    struct dray_model_info mi = {0};
    mi.n_head = n_head;
    mi.n_kv_head = n_kv;
    mi.n_ff = n_ff;
    return mi;
}

static void tensor_parallel_slices_heads_by_kv_groups_and_the_ffn_by_blocks(void **state)
{
    (void)state;
    char err[512];
    struct dray_tp_slice s;
    struct dray_model_info gemma = heads(4, 1, 2048), smol = heads(9, 3, 1536);
    /* Gemma 3 270M over 3: heads 2/1/1 all reading KV head 0, ff 3/3/2 blocks of 256 */
    uint32_t want[3][6] = {{0, 2, 0, 1, 0, 768}, {2, 1, 0, 1, 768, 768}, {3, 1, 0, 1, 1536, 512}};
    for (uint32_t r = 0; r < 3; r++) {
        assert_int_equal(dray_tp_slice(&gemma, 256, NULL, r, 3, &s, err, sizeof(err)), 0);
        uint32_t got[6] = {s.head0, s.n_head, s.kv0, s.n_kv, s.ff0, s.n_ff};
        assert_memory_equal(got, want[r], sizeof(got));
        assert_true(dray_tp_slice_ok(&gemma, &s));
    }
    /* SmolLM2 over 3: one KV group each; with shares 1,3 over 2 the FFN goes a quarter, three quarters */
    assert_int_equal(dray_tp_slice(&smol, 32, NULL, 2, 3, &s, err, sizeof(err)), 0);
    assert_int_equal(s.head0, 6);
    assert_int_equal(s.kv0, 2);
    assert_int_equal(s.n_ff, 512);
    assert_int_equal(dray_tp_slice(&gemma, 256, (double[]){1, 3}, 0, 2, &s, err, sizeof(err)), 0);
    assert_int_equal(s.n_ff, 512);
    assert_int_equal(dray_tp_slice(&gemma, 256, (double[]){1, 3}, 1, 2, &s, err, sizeof(err)), 0);
    assert_int_equal(s.ff0, 512);
    assert_int_equal(s.n_ff, 1536);
    /* refused with the reason: 3 KV heads over 2, more ranks than heads, an FFN not in blocks */
    assert_int_equal(dray_tp_slice(&smol, 32, NULL, 0, 2, &s, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "9 attention heads over 3 KV heads"));
    assert_int_equal(dray_tp_slice(&gemma, 256, NULL, 0, 5, &s, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "more ranks than the model's 4 attention heads"));
    struct dray_model_info odd = heads(4, 1, 300);
    assert_int_equal(dray_tp_slice(&odd, 256, NULL, 0, 2, &s, err, sizeof(err)), DRAY_EINVAL);
    assert_false(dray_tp_slice_ok(&smol, &(struct dray_tp_slice){0, 4, 0, 2, 0, 32})); /* 4 heads, 2 KV: GQA off */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layer_split_gives_rounded_shares_and_the_head_follows_the_last_layers),
        cmocka_unit_test(head_device_places_the_head_and_bad_entries_are_refused),
        cmocka_unit_test(a_budget_keeps_the_head_on_the_accelerator_and_the_cpu_takes_the_rest),
        cmocka_unit_test(without_settings_layers_follow_the_devices_memory),
        cmocka_unit_test(cpu_cpu_split_gives_the_tokens_of_one_cpu),
        cmocka_unit_test(micro_batches_give_the_tokens_of_the_whole_step),
        cmocka_unit_test(cpu_opencl_split_gives_the_tokens_of_one_cpu),
        cmocka_unit_test(cpu_vulkan_split_gives_the_tokens_of_one_cpu),
        cmocka_unit_test(a_split_calibrates_like_one_device),
        cmocka_unit_test(bad_split_settings_are_refused_with_the_reason),
        cmocka_unit_test(tensor_parallel_slices_heads_by_kv_groups_and_the_ffn_by_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
