/* Prepared-layout cache (ABI v5): what a plugin's weight_create made, stored
 * once per model file, plugin layout and precision, and mapped at later starts
 * so that a warm start neither reads the file's weights nor packs them
 * (docs/performance.md, "Start-up").
 *
 * File: <cache dir>/prep-<key>-<layout_id>-<precision>-v1.bin, key = XXH3-128 of
 * the model file's size, modification time and first 16 MiB (its metadata and
 * tensor table): a changed file gets a new key, and a full-content hash (half
 * a second for 4 GB) is not paid at every start. Little-endian:
 *   header (4096 bytes): "DRAYPRP1", u32 version, u32 entries, u64 index_at,
 *     char layout_id[32], char precision[16];
 *   blobs, each at a 4096-byte boundary: weight_export's bytes, as they are;
 *   index at index_at: entries x {char key[112]; u64 at, bytes, xxh64}.
 * A blob's XXH3-64 is checked before the plugin sees it; a file that does not
 * match is reported and written again. Writes go to a temporary file renamed
 * into place once the load finished. */
#ifndef DRAY_CORE_PREP_CACHE_H
#define DRAY_CORE_PREP_CACHE_H

#include <stdbool.h>
#include <stdint.h>

struct dray_gguf;
struct dray_device;
struct dray_packed;
struct dray_prep_cache;

/* The cache of g's weights prepared on dev under precision, or NULL when the
 * cache is off or dev's plugin has no prepared layouts (ABI < 5). *hit: the
 * file is there and mapped; else weights are to be put. */
struct dray_prep_cache *dray_prep_cache_open(const struct dray_gguf *g, const struct dray_device *dev,
                                             const char *precision, bool *hit);
/* A hit: the bytes stored under key (checked), or NULL. */
const void *dray_prep_cache_find(struct dray_prep_cache *c, const char *key, uint64_t *nbytes);
/* A miss: w's bytes under key. A failure is reported once and the cache given
 * up; the load goes on. */
void dray_prep_cache_put(struct dray_prep_cache *c, const char *key, const struct dray_packed *w);
/* The load finished: a miss with every put is renamed into place (else
 * dropped). The mapping of a hit stays (handles point into it). */
void dray_prep_cache_commit(struct dray_prep_cache *c);
/* After every handle made from it is freed: unmap, free (NULL ok). */
void dray_prep_cache_close(struct dray_prep_cache *c);

#endif
