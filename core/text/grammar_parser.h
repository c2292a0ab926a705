/* core/text/grammar_parser.h — the parser's working state, shared by the
 * parser (grammar_parse.c) and the checks and atom tables it ends with
 * (grammar_check.c). Private to the grammar. */
#ifndef DRAY_CORE_GRAMMAR_PARSER_H
#define DRAY_CORE_GRAMMAR_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar_internal.h"

/* A rule while parsing: its name, where it was defined or first used, and the
 * user rule a helper belongs to (for messages). */
struct prule {
    uint32_t name, name_len; /* offset and length in the text; helpers: their origin's */
    size_t def_at, ref_at;   /* text offsets; SIZE_MAX: none */
    bool defined;
    bool helper; /* a group's or a repetition's rule */
    uint32_t alt0, n_alt;
};

/* Elements of one rule body being parsed: alternatives separated by GRAM_END. */
struct seq {
    struct gram_el *e;
    size_t n, cap;
};

struct parser {
    const char *s;
    size_t n, i;
    char *err;
    size_t errlen;
    struct gram_el *el; /* committed elements */
    size_t n_el, cap_el;
    uint32_t *alts;
    size_t n_alts, cap_alts;
    struct prule *rules;
    size_t n_rules, cap_rules;
    uint32_t *ranges; /* pairs */
    size_t n_rng, cap_rng;
    uint32_t *cls;
    size_t n_cls, cap_cls;
    uint32_t *names; /* open addressing of user rule id + 1 by name */
    size_t names_cap;
    uint32_t any_cls; /* class of '.', UINT32_MAX until first used */
    struct dray_grammar_limits lim; /* resolved: no 0 */
    uint32_t depth;       /* parentheses open at the cursor */
    uint32_t group_loops; /* the last group's loops when it is one item (parse_group) */
};

/* DRAY_EINVAL with "line L, column C: what" for text offset at. */
int dray_gram_fail_at(struct parser *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int dray_gram_nomem(struct parser *p); /* DRAY_ENOMEM, said in p->err */
/* Whether rule r is named s[0..n). */
bool dray_gram_name_eq(const struct parser *p, const struct prule *r, const char *s, size_t n);

/* grammar_check.c */
int dray_gram_check_defined(struct parser *p);
int dray_gram_check_left_recursion(struct parser *p);
int dray_gram_atom_bounds(struct parser *p, struct dray_grammar *g);
int dray_gram_atom_blocks(struct parser *p, struct dray_grammar *g);

#endif
