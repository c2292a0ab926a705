#include "mhderr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apierr.h"

int dray_srv_mhd_log_read(const char *fmt, va_list ap, char *text, size_t len)
{
    va_list cp;
    va_copy(cp, ap);
    if (strncmp(fmt, DRAY_SRV_MHD_ERR_FMT, strlen(DRAY_SRV_MHD_ERR_FMT))) {
        vsnprintf(text, len, fmt, cp);
        va_end(cp);
        size_t n = strlen(text);
        while (n && (text[n - 1] == '\n' || text[n - 1] == ' '))
            text[--n] = 0;
        return 0;
    }
    unsigned status = va_arg(cp, unsigned);
    const char *html = va_arg(cp, const char *);
    va_end(cp);
    /* "<html><head><title>Request malformed</title>...": its title, else the code */
    const char *t = html ? strstr(html, "<title>") : NULL, *e = t ? strstr(t, "</title>") : NULL;
    if (t && e)
        snprintf(text, len, "%.*s", (int)(e - t - 7), t + 7);
    else
        snprintf(text, len, "HTTP %u", status);
    return status >= 100 && status < 600 ? (int)status : 500;
}

static const char *reason(int status, const char **code)
{
    *code = NULL;
    switch (status) {
    case 400: return "Bad Request";
    case 413: *code = "request_too_large"; return "Content Too Large";
    case 414: *code = "uri_too_long"; return "URI Too Long";
    case 431: *code = "request_header_fields_too_large"; return "Request Header Fields Too Large";
    case 505: *code = "http_version_not_supported"; return "HTTP Version Not Supported";
    default: return status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

char *dray_srv_mhd_error_response(int status, const char *why, size_t *len)
{
    const char *code, *phrase = reason(status, &code);
    struct dray_srv_error e;
    dray_srv_fail(&e, status, status < 500 || status == 505 ? "invalid_request_error" : "server_error",
                  code, NULL, "malformed HTTP request: %s", why);
    char *body = dray_srv_error_json(&e);
    if (!body)
        return NULL;
    size_t blen = strlen(body), cap = blen + 256;
    char *out = malloc(cap);
    if (out) {
        int n = snprintf(out, cap, "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                                   "Content-Length: %zu\r\n\r\n%s", status, phrase, blen, body);
        *len = n > 0 && (size_t)n < cap ? (size_t)n : 0;
    }
    free(body);
    return out;
}
