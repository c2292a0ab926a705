/* SentencePiece-vocabulary tokenizer as llama.cpp runs it (see tokenizer.h and
 * docs/reference/gemma3-gguf.md §6.3). Layout: all token texts live in one
 * arena; a power-of-two open-addressing table maps text -> id; a second table of
 * all prefixes of special-token texts lets the special-token partition walk each
 * text position like a trie. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "tokenizer_bpe.h"
#include "utf8.h"

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

/* ---------------------------------------------------------------- hashing */

/* FNV-1a, 64-bit: cheap and extends byte by byte, which the prefix walk needs. */
#define FNV_INIT 0xcbf29ce484222325ULL
static inline uint64_t fnv_step(uint64_t h, uint8_t c)
{
    return (h ^ c) * 0x100000001b3ULL;
}
static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = FNV_INIT;
    for (size_t i = 0; i < n; i++)
        h = fnv_step(h, (uint8_t)s[i]);
    return h;
}

static inline const char *tok_text(const struct dray_tokenizer *t, int32_t id, uint32_t *len)
{
    *len = t->off[id + 1] - t->off[id];
    return t->arena + t->off[id];
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

static struct prefix *pre_slot(const struct dray_tokenizer *t, uint64_t h, const char *s, uint32_t n)
{
    for (uint32_t i = (uint32_t)h & t->pre_mask;; i = (i + 1) & t->pre_mask) {
        struct prefix *p = &t->pre[i];
        if (p->src < 0)
            return p;
        if (p->len == n && memcmp(t->arena + t->off[p->src], s, n) == 0)
            return p;
    }
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

/* ---------------------------------------------------------------- output vector */

struct ids {
    int32_t *v;
    size_t n, cap;
};

static int ids_push(struct ids *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc(o->v, cap * sizeof(*v));
        if (!v)
            return DRAY_ENOMEM;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

static int push_id(void *o, int32_t id)
{
    return ids_push(o, id);
}

/* ---------------------------------------------------------------- special partition */

/* llama.cpp's order: candidates by rank (longest text first, ties lower id), each
 * candidate's occurrences left to right; an occurrence is taken when its whole span
 * is still raw text.
 *
 * Done without a list of all occurrences, which cost ~500 bytes per input byte on
 * runs of "\n" (Gemma has tokens for 1..31 of them; issue 18). Each raw position
 * waits in the bucket of its longest remaining match, buckets are visited in rank
 * order and positions in a bucket in ascending order, which is exactly the (rank,
 * position) order. A match blocked by a span taken to its right sends the position
 * on to its next shorter match: a later bucket, since shorter means a larger rank.
 * Memory: a 4-byte link and a 1-byte state per input byte, 2 words per candidate. */

#define NO_POS UINT32_MAX

enum { SP_RAW = 0, SP_START, SP_INSIDE };

struct part {
    uint8_t *state;  /* [n]: SP_RAW, SP_START (a taken token starts here), SP_INSIDE */
    uint32_t *link;  /* [n]: next position in the same bucket while waiting; at an
                      * SP_START position, once partitioned, the token id */
    uint32_t *head, *tail; /* [n_spec]: first and last waiting position, NO_POS if none */
    uint8_t *unsorted;     /* [n_spec]: a position joined behind a larger one */
};

static bool spec_allowed(const struct dray_tokenizer *t, int32_t id, bool parse_special)
{
    return parse_special || t->type[id] == DRAY_TOKEN_USER_DEFINED;
}

/* Longest allowed candidate matching s[p..] that is shorter than below bytes; -1 if none. */
static int32_t longest_match(const struct dray_tokenizer *t, const char *s, uint32_t n,
                             uint32_t p, uint32_t below, bool parse_special)
{
    uint64_t h = FNV_INIT;
    int32_t best = -1;
    for (uint32_t l = 1; l < below && l <= t->spec_max_len && p + l <= n; l++) {
        h = fnv_step(h, (uint8_t)s[p + l - 1]);
        const struct prefix *e = pre_slot(t, h, s + p, l);
        if (e->src < 0)
            break;
        if (e->full >= 0 && spec_allowed(t, e->full, parse_special))
            best = e->full;
    }
    return best;
}

static void bucket_add(struct part *pt, uint32_t r, uint32_t p)
{
    pt->link[p] = NO_POS;
    if (pt->tail[r] == NO_POS)
        pt->head[r] = p;
    else
        pt->link[pt->tail[r]] = p;
    if (pt->tail[r] != NO_POS && pt->tail[r] > p)
        pt->unsorted[r] = 1;
    pt->tail[r] = p;
}

/* Merge sort of a bucket's list by position (links in pt->link); returns the new head. */
static uint32_t sort_list(uint32_t *link, uint32_t h, uint32_t len)
{
    if (len < 2)
        return h;
    uint32_t mid = h, a, b, out = NO_POS, *at = &out;
    for (uint32_t i = 1; i < len / 2; i++)
        mid = link[mid];
    b = link[mid];
    link[mid] = NO_POS;
    a = sort_list(link, h, len / 2);
    b = sort_list(link, b, len - len / 2);
    while (a != NO_POS && b != NO_POS) {
        uint32_t *from = a < b ? &a : &b;
        *at = *from;
        at = &link[*from];
        *from = link[*from];
    }
    *at = a != NO_POS ? a : b;
    return out;
}

static void sort_bucket(struct part *pt, uint32_t r)
{
    uint32_t len = 0, p;
    for (p = pt->head[r]; p != NO_POS; p = pt->link[p])
        len++;
    pt->head[r] = sort_list(pt->link, pt->head[r], len);
    for (p = pt->head[r]; pt->link[p] != NO_POS; p = pt->link[p])
        ;
    pt->tail[r] = p;
    pt->unsorted[r] = 0;
}

/* Candidate id at position p: take its span if still raw, else wait for a shorter one. */
static void try_take(const struct dray_tokenizer *t, const char *s, uint32_t n, bool parse_special,
                     struct part *pt, uint32_t p, int32_t id)
{
    uint32_t len = t->off[id + 1] - t->off[id], i;
    for (i = 0; i < len && pt->state[p + i] == SP_RAW; i++)
        ;
    if (i == len) {
        pt->state[p] = SP_START;
        pt->link[p] = (uint32_t)id; /* p has left its bucket */
        memset(pt->state + p + 1, SP_INSIDE, len - 1);
        return;
    }
    int32_t next = longest_match(t, s, n, p, len, parse_special);
    if (next >= 0)
        bucket_add(pt, t->rank[next], p);
}

/* Fills pt->state and, at SP_START positions, pt->link with the token id. */
static int partition(const struct dray_tokenizer *t, const char *s, uint32_t n, bool parse_special,
                     struct part *pt)
{
    size_t nb = t->n_spec ? t->n_spec : 1;
    pt->head = malloc(nb * sizeof(*pt->head));
    pt->tail = malloc(nb * sizeof(*pt->tail));
    pt->unsorted = calloc(nb, 1);
    if (!pt->head || !pt->tail || !pt->unsorted)
        return DRAY_ENOMEM;
    memset(pt->head, 0xff, nb * sizeof(*pt->head)); /* NO_POS */
    memset(pt->tail, 0xff, nb * sizeof(*pt->tail));
    for (uint32_t p = 0; p < n && t->n_spec; p++) {
        int32_t id = longest_match(t, s, n, p, UINT32_MAX, parse_special);
        if (id >= 0)
            bucket_add(pt, t->rank[id], p);
    }
    for (uint32_t r = 0; r < t->n_spec; r++) {
        if (pt->unsorted[r])
            sort_bucket(pt, r);
        /* try_take may append to later buckets only, never to this one */
        for (uint32_t p = pt->head[r], nx; p != NO_POS; p = nx) {
            nx = pt->link[p];
            if (pt->state[p] == SP_RAW)
                try_take(t, s, n, parse_special, pt, p, t->spec[r]);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- SPM merge */

struct sym {
    int32_t prev, next;
    uint32_t start, len; /* bytes in the escaped buffer */
};

struct bigram {
    float score;
    int32_t left, right;
    uint32_t size;
};

struct spm {
    const struct dray_tokenizer *t;
    const char *buf; /* escaped fragment */
    struct sym *sym;
    struct bigram *heap;
    size_t n_heap, cap_heap;
};

/* Max-heap order: higher score first, then smaller left index. */
static bool bg_before(const struct bigram *a, const struct bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct spm *m, struct bigram b)
{
    size_t i = m->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bg_before(&b, &m->heap[parent]))
            break;
        m->heap[i] = m->heap[parent];
        i = parent;
    }
    m->heap[i] = b;
}

static struct bigram heap_pop(struct spm *m)
{
    struct bigram top = m->heap[0], last = m->heap[--m->n_heap];
    size_t i = 0, n = m->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bg_before(&m->heap[c + 1], &m->heap[c]))
            c++;
        if (!bg_before(&m->heap[c], &last))
            break;
        m->heap[i] = m->heap[c];
        i = c;
    }
    if (n)
        m->heap[i] = last;
    return top;
}

static void try_bigram(struct spm *m, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return;
    uint32_t size = m->sym[left].len + m->sym[right].len;
    int32_t id = dray_tokenizer_find(m->t, m->buf + m->sym[left].start, size);
    if (id < 0)
        return;
    /* capacity: n-1 initial + 2 per merge (< n merges) never exceeds 3n */
    heap_push(m, (struct bigram){m->t->score[id], left, right, size});
}

static int emit_symbol(const struct spm *m, const struct sym *s, struct ids *o)
{
    int32_t id = dray_tokenizer_find(m->t, m->buf + s->start, s->len);
    if (id >= 0)
        return ids_push(o, id);
    /* Only unmerged characters get here (every merge is a vocabulary token). */
    for (uint32_t i = 0; i < s->len; i++) {
        int32_t b = m->t->byte_tok[(uint8_t)m->buf[s->start + i]];
        if (b < 0)
            return DRAY_ENOTFOUND;
        int rc = ids_push(o, b);
        if (rc)
            return rc;
    }
    return 0;
}

/* Tokenize one escaped fragment buf[0..n). */
static int spm_fragment(const struct dray_tokenizer *t, const char *buf, uint32_t n, struct ids *o)
{
    struct spm m = {.t = t, .buf = buf};
    int rc = 0;
    if (n == 0)
        return 0;
    m.sym = malloc(sizeof(*m.sym) * n);
    m.heap = malloc(sizeof(*m.heap) * 3 * (size_t)n);
    if (!m.sym || !m.heap) {
        rc = DRAY_ENOMEM;
        goto out;
    }
    int32_t ns = 0;
    for (uint32_t p = 0; p < n; ns++) {
        uint32_t len = (uint32_t)dray_utf8_lead_len((uint8_t)buf[p]);
        if (len > n - p)
            len = n - p;
        m.sym[ns] = (struct sym){ns - 1, -1, p, len};
        if (ns > 0)
            m.sym[ns - 1].next = ns;
        p += len;
    }
    for (int32_t i = 1; i < ns; i++)
        try_bigram(&m, i - 1, i);
    while (m.n_heap) {
        struct bigram b = heap_pop(&m);
        struct sym *l = &m.sym[b.left], *r = &m.sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size)
            continue; /* stale: one side was merged elsewhere meanwhile */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            m.sym[r->next].prev = b.left;
        try_bigram(&m, l->prev, b.left);
        try_bigram(&m, b.left, l->next);
    }
    for (int32_t i = 0; i >= 0 && !rc; i = m.sym[i].next)
        rc = emit_symbol(&m, &m.sym[i], o);
out:
    free(m.sym);
    free(m.heap);
    return rc;
}

/* Escape raw text: optional leading space, then ' ' -> "▁" (E2 96 81). */
static uint32_t escape(const char *s, uint32_t n, bool space_prefix, char *buf)
{
    uint32_t k = 0;
    if (space_prefix) {
        memcpy(buf, "\xE2\x96\x81", 3);
        k = 3;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf + k, "\xE2\x96\x81", 3);
            k += 3;
        } else {
            buf[k++] = s[i];
        }
    }
    return k;
}

/* Bytes in the longest run of raw (unpartitioned) text. */
static uint32_t longest_raw(const struct part *pt, uint32_t n)
{
    uint32_t best = 0, run = 0;
    for (uint32_t p = 0; p < n; p++) {
        run = pt->state[p] == SP_RAW ? run + 1 : 0;
        best = run > best ? run : best;
    }
    return best;
}

static int tokenize_marked(const struct dray_tokenizer *t, const char *s, uint32_t n,
                           const struct part *pt, char *buf, struct ids *o)
{
    bool prev_special = true; /* the text start counts as "after a special token" */
    uint32_t p = 0;
    while (p < n) {
        if (pt->state[p] == SP_START) {
            int32_t id = (int32_t)pt->link[p];
            int rc = ids_push(o, id);
            if (rc)
                return rc;
            p += t->off[id + 1] - t->off[id];
            prev_special = true;
            continue;
        }
        uint32_t e = p;
        while (e < n && pt->state[e] == SP_RAW)
            e++;
        if (t->bpe) {
            int rc = dray_bpe_encode(t->bpe, s + p, e - p, push_id, o);
            if (rc)
                return rc;
            p = e;
            continue;
        }
        uint32_t k = escape(s + p, e - p, t->add_space_prefix && prev_special, buf);
        int rc = spm_fragment(t, buf, k, o);
        if (rc)
            return rc;
        prev_special = false;
        p = e;
    }
    return 0;
}

int dray_tokenize(const struct dray_tokenizer *t, const char *text, size_t len, bool add_bos,
                  bool parse_special, int32_t **ids, size_t *n_ids)
{
    struct ids o = {0};
    struct part pt = {0};
    char *buf = NULL;
    int rc = 0;
    if (!t || !ids || !n_ids || (!text && len))
        return DRAY_EINVAL;
    *ids = NULL;
    *n_ids = 0;
    if (len > MAX_TEXT_BYTES)
        return DRAY_ERANGE;
    uint32_t n = (uint32_t)len;
    /* 5 bytes per input byte: the partition's state and links */
    pt.state = calloc((size_t)n + 1, 1);
    pt.link = malloc(((size_t)n + 1) * sizeof(*pt.link));
    if (!pt.state || !pt.link) {
        rc = DRAY_ENOMEM;
        goto out;
    }
    if (add_bos && t->add_bos && t->bos >= 0)
        rc = ids_push(&o, t->bos);
    if (!rc)
        rc = partition(t, text, n, parse_special, &pt);
    /* the escape buffer holds the longest raw fragment ("▁" is 3 bytes, plus a prefix) */
    if (!rc && !(buf = malloc((size_t)longest_raw(&pt, n) * 3 + 4)))
        rc = DRAY_ENOMEM;
    if (!rc)
        rc = tokenize_marked(t, text, n, &pt, buf, &o);
    if (!rc && add_bos && t->add_eos && t->eos >= 0)
        rc = ids_push(&o, t->eos);
    if (!rc && !o.v) { /* a non-NULL result even when empty */
        rc = ids_push(&o, 0);
        o.n = 0;
    }
out:
    free(pt.state);
    free(pt.link);
    free(pt.head);
    free(pt.tail);
    free(pt.unsorted);
    free(buf);
    if (rc) {
        free(o.v);
        return rc;
    }
    *ids = o.v;
    *n_ids = o.n;
    return 0;
}

/* ---------------------------------------------------------------- detokenizer */

void dray_detok_init(struct dray_detok *d)
{
    memset(d, 0, sizeof(*d));
}

struct sink {
    char *out; /* NULL: only count */
    size_t n;
    bool raw;  /* the bytes as they are, past the UTF-8 gate (dray_tokenizer_token_bytes) */
};

static void put(struct sink *k, const void *s, size_t n)
{
    if (k->out)
        memcpy(k->out + k->n, s, n);
    k->n += n;
}

/* Pass s[0..n) through the UTF-8 gate with held-back state d. */
static void gate(struct dray_detok *d, const uint8_t *s, size_t n, struct sink *k)
{
    size_t i = 0;
    if (k->raw) {
        put(k, s, n);
        return;
    }
    if (d->n > 0) {
        uint8_t tmp[8];
        size_t np = d->n, take = n < 4 - np ? n : 4 - np;
        memcpy(tmp, d->pend, np);
        memcpy(tmp + np, s, take);
        int r = dray_utf8_next(tmp, np + take, NULL);
        if (r == 0) { /* still incomplete: s was fully absorbed */
            memcpy(d->pend, tmp, np + take);
            d->n = (uint8_t)(np + take);
            return;
        }
        d->n = 0;
        if (r > 0) {
            put(k, tmp, (size_t)r);
            i = (size_t)r - np;
        } else {
            /* pend is a valid prefix, so the bad byte lies in s: the maximal
             * subpart is pend plus s[0 .. -r - np) */
            put(k, DRAY_UTF8_REPLACEMENT, 3);
            i = (size_t)-r - np;
        }
    }
    while (i < n) {
        int r = dray_utf8_next(s + i, n - i, NULL);
        if (r > 0) {
            put(k, s + i, (size_t)r);
            i += (size_t)r;
        } else if (r < 0) {
            put(k, DRAY_UTF8_REPLACEMENT, 3);
            i += (size_t)-r;
        } else {
            memcpy(d->pend, s + i, n - i);
            d->n = (uint8_t)(n - i);
            return;
        }
    }
}

static void piece(struct dray_detok *d, const struct dray_tokenizer *t, int32_t id, struct sink *k)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab) {
        const uint8_t bad = 0xFF; /* ill-formed on purpose: one U+FFFD */
        gate(d, &bad, 1, k);
        return;
    }
    uint32_t n;
    const uint8_t *s = (const uint8_t *)tok_text(t, id, &n);
    if (t->bpe && t->type[id] == DRAY_TOKEN_NORMAL) {
        uint8_t buf[256];
        /* byte-level BPE: the text is in GPT-2's byte alphabet; pieces are short,
         * a longer one is decoded in slices that end on character boundaries */
        for (uint32_t a = 0; a < n;) {
            uint32_t e = n - a > 128 ? a + 128 : n;
            while (e < n && (s[e] & 0xC0) == 0x80)
                e++;
            gate(d, buf, dray_bpe_decode((const char *)s + a, e - a, buf), k);
            a = e;
        }
        return;
    }
    switch (t->type[id]) {
    case DRAY_TOKEN_NORMAL: {
        uint32_t a = 0;
        for (uint32_t i = 0; i + 3 <= n; i++) {
            if (memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                gate(d, s + a, i - a, k);
                gate(d, (const uint8_t *)" ", 1, k);
                a = i + 3;
                i += 2;
            }
        }
        gate(d, s + a, n - a, k);
        break;
    }
    case DRAY_TOKEN_BYTE: {
        unsigned v;
        char hex[8] = {0};
        memcpy(hex, s, n < 7 ? n : 7);
        if (n == 6 && sscanf(hex, "<0x%2x>", &v) == 1) {
            uint8_t b = (uint8_t)v;
            gate(d, &b, 1, k);
        } else {
            gate(d, s, n, k); /* not "<0xXX>": treat as text */
        }
        break;
    }
    case DRAY_TOKEN_USER_DEFINED:
        gate(d, s, n, k);
        break;
    default: /* CONTROL, UNKNOWN, UNUSED render as nothing */
        break;
    }
}

size_t dray_detok_push(struct dray_detok *d, const struct dray_tokenizer *t, int32_t id, char *out,
                       size_t cap)
{
    struct dray_detok dry = *d;
    struct sink count = {NULL, 0, false};
    piece(&dry, t, id, &count);
    if (count.n > cap || !out)
        return count.n;
    struct sink k = {out, 0, false};
    piece(d, t, id, &k);
    return k.n;
}

size_t dray_tokenizer_token_bytes(const struct dray_tokenizer *t, int32_t id, char *out, size_t cap)
{
    struct dray_detok d = {0};
    struct sink count = {NULL, 0, true};
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return 0;
    piece(&d, t, id, &count);
    if (count.n > cap || !out)
        return count.n;
    struct sink k = {out, 0, true};
    piece(&d, t, id, &k);
    return k.n;
}

size_t dray_detok_flush(struct dray_detok *d, char *out, size_t cap)
{
    if (d->n == 0)
        return 0;
    if (cap < 3 || !out)
        return 3;
    memcpy(out, DRAY_UTF8_REPLACEMENT, 3);
    d->n = 0;
    return 3;
}

int dray_detokenize(const struct dray_tokenizer *t, const int32_t *ids, size_t n, char **text,
                    size_t *len)
{
    struct dray_detok d;
    size_t cap = 256, used = 0, step = dray_tokenizer_max_piece(t);
    char *s = malloc(cap);
    if (!s)
        return DRAY_ENOMEM;
    dray_detok_init(&d);
    for (size_t i = 0; i <= n; i++) {
        if (cap - used < step + 1) {
            cap = (cap + step + 1) * 2;
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return DRAY_ENOMEM;
            }
            s = ns;
        }
        used += i < n ? dray_detok_push(&d, t, ids[i], s + used, cap - used)
                      : dray_detok_flush(&d, s + used, cap - used);
    }
    s[used] = 0;
    *text = s;
    if (len)
        *len = used;
    return 0;
}
