/* core/text/grammar_internal.h — what the grammar's three files share: the compiled
 * grammar (grammar_parse.c), the matcher and the automaton it builds lazily
 * (grammar_match.c), and the one-byte step that accept_bytes and the mask walk
 * (grammar_mask.c) both take, so that a token's bit in the mask and accepting
 * its bytes can never disagree.
 *
 * The matcher is the classic pushdown one: a set of stacks of grammar positions,
 * advanced per code point. Each distinct (canonical, sorted, deduplicated) stack
 * set becomes a state of a DFA built on demand, whose transitions are memoised
 * per state in a row indexed by the byte (ASCII) or by the code point's "atom":
 * the grammar's code points fall into intervals (atoms) no terminal tells apart,
 * so one transition serves the whole interval. A multi-byte character in flight
 * is carried beside the state (struct gram_pos), not as a state of its own. */
#ifndef DRAY_CORE_GRAMMAR_INTERNAL_H
#define DRAY_CORE_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"
#include "grammar.h"

/* Limits: a grammar bigger than these is refused at parse time. The element,
 * alternative and depth limits are the defaults of struct dray_grammar_limits,
 * which may only lower the element one. */
#define GRAM_MAX_TEXT (1u << 20)      /* bytes of GBNF text */
#define GRAM_MAX_ELEMENTS (1u << 16)  /* elements after expanding repetitions */
#define GRAM_DEF_ALTERNATIVES 1024u   /* alternatives of one rule */
#define GRAM_DEF_DEPTH 1024u          /* nesting of parentheses: the parser recurses per level, ~200 bytes of stack */
#define GRAM_DEF_STEP_STACKS (1u << 22) /* stack entries one transition may build (16 MiB) */
#define GRAM_DEF_STEP_MS 200u         /* milliseconds one step may take */
#define GRAM_DEF_CACHE (8u << 20)     /* bytes of DFA per matcher before a rebuild */
#define GRAM_MAX_REPEAT 65535u        /* m and n of x{m,n} */
#define GRAM_MAX_CP 0x10FFFFu

/* ------------------------------------------------------------ the grammar */
enum gram_kind {
    GRAM_END,   /* end of an alternative */
    GRAM_CHAR,  /* one code point: val */
    GRAM_CLASS, /* a set of code points: class val (negation already applied) */
    GRAM_REF,   /* rule val */
};

struct gram_el {
    uint32_t kind, val;
};

struct gram_rule {
    uint32_t alt0, n_alt; /* its alternatives: alts[alt0 .. alt0 + n_alt) */
};

struct dray_grammar {
    struct gram_el *el; /* every alternative's elements, each ended by GRAM_END */
    uint32_t n_el;
    uint32_t *alts; /* index in el of each alternative's first element */
    struct gram_rule *rules;
    uint32_t n_rules;
    uint32_t *ranges;  /* inclusive [lo, hi] pairs, sorted and disjoint per class */
    uint32_t *cls;     /* class i is pairs cls[i] .. cls[i + 1] of ranges */
    uint32_t n_cls;
    uint32_t start;    /* el[start] = REF root, el[start + 1] = END */
    uint32_t *bounds;  /* atom a = code points [bounds[a], bounds[a + 1]) */
    uint32_t n_atoms;  /* atoms 0..127 are the ASCII code points themselves */
    uint32_t *blk_atom; /* atom of each 64-code-point block, UINT32_MAX if split */
    struct dray_grammar_limits lim; /* what it was compiled under, defaults filled in */
};

/* lim with every 0 replaced by its default (lim NULL: all defaults). */
void dray_gram_limits_resolve(const struct dray_grammar_limits *lim, struct dray_grammar_limits *out);

/* Atom of code point cp by binary search (dray_gram_atom is the fast way). */
uint32_t dray_gram_atom_search(const struct dray_grammar *g, uint32_t cp);

/* Atom of code point cp (<= GRAM_MAX_CP). */
static inline uint32_t dray_gram_atom(const struct dray_grammar *g, uint32_t cp)
{
    if (cp < 128)
        return cp;
    uint32_t a = g->blk_atom[cp >> 6];
    return a != UINT32_MAX ? a : dray_gram_atom_search(g, cp);
}

/* The atom holding every code point whose top bits are acc followed by k
 * continuation bytes (k >= 1), or UINT32_MAX when they span several. */
static inline uint32_t dray_gram_atom_span(const struct dray_grammar *g, uint32_t acc, unsigned k)
{
    uint32_t lo = acc << (6 * k), hi = lo | ((1u << (6 * k)) - 1);
    uint32_t a = g->blk_atom[lo >> 6];
    return a == g->blk_atom[hi >> 6] ? a : UINT32_MAX;
}
/* Whether terminal el[pos] (CHAR or CLASS) matches some code point in [lo, hi]. */
bool dray_gram_term_hits(const struct dray_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi);

/* ------------------------------------------------------------ the matcher */
/* Row entries: 0 not computed yet, GRAM_REJECT, or state id + GRAM_OK for a
 * transition; for a lead byte 0xC0..0xFF, GRAM_OK says some continuation may be
 * accepted. A row has 256 byte entries, then one per non-ASCII atom. */
#define GRAM_REJECT 1u
#define GRAM_OK 2u

/* Where a sequence stands: a DFA state and the UTF-8 character in flight.
 * Canonical, since it keys the mask cache: acc, lo and hi are 0 when rem is. */
struct gram_pos {
    uint32_t s;   /* state id */
    uint32_t acc; /* payload bits of the partial character so far */
    uint8_t rem;  /* continuation bytes still due (0: none in flight) */
    uint8_t lo, hi; /* range of the next continuation byte */
};

/* Start the character of lead byte b (0xC2..0xF4) in *p: its payload, the
 * continuation bytes due and the range of the first (Unicode Table 3-7). */
static inline void dray_gram_lead(struct gram_pos *p, uint8_t b)
{
    p->rem = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
    p->acc = b & (p->rem == 3 ? 0x07u : p->rem == 2 ? 0x0Fu : 0x1Fu);
    p->lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
    p->hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
}

struct gram_state {
    uint32_t off, len;     /* stacks in pool: [depth, pos...] each, sorted */
    uint32_t n_stacks;
    uint32_t tops, n_tops; /* distinct terminal positions atop the stacks, in pool */
    uint64_t hash;
    bool accept;           /* holds the empty stack: root is complete */
};

struct gram_dfa {
    struct gram_state *st;
    uint32_t n_st, cap_st;
    uint32_t *trans; /* n_st rows of row_len entries (room for cap_rows) */
    uint32_t row_len, cap_rows;
    uint32_t *pool;
    size_t n_pool, cap_pool;
    uint32_t *tab; /* interning: open addressing of state id + 1 */
    uint32_t tab_cap;
    size_t budget; /* bytes; over it, the DFA is rebuilt from the states in use */
    uint64_t *mark; /* a bit per grammar element, all clear between uses (state_tops) */
};

/* Scratch of one transition: stacks under construction and a set of them. */
struct gram_ref {
    uint32_t off, len;
    uint64_t hash;
    uint32_t slot; /* its entry in seen, cleared by the next transition */
};
struct gram_scratch {
    uint32_t *w;
    size_t n_w, cap_w;
    struct gram_ref *refs;
    uint32_t n_refs, cap_refs;
    uint32_t *work, *out; /* ref indices: to expand, and final */
    uint32_t n_work, n_out, cap_idx;
    uint32_t *seen; /* open addressing of ref index + 1 */
    uint32_t seen_cap;
};

/* Masks cached per position: a small LRU inside the matcher (no sharing, so no
 * locks), keyed by the position and the vocabulary's content hash. */
#define GRAM_MASK_LRU 8
struct gram_mask {
    struct gram_pos key;
    uint64_t vocab;  /* dray_grammar_vocab hash; 0: slot unused */
    uint64_t used;   /* tick of the last use */
    long count;
    uint32_t *bits;
};

struct dray_grammar_matcher {
    const struct dray_grammar *g;
    struct gram_dfa d;
    struct gram_scratch x;
    struct gram_pos pos;
    struct gram_mask lru[GRAM_MASK_LRU];
    uint32_t lru_words; /* words of each lru[i].bits */
    uint64_t tick;
    uint64_t *walk; /* the mask walk's position per trie depth (packed) */
    size_t walk_cap;
    uint32_t *bits; /* the walk's mask, one word past the vocabulary's */
    size_t bits_cap;
    /* the step budget (grammar_budget.c) */
    uint64_t deadline;  /* CLOCK_MONOTONIC ns the open step must end by */
    uint32_t clock_in;  /* budget checks left before the clock is read again */
    bool step_open;     /* dray_grammar_step_begin was called: calls share one budget */
    int failed;         /* 0, or DRAY_ERANGE once over the budget, DRAY_ECANCELED
                         * once *stop was seen: sticky */
    const atomic_bool *stop; /* the owner's cancel flag, or NULL */
    char why[200];      /* what the budget was, when failed */
};

/* At a public call: 0, or DRAY_ERANGE when the matcher has failed. */
int dray_gram_enter(struct dray_grammar_matcher *m);
/* Inside the loops: 0, or DRAY_ERANGE (and the matcher fails) when words, the
 * stack entries the transition has built, is over the budget, or a step is
 * open (dray_grammar_step_begin) and its time is up; DRAY_ECANCELED when the
 * watched stop flag is set. The clock and the flag are read every 64 calls. */
int dray_gram_budget(struct dray_grammar_matcher *m, size_t words);

/* The whole step over byte b, computing what is not memoised yet: 1 moved (*p
 * updated), 0 rejected, DRAY_ENOMEM. */
int dray_gram_step_slow(struct dray_grammar_matcher *m, struct gram_pos *p, uint8_t b);

/* The step over byte b: the memoised cases inline, the rest in step_slow. A
 * continuation byte that leaves the character's possible code points inside one
 * atom is answered by that atom's transition (some stack takes them or none). */
static inline int dray_gram_step(struct dray_grammar_matcher *m, struct gram_pos *p, uint8_t b)
{
    const uint32_t *row = m->d.trans + (size_t)p->s * m->d.row_len;
    if (p->rem == 0) {
        uint32_t x = row[b];
        if (x == GRAM_REJECT)
            return 0;
        if (x >= GRAM_OK && b < 0x80) {
            p->s = x - GRAM_OK;
            return 1;
        }
        if (x >= GRAM_OK) {
            dray_gram_lead(p, b);
            return 1;
        }
        return dray_gram_step_slow(m, p, b);
    }
    if (b < p->lo || b > p->hi)
        return 0;
    uint32_t acc = p->acc << 6 | (b & 0x3Fu);
    uint32_t a = p->rem == 1 ? dray_gram_atom(m->g, acc) : dray_gram_atom_span(m->g, acc, p->rem - 1u);
    uint32_t x = a != UINT32_MAX ? row[128 + a] : 0;
    if (x == GRAM_REJECT)
        return 0;
    if (x < GRAM_OK)
        return dray_gram_step_slow(m, p, b);
    if (p->rem == 1) {
        *p = (struct gram_pos){x - GRAM_OK, 0, 0, 0, 0};
    } else {
        p->acc = acc;
        p->rem--;
        p->lo = 0x80;
        p->hi = 0xBF;
    }
    return 1;
}

/* Whether the DFA outgrew its budget: then rebuild it (dray_gram_rebuild). */
bool dray_gram_over_budget(const struct dray_grammar_matcher *m);
/* Rebuild the DFA keeping only states ids[0..n), which are renumbered in place;
 * drops the mask cache (its keys are state ids). 0 or DRAY_ENOMEM. */
int dray_gram_rebuild(struct dray_grammar_matcher *m, uint32_t *ids, size_t n);
/* Drop every cached mask. */
void dray_gram_lru_clear(struct dray_grammar_matcher *m);

/* Grow *p (of *cap elements of size sz) to hold need; 0 or DRAY_ENOMEM. */
int dray_gram_grow(void **p, size_t *cap, size_t need, size_t sz);

#endif
