/* The Llama graph (models/llama.c over the shared decoder) end to end through
 * the engine and the CPU plugin, on tiny random-weight GGUFs: checked against a
 * naive double-precision forward pass written here from the architecture as
 * llama.cpp stores it, i.e. with RoPE rotating ADJACENT pairs of the stored Q/K
 * rows, so it also checks the row reordering at load (llama.c). GQA 4:2, biases
 * and a separate output head are exercised; bad files get clear errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "gguf.h"
#include "ref_naive.h"
#include "testutil.h"
#include "tiny_gemma.h"

#define V TINY_GEMMA_VOCAB

/* llama.cpp's "normal" RoPE: adjacent pairs (v[2i], v[2i+1]) turned by p base^(-2i/d) */
static void rope_adjacent(double *v, uint32_t d, uint32_t p, double base)
{
    for (uint32_t i = 0; i < d / 2; i++) {
        double th = p * pow(base, -2.0 * i / d), c = cos(th), s = sin(th);
        double a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
    }
}

/* softmax(q K^T / sqrt(D)) V for query head hd at position p (causal, GQA). */
static void attend(const struct tiny_gemma *t, const double *q, const double *K, const double *Vv,
                   uint32_t p, uint32_t hd, double *out, double *sc)
{
    uint32_t D = t->head_dim, KV = t->n_kv_head * D, kh = hd / (t->n_head / t->n_kv_head);
    double mx = -INFINITY, sum = 0;
    for (uint32_t j = 0; j <= p; j++) {
        double s = 0;
        for (uint32_t i = 0; i < D; i++)
            s += q[i] * K[(size_t)j * KV + kh * D + i];
        sc[j] = s / sqrt((double)D);
        mx = fmax(mx, sc[j]);
    }
    for (uint32_t j = 0; j <= p; j++)
        sum += exp(sc[j] - mx);
    for (uint32_t i = 0; i < D; i++) {
        double acc = 0;
        for (uint32_t j = 0; j <= p; j++)
            acc += exp(sc[j] - mx) / sum * Vv[(size_t)j * KV + kh * D + i];
        out[i] = acc;
    }
}

/* Weights the file must have; biases it may have (NULL when not). */
static double *w(struct dray_gguf *g, int il, const char *what)
{
    return ref_tensor(g, il, what, "weight", true);
}

static double *bias(struct dray_gguf *g, int il, const char *what)
{
    return ref_tensor(g, il, what, "bias", false);
}

static void layer(struct dray_gguf *g, const struct tiny_gemma *t, uint32_t il, double *x, uint32_t n)
{
    uint32_t E = t->n_embd, D = t->head_dim, Q = t->n_head * D, KV = t->n_kv_head * D, F = t->n_ff;
    double *an = w(g, il, "attn_norm"), *fn = w(g, il, "ffn_norm");
    double *wq = w(g, il, "attn_q"), *wk = w(g, il, "attn_k"), *wv = w(g, il, "attn_v");
    double *wo = w(g, il, "attn_output"), *wg = w(g, il, "ffn_gate"), *wu = w(g, il, "ffn_up");
    double *wd = w(g, il, "ffn_down");
    double *bq = bias(g, il, "attn_q"), *bk = bias(g, il, "attn_k"), *bv = bias(g, il, "attn_v");
    double *bo = bias(g, il, "attn_output");
    double *q = malloc((size_t)n * Q * sizeof(double)), *K = malloc((size_t)n * KV * sizeof(double));
    double *Vv = malloc((size_t)n * KV * sizeof(double)), *h = malloc(E * sizeof(double));
    double *att = malloc(Q * sizeof(double)), *o = malloc(E * sizeof(double)), *sc = malloc(n * sizeof(double));
    double *gt = malloc(F * sizeof(double)), *up = malloc(F * sizeof(double));
    for (uint32_t p = 0; p < n; p++) {
        memcpy(h, x + (size_t)p * E, E * sizeof(double));
        ref_rmsnorm(h, an, E);
        ref_linear(wq, bq, h, q + (size_t)p * Q, E, Q);
        ref_linear(wk, bk, h, K + (size_t)p * KV, E, KV);
        ref_linear(wv, bv, h, Vv + (size_t)p * KV, E, KV);
        for (uint32_t hd = 0; hd < t->n_head; hd++)
            rope_adjacent(q + (size_t)p * Q + hd * D, D, p, 1000000.0);
        for (uint32_t hd = 0; hd < t->n_kv_head; hd++)
            rope_adjacent(K + (size_t)p * KV + hd * D, D, p, 1000000.0);
    }
    for (uint32_t p = 0; p < n; p++) {
        for (uint32_t hd = 0; hd < t->n_head; hd++)
            attend(t, q + (size_t)p * Q + hd * D, K, Vv, p, hd, att + hd * D, sc);
        ref_linear(wo, bo, att, o, Q, E);
        for (uint32_t i = 0; i < E; i++)
            x[(size_t)p * E + i] += o[i];
        memcpy(h, x + (size_t)p * E, E * sizeof(double));
        ref_rmsnorm(h, fn, E);
        ref_linear(wg, NULL, h, gt, E, F);
        ref_linear(wu, NULL, h, up, E, F);
        for (uint32_t i = 0; i < F; i++)
            gt[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
        ref_linear(wd, NULL, gt, o, F, E);
        for (uint32_t i = 0; i < E; i++)
            x[(size_t)p * E + i] += o[i];
    }
    double *all[] = {an, fn, wq, wk, wv, wo, bq, bk, bv, bo, wg, wu, wd, q, K, Vv, h, att, o, sc, gt, up};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        free(all[i]);
}

/* Logits [n][V] for ids[0..n), every position. */
static double *ref_forward(const char *path, const struct tiny_gemma *t, const int32_t *ids, uint32_t n)
{
    struct dray_gguf *g = NULL;
    char err[256];
    assert_int_equal(dray_gguf_open(path, &g, err, sizeof(err)), 0);
    uint32_t E = t->n_embd;
    double *emb = w(g, -1, "token_embd"), *x = malloc((size_t)n * E * sizeof(double));
    for (uint32_t p = 0; p < n; p++)
        memcpy(x + (size_t)p * E, emb + (size_t)ids[p] * E, E * sizeof(double)); /* no scale */
    for (uint32_t il = 0; il < t->n_layer; il++)
        layer(g, t, il, x, n);
    double *on = w(g, -1, "output_norm"), *head = ref_tensor(g, -1, "output", "weight", false);
    double *logits = malloc((size_t)n * V * sizeof(double));
    for (uint32_t p = 0; p < n; p++) {
        ref_rmsnorm(x + (size_t)p * E, on, E);
        ref_linear(head ? head : emb, NULL, x + (size_t)p * E, logits + (size_t)p * V, E, V);
    }
    free(on);
    free(head);
    free(emb);
    free(x);
    dray_gguf_close(g);
    return logits;
}

static struct tiny_gemma llama_defaults(void)
{
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    t.arch = "llama";
    t.n_layer = 3;
    t.n_head = 4;
    t.n_kv_head = 2; /* GQA: two query heads per kv head */
    return t;
}

static struct dray_engine *open_engine(const char *path, const char *precision, int *rc, char *err,
                                       size_t errlen)
{
    struct dray_config c;
    struct dray_engine *e = NULL;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", path);
    assert_int_equal(dray_config_set(&c, "precision", precision, err, errlen), 0);
    assert_int_equal(dray_config_set(&c, "kv_dtype", "f16", err, errlen), 0);
    c.context = 64;
    c.max_seqs = 2;
    c.chunk = 16; /* several prefill steps per prompt */
    c.kv_block = 4;
    c.threads = 2;
    *rc = dray_engine_open(&c, &e, err, errlen);
    return e;
}

static void check_against_reference(struct tiny_gemma t, const char *name)
{
    const char *path = dray_test_path(name);
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    char err[1024];
    int rc;
    struct dray_engine *e = open_engine(path, "f32", &rc, err, sizeof(err));
    if (rc)
        fail_msg("engine: %s", err);
    assert_string_equal(dray_engine_get_info(e)->arch, "llama");
    const uint32_t n = 40;
    int32_t ids[40];
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)(6 + (i * 37) % (V - 6));
    float *got = ref_engine_logits(e, ids, n, V);
    double *want = ref_forward(path, &t, ids, n), d = 0;
    for (size_t i = 0; i < (size_t)n * V; i++)
        d = fmax(d, fabs(got[i] - want[i]));
    if (d >= 2e-2) /* f16 KV rounds k and v (rel 2^-11); everything else is f32 */
        fail_msg("%s: max |logit - reference| = %g", name, d);
    for (uint32_t p = 0; p < n; p++)
        assert_int_equal(ref_argmax_f(got + (size_t)p * V, V), ref_argmax_d(want + (size_t)p * V, V));
    free(got);
    free(want);
    dray_engine_close(e);
}

static void test_llama_f32_matches_naive_reference(void **state)
{
    (void)state;
    check_against_reference(llama_defaults(), "llama_plain.gguf");
}

static void test_llama_biases_and_separate_head(void **state)
{
    (void)state;
    struct tiny_gemma t = llama_defaults();
    t.biases = 1;
    t.output_head = 1;
    t.n_kv_head = 1; /* MQA too */
    check_against_reference(t, "llama_bias.gguf");
}

/* int8 weights (and calibrated outliers) load and stay close to the f32 logits */
static void test_llama_int8_tracks_f32(void **state)
{
    (void)state;
    struct tiny_gemma t = llama_defaults();
    t.weight_type = DRAY_GGML_Q8_0;
    t.n_embd = 64;
    const char *path = dray_test_path("llama_q8.gguf");
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    char err[1024];
    int rc;
    int32_t ids[24];
    for (uint32_t i = 0; i < 24; i++)
        ids[i] = (int32_t)(6 + (i * 53) % (V - 6));
    struct dray_engine *ef = open_engine(path, "f32", &rc, err, sizeof(err));
    if (rc)
        fail_msg("f32: %s", err);
    struct dray_engine *ei = open_engine(path, "int8", &rc, err, sizeof(err));
    if (rc)
        fail_msg("int8: %s", err);
    float *f = ref_engine_logits(ef, ids, 24, V), *q = ref_engine_logits(ei, ids, 24, V);
    uint32_t same = 0;
    for (uint32_t p = 0; p < 24; p++)
        same += ref_argmax_f(f + (size_t)p * V, V) == ref_argmax_f(q + (size_t)p * V, V);
    assert_true(same >= 20);
    free(f);
    free(q);
    dray_engine_close(ef);
    dray_engine_close(ei);
}

/* activations: auto (the default) is the family's choice, as run (engine info):
 * two passes for llama, one for gemma3; a setting in the config wins. */
static const char *activations_of(struct tiny_gemma t, const char *name, const char *setting)
{
    static char got[16];
    const char *path = dray_test_path(name);
    t.weight_type = DRAY_GGML_Q8_0;
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    struct dray_config c;
    char err[1024];
    struct dray_engine *e = NULL;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", path);
    snprintf(c.backend, sizeof(c.backend), "cpu");
    assert_int_equal(dray_config_set(&c, "precision", "w4a8", err, sizeof(err)), 0);
    if (setting)
        assert_int_equal(dray_config_set(&c, "activations", setting, err, sizeof(err)), 0);
    c.context = 64;
    c.max_seqs = 1;
    if (dray_engine_open(&c, &e, err, sizeof(err)))
        fail_msg("%s: %s", name, err);
    snprintf(got, sizeof(got), "%s", dray_engine_get_info(e)->activations);
    dray_engine_close(e);
    return got;
}

static void test_activations_auto_is_the_family_choice(void **state)
{
    (void)state;
    struct tiny_gemma gemma;
    tiny_gemma_defaults(&gemma);
    assert_string_equal(activations_of(llama_defaults(), "act_llama.gguf", NULL), "int8x2");
    assert_string_equal(activations_of(gemma, "act_gemma.gguf", NULL), "int8");
    assert_string_equal(activations_of(llama_defaults(), "act_llama1.gguf", "int8"), "int8");
    assert_string_equal(activations_of(gemma, "act_gemma2.gguf", "int8x2"), "int8x2");
}

static void expect_open_error(struct tiny_gemma t, const char *name, int want_rc, const char *want1,
                              const char *want2)
{
    const char *path = dray_test_path(name);
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    char err[1024] = "";
    int rc;
    struct dray_engine *e = open_engine(path, "f32", &rc, err, sizeof(err));
    assert_null(e);
    assert_int_equal(rc, want_rc);
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", err, want1, want2 ? want2 : "");
}

static void test_llama_bad_files_get_clear_errors(void **state)
{
    (void)state;
    struct tiny_gemma t = llama_defaults();
    t.omit_tensor = "blk.1.ffn_up.weight";
    expect_open_error(t, "llama_missing.gguf", DRAY_ENOTFOUND, "blk.1.ffn_up.weight", NULL);
    t = llama_defaults();
    t.n_kv_head = 3; /* 4 query heads cannot share 3 kv heads */
    expect_open_error(t, "llama_heads.gguf", DRAY_EFORMAT, "llama.attention.head_count_kv = 3 does not divide", "4");
    t = llama_defaults();
    t.arch = "mamba";
    expect_open_error(t, "mamba.gguf", DRAY_ENOTSUP, "architecture \"mamba\" is not supported",
                      "dray runs: gemma2, gemma3, granite, llama, olmo2, phi3, qwen2, qwen3, smollm3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f32_matches_naive_reference),
        cmocka_unit_test(test_llama_biases_and_separate_head),
        cmocka_unit_test(test_llama_int8_tracks_f32),
        cmocka_unit_test(test_activations_auto_is_the_family_choice),
        cmocka_unit_test(test_llama_bad_files_get_clear_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
