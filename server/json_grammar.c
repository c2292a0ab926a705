/* server/json_grammar.c — JSON Schema to GBNF (json_grammar.h): the walk over
 * the schema, enums, $ref, and the API. Strings, objects and arrays are
 * json_values.c's, patterns and character sets json_pattern.c's, numeric bounds
 * json_range.c's; the four share json_grammar_gen.h.
 *
 * One pass over the schema: each subschema becomes an expression (a shared
 * rule's name, or a rule of its own), written into rules named
 * "<prefix>-<what>-<n>". The shared rules (ws, string, number, ...) are appended
 * at the end, those used only. Every keyword is either known and enforced, an
 * annotation, or refused. */
#include "json_grammar.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jfield.h"
#include "json_grammar_gen.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* ------------------------------------------------------------ primitives */

/* Rule bodies: '@' stands for the rule-name prefix ("tool0-", or nothing). */
static const struct prim {
    const char *name;
    unsigned deps;
    const char *body;
} prims[P_COUNT] = {
    [P_WS] = {"ws", 0, "[ \\t\\n]{0," STR(DRAY_SRV_JSON_WS_MAX) "}"},
    [P_HEX] = {"hex", 0, "[0-9a-fA-F]"},
    /* one character of a JSON string: unescaped, a short escape, or \uXXXX (a
     * surrogate only as a pair) */
    [P_CHAR] = {"char", BIT(P_HEX),
                "[^\\x22\\x5C\\x00-\\x1F] | \"\\\\\" ( [\\x22\\x5C/bfnrt] | \"u\" ( "
                "[0-9a-cA-CeEfF] @hex{3} | [dD] [0-7] @hex{2} | "
                "[dD] [89abAB] @hex{2} \"\\\\u\" [dD] [c-fC-F] @hex{2} ) )"},
    [P_STRING] = {"string", BIT(P_CHAR), "\"\\\"\" @char* \"\\\"\""},
    [P_INTEGER] = {"integer", 0, "\"-\"? ( \"0\" | [1-9] [0-9]* )"},
    [P_NUMBER] = {"number", 0,
                  "\"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? "
                  "( [eE] ( \"-\" | \"+\" )? [0-9]+ )?"},
    [P_BOOLEAN] = {"boolean", 0, "\"true\" | \"false\""},
    [P_NULL] = {"null", 0, "\"null\""},
    [P_VALUE] = {"value",
                 BIT(P_OBJECT) | BIT(P_ARRAY) | BIT(P_STRING) | BIT(P_NUMBER) | BIT(P_BOOLEAN) |
                     BIT(P_NULL),
                 "@object | @array | @string | @number | @boolean | @null"},
    [P_OBJECT] = {"object", BIT(P_WS) | BIT(P_STRING) | BIT(P_VALUE),
                  "\"{\" @ws ( @string @ws \":\" @ws @value "
                  "( @ws \",\" @ws @string @ws \":\" @ws @value )* @ws )? \"}\""},
    [P_ARRAY] = {"array", BIT(P_WS) | BIT(P_VALUE),
                 "\"[\" @ws ( @value ( @ws \",\" @ws @value )* @ws )? \"]\""},
    /* RFC 3339 full-date, days per month, 29 February in leap years only */
    [P_DATE] = {"date", BIT(P_DLEAP),
                "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" "
                "( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
                "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | "
                "\"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | @date-leap \"-02-29\""},
    [P_DLEAP] = {"date-leap", 0,
                 "[0-9]{2} ( [02468] [48] | [13579] [26] | [2468] \"0\" ) | "
                 "( [02468] [048] | [13579] [26] ) \"00\""},
    /* RFC 3339 full-time; seconds 00-59 (no leap second), "T" and "Z" upper case */
    [P_TIME] = {"time", 0,
                "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                "( \".\" [0-9]+ )? ( \"Z\" | ( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) "
                "\":\" [0-5] [0-9] )"},
    [P_DATETIME] = {"date-time", BIT(P_DATE) | BIT(P_TIME), "@date \"T\" @time"},
    [P_UUID] = {"uuid", BIT(P_HEX),
                "@hex{8} \"-\" @hex{4} \"-\" @hex{4} \"-\" @hex{4} \"-\" @hex{12}"},
};

/* ------------------------------------------------------------ the generator */

int jg_oom(struct gen *g)
{
    g->oom = true;
    return dray_srv_fail(g->e, 500, "server_error", NULL, NULL, "out of memory");
}

/* 400 naming path.kw (kw NULL: the subschema itself) */
__attribute__((format(printf, 3, 4))) int jg_bad(struct gen *g, const char *kw,
                                                     const char *fmt, ...)
{
    char param[1200], msg[400];
    snprintf(param, sizeof(param), "%s%s%s", g->path, kw && g->plen ? "." : "", kw ? kw : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* a path too long for the param field keeps its end: the keyword */
    char shortp[sizeof(g->e->param)];
    size_t n = strlen(param);
    if (n < sizeof(shortp))
        memcpy(shortp, param, n + 1);
    else
        snprintf(shortp, sizeof(shortp), "...%s", param + n - (sizeof(shortp) - 4));
    return dray_srv_bad(g->e, shortp, "%s: %s", param, msg);
}

void jg_path_pop(struct gen *g, size_t old)
{
    g->plen = old;
    g->path[old] = '\0';
}

void jg_put(struct gen *g, struct dray_srv_buf *b, const char *s)
{
    if (dray_srv_buf_add(b, s, strlen(s)))
        g->oom = true;
}

void jg_putn(struct gen *g, struct dray_srv_buf *b, const char *s, size_t n)
{
    if (n && dray_srv_buf_add(b, s, n))
        g->oom = true;
}

__attribute__((format(printf, 3, 4))) void jg_putf(struct gen *g, struct dray_srv_buf *b,
                                                       const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        jg_putn(g, b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* append b2 (then emptied) */
void jg_put_buf(struct gen *g, struct dray_srv_buf *b, struct dray_srv_buf *b2)
{
    jg_putn(g, b, b2->data, b2->len);
    dray_srv_buf_reset(b2);
}

/* a primitive's rule name */
void jg_prim(struct gen *g, struct dray_srv_buf *b, int p)
{
    g->used |= BIT(p);
    jg_put(g, b, g->prefix);
    jg_put(g, b, prims[p].name);
}

/* A fresh rule name: prefix + hint + "-" + n */
void jg_new_name(struct gen *g, const char *hint, char *name, size_t n)
{
    snprintf(name, n, "%s%s-%u", g->prefix, hint, g->n_rules++);
}

/* The grammar engine copies x{m,n}'s item n times (an optional copy costs a few
 * elements more): count what that comes to (items: the item's tokens) so that a
 * schema the engine would refuse as too large is refused here, naming the
 * schema. max -1: unbounded. */
#define EXPAND_MAX 40000

void jg_charge(struct gen *g, long min, long max, size_t items)
{
    g->expanded += min * (long)items + (max < 0 ? 1 : max - min) * (long)(items + 3);
}

size_t jg_tokens(const char *s, size_t n)
{
    size_t k = 1;
    for (size_t i = 0; i < n; i++)
        k += s[i] == ' ';
    return k;
}

/* name ::= body, at the end of the rules; 400 once they pass the size limit */
int jg_emit_rule(struct gen *g, const char *name, const struct dray_srv_buf *body)
{
    jg_put(g, &g->rules, name);
    jg_put(g, &g->rules, " ::= ");
    jg_putn(g, &g->rules, body->data, body->len);
    jg_put(g, &g->rules, "\n");
    if (g->oom)
        return jg_oom(g);
    if (g->rules.len > DRAY_SRV_GRAMMAR_MAX)
        return jg_bad(g, NULL, "the schema's grammar is larger than this server accepts "
                   "(%d KiB): simplify the schema", DRAY_SRV_GRAMMAR_MAX / 1024);
    if (g->expanded > EXPAND_MAX)
        return jg_bad(g, NULL, "the schema's repetitions (maxLength, maxItems, {m,n} in "
                   "patterns, ...) add up to more than this server accepts: lower them");
    return 0;
}

/* body as a rule of its own; its name appended to out */
int jg_rule_of(struct gen *g, const char *hint, struct dray_srv_buf *body,
                   struct dray_srv_buf *out)
{
    char name[96];
    jg_new_name(g, hint, name, sizeof(name));
    if (jg_emit_rule(g, name, body))
        return -1;
    jg_put(g, out, name);
    return 0;
}

/* ------------------------------------------------------------ literals */

/* a GBNF string literal of the bytes s[0..n) (UTF-8 passes as it is) */
void jg_lit(struct gen *g, struct dray_srv_buf *b, const char *s, size_t n)
{
    jg_put(g, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            jg_putf(g, b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            jg_putf(g, b, "\\x%02X", c);
        else
            jg_putn(g, b, (const char *)&c, 1);
    }
    jg_put(g, b, "\"");
}

/* the JSON spelling of string s[0..n), quotes included, as an encoder writes it */
void jg_json_spell(struct gen *g, struct dray_srv_buf *b, const char *s, size_t n)
{
    jg_put(g, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : NULL;
        if (esc)
            jg_put(g, b, esc);
        else if (c < 0x20)
            jg_putf(g, b, "\\u%04x", c);
        else
            jg_putn(g, b, (const char *)&c, 1);
    }
    jg_put(g, b, "\"");
}

/* The shortest %g spelling that reads back as v */
static void real_spell(char *out, size_t n, double v)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(out, n, "%.*g", p, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* v (an enum or const value) as GBNF: its tokens as an encoder writes them,
 * whitespace allowed between them as everywhere else */
static void value_lit(struct gen *g, struct dray_srv_buf *b, json_t *v)
{
    struct dray_srv_buf t = {0};
    char tmp[40];
    size_t i;
    const char *key;
    json_t *x;
    switch (json_typeof(v)) {
    case JSON_NULL: jg_put(g, b, "\"null\""); break;
    case JSON_TRUE: jg_put(g, b, "\"true\""); break;
    case JSON_FALSE: jg_put(g, b, "\"false\""); break;
    case JSON_INTEGER: jg_putf(g, b, "\"%" JSON_INTEGER_FORMAT "\"", json_integer_value(v)); break;
    case JSON_REAL:
        real_spell(tmp, sizeof(tmp), json_real_value(v));
        jg_lit(g, b, tmp, strlen(tmp));
        break;
    case JSON_STRING:
        jg_json_spell(g, &t, json_string_value(v), json_string_length(v));
        jg_lit(g, b, t.data, t.len);
        break;
    case JSON_ARRAY:
        jg_put(g, b, "\"[\" ");
        jg_prim(g, b, P_WS);
        json_array_foreach(v, i, x) {
            if (i) {
                jg_put(g, b, " \",\" ");
                jg_prim(g, b, P_WS);
            }
            jg_put(g, b, " ");
            value_lit(g, b, x);
            jg_put(g, b, " ");
            jg_prim(g, b, P_WS);
        }
        jg_put(g, b, " \"]\"");
        break;
    case JSON_OBJECT:
        jg_put(g, b, "\"{\" ");
        jg_prim(g, b, P_WS);
        i = 0;
        json_object_foreach(v, key, x) {
            if (i++) {
                jg_put(g, b, " \",\" ");
                jg_prim(g, b, P_WS);
            }
            jg_put(g, b, " ");
            jg_json_spell(g, &t, key, strlen(key));
            jg_lit(g, b, t.data, t.len);
            dray_srv_buf_reset(&t);
            jg_put(g, b, " ");
            jg_prim(g, b, P_WS);
            jg_put(g, b, " \":\" ");
            jg_prim(g, b, P_WS);
            jg_put(g, b, " ");
            value_lit(g, b, x);
            jg_put(g, b, " ");
            jg_prim(g, b, P_WS);
        }
        jg_put(g, b, " \"}\"");
        break;
    }
    dray_srv_buf_free(&t);
}

/* s's expression, with path += fmt while at it */
__attribute__((format(printf, 4, 5))) int jg_at(struct gen *g, json_t *s,
                                                        struct dray_srv_buf *out,
                                                        const char *fmt, ...)
{
    size_t old = g->plen;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g->path + g->plen, sizeof(g->path) - g->plen, fmt, ap);
    va_end(ap);
    if (n > 0)
        g->plen += (size_t)n < sizeof(g->path) - g->plen ? (size_t)n
                                                         : sizeof(g->path) - 1 - g->plen;
    int rc = jg_schema(g, s, out);
    jg_path_pop(g, old);
    return rc;
}

/* ------------------------------------------------------------ keywords */

enum {
    T_NULL = 1, T_BOOLEAN = 2, T_OBJECT = 4, T_ARRAY = 8, T_NUMBER = 16, T_INTEGER = 32,
    T_STRING = 64
};

static const struct {
    const char *name;
    unsigned bit;
} types[] = {{"null", T_NULL}, {"boolean", T_BOOLEAN}, {"object", T_OBJECT}, {"array", T_ARRAY},
             {"number", T_NUMBER}, {"integer", T_INTEGER}, {"string", T_STRING}};

/* Keywords that constrain: each names the type it applies to (0: any) */
static const struct {
    const char *kw;
    unsigned type;
} keywords[] = {
    {"type", 0}, {"enum", 0}, {"const", 0}, {"anyOf", 0}, {"oneOf", 0}, {"allOf", 0},
    {"$ref", 0}, {"properties", T_OBJECT}, {"required", T_OBJECT},
    {"additionalProperties", T_OBJECT}, {"items", T_ARRAY}, {"prefixItems", T_ARRAY},
    {"minItems", T_ARRAY}, {"maxItems", T_ARRAY}, {"uniqueItems", T_ARRAY},
    {"minimum", T_NUMBER}, {"maximum", T_NUMBER}, {"exclusiveMinimum", T_NUMBER},
    {"exclusiveMaximum", T_NUMBER}, {"minLength", T_STRING}, {"maxLength", T_STRING},
    {"pattern", T_STRING}, {"format", T_STRING},
};
#define N_KEYWORDS (sizeof(keywords) / sizeof(keywords[0]))

/* Keywords that do not constrain (discriminator: OpenAPI's hint beside a
 * oneOf, which pydantic writes for tagged unions; the branches do the checking) */
static const char *const annotations[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "discriminator",
};

static int keyword_index(const char *k)
{
    for (size_t i = 0; i < N_KEYWORDS; i++)
        if (!strcmp(k, keywords[i].kw))
            return (int)i;
    return -1;
}

static bool is_annotation(const char *k)
{
    for (size_t i = 0; i < sizeof(annotations) / sizeof(annotations[0]); i++)
        if (!strcmp(k, annotations[i]))
            return true;
    return false;
}

static bool type_has(json_t *v, unsigned t)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return t & T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return t & T_BOOLEAN;
    case JSON_OBJECT: return t & T_OBJECT;
    case JSON_ARRAY: return t & T_ARRAY;
    case JSON_STRING: return t & T_STRING;
    case JSON_INTEGER: return t & (T_NUMBER | T_INTEGER);
    case JSON_REAL:
        return (t & T_NUMBER) ||
               ((t & T_INTEGER) && json_real_value(v) == floor(json_real_value(v)));
    }
    return false;
}

static int read_type(struct gen *g, json_t *t, unsigned *out)
{
    *out = 0;
    if (!json_is_string(t) && !(json_is_array(t) && json_array_size(t) > 0))
        return jg_bad(g, "type", "must be a type name or a non-empty array of them, got %s",
                   dray_srv_kind_of(t));
    size_t n = json_is_string(t) ? 1 : json_array_size(t);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_string(t) ? t : json_array_get(t, i);
        size_t k = 0;
        while (k < 7 && !(json_is_string(x) && !strcmp(json_string_value(x), types[k].name)))
            k++;
        if (k == 7)
            return jg_bad(g, "type", "%s%.40s%s is not a JSON Schema type (\"string\", "
                       "\"integer\", \"number\", \"boolean\", \"null\", \"object\" or "
                       "\"array\")",
                       json_is_string(x) ? "\"" : "", json_is_string(x) ? json_string_value(x)
                       : dray_srv_kind_of(x), json_is_string(x) ? "\"" : "");
        *out |= types[k].bit;
    }
    return 0;
}

static int gen_enum(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"), *t;
    unsigned allow = T_NULL | T_BOOLEAN | T_OBJECT | T_ARRAY | T_NUMBER | T_STRING;
    if (en && cn)
        return jg_bad(g, "const", "together with enum is not supported");
    if ((t = json_object_get(s, "type")) && read_type(g, t, &allow))
        return -1;
    if (en && (!json_is_array(en) || !json_array_size(en)))
        return jg_bad(g, "enum", "must be a non-empty array, got %s", dray_srv_kind_of(en));
    size_t n = en ? json_array_size(en) : 1, k = 0;
    struct dray_srv_buf body = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *v = en ? json_array_get(en, i) : cn;
        if (!type_has(v, allow))
            continue;
        if (k++)
            jg_put(g, &body, " | ");
        value_lit(g, &body, v);
    }
    int rc = k ? jg_rule_of(g, en ? "enum" : "const", &body, out)
               : jg_bad(g, en ? "enum" : "const", "no value is of the schema's type: nothing "
                     "satisfies the schema");
    dray_srv_buf_free(&body);
    return rc;
}

/* "#", "#/$defs/NAME" or "#/definitions/NAME" (JSON pointer escapes, %XX) */
static int resolve_ref(struct gen *g, const char *ref, json_t **target, char *where, size_t wn)
{
    if (!strcmp(ref, "#")) {
        *target = g->root;
        where[0] = '\0';
        return 0;
    }
    const char *section = NULL;
    if (!strncmp(ref, "#/$defs/", 8))
        section = "$defs";
    else if (!strncmp(ref, "#/definitions/", 14))
        section = "definitions";
    if (!section)
        return jg_bad(g, "$ref", "\"%.80s\" is not supported: only \"#\", \"#/$defs/NAME\" and "
                   "\"#/definitions/NAME\" are", ref);
    const char *s = ref + strlen(section) + 3;
    char name[256];
    size_t n = 0;
    for (; *s && n + 1 < sizeof(name); s++) {
        if (*s == '/')
            return jg_bad(g, "$ref", "\"%.80s\": a pointer into a definition is not supported, "
                       "only \"#/%s/NAME\"", ref, section);
        if (*s == '~' && (s[1] == '0' || s[1] == '1')) {
            name[n++] = s[1] == '0' ? '~' : '/';
            s++;
        } else if (*s == '%' && jg_hexval(s[1]) >= 0 && jg_hexval(s[2]) >= 0) {
            name[n++] = (char)(jg_hexval(s[1]) * 16 + jg_hexval(s[2]));
            s += 2;
        } else {
            name[n++] = *s;
        }
    }
    name[n] = '\0';
    json_t *defs = json_object_get(g->root, section);
    *target = json_is_object(defs) ? json_object_get(defs, name) : NULL;
    if (!*target)
        return jg_bad(g, "$ref", "\"%.80s\" names no definition in the schema's \"%s\"", ref,
                   section);
    snprintf(where, wn, ".%s.%s", section, name);
    return 0;
}

static int gen_ref(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    json_t *ref = json_object_get(s, "$ref"), *target;
    char where[300];
    if (!json_is_string(ref))
        return jg_bad(g, "$ref", "must be a string, got %s", dray_srv_kind_of(ref));
    if (resolve_ref(g, json_string_value(ref), &target, where, sizeof(where)))
        return -1;
    for (size_t i = 0; i < g->n_defs; i++) {
        struct gdef *d = &g->defs[i];
        if (d->target != target)
            continue;
        if (!d->done && d->level == g->level)
            return jg_bad(g, "$ref", "\"%.80s\" refers back to a schema that encloses it with no "
                       "object or array between (left recursion: it would match forever)",
                       json_string_value(ref));
        jg_put(g, out, d->name);
        return 0;
    }
    if (g->n_defs == g->cap_defs) {
        size_t cap = g->cap_defs ? 2 * g->cap_defs : 8;
        struct gdef *d = realloc(g->defs, cap * sizeof(*d));
        if (!d)
            return jg_oom(g);
        g->defs = d;
        g->cap_defs = cap;
    }
    size_t di = g->n_defs++;
    struct gdef *d = &g->defs[di];
    d->target = target;
    d->done = false;
    d->level = g->level;
    /* the rule's name: the definition's, as far as a rule name can spell it */
    char hint[32] = "def-";
    const char *nm = strrchr(where, '.');
    nm = nm ? nm + 1 : "root";
    size_t h = 4;
    for (; *nm && h + 1 < 24; nm++)
        if ((*nm >= 'a' && *nm <= 'z') || (*nm >= 'A' && *nm <= 'Z') || (*nm >= '0' && *nm <= '9'))
            hint[h++] = *nm;
    hint[h] = '\0';
    jg_new_name(g, hint, d->name, sizeof(d->name));
    /* errors inside the definition name it where it is written */
    char saved[sizeof(g->path)];
    size_t saved_len = g->plen;
    memcpy(saved, g->path, g->plen + 1);
    struct dray_srv_buf body = {0};
    snprintf(g->path, sizeof(g->path), "%s%s", g->base, where);
    g->plen = strlen(g->path);
    int rc = jg_schema(g, target, &body);
    memcpy(g->path, saved, saved_len + 1);
    g->plen = saved_len;
    if (!rc)
        rc = jg_emit_rule(g, g->defs[di].name, &body);
    dray_srv_buf_free(&body);
    if (rc)
        return -1;
    g->defs[di].done = true;
    jg_put(g, out, g->defs[di].name);
    return 0;
}

static int gen_any_of(struct gen *g, json_t *s, const char *kw, struct dray_srv_buf *out)
{
    json_t *arr = json_object_get(s, kw), *v;
    size_t i;
    if (!json_is_array(arr) || !json_array_size(arr))
        return jg_bad(g, kw, "must be a non-empty array of schemas, got %s", dray_srv_kind_of(arr));
    if (!strcmp(kw, "allOf")) {
        if (json_array_size(arr) > 1)
            return jg_bad(g, kw, "with more than one schema is not supported (merge them into "
                       "one)");
        return jg_at(g, json_array_get(arr, 0), out, ".allOf[0]");
    }
    struct dray_srv_buf body = {0};
    json_array_foreach(arr, i, v) {
        if (i)
            jg_put(g, &body, " | ");
        if (jg_at(g, v, &body, ".%s[%zu]", kw, i)) {
            dray_srv_buf_free(&body);
            return -1;
        }
    }
    int rc = jg_rule_of(g, "alt", &body, out);
    dray_srv_buf_free(&body);
    return rc;
}

int jg_schema(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    if (json_is_true(s)) {
        jg_prim(g, out, P_VALUE);
        return 0;
    }
    if (json_is_false(s))
        return jg_bad(g, NULL, "the schema false matches nothing");
    if (!json_is_object(s))
        return jg_bad(g, NULL, "a schema must be an object or a boolean, got %s",
                   dray_srv_kind_of(s));
    if (++g->depth > DRAY_SRV_SCHEMA_MAX_DEPTH) {
        g->depth--;
        return jg_bad(g, NULL, "schemas nested more than %d deep are not supported",
                   DRAY_SRV_SCHEMA_MAX_DEPTH);
    }
    int rc = -1;
    const char *key, *combinator = NULL, *other = NULL;
    json_t *v;
    unsigned implied = 0;
    json_object_foreach(s, key, v) {
        int k = keyword_index(key);
        if (k < 0) {
            if (!is_annotation(key)) {
                rc = jg_bad(g, key, "the keyword '%.60s' is not supported", key);
                goto done;
            }
            if (!strcmp(key, "$id") && s != g->root) {
                rc = jg_bad(g, key, "$id on a subschema (a new base for $ref) is not supported");
                goto done;
            }
            continue;
        }
        if (!strcmp(key, "uniqueItems") && !json_is_false(v)) {
            rc = jg_bad(g, key, "uniqueItems true is not supported");
            goto done;
        }
        if (!strcmp(key, "$ref") || !strcmp(key, "anyOf") || !strcmp(key, "oneOf") ||
            !strcmp(key, "allOf")) {
            if (combinator) {
                rc = jg_bad(g, key, "together with %s is not supported", combinator);
                goto done;
            }
            combinator = key;
        } else if (strcmp(key, "uniqueItems")) {
            if (!other)
                other = key;
            implied |= keywords[k].type;
        }
    }
    if (combinator) {
        if (other) {
            rc = jg_bad(g, other, "alongside %s is not supported (only annotations may be)",
                     combinator);
            goto done;
        }
        rc = !strcmp(combinator, "$ref") ? gen_ref(g, s, out) : gen_any_of(g, s, combinator, out);
        goto done;
    }
    if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        json_object_foreach(s, key, v) {
            if (keyword_index(key) >= 0 && strcmp(key, "enum") && strcmp(key, "const") &&
                strcmp(key, "type") && strcmp(key, "uniqueItems")) {
                rc = jg_bad(g, key, "alongside %s is not supported (only type and annotations "
                         "may be)", json_object_get(s, "enum") ? "enum" : "const");
                goto done;
            }
        }
        rc = gen_enum(g, s, out);
        goto done;
    }
    unsigned t;
    json_t *tv = json_object_get(s, "type");
    if (tv) {
        if (read_type(g, tv, &t))
            goto done;
    } else if (implied) {
        /* no type: the types the keywords constrain (a tightening of JSON Schema,
         * where the other types would pass unchecked) */
        t = implied;
    } else {
        jg_prim(g, out, P_VALUE);
        rc = 0;
        goto done;
    }
    if (t & T_NUMBER)
        t &= ~(unsigned)T_INTEGER;
    struct dray_srv_buf body = {0};
    int n = 0;
    rc = 0;
    for (size_t i = 0; i < 7 && !rc; i++) {
        unsigned bit = types[i].bit;
        if (!(t & bit))
            continue;
        if (n++)
            jg_put(g, &body, " | ");
        switch (bit) {
        case T_NULL: jg_prim(g, &body, P_NULL); break;
        case T_BOOLEAN: jg_prim(g, &body, P_BOOLEAN); break;
        case T_OBJECT: rc = jg_object(g, s, &body); break;
        case T_ARRAY: rc = jg_array(g, s, &body); break;
        case T_NUMBER: rc = jg_number(g, s, &body); break;
        case T_INTEGER: rc = jg_integer(g, s, &body); break;
        default: rc = jg_string(g, s, &body); break;
        }
    }
    if (!rc) {
        if (n > 1) {
            jg_put(g, out, "( ");
            jg_put_buf(g, out, &body);
            jg_put(g, out, " )");
        } else {
            jg_put_buf(g, out, &body);
        }
    }
    dray_srv_buf_free(&body);
done:
    g->depth--;
    if (!rc && g->oom)
        rc = jg_oom(g);
    return rc;
}

/* ------------------------------------------------------------ the API */

static int generate(json_t *schema, const char *prefix, const char *param,
                    struct dray_srv_buf *out, struct dray_srv_error *e)
{
    struct gen g = {.root = schema, .e = e};
    snprintf(g.prefix, sizeof(g.prefix), "%s%s", prefix, *prefix ? "-" : "");
    snprintf(g.entry, sizeof(g.entry), "%s", *prefix ? prefix : "root");
    snprintf(g.base, sizeof(g.base), "%s", param ? param : "");
    snprintf(g.path, sizeof(g.path), "%s", g.base);
    g.plen = strlen(g.path);
    struct dray_srv_buf body = {0};
    int rc = -1;
    if (!schema)
        return jg_bad(&g, NULL, "the schema is missing");
    /* the root is a definition too: "$ref": "#" recurses to it */
    g.defs = malloc(8 * sizeof(*g.defs));
    if (!g.defs)
        return jg_oom(&g);
    g.cap_defs = 8;
    g.n_defs = 1;
    g.defs[0] = (struct gdef){.target = schema, .done = false, .level = 0};
    snprintf(g.defs[0].name, sizeof(g.defs[0].name), "%s", g.entry);
    if (jg_schema(&g, schema, &body) || jg_emit_rule(&g, g.entry, &body))
        goto done;
    /* the primitives used, and those they use */
    unsigned used = g.used, prev;
    do {
        prev = used;
        for (int p = 0; p < P_COUNT; p++)
            if (used & BIT(p))
                used |= prims[p].deps;
    } while (used != prev);
    for (int p = 0; p < P_COUNT; p++) {
        if (!(used & BIT(p)))
            continue;
        jg_put(&g, &g.rules, g.prefix);
        jg_put(&g, &g.rules, prims[p].name);
        jg_put(&g, &g.rules, " ::= ");
        for (const char *c = prims[p].body; *c; c++)
            if (*c == '@')
                jg_put(&g, &g.rules, g.prefix);
            else
                jg_putn(&g, &g.rules, c, 1);
        jg_put(&g, &g.rules, "\n");
    }
    if (g.oom) {
        jg_oom(&g);
        goto done;
    }
    if (g.rules.len > DRAY_SRV_GRAMMAR_MAX) {
        snprintf(g.path, sizeof(g.path), "%s", g.base);
        g.plen = strlen(g.path);
        jg_bad(&g, NULL, "the schema's grammar is larger than this server accepts (%d KiB): "
            "simplify the schema", DRAY_SRV_GRAMMAR_MAX / 1024);
        goto done;
    }
    if (dray_srv_buf_add(out, g.rules.data, g.rules.len)) {
        jg_oom(&g);
        goto done;
    }
    rc = 0;
done:
    dray_srv_buf_free(&body);
    dray_srv_buf_free(&g.rules);
    free(g.defs);
    return rc;
}

int dray_srv_schema_rules(json_t *schema, const char *prefix, const char *param,
                          struct dray_srv_buf *out, struct dray_srv_error *e)
{
    size_t n = prefix ? strlen(prefix) : 0;
    bool ok = n > 0 && n < 40;
    for (size_t i = 0; i < n; i++) {
        char c = prefix[i];
        ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_');
    }
    if (!ok)
        return dray_srv_fail(e, 500, "server_error", NULL, NULL,
                             "internal error: grammar rule prefix \"%.40s\" is not [a-zA-Z0-9_]+",
                             prefix ? prefix : "(null)");
    return generate(schema, prefix, param, out, e);
}

int dray_srv_schema_grammar(json_t *schema, const char *param, char **gbnf,
                            struct dray_srv_error *e)
{
    struct dray_srv_buf b = {0};
    *gbnf = NULL;
    if (generate(schema, "", param, &b, e)) {
        dray_srv_buf_free(&b);
        return -1;
    }
    *gbnf = b.data;
    return 0;
}

static pthread_once_t object_once = PTHREAD_ONCE_INIT;
static char *object_grammar;

static void object_init(void)
{
    json_t *s = json_pack("{s:s}", "type", "object");
    struct dray_srv_error e;
    if (s && dray_srv_schema_grammar(s, "", &object_grammar, &e))
        object_grammar = NULL;
    json_decref(s);
}

const char *dray_srv_json_object_grammar(void)
{
    pthread_once(&object_once, object_init);
    return object_grammar;
}

int dray_srv_response_format_grammar(json_t *rf, char **gbnf, struct dray_srv_error *e)
{
    *gbnf = NULL;
    json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL, *v;
    const char *key;
    if (!json_is_string(type))
        return dray_srv_bad(e, "response_format", "'response_format' must be an object with a "
                            "'type' string, got %s", dray_srv_kind_of(rf));
    const char *t = json_string_value(type);
    bool schema = !strcmp(t, "json_schema");
    if (strcmp(t, "text") && strcmp(t, "json_object") && !schema)
        return dray_srv_bad(e, "response_format.type", "'response_format.type' must be "
                            "\"text\", \"json_object\" or \"json_schema\", got \"%.40s\"", t);
    json_object_foreach(rf, key, v) {
        if (strcmp(key, "type") && !(schema && !strcmp(key, "json_schema")) && !json_is_null(v)) {
            char param[96];
            snprintf(param, sizeof(param), "response_format.%.60s", key);
            return dray_srv_bad(e, param, "Unrecognized request argument supplied: %s", param);
        }
    }
    if (!strcmp(t, "text"))
        return 0;
    if (!schema) {
        const char *g = dray_srv_json_object_grammar();
        if (!g || !(*gbnf = strdup(g)))
            return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return 0;
    }
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return dray_srv_bad(e, "response_format.json_schema", "'response_format.json_schema' "
                            "must be an object with 'name' and 'schema', got %s",
                            js ? dray_srv_kind_of(js) : "nothing");
    json_object_foreach(js, key, v) {
        char param[96];
        snprintf(param, sizeof(param), "response_format.json_schema.%.40s", key);
        if (json_is_null(v))
            continue;
        if (!strcmp(key, "name") || !strcmp(key, "description")) {
            if (!json_is_string(v))
                return dray_srv_bad(e, param, "'%s' must be a string, got %s", param,
                                    dray_srv_kind_of(v));
        } else if (!strcmp(key, "strict")) {
            if (!json_is_boolean(v))
                return dray_srv_bad(e, param, "'%s' must be a boolean, got %s", param,
                                    dray_srv_kind_of(v));
        } else if (strcmp(key, "schema")) {
            return dray_srv_bad(e, param, "Unrecognized request argument supplied: %s", param);
        }
    }
    if (!json_is_string(json_object_get(js, "name")))
        return dray_srv_bad(e, "response_format.json_schema.name",
                            "'response_format.json_schema.name' is required: a string");
    json_t *sch = json_object_get(js, "schema");
    if (!sch || json_is_null(sch)) { /* no schema: any JSON object, as OpenAI takes it */
        const char *g = dray_srv_json_object_grammar();
        if (!g || !(*gbnf = strdup(g)))
            return dray_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return 0;
    }
    return dray_srv_schema_grammar(sch, "response_format.json_schema.schema", gbnf, e);
}
