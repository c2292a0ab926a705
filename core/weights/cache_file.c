/* The cache folder and the model key (cache_file.h). */
#include "cache_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "dray/gguf.h"

bool dray_cache_dir(char *dir, size_t len)
{
    const char *d = getenv("DRAY_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (d && !strcmp(d, "none"))
        return false;
    if (d && d[0])
        snprintf(dir, len, "%s", d);
    else if (x && x[0])
        snprintf(dir, len, "%s/dray", x);
    else if (home && home[0])
        snprintf(dir, len, "%s/.cache/dray", home);
    else
        return false;
    /* mkdir -p, one level at a time */
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0755);
            *p = '/';
        }
    return mkdir(dir, 0755) == 0 || errno == EEXIST;
}

void dray_cache_bytes_hash(const void *p, size_t n, unsigned char out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}

void dray_cache_file_hash(const struct dray_gguf *g, const void *p, size_t n, unsigned char out[16])
{
    enum { CHUNK = 8u << 20 }; /* read, hashed, released: the file never stays resident */
    XXH3_state_t *s = XXH3_createState();
    if (!s || XXH3_128bits_reset(s)) {
        XXH3_freeState(s);
        dray_cache_bytes_hash(p, n, out);
        return;
    }
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t len = n - at < CHUNK ? n - at : CHUNK;
        XXH3_128bits_update(s, (const char *)p + at, len);
        dray_gguf_release(g, (const char *)p + at, len);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s));
    memcpy(out, c.digest, 16);
    XXH3_freeState(s);
}

void dray_cache_model_hash(const struct dray_gguf *g, unsigned char out[16])
{
    dray_cache_file_hash(g, dray_gguf_bytes(g), (size_t)dray_gguf_file_size(g), out);
}

bool dray_cache_path(char *path, size_t len, const char *prefix, const unsigned char hash[16],
                     const char *suffix)
{
    char dir[4096];
    path[0] = 0;
    if (!dray_cache_dir(dir, sizeof(dir)))
        return false;
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", hash[i]);
    int n = snprintf(path, len, "%s/%s%s%s", dir, prefix, hex, suffix);
    if (n < 0 || (size_t)n >= len) {
        path[0] = 0;
        return false;
    }
    return true;
}
