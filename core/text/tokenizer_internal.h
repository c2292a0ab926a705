/* What the tokenizer's files share (tokenizer.c: loading, the text -> id table,
 * accessors; tokenizer_encode.c: the special-token partition and SPM merges;
 * tokenizer_detok.c: the streaming detokenizer): the tokenizer's state and its
 * small hashing helpers. The text room only. */
#ifndef DRAY_CORE_TOKENIZER_INTERNAL_H
#define DRAY_CORE_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer.h"

#define MAX_TEXT_BYTES ((size_t)1 << 29) /* 512 MiB: keeps indices in int32 after "▁" expansion */

/* One prefix of a special token's text: the bytes are tok_text(src)[0..len). */
struct prefix {
    uint32_t len;
    int32_t src;  /* a special token whose text starts with this prefix; -1 = empty slot */
    int32_t full; /* the special token whose text is exactly this prefix, or -1 */
};

struct dray_tokenizer {
    uint32_t n_vocab;
    char *arena;     /* token texts back to back */
    uint32_t *off;   /* [n_vocab + 1]: text of id i is arena[off[i] .. off[i+1]) */
    float *score;    /* [n_vocab] */
    uint8_t *type;   /* [n_vocab] enum dray_token_type */
    uint32_t *slots; /* text -> id table: id + 1, 0 = empty; mask + 1 slots */
    uint32_t mask;
    uint32_t max_len; /* longest token text, bytes */
    int32_t byte_tok[256];
    int32_t bos, eos, eot, eom, unk;
    bool add_bos, add_eos, add_space_prefix;
    /* special-token partition */
    int32_t *spec;     /* candidate ids: CONTROL, UNKNOWN, USER_DEFINED */
    uint32_t *rank;    /* [n_vocab]: priority of a candidate (0 = first), UINT32_MAX otherwise */
    uint32_t n_spec;
    struct prefix *pre; /* open addressing, pre_mask + 1 slots */
    uint32_t pre_mask;
    uint32_t spec_max_len;
    struct dray_bpe *bpe; /* tokenizer.ggml.model "gpt2": byte-level BPE; NULL = SPM */
};

/* FNV-1a, 64-bit: cheap and extends byte by byte, which the prefix walk needs. */
#define FNV_INIT 0xcbf29ce484222325ULL
static inline uint64_t fnv_step(uint64_t h, uint8_t c)
{
    return (h ^ c) * 0x100000001b3ULL;
}

static inline const char *tok_text(const struct dray_tokenizer *t, int32_t id, uint32_t *len)
{
    *len = t->off[id + 1] - t->off[id];
    return t->arena + t->off[id];
}

static inline struct prefix *pre_slot(const struct dray_tokenizer *t, uint64_t h, const char *s, uint32_t n)
{
    for (uint32_t i = (uint32_t)h & t->pre_mask;; i = (i + 1) & t->pre_mask) {
        struct prefix *p = &t->pre[i];
        if (p->src < 0)
            return p;
        if (p->len == n && memcmp(t->arena + t->off[p->src], s, n) == 0)
            return p;
    }
}

#endif
