/* Tiny random-weight Gemma 3 (or, with arch "llama", Llama-family) GGUFs for fast tests of the graph, the KV manager and
 * the engine, written with dray's own GGUF writer. The vocabulary is a real SPM
 * vocabulary in miniature: control tokens, 256 byte-fallback tokens, a few words. */
#ifndef DRAY_TINY_GEMMA_H
#define DRAY_TINY_GEMMA_H

#include <stdint.h>

struct tiny_gemma {
    uint32_t n_layer, n_embd, n_ff, n_head, n_kv_head, head_dim, window, n_ctx;
    uint32_t weight_type;      /* DRAY_GGML_F32, DRAY_GGML_Q8_0, DRAY_GGML_Q4_1 or DRAY_GGML_Q5_0 for the
                                * 2-D weights (those with rows of whole blocks) */
    uint64_t seed;
    const char *arch;          /* "gemma3" unless a test wants another */
    const char *omit_tensor;   /* leave this tensor out (error-path tests) */
    int biases;                /* also write attn_{q,k,v,output}.bias (Llama-family tests) */
    int output_head;           /* also write a separate output.weight */
    float loud_k;              /* > 0: the k norm scales head channels 1 and 6 by this
                                * (keys with always-loud channels, as Gemma's) */
    float loud;                /* > 0: the attention and FFN input norms scale channels
                                * 3, 17 and 40 by this, making them activation outliers */
    int chatml;                /* ids 298 and 299 of the vocabulary are ChatML's control tokens
                                * <|im_start|> (298) and <|im_end|> (299), for tests that
                                * render with chat_template "chatml" */
    uint32_t n_vocab;          /* 0 = TINY_GEMMA_VOCAB; up to TINY_GEMMA_MAX_VOCAB (more
                                * unused tokens: e.g. whole 16-row blocks for grouped heads) */
};

/* Sensible small defaults: 7 layers (so both a global layer and a local one after it
 * exist), n_embd 64, 4 heads of 16, 1 kv head, window 8, n_ff 96, ctx 256. */
void tiny_gemma_defaults(struct tiny_gemma *t);
/* Writes the file; returns 0 on success. */
int tiny_gemma_write(const struct tiny_gemma *t, const char *path);
#define TINY_GEMMA_VOCAB 300
#define TINY_GEMMA_MAX_VOCAB 512

#endif
