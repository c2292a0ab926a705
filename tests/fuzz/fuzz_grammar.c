/* libFuzzer target: the grammar engine (core/text/grammar_*.c). The input is a
 * GBNF text, a NUL, then a script: each byte an operation on a matcher, the
 * bytes after it its argument.
 *   0 accept k bytes   peek first: accept must answer what peek did; a refused
 *                      accept leaves the matcher where it was
 *   1 accept a token   the same through the vocabulary below
 *   2 mask             every token's bit is what peek_token answers
 *   3 clone            the clone answers the next bytes as the original does,
 *                      and goes on in its place
 *   4 can_end/must_end must_end implies can_end
 * Invariants beyond "no crash, no leak, no hang": a refused grammar says why
 * with "grammar: "; a matcher over its step budget (DRAY_ERANGE) stays failed
 * and says why. The stack budget is lowered (and no step is timed) so that
 * runs stay fast and deterministic; parenthesis depth keeps its default so
 * -max_len lets deep nesting through. Build and run: ci/fuzz.sh grammar SECONDS. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dray/dray.h"
#include "grammar.h"

#define N_EXTRA 12

/* 256 single bytes, a few multi-byte pieces (split characters among them),
 * and an end-of-generation token of no bytes. */
static struct dray_grammar_vocab *vocab(void)
{
    static const char *const extra[N_EXTRA] = {"ab", "{\"", "\": ", "true", "\xC3\xA9", "\xC3",
                                              "\xA9x", "\xE6\x97\xA5", "\xE6\x97", "\xF0\x9F\x98\x80",
                                              "  ", "\n\t"};
    static struct dray_grammar_vocab *v;
    if (v)
        return v;
    static char bytes[256];
    const char *pieces[256 + N_EXTRA + 1];
    uint32_t lens[256 + N_EXTRA + 1];
    for (int b = 0; b < 256; b++) {
        bytes[b] = (char)b;
        pieces[b] = &bytes[b];
        lens[b] = 1;
    }
    for (int k = 0; k < N_EXTRA; k++) {
        pieces[256 + k] = extra[k];
        lens[256 + k] = (uint32_t)strlen(extra[k]);
    }
    pieces[256 + N_EXTRA] = "";
    lens[256 + N_EXTRA] = 0;
    const int32_t eog = 256 + N_EXTRA;
    char err[256];
    if (dray_grammar_vocab_new(256 + N_EXTRA + 1, pieces, lens, &eog, 1, &v, err, sizeof(err)))
        abort();
    return v;
}

/* A failed matcher answers DRAY_ERANGE to everything and says why. */
static void check_failed(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v)
{
    if (!dray_grammar_matcher_error(m) || dray_grammar_peek_bytes(m, "a", 1) != DRAY_ERANGE ||
        dray_grammar_peek_token(m, v, 'a') != DRAY_ERANGE || dray_grammar_can_end(m))
        abort();
}

static void op_bytes(struct dray_grammar_matcher *m, const uint8_t *s, size_t k)
{
    bool end = dray_grammar_can_end(m);
    int peek = dray_grammar_peek_bytes(m, (const char *)s, k);
    int rc = dray_grammar_accept_bytes(m, (const char *)s, k);
    if (rc != peek && rc != DRAY_ENOMEM && peek != DRAY_ENOMEM)
        abort(); /* peek and accept disagree */
    if (rc == DRAY_EINVAL && (dray_grammar_can_end(m) != end ||
                              dray_grammar_peek_bytes(m, (const char *)s, k) != DRAY_EINVAL))
        abort(); /* a refused accept moved the matcher */
}

static void op_token(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v, int32_t id)
{
    int peek = dray_grammar_peek_token(m, v, id);
    int rc = dray_grammar_accept_token(m, v, id);
    if (rc != peek && rc != DRAY_ENOMEM && peek != DRAY_ENOMEM)
        abort();
}

static void op_mask(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v)
{
    uint32_t n = dray_grammar_vocab_size(v), allow[(256 + N_EXTRA + 1 + 31) / 32];
    long count = dray_grammar_allowed(m, v, allow);
    if (count < 0)
        return;
    long seen = 0;
    for (uint32_t id = 0; id < n; id++) {
        bool bit = allow[id / 32] >> (id % 32) & 1;
        int peek = dray_grammar_peek_token(m, v, (int32_t)id);
        if (peek == DRAY_ERANGE || peek == DRAY_ENOMEM)
            return; /* the budget ran out while checking: nothing to compare */
        if (bit != (peek == 0))
            abort(); /* the mask and peek disagree */
        seen += bit;
    }
    if (seen != count)
        abort();
}

/* Clone m; the clone must answer the probe as m does, then replaces m. */
static struct dray_grammar_matcher *op_clone(struct dray_grammar_matcher *m, const uint8_t *s,
                                             size_t k)
{
    struct dray_grammar_matcher *c = NULL;
    if (dray_grammar_matcher_clone(m, &c))
        return m;
    int a = dray_grammar_peek_bytes(m, (const char *)s, k);
    int b = dray_grammar_peek_bytes(c, (const char *)s, k);
    if (a != b && a != DRAY_ENOMEM && b != DRAY_ENOMEM)
        abort();
    dray_grammar_matcher_free(m);
    return c;
}

static void run_script(struct dray_grammar_matcher **mp, const uint8_t *p, size_t n)
{
    const struct dray_grammar_vocab *v = vocab();
    size_t i = 0;
    while (i < n) {
        struct dray_grammar_matcher *m = *mp;
        uint8_t op = p[i++] % 5;
        size_t k = i < n ? p[i++] % 8 + 1 : 0;
        k = k > n - i ? n - i : k;
        if (op == 0)
            op_bytes(m, p + i, k);
        else if (op == 1 && k)
            op_token(m, v, (int32_t)(p[i] | (p[i] & 1) << 8) % (int32_t)dray_grammar_vocab_size(v));
        else if (op == 2)
            op_mask(m, v);
        else if (op == 3)
            *mp = op_clone(m, p + i, k);
        else if (op == 4 && dray_grammar_must_end(m) && !dray_grammar_can_end(m))
            abort();
        i += op == 0 || op == 3 ? k : op == 1 && k ? 1 : 0;
        if (dray_grammar_matcher_error(*mp)) {
            check_failed(*mp, v);
            return;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    /* a copy of exactly the text's bytes: a read past its end is ASan's to see */
    char *text = malloc(len ? len : 1);
    if (!text)
        return 0;
    memcpy(text, data, len);
    const struct dray_grammar_limits lim = {.step_stacks = 1u << 16};
    struct dray_grammar *g = NULL;
    char err[256];
    int rc = dray_grammar_parse_limited(text, len, &lim, &g, err, sizeof(err));
    free(text);
    if (rc) {
        if (rc != DRAY_ENOMEM && strncmp(err, "grammar: ", 9))
            abort(); /* a refusal says why, with one prefix */
        return 0;
    }
    struct dray_grammar_matcher *m = NULL;
    rc = dray_grammar_matcher_new(g, &m);
    if (rc && rc != DRAY_ERANGE && rc != DRAY_ENOMEM)
        abort();
    if (!rc && nul)
        run_script(&m, nul + 1, size - len - 1);
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    return 0;
}
