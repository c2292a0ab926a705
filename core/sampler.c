/* Sampler. See sampler.h for the filter order. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dray/backend.h"
#include "error.h"
#include "host_clones.h"

struct cand {
    float l;    /* logit after the penalty */
    int32_t id;
};

struct dray_sampler {
    struct dray_sampler_params p;
    uint64_t rng[4];     /* xoshiro256** state */
    float *work;         /* [cap] penalized copy of the logits, then exp values */
    uint8_t *mark;       /* [cap] history dedup for the penalty, all 0 between calls */
    uint32_t *count;     /* [cap] times each id was generated, all 0 between calls; NULL
                          * without frequency and presence penalties */
    struct dray_logit_bias *bias; /* [p.n_bias] own copy */
    int32_t *hold;       /* [p.n_hold] own copy */
    struct cand *cand;   /* [cap] candidates */
    double *prob;        /* [cap] candidate weights */
    uint32_t cap;
};

/* ------------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** (Blackman & Vigna), written from the published description. */
static uint64_t next_u64(struct dray_sampler *s)
{
    uint64_t *st = s->rng;
    uint64_t r = rotl(st[1] * 5, 7) * 9, t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return r;
}

double dray_sampler_uniform(struct dray_sampler *s)
{
    return (double)(next_u64(s) >> 11) * 0x1.0p-53; /* 53 random mantissa bits */
}

void dray_sampler_reseed(struct dray_sampler *s, uint64_t seed)
{
    if (seed == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uintptr_t)s;
    }
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&seed); /* never all zero */
}

/* --------------------------------------------------------------- create */

int dray_sampler_create(const struct dray_sampler_params *p, struct dray_sampler **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    if (!(p->temperature >= 0 && isfinite(p->temperature)))
        return dray_fail(err, errlen, DRAY_EINVAL, "sampler: temperature %g, expected >= 0",
                         p->temperature);
    if (!(p->top_p >= 0 && p->top_p <= 1))
        return dray_fail(err, errlen, DRAY_EINVAL, "sampler: top_p %g, expected in [0, 1]",
                         p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return dray_fail(err, errlen, DRAY_EINVAL, "sampler: min_p %g, expected in [0, 1]",
                         p->min_p);
    if (!(p->repeat_penalty > 0 && isfinite(p->repeat_penalty)))
        return dray_fail(err, errlen, DRAY_EINVAL, "sampler: repeat_penalty %g, expected > 0",
                         p->repeat_penalty);
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return dray_fail(err, errlen, DRAY_EINVAL, "sampler: frequency_penalty %g, presence_penalty "
                         "%g, expected finite numbers", p->frequency_penalty, p->presence_penalty);
    for (size_t i = 0; i < p->n_bias; i++)
        if (isnan(p->bias[i].bias) || p->bias[i].bias == INFINITY)
            return dray_fail(err, errlen, DRAY_EINVAL, "sampler: bias %g of id %d, expected a finite "
                             "number or -inf", p->bias[i].bias, p->bias[i].id);
    struct dray_sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return dray_fail(err, errlen, DRAY_ENOMEM, "sampler: out of memory");
    s->p = *p;
    s->bias = p->n_bias ? malloc(sizeof(*s->bias) * p->n_bias) : NULL;
    s->hold = p->n_hold ? malloc(sizeof(*s->hold) * p->n_hold) : NULL;
    if ((p->n_bias && !s->bias) || (p->n_hold && !s->hold)) {
        dray_sampler_free(s);
        return dray_fail(err, errlen, DRAY_ENOMEM, "sampler: out of memory");
    }
    if (p->n_bias)
        memcpy(s->bias, p->bias, sizeof(*s->bias) * p->n_bias);
    if (p->n_hold)
        memcpy(s->hold, p->hold, sizeof(*s->hold) * p->n_hold);
    s->p.bias = s->bias;
    s->p.hold = s->hold;
    dray_sampler_reseed(s, p->seed);
    *out = s;
    return 0;
}

void dray_sampler_free(struct dray_sampler *s)
{
    if (!s)
        return;
    free(s->work);
    free(s->mark);
    free(s->count);
    free(s->bias);
    free(s->hold);
    free(s->cand);
    free(s->prob);
    free(s);
}

static int reserve(struct dray_sampler *s, uint32_t n)
{
    if (n <= s->cap)
        return 0;
    float *w = realloc(s->work, sizeof(*w) * n);
    if (w)
        s->work = w;
    struct cand *c = realloc(s->cand, sizeof(*c) * n);
    if (c)
        s->cand = c;
    double *pr = realloc(s->prob, sizeof(*pr) * n);
    if (pr)
        s->prob = pr;
    uint8_t *m = realloc(s->mark, n);
    if (m)
        s->mark = m;
    /* the counts only for a sampler with frequency or presence penalties */
    bool counts = s->p.frequency_penalty != 0 || s->p.presence_penalty != 0;
    uint32_t *cnt = counts ? realloc(s->count, sizeof(*cnt) * n) : NULL;
    if (cnt)
        s->count = cnt;
    if (!w || !c || !pr || !m || (counts && !cnt))
        return DRAY_ENOMEM;
    memset(s->mark + s->cap, 0, n - s->cap);
    if (counts)
        memset(s->count + s->cap, 0, sizeof(*cnt) * (n - s->cap));
    s->cap = n;
    return 0;
}

/* ----------------------------------------------------------- filters */

/* OpenAI's penalties: each id generated (hist[from..n_hist)) loses
 * count * frequency + presence, once; counts go back to 0 for the next call. */
static void penalize_generated(struct dray_sampler *s, uint32_t n, const int32_t *hist, size_t from,
                               size_t n_hist)
{
    float fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
    if ((fp == 0 && pp == 0) || !hist)
        return;
    for (size_t i = from; i < n_hist; i++)
        if (hist[i] >= 0 && (uint32_t)hist[i] < n)
            s->count[hist[i]]++;
    for (size_t i = from; i < n_hist; i++) {
        int32_t id = hist[i];
        if (id < 0 || (uint32_t)id >= n || !s->count[id])
            continue;
        s->work[id] -= (float)s->count[id] * fp + pp;
        s->count[id] = 0;
    }
}

/* logit_bias, then the hold ids banned while fewer than min_tokens were generated. */
static void bias(struct dray_sampler *s, uint32_t n, size_t n_generated)
{
    for (size_t i = 0; i < s->p.n_bias; i++) {
        int32_t id = s->bias[i].id;
        if (id < 0 || (uint32_t)id >= n)
            continue;
        float v = s->work[id] + s->bias[i].bias;
        s->work[id] = isnan(v) ? -INFINITY : v; /* +inf logit, -inf bias: banned */
    }
    if (n_generated >= s->p.min_tokens)
        return;
    for (size_t i = 0; i < s->p.n_hold; i++)
        if (s->hold[i] >= 0 && (uint32_t)s->hold[i] < n)
            s->work[s->hold[i]] = -INFINITY;
}

/* The CTRL penalty, once per distinct id of the last repeat_last_n history tokens. */
static void penalize_repeats(struct dray_sampler *s, uint32_t n, const int32_t *hist, size_t n_hist)
{
    float *w = s->work, rp = s->p.repeat_penalty;
    if (rp == 1.0f || !hist || !n_hist)
        return;
    size_t from = s->p.repeat_last_n && n_hist > s->p.repeat_last_n ? n_hist - s->p.repeat_last_n
                                                                     : 0;
    for (size_t i = from; i < n_hist; i++) {
        int32_t id = hist[i];
        if (id < 0 || (uint32_t)id >= n || s->mark[id])
            continue;
        s->mark[id] = 1;
        w[id] = w[id] > 0 ? w[id] / rp : w[id] * rp;
    }
    for (size_t i = from; i < n_hist; i++)
        if (hist[i] >= 0 && (uint32_t)hist[i] < n)
            s->mark[hist[i]] = 0;
}

/* Copy logits (NaN -> -inf), then steps 1-3 of sampler.h in order. */
static void penalize(struct dray_sampler *s, const float *logits, uint32_t n, const int32_t *hist,
                     size_t n_hist)
{
    float *w = s->work;
    for (uint32_t i = 0; i < n; i++)
        w[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    size_t gen_from = s->p.n_prompt < n_hist ? s->p.n_prompt : n_hist;
    penalize_repeats(s, n, hist, n_hist);
    penalize_generated(s, n, hist, gen_from, n_hist);
    bias(s, n, n_hist - gen_from);
}

/* Four floats and their compare mask (GCC vector extensions). The loops below
 * keep four of them in named variables, sixteen lanes in all: GCC 12 lowers a
 * 16-float vector to scalar code for AVX2 and SSE2 (vcomiss and cmov per lane),
 * while 4-float ones are native in every clone of DRAY_HOST_CLONES. */
typedef float dray_v4f __attribute__((vector_size(16)));
typedef int32_t dray_v4i __attribute__((vector_size(16)));

static inline dray_v4f load4(const float *p)
{
    dray_v4f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* m, each lane replaced by p's where p's is larger (never by NaN) */
static inline dray_v4f max4(dray_v4f m, const float *p)
{
    dray_v4f b = load4(p);
    dray_v4i gt = b > m;
    return (dray_v4f)(((dray_v4i)b & gt) | ((dray_v4i)m & ~gt));
}

DRAY_HOST_CLONES static float max_f32(const float *x, uint32_t n)
{
    /* sixteen running maxima, lane j taking x[16 b + j]: the loop as written
     * for scalars GCC 12 leaves scalar (maxss) */
    const dray_v4f ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    dray_v4f l0 = ninf, l1 = ninf, l2 = ninf, l3 = ninf;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        l0 = max4(l0, x + i);
        l1 = max4(l1, x + i + 4);
        l2 = max4(l2, x + i + 8);
        l3 = max4(l3, x + i + 12);
    }
    float top = -INFINITY;
    for (; i < n; i++)
        top = x[i] > top ? x[i] : top;
    const dray_v4f lanes[4] = {l0, l1, l2, l3}; /* the tail first, then lanes 0..15 */
    for (int v = 0; v < 4; v++)
        for (int j = 0; j < 4; j++)
            top = lanes[v][j] > top ? lanes[v][j] : top;
    return top;
}

/* The clones stay static behind a plain function: clang resolves a clone set
 * only for calls inside its own translation unit. */
float dray_max_f32(const float *x, uint32_t n)
{
    return max_f32(x, n);
}

/* The first index holding m (n if none), 16 at a time: four compares, their
 * OR and one branch a block. */
DRAY_HOST_CLONES static uint32_t first_of(const float *w, uint32_t n, float m)
{
    uint32_t i = 0;
    const dray_v4f mv = {m, m, m, m};
    for (; i + 16 <= n; i += 16) {
        dray_v4i eq = (load4(w + i) == mv) | (load4(w + i + 4) == mv) | (load4(w + i + 8) == mv) |
                      (load4(w + i + 12) == mv);
        if (eq[0] | eq[1] | eq[2] | eq[3])
            break;
    }
    for (; i < n; i++)
        if (w[i] == m)
            return i;
    return n;
}

/* The lowest id of the largest value, NaN never: the maximum, then the first
 * index holding it; two passes that vectorize. */
static uint32_t argmax(const float *w, uint32_t n)
{
    uint32_t i = first_of(w, n, max_f32(w, n));
    return i < n ? i : 0;
}

int32_t dray_greedy_token(const float *logits, uint32_t n_vocab)
{
    return (int32_t)argmax(logits, n_vocab);
}

/* a ranks before b: larger logit, then lower id */
static bool before(const struct cand *a, const struct cand *b)
{
    return a->l > b->l || (a->l == b->l && a->id < b->id);
}

static int cmp_cand(const void *x, const void *y)
{
    const struct cand *a = x, *b = y;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Min-heap (root = worst) of the k best candidates; O(n log k). */
static void sift_down(struct cand *h, uint32_t k, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && before(&h[m], &h[l]))
            m = l;
        if (r < k && before(&h[m], &h[r]))
            m = r;
        if (m == i)
            return;
        struct cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static uint32_t select_top_k(struct dray_sampler *s, uint32_t n, uint32_t k)
{
    struct cand *h = s->cand;
    for (uint32_t i = 0; i < k; i++)
        h[i] = (struct cand){s->work[i], (int32_t)i};
    for (uint32_t i = k / 2; i-- > 0;)
        sift_down(h, k, i);
    for (uint32_t i = k; i < n; i++) {
        struct cand c = {s->work[i], (int32_t)i};
        if (before(&c, &h[0])) {
            h[0] = c;
            sift_down(h, k, 0);
        }
    }
    return k;
}

/* Draw from cand[0..k) with weights prob[0..k) (need not be normalized). */
static int32_t draw_weights(struct dray_sampler *s, uint32_t k)
{
    double total = 0;
    for (uint32_t i = 0; i < k; i++)
        total += s->prob[i];
    double u = dray_sampler_uniform(s) * total, cum = 0;
    for (uint32_t i = 0; i < k; i++) {
        cum += s->prob[i];
        if (u < cum)
            return s->cand[i].id;
    }
    return s->cand[k - 1].id; /* rounding at the very end */
}

/* After top-k: candidates sorted; softmax, top-p prefix, min-p, draw. */
static int32_t draw_sorted(struct dray_sampler *s, uint32_t k)
{
    float inv_t = 1.0f / s->p.temperature;
    double sum = 0;
    for (uint32_t i = 0; i < k; i++) {
        s->prob[i] = exp((double)(s->cand[i].l - s->cand[0].l) * inv_t);
        sum += s->prob[i];
    }
    uint32_t keep = k;
    if (s->p.top_p < 1) {
        double cum = 0, target = (double)s->p.top_p * sum;
        for (keep = 0; keep < k;) {
            cum += s->prob[keep++];
            if (cum >= target)
                break;
        }
    }
    uint32_t j = 0; /* prob[0] = 1 is the max */
    while (j < keep && s->prob[j] >= (double)s->p.min_p)
        j++;
    return draw_weights(s, j);
}

/* Without top-k, top-p and min-p need no full sort. One pass computes each
 * token's weight e = exp((l - max) / T) in (0, 1] and a histogram of the mass
 * over d = (max - l) / T in buckets of 1/HIST_RES. The top-p set is every bucket
 * above the one where the cumulative mass crosses top_p, plus the best tokens of
 * that one bucket (the only sort). min-p is the plain test e >= min_p. */
#define HIST_RES 4
#define HIST_N 256 /* d in [0, 64); the last bucket takes the rest */

static uint32_t bucket_of(float d)
{
    float b = d * HIST_RES;
    return b < HIST_N - 1 ? (uint32_t)b : HIST_N - 1;
}

static int32_t draw_threshold(struct dray_sampler *s, uint32_t n, float m)
{
    float inv_t = 1.0f / s->p.temperature;
    const float *l = s->work;
    double *e = s->prob, mass[HIST_N] = {0}, z = 0;
    for (uint32_t i = 0; i < n; i++) {
        float d = (m - l[i]) * inv_t; /* >= 0; +inf for -inf logits */
        e[i] = expf(-d);
        mass[bucket_of(d)] += e[i];
        z += e[i];
    }
    uint32_t cut = HIST_N; /* buckets < cut are kept whole */
    double target = (double)s->p.top_p * z, before = 0;
    if (s->p.top_p < 1)
        for (cut = 0; cut < HIST_N - 1 && before + mass[cut] < target; cut++)
            before += mass[cut];
    uint32_t k = 0, nb = 0;
    struct cand *edge = s->cand + n; /* boundary tokens, filled from the end */
    for (uint32_t i = 0; i < n; i++) {
        if (e[i] <= 0 || e[i] < (double)s->p.min_p)
            continue;
        uint32_t b = bucket_of((m - l[i]) * inv_t); /* same float ops as above */
        if (b < cut)
            s->cand[k++] = (struct cand){(float)e[i], (int32_t)i};
        else if (b == cut) {
            *--edge = (struct cand){l[i], (int32_t)i};
            nb++;
        }
    }
    qsort(edge, nb, sizeof(*edge), cmp_cand);
    for (uint32_t j = 0; j < nb && (cut == HIST_N || before < target); j++) {
        double w = exp((double)((edge[j].l - m) * inv_t));
        before += w;
        s->cand[k++] = (struct cand){(float)w, edge[j].id};
    }
    for (uint32_t i = 0; i < k; i++)
        s->prob[i] = s->cand[i].l;
    return k ? draw_weights(s, k) : (int32_t)argmax(s->work, n);
}

/* No truncation: one pass of exp, one scan. The weights go to prob (the float
 * values expf gives, as before), so work keeps the penalized row for
 * dray_sampler_row. */
static int32_t draw_full(struct dray_sampler *s, uint32_t n, float m)
{
    float inv_t = 1.0f / s->p.temperature;
    double z = 0, *w = s->prob;
    for (uint32_t i = 0; i < n; i++) {
        w[i] = expf((s->work[i] - m) * inv_t);
        z += w[i];
    }
    double u = dray_sampler_uniform(s) * z, cum = 0;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (w[i] <= 0)
            continue;
        cum += w[i];
        last = i;
        if (u < cum)
            return (int32_t)i;
    }
    return (int32_t)last;
}

/* Step 3b: the ids a constraint does not allow get -inf (whole words at a time:
 * most of a mask is all ones or all zeros). */
static void apply_allow(float *w, uint32_t n_vocab, const uint32_t *allow)
{
    for (uint32_t i = 0; i < (n_vocab + 31) / 32; i++) {
        uint32_t a = allow[i], base = i * 32, end = base + 32 < n_vocab ? base + 32 : n_vocab;
        if (a == UINT32_MAX)
            continue;
        for (uint32_t j = base; j < end; j++)
            if (!(a >> (j - base) & 1))
                w[j] = -INFINITY;
    }
}

int32_t dray_sampler_sample(struct dray_sampler *s, const float *logits, uint32_t n_vocab,
                            const int32_t *history, size_t n_history)
{
    return dray_sampler_sample_allowed(s, logits, n_vocab, history, n_history, NULL);
}

int32_t dray_sampler_sample_allowed(struct dray_sampler *s, const float *logits, uint32_t n_vocab,
                                    const int32_t *history, size_t n_history, const uint32_t *allow)
{
    if (!logits || n_vocab == 0 || n_vocab > INT32_MAX)
        return DRAY_EINVAL;
    if (reserve(s, n_vocab))
        return DRAY_ENOMEM;
    penalize(s, logits, n_vocab, history, n_history);
    if (allow)
        apply_allow(s->work, n_vocab, allow);
    uint32_t best = argmax(s->work, n_vocab);
    float m = s->work[best];
    /* greedy (top_p 0 keeps only the most likely token, as OpenAI reads it); or
     * all -inf / an +inf logit: nothing to weigh */
    if (s->p.temperature == 0 || s->p.top_p == 0 || isinf(m))
        return (int32_t)best;
    uint32_t k = s->p.top_k && s->p.top_k < n_vocab ? s->p.top_k : 0;
    if (!k && (s->p.top_p < 1 || s->p.min_p > 0))
        return draw_threshold(s, n_vocab, m);
    if (!k)
        return draw_full(s, n_vocab, m);
    k = select_top_k(s, n_vocab, k);
    qsort(s->cand, k, sizeof(*s->cand), cmp_cand);
    return draw_sorted(s, k);
}

const float *dray_sampler_row(const struct dray_sampler *s)
{
    return s->work;
}

enum dray_sampler_shape dray_sampler_shape(const struct dray_sampler *s, uint32_t *k)
{
    *k = 1;
    if (s->p.temperature == 0 || s->p.top_p == 0)
        return DRAY_SAMPLER_TOP_K; /* the best one */
    if (s->p.top_k) {
        *k = s->p.top_k;
        return DRAY_SAMPLER_TOP_K;
    }
    return s->p.top_p < 1 || s->p.min_p > 0 ? DRAY_SAMPLER_WHOLE : DRAY_SAMPLER_PLAIN;
}

long dray_sampler_best(struct dray_sampler *s, const float *logits, uint32_t n_vocab,
                       const int32_t *history, size_t n_history, int32_t *ids, uint32_t m)
{
    if (!logits || n_vocab == 0 || n_vocab > INT32_MAX)
        return DRAY_EINVAL;
    if (reserve(s, n_vocab))
        return DRAY_ENOMEM;
    penalize(s, logits, n_vocab, history, n_history);
    if (m > n_vocab)
        m = n_vocab;
    uint32_t k = select_top_k(s, n_vocab, m);
    qsort(s->cand, k, sizeof(*s->cand), cmp_cand);
    long n = 0;
    for (uint32_t i = 0; i < k && s->cand[i].l > -INFINITY; i++)
        ids[n++] = s->cand[i].id;
    return n;
}

int32_t dray_sampler_draw_among(struct dray_sampler *s, const int32_t *ids, uint32_t n)
{
    if (n == 0)
        return DRAY_EINVAL;
    if (s->p.temperature == 0 || s->p.top_p == 0)
        return ids[0];
    for (uint32_t i = 0; i < n; i++)
        s->cand[i] = (struct cand){s->work[ids[i]], ids[i]};
    return draw_sorted(s, n);
}
