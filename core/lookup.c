/* Prompt-lookup drafts and when to try them. See lookup.h. */
#include "lookup.h"

#include <string.h>

size_t dray_lookup_draft(const int32_t *hist, size_t n, int32_t next, int32_t *draft, size_t max)
{
    int32_t tail[DRAY_LOOKUP_NGRAM_MAX];
    for (size_t g = DRAY_LOOKUP_NGRAM_MAX; g >= DRAY_LOOKUP_NGRAM_MIN; g--) {
        if (n + 1 <= g)
            continue;
        memcpy(tail, hist + n + 1 - g, (g - 1) * sizeof(*tail));
        tail[g - 1] = next;
        /* the latest earlier occurrence: the nearest context is the likeliest copy */
        for (size_t at = n + 1 - g; at-- > 0;) {
            if (memcmp(hist + at, tail, g * sizeof(*tail)))
                continue;
            size_t k = 0;
            for (size_t j = at + g; j <= n && k < max; j++) /* hist, then next */
                draft[k++] = j < n ? hist[j] : next;
            return k;
        }
    }
    return 0;
}

uint32_t dray_lookup_try(struct dray_lookup_policy *p, uint32_t max)
{
    if (p->wait) {
        p->wait--;
        return 0;
    }
    return p->len && p->len < max ? p->len : max;
}

void dray_lookup_kept(struct dray_lookup_policy *p, size_t n, size_t kept)
{
    if (kept) {
        p->backoff = 0;
        p->len = (uint32_t)(kept == n ? 2 * n : kept + 1);
        return;
    }
    p->len = 1;
    p->wait = p->backoff ? p->backoff : 1;
    p->backoff = p->wait * 2 > 64 ? 64 : p->wait * 2;
}
