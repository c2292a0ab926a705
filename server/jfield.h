/* server/jfield.h — typed reads of one field of a JSON request body. Each
 * refusal is a 400 naming the field and saying what was expected; a key whose
 * value is null counts as absent (clients send "stop": null for "not given"). */
#ifndef DRAY_SERVER_JFIELD_H
#define DRAY_SERVER_JFIELD_H

#include <stdbool.h>

#include <jansson.h>

#include "apierr.h"

/* "a string", "an array", ... for "expected X, got Y" messages */
const char *dray_srv_kind_of(const json_t *v);
/* The value the client set: NULL for an absent key and for null. */
json_t *dray_srv_field(json_t *obj, const char *key);

/* Each leaves *out untouched when the key is absent. */
int dray_srv_get_number(json_t *obj, const char *key, double lo, double hi, float *out,
                        struct dray_srv_error *e);
/* *given tells whether the key was there. */
int dray_srv_get_int(json_t *obj, const char *key, long long lo, long long hi, bool *given,
                     long long *out, struct dray_srv_error *e);
/* param: the name in messages ("stream_options.include_usage"). */
int dray_srv_get_bool(json_t *obj, const char *key, const char *param, bool *out,
                      struct dray_srv_error *e);
int dray_srv_get_string(json_t *obj, const char *key, const char **out, struct dray_srv_error *e);

#endif
