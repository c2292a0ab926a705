/* The vocabulary as a byte trie, and the mask of the tokens the grammar allows
 * next. The trie is stored in preorder (node i's subtree is i .. skip[i]), so
 * the mask is one forward pass: each node steps its parent's position over its
 * byte, and a rejected node jumps over its whole subtree. A token's bit is set
 * when the walk reaches its node, i.e. exactly when accept_bytes would take its
 * bytes (the same step function). Masks are cached per position in the
 * matcher's LRU (grammar_internal.h). */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "error.h"
#include "grammar_internal.h"

#define GRAM_MAX_PIECE 65535u /* bytes of one token (the trie's depth is 16-bit) */

struct dray_grammar_vocab {
    uint32_t n_vocab;
    uint32_t n_nodes;
    uint8_t *byte;    /* node i's byte */
    uint16_t *depth;  /* node i's depth (1 for a child of the root) */
    uint32_t *skip;   /* first node after i's subtree */
    uint32_t *tok;    /* node i's token (the lowest id of these bytes), or pad */
    uint32_t pad;     /* a bit past the vocabulary: the walk sets it for no token */
    uint32_t (*dup)[2]; /* (token, another token of the same bytes) */
    size_t n_dup;
    char *bytes;      /* every token's piece, for accept_token */
    size_t *off;      /* token i is bytes[off[i] .. off[i + 1]) */
    int32_t *eog;
    size_t n_eog;
    uint32_t max_len;
    uint64_t hash;    /* content hash, the mask cache's key (never 0) */
};

/* One token while sorting: its piece and id. */
struct piece {
    const char *s;
    uint32_t len;
    int32_t id;
};

/* Bytewise order of pieces, then by id (so duplicates keep id order). */
static int piece_cmp(const void *a, const void *b)
{
    const struct piece *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->s, y->s, n) : 0;
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool is_eog(const int32_t *eog, size_t n, int32_t id)
{
    for (size_t k = 0; k < n; k++)
        if (eog[k] == id)
            return true;
    return false;
}

/* A copy of the eog ids in v. */
static int dup_eog(struct dray_grammar_vocab *v, const int32_t *eog, size_t n)
{
    v->eog = malloc((n ? n : 1) * sizeof(*v->eog));
    if (!v->eog)
        return DRAY_ENOMEM;
    if (n)
        memcpy(v->eog, eog, n * sizeof(*eog));
    return 0;
}

/* Copy the pieces into v; the sortable pieces (non-empty, not eog)
 * into *ps (*n of them). */
static int copy_pieces(struct dray_grammar_vocab *v, const char *const *pieces,
                       const uint32_t *lens, struct piece **ps, size_t *n, char *err,
                       size_t errlen)
{
    size_t total = 0;
    for (uint32_t i = 0; i < v->n_vocab; i++) {
        if (lens[i] > GRAM_MAX_PIECE)
            return dray_fail(err, errlen, DRAY_EINVAL, "grammar vocab: token %u has %u bytes "
                             "(at most %u)", i, lens[i], GRAM_MAX_PIECE);
        if (lens[i] && !pieces[i])
            return dray_fail(err, errlen, DRAY_EINVAL, "grammar vocab: token %u has no bytes", i);
        total += lens[i];
    }
    v->bytes = malloc(total ? total : 1);
    v->off = malloc((v->n_vocab + 1) * sizeof(*v->off));
    *ps = malloc((v->n_vocab ? v->n_vocab : 1) * sizeof(**ps));
    if (!v->bytes || !v->off || !*ps)
        return dray_fail(err, errlen, DRAY_ENOMEM, "grammar vocab: out of memory");
    size_t o = 0;
    *n = 0;
    uint64_t h = XXH3_64bits(v->eog, v->n_eog * sizeof(*v->eog));
    for (uint32_t i = 0; i < v->n_vocab; i++) {
        v->off[i] = o;
        if (lens[i])
            memcpy(v->bytes + o, pieces[i], lens[i]);
        h = XXH3_64bits_withSeed(v->bytes + o, lens[i], h ^ ((uint64_t)i << 32 | lens[i]));
        if (lens[i] && !is_eog(v->eog, v->n_eog, (int32_t)i))
            (*ps)[(*n)++] = (struct piece){v->bytes + o, lens[i], (int32_t)i};
        if (lens[i] > v->max_len)
            v->max_len = lens[i];
        o += lens[i];
    }
    v->off[v->n_vocab] = o;
    v->hash = h ? h : 1;
    return 0;
}

/* The preorder trie of sorted pieces ps[0..n): a node per distinct prefix. */
static int build_trie(struct dray_grammar_vocab *v, const struct piece *ps, size_t n)
{
    size_t cap = 0;
    for (size_t k = 0; k < n; k++)
        cap += ps[k].len; /* an upper bound on the node count */
    v->pad = (v->n_vocab + 31) / 32 * 32;
    v->byte = malloc(cap ? cap : 1);
    v->depth = malloc((cap ? cap : 1) * sizeof(*v->depth));
    v->skip = malloc((cap ? cap : 1) * sizeof(*v->skip));
    v->tok = malloc((cap ? cap : 1) * sizeof(*v->tok));
    v->dup = malloc((n ? n : 1) * sizeof(*v->dup));
    uint32_t *path = malloc(((size_t)v->max_len + 1) * sizeof(*path)); /* node per depth */
    if (!v->byte || !v->depth || !v->skip || !v->tok || !v->dup || !path) {
        free(path);
        return DRAY_ENOMEM;
    }
    uint32_t nn = 0, depth = 0;
    for (size_t k = 0; k < n; k++) {
        const struct piece *p = &ps[k];
        uint32_t common = 0; /* shared with the previous piece: nodes that stay open */
        if (k > 0)
            while (common < depth && common < p->len && ps[k - 1].s[common] == p->s[common])
                common++;
        for (; depth > common; depth--)
            v->skip[path[depth]] = nn;
        for (; depth < p->len; depth++) {
            v->byte[nn] = (uint8_t)p->s[depth];
            v->depth[nn] = (uint16_t)(depth + 1);
            v->tok[nn] = v->pad;
            path[depth + 1] = nn++;
        }
        uint32_t *t = &v->tok[nn - 1]; /* its node is the newest (or the last's) */
        if (*t == v->pad) {
            *t = (uint32_t)p->id;
        } else {
            v->dup[v->n_dup][0] = *t;
            v->dup[v->n_dup++][1] = (uint32_t)p->id;
        }
    }
    for (; depth > 0; depth--)
        v->skip[path[depth]] = nn;
    v->n_nodes = nn;
    free(path);
    return 0;
}

int dray_grammar_vocab_new(uint32_t n_vocab, const char *const *pieces, const uint32_t *lens,
                           const int32_t *eog, size_t n_eog, struct dray_grammar_vocab **out,
                           char *err, size_t errlen)
{
    *out = NULL;
    if ((n_vocab && (!pieces || !lens)) || (n_eog && !eog) || n_vocab > INT32_MAX)
        return dray_fail(err, errlen, DRAY_EINVAL, "grammar vocab: bad arguments");
    for (size_t k = 0; k < n_eog; k++)
        if (eog[k] < 0 || (uint32_t)eog[k] >= n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL, "grammar vocab: eog id %d out of range",
                             eog[k]);
    struct dray_grammar_vocab *v = calloc(1, sizeof(*v));
    if (!v)
        return dray_fail(err, errlen, DRAY_ENOMEM, "grammar vocab: out of memory");
    v->n_vocab = n_vocab;
    v->n_eog = n_eog;
    struct piece *ps = NULL;
    size_t n = 0;
    int rc = dup_eog(v, eog, n_eog);
    if (rc)
        rc = dray_fail(err, errlen, rc, "grammar vocab: out of memory");
    if (!rc)
        rc = copy_pieces(v, pieces, lens, &ps, &n, err, errlen);
    if (!rc) {
        qsort(ps, n, sizeof(*ps), piece_cmp);
        if ((rc = build_trie(v, ps, n)))
            rc = dray_fail(err, errlen, rc, "grammar vocab: out of memory");
    }
    free(ps);
    if (rc) {
        dray_grammar_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void dray_grammar_vocab_free(struct dray_grammar_vocab *v)
{
    if (!v)
        return;
    free(v->byte), free(v->depth), free(v->skip), free(v->tok), free(v->dup);
    free(v->bytes), free(v->off), free(v->eog);
    free(v);
}

uint32_t dray_grammar_vocab_size(const struct dray_grammar_vocab *v)
{
    return v->n_vocab;
}

static int token(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v, int32_t id,
                 bool commit)
{
    if (id < 0 || (uint32_t)id >= v->n_vocab)
        return DRAY_EINVAL;
    if (is_eog(v->eog, v->n_eog, id))
        return dray_grammar_can_end(m) ? 0 : DRAY_EINVAL;
    size_t n = v->off[id + 1] - v->off[id];
    if (n == 0)
        return DRAY_EINVAL; /* never allowed: control, unknown, unused */
    return commit ? dray_grammar_accept_bytes(m, v->bytes + v->off[id], n)
                  : dray_grammar_peek_bytes(m, v->bytes + v->off[id], n);
}

int dray_grammar_accept_token(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                              int32_t id)
{
    return token(m, v, id, true);
}

int dray_grammar_peek_token(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                            int32_t id)
{
    return token(m, v, id, false);
}

/* ------------------------------------------------------------ the mask cache */
static bool pos_eq(const struct gram_pos *a, const struct gram_pos *b)
{
    return a->s == b->s && a->acc == b->acc && a->rem == b->rem && a->lo == b->lo &&
           a->hi == b->hi;
}

/* The cached mask of the matcher's position for v, or NULL. */
static struct gram_mask *lru_find(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v)
{
    if (m->lru_words != (v->n_vocab + 31) / 32)
        return NULL;
    for (int k = 0; k < GRAM_MASK_LRU; k++) {
        struct gram_mask *e = &m->lru[k];
        if (e->vocab == v->hash && pos_eq(&e->key, &m->pos))
            return e;
    }
    return NULL;
}

/* Store allow[0..words) as the mask of key for v, over the least recently used
 * slot. Best effort: a failed allocation just caches nothing. */
static void lru_store(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                      const struct gram_pos *key, const uint32_t *allow, long count)
{
    uint32_t words = (v->n_vocab + 31) / 32;
    if (m->lru_words != words) {
        for (int k = 0; k < GRAM_MASK_LRU; k++) {
            free(m->lru[k].bits);
            m->lru[k].bits = NULL;
            m->lru[k].vocab = 0;
        }
        m->lru_words = words;
    }
    struct gram_mask *e = &m->lru[0];
    for (int k = 1; k < GRAM_MASK_LRU && e->vocab; k++)
        if (!m->lru[k].vocab || m->lru[k].used < e->used)
            e = &m->lru[k];
    if (!e->bits && !(e->bits = malloc((words ? words : 1) * sizeof(*e->bits))))
        return;
    memcpy(e->bits, allow, words * sizeof(*allow));
    e->key = *key;
    e->vocab = v->hash;
    e->count = count;
    e->used = ++m->tick;
}

/* ------------------------------------------------------------ the walk */
/* A position in one word, for the walk: the state in the low half, the
 * character in flight in the high half (0 when none: acc is under 2^15 while
 * a character is due, lo and hi differ from 0x80 and 0xBF by 0, 0x10 or 0x20). */
static uint64_t pack(struct gram_pos p)
{
    uint64_t part = p.rem ? p.acc | (uint32_t)p.rem << 15 | (uint32_t)(p.lo - 0x80) << 17 |
                                (uint32_t)(0xBF - p.hi) << 23
                          : 0;
    return part << 32 | p.s;
}

static struct gram_pos unpack(uint64_t w)
{
    uint32_t part = (uint32_t)(w >> 32);
    if (!part)
        return (struct gram_pos){(uint32_t)w, 0, 0, 0, 0};
    return (struct gram_pos){(uint32_t)w, part & 0x7FFF, (uint8_t)(part >> 15 & 3),
                             (uint8_t)(0x80 + (part >> 17 & 0x3F)),
                             (uint8_t)(0xBF - (part >> 23 & 0x3F))};
}

/* Make room for the walk: a position per trie depth, the bits. */
static int walk_reserve(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v)
{
    size_t words = v->pad / 32 + 1;
    if (m->bits_cap < words) {
        uint32_t *b = realloc(m->bits, words * sizeof(*b));
        if (!b)
            return DRAY_ENOMEM;
        m->bits = b;
        m->bits_cap = words;
    }
    if (m->walk_cap >= (size_t)v->max_len + 1)
        return 0;
    uint64_t *w = realloc(m->walk, ((size_t)v->max_len + 1) * sizeof(*w));
    if (!w)
        return DRAY_ENOMEM;
    m->walk = w;
    m->walk_cap = (size_t)v->max_len + 1;
    return 0;
}

/* Rebuild the DFA mid-walk, keeping the positions of the open path w[0..depth]. */
static int walk_rebuild(struct dray_grammar_matcher *m, uint64_t *w, uint32_t depth)
{
    uint32_t *ids = malloc(((size_t)depth + 1) * sizeof(*ids));
    if (!ids)
        return DRAY_ENOMEM;
    for (uint32_t k = 0; k <= depth; k++)
        ids[k] = (uint32_t)w[k];
    int rc = dray_gram_rebuild(m, ids, (size_t)depth + 1);
    for (uint32_t k = 0; k <= depth && !rc; k++)
        w[k] = (w[k] >> 32) << 32 | ids[k];
    free(ids);
    return rc;
}

/* The full step of the walk (anything but a known ASCII transition): 1 moved,
 * 0 refused, DRAY_ENOMEM; *rebuilt when the DFA grew (trans may have moved). */
static int walk_step(struct dray_grammar_matcher *m, uint64_t *w, uint32_t d, uint64_t *p,
                     uint8_t b)
{
    struct gram_pos q = unpack(*p);
    uint32_t n_st = m->d.n_st;
    int r = dray_gram_budget(m, 0);
    r = r ? r : dray_gram_step(m, &q, b);
    if (r <= 0)
        return r;
    *p = pack(q);
    if (m->d.n_st != n_st && dray_gram_over_budget(m)) {
        w[d] = *p;
        if (walk_rebuild(m, w, d))
            return DRAY_ENOMEM;
        *p = w[d];
        m->pos.s = (uint32_t)w[0];
    }
    return 1;
}

/* Set in bits the token of every node the trie walk from m->pos reaches (pad
 * for a node of no token). The common case (an ASCII byte, no character in
 * flight, the transition known) is a row lookup inline, and the position just
 * reached stays in a register for its first child (preorder: the next node,
 * usually). */
static int walk(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v, uint32_t *bits)
{
    uint64_t *w = m->walk, cur = pack(m->pos);
    w[0] = cur;
    const uint32_t *trans = m->d.trans, row = m->d.row_len, *tok = v->tok;
    const uint16_t *depth = v->depth;
    const uint8_t *bytes = v->byte;
    uint32_t cd = 0; /* cur is w[cd] */
    for (uint32_t i = 0; i < v->n_nodes;) {
        uint32_t d = depth[i], b = bytes[i], x;
        uint64_t p = d == cd + 1 ? cur : w[d - 1];
        if ((p >> 32) == 0 && b < 0x80 && (x = trans[(size_t)(uint32_t)p * row + b]) >= GRAM_OK) {
            p = x - GRAM_OK;
        } else {
            int r = walk_step(m, w, d, &p, (uint8_t)b);
            if (r < 0)
                return r;
            if (r == 0) {
                i = v->skip[i];
                continue;
            }
            trans = m->d.trans;
        }
        w[d] = cur = p;
        cd = d;
        bits[tok[i] >> 5] |= 1u << (tok[i] & 31);
        i++;
    }
    m->pos.s = (uint32_t)w[0]; /* renumbered if the DFA was rebuilt */
    return 0;
}

/* The walk's bits as the mask: duplicates follow their twin, eog ids the end;
 * returns the number allowed. */
static long finish_mask(const struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                        uint32_t *bits, uint32_t *allow)
{
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    for (size_t k = 0; k < v->n_dup; k++) {
        uint32_t a = v->dup[k][0], b = v->dup[k][1];
        bits[b >> 5] |= (bits[a >> 5] >> (a & 31) & 1u) << (b & 31);
    }
    bool end = dray_grammar_can_end(m);
    for (size_t k = 0; k < v->n_eog; k++) {
        uint32_t id = (uint32_t)v->eog[k];
        bits[id >> 5] = (bits[id >> 5] & ~(1u << (id & 31))) | (uint32_t)end << (id & 31);
    }
    long count = 0;
    for (size_t k = 0; k < words; k++)
        count += __builtin_popcount(bits[k]);
    memcpy(allow, bits, words * sizeof(*allow));
    return count;
}

long dray_grammar_allowed(struct dray_grammar_matcher *m, const struct dray_grammar_vocab *v,
                          uint32_t *allow)
{
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    int rc = dray_gram_enter(m);
    if (rc) {
        memset(allow, 0, words * sizeof(*allow));
        return rc;
    }
    const struct gram_mask *hit = lru_find(m, v);
    if (hit) {
        memcpy(allow, hit->bits, words * sizeof(*allow));
        m->lru[hit - m->lru].used = ++m->tick;
        return hit->count;
    }
    if (walk_reserve(m, v)) {
        memset(allow, 0, words * sizeof(*allow));
        return DRAY_ENOMEM;
    }
    memset(m->bits, 0, (v->pad / 32 + 1) * sizeof(*m->bits));
    rc = walk(m, v, m->bits);
    if (rc < 0) {
        memset(allow, 0, words * sizeof(*allow));
        return rc;
    }
    long count = finish_mask(m, v, m->bits, allow);
    lru_store(m, v, &m->pos, allow, count);
    return count;
}
