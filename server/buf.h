/* server/buf.h — a growable byte buffer for response bodies, SSE frames and the
 * metrics page (text built piece by piece, then handed to libmicrohttpd). */
#ifndef DRAY_SERVER_BUF_H
#define DRAY_SERVER_BUF_H

#include <stddef.h>

struct dray_srv_buf {
    char *data;   /* NUL-terminated when len > 0 */
    size_t len;   /* bytes used, without the NUL */
    size_t cap;   /* bytes allocated */
};

/* Append n bytes. Returns 0 or DRAY_ENOMEM (the buffer is then unchanged). */
int dray_srv_buf_add(struct dray_srv_buf *b, const char *s, size_t n);
int dray_srv_buf_printf(struct dray_srv_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void dray_srv_buf_reset(struct dray_srv_buf *b); /* len = 0, memory kept */
void dray_srv_buf_free(struct dray_srv_buf *b);

#endif
