/* server/mhderr.h — the answers libmicrohttpd makes itself, to requests it cannot
 * parse (bad Content-Length or chunking, no colon in a header line, headers too
 * big, a bad request line or HTTP version). libmicrohttpd 0.9.75 has no hook to
 * replace their HTML bodies; what it does give is its log, through
 * MHD_OPTION_EXTERNAL_LOGGER: each such answer is logged first with the format
 * MHD_ERR_FMT and its status code. These helpers read that log and build the
 * OpenAI-shaped answer dray sends instead (http.c, where it can). */
#ifndef DRAY_SERVER_MHDERR_H
#define DRAY_SERVER_MHDERR_H

#include <stdarg.h>
#include <stddef.h>

/* libmicrohttpd's transmit_error_response_len() (connection.c, 0.9.75 to 1.0.1) */
#define DRAY_SRV_MHD_ERR_FMT "Error processing request (HTTP response code is %u ('%s')). "

/* Read one libmicrohttpd log message. An error answer (fmt starts with
 * DRAY_SRV_MHD_ERR_FMT): returns its status and writes the <title> of its HTML
 * body ("Request malformed") to text. Any other message: returns 0 and writes
 * the message, without its trailing newline, to text. */
int dray_srv_mhd_log_read(const char *fmt, va_list ap, char *text, size_t len)
    __attribute__((format(printf, 1, 0)));

/* The whole HTTP/1.1 response (status line, Content-Type, Content-Length,
 * Connection: close, the OpenAI error JSON) that stands for libmicrohttpd's
 * answer with this status; why goes into error.message. malloc'd, NUL-ended,
 * length in *len; NULL without memory. */
char *dray_srv_mhd_error_response(int status, const char *why, size_t *len);

#endif
