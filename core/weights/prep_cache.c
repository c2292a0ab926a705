/* Prepared-layout cache (prep_cache.h). */
#include "prep_cache.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache_file.h"
#include "dray/gguf.h"
#include "dray/plugins.h"
#include "log.h"

#define PREP_VERSION 1u
#define HEAD 4096u
#define KEY 112u

struct entry {
    char key[KEY];
    uint64_t at, bytes, xxh;
};

struct head {
    char magic[8];
    uint32_t version, entries;
    uint64_t index_at;
    char layout_id[32];
    char precision[16];
};

struct dray_prep_cache {
    const struct dray_device *dev;
    char path[4096], tmp[4200];
    struct head h;
    struct entry *e;
    uint32_t n, cap;
    /* a hit: the mapping */
    const uint8_t *map;
    size_t map_len;
    /* a miss: the temporary file, its end, and whether it is still good */
    int fd;
    uint64_t end;
    bool failed;
    bool stale; /* a hit with a damaged entry: removed at commit, made again next time */
};

static uint64_t up4k(uint64_t n)
{
    return (n + HEAD - 1) & ~(uint64_t)(HEAD - 1);
}

/* The model file's key: size, mtime and its first 16 MiB. */
static bool model_key(const struct dray_gguf *g, unsigned char out[16])
{
    struct stat st;
    if (stat(dray_gguf_name(g), &st))
        return false;
    uint64_t size = dray_gguf_file_size(g), head = size < (16u << 20) ? size : (16u << 20);
    uint64_t id[3] = {size, (uint64_t)st.st_mtim.tv_sec, (uint64_t)st.st_mtim.tv_nsec};
    XXH3_state_t *s = XXH3_createState();
    if (!s)
        return false;
    XXH3_128bits_reset(s);
    XXH3_128bits_update(s, id, sizeof(id));
    XXH3_128bits_update(s, dray_gguf_bytes(g), head);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s));
    memcpy(out, c.digest, 16);
    XXH3_freeState(s);
    return true;
}

/* Map path and check its header and index against c->h; false = a miss. */
static bool map_hit(struct dray_prep_cache *c)
{
    int fd = open(c->path, O_RDONLY);
    if (fd < 0)
        return false;
    struct stat st;
    bool ok = fstat(fd, &st) == 0 && st.st_size >= HEAD;
    void *m = ok ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED)
        return false;
    c->map = m;
    c->map_len = (size_t)st.st_size;
    struct head h;
    memcpy(&h, m, sizeof(h));
    uint64_t ib = (uint64_t)h.entries * sizeof(struct entry);
    if (memcmp(h.magic, c->h.magic, 8) || h.version != PREP_VERSION || strcmp(h.layout_id, c->h.layout_id) ||
        strcmp(h.precision, c->h.precision) || h.index_at > c->map_len || ib > c->map_len - h.index_at) {
        dray_warn("prepared layouts %s do not match this dray (or are damaged); preparing again", c->path);
        return false;
    }
    c->e = malloc(ib ? ib : 1);
    if (!c->e)
        return false;
    memcpy(c->e, c->map + h.index_at, ib);
    c->n = h.entries;
    for (uint32_t i = 0; i < c->n; i++)
        if (c->e[i].at > c->map_len || c->e[i].bytes > c->map_len - c->e[i].at || c->e[i].key[KEY - 1]) {
            dray_warn("prepared layouts %s: entry %u lies outside the file; preparing again", c->path, i);
            return false;
        }
    return true;
}

static void unmap(struct dray_prep_cache *c)
{
    if (c->map)
        munmap((void *)(uintptr_t)c->map, c->map_len);
    c->map = NULL;
    free(c->e);
    c->e = NULL;
    c->n = c->cap = 0;
}

struct dray_prep_cache *dray_prep_cache_open(const struct dray_gguf *g, const struct dray_device *dev,
                                             const char *precision, bool *hit)
{
    *hit = false;
    const struct dray_ops *ops = dev->ops;
    unsigned char key[16];
    if (!DRAY_HAS(ops, weight_export, 5) || !DRAY_HAS(ops, weight_import, 5) || !ops->layout_id ||
        strlen(ops->layout_id) >= 32 || strlen(precision) >= 16 || !model_key(g, key))
        return NULL;
    struct dray_prep_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->dev = dev;
    c->fd = -1;
    memcpy(c->h.magic, "DRAYPRP1", 8);
    c->h.version = PREP_VERSION;
    snprintf(c->h.layout_id, sizeof(c->h.layout_id), "%s", ops->layout_id);
    snprintf(c->h.precision, sizeof(c->h.precision), "%s", precision);
    char suffix[80];
    snprintf(suffix, sizeof(suffix), "-%s-%s-v%u.bin", ops->layout_id, precision, PREP_VERSION);
    if (!dray_cache_path(c->path, sizeof(c->path), "prep-", key, suffix)) {
        free(c);
        return NULL;
    }
    if (map_hit(c)) {
        *hit = true;
        return c;
    }
    unmap(c);
    snprintf(c->tmp, sizeof(c->tmp), "%s.tmp.%ld", c->path, (long)getpid());
    c->fd = open(c->tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (c->fd < 0) {
        dray_warn("prepared layouts: cannot write %s; the next start prepares again", c->tmp);
        free(c);
        return NULL;
    }
    c->end = HEAD;
    return c;
}

const void *dray_prep_cache_find(struct dray_prep_cache *c, const char *key, uint64_t *nbytes)
{
    for (uint32_t i = 0; c && c->map && i < c->n; i++) {
        const struct entry *e = &c->e[i];
        if (strcmp(e->key, key))
            continue;
        if (XXH3_64bits(c->map + e->at, e->bytes) != e->xxh) {
            dray_warn("prepared layouts %s: %s does not match its checksum; preparing it again (and the "
                      "file at the next start)", c->path, key);
            c->stale = true;
            return NULL;
        }
        *nbytes = e->bytes;
        return c->map + e->at;
    }
    return NULL;
}

static void give_up(struct dray_prep_cache *c, const char *why)
{
    if (!c->failed)
        dray_warn("prepared layouts: %s; the next start prepares again", why);
    c->failed = true;
}

void dray_prep_cache_put(struct dray_prep_cache *c, const char *key, const struct dray_packed *w)
{
    if (!c || c->map || c->failed)
        return;
    const struct dray_ops *ops = c->dev->ops;
    uint64_t n = 0;
    if (strlen(key) >= KEY || ops->weight_export(c->dev->ctx, w, NULL, &n)) {
        give_up(c, "a weight cannot be exported");
        return;
    }
    void *buf = malloc(n ? n : 1);
    if (!buf || ops->weight_export(c->dev->ctx, w, buf, &n)) {
        free(buf);
        give_up(c, "a weight cannot be exported");
        return;
    }
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? 2 * c->cap : 256;
        struct entry *e = realloc(c->e, cap * sizeof(*e));
        if (!e) {
            free(buf);
            give_up(c, "out of memory");
            return;
        }
        c->e = e, c->cap = cap;
    }
    struct entry *e = &c->e[c->n];
    memset(e, 0, sizeof(*e));
    snprintf(e->key, KEY, "%s", key);
    e->at = c->end, e->bytes = n, e->xxh = XXH3_64bits(buf, n);
    ssize_t wr = pwrite(c->fd, buf, n, (off_t)e->at);
    free(buf);
    if (wr < 0 || (uint64_t)wr != n) {
        give_up(c, "a write to the cache folder failed");
        return;
    }
    c->n++;
    c->end = up4k(e->at + n);
}

void dray_prep_cache_commit(struct dray_prep_cache *c)
{
    if (c && c->map && c->stale) /* the mapping stays valid for the handles in it */
        unlink(c->path);
    if (!c || c->map || c->fd < 0)
        return;
    c->h.entries = c->n;
    c->h.index_at = c->end;
    uint64_t ib = (uint64_t)c->n * sizeof(struct entry);
    bool ok = !c->failed && c->n > 0 && pwrite(c->fd, c->e, ib, (off_t)c->end) == (ssize_t)ib &&
              pwrite(c->fd, &c->h, sizeof(c->h), 0) == (ssize_t)sizeof(c->h);
    close(c->fd);
    c->fd = -1;
    if (ok && rename(c->tmp, c->path) == 0)
        dray_info("prepared layouts stored in %s (%u weights)", c->path, c->n);
    else
        unlink(c->tmp);
}

void dray_prep_cache_close(struct dray_prep_cache *c)
{
    if (!c)
        return;
    if (c->fd >= 0) { /* never committed: the load failed */
        close(c->fd);
        unlink(c->tmp);
    }
    unmap(c);
    free(c);
}
