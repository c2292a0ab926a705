/* server/json_grammar_gen.h — the JSON Schema converter's own header: the
 * generator's state and the helpers its three files share: json_grammar.c
 * (schemas, the API), json_pattern.c (character sets, pattern) and
 * json_range.c (numeric bounds). Nothing else includes it. */
#ifndef DRAY_SERVER_JSON_GRAMMAR_GEN_H
#define DRAY_SERVER_JSON_GRAMMAR_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "apierr.h"
#include "buf.h"

/* The shared rules (json_grammar.c has their bodies), emitted when used */
enum {
    P_WS, P_HEX, P_CHAR, P_STRING, P_INTEGER, P_NUMBER, P_BOOLEAN, P_NULL, P_VALUE, P_OBJECT,
    P_ARRAY, P_DATE, P_DLEAP, P_TIME, P_DATETIME, P_UUID, P_COUNT
};
#define BIT(p) (1u << (p))

struct gdef {
    json_t *target;  /* the schema a $ref names */
    char name[96];   /* its rule */
    bool done;       /* false: being written (a $ref to it now is recursion) */
    int level;       /* g->level when it was started */
};

struct gen {
    json_t *root;
    char prefix[64];      /* "tool0-" or "" */
    char entry[64];       /* the start rule: "root", or the caller's prefix */
    char base[256];       /* the param of the whole schema */
    struct dray_srv_buf rules;
    unsigned used;        /* BIT(P_*) */
    unsigned n_rules;
    struct gdef *defs;
    size_t n_defs, cap_defs;
    int level;            /* objects and arrays entered: JSON written since the root */
    int depth;            /* subschemas entered */
    long expanded;        /* elements the repetitions x{m,n} will expand to */
    char path[1024];      /* the param of the subschema at hand */
    size_t plen;
    bool oom;
    struct dray_srv_error *e;
};

/* 500 (out of memory); returns -1 */
int jg_oom(struct gen *g);
/* 400 naming g->path + "." + kw (kw NULL: the subschema itself); returns -1 */
int jg_bad(struct gen *g, const char *kw, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* append to b; an allocation failure sets g->oom, seen when a rule is emitted */
void jg_put(struct gen *g, struct dray_srv_buf *b, const char *s);
void jg_putn(struct gen *g, struct dray_srv_buf *b, const char *s, size_t n);
void jg_putf(struct gen *g, struct dray_srv_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void jg_put_buf(struct gen *g, struct dray_srv_buf *b, struct dray_srv_buf *b2); /* b2 emptied */
/* a shared rule's name, marking it used */
void jg_prim(struct gen *g, struct dray_srv_buf *b, int p);
/* a GBNF string literal of s[0..n) */
void jg_lit(struct gen *g, struct dray_srv_buf *b, const char *s, size_t n);
/* body as a new rule named after hint; its name appended to out */
int jg_rule_of(struct gen *g, const char *hint, struct dray_srv_buf *body,
               struct dray_srv_buf *out);
/* an x{min,max} of an item of `items` tokens (max -1: unbounded) is written: count
 * what the grammar engine will expand it to */
void jg_charge(struct gen *g, long min, long max, size_t items);
size_t jg_tokens(const char *s, size_t n);
int jg_hexval(char c);
uint32_t jg_utf8_next(const char *s, size_t n, size_t *i);

/* json_grammar.c, for the others: the expression of schema s (the walk), a
 * string literal spelled as JSON, a fresh rule name, a rule written, the path
 * cut back to old */
int jg_schema(struct gen *g, json_t *s, struct dray_srv_buf *out);
void jg_json_spell(struct gen *g, struct dray_srv_buf *b, const char *s, size_t n);
void jg_new_name(struct gen *g, const char *hint, char *name, size_t n);
int jg_emit_rule(struct gen *g, const char *name, const struct dray_srv_buf *body);
void jg_path_pop(struct gen *g, size_t old);
/* jg_schema with path += fmt while at it */
int jg_at(struct gen *g, json_t *s, struct dray_srv_buf *out, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- json_values.c: strings, objects, arrays */
int jg_string(struct gen *g, json_t *s, struct dray_srv_buf *out);
int jg_object(struct gen *g, json_t *s, struct dray_srv_buf *out);
int jg_array(struct gen *g, json_t *s, struct dray_srv_buf *out);

/* ---- json_pattern.c: sets of code points, spelled inside a JSON string */
struct range {
    uint32_t lo, hi;
};

struct cset {
    struct range *r;
    size_t n, cap;
};

#define CP_MAX 0x10FFFFu

bool jg_cs_add(struct cset *s, uint32_t lo, uint32_t hi);
void jg_cs_norm(struct cset *s);      /* sorted, disjoint */
bool jg_cs_invert(struct cset *s);    /* the complement over [0, CP_MAX]; s normalized */
/* one character of s as a JSON string spells it; the number of alternatives (0:
 * none a string can hold) */
int jg_emit_set(struct gen *g, struct dray_srv_buf *b, const struct cset *s);
/* the string rule of a pattern (ECMA-262 subset) */
int jg_pattern(struct gen *g, const char *pat, size_t len, struct dray_srv_buf *out);

/* ---- json_range.c: integer and number under minimum/maximum/exclusive* */
int jg_integer(struct gen *g, json_t *s, struct dray_srv_buf *out);
int jg_number(struct gen *g, json_t *s, struct dray_srv_buf *out);

#endif
