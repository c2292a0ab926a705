/* SentencePiece-vocabulary tokenizer as llama.cpp runs it (see tokenizer.h and
 * docs/reference/gemma3-gguf.md §6.3). Layout: all token texts live in one
 * arena; a power-of-two open-addressing table maps text -> id; a second table of
 * all prefixes of special-token texts lets the special-token partition walk each
 * text position like a trie. */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "tokenizer_bpe.h"

/* ---------------------------------------------------------------- hashing */

/* FNV-1a, 64-bit: cheap and extends byte by byte, which the prefix walk needs. */
static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = FNV_INIT;
    for (size_t i = 0; i < n; i++)
        h = fnv_step(h, (uint8_t)s[i]);
    return h;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int32_t dray_tokenizer_find(const struct dray_tokenizer *t, const char *s, size_t n)
{
    if (n > t->max_len)
        return -1;
    for (uint32_t i = (uint32_t)fnv(s, n) & t->mask;; i = (i + 1) & t->mask) {
        uint32_t v = t->slots[i];
        if (v == 0)
            return -1;
        uint32_t len;
        const char *txt = tok_text(t, (int32_t)(v - 1), &len);
        if (len == n && memcmp(txt, s, n) == 0)
            return (int32_t)(v - 1);
    }
}

/* Insert id; an earlier id with the same text is replaced (llama.cpp keeps the
 * last one too). Table is at most half full, so the probe ends. */
static void map_insert(struct dray_tokenizer *t, int32_t id)
{
    uint32_t n;
    const char *s = tok_text(t, id, &n);
    for (uint32_t i = (uint32_t)fnv(s, n) & t->mask;; i = (i + 1) & t->mask) {
        uint32_t v = t->slots[i], len = 0;
        const char *other = v ? tok_text(t, (int32_t)(v - 1), &len) : NULL;
        if (v == 0 || (len == n && memcmp(other, s, n) == 0)) {
            t->slots[i] = (uint32_t)id + 1;
            return;
        }
    }
}

/* ---------------------------------------------------------------- loading */

static int32_t opt_id(const struct dray_gguf *g, const char *key, int32_t dflt, uint32_t n_vocab,
                      int *rc, char *err, size_t errlen)
{
    uint32_t v;
    int r = dray_gguf_get_u32(g, key, &v, err, errlen);
    if (r == DRAY_ENOTFOUND)
        return dflt >= 0 && (uint32_t)dflt < n_vocab ? dflt : -1;
    if (r == 0 && v >= n_vocab)
        r = dray_fail(err, errlen, DRAY_EFORMAT, "%s: %s = %u is not below the vocabulary size %u",
                      dray_gguf_name(g), key, v, n_vocab);
    if (r)
        *rc = r;
    return r ? -1 : (int32_t)v;
}

static bool opt_bool(const struct dray_gguf *g, const char *key, bool dflt, int *rc, char *err,
                     size_t errlen)
{
    bool v;
    int r = dray_gguf_get_bool(g, key, &v, err, errlen);
    if (r == DRAY_ENOTFOUND)
        return dflt;
    if (r)
        *rc = r;
    return r ? dflt : v;
}

static int load_texts(struct dray_tokenizer *t, const struct dray_gguf *g, char *err, size_t errlen)
{
    const char *key = "tokenizer.ggml.tokens";
    const struct dray_gguf_kv *kv = dray_gguf_find(g, key);
    if (!kv)
        return dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: no key %s", dray_gguf_name(g), key);
    if (kv->type != DRAY_GGUF_ARRAY || kv->arr_type != DRAY_GGUF_STRING || !kv->strs)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: %s must be an array of strings",
                         dray_gguf_name(g), key);
    if (kv->arr_n == 0 || kv->arr_n > (uint64_t)INT32_MAX - 1)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: %s has %llu entries (expected 1..2^31-2)",
                         dray_gguf_name(g), key, (unsigned long long)kv->arr_n);
    t->n_vocab = (uint32_t)kv->arr_n;
    uint64_t total = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        total += kv->strs[i].len;
    if (total >= UINT32_MAX)
        return dray_fail(err, errlen, DRAY_ERANGE, "%s: %s holds %llu bytes of text (max 4 GiB)",
                         dray_gguf_name(g), key, (unsigned long long)total);
    t->arena = malloc(total + 1);
    t->off = malloc(((size_t)t->n_vocab + 1) * sizeof(*t->off));
    if (!t->arena || !t->off)
        return DRAY_ENOMEM;
    uint32_t pos = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        t->off[i] = pos;
        memcpy(t->arena + pos, kv->strs[i].ptr, kv->strs[i].len);
        pos += (uint32_t)kv->strs[i].len;
        if (kv->strs[i].len > t->max_len)
            t->max_len = (uint32_t)kv->strs[i].len;
    }
    t->off[t->n_vocab] = pos;
    return 0;
}

/* scores (f32, default 0) and token_type (i32, default NORMAL), both optional as
 * in llama.cpp, but when present they must have one entry per token. */
static int load_scores_types(struct dray_tokenizer *t, const struct dray_gguf *g, char *err,
                             size_t errlen)
{
    const void *data;
    uint64_t n;
    t->score = calloc(t->n_vocab, sizeof(*t->score));
    t->type = malloc(t->n_vocab);
    if (!t->score || !t->type)
        return DRAY_ENOMEM;
    memset(t->type, DRAY_TOKEN_NORMAL, t->n_vocab);
    int rc = dray_gguf_get_arr(g, "tokenizer.ggml.scores", DRAY_GGUF_FLOAT32, &data, &n, err, errlen);
    if (rc == 0 && n != t->n_vocab)
        rc = dray_fail(err, errlen, DRAY_EFORMAT, "%s: tokenizer.ggml.scores has %llu entries, tokens %u",
                       dray_gguf_name(g), (unsigned long long)n, t->n_vocab);
    if (rc == 0)
        memcpy(t->score, data, (size_t)n * sizeof(float)); /* may be unaligned in the file */
    else if (rc != DRAY_ENOTFOUND)
        return rc;
    rc = dray_gguf_get_arr(g, "tokenizer.ggml.token_type", DRAY_GGUF_INT32, &data, &n, err, errlen);
    if (rc == DRAY_ENOTFOUND)
        return 0;
    if (rc == 0 && n != t->n_vocab)
        rc = dray_fail(err, errlen, DRAY_EFORMAT, "%s: tokenizer.ggml.token_type has %llu entries, tokens %u",
                       dray_gguf_name(g), (unsigned long long)n, t->n_vocab);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        int32_t v;
        memcpy(&v, (const char *)data + (size_t)i * 4, 4);
        if (v < DRAY_TOKEN_NORMAL || v > DRAY_TOKEN_BYTE)
            return dray_fail(err, errlen, DRAY_EFORMAT,
                             "%s: tokenizer.ggml.token_type[%u] = %d (expected 1..6)",
                             dray_gguf_name(g), i, v);
        t->type[i] = (uint8_t)v;
    }
    return 0;
}

static int build_map(struct dray_tokenizer *t)
{
    t->mask = pow2_at_least((uint64_t)t->n_vocab * 2) - 1;
    t->slots = calloc((size_t)t->mask + 1, sizeof(*t->slots));
    if (!t->slots)
        return DRAY_ENOMEM;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        map_insert(t, (int32_t)i);
    return 0;
}

/* Byte fallback: "<0xXX>" (uppercase hex), else the 1-byte token, else unk. */
static void build_byte_tokens(struct dray_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        char one = (char)b;
        int32_t id = dray_tokenizer_find(t, name, 6);
        if (id < 0)
            id = dray_tokenizer_find(t, &one, 1);
        t->byte_tok[b] = id >= 0 ? id : t->unk;
    }
}

static bool is_spec_type(uint8_t ty)
{
    return ty == DRAY_TOKEN_CONTROL || ty == DRAY_TOKEN_UNKNOWN || ty == DRAY_TOKEN_USER_DEFINED;
}

static const struct dray_tokenizer *sort_ctx; /* qsort has no context argument in C11 */
static int cmp_spec(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_ctx->off[x + 1] - sort_ctx->off[x], ly = sort_ctx->off[y + 1] - sort_ctx->off[y];
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Candidates sorted longest first, and every prefix of their texts in a table. */
static int build_specials(struct dray_tokenizer *t)
{
    uint64_t n_bytes = 0;
    t->spec = malloc(sizeof(*t->spec) * t->n_vocab);
    t->rank = malloc(sizeof(*t->rank) * t->n_vocab);
    if (!t->spec || !t->rank)
        return DRAY_ENOMEM;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        t->rank[i] = UINT32_MAX;
        if (is_spec_type(t->type[i]) && t->off[i + 1] > t->off[i]) {
            t->spec[t->n_spec++] = (int32_t)i;
            n_bytes += t->off[i + 1] - t->off[i];
        }
    }
    sort_ctx = t;
    qsort(t->spec, t->n_spec, sizeof(*t->spec), cmp_spec);
    t->pre_mask = pow2_at_least(n_bytes * 2) - 1;
    t->pre = malloc(sizeof(*t->pre) * ((size_t)t->pre_mask + 1));
    if (!t->pre)
        return DRAY_ENOMEM;
    for (uint32_t i = 0; i <= t->pre_mask; i++)
        t->pre[i] = (struct prefix){0, -1, -1};
    for (uint32_t k = 0; k < t->n_spec; k++) {
        int32_t id = t->spec[k];
        uint32_t n;
        const char *s = tok_text(t, id, &n);
        uint64_t h = FNV_INIT;
        t->rank[id] = k;
        if (n > t->spec_max_len)
            t->spec_max_len = n;
        for (uint32_t l = 1; l <= n; l++) {
            h = fnv_step(h, (uint8_t)s[l - 1]);
            struct prefix *p = pre_slot(t, h, s, l);
            if (p->src < 0)
                *p = (struct prefix){l, id, -1};
            if (l == n)
                p->full = id;
        }
    }
    return 0;
}

static int load_ids(struct dray_tokenizer *t, const struct dray_gguf *g, bool spm, char *err,
                    size_t errlen)
{
    int rc = 0;
    /* SentencePiece defaults when a key is absent, as llama.cpp assumes for "llama".
     * Each getter runs only while no error is recorded, so err keeps the first one. */
    t->bos = opt_id(g, "tokenizer.ggml.bos_token_id", 1, t->n_vocab, &rc, err, errlen);
    if (!rc)
        t->eos = opt_id(g, "tokenizer.ggml.eos_token_id", 2, t->n_vocab, &rc, err, errlen);
    if (!rc)
        t->unk = opt_id(g, "tokenizer.ggml.unknown_token_id", 0, t->n_vocab, &rc, err, errlen);
    if (!rc)
        t->eot = opt_id(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab, &rc, err, errlen);
    if (!rc)
        t->eom = opt_id(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab, &rc, err, errlen);
    if (!rc)
        t->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", spm, &rc, err, errlen);
    if (!rc)
        t->add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token", false, &rc, err, errlen);
    if (!rc)
        t->add_space_prefix = opt_bool(g, "tokenizer.ggml.add_space_prefix", spm, &rc, err, errlen);
    if (!rc && t->eot < 0)
        t->eot = dray_tokenizer_find(t, "<end_of_turn>", 13);
    return rc;
}

/* *spm: "llama" (SentencePiece) rather than "gpt2" (byte-level BPE). */
static int check_model(const struct dray_gguf *g, bool *spm, char *err, size_t errlen)
{
    struct dray_str model;
    int rc = dray_gguf_get_str(g, "tokenizer.ggml.model", &model, err, errlen);
    if (rc == DRAY_ENOTFOUND)
        return dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: no key tokenizer.ggml.model",
                         dray_gguf_name(g));
    if (rc)
        return rc;
    *spm = dray_str_eq(model, "llama");
    if (!*spm && !dray_str_eq(model, "gpt2"))
        return dray_fail(err, errlen, DRAY_ENOTSUP,
                         "%s: tokenizer.ggml.model = \"%.*s\" is not supported (supported: \"llama\", "
                         "SentencePiece; \"gpt2\", byte-level BPE)", dray_gguf_name(g),
                         (int)(model.len > 64 ? 64 : model.len), model.ptr);
    return 0;
}

int dray_tokenizer_load(const struct dray_gguf *g, struct dray_tokenizer **out, char *err,
                        size_t errlen)
{
    if (!out)
        return DRAY_EINVAL;
    *out = NULL;
    if (!g)
        return dray_fail(err, errlen, DRAY_EINVAL, "tokenizer: no GGUF given");
    bool spm;
    int rc = check_model(g, &spm, err, errlen);
    if (rc)
        return rc;
    struct dray_tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        return dray_fail(err, errlen, DRAY_ENOMEM, "tokenizer: out of memory");
    rc = load_texts(t, g, err, errlen);
    if (!rc)
        rc = load_scores_types(t, g, err, errlen);
    if (!rc)
        rc = build_map(t);
    if (!rc)
        rc = load_ids(t, g, spm, err, errlen);
    if (!rc) {
        build_byte_tokens(t);
        rc = build_specials(t);
    }
    if (!rc && !spm)
        rc = dray_bpe_load(g, t, &t->bpe, err, errlen);
    if (rc) {
        if (rc == DRAY_ENOMEM)
            dray_fail(err, errlen, rc, "%s: out of memory loading the tokenizer", dray_gguf_name(g));
        dray_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void dray_tokenizer_free(struct dray_tokenizer *t)
{
    if (!t)
        return;
    free(t->arena);
    free(t->off);
    free(t->score);
    free(t->type);
    free(t->slots);
    free(t->spec);
    free(t->rank);
    free(t->pre);
    dray_bpe_free(t->bpe);
    free(t);
}

/* ---------------------------------------------------------------- accessors */

uint32_t dray_tokenizer_n_vocab(const struct dray_tokenizer *t) { return t->n_vocab; }
int32_t dray_tokenizer_bos(const struct dray_tokenizer *t) { return t->bos; }
int32_t dray_tokenizer_eos(const struct dray_tokenizer *t) { return t->eos; }
int32_t dray_tokenizer_eot(const struct dray_tokenizer *t) { return t->eot; }

bool dray_tokenizer_is_eog(const struct dray_tokenizer *t, int32_t id)
{
    return id >= 0 && (id == t->eos || id == t->eot || id == t->eom);
}

size_t dray_tokenizer_eog_ids(const struct dray_tokenizer *t, int32_t out[3])
{
    const int32_t ids[3] = {t->eos, t->eot, t->eom};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        bool seen = ids[i] < 0;
        for (size_t j = 0; j < n && !seen; j++)
            seen = out[j] == ids[i];
        if (!seen)
            out[n++] = ids[i];
    }
    return n;
}

const char *dray_tokenizer_text(const struct dray_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab) {
        if (len)
            *len = 0;
        return NULL;
    }
    uint32_t n;
    const char *s = tok_text(t, id, &n);
    if (len)
        *len = n;
    return s;
}

int dray_tokenizer_type(const struct dray_tokenizer *t, int32_t id)
{
    return id >= 0 && (uint32_t)id < t->n_vocab ? t->type[id] : 0;
}

uint32_t dray_tokenizer_max_token_bytes(const struct dray_tokenizer *t)
{
    /* a token covers at most its text's bytes ("▁" stands for one space, "<0x0A>"
     * for one byte); an unknown character is emitted for at most 4 bytes */
    return t->max_len > 4 ? t->max_len : 4;
}

size_t dray_tokenizer_max_piece(const struct dray_tokenizer *t)
{
    /* held-back bytes + the piece, every byte possibly becoming a 3-byte U+FFFD */
    return 3 * (sizeof(((struct dray_detok *)0)->pend) + (size_t)t->max_len);
}
