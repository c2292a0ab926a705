/* GBNF text -> struct dray_grammar: a recursive-descent parser of llama.cpp's
 * dialect (grammar.h), then the checks (every rule defined, a root, no left
 * recursion) and the code-point atoms the matcher's rows are indexed by.
 *
 * Groups and repetitions become helper rules: ( a | b ) is a rule of two
 * alternatives; S* is R ::= S R | ""; S+ is S R; S? is R ::= S | ""; S{m,n} is
 * S m times then n - m nested optional rules R1 ::= S R2 | "", ..., Rk ::= S | "",
 * so the expansion stays linear and unambiguous. A newline ends a rule except
 * after '|' or inside parentheses. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dray/dray.h"
#include "error.h"
#include "grammar_internal.h"
#include "grammar_parser.h"
#include "utf8.h"

int dray_gram_grow(void **p, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * sz);
    if (!q)
        return DRAY_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* Line and column (1-based; columns count code points) of text offset at. */
static void line_col(const struct parser *p, size_t at, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < p->n; i++) {
        if (p->s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((uint8_t)p->s[i] & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

/* DRAY_EINVAL with "line L, column C: what" for text offset at. */
__attribute__((format(printf, 3, 4))) int dray_gram_fail_at(struct parser *p, size_t at,
                                                         const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    size_t line, col;
    line_col(p, at, &line, &col);
    return dray_fail(p->err, p->errlen, DRAY_EINVAL, "grammar: line %zu, column %zu: %s", line,
                     col, what);
}

int dray_gram_nomem(struct parser *p)
{
    return dray_fail(p->err, p->errlen, DRAY_ENOMEM, "grammar: out of memory");
}

/* The byte at the cursor, -1 at the end. */
static int peek(const struct parser *p)
{
    return p->i < p->n ? (uint8_t)p->s[p->i] : -1;
}

/* Skip blanks and # comments; newlines too when nl_ok. */
static void skip_space(struct parser *p, bool nl_ok)
{
    for (;;) {
        int c = peek(p);
        if (c == ' ' || c == '\t' || (nl_ok && (c == '\n' || c == '\r'))) {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n' && p->s[p->i] != '\r')
                p->i++;
        } else {
            return;
        }
    }
}

static bool is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

/* The display text of a character for messages: 'x', or "end of input". */
static const char *what_char(const struct parser *p, char buf[16])
{
    int c = peek(p);
    if (c < 0)
        return "end of input";
    if (c >= 0x20 && c < 0x7F)
        snprintf(buf, 16, "'%c'", c);
    else
        snprintf(buf, 16, "byte 0x%02X", (unsigned)c);
    return buf;
}

/* ------------------------------------------------------------ rule names */
static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

bool dray_gram_name_eq(const struct parser *p, const struct prule *r, const char *s, size_t n)
{
    return r->name_len == n && memcmp(p->s + r->name, s, n) == 0;
}

/* A new rule (user rule when name_len > 0, else a helper of origin's name). */
static int new_rule(struct parser *p, uint32_t name, uint32_t name_len, uint32_t *id)
{
    *id = UINT32_MAX;
    if (dray_gram_grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof(*p->rules)))
        return dray_gram_nomem(p);
    p->rules[p->n_rules] = (struct prule){.name = name, .name_len = name_len,
                                          .def_at = SIZE_MAX, .ref_at = SIZE_MAX};
    *id = (uint32_t)p->n_rules++;
    return 0;
}

/* Double the name table and re-insert. */
static int names_grow(struct parser *p)
{
    size_t cap = p->names_cap ? p->names_cap * 2 : 64;
    uint32_t *t = calloc(cap, sizeof(*t));
    if (!t)
        return dray_gram_nomem(p);
    for (size_t k = 0; k < p->names_cap; k++) {
        uint32_t v = p->names[k];
        if (!v)
            continue;
        const struct prule *r = &p->rules[v - 1];
        size_t j = name_hash(p->s + r->name, r->name_len) & (cap - 1);
        while (t[j])
            j = (j + 1) & (cap - 1);
        t[j] = v;
    }
    free(p->names);
    p->names = t;
    p->names_cap = cap;
    return 0;
}

/* The id of the user rule named text[at .. at + n), created when new. */
static int rule_id(struct parser *p, size_t at, size_t n, uint32_t *id)
{
    if (p->n_rules * 2 + 2 > p->names_cap && names_grow(p))
        return DRAY_ENOMEM;
    size_t j = name_hash(p->s + at, n) & (p->names_cap - 1);
    for (; p->names[j]; j = (j + 1) & (p->names_cap - 1)) {
        if (dray_gram_name_eq(p, &p->rules[p->names[j] - 1], p->s + at, n)) {
            *id = p->names[j] - 1;
            return 0;
        }
    }
    int rc = new_rule(p, (uint32_t)at, (uint32_t)n, id);
    if (rc)
        return rc;
    p->names[j] = *id + 1;
    return 0;
}

/* ------------------------------------------------------------ elements */
static int too_large(struct parser *p)
{
    return dray_gram_fail_at(p, p->i, "grammar too large: over %u elements (config key "
                             "grammar_max_elements)", p->lim.max_elements);
}

static int seq_push(struct parser *p, struct seq *q, uint32_t kind, uint32_t val)
{
    if (q->n >= p->lim.max_elements)
        return too_large(p);
    if (dray_gram_grow((void **)&q->e, &q->cap, q->n + 1, sizeof(*q->e)))
        return dray_gram_nomem(p);
    q->e[q->n++] = (struct gram_el){kind, val};
    return 0;
}

/* Append q[from .. from + len) to q (a copy of the last item). */
static int seq_repeat(struct parser *p, struct seq *q, size_t from, size_t len)
{
    if (dray_gram_grow((void **)&q->e, &q->cap, q->n + len, sizeof(*q->e)))
        return dray_gram_nomem(p);
    memcpy(q->e + q->n, q->e + from, len * sizeof(*q->e));
    q->n += len;
    return 0;
}

/* Give rule id the alternatives of q (END-separated) as its definition. */
static int commit_rule(struct parser *p, uint32_t id, const struct seq *q)
{
    size_t n_alt = 0;
    for (size_t k = 0; k < q->n; k++)
        n_alt += q->e[k].kind == GRAM_END;
    const struct prule *r = &p->rules[id];
    if (n_alt > p->lim.max_alternatives)
        return dray_gram_fail_at(p, p->i, "rule '%.*s'%s has %zu alternatives, over the limit of "
                                 "%u (config key grammar_max_alternatives)", (int)r->name_len,
                                 p->s + r->name, r->helper ? " (a group in it)" : "", n_alt,
                                 p->lim.max_alternatives);
    if (p->n_el + q->n + 2 > p->lim.max_elements)
        return too_large(p);
    if (dray_gram_grow((void **)&p->el, &p->cap_el, p->n_el + q->n, sizeof(*p->el)) ||
        dray_gram_grow((void **)&p->alts, &p->cap_alts, p->n_alts + n_alt, sizeof(*p->alts)))
        return dray_gram_nomem(p);
    p->rules[id].alt0 = (uint32_t)p->n_alts;
    p->rules[id].n_alt = (uint32_t)n_alt;
    p->rules[id].defined = true;
    bool at_start = true;
    for (size_t k = 0; k < q->n; k++) {
        if (at_start)
            p->alts[p->n_alts++] = (uint32_t)p->n_el;
        p->el[p->n_el++] = q->e[k];
        at_start = q->e[k].kind == GRAM_END;
    }
    return 0;
}

/* A helper rule of origin's name defined by q; its id in *id. */
static int helper_rule(struct parser *p, uint32_t origin, const struct seq *q, uint32_t *id)
{
    int rc = new_rule(p, p->rules[origin].name, p->rules[origin].name_len, id);
    if (rc)
        return rc;
    p->rules[*id].def_at = p->rules[origin].def_at;
    p->rules[*id].helper = true;
    return commit_rule(p, *id, q);
}

/* ------------------------------------------------------------ characters */
static int hex_val(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The code point of exactly digits hex digits at the cursor. */
static int parse_hex(struct parser *p, size_t at, int digits, uint32_t *cp)
{
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int h = hex_val(peek(p));
        if (h < 0)
            return dray_gram_fail_at(p, at, "escape needs %d hex digits", digits);
        v = v * 16 + (uint32_t)h;
        p->i++;
    }
    if (v > GRAM_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
        return dray_gram_fail_at(p, at, "escape U+%X is not a Unicode scalar value", v);
    *cp = v;
    return 0;
}

/* One character of a literal or a class (an escape or a UTF-8 character). */
static int parse_char(struct parser *p, uint32_t *cp)
{
    size_t at = p->i;
    int c = peek(p);
    if (c == '\\') {
        p->i++;
        int e = peek(p);
        p->i++;
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^':
            *cp = (uint32_t)e;
            return 0;
        case 'x': return parse_hex(p, at, 2, cp);
        case 'u': return parse_hex(p, at, 4, cp);
        case 'U': return parse_hex(p, at, 8, cp);
        case -1: return dray_gram_fail_at(p, at, "escape at end of input");
        default: return dray_gram_fail_at(p, at, "unknown escape '\\%c'", e);
        }
    }
    int r = dray_utf8_next((const uint8_t *)p->s + p->i, p->n - p->i, cp);
    if (r <= 0)
        return dray_gram_fail_at(p, at, "ill-formed UTF-8");
    p->i += (size_t)r;
    return 0;
}

/* ------------------------------------------------------------ classes */
static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sort and merge pairs r[0..2n) in place; returns the new pair count. */
static size_t merge_ranges(uint32_t *r, size_t n)
{
    qsort(r, n, 2 * sizeof(*r), cmp_range);
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        if (k > 0 && r[2 * j] <= r[2 * k - 1] + 1) {
            if (r[2 * j + 1] > r[2 * k - 1])
                r[2 * k - 1] = r[2 * j + 1];
        } else {
            r[2 * k] = r[2 * j];
            r[2 * k + 1] = r[2 * j + 1];
            k++;
        }
    }
    return k;
}

/* Replace sorted disjoint pairs r[0..2n) by their complement in [0, max cp]
 * (r has room for n + 1 pairs); returns the new pair count. */
static size_t negate_ranges(uint32_t *r, size_t n)
{
    uint32_t *t = malloc((n + 1) * 2 * sizeof(*t));
    if (!t)
        return SIZE_MAX;
    size_t k = 0;
    uint32_t next = 0;
    for (size_t j = 0; j < n; j++) {
        if (r[2 * j] > next) {
            t[2 * k] = next;
            t[2 * k + 1] = r[2 * j] - 1;
            k++;
        }
        next = r[2 * j + 1] + 1;
    }
    if (next <= GRAM_MAX_CP) {
        t[2 * k] = next;
        t[2 * k + 1] = GRAM_MAX_CP;
        k++;
    }
    memcpy(r, t, k * 2 * sizeof(*t));
    free(t);
    return k;
}

/* Store pairs r[0..2n) as a new class; its index in *id. */
static int add_class(struct parser *p, const uint32_t *r, size_t n, uint32_t *id)
{
    if (dray_gram_grow((void **)&p->ranges, &p->cap_rng, p->n_rng + 2 * n, sizeof(*p->ranges)) ||
        dray_gram_grow((void **)&p->cls, &p->cap_cls, p->n_cls + 2, sizeof(*p->cls)))
        return dray_gram_nomem(p);
    if (p->n_cls == 0)
        p->cls[p->n_cls++] = 0;
    memcpy(p->ranges + p->n_rng, r, 2 * n * sizeof(*r));
    p->n_rng += 2 * n;
    *id = (uint32_t)p->n_cls - 1;
    p->cls[p->n_cls++] = (uint32_t)(p->n_rng / 2);
    return 0;
}

/* The items of [...] up to the closing bracket, as pairs in *r (*n of them). */
static int class_items(struct parser *p, size_t at, uint32_t **r, size_t *n)
{
    size_t cap = 0;
    for (;;) {
        int c = peek(p);
        if (c < 0)
            return dray_gram_fail_at(p, at, "unterminated character class");
        if (c == ']')
            return 0;
        uint32_t lo, hi;
        size_t item = p->i;
        int rc = parse_char(p, &lo);
        if (rc)
            return rc;
        hi = lo;
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            if ((rc = parse_char(p, &hi)))
                return rc;
            if (hi < lo)
                return dray_gram_fail_at(p, item, "range U+%X-U+%X is reversed", lo, hi);
        }
        if (dray_gram_grow((void **)r, &cap, 2 * (*n + 2), sizeof(**r)))
            return dray_gram_nomem(p);
        (*r)[2 * *n] = lo;
        (*r)[2 * *n + 1] = hi;
        (*n)++;
    }
}

/* [...] or [^...] at the cursor: a CHAR for one code point, else a CLASS. */
static int parse_class(struct parser *p, struct seq *q)
{
    size_t at = p->i;
    p->i++; /* [ */
    bool neg = peek(p) == '^';
    if (neg)
        p->i++;
    uint32_t *r = NULL;
    size_t n = 0;
    int rc = class_items(p, at, &r, &n);
    if (!rc && n == 0)
        rc = dray_gram_fail_at(p, at, "empty character class");
    if (!rc) {
        p->i++; /* ] */
        n = merge_ranges(r, n);
        if (neg && (n = negate_ranges(r, n)) == SIZE_MAX)
            rc = dray_gram_nomem(p);
        else if (n == 0)
            rc = dray_gram_fail_at(p, at, "character class matches no character");
    }
    if (!rc) {
        uint32_t id;
        if (n == 1 && r[0] == r[1])
            rc = seq_push(p, q, GRAM_CHAR, r[0]);
        else if (!(rc = add_class(p, r, n, &id)))
            rc = seq_push(p, q, GRAM_CLASS, id);
    }
    free(r);
    return rc;
}

/* '.': the class of every code point (one shared class). */
static int parse_any(struct parser *p, struct seq *q)
{
    p->i++;
    if (p->any_cls == UINT32_MAX) {
        const uint32_t all[2] = {0, GRAM_MAX_CP};
        int rc = add_class(p, all, 1, &p->any_cls);
        if (rc)
            return rc;
    }
    return seq_push(p, q, GRAM_CLASS, p->any_cls);
}

/* "..." at the cursor: one CHAR per code point. */
static int parse_literal(struct parser *p, struct seq *q)
{
    size_t at = p->i;
    p->i++;
    for (;;) {
        int c = peek(p);
        if (c < 0 || c == '\n' || c == '\r')
            return dray_gram_fail_at(p, at, "unterminated literal");
        if (c == '"') {
            p->i++;
            return 0;
        }
        uint32_t cp;
        int rc = parse_char(p, &cp);
        if (!rc)
            rc = seq_push(p, q, GRAM_CHAR, cp);
        if (rc)
            return rc;
    }
}

/* ------------------------------------------------------------ repetition */
/* A decimal count at the cursor (<= GRAM_MAX_REPEAT). */
static int parse_count(struct parser *p, uint32_t *v)
{
    size_t at = p->i;
    int c = peek(p);
    if (c < '0' || c > '9') {
        char b[16];
        return dray_gram_fail_at(p, at, "expected a number, not %s", what_char(p, b));
    }
    uint64_t x = 0;
    while ((c = peek(p)) >= '0' && c <= '9') {
        x = x * 10 + (uint64_t)(c - '0');
        if (x > GRAM_MAX_REPEAT)
            return dray_gram_fail_at(p, at, "repetition count over %u", GRAM_MAX_REPEAT);
        p->i++;
    }
    *v = (uint32_t)x;
    return 0;
}

/* {m}, {m,} or {m,n} after the '{' at the cursor: *max UINT32_MAX for no bound. */
static int parse_braces(struct parser *p, bool nested, uint32_t *min, uint32_t *max)
{
    size_t at = p->i;
    char b[16];
    p->i++;
    skip_space(p, nested);
    int rc = parse_count(p, min);
    if (rc)
        return rc;
    skip_space(p, nested);
    *max = *min;
    if (peek(p) == ',') {
        p->i++;
        skip_space(p, nested);
        *max = UINT32_MAX;
        if (peek(p) >= '0' && peek(p) <= '9') {
            if ((rc = parse_count(p, max)))
                return rc;
            skip_space(p, nested);
        }
    }
    if (peek(p) != '}')
        return dray_gram_fail_at(p, p->i, "expected '}', not %s", what_char(p, b));
    p->i++;
    if (*max < *min)
        return dray_gram_fail_at(p, at, "repetition {%u,%u} has max below min", *min, *max);
    return 0;
}

/* The optional tail of S{m,n}: n - m nested rules R ::= S R' | "" (the last
 * R ::= S | ""), or R ::= S R | "" when unbounded; the outermost id in *id. */
static int repeat_tail(struct parser *p, uint32_t origin, const struct gram_el *s, size_t len,
                       uint32_t n_opt, bool unbounded, uint32_t *id)
{
    struct seq q = {0};
    int rc = 0;
    uint32_t inner = UINT32_MAX;
    if (unbounded && (rc = new_rule(p, p->rules[origin].name, p->rules[origin].name_len, &inner)))
        return rc;
    if (unbounded)
        p->rules[inner].helper = true;
    uint32_t self = inner;
    for (uint32_t k = 0; k < n_opt && !rc; k++) {
        q.n = 0;
        if (p->n_el + (len + 3) * (uint64_t)(n_opt - k) > p->lim.max_elements) {
            rc = too_large(p);
            break;
        }
        if (dray_gram_grow((void **)&q.e, &q.cap, len + 3, sizeof(*q.e))) {
            rc = dray_gram_nomem(p);
            break;
        }
        memcpy(q.e, s, len * sizeof(*s));
        q.n = len;
        if (inner != UINT32_MAX)
            q.e[q.n++] = (struct gram_el){GRAM_REF, inner};
        q.e[q.n++] = (struct gram_el){GRAM_END, 0};
        q.e[q.n++] = (struct gram_el){GRAM_END, 0};
        if (unbounded) {
            p->rules[self].def_at = p->rules[origin].def_at;
            rc = commit_rule(p, self, &q);
            *id = self;
        } else {
            rc = helper_rule(p, origin, &q, &inner);
            *id = inner;
        }
    }
    free(q.e);
    return rc;
}

/* Apply {min,max} to the item q[from..): S repeated min times, then the tail. */
static int apply_repeat(struct parser *p, struct seq *q, uint32_t origin, size_t from,
                        uint32_t min, uint32_t max)
{
    size_t len = q->n - from;
    bool unbounded = max == UINT32_MAX;
    uint32_t n_opt = unbounded ? 1 : max - min;
    if (q->n + len * (uint64_t)(min ? min - 1 : 0) + 1 > p->lim.max_elements ||
        p->n_el + (len + 3) * (uint64_t)n_opt > p->lim.max_elements)
        return too_large(p);
    struct gram_el *s = malloc((len ? len : 1) * sizeof(*s));
    if (!s)
        return dray_gram_nomem(p);
    memcpy(s, q->e + from, len * sizeof(*s));
    q->n = from + (min ? len : 0); /* S once stays where it is */
    int rc = 0;
    for (uint32_t k = 1; k < min && !rc; k++)
        rc = seq_repeat(p, q, from, len);
    uint32_t id = 0;
    if (!rc && n_opt > 0 && !(rc = repeat_tail(p, origin, s, len, n_opt, unbounded, &id)))
        rc = seq_push(p, q, GRAM_REF, id);
    free(s);
    return rc;
}

/* ------------------------------------------------------------ rules */
static int parse_alternates(struct parser *p, struct seq *q, uint32_t origin, bool nested);

/* ( alternates ) at the cursor: a helper rule, referenced from q. The parser
 * recurses once per level, so the nesting has a limit. */
static int parse_group(struct parser *p, struct seq *q, uint32_t origin)
{
    size_t at = p->i;
    char b[16];
    if (p->depth >= p->lim.max_depth)
        return dray_gram_fail_at(p, at, "parentheses nested deeper than %u (config key "
                                 "grammar_max_depth)", p->lim.max_depth);
    p->depth++;
    p->i++;
    skip_space(p, true);
    struct seq sub = {0};
    uint32_t id;
    int rc = parse_alternates(p, &sub, origin, true);
    if (!rc && peek(p) != ')')
        rc = peek(p) < 0 ? dray_gram_fail_at(p, at, "unclosed '('")
                         : dray_gram_fail_at(p, p->i, "expected ')', not %s", what_char(p, b));
    uint32_t loops = p->group_loops;
    if (!rc) {
        p->i++;
        rc = helper_rule(p, origin, &sub, &id);
    }
    free(sub.e);
    p->depth--;
    p->group_loops = loops;
    return rc ? rc : seq_push(p, q, GRAM_REF, id);
}

/* A reference to a rule by name at the cursor. */
static int parse_ref(struct parser *p, struct seq *q)
{
    size_t at = p->i;
    while (is_name_char(peek(p)))
        p->i++;
    uint32_t id;
    int rc = rule_id(p, at, p->i - at, &id);
    if (rc)
        return rc;
    if (p->rules[id].ref_at == SIZE_MAX)
        p->rules[id].ref_at = at;
    return seq_push(p, q, GRAM_REF, id);
}

/* A repetition operator at the cursor applied to the item at q[last..), which
 * *loops unbounded repetitions already repeat. One loop around another (x++,
 * (x+)*, x{2,}+) matches nothing a single one does not, but each character
 * multiplies the ways to split the text between them, and the matcher's work
 * with it: refused. */
static int parse_repeat(struct parser *p, struct seq *q, uint32_t origin, size_t last,
                        uint32_t *loops, bool nested)
{
    size_t at = p->i;
    int c = peek(p);
    uint32_t min = 0, max = UINT32_MAX;
    if (last == SIZE_MAX)
        return dray_gram_fail_at(p, at, "'%c' has nothing to repeat", c);
    if (c == '{') {
        int rc = parse_braces(p, nested, &min, &max);
        if (rc)
            return rc;
    } else {
        p->i++;
        min = c == '+';
        max = c == '?' ? 1 : UINT32_MAX;
    }
    if (max == UINT32_MAX && *loops)
        return dray_gram_fail_at(p, at, "an unbounded repetition of an item that is already one "
                                 "(x++, (x+)*): its ambiguity grows with every character; "
                                 "write one operator");
    *loops += max == UINT32_MAX;
    return apply_repeat(p, q, origin, last, min, max);
}

/* One item of a sequence at the cursor (its first element at q[*last], the
 * unbounded repetitions on it in *loops); 1 when the cursor is at something
 * that ends the sequence. */
static int parse_item(struct parser *p, struct seq *q, uint32_t origin, size_t *last,
                      uint32_t *loops, bool nested)
{
    int c = peek(p);
    size_t from = q->n;
    uint32_t inner = 0;
    int rc;
    if (c == '"')
        rc = parse_literal(p, q);
    else if (c == '[')
        rc = parse_class(p, q);
    else if (c == '.')
        rc = parse_any(p, q);
    else if (c == '(')
        rc = parse_group(p, q, origin), inner = p->group_loops; /* (x+) is x+ */
    else if (is_name_char(c))
        rc = parse_ref(p, q);
    else if (c == '*' || c == '+' || c == '?' || c == '{')
        return parse_repeat(p, q, origin, *last, loops, nested);
    else if (c == '<' || c == '!')
        return dray_gram_fail_at(p, p->i, "token references (<...>) are not supported");
    else
        return 1;
    *last = q->n > from ? from : SIZE_MAX; /* "" is nothing to repeat */
    *loops = inner;
    return rc;
}

/* A sequence of items up to '|', ')', a newline (unless nested) or the end;
 * *single: the loops on its item when it has exactly one, else 0. */
static int parse_sequence(struct parser *p, struct seq *q, uint32_t origin, bool nested,
                          uint32_t *single)
{
    size_t last = SIZE_MAX, items = 0;
    uint32_t loops = 0;
    for (;;) {
        int c = peek(p);
        bool repeat = c == '*' || c == '+' || c == '?' || c == '{';
        int rc = parse_item(p, q, origin, &last, &loops, nested);
        if (rc == 1) {
            *single = items == 1 ? loops : 0;
            return 0;
        }
        if (rc)
            return rc;
        items += !repeat;
        skip_space(p, nested);
    }
}

/* Alternatives separated by '|', each ended by GRAM_END in q; p->group_loops
 * the loops on the item when there is one alternative of one item. */
static int parse_alternates(struct parser *p, struct seq *q, uint32_t origin, bool nested)
{
    for (uint32_t n = 1;; n++) {
        uint32_t single = 0;
        int rc = parse_sequence(p, q, origin, nested, &single);
        if (!rc)
            rc = seq_push(p, q, GRAM_END, 0);
        p->group_loops = n == 1 ? single : 0;
        if (rc || peek(p) != '|')
            return rc;
        p->i++;
        skip_space(p, true);
    }
}

/* name ::= alternates, ended by a newline or the end of input. */
static int parse_rule(struct parser *p)
{
    size_t at = p->i;
    char b[16];
    while (is_name_char(peek(p)))
        p->i++;
    if (p->i == at)
        return dray_gram_fail_at(p, at, "expected a rule name, not %s", what_char(p, b));
    uint32_t id;
    int rc = rule_id(p, at, p->i - at, &id);
    if (rc)
        return rc;
    if (p->rules[id].defined) {
        size_t line, col;
        line_col(p, p->rules[id].def_at, &line, &col);
        return dray_gram_fail_at(p, at, "rule '%.*s' is already defined at line %zu", (int)(p->i - at),
                       p->s + at, line);
    }
    p->rules[id].def_at = at;
    skip_space(p, false);
    if (p->n - p->i < 3 || memcmp(p->s + p->i, "::=", 3) != 0)
        return dray_gram_fail_at(p, p->i, "expected '::=', not %s", what_char(p, b));
    p->i += 3;
    skip_space(p, true);
    struct seq q = {0};
    rc = parse_alternates(p, &q, id, false);
    if (!rc)
        rc = commit_rule(p, id, &q);
    free(q.e);
    if (rc)
        return rc;
    int c = peek(p);
    if (c == ')')
        return dray_gram_fail_at(p, p->i, "unbalanced ')'");
    if (c >= 0 && c != '\n' && c != '\r')
        return dray_gram_fail_at(p, p->i, "unexpected %s", what_char(p, b));
    return 0;
}

/* ------------------------------------------------------------ the result */
static void parser_free(struct parser *p)
{
    free(p->el), free(p->alts), free(p->rules), free(p->ranges), free(p->cls), free(p->names);
}

void dray_grammar_free(struct dray_grammar *g)
{
    if (!g)
        return;
    free(g->el), free(g->alts), free(g->rules), free(g->ranges), free(g->cls);
    free(g->bounds), free(g->blk_atom);
    free(g);
}

/* The whole text as rules. */
static int parse_rules(struct parser *p)
{
    skip_space(p, true);
    while (p->i < p->n) {
        int rc = parse_rule(p);
        if (rc)
            return rc;
        skip_space(p, true);
    }
    return 0;
}

/* Hand the rules over to g: elements (plus the start), alternatives, classes. */
static int finish(struct parser *p, struct dray_grammar *g)
{
    uint32_t root = 0;
    while (p->rules[root].helper || !dray_gram_name_eq(p, &p->rules[root], "root", 4))
        root++;
    if (dray_gram_grow((void **)&p->el, &p->cap_el, p->n_el + 2, sizeof(*p->el)) ||
        dray_gram_grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof(*p->rules)))
        return dray_gram_nomem(p);
    g->start = (uint32_t)p->n_el;
    p->el[p->n_el++] = (struct gram_el){GRAM_REF, root};
    p->el[p->n_el++] = (struct gram_el){GRAM_END, 0};
    g->rules = malloc(p->n_rules * sizeof(*g->rules));
    if (!g->rules)
        return dray_gram_nomem(p);
    for (size_t r = 0; r < p->n_rules; r++)
        g->rules[r] = (struct gram_rule){p->rules[r].alt0, p->rules[r].n_alt};
    g->n_rules = (uint32_t)p->n_rules;
    g->el = p->el, g->n_el = (uint32_t)p->n_el, p->el = NULL;
    g->alts = p->alts, p->alts = NULL;
    g->ranges = p->ranges, p->ranges = NULL;
    g->cls = p->cls, g->n_cls = p->n_cls ? (uint32_t)p->n_cls - 1 : 0, p->cls = NULL;
    return 0;
}

int dray_grammar_parse(const char *text, size_t len, struct dray_grammar **out, char *err,
                       size_t errlen)
{
    return dray_grammar_parse_limited(text, len, NULL, out, err, errlen);
}

int dray_grammar_parse_limited(const char *text, size_t len, const struct dray_grammar_limits *lim,
                               struct dray_grammar **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!text && len)
        return dray_fail(err, errlen, DRAY_EINVAL, "grammar: no text");
    if (len > GRAM_MAX_TEXT)
        return dray_fail(err, errlen, DRAY_EINVAL,
                         "grammar: text of %zu bytes is over the limit of %u", len,
                         GRAM_MAX_TEXT);
    struct parser p = {.s = text, .n = len, .err = err, .errlen = errlen,
                       .any_cls = UINT32_MAX};
    dray_gram_limits_resolve(lim, &p.lim);
    struct dray_grammar *g = calloc(1, sizeof(*g));
    if (g)
        g->lim = p.lim;
    int rc = g ? parse_rules(&p) : dray_gram_nomem(&p);
    if (!rc)
        rc = dray_gram_check_defined(&p);
    if (!rc)
        rc = dray_gram_check_left_recursion(&p);
    if (!rc)
        rc = dray_gram_atom_bounds(&p, g);
    if (!rc)
        rc = finish(&p, g);
    if (!rc)
        rc = dray_gram_atom_blocks(&p, g);
    parser_free(&p);
    if (rc) {
        dray_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int dray_grammar_check(const char *text, size_t len, char *err, size_t errlen)
{
    return dray_grammar_check_limits(text, len, NULL, err, errlen);
}

/* Parse, then build the start state under the step budget: a grammar whose
 * start alone is over it would fail its request's first step. */
int dray_grammar_check_limits(const char *text, size_t len, const struct dray_grammar_limits *lim,
                              char *err, size_t errlen)
{
    struct dray_grammar *g;
    struct dray_grammar_matcher *m = NULL;
    int rc = dray_grammar_parse_limited(text, len, lim, &g, err, errlen);
    if (rc)
        return rc;
    rc = dray_grammar_matcher_new(g, &m);
    if (rc == DRAY_ERANGE)
        rc = dray_fail(err, errlen, DRAY_EINVAL, "grammar: its start state alone is over the "
                       "step budget (config keys grammar_step_stacks, grammar_step_ms: %u "
                       "stacks, %u ms)", g->lim.step_stacks, g->lim.step_ms);
    else if (rc)
        rc = dray_fail(err, errlen, rc, "grammar: out of memory");
    dray_grammar_matcher_free(m);
    dray_grammar_free(g);
    return rc;
}
