#include "tiny_gemma.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_write.h"
#include "testutil.h"

void tiny_gemma_defaults(struct tiny_gemma *t)
{
    *t = (struct tiny_gemma){
        .n_layer = 7, .n_embd = 64, .n_ff = 96, .n_head = 4, .n_kv_head = 1, .head_dim = 16,
        .window = 8, .n_ctx = 256, .weight_type = DRAY_GGML_F32, .seed = 42, .arch = "gemma3",
    };
}

/* Vocabulary: 0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4 <start_of_turn>, 5 <end_of_turn>,
 * 6..261 <0x00>..<0xFF>, then words. */
static const char *const words[] = {
    "\n", "▁", "e", "t", "a", "o", "n", "s", "h", "r", "th", "▁t", "▁th", "▁the", "he", "in",
    "er", "an", "▁a", "▁an", "▁and", "user", "model", "▁is", "is", "▁hello", "hello", "o▁",
    "ll", "el", "lo", "▁w", "wo", "or", "rl", "ld", "▁world", "world", ".", ",", "!", "?",
};

static int add_vocab(struct dray_gguf_writer *w, uint32_t n_vocab, int chatml)
{
    static char bytes[256][8];
    const char *toks[TINY_GEMMA_MAX_VOCAB];
    float scores[TINY_GEMMA_MAX_VOCAB];
    int32_t types[TINY_GEMMA_MAX_VOCAB];
    static const char *const special[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"};
    uint32_t n = 0;
    for (; n < 6; n++) {
        toks[n] = special[n];
        scores[n] = -1000.0f;
        types[n] = n == 3 ? 2 : 3; /* unknown, control */
    }
    for (int b = 0; b < 256; b++, n++) {
        snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
        toks[n] = bytes[b];
        scores[n] = 0.0f;
        types[n] = 6; /* byte */
    }
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]) && n < n_vocab; i++, n++) {
        toks[n] = words[i];
        scores[n] = -(float)i; /* earlier words merge first */
        types[n] = 1;
    }
    static char unused[TINY_GEMMA_MAX_VOCAB][24];
    for (; n < n_vocab; n++) {
        snprintf(unused[n], sizeof(unused[n]), "<unused%u>", n);
        toks[n] = unused[n];
        scores[n] = -1000.0f;
        types[n] = 5; /* unused */
    }
    if (chatml) {
        toks[TINY_GEMMA_VOCAB - 2] = "<|im_start|>";
        toks[TINY_GEMMA_VOCAB - 1] = "<|im_end|>";
        types[TINY_GEMMA_VOCAB - 2] = types[TINY_GEMMA_VOCAB - 1] = 3; /* control */
    }
    int rc = dray_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    rc |= dray_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, n_vocab);
    rc |= dray_gguf_add_arr(w, "tokenizer.ggml.scores", DRAY_GGUF_FLOAT32, scores, n_vocab);
    rc |= dray_gguf_add_arr(w, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, types, n_vocab);
    rc |= dray_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 2);
    rc |= dray_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 1);
    rc |= dray_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 3);
    rc |= dray_gguf_add_u32(w, "tokenizer.ggml.padding_token_id", 0);
    rc |= dray_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", true);
    rc |= dray_gguf_add_bool(w, "tokenizer.ggml.add_eos_token", false);
    rc |= dray_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", false);
    return rc;
}

/* Q8_0 blocks of 32: f16 scale + 32 int8. */
static void *to_q8_0(const float *x, uint64_t n)
{
    uint8_t *out = malloc(n / 32 * 34), *p = out;
    for (uint64_t b = 0; b < n / 32; b++, p += 34) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        float d = amax / 127.0f;
        uint16_t h = dray_f32_to_f16(d);
        memcpy(p, &h, 2);
        for (int i = 0; i < 32; i++)
            p[2 + i] = (uint8_t)(int8_t)(d ? lrintf(x[b * 32 + i] / d) : 0);
    }
    return out;
}

/* Q4_1 blocks of 32: half d = (max-min)/15, half m = min, codes 0..15 packed with
 * element i in the low nibble and i+16 in the high nibble of byte i. */
static void *to_q4_1(const float *x, uint64_t n)
{
    uint8_t *out = malloc(n / 32 * 20), *p = out;
    for (uint64_t b = 0; b < n / 32; b++, p += 20) {
        float lo = x[b * 32], hi = x[b * 32];
        for (int i = 1; i < 32; i++) {
            lo = fminf(lo, x[b * 32 + i]);
            hi = fmaxf(hi, x[b * 32 + i]);
        }
        uint16_t hd = dray_f32_to_f16((hi - lo) / 15.0f), hm = dray_f32_to_f16(lo);
        memcpy(p, &hd, 2);
        memcpy(p + 2, &hm, 2);
        float d = dray_f16_to_f32(hd), m = dray_f16_to_f32(hm);
        int q[32];
        for (int i = 0; i < 32; i++) {
            long v = d > 0 ? lrintf((x[b * 32 + i] - m) / d) : 0;
            q[i] = (int)(v < 0 ? 0 : v > 15 ? 15 : v);
        }
        for (int i = 0; i < 16; i++)
            p[4 + i] = (uint8_t)(q[i] | q[i + 16] << 4);
    }
    return out;
}

/* Q5_0 blocks of 32: half d = max|x|/16 (sign kept so the extreme is code 0),
 * codes q = round(x/d) + 16 in 0..31, y = (q - 16) * d; low nibbles packed as
 * Q4_1's, bit 4 of element i at bit i of the little-endian uint32 qh. */
static void *to_q5_0(const float *x, uint64_t n)
{
    uint8_t *out = malloc(n / 32 * 22), *p = out;
    for (uint64_t b = 0; b < n / 32; b++, p += 22) {
        float amax = 0, ext = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[b * 32 + i]) > amax)
                amax = fabsf(x[b * 32 + i]), ext = x[b * 32 + i];
        uint16_t hd = dray_f32_to_f16(ext / -16.0f);
        memcpy(p, &hd, 2);
        float d = dray_f16_to_f32(hd);
        uint32_t qh = 0;
        int q[32];
        for (int i = 0; i < 32; i++) {
            long v = d != 0 ? lrintf(x[b * 32 + i] / d) + 16 : 16;
            q[i] = (int)(v < 0 ? 0 : v > 31 ? 31 : v);
            qh |= (uint32_t)(q[i] >> 4) << i;
        }
        memcpy(p + 2, &qh, 4);
        for (int i = 0; i < 16; i++)
            p[6 + i] = (uint8_t)((q[i] & 15) | (q[i + 16] & 15) << 4);
    }
    return out;
}

static int add_tensor(struct dray_gguf_writer *w, const struct tiny_gemma *t, const char *name,
                      uint64_t ne0, uint64_t ne1, float lo, float hi, float offset)
{
    if (t->omit_tensor && !strcmp(t->omit_tensor, name))
        return 0;
    uint64_t n = ne0 * ne1, ne[2] = {ne0, ne1};
    float *x = malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++)
        x[i] = offset + dray_test_randf(lo, hi);
    if (t->loud > 0 && (strstr(name, ".attn_norm.") || strstr(name, ".ffn_norm.")))
        for (uint64_t c = 3; c < n; c += c == 3 ? 14 : 23) /* 3, 17, 40 */
            x[c] *= t->loud;
    if (t->loud_k > 0 && strstr(name, ".attn_k_norm.")) {
        x[1] *= t->loud_k;
        x[6] *= t->loud_k;
    }
    int rc;
    if (ne1 > 1 && t->weight_type == DRAY_GGML_Q8_0 && ne0 % 32 == 0) {
        void *q = to_q8_0(x, n);
        rc = dray_gguf_add_tensor(w, name, DRAY_GGML_Q8_0, 2, ne, q);
        free(q);
    } else if (ne1 > 1 && t->weight_type == DRAY_GGML_Q5_0 && ne0 % 32 == 0) {
        void *q = to_q5_0(x, n);
        rc = dray_gguf_add_tensor(w, name, DRAY_GGML_Q5_0, 2, ne, q);
        free(q);
    } else if (ne1 > 1 && t->weight_type == DRAY_GGML_Q4_1 && ne0 % 32 == 0) {
        void *q = to_q4_1(x, n);
        rc = dray_gguf_add_tensor(w, name, DRAY_GGML_Q4_1, 2, ne, q);
        free(q);
    } else {
        rc = dray_gguf_add_tensor(w, name, DRAY_GGML_F32, ne1 > 1 ? 2 : 1, ne, x);
    }
    free(x);
    return rc;
}

int tiny_gemma_write(const struct tiny_gemma *t, const char *path)
{
    uint32_t n_vocab = t->n_vocab ? t->n_vocab : TINY_GEMMA_VOCAB;
    if (n_vocab > TINY_GEMMA_MAX_VOCAB || n_vocab < TINY_GEMMA_VOCAB)
        return -1; /* the words and special tokens need 300 */
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    char key[96], name[64];
    const char *a = t->arch;
    uint32_t q = t->n_head * t->head_dim, kv = t->n_kv_head * t->head_dim;
    int rc = 0;
    dray_test_seed(t->seed);
    rc |= dray_gguf_add_str(w, "general.architecture", a);
    rc |= dray_gguf_add_str(w, "general.name", "tiny gemma");
#define KEY(k) (snprintf(key, sizeof(key), "%s." k, a), key)
    rc |= dray_gguf_add_u32(w, KEY("context_length"), t->n_ctx);
    rc |= dray_gguf_add_u32(w, KEY("embedding_length"), t->n_embd);
    rc |= dray_gguf_add_u32(w, KEY("block_count"), t->n_layer);
    rc |= dray_gguf_add_u32(w, KEY("feed_forward_length"), t->n_ff);
    rc |= dray_gguf_add_u32(w, KEY("attention.head_count"), t->n_head);
    rc |= dray_gguf_add_u32(w, KEY("attention.head_count_kv"), t->n_kv_head);
    rc |= dray_gguf_add_u32(w, KEY("attention.key_length"), t->head_dim);
    rc |= dray_gguf_add_u32(w, KEY("attention.value_length"), t->head_dim);
    if (!strcmp(a, "gemma3")) /* llama has no window key */
        rc |= dray_gguf_add_u32(w, KEY("attention.sliding_window"), t->window);
    rc |= dray_gguf_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    rc |= dray_gguf_add_f32(w, KEY("rope.freq_base"), 1000000.0f);
#undef KEY
    rc |= add_vocab(w, n_vocab, t->chatml);
    rc |= add_tensor(w, t, "token_embd.weight", t->n_embd, n_vocab, -0.5f, 0.5f, 0);
    rc |= add_tensor(w, t, "output_norm.weight", t->n_embd, 1, 0.5f, 1.5f, 0);
    if (t->output_head)
        rc |= add_tensor(w, t, "output.weight", t->n_embd, n_vocab, -0.5f, 0.5f, 0);
    for (uint32_t il = 0; il < t->n_layer; il++) {
        struct { const char *what; uint64_t ne0, ne1; float lo, hi; } ts[] = {
            {"attn_norm", t->n_embd, 1, 0.5f, 1.5f}, {"attn_q_norm", t->head_dim, 1, 0.5f, 1.5f},
            {"attn_k_norm", t->head_dim, 1, 0.5f, 1.5f}, {"post_attention_norm", t->n_embd, 1, 0.5f, 1.5f},
            {"ffn_norm", t->n_embd, 1, 0.5f, 1.5f}, {"post_ffw_norm", t->n_embd, 1, 0.5f, 1.5f},
            {"attn_q", t->n_embd, q, -0.3f, 0.3f}, {"attn_k", t->n_embd, kv, -0.3f, 0.3f},
            {"attn_v", t->n_embd, kv, -0.3f, 0.3f}, {"attn_output", q, t->n_embd, -0.3f, 0.3f},
            {"ffn_gate", t->n_embd, t->n_ff, -0.3f, 0.3f}, {"ffn_up", t->n_embd, t->n_ff, -0.3f, 0.3f},
            {"ffn_down", t->n_ff, t->n_embd, -0.3f, 0.3f},
        };
        bool gemma = !strcmp(a, "gemma3"); /* q/k and post norms are Gemma's only */
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
            if (!gemma && (strstr(ts[i].what, "_q_norm") || strstr(ts[i].what, "_k_norm") ||
                           !strncmp(ts[i].what, "post_", 5)))
                continue;
            snprintf(name, sizeof(name), "blk.%u.%s.weight", il, ts[i].what);
            rc |= add_tensor(w, t, name, ts[i].ne0, ts[i].ne1, ts[i].lo, ts[i].hi, 0);
        }
        struct { const char *what; uint64_t n; } bs[] = {
            {"attn_q", q}, {"attn_k", kv}, {"attn_v", kv}, {"attn_output", t->n_embd}};
        for (size_t i = 0; t->biases && i < sizeof(bs) / sizeof(bs[0]); i++) {
            snprintf(name, sizeof(name), "blk.%u.%s.bias", il, bs[i].what);
            rc |= add_tensor(w, t, name, bs[i].n, 1, -0.5f, 0.5f, 0);
        }
    }
    if (!rc)
        rc = dray_gguf_writer_write(w, path, NULL, 0);
    dray_gguf_writer_free(w);
    return rc;
}
