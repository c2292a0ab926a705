/* Byte-level BPE (see tokenizer_bpe.h). Merges live in an open-addressing table
 * keyed by the pair of token ids; a word is merged with a heap of candidate
 * pairs over a linked list of symbols, so a long word costs O(n log n). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer_bpe.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dray/dray.h"
#include "error.h"
#include "gguf.h"
#include "tokenizer.h"
#include "utf8.h"

#define MAX_REGEX 2

/* Pre-tokenizer regexes, written from the Hugging Face tokenizer.json of each
 * family (the same expressions llama.cpp lists per tokenizer.ggml.pre). */
struct pre_kind {
    const char *name;
    const char *regex[MAX_REGEX]; /* applied in order; NULL ends */
    bool ignore_merges;           /* a word that is a token is taken whole */
};

/* GPT-2's ByteLevel regex; SmolLM2's pre-tokenizer first isolates every digit. */
#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

/* Llama 3's regex (tiktoken cl100k's, which OLMo 2's dbrx and smaug-bpe share) */
#define LLAMA3_RE CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
                  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const struct pre_kind kinds[] = {
    {"gpt2", {GPT2_RE, NULL}, false},
    {"smollm", {"\\p{N}", GPT2_RE}, false},
    {"refact", {"\\p{N}", GPT2_RE}, false},    /* Granite 3 (llama.cpp groups it with smollm) */
    {"starcoder", {"\\p{N}", GPT2_RE}, false},
    {"llama-bpe", {LLAMA3_RE, NULL}, true},     /* Llama 3.x: whole-word tokens skip merges */
    {"llama3", {LLAMA3_RE, NULL}, true},
    {"llama-v3", {LLAMA3_RE, NULL}, true},
    {"dbrx", {LLAMA3_RE, NULL}, false},         /* OLMo 2 */
    {"smaug-bpe", {LLAMA3_RE, NULL}, false},
    {"qwen2",
     {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                   "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL},
     false},
};
#define N_KINDS (sizeof(kinds) / sizeof(kinds[0]))

struct merge {
    uint64_t key; /* (left id + 1) << 32 | (right id + 1); 0 = empty slot */
    uint32_t rank;
    int32_t id;   /* the merged token */
};

struct dray_bpe {
    const struct dray_tokenizer *t;
    const struct pre_kind *kind;
    pcre2_code *re[MAX_REGEX];
    uint32_t n_re;
    struct merge *merges;
    uint32_t mask;
    int32_t byte_id[256];  /* token of each byte's mapped character, -1 if none */
    uint16_t byte_cp[256]; /* GPT-2 byte -> code point */
    int32_t unk;
};

/* ------------------------------------------------------------ byte alphabet */

static bool printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

static void byte_alphabet(uint16_t cp[256])
{
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; b++)
        cp[b] = (uint16_t)(printable(b) ? b : 256 + extra++);
}

size_t dray_bpe_decode(const char *s, size_t n, uint8_t *out)
{
    static uint8_t inv_ready;
    static int16_t inv[324]; /* code point -> byte, -1 = not in the alphabet */
    if (!inv_ready) {        /* idempotent: racing threads write the same values */
        uint16_t cp[256];
        byte_alphabet(cp);
        for (unsigned c = 0; c < 324; c++)
            inv[c] = -1;
        for (unsigned b = 0; b < 256; b++)
            inv[cp[b]] = (int16_t)b;
        inv_ready = 1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        int r = dray_utf8_next((const uint8_t *)s + i, n - i, &c);
        if (r > 0 && c < 324 && inv[c] >= 0) {
            out[k++] = (uint8_t)inv[c];
            i += (size_t)r;
            continue;
        }
        size_t len = r > 0 ? (size_t)r : r < 0 ? (size_t)-r : n - i;
        memcpy(out + k, s + i, len);
        k += len;
        i += len;
    }
    return k;
}

/* ------------------------------------------------------------ merge table */

static uint64_t pair_key(int32_t a, int32_t b)
{
    return (uint64_t)(uint32_t)(a + 1) << 32 | (uint32_t)(b + 1);
}

static struct merge *merge_slot(const struct dray_bpe *b, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ULL;
    for (uint32_t i = (uint32_t)(h >> 32) & b->mask;; i = (i + 1) & b->mask)
        if (b->merges[i].key == key || b->merges[i].key == 0)
            return &b->merges[i];
}

/* "left right" -> ids of left, right and left+right; false if any is missing. */
static bool parse_merge(const struct dray_tokenizer *t, struct dray_str m, int32_t ids[3], char *buf)
{
    const char *sp = memchr(m.ptr, ' ', m.len);
    if (!sp || sp == m.ptr || (size_t)(sp - m.ptr) + 1 >= m.len)
        return false;
    size_t nl = (size_t)(sp - m.ptr), nr = m.len - nl - 1;
    memcpy(buf, m.ptr, nl);
    memcpy(buf + nl, sp + 1, nr);
    ids[0] = dray_tokenizer_find(t, m.ptr, nl);
    ids[1] = dray_tokenizer_find(t, sp + 1, nr);
    ids[2] = dray_tokenizer_find(t, buf, nl + nr);
    return ids[0] >= 0 && ids[1] >= 0 && ids[2] >= 0;
}

static int load_merges(struct dray_bpe *b, const struct dray_gguf *g, char *err, size_t errlen)
{
    const char *key = "tokenizer.ggml.merges";
    const struct dray_gguf_kv *kv = dray_gguf_find(g, key);
    if (!kv)
        return dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: no key %s (a gpt2 tokenizer needs its merges)",
                         dray_gguf_name(g), key);
    if (kv->type != DRAY_GGUF_ARRAY || kv->arr_type != DRAY_GGUF_STRING || !kv->strs ||
        kv->arr_n > (1u << 26))
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: %s must be an array of at most 2^26 strings",
                         dray_gguf_name(g), key);
    uint32_t cap = 16;
    while (cap < kv->arr_n * 2)
        cap *= 2;
    b->mask = cap - 1;
    b->merges = calloc(cap, sizeof(*b->merges));
    char *buf = malloc(dray_tokenizer_max_piece(b->t) + 16);
    int rc = b->merges && buf ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "tokenizer: out of memory");
    for (uint64_t r = 0; !rc && r < kv->arr_n; r++) {
        int32_t ids[3];
        /* a merge whose parts are not tokens can never apply (llama.cpp and HF
         * keep it but never reach it); a longer-than-any-token one is skipped too */
        if (kv->strs[r].len > dray_tokenizer_max_piece(b->t) || !parse_merge(b->t, kv->strs[r], ids, buf))
            continue;
        struct merge *m = merge_slot(b, pair_key(ids[0], ids[1]));
        if (m->key == 0) /* the first (lowest) rank of a duplicate wins */
            *m = (struct merge){pair_key(ids[0], ids[1]), (uint32_t)r, ids[2]};
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------------ load */

static int compile_kind(struct dray_bpe *b, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < MAX_REGEX && b->kind->regex[i]; i++) {
        int code;
        PCRE2_SIZE at;
        b->re[i] = pcre2_compile((PCRE2_SPTR)b->kind->regex[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
        if (!b->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof(msg));
            return dray_fail(err, errlen, DRAY_EINVAL, "tokenizer: pre-tokenizer %s regex %u: %s at %zu",
                             b->kind->name, i, (const char *)msg, (size_t)at);
        }
        pcre2_jit_compile(b->re[i], PCRE2_JIT_COMPLETE); /* optional: interpreted if it fails */
        b->n_re = i + 1;
    }
    return 0;
}

static int pick_kind(struct dray_bpe *b, const struct dray_gguf *g, char *err, size_t errlen)
{
    struct dray_str pre = {"default", 7};
    dray_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL, 0);
    for (size_t i = 0; i < N_KINDS; i++)
        if (dray_str_eq(pre, kinds[i].name)) {
            b->kind = &kinds[i];
            return 0;
        }
    char names[256] = "";
    for (size_t i = 0; i < N_KINDS; i++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? ", " : "", kinds[i].name);
    return dray_fail(err, errlen, DRAY_ENOTSUP,
                     "%s: tokenizer.ggml.pre = \"%.*s\" is not supported for a gpt2 (byte-level BPE) "
                     "tokenizer (supported: %s)",
                     dray_gguf_name(g), (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, names);
}

int dray_bpe_load(const struct dray_gguf *g, const struct dray_tokenizer *t, struct dray_bpe **out,
                  char *err, size_t errlen)
{
    *out = NULL;
    struct dray_bpe *b = calloc(1, sizeof(*b));
    if (!b)
        return dray_fail(err, errlen, DRAY_ENOMEM, "tokenizer: out of memory");
    b->t = t;
    b->unk = dray_tokenizer_find(t, "<unk>", 5);
    byte_alphabet(b->byte_cp);
    for (unsigned c = 0; c < 256; c++) {
        char u[4];
        size_t n = dray_utf8_encode(b->byte_cp[c], u);
        b->byte_id[c] = dray_tokenizer_find(t, u, n);
    }
    int rc = pick_kind(b, g, err, errlen);
    if (!rc)
        rc = compile_kind(b, err, errlen);
    if (!rc)
        rc = load_merges(b, g, err, errlen);
    if (rc) {
        dray_bpe_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

void dray_bpe_free(struct dray_bpe *b)
{
    if (!b)
        return;
    for (uint32_t i = 0; i < b->n_re; i++)
        pcre2_code_free(b->re[i]);
    free(b->merges);
    free(b);
}

/* ------------------------------------------------------------ merging a word */

struct sym {
    int32_t id;         /* token of this symbol, -1 if its text is not one */
    int32_t prev, next; /* neighbours in the word, -1 at the ends */
    uint32_t start, len; /* bytes in the mapped word */
};

struct cand {
    uint32_t rank;
    int32_t left, right, l_id, r_id;
};

struct word {
    const struct dray_bpe *b;
    const char *text; /* mapped word */
    struct sym *sym;
    struct cand *heap;
    size_t n_heap;
};

static bool cand_before(const struct cand *a, const struct cand *c)
{
    return a->rank < c->rank || (a->rank == c->rank && a->left < c->left);
}

static void heap_push(struct word *w, struct cand c)
{
    size_t i = w->n_heap++;
    while (i > 0 && cand_before(&c, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = c;
}

static struct cand heap_pop(struct word *w)
{
    struct cand top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && cand_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!cand_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static void try_pair(struct word *w, int32_t l, int32_t r)
{
    if (l < 0 || r < 0 || w->sym[l].id < 0 || w->sym[r].id < 0)
        return;
    const struct merge *m = merge_slot(w->b, pair_key(w->sym[l].id, w->sym[r].id));
    if (m->key) /* capacity: n - 1 initial + 2 per merge (< n merges) stays under 3n */
        heap_push(w, (struct cand){m->rank, l, r, w->sym[l].id, w->sym[r].id});
}

/* Merge the mapped word text[0..n) and push its ids. */
static int merge_word(const struct dray_bpe *b, const char *text, uint32_t n, struct sym *sym,
                      struct cand *heap, int (*push)(void *, int32_t), void *user)
{
    struct word w = {b, text, sym, heap, 0};
    int32_t ns = 0;
    for (uint32_t p = 0; p < n; ns++) {
        uint32_t len = (uint32_t)dray_utf8_lead_len((uint8_t)text[p]);
        len = len > n - p ? n - p : len;
        sym[ns] = (struct sym){dray_tokenizer_find(b->t, text + p, len), ns - 1, -1, p, len};
        if (ns > 0)
            sym[ns - 1].next = ns;
        p += len;
    }
    for (int32_t i = 1; i < ns; i++)
        try_pair(&w, i - 1, i);
    while (w.n_heap) {
        struct cand c = heap_pop(&w);
        struct sym *l = &sym[c.left], *r = &sym[c.right];
        if (l->len == 0 || r->len == 0 || l->next != c.right || l->id != c.l_id || r->id != c.r_id)
            continue; /* stale: a neighbour merged elsewhere meanwhile */
        l->id = merge_slot(b, pair_key(c.l_id, c.r_id))->id;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = c.left;
        try_pair(&w, l->prev, c.left);
        try_pair(&w, c.left, l->next);
    }
    int rc = 0;
    for (int32_t i = 0; i >= 0 && !rc; i = sym[i].next) {
        if (sym[i].id >= 0)
            rc = push(user, sym[i].id);
        else if (b->unk >= 0)
            rc = push(user, b->unk); /* a character outside the vocabulary */
    }
    return rc;
}

/* ------------------------------------------------------------ encoding */

struct piece {
    uint32_t start, len;
};

struct enc {
    const struct dray_bpe *b;
    const char *s;
    struct piece *v; /* pieces of the fragment (at most one per byte, twice) */
    size_t n;
    char *mapped;    /* word in the byte alphabet: <= 2 bytes per byte */
    struct sym *sym;
    struct cand *heap;
    pcre2_match_data *md;
};

/* Split every piece of e->v by regex re: matches and the gaps between them. */
static int split(struct enc *e, const pcre2_code *re, struct piece *out, size_t *n_out)
{
    size_t k = 0;
    for (size_t i = 0; i < e->n; i++) {
        const char *subj = e->s + e->v[i].start;
        PCRE2_SIZE len = e->v[i].len, at = 0, gap = 0;
        while (at < len) {
            int r = pcre2_match(re, (PCRE2_SPTR)subj, len, at, 0, e->md, NULL);
            if (r == PCRE2_ERROR_NOMATCH)
                break;
            if (r < 0)
                return DRAY_EINVAL;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            if (ov[1] == ov[0]) { /* an empty match: move on by one byte */
                at = ov[0] + 1;
                continue;
            }
            if (ov[0] > gap)
                out[k++] = (struct piece){e->v[i].start + (uint32_t)gap, (uint32_t)(ov[0] - gap)};
            out[k++] = (struct piece){e->v[i].start + (uint32_t)ov[0], (uint32_t)(ov[1] - ov[0])};
            at = gap = ov[1];
        }
        if (gap < len)
            out[k++] = (struct piece){e->v[i].start + (uint32_t)gap, (uint32_t)(len - gap)};
    }
    *n_out = k;
    return 0;
}

static uint32_t map_word(const struct dray_bpe *b, const char *s, uint32_t n, char *out)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        k += (uint32_t)dray_utf8_encode(b->byte_cp[(uint8_t)s[i]], out + k);
    return k;
}

static int encode_words(struct enc *e, int (*push)(void *, int32_t), void *user)
{
    const struct dray_bpe *b = e->b;
    for (size_t i = 0; i < e->n; i++) {
        uint32_t n = map_word(b, e->s + e->v[i].start, e->v[i].len, e->mapped);
        int32_t whole = b->kind->ignore_merges ? dray_tokenizer_find(b->t, e->mapped, n) : -1;
        int rc = whole >= 0 ? push(user, whole)
                            : merge_word(b, e->mapped, n, e->sym, e->heap, push, user);
        if (rc)
            return rc;
    }
    return 0;
}

int dray_bpe_encode(const struct dray_bpe *b, const char *s, size_t n,
                    int (*push)(void *user, int32_t id), void *user)
{
    if (n == 0)
        return 0;
    if (n > UINT32_MAX / 4)
        return DRAY_ERANGE;
    struct enc e = {.b = b, .s = s};
    struct piece *tmp = malloc(n * 2 * sizeof(*tmp));
    e.v = malloc(n * 2 * sizeof(*e.v));
    e.mapped = malloc(n * 2 + 4);
    e.sym = malloc(n * 2 * sizeof(*e.sym));
    e.heap = malloc(n * 3 * sizeof(*e.heap));
    e.md = pcre2_match_data_create(4, NULL);
    int rc = DRAY_ENOMEM;
    if (!tmp || !e.v || !e.mapped || !e.sym || !e.heap || !e.md)
        goto out;
    e.v[0] = (struct piece){0, (uint32_t)n};
    e.n = 1;
    rc = 0;
    for (uint32_t r = 0; r < b->n_re && !rc; r++) {
        rc = split(&e, b->re[r], tmp, &e.n);
        struct piece *swap = e.v;
        e.v = tmp;
        tmp = swap;
    }
    if (!rc)
        rc = encode_words(&e, push, user);
out:
    free(tmp);
    free(e.v);
    free(e.mapped);
    free(e.sym);
    free(e.heap);
    if (e.md)
        pcre2_match_data_free(e.md);
    return rc;
}
