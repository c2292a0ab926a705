/* Calibration cache on disk (calib_cache.h). */
#include "calib_cache.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "dray/dray.h"
#include "dray/gguf.h"
#include "cache_file.h"
#include "error.h"
#include "log.h"

static const char magic[8] = {'D', 'R', 'A', 'Y', 'C', 'A', 'L', '1'};

struct header {
    char magic[8];
    uint32_t version, zero;
    unsigned char file_hash[16];
    uint64_t file_size, n;
};

/* Read and check the file; its scores or NULL with the reason in why. */
static float *read_scores(FILE *f, const struct header *want, size_t *n, const char **why)
{
    struct header h;
    if (fread(&h, sizeof(h), 1, f) != 1 || memcmp(h.magic, magic, sizeof(magic))) {
        *why = "not a calibration cache file";
        return NULL;
    }
    if (h.version != want->version) {
        *why = "written by another calibration version";
        return NULL;
    }
    if (memcmp(h.file_hash, want->file_hash, 16) || h.file_size != want->file_size) {
        *why = "made for another model file";
        return NULL;
    }
    float *s = h.n && h.n < (1ull << 32) ? malloc(h.n * sizeof(float)) : NULL;
    uint64_t sum = 0;
    if (!s || fread(s, sizeof(float), h.n, f) != h.n || fread(&sum, sizeof(sum), 1, f) != 1 ||
        sum != XXH3_64bits(s, h.n * sizeof(float))) {
        *why = "short or corrupt";
        free(s);
        return NULL;
    }
    *n = (size_t)h.n;
    return s;
}

void dray_calib_cache_lookup(const struct dray_gguf *g, const char *precision, char *path,
                             size_t path_len, float **scores, size_t *n)
{
    struct header want = {.version = DRAY_CALIB_VERSION, .file_size = dray_gguf_file_size(g)};
    char suffix[96];
    *scores = NULL;
    *n = 0;
    path[0] = 0;
    if (!dray_cache_dir(path, path_len)) /* off: no need to hash the file */
        return;
    dray_cache_model_hash(g, want.file_hash);
    snprintf(suffix, sizeof(suffix), "-%s-v%u.bin", precision, DRAY_CALIB_VERSION);
    if (!dray_cache_path(path, path_len, "calib-", want.file_hash, suffix))
        return;
    FILE *f = fopen(path, "rb");
    if (!f)
        return; /* first start with this model */
    const char *why = NULL;
    *scores = read_scores(f, &want, n, &why);
    fclose(f);
    if (!*scores)
        dray_warn("calibration cache %s: %s; calibrating again", path, why);
}

int dray_calib_cache_store(const char *path, const struct dray_gguf *g, const float *scores,
                           size_t n, char *err, size_t errlen)
{
    char tmp[4200];
    struct header h = {.version = DRAY_CALIB_VERSION, .file_size = dray_gguf_file_size(g), .n = n};
    memcpy(h.magic, magic, sizeof(magic));
    dray_cache_model_hash(g, h.file_hash);
    uint64_t sum = XXH3_64bits(scores, n * sizeof(float));
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(&h, sizeof(h), 1, f) == 1 && fwrite(scores, sizeof(float), n, f) == n &&
              fwrite(&sum, sizeof(sum), 1, f) == 1;
    if (f && fclose(f))
        ok = false;
    if (!ok || rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return dray_fail(err, errlen, DRAY_EIO, "writing the calibration cache %s: %s", path,
                         strerror(e));
    }
    return 0;
}
