/* The rounded-weights cache on disk (round_cache.h). */
#include "round_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dray/backend.h"
#include "dray/gguf.h"
#include "cache_file.h"
#include "log.h"

static const char magic[8] = {'D', 'R', 'A', 'Y', 'R', 'N', 'D', '1'};

struct header {
    char magic[8];
    uint32_t version, dtype;
    unsigned char tensor_hash[16];
    uint32_t type, zero;
    uint64_t rows, k, sum_codes, sum_scales;
};

struct dray_round_cache {
    char path[4200], tmp[4300];
    struct header h;
    uint64_t code_bytes, scale_bytes; /* per row */
    /* a hit: the file mapped */
    const unsigned char *map;
    size_t map_len;
    /* a miss: the file being written, the next row expected, running sums */
    int fd;
    uint64_t next;
    XXH3_state_t *codes, *scales;
};

static uint64_t data_offset(const struct dray_round_cache *c, int scales, uint64_t row)
{
    return sizeof(struct header) + (scales ? c->h.rows * c->code_bytes + row * c->scale_bytes
                                           : row * c->code_bytes);
}

/* Done with n mapped bytes at p for now: their pages leave the resident set
 * (the mapping is the file's, read again if touched), so a hit never holds
 * the whole file in memory beside the weights it becomes. */
static void release(const void *p, uint64_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p & ~(page - 1);
    madvise((void *)lo, (uintptr_t)p + n - lo, MADV_DONTNEED);
}

/* XXH3_64 of n mapped bytes, released chunk by chunk as they are hashed. */
static uint64_t sum_released(const unsigned char *p, uint64_t n)
{
    enum { CHUNK = 8u << 20 };
    XXH3_state_t *s = XXH3_createState();
    if (!s || XXH3_64bits_reset(s)) {
        XXH3_freeState(s);
        return XXH3_64bits(p, n);
    }
    for (uint64_t at = 0; at < n; at += CHUNK) {
        uint64_t len = n - at < CHUNK ? n - at : CHUNK;
        XXH3_64bits_update(s, p + at, len);
        release(p + at, len);
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* Map path and check it against c->h; true when every row is there intact. */
static bool map_valid(struct dray_round_cache *c, const char **why)
{
    int fd = open(c->path, O_RDONLY);
    if (fd < 0)
        return false; /* the first start with this model: no reason to tell */
    struct stat st;
    size_t want = (size_t)data_offset(c, 1, c->h.rows);
    void *m = fstat(fd, &st) == 0 && (size_t)st.st_size == want
                  ? mmap(NULL, want, PROT_READ, MAP_PRIVATE, fd, 0)
                  : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) {
        *why = "short or unreadable";
        return false;
    }
    const struct header *h = m;
    const unsigned char *base = m;
    if (memcmp(h->magic, magic, sizeof(magic)) || h->version != c->h.version || h->dtype != c->h.dtype)
        *why = "written by another version";
    else if (memcmp(h->tensor_hash, c->h.tensor_hash, 16) || h->type != c->h.type || h->rows != c->h.rows ||
             h->k != c->h.k)
        *why = "made for another tensor";
    else if (h->sum_codes != sum_released(base + data_offset(c, 0, 0), c->h.rows * c->code_bytes) ||
             h->sum_scales != sum_released(base + data_offset(c, 1, 0), c->h.rows * c->scale_bytes))
        *why = "corrupt";
    if (*why) {
        munmap(m, want);
        return false;
    }
    c->map = m;
    c->map_len = want;
    return true;
}

struct dray_round_cache *dray_round_cache_open(const struct dray_gguf_tensor *t, uint32_t dtype, bool *hit)
{
    *hit = false;
    uint64_t k = t->ne[0], rows = t->ne[1];
    if ((dtype != DRAY_Q4G32 && dtype != DRAY_Q4G32H) || t->n_dims != 2 || !rows || k % 32 ||
        strchr(t->name, '/'))
        return NULL;
    struct dray_round_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    if (!dray_cache_dir(c->path, sizeof(c->path))) { /* off: no need to hash the tensor */
        free(c);
        return NULL;
    }
    c->fd = -1;
    c->h = (struct header){.version = DRAY_ROUND_VERSION, .dtype = dtype, .type = t->type, .rows = rows, .k = k};
    memcpy(c->h.magic, magic, sizeof(magic));
    c->code_bytes = k / 2;
    c->scale_bytes = k / 16 * sizeof(float);
    dray_cache_file_hash(t->file, t->data, (size_t)t->nbytes, c->h.tensor_hash);
    char suffix[320];
    snprintf(suffix, sizeof(suffix), "-%s-%s-v%u.bin", t->name, dtype == DRAY_Q4G32H ? "q4gh" : "q4g",
             DRAY_ROUND_VERSION);
    if (!dray_cache_path(c->path, sizeof(c->path), "round-", c->h.tensor_hash, suffix)) {
        free(c);
        return NULL;
    }
    const char *why = NULL;
    if (map_valid(c, &why)) {
        *hit = true;
        dray_info("rounded %s from the cache %s", t->name, c->path);
        return c;
    }
    if (why)
        dray_warn("rounded-weights cache %s: %s; rounding again", c->path, why);
    snprintf(c->tmp, sizeof(c->tmp), "%s.%ld.tmp", c->path, (long)getpid());
    c->fd = open(c->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    c->codes = XXH3_createState();
    c->scales = XXH3_createState();
    if (c->fd < 0 || !c->codes || !c->scales || XXH3_64bits_reset(c->codes) || XXH3_64bits_reset(c->scales)) {
        if (c->fd < 0)
            dray_warn("rounded-weights cache %s: %s; not caching", c->tmp, strerror(errno));
        dray_round_cache_close(c);
        return NULL;
    }
    return c;
}

void dray_round_cache_get(const struct dray_round_cache *c, uint64_t row0, uint64_t n, uint8_t *q,
                          float *sc)
{
    memcpy(q, c->map + data_offset(c, 0, row0), n * c->code_bytes);
    memcpy(sc, c->map + data_offset(c, 1, row0), n * c->scale_bytes);
    release(c->map + data_offset(c, 0, row0), n * c->code_bytes);
    release(c->map + data_offset(c, 1, row0), n * c->scale_bytes);
}

/* Write all of buf at off; false on any failure. */
static bool put_all(int fd, const void *buf, size_t len, uint64_t off)
{
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (w <= 0)
            return false;
        done += (size_t)w;
    }
    return true;
}

/* Give a miss up: the load goes on without the cache. */
static void give_up(struct dray_round_cache *c, const char *why)
{
    dray_warn("rounded-weights cache %s: %s; not caching", c->tmp, why);
    close(c->fd);
    unlink(c->tmp);
    c->fd = -1;
}

void dray_round_cache_put(struct dray_round_cache *c, uint64_t row0, uint64_t n, const uint8_t *q,
                          const float *sc)
{
    if (!c || c->fd < 0)
        return;
    if (row0 != c->next || row0 + n > c->h.rows) {
        give_up(c, "rows out of order");
        return;
    }
    size_t cb = (size_t)(n * c->code_bytes), sb = (size_t)(n * c->scale_bytes);
    if (!put_all(c->fd, q, cb, data_offset(c, 0, row0)) || !put_all(c->fd, sc, sb, data_offset(c, 1, row0))) {
        give_up(c, strerror(errno ? errno : EIO));
        return;
    }
    XXH3_64bits_update(c->codes, q, cb);
    XXH3_64bits_update(c->scales, sc, sb);
    c->next += n;
}

void dray_round_cache_close(struct dray_round_cache *c)
{
    if (!c)
        return;
    if (c->map)
        munmap((void *)c->map, c->map_len);
    if (c->fd >= 0 && c->next == c->h.rows) {
        c->h.sum_codes = XXH3_64bits_digest(c->codes);
        c->h.sum_scales = XXH3_64bits_digest(c->scales);
        bool ok = put_all(c->fd, &c->h, sizeof(c->h), 0);
        ok = close(c->fd) == 0 && ok;
        c->fd = -1;
        if (!ok || rename(c->tmp, c->path)) {
            dray_warn("rounded-weights cache %s: %s; not caching", c->path, strerror(errno ? errno : EIO));
            unlink(c->tmp);
        }
    } else if (c->fd >= 0) { /* the load failed part way */
        close(c->fd);
        unlink(c->tmp);
    }
    XXH3_freeState(c->codes);
    XXH3_freeState(c->scales);
    free(c);
}
