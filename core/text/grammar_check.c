/* The checks a parsed grammar must pass (every rule defined, no left
 * recursion) and the code-point atoms the matcher's rows are indexed by; the
 * parser (grammar_parse.c) calls them once the text is read. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "grammar_internal.h"
#include "grammar_parser.h"

/* Every referenced rule is defined, and root is. */
int dray_gram_check_defined(struct parser *p)
{
    for (size_t r = 0; r < p->n_rules; r++) {
        const struct prule *u = &p->rules[r];
        if (!u->defined)
            return dray_gram_fail_at(p, u->ref_at, "undefined rule '%.*s'", (int)u->name_len,
                           p->s + u->name);
    }
    for (size_t r = 0; r < p->n_rules; r++)
        if (!p->rules[r].helper && dray_gram_name_eq(p, &p->rules[r], "root", 4))
            return 0;
    return dray_gram_fail_at(p, p->n, "no rule named 'root'");
}

/* For each rule, the alternatives that refer to it (once per reference), as
 * CSR: alt[off[r] .. off[r + 1]). */
static int refs_index(struct parser *p, uint32_t **off, uint32_t **alt)
{
    size_t nr = p->n_rules;
    *off = calloc(nr + 2, sizeof(**off));
    *alt = malloc((p->n_el ? p->n_el : 1) * sizeof(**alt));
    if (!*off || !*alt)
        return dray_gram_nomem(p);
    for (size_t k = 0; k < p->n_el; k++)
        if (p->el[k].kind == GRAM_REF)
            (*off)[p->el[k].val + 2]++;
    for (size_t r = 0; r < nr; r++)
        (*off)[r + 2] += (*off)[r + 1];
    for (size_t a = 0; a < p->n_alts; a++)
        for (const struct gram_el *e = p->el + p->alts[a]; e->kind != GRAM_END; e++)
            if (e->kind == GRAM_REF)
                (*alt)[(*off)[e->val + 1]++] = (uint32_t)a;
    return 0;
}

/* nullable[r]: rule r can match the empty string. A worklist: each alternative
 * made of references only counts the references not yet known nullable. */
static int find_nullable(struct parser *p, bool *nullable)
{
    size_t n_alt = p->n_alts, nr = p->n_rules;
    uint32_t *left = calloc(n_alt ? n_alt : 1, sizeof(*left));
    uint32_t *owner = calloc(n_alt ? n_alt : 1, sizeof(*owner));
    uint32_t *todo = malloc((nr ? nr : 1) * sizeof(*todo));
    uint32_t *off = NULL, *by = NULL;
    int rc = left && owner && todo ? refs_index(p, &off, &by) : dray_gram_nomem(p);
    size_t n_todo = 0;
    for (size_t r = 0; r < nr && !rc; r++) {
        for (uint32_t a = p->rules[r].alt0; a < p->rules[r].alt0 + p->rules[r].n_alt; a++) {
            owner[a] = (uint32_t)r;
            for (const struct gram_el *e = p->el + p->alts[a]; e->kind != GRAM_END; e++)
                left[a] = e->kind != GRAM_REF || left[a] == UINT32_MAX ? UINT32_MAX : left[a] + 1;
            if (left[a] == 0 && !nullable[r]) {
                nullable[r] = true;
                todo[n_todo++] = (uint32_t)r;
            }
        }
    }
    while (n_todo > 0 && !rc) {
        uint32_t r = todo[--n_todo];
        for (uint32_t k = off[r]; k < off[r + 1]; k++) {
            uint32_t a = by[k];
            if (left[a] == UINT32_MAX || left[a] == 0 || --left[a] > 0 || nullable[owner[a]])
                continue;
            nullable[owner[a]] = true;
            todo[n_todo++] = owner[a];
        }
    }
    free(left), free(owner), free(todo), free(off), free(by);
    return rc;
}

/* Edges r -> s where s can come first in r (after nullable rules only), as
 * CSR: edges[off[r] .. off[r + 1]). */
static int first_edges(struct parser *p, const bool *nullable, uint32_t **off, uint32_t **edges)
{
    size_t nr = p->n_rules, n = 0;
    *off = calloc(nr + 1, sizeof(**off));
    *edges = malloc((p->n_el ? p->n_el : 1) * sizeof(**edges));
    if (!*off || !*edges)
        return dray_gram_nomem(p);
    for (size_t r = 0; r < nr; r++) {
        (*off)[r] = (uint32_t)n;
        for (uint32_t a = p->rules[r].alt0; a < p->rules[r].alt0 + p->rules[r].n_alt; a++) {
            for (const struct gram_el *e = p->el + p->alts[a]; e->kind == GRAM_REF; e++) {
                (*edges)[n++] = e->val;
                if (!nullable[e->val])
                    break;
            }
        }
    }
    (*off)[nr] = (uint32_t)n;
    return 0;
}

/* A cycle in the first-edges graph (iterative DFS): left recursion. */
static int find_cycle(struct parser *p, const uint32_t *off, const uint32_t *edges)
{
    size_t nr = p->n_rules;
    uint8_t *color = calloc(nr, 1); /* 0 new, 1 on the path, 2 done */
    uint32_t *stk = malloc(nr * sizeof(*stk)), *cur = malloc(nr * sizeof(*cur));
    int rc = 0;
    if (!color || !stk || !cur)
        rc = dray_gram_nomem(p);
    for (size_t r0 = 0; r0 < nr && !rc; r0++) {
        if (color[r0])
            continue;
        size_t d = 0;
        stk[d] = (uint32_t)r0, cur[d] = off[r0], color[r0] = 1, d++;
        while (d > 0 && !rc) {
            uint32_t r = stk[d - 1];
            if (cur[d - 1] == off[r + 1]) {
                color[r] = 2;
                d--;
                continue;
            }
            uint32_t s = edges[cur[d - 1]++];
            if (color[s] == 1) {
                const struct prule *u = &p->rules[s];
                rc = dray_gram_fail_at(p, u->def_at, "rule '%.*s' can reach itself without consuming a "
                             "character (left recursion)", (int)u->name_len, p->s + u->name);
            } else if (color[s] == 0) {
                stk[d] = s, cur[d] = off[s], color[s] = 1, d++;
            }
        }
    }
    free(color), free(stk), free(cur);
    return rc;
}

int dray_gram_check_left_recursion(struct parser *p)
{
    bool *nullable = calloc(p->n_rules, sizeof(*nullable));
    uint32_t *off = NULL, *edges = NULL;
    int rc = nullable ? find_nullable(p, nullable) : dray_gram_nomem(p);
    if (!rc)
        rc = first_edges(p, nullable, &off, &edges);
    if (!rc)
        rc = find_cycle(p, off, edges);
    free(nullable), free(off), free(edges);
    return rc;
}

/* ------------------------------------------------------------ atoms */
static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The boundaries every terminal puts in the code point line (sorted, unique). */
int dray_gram_atom_bounds(struct parser *p, struct dray_grammar *g)
{
    size_t cap = 130 + 2 * p->n_el + p->n_rng, n = 0;
    uint32_t *b = malloc(cap * sizeof(*b));
    if (!b)
        return dray_gram_nomem(p);
    for (uint32_t c = 0; c <= 128; c++)
        b[n++] = c;
    b[n++] = GRAM_MAX_CP + 1;
    for (size_t k = 0; k < p->n_el; k++) {
        if (p->el[k].kind == GRAM_CHAR && p->el[k].val >= 128) {
            b[n++] = p->el[k].val;
            b[n++] = p->el[k].val + 1;
        }
    }
    for (size_t k = 0; k < p->n_rng; k += 2) {
        b[n++] = p->ranges[k];
        b[n++] = p->ranges[k + 1] + 1;
    }
    qsort(b, n, sizeof(*b), cmp_u32);
    size_t u = 0;
    for (size_t k = 0; k < n; k++)
        if (u == 0 || b[k] != b[u - 1])
            b[u++] = b[k];
    g->bounds = b;
    g->n_atoms = (uint32_t)u - 1;
    return 0;
}

uint32_t dray_gram_atom_search(const struct dray_grammar *g, uint32_t cp)
{
    uint32_t lo = 0, hi = g->n_atoms; /* bounds[lo] <= cp < bounds[hi] */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (g->bounds[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The block table: a 64-code-point block inside one atom finds it directly. */
int dray_gram_atom_blocks(struct parser *p, struct dray_grammar *g)
{
    size_t nb = (GRAM_MAX_CP + 1) >> 6;
    g->blk_atom = malloc(nb * sizeof(*g->blk_atom));
    if (!g->blk_atom)
        return dray_gram_nomem(p);
    for (size_t k = 0; k < nb; k++) {
        uint32_t a = dray_gram_atom_search(g, (uint32_t)(k << 6));
        g->blk_atom[k] = g->bounds[a + 1] >= ((k + 1) << 6) ? a : UINT32_MAX;
    }
    return 0;
}

bool dray_gram_term_hits(const struct dray_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi)
{
    const struct gram_el *e = &g->el[pos];
    if (e->kind == GRAM_CHAR)
        return e->val >= lo && e->val <= hi;
    const uint32_t *r = g->ranges + 2 * g->cls[e->val];
    size_t n = g->cls[e->val + 1] - g->cls[e->val];
    size_t a = 0, b = n; /* first range whose hi >= lo */
    while (a < b) {
        size_t mid = a + (b - a) / 2;
        if (r[2 * mid + 1] < lo)
            a = mid + 1;
        else
            b = mid;
    }
    return a < n && r[2 * a] <= hi;
}

