/* core/text/grammar.h — grammar-constrained decoding: a GBNF grammar, a matcher that
 * follows one sequence's output byte by byte, and the mask of the tokens whose
 * bytes the grammar allows next. Vendor-neutral: the mask is applied to the
 * logits on the host before sampling, whatever plugin computed them.
 *
 * The grammar language is llama.cpp's GBNF:
 *   root   ::= "{" ws members? "}"        # rules: name ::= alternatives
 *   name   ::= [a-zA-Z_] [a-zA-Z0-9_]*    # char classes, ranges, [^...] negation
 *   alt    ::= "a" | "b" ( "c" | d )*     # literals with \n \t \" \\ \xHH \uHHHH
 *   rep    ::= x? x* x+ x{3} x{2,} x{2,5} # repetition; '.' is any character
 * Rule names are [a-zA-Z0-9_-]+; the start rule is `root`. Characters are Unicode
 * code points matched against the UTF-8 bytes of the output, so a token may end
 * inside a multi-byte character and the next one finish it. Also: \r, \xHH,
 * \UHHHHHHHH, and \' \[ \] \- \^ as themselves; # comments to the end of the
 * line; a newline ends a rule except after '|' or inside parentheses.
 * Not supported: llama.cpp's token references <...> / !<...>.
 * Ill-formed UTF-8 in the output never matches (not even '.').
 *
 * Implementation: core/text/grammar_parse.c, grammar_match.c, grammar_mask.c; the
 * design in core/text/grammar_internal.h.
 */
#ifndef DRAY_CORE_GRAMMAR_H
#define DRAY_CORE_GRAMMAR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"

/* A compiled grammar: immutable once built, shared by any number of matchers
 * (and threads). */
struct dray_grammar;

/* Compile GBNF text[0..len). DRAY_EINVAL with "line L, column C: what" in err for
 * a syntax error, an undefined rule, a missing root, or a rule that can recurse
 * on itself without consuming a character (left recursion); also for a rule
 * defined twice and a grammar over the limits (1 MiB of text, 65536 elements
 * once repetitions are expanded, counts of x{m,n} up to 65535). Columns count
 * code points; a missing root is reported at the end of the text. DRAY_ENOMEM
 * when memory runs out. */
int dray_grammar_parse(const char *text, size_t len, struct dray_grammar **out, char *err,
                       size_t errlen);
/* The same under lim (NULL: the defaults of dray.h's struct dray_grammar_limits):
 * "line L, column C: ... (the limit is N: config key K)" for a rule of more
 * alternatives, parentheses nested deeper, or more elements than lim allows;
 * also for a repetition of a repeated item (x++, (x+)*, x{2,}+), whose
 * ambiguity grows the matcher's work with every character. The step budget
 * (step_stacks, step_ms) and the automaton's size (cache) go with the grammar
 * to its matchers. */
int dray_grammar_parse_limited(const char *text, size_t len, const struct dray_grammar_limits *lim,
                               struct dray_grammar **out, char *err, size_t errlen);
void dray_grammar_free(struct dray_grammar *g);

/* The vocabulary as the grammar sees it: each token's bytes, built once per
 * tokenizer (a byte trie, so a mask walks shared prefixes once). pieces[i] of
 * lens[i] bytes is token i's output (after SentencePiece's "▁" -> ' ' and byte
 * fallback, or byte-level BPE's byte mapping: what the detokenizer emits). A token
 * of length 0 (control, unknown, unused) is never allowed, except the eog ids,
 * which are allowed exactly when the matcher can end. */
struct dray_grammar_vocab;
int dray_grammar_vocab_new(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens,
                           const int32_t *eog, size_t n_eog, struct dray_grammar_vocab **out,
                           char *err, size_t errlen);
void dray_grammar_vocab_free(struct dray_grammar_vocab *v);
uint32_t dray_grammar_vocab_size(const struct dray_grammar_vocab *v);

/* Where one sequence's output stands in the grammar. Not thread-safe; one per
 * sequence. It owns the automaton it builds as it goes (up to about 8 MiB, then
 * rebuilt from the states in use) and its mask cache (the last 8 masks, 4 bytes
 * per 32 tokens each), so nothing is shared between matchers and no lock is
 * taken. */
struct dray_grammar_matcher;
int dray_grammar_matcher_new(const struct dray_grammar *g, struct dray_grammar_matcher **out);
/* An independent copy at the same position (n > 1 choices of one prompt); it
 * copies the automaton and the cached masks too. */
int dray_grammar_matcher_clone(const struct dray_grammar_matcher *m,
                               struct dray_grammar_matcher **out);
void dray_grammar_matcher_free(struct dray_grammar_matcher *m);

/* The step budget: the work one token's decision may take: step_stacks
 * parse-stack entries in one transition, always; step_ms milliseconds for all
 * the calls between step_begin and step_end (calls outside a step are not
 * timed: a caller feeding a long text in one call means it). Past it, the call returns DRAY_ERANGE and so does every later one (the
 * matcher has failed; matcher_error says which budget). matcher_new is
 * budgeted too: a grammar whose start alone is over it gets DRAY_ERANGE. */
void dray_grammar_step_begin(struct dray_grammar_matcher *m);
void dray_grammar_step_end(struct dray_grammar_matcher *m);
/* NULL, or why the matcher failed: "grammar: one step went over ..." */
const char *dray_grammar_matcher_error(const struct dray_grammar_matcher *m);
/* Make m's loops watch *stop (NULL: nothing), where the budget reads the
 * clock: once it is set, the call in progress and every later one return
 * DRAY_ECANCELED (the matcher has failed). A clone watches nothing. */
void dray_grammar_matcher_watch(struct dray_grammar_matcher *m, const atomic_bool *stop);

/* Advance over bytes[0..n). 0 when the grammar allows them all (the matcher moved);
 * DRAY_EINVAL when it does not (the matcher is unchanged); DRAY_ENOMEM (also
 * unchanged); DRAY_ERANGE or DRAY_ECANCELED when the matcher has failed (the
 * step budget, the watched stop flag: see below; so for every call). Bytes ending inside a character are allowed when some completion
 * of it could be. */
int dray_grammar_accept_bytes(struct dray_grammar_matcher *m, const char *bytes, size_t n);
/* Advance over token id's bytes, as accept_bytes; an eog id is accepted when the
 * matcher can end (and leaves it there). DRAY_EINVAL for an id out of range and
 * for a token of no bytes that is not eog. */
int dray_grammar_accept_token(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                              int32_t id);
/* Whether bytes (or token id) could be accepted now, without moving: 0 or
 * DRAY_EINVAL, as accept would answer. Cheaper than a mask when only a few
 * tokens are in question (the sampler's best candidates). */
int dray_grammar_peek_bytes(struct dray_grammar_matcher *m, const char *bytes, size_t n);
int dray_grammar_peek_token(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                            int32_t id);
/* The output so far is a complete sentence of root: end of generation is allowed. */
bool dray_grammar_can_end(const struct dray_grammar_matcher *m);
/* Nothing can follow: the sequence must end now (can_end, and no character can
 * come next). */
bool dray_grammar_must_end(const struct dray_grammar_matcher *m);

/* The tokens allowed next, as a bitset of (n_vocab + 31) / 32 words: bit i of
 * allow[i / 32] is set when token i's bytes can follow (eog ids: when the matcher
 * can end). Returns the number allowed (0: the output cannot continue, which a
 * well-formed grammar only reaches at its end). Masks are cached per matcher
 * state, so a state met again (inside a JSON string, between list items) costs a
 * lookup. DRAY_ENOMEM (negative) when scratch memory runs out (allow is then all
 * zero). The cache is keyed by the position and v's content, so one matcher may
 * be asked with several vocabularies. */
long dray_grammar_allowed(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                          uint32_t *allow);

#endif
