/*
 * Prefix cache: the KV of earlier requests kept for later ones that start with
 * the same tokens (the next turn of a chat resends the whole conversation).
 *
 * Keys. A sequence's tokens are cut into blocks of the KV block size. Block k is
 * keyed by a chained hash of the whole prefix up to its end:
 *     h(k) = XXH3_64(tokens of block k, seed = h(k-1)),  h(-1) = tenant salt,
 * so equal keys mean equal prefixes (the block's tokens are also stored and
 * compared, so a hash collision can never hand out the wrong KV). Entries form a
 * radix tree over blocks: each entry's parent is the entry one block shorter.
 * The end of an inserted sequence rarely falls on a block boundary: its partial
 * last block is a tail entry (fewer tokens, always a leaf). A lookup uses an
 * entry's block up to where the query stops matching it, so a request reuses a
 * tail, or diverges inside a cached block and reuses up to the divergence. The
 * block it continues in is shared; kv.c copies it on write (kv.h).
 *
 * What an entry holds. Global-attention layers need the KV of every position,
 * so an entry holds its block of every global group. Sliding-window layers only
 * need the last `window` positions before the point of reuse, and their older
 * blocks are recycled as a sequence grows; so the window groups' blocks are kept
 * only at checkpoints: the entry at the end of an inserted sequence (the end of a
 * finished request: prompt plus reply) holds a reference to the window blocks a
 * query there can see (from the last block boundary on, so it also serves a
 * query anywhere inside its last block). A lookup reuses the longest cached
 * prefix that a checkpoint serves: the next turn of a chat extends exactly such
 * a prefix. A query that diverges further back (an earlier message edited)
 * reuses everything up to the divergence when the checkpoints around it hold
 * the window blocks it needs between them, which they do when they lie less
 * than a window apart (a chat leaves one per reply and one per user header);
 * otherwise it falls back to the longest prefix one checkpoint serves.
 * Recomputing only the window layers' last `window` positions instead would not
 * give a cold run's KV: each window layer's input at a position depends on the
 * window before it in every window layer below (prefix_cache.c).
 *
 * Memory. Every block the cache holds is one reference (kv.h); blocks in use by
 * running sequences are shared, never copied. When the KV pool runs short, the
 * KV manager asks the cache to let go, least recently used first: checkpoints
 * (window pressure) or entries' global blocks (global pressure) that only the
 * cache holds move to the host tier: downloaded through the plugin in kv.h's
 * vendor-neutral layout, up to host_bytes. A hit on a spilled prefix uploads it
 * into fresh device blocks first. What the host tier cannot take is dropped;
 * the host tier itself evicts oldest first (an entry only from a leaf, so every
 * cached prefix stays reachable from the root).
 *
 * Not thread-safe: the scheduler's loop thread owns it, as it owns the KV.
 */
#ifndef DRAY_CORE_PREFIX_CACHE_H
#define DRAY_CORE_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

struct dray_kv;
struct dray_pcache;

struct dray_pcache_stats {
    uint64_t lookups, lookup_tokens, hit_tokens; /* tokens asked for / served from cache */
    uint64_t entries, checkpoints;               /* live now */
    uint64_t blocks;                             /* block references held now */
    uint64_t evictions;                          /* entries and checkpoints dropped */
    uint64_t host_bytes;                         /* host tier: bytes held now */
    uint64_t spills, restores;                   /* device -> host, host -> device moves */
    uint64_t assembled;                          /* hits whose window blocks came from
                                                  * several checkpoints (a divergence
                                                  * inside a cached prefix) */
};

/* Registers itself as the KV manager's reclaim callback. host_bytes: the host
 * tier's budget (0 = no host tier: what the device cannot keep is dropped). */
int dray_pcache_create(struct dray_kv *kv, uint64_t host_bytes, struct dray_pcache **out);
/* Drops every reference it holds. */
void dray_pcache_free(struct dray_pcache *pc);

/* The salt of a tenant (an API key, a user): prefixes of different tenants
 * never match. NULL or "" is the shared tenant 0. */
uint64_t dray_pcache_salt(const char *tenant);

/* Give the empty KV sequence seq the longest cached prefix of ids[0..n) that a
 * checkpoint serves; returns its length in tokens (any length, 0 on a miss).
 * Pass n = tokens that may be reused: leave at least the last prompt token out,
 * since its logits must be computed. */
uint32_t dray_pcache_attach(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t n,
                            uint32_t seq);

/* Record sequence seq, whose first len tokens (all in its KV) are ids: its full
 * blocks, its partial last block as a tail, and a checkpoint at its end. The
 * sequence must not grow after this unless through a step (which copies the
 * shared tail block before writing). */
void dray_pcache_insert(struct dray_pcache *pc, uint64_t salt, const int32_t *ids, size_t len,
                        uint32_t seq);

void dray_pcache_get_stats(const struct dray_pcache *pc, struct dray_pcache_stats *st);

#endif
