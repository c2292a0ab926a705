#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dray/dray.h"

/* Room for n more bytes plus the NUL; grows by doubling. */
static int reserve(struct dray_srv_buf *b, size_t n)
{
    if (b->len + n + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return DRAY_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

int dray_srv_buf_add(struct dray_srv_buf *b, const char *s, size_t n)
{
    if (reserve(b, n))
        return DRAY_ENOMEM;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int dray_srv_buf_printf(struct dray_srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n))
        return DRAY_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void dray_srv_buf_reset(struct dray_srv_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void dray_srv_buf_free(struct dray_srv_buf *b)
{
    free(b->data);
    *b = (struct dray_srv_buf){0};
}
