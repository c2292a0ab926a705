/* server/json_range.c — the JSON Schema converter's numeric bounds
 * (json_grammar_gen.h): minimum, maximum, exclusiveMinimum and exclusiveMaximum
 * on integers and numbers, exactly, as rules over the digits. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jfield.h"
#include "json_grammar_gen.h"

/* ------------------------------------------------------------ numbers */

/* A decimal: digits of the integer part ("0", or no leading zero) and of the
 * fraction (no trailing zero). Bounds are compared as exact decimals; a bound
 * given as a binary double is read as its shortest spelling (0.1 is 0.1). */
#define DEC_DIGITS 400

struct dec {
    bool neg;
    char ip[DEC_DIGITS + 2];
    char fp[DEC_DIGITS + 2];
};

static void dec_trim(struct dec *d)
{
    size_t z = 0, n = strlen(d->ip);
    while (z + 1 < n && d->ip[z] == '0')
        z++;
    memmove(d->ip, d->ip + z, n - z + 1);
    n = strlen(d->fp);
    while (n && d->fp[n - 1] == '0')
        d->fp[--n] = '\0';
    if (!strcmp(d->ip, "0") && !n)
        d->neg = false;
}

static void dec_of(json_t *v, struct dec *d)
{
    memset(d, 0, sizeof(*d));
    if (json_is_integer(v)) {
        char tmp[32];
        snprintf(tmp, sizeof(tmp), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        d->neg = tmp[0] == '-';
        snprintf(d->ip, sizeof(d->ip), "%s", tmp + d->neg);
        return;
    }
    double x = json_real_value(v);
    char tmp[40], digits[24];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(tmp, sizeof(tmp), "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    snprintf(tmp, sizeof(tmp), "%.*e", p - 1, x);
    d->neg = tmp[0] == '-';
    const char *s = tmp + d->neg;
    size_t nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9')
            digits[nd++] = *s;
    digits[nd] = '\0';
    int ex = atoi(s + 1); /* the first digit's place: 10^ex */
    if (ex >= 0) {
        size_t k = 0;
        for (int i = 0; i <= ex; i++)
            d->ip[k++] = (size_t)i < nd ? digits[i] : '0';
        d->ip[k] = '\0';
        snprintf(d->fp, sizeof(d->fp), "%s", (size_t)ex + 1 < nd ? digits + ex + 1 : "");
    } else {
        strcpy(d->ip, "0");
        size_t k = 0;
        for (int i = 0; i < -ex - 1; i++)
            d->fp[k++] = '0';
        memcpy(d->fp + k, digits, nd + 1);
    }
    dec_trim(d);
}

static int mag_cmp(const struct dec *a, const struct dec *b)
{
    size_t la = strlen(a->ip), lb = strlen(b->ip);
    if (la != lb)
        return la < lb ? -1 : 1;
    int c = strcmp(a->ip, b->ip);
    if (!c)
        c = strcmp(a->fp, b->fp);
    return c < 0 ? -1 : c > 0;
}

static bool dec_zero(const struct dec *d)
{
    return !strcmp(d->ip, "0") && !d->fp[0];
}

static int dec_cmp(const struct dec *a, const struct dec *b)
{
    if (a->neg != b->neg)
        return a->neg ? -1 : 1;
    return a->neg ? -mag_cmp(a, b) : mag_cmp(a, b);
}

/* the integer digit string s, plus or minus one (s > 0 for minus) */
static void digits_inc(char *s)
{
    size_t n = strlen(s);
    for (size_t i = n; i-- > 0;) {
        if (s[i] != '9') {
            s[i]++;
            return;
        }
        s[i] = '0';
    }
    memmove(s + 1, s, n + 1);
    s[0] = '1';
}

static void digits_dec(char *s)
{
    size_t n = strlen(s);
    for (size_t i = n; i-- > 0;) {
        if (s[i] != '0') {
            s[i]--;
            break;
        }
        s[i] = '9';
    }
    if (n > 1 && s[0] == '0')
        memmove(s, s + 1, n);
}

/* d + 1 and d - 1 for an integer d */
static void dec_add1(struct dec *d)
{
    if (!d->neg)
        digits_inc(d->ip);
    else
        digits_dec(d->ip);
    dec_trim(d);
}

static void dec_sub1(struct dec *d)
{
    if (d->neg || dec_zero(d)) {
        d->neg = true;
        digits_inc(d->ip);
    } else {
        digits_dec(d->ip);
    }
    dec_trim(d);
}

/* the integer at or above (ceil) / at or below (floor) d */
static void dec_ceil(struct dec *d)
{
    if (!d->fp[0])
        return;
    d->fp[0] = '\0';
    if (!d->neg)
        digits_inc(d->ip);
    dec_trim(d);
}

static void dec_floor(struct dec *d)
{
    if (!d->fp[0])
        return;
    d->fp[0] = '\0';
    if (d->neg)
        digits_inc(d->ip);
    dec_trim(d);
}

/* [lo-hi] of digits; one digit as a literal */
static void digit_class(struct gen *g, struct dray_srv_buf *b, char lo, char hi)
{
    if (lo == hi)
        jg_putf(g, b, "\"%c\"", lo);
    else
        jg_putf(g, b, "[%c-%c]", lo, hi);
}

static void any_digits(struct gen *g, struct dray_srv_buf *b, size_t n)
{
    jg_charge(g, (long)n, (long)n, 1);
    if (n == 1)
        jg_put(g, b, " [0-9]");
    else if (n > 1)
        jg_putf(g, b, " [0-9]{%zu}", n);
}

static bool all_of(const char *s, size_t n, char c)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != c)
            return false;
    return true;
}

/* the n-digit strings from a to b (a <= b, leading zeros counted as digits) */
static void same_len_range(struct gen *g, struct dray_srv_buf *b, const char *lo, const char *hi,
                           size_t n)
{
    size_t i = 0;
    while (i < n && lo[i] == hi[i]) /* the common prefix */
        i++;
    if (i) {
        jg_put(g, b, " ");
        jg_lit(g, b, lo, i);
    }
    if (i == n)
        return;
    lo += i, hi += i, n -= i;
    bool lo_any = all_of(lo + 1, n - 1, '0'), hi_any = all_of(hi + 1, n - 1, '9');
    char m1 = lo_any ? lo[0] : (char)(lo[0] + 1), m2 = hi_any ? hi[0] : (char)(hi[0] - 1);
    int alts = (!lo_any) + (!hi_any) + (m1 <= m2);
    jg_put(g, b, alts > 1 ? " (" : "");
    int k = 0;
    if (!lo_any) { /* lo[0] then at least lo[1..] */
        k++;
        jg_put(g, b, " ");
        digit_class(g, b, lo[0], lo[0]);
        /* lo[1..] to 99..9 */
        char nines[DEC_DIGITS + 2];
        memset(nines, '9', n - 1);
        nines[n - 1] = '\0';
        same_len_range(g, b, lo + 1, nines, n - 1);
    }
    if (m1 <= m2) {
        if (k++)
            jg_put(g, b, " |");
        jg_put(g, b, " ");
        digit_class(g, b, m1, m2);
        any_digits(g, b, n - 1);
    }
    if (!hi_any) { /* hi[0] then at most hi[1..] */
        if (k++)
            jg_put(g, b, " |");
        jg_put(g, b, " ");
        digit_class(g, b, hi[0], hi[0]);
        char zeros[DEC_DIGITS + 2];
        memset(zeros, '0', n - 1);
        zeros[n - 1] = '\0';
        same_len_range(g, b, zeros, hi + 1, n - 1);
    }
    jg_put(g, b, alts > 1 ? " )" : "");
}

/* The integers from a to b (digit strings, 1 <= a <= b; b NULL: no end), no
 * leading zeros */
static void int_range(struct gen *g, struct dray_srv_buf *b, const char *lo, const char *hi)
{
    size_t la = strlen(lo), lb = hi ? strlen(hi) : 0;
    char tmp[DEC_DIGITS + 2];
    if (hi && la == lb) {
        same_len_range(g, b, lo, hi, la);
        return;
    }
    jg_put(g, b, " (");
    memset(tmp, '9', la);
    tmp[la] = '\0';
    same_len_range(g, b, lo, tmp, la);
    if (!hi) { /* longer than lo */
        if (la == 1)
            jg_put(g, b, " | [1-9] [0-9]+");
        else
            jg_putf(g, b, " | [1-9] [0-9]{%zu,}", la);
        jg_charge(g, (long)la, -1, 1);
    } else {
        if (lb - la == 2) {
            jg_put(g, b, " | [1-9]");
            any_digits(g, b, la);
        } else if (lb - la > 2) {
            jg_putf(g, b, " | [1-9] [0-9]{%zu,%zu}", la, lb - 2);
            jg_charge(g, (long)la, (long)(lb - 2), 1);
        }
        jg_put(g, b, " |");
        tmp[0] = '1';
        memset(tmp + 1, '0', lb - 1);
        tmp[lb] = '\0';
        same_len_range(g, b, tmp, hi, lb);
    }
    jg_put(g, b, " )");
}

/* Fractions: the digit strings S after "." whose value 0.S is above a lower
 * bound and below an upper one, each given by the bound's remaining digits d ("":
 * 0). */
enum { F_NONE, F_GE, F_GT, F_LE, F_LT };

struct fb {
    int op;
    const char *d;
};

/* the language: none, the empty string only, or more */
enum { L_NONE, L_EPS, L_SOME };

static bool frac_eps_ok(struct fb lo, struct fb hi)
{
    bool l = lo.op == F_NONE || (lo.op == F_GE && !lo.d[0]);
    bool h = hi.op != F_LT || hi.d[0];
    return l && h;
}

static int frac_any(struct gen *g, struct dray_srv_buf *b, struct fb lo, struct fb hi);

/* non-empty S */
static int frac_ne(struct gen *g, struct dray_srv_buf *b, struct fb lo, struct fb hi)
{
    if (lo.op == F_GE && !lo.d[0])
        lo.op = F_NONE;
    if (hi.op == F_LT && !hi.d[0])
        return L_NONE;
    bool lo0 = lo.op == F_GT && !lo.d[0], hi0 = hi.op == F_LE && !hi.d[0];
    if (lo.op == F_NONE && hi.op == F_NONE) {
        jg_put(g, b, " [0-9]+");
        return L_SOME;
    }
    if (lo0 && hi0)
        return L_NONE;
    if (lo0 && hi.op == F_NONE) {
        jg_put(g, b, " \"0\"* [1-9] [0-9]*");
        return L_SOME;
    }
    if (hi0 && lo.op == F_NONE) {
        jg_put(g, b, " \"0\"+");
        return L_SOME;
    }
    /* by the first digit c: each bound is passed (NONE), still tied (its next
     * digits), or broken */
    char a = lo.op != F_NONE ? (lo.d[0] ? lo.d[0] : '0') : 0;
    char z = hi.op != F_NONE ? (hi.d[0] ? hi.d[0] : '0') : 0;
    struct dray_srv_buf alts = {0}, t = {0};
    int n = 0;
    for (char c = '0'; c <= '9';) {
        int kl = lo.op == F_NONE ? 0 : c < a ? -1 : c == a ? 1 : 0;
        int kh = hi.op == F_NONE ? 0 : c > z ? -1 : c == z ? 1 : 0;
        char e = c;
        /* the digits after c with the same outcome */
        while (e < '9') {
            char f = (char)(e + 1);
            int fl = lo.op == F_NONE ? 0 : f < a ? -1 : f == a ? 1 : 0;
            int fh = hi.op == F_NONE ? 0 : f > z ? -1 : f == z ? 1 : 0;
            if (fl != kl || fh != kh || kl == 1 || kh == 1)
                break;
            e = f;
        }
        if (kl >= 0 && kh >= 0) {
            struct fb nl = {F_NONE, ""}, nh = {F_NONE, ""};
            if (kl) /* tied: the bound's next digits */
                nl = (struct fb){lo.op, lo.d[0] ? lo.d + 1 : lo.d};
            if (kh)
                nh = (struct fb){hi.op, hi.d[0] ? hi.d + 1 : hi.d};
            int r = frac_any(g, &t, nl, nh);
            if (r != L_NONE) {
                if (n++)
                    jg_put(g, &alts, " |");
                jg_put(g, &alts, " ");
                digit_class(g, &alts, c, e);
                jg_put_buf(g, &alts, &t);
            }
            dray_srv_buf_reset(&t);
        }
        c = (char)(e + 1);
    }
    if (n) {
        jg_put(g, b, n > 1 ? " (" : "");
        jg_putn(g, b, alts.data, alts.len);
        jg_put(g, b, n > 1 ? " )" : "");
    }
    dray_srv_buf_free(&alts);
    dray_srv_buf_free(&t);
    return n ? L_SOME : L_NONE;
}

/* S possibly empty */
static int frac_any(struct gen *g, struct dray_srv_buf *b, struct fb lo, struct fb hi)
{
    struct dray_srv_buf t = {0};
    int r = frac_ne(g, &t, lo, hi);
    bool eps = frac_eps_ok(lo, hi);
    if (r == L_SOME) {
        jg_put(g, b, eps ? " (" : "");
        jg_putn(g, b, t.data, t.len);
        jg_put(g, b, eps ? " )?" : "");
    }
    dray_srv_buf_free(&t);
    return r == L_SOME ? L_SOME : eps ? L_EPS : L_NONE;
}

/* the "." and fraction after an integer part, none being a fraction of 0 */
static int frac_part(struct gen *g, struct dray_srv_buf *b, struct fb lo, struct fb hi)
{
    struct dray_srv_buf t = {0};
    int r = frac_ne(g, &t, lo, hi);
    bool eps = frac_eps_ok(lo, hi);
    if (r == L_SOME) {
        jg_put(g, b, " ( \".\"");
        jg_putn(g, b, t.data, t.len);
        jg_put(g, b, eps ? " )?" : " )");
    }
    dray_srv_buf_free(&t);
    return r == L_SOME ? L_SOME : eps ? L_EPS : L_NONE;
}

/* Magnitudes m (integer part and optional fraction, no exponent) with
 * lo (F_GE/F_GT) <= m and, when hi, m <= hi (F_LE/F_LT). */
static int num_mag(struct gen *g, struct dray_srv_buf *b, const struct dec *lo, int lop,
                   const struct dec *hi, int hop)
{
    struct dray_srv_buf alts = {0}, t = {0};
    int n = 0;
#define ALT() (n++ ? jg_put(g, &alts, " |") : (void)0)
    if (hi && !strcmp(lo->ip, hi->ip)) {
        if (frac_part(g, &t, (struct fb){lop, lo->fp}, (struct fb){hop, hi->fp}) != L_NONE) {
            ALT();
            jg_put(g, &alts, " ");
            jg_lit(g, &alts, lo->ip, strlen(lo->ip));
            jg_put_buf(g, &alts, &t);
        }
    } else {
        if (frac_part(g, &t, (struct fb){lop, lo->fp}, (struct fb){F_NONE, ""}) != L_NONE) {
            ALT();
            jg_put(g, &alts, " ");
            jg_lit(g, &alts, lo->ip, strlen(lo->ip));
            jg_put_buf(g, &alts, &t);
        }
        /* integer parts strictly between */
        struct dec a = *lo, z;
        a.fp[0] = '\0';
        a.neg = false;
        dec_add1(&a);
        bool mid = true;
        if (hi) {
            z = *hi;
            z.fp[0] = '\0';
            z.neg = false;
            if (dec_zero(&z))
                mid = false;
            else
                dec_sub1(&z);
            mid = mid && mag_cmp(&a, &z) <= 0;
        }
        if (mid) {
            ALT();
            int_range(g, &alts, a.ip, hi ? z.ip : NULL);
            jg_put(g, &alts, " ( \".\" [0-9]+ )?");
        }
        if (hi && frac_part(g, &t, (struct fb){F_NONE, ""}, (struct fb){hop, hi->fp}) != L_NONE) {
            ALT();
            jg_put(g, &alts, " ");
            jg_lit(g, &alts, hi->ip, strlen(hi->ip));
            jg_put_buf(g, &alts, &t);
        }
    }
#undef ALT
    if (n) {
        jg_put(g, b, n > 1 ? " (" : "");
        jg_putn(g, b, alts.data, alts.len);
        jg_put(g, b, n > 1 ? " )" : "");
    }
    dray_srv_buf_free(&alts);
    dray_srv_buf_free(&t);
    return n;
}

struct bound {
    bool set, incl;
    struct dec d;
};

/* minimum/exclusiveMinimum into lo, maximum/exclusiveMaximum into hi (the
 * stricter of each pair) */
static int read_bounds(struct gen *g, json_t *s, struct bound *lo, struct bound *hi)
{
    static const struct {
        const char *kw;
        bool upper, incl;
    } kws[] = {{"minimum", false, true}, {"exclusiveMinimum", false, false},
               {"maximum", true, true}, {"exclusiveMaximum", true, false}};
    memset(lo, 0, sizeof(*lo));
    memset(hi, 0, sizeof(*hi));
    for (size_t i = 0; i < 4; i++) {
        json_t *v = json_object_get(s, kws[i].kw);
        if (!v)
            continue;
        if (json_is_boolean(v))
            return jg_bad(g, kws[i].kw, "must be a number (draft 4's boolean form is not "
                       "supported: give the bound itself)");
        if (!json_is_number(v))
            return jg_bad(g, kws[i].kw, "must be a number, got %s", dray_srv_kind_of(v));
        struct bound nb = {true, kws[i].incl, {0}};
        dec_of(v, &nb.d);
        struct bound *b = kws[i].upper ? hi : lo;
        int c = b->set ? dec_cmp(&nb.d, &b->d) : 0;
        if (!b->set || (kws[i].upper ? c < 0 : c > 0) || (c == 0 && !nb.incl))
            *b = nb;
    }
    return 0;
}

static int no_number(struct gen *g)
{
    return jg_bad(g, NULL, "no number satisfies the schema's minimum/maximum bounds");
}

int jg_integer(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    struct bound lo, hi;
    if (read_bounds(g, s, &lo, &hi))
        return -1;
    if (!lo.set && !hi.set) {
        jg_prim(g, out, P_INTEGER);
        return 0;
    }
    /* inclusive integer bounds */
    if (lo.set) {
        bool was_int = !lo.d.fp[0];
        dec_ceil(&lo.d);
        if (!lo.incl && was_int)
            dec_add1(&lo.d);
    }
    if (hi.set) {
        bool was_int = !hi.d.fp[0];
        dec_floor(&hi.d);
        if (!hi.incl && was_int)
            dec_sub1(&hi.d);
    }
    if (lo.set && hi.set && dec_cmp(&lo.d, &hi.d) > 0)
        return no_number(g);
    struct dray_srv_buf body = {0};
    int n = 0;
    struct dec zero = {0}, one = {0};
    strcpy(zero.ip, "0");
    strcpy(one.ip, "1");
    if ((!lo.set || dec_cmp(&lo.d, &zero) <= 0) && (!hi.set || dec_cmp(&hi.d, &zero) >= 0)) {
        jg_put(g, &body, " \"0\"");
        n++;
    }
    if (!hi.set || dec_cmp(&hi.d, &one) >= 0) { /* positive */
        const struct dec *a = lo.set && dec_cmp(&lo.d, &one) > 0 ? &lo.d : &one;
        if (n++)
            jg_put(g, &body, " |");
        int_range(g, &body, a->ip, hi.set ? hi.d.ip : NULL);
    }
    if (!lo.set || lo.d.neg) { /* negative: magnitudes from max(-hi, 1) to -lo */
        const struct dec *a = hi.set && hi.d.neg ? &hi.d : &one;
        if (n++)
            jg_put(g, &body, " |");
        jg_put(g, &body, " \"-\"");
        int_range(g, &body, a->ip, lo.set ? lo.d.ip : NULL);
    }
    struct dray_srv_buf wrapped = {0};
    jg_put(g, &wrapped, n > 1 ? "(" : "");
    jg_putn(g, &wrapped, body.data, body.len);
    jg_put(g, &wrapped, n > 1 ? " )" : "");
    int rc = jg_rule_of(g, "int", &wrapped, out);
    dray_srv_buf_free(&body);
    dray_srv_buf_free(&wrapped);
    return rc;
}

int jg_number(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    struct bound lo, hi;
    if (read_bounds(g, s, &lo, &hi))
        return -1;
    if (!lo.set && !hi.set) {
        jg_prim(g, out, P_NUMBER);
        return 0;
    }
    if (strlen(lo.d.ip) > DEC_DIGITS - 2 || strlen(lo.d.fp) > DEC_DIGITS - 2 ||
        strlen(hi.d.ip) > DEC_DIGITS - 2 || strlen(hi.d.fp) > DEC_DIGITS - 2)
        return jg_bad(g, NULL, "a bound with more than %d digits is not supported", DEC_DIGITS - 2);
    if (lo.set && hi.set) {
        int c = dec_cmp(&lo.d, &hi.d);
        if (c > 0 || (c == 0 && !(lo.incl && hi.incl)))
            return no_number(g);
    }
    struct dec zero = {0};
    strcpy(zero.ip, "0");
    struct dray_srv_buf body = {0}, t = {0};
    int n = 0;
    int lc = lo.set ? dec_cmp(&lo.d, &zero) : -1, hc = hi.set ? dec_cmp(&hi.d, &zero) : 1;
    if ((lc < 0 || (lc == 0 && lo.incl)) && (hc > 0 || (hc == 0 && hi.incl))) {
        jg_put(g, &body, " \"0\" ( \".\" \"0\"+ )?");
        n++;
    }
    if (hc > 0) { /* positive */
        const struct dec *a = lc > 0 ? &lo.d : &zero;
        int aop = lc > 0 ? (lo.incl ? F_GE : F_GT) : F_GT;
        if (num_mag(g, &t, a, aop, hi.set ? &hi.d : NULL, hi.incl ? F_LE : F_LT)) {
            if (n++)
                jg_put(g, &body, " |");
            jg_put_buf(g, &body, &t);
        }
    }
    if (lc < 0) { /* negative: magnitudes above max(-hi, 0), up to -lo */
        const struct dec *a = hc < 0 ? &hi.d : &zero;
        int aop = hc < 0 ? (hi.incl ? F_GE : F_GT) : F_GT;
        if (num_mag(g, &t, a, aop, lo.set ? &lo.d : NULL, lo.incl ? F_LE : F_LT)) {
            if (n++)
                jg_put(g, &body, " |");
            jg_put(g, &body, " \"-\"");
            jg_put_buf(g, &body, &t);
        }
    }
    int rc;
    if (!n) {
        rc = no_number(g);
    } else {
        struct dray_srv_buf wrapped = {0};
        jg_put(g, &wrapped, n > 1 ? "(" : "");
        jg_putn(g, &wrapped, body.data, body.len);
        jg_put(g, &wrapped, n > 1 ? " )" : "");
        rc = jg_rule_of(g, "num", &wrapped, out);
        dray_srv_buf_free(&wrapped);
    }
    dray_srv_buf_free(&body);
    dray_srv_buf_free(&t);
    return rc;
}

