/* Calibration cache: the calibration scores of a model (outlier-channel scores
 * of int8 weights, K maxima for K smoothing of an int8 KV), stored once per model
 * file and weight precision so later starts, on any plugin, skip the calibration
 * pass (a forward over the calibration text: about a second on the CPU, minutes
 * on a software Vulkan device).
 *
 * Key: the 128-bit XXH3 of the model file's whole content, the weight precision
 * the pass ran in ("int8" calibrates in f32, "w4a8" in its own 4-bit weights, so
 * their K maxima differ slightly, and each precision must always get the same
 * weights) and DRAY_CALIB_VERSION (bumped whenever the calibration text or
 * algorithm changes). The scores depend on nothing else: not on the plugin, the
 * context or the chunk (calibrate.h).
 *
 * File: <dir>/calib-<hash in hex>-<precision>-v<version>.bin, where dir is $DRAY_CACHE_DIR,
 * else $XDG_CACHE_HOME/dray, else $HOME/.cache/dray ($DRAY_CACHE_DIR=none turns
 * the cache off). Layout, little-endian:
 *     "DRAYCAL1", u32 version, u32 0, u8 file_hash[16], u64 file_size,
 *     u64 n, f32 scores[n], u64 XXH3_64(scores)
 * A file that does not match (another version, another model, a short or
 * corrupt file) is reported and replaced by a fresh calibration. Writes go to a
 * temporary file renamed into place, so a reader never sees half a file. */
#ifndef DRAY_CORE_CALIB_CACHE_H
#define DRAY_CORE_CALIB_CACHE_H

#include <stddef.h>

#define DRAY_CALIB_VERSION 3u /* 2: K maxima for the int8 KV appended; 3: precision in the key */

struct dray_gguf;

/* The cache file for g calibrated in `precision` (a config name: "int8", "w4a8",
 * ...) in path (NUL-terminated; "" when the cache is off or no folder can be
 * named). Then *scores (malloc'd) and *n when a valid file is there; NULL and 0
 * otherwise. Never fails: a missing cache is just a miss. */
void dray_calib_cache_lookup(const struct dray_gguf *g, const char *precision, char *path,
                             size_t path_len, float **scores, size_t *n);
/* Store scores for g at path (from lookup). 0, or DRAY_EIO with err set (the
 * caller warns and goes on: a cache that cannot be written costs time only). */
int dray_calib_cache_store(const char *path, const struct dray_gguf *g, const float *scores,
                           size_t n, char *err, size_t errlen);

#endif
