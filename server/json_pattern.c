/* server/json_pattern.c — the JSON Schema converter's character sets and
 * "pattern" keyword (json_grammar_gen.h): a set of code points becomes the GBNF
 * for one character of it as written inside a JSON string; a pattern (a subset
 * of ECMA-262) becomes the rule of the strings it matches. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_grammar.h"
#include "json_grammar_gen.h"

/* ------------------------------------------------------------ code point sets */

bool jg_cs_add(struct cset *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        struct range *r = realloc(s->r, cap * sizeof(*r));
        if (!r)
            return false;
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n++] = (struct range){lo, hi};
    return true;
}

static int range_cmp(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* sorted, disjoint, not adjacent */
void jg_cs_norm(struct cset *s)
{
    if (s->n < 2)
        return;
    qsort(s->r, s->n, sizeof(*s->r), range_cmp);
    size_t k = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi)
                s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

/* the complement over [0, CP_MAX]; s normalized */
bool jg_cs_invert(struct cset *s)
{
    struct cset t = {0};
    uint32_t next = 0;
    bool ok = true;
    for (size_t i = 0; i < s->n && ok; i++) {
        if (s->r[i].lo > next)
            ok = jg_cs_add(&t, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (ok && next <= CP_MAX)
        ok = jg_cs_add(&t, next, CP_MAX);
    free(s->r);
    *s = t;
    return ok;
}

/* out = s ∩ ranges[0..n); s normalized, ranges sorted and disjoint */
static bool cs_meet(const struct cset *s, const struct range *ranges, size_t n, struct cset *out)
{
    for (size_t i = 0; i < s->n; i++)
        for (size_t j = 0; j < n; j++) {
            uint32_t lo = s->r[i].lo > ranges[j].lo ? s->r[i].lo : ranges[j].lo;
            uint32_t hi = s->r[i].hi < ranges[j].hi ? s->r[i].hi : ranges[j].hi;
            if (lo <= hi && !jg_cs_add(out, lo, hi))
                return false;
        }
    return true;
}

static bool cs_has(const struct cset *s, uint32_t c)
{
    for (size_t i = 0; i < s->n; i++)
        if (c >= s->r[i].lo && c <= s->r[i].hi)
            return true;
    return false;
}

/* the characters a JSON string may hold unescaped */
static const struct range RAW[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0xD7FF}, {0xE000, CP_MAX}};
#define N_RAW (sizeof(RAW) / sizeof(RAW[0]))

/* one code point inside a GBNF character class */
static void cls_cp(struct gen *g, struct dray_srv_buf *b, uint32_t c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        jg_putf(g, b, "%c", (char)c);
    else if (c < 0x80)
        jg_putf(g, b, "\\x%02X", c);
    else if (c < 0x10000)
        jg_putf(g, b, "\\u%04X", c);
    else
        jg_putf(g, b, "\\U%08X", c);
}

static void cls_ranges(struct gen *g, struct dray_srv_buf *b, const struct cset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        cls_cp(g, b, s->r[i].lo);
        if (s->r[i].hi != s->r[i].lo) {
            if (s->r[i].hi > s->r[i].lo + 1)
                jg_put(g, b, "-");
            cls_cp(g, b, s->r[i].hi);
        }
    }
}

static void utf8_put(struct gen *g, struct dray_srv_buf *b, uint32_t c)
{
    char u[4];
    size_t n;
    if (c < 0x80) {
        u[0] = (char)c;
        n = 1;
    } else if (c < 0x800) {
        u[0] = (char)(0xC0 | (c >> 6));
        u[1] = (char)(0x80 | (c & 0x3F));
        n = 2;
    } else if (c < 0x10000) {
        u[0] = (char)(0xE0 | (c >> 12));
        u[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[2] = (char)(0x80 | (c & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (c >> 18));
        u[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[3] = (char)(0x80 | (c & 0x3F));
        n = 4;
    }
    jg_lit(g, b, u, n);
}

/* An expression matching one character of set s as it is spelled inside a JSON
 * string: unescaped where JSON allows, else its short escape or \u00XX (controls).
 * s normalized. Returns the number of alternatives (0: s holds no character a
 * string can hold; 1: a single item, no parentheses needed). */
int jg_emit_set(struct gen *g, struct dray_srv_buf *b, const struct cset *s)
{
    struct dray_srv_buf part = {0};
    struct cset raw = {0};
    int n = 0;
    if (!cs_meet(s, RAW, N_RAW, &raw))
        g->oom = true;
    jg_cs_norm(&raw);
#define NEXT() (n++ ? jg_put(g, &part, " | ") : (void)0)
    if (raw.n) {
        NEXT();
        if (raw.n == 1 && raw.r[0].lo == raw.r[0].hi) {
            utf8_put(g, &part, raw.r[0].lo);
        } else {
            /* the negated class when that is shorter: RAW less raw, plus what RAW lacks */
            struct cset inv = {0};
            for (size_t i = 0; i < raw.n; i++)
                if (!jg_cs_add(&inv, raw.r[i].lo, raw.r[i].hi))
                    g->oom = true;
            if (!jg_cs_invert(&inv))
                g->oom = true;
            struct cset neg = {0};
            if (!cs_meet(&inv, RAW, N_RAW, &neg))
                g->oom = true;
            jg_cs_norm(&neg);
            if (neg.n + 1 < raw.n) {
                jg_put(g, &part, "[^\\x00-\\x1F\\x22\\x5C");
                cls_ranges(g, &part, &neg);
                jg_put(g, &part, "]");
            } else {
                jg_put(g, &part, "[");
                cls_ranges(g, &part, &raw);
                jg_put(g, &part, "]");
            }
            free(inv.r);
            free(neg.r);
        }
    }
    if (cs_has(s, '"')) {
        NEXT();
        jg_put(g, &part, "\"\\\\\\\"\"");
    }
    if (cs_has(s, '\\')) {
        NEXT();
        jg_put(g, &part, "\"\\\\\\\\\"");
    }
    /* controls: the short escapes, then \u00XX by high nibble */
    static const struct {
        uint32_t c;
        char e;
    } shorts[] = {{8, 'b'}, {9, 't'}, {10, 'n'}, {12, 'f'}, {13, 'r'}};
    char sh[8];
    size_t nsh = 0;
    for (size_t i = 0; i < sizeof(shorts) / sizeof(shorts[0]); i++)
        if (cs_has(s, shorts[i].c))
            sh[nsh++] = shorts[i].e;
    if (nsh) {
        NEXT();
        if (nsh == 1)
            jg_putf(g, &part, "\"\\\\%c\"", sh[0]);
        else
            jg_putf(g, &part, "\"\\\\\" [%.*s]", (int)nsh, sh);
    }
    for (uint32_t hi = 0; hi < 2; hi++) {
        char cls[40];
        size_t k = 0, nlo = 0;
        for (uint32_t lo = 0; lo < 16; lo++) {
            if (!cs_has(s, hi * 16 + lo))
                continue;
            nlo++;
            cls[k++] = "0123456789abcdef"[lo];
            if (lo >= 10)
                cls[k++] = "0123456789ABCDEF"[lo];
        }
        if (!nlo)
            continue;
        NEXT();
        jg_putf(g, &part, "\"\\\\u00%u\" ", hi);
        if (nlo == 16)
            jg_put(g, &part, "[0-9a-fA-F]");
        else if (k == 1)
            jg_putf(g, &part, "\"%c\"", cls[0]);
        else
            jg_putf(g, &part, "[%.*s]", (int)k, cls);
    }
#undef NEXT
    /* a single alternative of several items (the \u forms) needs parentheses too */
    bool one_item = n == 1 && !memchr(part.data, ' ', part.len);
    if (n > 1 || (n == 1 && !one_item))
        jg_put(g, b, "( ");
    jg_putn(g, b, part.data, part.len);
    if (n > 1 || (n == 1 && !one_item))
        jg_put(g, b, " )");
    free(raw.r);
    dray_srv_buf_free(&part);
    return n == 1 && !one_item ? 2 : n;
}

/* ------------------------------------------------------------ pattern (regex) */

/* The subset of ECMA-262 regular expressions: literals, escapes, classes, '.',
 * groups, '|', quantifiers, '^' and '$' at the ends of the top-level branches.
 * The AST's sets are of code points; the output spells them inside a JSON
 * string. */
enum { RX_SET, RX_SEQ, RX_ALT, RX_REP };

struct rx {
    int kind;
    struct cset set;      /* RX_SET */
    struct rx **kid;      /* RX_SEQ, RX_ALT; RX_REP: kid[0] */
    size_t n, cap;
    int min, max;         /* RX_REP; max -1: unbounded */
    bool anchor_start, anchor_end; /* a top-level branch (RX_SEQ) */
};

struct rxp {
    struct gen *g;
    const char *s;
    size_t i, n;
    struct rx **all;      /* every node, to free */
    size_t n_all, cap_all;
    int depth;
    int failed;           /* -1 once e is filled */
};

#define RX_MAX_DEPTH 32

__attribute__((format(printf, 2, 3))) static struct rx *rx_fail(struct rxp *p, const char *fmt,
                                                                 ...)
{
    if (p->failed)
        return NULL;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    p->failed = -1;
    jg_bad(p->g, "pattern", "at offset %zu of \"%.60s\": %s", p->i, p->s, msg);
    return NULL;
}

static struct rx *rx_new(struct rxp *p, int kind)
{
    if (p->n_all == p->cap_all) {
        size_t cap = p->cap_all ? 2 * p->cap_all : 32;
        struct rx **a = realloc(p->all, cap * sizeof(*a));
        if (!a)
            goto nomem;
        p->all = a;
        p->cap_all = cap;
    }
    struct rx *x = calloc(1, sizeof(*x));
    if (!x)
        goto nomem;
    x->kind = kind;
    p->all[p->n_all++] = x;
    return x;
nomem:
    p->failed = -1;
    jg_oom(p->g);
    return NULL;
}

static bool rx_push(struct rxp *p, struct rx *parent, struct rx *kid)
{
    if (parent->n == parent->cap) {
        size_t cap = parent->cap ? 2 * parent->cap : 4;
        struct rx **k = realloc(parent->kid, cap * sizeof(*k));
        if (!k) {
            p->failed = -1;
            jg_oom(p->g);
            return false;
        }
        parent->kid = k;
        parent->cap = cap;
    }
    parent->kid[parent->n++] = kid;
    return true;
}

static void rx_free(struct rxp *p)
{
    for (size_t i = 0; i < p->n_all; i++) {
        free(p->all[i]->set.r);
        free(p->all[i]->kid);
        free(p->all[i]);
    }
    free(p->all);
}

/* the code point at s[*i] (UTF-8, which jansson checked), *i moved past it */
uint32_t jg_utf8_next(const char *str, size_t n, size_t *i)
{
    const unsigned char *s = (const unsigned char *)str + *i;
    uint32_t c = s[0];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (*i + len > n)
        len = 1;
    if (len == 2)
        c = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    else if (len == 3)
        c = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    else if (len == 4)
        c = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    *i += len;
    return c;
}

static uint32_t rx_cp(struct rxp *p)
{
    return jg_utf8_next(p->s, p->n, &p->i);
}

static bool set_add(struct rxp *p, struct cset *s, uint32_t lo, uint32_t hi)
{
    if (!jg_cs_add(s, lo, hi)) {
        p->failed = -1;
        jg_oom(p->g);
        return false;
    }
    return true;
}

/* \d \w \s (and their complements when neg) into s */
static bool class_escape(struct rxp *p, char c, struct cset *s)
{
    static const struct range digit[] = {{'0', '9'}};
    static const struct range word[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    /* ECMA-262 WhiteSpace and LineTerminator */
    static const struct range space[] = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0},
                                         {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                                         {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                         {0xFEFF, 0xFEFF}};
    const struct range *r;
    size_t n;
    switch (c | 0x20) {
    case 'd': r = digit; n = 1; break;
    case 'w': r = word; n = 4; break;
    default: r = space; n = sizeof(space) / sizeof(space[0]); break;
    }
    struct cset t = {0};
    for (size_t i = 0; i < n; i++)
        if (!set_add(p, &t, r[i].lo, r[i].hi))
            goto fail;
    if (c >= 'A' && c <= 'Z' && !jg_cs_invert(&t)) {
        p->failed = -1;
        jg_oom(p->g);
        goto fail;
    }
    for (size_t i = 0; i < t.n; i++)
        if (!set_add(p, s, t.r[i].lo, t.r[i].hi))
            goto fail;
    free(t.r);
    return true;
fail:
    free(t.r);
    return false;
}

int jg_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    return (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

/* After a backslash: a class escape into *set (returns 1), or one code point
 * into *cp (returns 0); -1 refused. */
static int rx_escape(struct rxp *p, bool in_class, uint32_t *cp, struct cset *set)
{
    if (p->i >= p->n)
        return rx_fail(p, "the pattern ends with a lone backslash"), -1;
    char c = p->s[p->i];
    if (strchr("dDwWsS", c)) {
        p->i++;
        return class_escape(p, c, set) ? 1 : -1;
    }
    const char *simple = "t\tn\nr\rf\fv\v";
    const char *hit = strchr("tnrfv", c);
    if (hit) {
        p->i++;
        *cp = (uint32_t)simple[2 * (hit - "tnrfv") + 1];
        return 0;
    }
    if (c == 'b' && in_class) {
        p->i++;
        *cp = 8;
        return 0;
    }
    if (c == '0' && !(p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')) {
        p->i++;
        *cp = 0;
        return 0;
    }
    if (c == 'x' || c == 'u') {
        int nd = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        if (p->i + 1 + (size_t)nd > p->n)
            return rx_fail(p, "\\%c needs %d hex digits", c, nd), -1;
        for (int k = 0; k < nd; k++) {
            int h = jg_hexval(p->s[p->i + 1 + (size_t)k]);
            if (h < 0)
                return rx_fail(p, "\\%c needs %d hex digits", c, nd), -1;
            v = v * 16 + (uint32_t)h;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rx_fail(p, "surrogate escapes (\\uD800-\\uDFFF) are not supported"), -1;
        p->i += 1 + (size_t)nd;
        *cp = v;
        return 0;
    }
    if (c == 'b' || c == 'B')
        return rx_fail(p, "word boundaries (\\%c) are not supported", c), -1;
    if (c >= '1' && c <= '9')
        return rx_fail(p, "back-references (\\%c) are not supported", c), -1;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return rx_fail(p, "the escape \\%c is not supported", c), -1;
    /* an escaped punctuation character stands for itself */
    *cp = rx_cp(p);
    return 0;
}

static struct rx *rx_class(struct rxp *p)
{
    struct rx *x = rx_new(p, RX_SET);
    if (!x)
        return NULL;
    bool neg = p->i < p->n && p->s[p->i] == '^';
    if (neg)
        p->i++;
    for (;;) {
        if (p->i >= p->n)
            return rx_fail(p, "a '[' class is not closed");
        if (p->s[p->i] == ']') {
            p->i++;
            break;
        }
        uint32_t lo, hi;
        int k;
        if (p->s[p->i] == '\\') {
            p->i++;
            if ((k = rx_escape(p, true, &lo, &x->set)) < 0)
                return NULL;
            if (k == 1) {
                if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']')
                    return rx_fail(p, "a range cannot start or end with a class escape");
                continue;
            }
        } else {
            lo = rx_cp(p);
        }
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                struct cset dummy = {0};
                k = rx_escape(p, true, &hi, &dummy);
                free(dummy.r);
                if (k < 0)
                    return NULL;
                if (k == 1)
                    return rx_fail(p, "a range cannot start or end with a class escape");
            } else {
                hi = rx_cp(p);
            }
            if (hi < lo)
                return rx_fail(p, "the range is out of order");
        }
        if (!set_add(p, &x->set, lo, hi))
            return NULL;
    }
    jg_cs_norm(&x->set);
    if (neg && !jg_cs_invert(&x->set)) {
        p->failed = -1;
        jg_oom(p->g);
        return NULL;
    }
    return x;
}

static struct rx *rx_alt(struct rxp *p, bool top);

static struct rx *rx_atom(struct rxp *p)
{
    char c = p->s[p->i];
    struct rx *x;
    if (c == '(') {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':') {
                p->i += 2;
            } else if (p->i + 2 < p->n && p->s[p->i + 1] == '<' && p->s[p->i + 2] != '=' &&
                       p->s[p->i + 2] != '!') {
                const char *end = memchr(p->s + p->i, '>', p->n - p->i);
                if (!end)
                    return rx_fail(p, "a named group's name is not closed with '>'");
                p->i = (size_t)(end - p->s) + 1;
            } else {
                return rx_fail(p, "lookahead, lookbehind and other '(?' groups are not "
                               "supported");
            }
        }
        if (++p->depth > RX_MAX_DEPTH)
            return rx_fail(p, "groups nested more than %d deep", RX_MAX_DEPTH);
        x = rx_alt(p, false);
        p->depth--;
        if (!x)
            return NULL;
        if (p->i >= p->n || p->s[p->i] != ')')
            return rx_fail(p, "a '(' group is not closed");
        p->i++;
        return x;
    }
    if (c == '[') {
        p->i++;
        return rx_class(p);
    }
    if (!(x = rx_new(p, RX_SET)))
        return NULL;
    if (c == '.') {
        p->i++;
        /* any character but the line terminators */
        if (!set_add(p, &x->set, 0, 0x09) || !set_add(p, &x->set, 0x0B, 0x0C) ||
            !set_add(p, &x->set, 0x0E, 0x2027) || !set_add(p, &x->set, 0x202A, CP_MAX))
            return NULL;
        return x;
    }
    uint32_t cp;
    if (c == '\\') {
        p->i++;
        int k = rx_escape(p, false, &cp, &x->set);
        if (k < 0)
            return NULL;
        if (k == 1) {
            jg_cs_norm(&x->set);
            return x;
        }
    } else if (c == '*' || c == '+' || c == '?') {
        return rx_fail(p, "'%c' has nothing to repeat", c);
    } else if (c == '{') {
        return rx_fail(p, "a '{' that is not a quantifier: write \\{ for the character");
    } else if (c == ')') {
        return rx_fail(p, "a ')' without its '('");
    } else {
        cp = rx_cp(p);
    }
    return set_add(p, &x->set, cp, cp) ? x : NULL;
}

/* a decimal count of a {m,n} quantifier; -1 when none */
static long rx_count(struct rxp *p)
{
    long v = -1;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (p->s[p->i++] - '0');
        if (v > 1000000)
            v = 1000000;
    }
    return v;
}

static bool rx_nullable(const struct rx *x);

/* the quantifier after an atom, if any */
static struct rx *rx_quant(struct rxp *p, struct rx *atom)
{
    if (p->i >= p->n)
        return atom;
    char c = p->s[p->i];
    long min, max;
    if (c == '*') {
        min = 0, max = -1;
        p->i++;
    } else if (c == '+') {
        min = 1, max = -1;
        p->i++;
    } else if (c == '?') {
        min = 0, max = 1;
        p->i++;
    } else if (c == '{') {
        p->i++;
        min = rx_count(p);
        max = min;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            max = rx_count(p);
        }
        if (min < 0 || p->i >= p->n || p->s[p->i] != '}')
            return rx_fail(p, "a '{' that is not a quantifier {m}, {m,} or {m,n}: write \\{ "
                           "for the character");
        p->i++;
        if (max >= 0 && max < min)
            return rx_fail(p, "{%ld,%ld}: the bounds are out of order", min, max);
        if (min > DRAY_SRV_SCHEMA_MAX_REPEAT || max > DRAY_SRV_SCHEMA_MAX_REPEAT)
            return rx_fail(p, "a count above %d is not supported", DRAY_SRV_SCHEMA_MAX_REPEAT);
    } else {
        return atom;
    }
    if (p->i < p->n && p->s[p->i] == '?') /* lazy: the same strings match in full */
        p->i++;
    if (p->i < p->n && strchr("*+?{", p->s[p->i]))
        return rx_fail(p, "a quantifier cannot follow a quantifier");
    const struct rx *in = atom; /* through groups of one branch of one item */
    while ((in->kind == RX_ALT || in->kind == RX_SEQ) && in->n == 1)
        in = in->kid[0];
    if (max < 0 && in->kind == RX_REP && in->max < 0 && !rx_nullable(in)) /* (x*)*: below */
        return rx_fail(p, "an unbounded quantifier on a group that is one already ((x+)*): "
                       "its ambiguity grows with every character; write one quantifier");
    struct rx *r = rx_new(p, RX_REP);
    if (!r || !rx_push(p, r, atom))
        return NULL;
    r->min = (int)min;
    r->max = (int)max;
    return r;
}

static struct rx *rx_seq(struct rxp *p, bool top)
{
    struct rx *s = rx_new(p, RX_SEQ);
    if (!s)
        return NULL;
    if (top && p->i < p->n && p->s[p->i] == '^') {
        s->anchor_start = true;
        p->i++;
    }
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        char c = p->s[p->i];
        if (c == '$') {
            if (top && (p->i + 1 == p->n || p->s[p->i + 1] == '|')) {
                s->anchor_end = true;
                p->i++;
                break;
            }
            return rx_fail(p, "'$' is supported only at the end of the pattern (or of a "
                           "top-level branch)");
        }
        if (c == '^')
            return rx_fail(p, "'^' is supported only at the start of the pattern (or of a "
                           "top-level branch)");
        struct rx *a = rx_atom(p);
        if (!a || !(a = rx_quant(p, a)) || !rx_push(p, s, a))
            return NULL;
    }
    return s;
}

static struct rx *rx_alt(struct rxp *p, bool top)
{
    struct rx *a = rx_new(p, RX_ALT);
    if (!a)
        return NULL;
    for (;;) {
        struct rx *s = rx_seq(p, top);
        if (!s || !rx_push(p, a, s))
            return NULL;
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    if (top && p->i < p->n)
        return rx_fail(p, "a ')' without its '('");
    return a;
}

/* matches the empty string only */
static bool rx_eps(const struct rx *x)
{
    switch (x->kind) {
    case RX_SET: return false;
    case RX_REP: return x->max == 0 || rx_eps(x->kid[0]);
    default:
        for (size_t i = 0; i < x->n; i++)
            if (!rx_eps(x->kid[i]))
                return false;
        return true;
    }
}

static bool rx_nullable(const struct rx *x)
{
    switch (x->kind) {
    case RX_SET: return false;
    case RX_REP: return x->min == 0 || rx_nullable(x->kid[0]);
    case RX_SEQ:
        for (size_t i = 0; i < x->n; i++)
            if (!rx_nullable(x->kid[i]))
                return false;
        return true;
    default:
        for (size_t i = 0; i < x->n; i++)
            if (rx_nullable(x->kid[i]))
                return true;
        return false;
    }
}

/* x (not rx_eps) as GBNF into b; returns -1 refused, else 1 when the output is
 * one item (needs no parentheses under a quantifier) and 2 when not */
static int rx_emit(struct rxp *p, struct dray_srv_buf *b, const struct rx *x)
{
    struct gen *g = p->g;
    if (x->kind == RX_SET) {
        int n = jg_emit_set(g, b, &x->set);
        if (n == 0)
            return rx_fail(p, "a class that matches no character a JSON string can hold"), -1;
        return n == 1 ? 1 : 2;
    }
    if (x->kind == RX_REP) {
        const struct rx *k = x->kid[0];
        if (x->max < 0 && rx_nullable(k))
            return rx_fail(p, "an unbounded repetition of something that can match the "
                           "empty string is not supported"), -1;
        if (x->min == 1 && x->max == 1)
            return rx_emit(p, b, k);
        struct dray_srv_buf t = {0};
        int one = rx_emit(p, &t, k);
        if (one < 0) {
            dray_srv_buf_free(&t);
            return -1;
        }
        jg_charge(g, x->min, x->max, jg_tokens(t.data, t.len));
        if (one != 1)
            jg_put(g, b, "( ");
        jg_put_buf(g, b, &t);
        if (one != 1)
            jg_put(g, b, " )");
        dray_srv_buf_free(&t);
        if (x->min == 0 && x->max == 1)
            jg_put(g, b, "?");
        else if (x->min == 0 && x->max < 0)
            jg_put(g, b, "*");
        else if (x->min == 1 && x->max < 0)
            jg_put(g, b, "+");
        else if (x->max < 0)
            jg_putf(g, b, "{%d,}", x->min);
        else if (x->min == x->max)
            jg_putf(g, b, "{%d}", x->min);
        else
            jg_putf(g, b, "{%d,%d}", x->min, x->max);
        return 1;
    }
    if (x->kind == RX_SEQ) {
        int items = 0, one = 1;
        for (size_t i = 0; i < x->n; i++) {
            if (rx_eps(x->kid[i]))
                continue;
            if (items++)
                jg_put(g, b, " ");
            int r = rx_emit(p, b, x->kid[i]);
            if (r < 0)
                return -1;
            one = r;
        }
        return items == 1 ? one : 2;
    }
    /* RX_ALT */
    size_t n = 0;
    bool eps = false;
    for (size_t i = 0; i < x->n; i++)
        if (rx_eps(x->kid[i]))
            eps = true;
        else
            n++;
    if (n == 1 && !eps) {
        for (size_t i = 0; i < x->n; i++)
            if (!rx_eps(x->kid[i]))
                return rx_emit(p, b, x->kid[i]);
    }
    jg_put(g, b, "( ");
    size_t k = 0;
    for (size_t i = 0; i < x->n; i++) {
        if (rx_eps(x->kid[i]))
            continue;
        if (k++)
            jg_put(g, b, " | ");
        if (rx_emit(p, b, x->kid[i]) < 0)
            return -1;
    }
    jg_put(g, b, eps ? " )?" : " )");
    return 1;
}

/* the string rule of pattern pat into out */
int jg_pattern(struct gen *g, const char *pat, size_t len, struct dray_srv_buf *out)
{
    struct rxp p = {.g = g, .s = pat, .n = len};
    struct rx *top = rx_alt(&p, true);
    struct dray_srv_buf body = {0}, br = {0};
    int rc = -1;
    if (!top)
        goto done;
    /* each top-level branch: any characters before it unless it starts with '^',
     * after it unless it ends with '$' (a pattern matches anywhere in the string) */
    bool eps = false;
    size_t nb = 0;
    for (size_t i = 0; i < top->n; i++) {
        const struct rx *s = top->kid[i];
        bool e = rx_eps(s);
        if (e && s->anchor_start && s->anchor_end) {
            eps = true;
            continue;
        }
        if (nb++)
            jg_put(g, &br, " | ");
        if (!s->anchor_start) {
            jg_prim(g, &br, P_CHAR);
            jg_put(g, &br, "*");
        }
        if (!e) {
            if (!s->anchor_start)
                jg_put(g, &br, " ");
            if (rx_emit(&p, &br, s) < 0)
                goto done;
        }
        if (!s->anchor_end && !(e && !s->anchor_start)) {
            jg_put(g, &br, " ");
            jg_prim(g, &br, P_CHAR);
            jg_put(g, &br, "*");
        }
    }
    jg_put(g, &body, "\"\\\"\" ");
    if (nb) {
        jg_put(g, &body, nb > 1 || eps ? "( " : "");
        jg_put_buf(g, &body, &br);
        jg_put(g, &body, nb > 1 || eps ? (eps ? " )? " : " ) ") : " ");
    }
    jg_put(g, &body, "\"\\\"\"");
    rc = jg_rule_of(g, "pattern", &body, out);
done:
    rx_free(&p);
    dray_srv_buf_free(&body);
    dray_srv_buf_free(&br);
    return rc;
}

