/* The streaming detokenizer (tokenizer.h): token pieces through a UTF-8 gate. */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_bpe.h"
#include "utf8.h"

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
