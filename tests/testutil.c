#include "testutil.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static void remove_tmpdir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "testutil: could not remove %s\n", tmpdir);
}

const char *dray_test_tmpdir(void)
{
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/dray-test-XXXXXX");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            abort();
        }
        atexit(remove_tmpdir);
    }
    return tmpdir;
}

const char *dray_test_path(const char *name)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, 512, "%s/%s", dray_test_tmpdir(), name);
    return b;
}

int dray_test_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, size, f);
    return fclose(f) == 0 && w == size ? 0 : -1;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

void dray_test_seed(uint64_t seed)
{
    rng = seed ? seed : 1;
}

uint32_t dray_test_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

float dray_test_randf(float lo, float hi)
{
    return lo + (hi - lo) * (float)(dray_test_rand() & 0xFFFFFF) / (float)0x1000000;
}

size_t dray_test_cache_files(const char *dir, const char *pattern, char *path, size_t n, uint64_t *ino)
{
    char pat[2048];
    glob_t g;
    struct stat st;
    snprintf(pat, sizeof(pat), "%s/%s", dir, pattern);
    path[0] = 0;
    *ino = 0;
    if (glob(pat, 0, NULL, &g) != 0)
        return 0;
    size_t count = g.gl_pathc;
    snprintf(path, n, "%s", g.gl_pathv[0]);
    if (stat(path, &st) == 0)
        *ino = (uint64_t)st.st_ino;
    globfree(&g);
    return count;
}
