/* core/lookup.h — drafts for speculative decoding by prompt lookup: replies
 * that copy their context (summaries, code edits, answers quoting a document)
 * repeat spans of it, so the tokens that followed the last occurrence of the
 * newest n-gram are a cheap guess at what comes next. The decode loop verifies
 * a draft in one batched step (the weights are read once for all its tokens)
 * and keeps the longest prefix the sampler agrees with, which leaves the
 * output exactly what decoding one token at a time gives. A policy stops
 * drafting while drafts keep failing, so text that copies nothing pays only
 * the cheap search. */
#ifndef DRAY_CORE_LOOKUP_H
#define DRAY_CORE_LOOKUP_H

#include <stddef.h>
#include <stdint.h>

#define DRAY_LOOKUP_NGRAM_MAX 4 /* the longest suffix looked for */
#define DRAY_LOOKUP_NGRAM_MIN 2 /* shorter matches guess too often wrong */

/* The text so far is hist[0..n) then next. Up to max tokens that followed the
 * latest earlier occurrence of its longest suffix (of DRAY_LOOKUP_NGRAM_MAX down
 * to _MIN tokens) into draft; returns how many (0: no match). O(n) a call. */
size_t dray_lookup_draft(const int32_t *hist, size_t n, int32_t next, int32_t *draft, size_t max);

/* When to draft and how long: after a draft whose tokens were all refused, the
 * next tries wait (1, 2, 4, ... 64 tokens); the length follows what was kept
 * (all kept: twice as long, up to the maximum; else one more than was kept),
 * so a text that copies a little pays for short drafts only. */
struct dray_lookup_policy {
    uint32_t wait;    /* tokens to decode before the next try */
    uint32_t backoff; /* the wait after the next failure */
    uint32_t len;     /* tokens the next draft may have; 0 = not set yet (the maximum) */
};
/* The length of a draft now (0: do not try yet; counts the wait down), at most max. */
uint32_t dray_lookup_try(struct dray_lookup_policy *p, uint32_t max);
/* A draft of n tokens was verified and kept of them. */
void dray_lookup_kept(struct dray_lookup_policy *p, size_t n, size_t kept);

#endif
