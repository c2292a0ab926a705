/* The in-memory op table of fake_ops.h. */
#include "fake_ops.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

int fake_live;
int fake_alloc_left = -1;
int fake_uploads;
int fake_fail_upload;

static int fake_alloc(struct dray_ctx *ctx, size_t n, struct dray_buf **out)
{
    (void)ctx;
    *out = NULL;
    if (fake_alloc_left == 0)
        return DRAY_ENOMEM;
    if (fake_alloc_left > 0)
        fake_alloc_left--;
    struct dray_buf *b = malloc(sizeof(*b) + n);
    if (!b)
        return DRAY_ENOMEM;
    memset(b->data, 0xA5, n); /* garbage, so a missing fill would show */
    b->n = n;
    fake_live++;
    *out = b;
    return 0;
}

static void fake_free(struct dray_ctx *ctx, struct dray_buf *b)
{
    (void)ctx;
    if (b) {
        fake_live--;
        free(b);
    }
}

static int fake_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t n)
{
    (void)ctx;
    fake_uploads++;
    if (fake_fail_upload) {
        fake_fail_upload = 0;
        return DRAY_EBACKEND;
    }
    if (!dst.buf || dst.offset + n > dst.buf->n)
        return DRAY_EINVAL;
    memcpy(dst.buf->data + dst.offset, src, n);
    return 0;
}

int fake_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t n)
{
    (void)ctx;
    if (!src.buf || src.offset + n > src.buf->n)
        return DRAY_EINVAL;
    memcpy(dst, src.buf->data + src.offset, n);
    return 0;
}

static int fake_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t n)
{
    (void)ctx;
    if (dst.offset + n > dst.buf->n || src.offset + n > src.buf->n)
        return DRAY_EINVAL;
    memmove(dst.buf->data + dst.offset, src.buf->data + src.offset, n);
    return 0;
}

static int fake_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pat, size_t n)
{
    (void)ctx;
    if (n % 4 || dst.offset + n > dst.buf->n)
        return DRAY_EINVAL;
    for (size_t i = 0; i < n; i += 4)
        memcpy(dst.buf->data + dst.offset + i, &pat, 4);
    return 0;
}

static int fake_sync(struct dray_ctx *ctx)
{
    (void)ctx;
    return 0;
}

static const char *fake_last_error(struct dray_ctx *ctx)
{
    (void)ctx;
    return "fake failure";
}

const struct dray_ops fake_ops = {
    .version = DRAY_ABI_VERSION,
    .name = "fake",
    .last_error = fake_last_error,
    .alloc = fake_alloc,
    .free = fake_free,
    .upload = fake_upload,
    .download = fake_download,
    .copy = fake_copy,
    .fill = fake_fill,
    .synchronize = fake_sync,
};

void fake_ops_reset(void)
{
    fake_live = 0;
    fake_alloc_left = -1;
    fake_uploads = 0;
    fake_fail_upload = 0;
}

int fake_ops_setup(void **state)
{
    (void)state;
    fake_ops_reset();
    return 0;
}

int fake_ops_teardown(void **state)
{
    (void)state;
    assert_int_equal(fake_live, 0);
    return 0;
}
