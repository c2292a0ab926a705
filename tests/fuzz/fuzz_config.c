/* libFuzzer target: the YAML config loader (core/config.c, libyaml) and
 * dray_config_set on arbitrary bytes. The input goes through a memfd so the real
 * file path (open, fstat, size cap, depth check, parse) runs. Invariants beyond
 * "no crash, no leak, no hang": a refused file leaves the config untouched and
 * says why; an accepted one prints (dray config) as YAML that loads again.
 * Build and run: ci/fuzz.sh config SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dray/dray.h"

/* Writes data to a fresh memfd; returns its /proc path in path, the fd, or -1. */
static int mem_file(const uint8_t *data, size_t size, char *path, size_t len)
{
    int fd = memfd_create("fuzz.yaml", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return -1;
    }
    snprintf(path, len, "/proc/self/fd/%d", fd);
    return fd;
}

/* "key=value" inputs also go through dray_config_set, as --set does. */
static void try_set(const uint8_t *data, size_t size)
{
    char buf[512], err[512];
    size_t n = size < sizeof(buf) - 1 ? size : sizeof(buf) - 1;
    memcpy(buf, data, n);
    buf[n] = 0;
    char *eq = strchr(buf, '=');
    if (!eq)
        return;
    *eq = 0;
    struct dray_config cfg;
    dray_config_defaults(&cfg);
    if (dray_config_set(&cfg, buf, eq + 1, err, sizeof(err)) && !err[0])
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[1024], again_path[64];
    struct dray_config cfg, before, again;
    try_set(data, size);
    int fd = mem_file(data, size, path, sizeof(path));
    if (fd < 0)
        return 0;
    dray_config_defaults(&cfg);
    memcpy(&before, &cfg, sizeof(cfg)); /* bytes, padding included, for memcmp */
    err[0] = 0;
    if (dray_config_load(path, &cfg, err, sizeof(err))) {
        if (!err[0] || memcmp(&cfg, &before, sizeof(cfg)))
            abort(); /* a refusal says why and changes nothing */
        close(fd);
        return 0;
    }
    close(fd);
    /* what was accepted prints as YAML that loads to the same values */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return 0;
    dray_config_print(&cfg, f);
    fclose(f);
    int fd2 = mem_file((const uint8_t *)text, len, again_path, sizeof(again_path));
    if (fd2 >= 0) {
        dray_config_defaults(&again);
        if (dray_config_load(again_path, &again, err, sizeof(err))) {
            fprintf(stderr, "printed config does not load: %s\n%s\n", err, text);
            abort();
        }
        close(fd2);
    }
    free(text);
    return 0;
}
