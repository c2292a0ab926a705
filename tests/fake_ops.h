/* An in-memory op table for the tests of the KV manager and what sits on it
 * (test_kv.c, test_prefix_cache.c): buffers in host memory, memory calls only,
 * no plugin. The counters let a test watch and break it. */
#ifndef DRAY_TESTS_FAKE_OPS_H
#define DRAY_TESTS_FAKE_OPS_H

#include <stddef.h>

#include "dray/backend.h"

/* A buffer: n bytes of data. */
struct dray_buf {
    size_t n;
    unsigned char data[];
};

extern int fake_live;        /* buffers allocated and not freed */
extern int fake_alloc_left;  /* allocations that succeed before failures; -1 = no limit */
extern int fake_uploads;     /* upload calls */
extern int fake_fail_upload; /* 1: next upload fails */

extern const struct dray_ops fake_ops;

/* The counters as a fresh test wants them. */
void fake_ops_reset(void);
/* cmocka fixtures: reset before a test; after it, fail if a buffer is left
 * (every test frees what it made: nothing leaks). */
int fake_ops_setup(void **state);
int fake_ops_teardown(void **state);
/* fake_ops.download, for reading a buffer back directly. */
int fake_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t n);

#endif
