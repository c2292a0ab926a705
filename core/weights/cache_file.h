/* What the on-disk caches share (calib_cache.c, round_cache.c): the folder they
 * live in and the key of a model file. */
#ifndef DRAY_CORE_CACHE_FILE_H
#define DRAY_CORE_CACHE_FILE_H

#include <stdbool.h>
#include <stddef.h>

struct dray_gguf;

/* The cache folder, created if needed: $DRAY_CACHE_DIR, else $XDG_CACHE_HOME/dray,
 * else $HOME/.cache/dray. False when the cache is off ($DRAY_CACHE_DIR=none) or
 * no folder can be named or made. */
bool dray_cache_dir(char *dir, size_t len);

/* The 128-bit XXH3 of n bytes, canonical byte order; of the model file's whole
 * content. */
void dray_cache_bytes_hash(const void *p, size_t n, unsigned char out[16]);
/* The same of n bytes at p inside g's file, read in chunks that leave the
 * resident set as they are hashed (dray_gguf_release). */
void dray_cache_file_hash(const struct dray_gguf *g, const void *p, size_t n, unsigned char out[16]);
void dray_cache_model_hash(const struct dray_gguf *g, unsigned char out[16]);

/* "<dir>/<prefix><hash in hex><suffix>" into path; false (path "") when the
 * cache is off. */
bool dray_cache_path(char *path, size_t len, const char *prefix, const unsigned char hash[16],
                     const char *suffix);

#endif
