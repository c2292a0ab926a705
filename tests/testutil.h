/* Helpers shared by the cmocka tests. */
#ifndef DRAY_TESTUTIL_H
#define DRAY_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* A fresh private temp folder for this test process (created once, removed at exit). */
const char *dray_test_tmpdir(void);
/* tmpdir/name, in a static rotating buffer (valid for the next 7 calls). */
const char *dray_test_path(const char *name);
/* Write bytes to a file; returns 0 on success. */
int dray_test_write_file(const char *path, const void *data, size_t size);
/* The files in dir matching pattern (a glob, e.g. "round-*.bin"): how many,
 * and the first one's path into path ("" for none) and inode (0 for none). */
size_t dray_test_cache_files(const char *dir, const char *pattern, char *path, size_t n, uint64_t *ino);
/* Deterministic random numbers (xorshift), so failures reproduce. */
void dray_test_seed(uint64_t seed);
uint32_t dray_test_rand(void);
float dray_test_randf(float lo, float hi);

#endif
