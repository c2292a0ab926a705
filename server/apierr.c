#include "apierr.h"

#include <stdarg.h>
#include <stdio.h>

#include <jansson.h>

static void vfill(struct dray_srv_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, va_list ap)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
}

int dray_srv_fail(struct dray_srv_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfill(e, status, type, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

int dray_srv_bad(struct dray_srv_error *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfill(e, 400, "invalid_request_error", NULL, param, fmt, ap);
    va_end(ap);
    return -1;
}

char *dray_srv_error_json(const struct dray_srv_error *e)
{
    /* the message may quote bytes of the request that are not UTF-8: json_string
     * refuses those, so fall back to a message that names only the status */
    json_t *msg = json_string(e->message);
    if (!msg)
        msg = json_string("the request was refused (its description was not valid UTF-8)");
    json_t *err = json_pack("{s:o, s:s, s:o, s:o}", "message", msg, "type", e->type, "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code ? json_string(e->code) : json_null());
    json_t *root = err ? json_pack("{s:o}", "error", err) : NULL;
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return text;
}
