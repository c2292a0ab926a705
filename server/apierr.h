/* server/apierr.h — why a request was refused: the HTTP status and the fields of
 * OpenAI's error body {"error":{"message","type","param","code"}}. */
#ifndef DRAY_SERVER_APIERR_H
#define DRAY_SERVER_APIERR_H

struct dray_srv_error {
    int status;        /* HTTP status: 400, 401, 404, 413, 429, 500, 503 */
    const char *type;  /* "invalid_request_error", "authentication_error", ... */
    const char *code;  /* machine-readable ("model_not_found"), or NULL (JSON null) */
    char param[96];    /* the request field at fault ("messages[2].content"), "" = null */
    char message[512]; /* one sentence naming what was wrong and where */
};

/* Fill e; param may be NULL. Returns -1 so a parser can `return dray_srv_fail(...)`. */
int dray_srv_fail(struct dray_srv_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Shorthand for a 400 invalid_request_error naming param. */
int dray_srv_bad(struct dray_srv_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The error body as compact JSON, malloc'd; NULL when out of memory. */
char *dray_srv_error_json(const struct dray_srv_error *e);

#endif
