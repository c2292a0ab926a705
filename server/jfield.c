#include "jfield.h"

const char *dray_srv_kind_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a JSON value";
}

json_t *dray_srv_field(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

int dray_srv_get_number(json_t *obj, const char *key, double lo, double hi, float *out,
                        struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(obj, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return dray_srv_bad(e, key, "'%s' must be a number, got %s", key, dray_srv_kind_of(v));
    double d = json_number_value(v);
    if (d < lo || d > hi)
        return dray_srv_bad(e, key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    *out = (float)d;
    return 0;
}

int dray_srv_get_int(json_t *obj, const char *key, long long lo, long long hi, bool *given,
                     long long *out, struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(obj, key);
    *given = v != NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return dray_srv_bad(e, key, "'%s' must be an integer, got %s", key, dray_srv_kind_of(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return dray_srv_bad(e, key, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

int dray_srv_get_bool(json_t *obj, const char *key, const char *param, bool *out,
                      struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(obj, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return dray_srv_bad(e, param, "'%s' must be true or false, got %s", param, dray_srv_kind_of(v));
    *out = json_is_true(v);
    return 0;
}

int dray_srv_get_string(json_t *obj, const char *key, const char **out, struct dray_srv_error *e)
{
    json_t *v = dray_srv_field(obj, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return dray_srv_bad(e, key, "'%s' must be a string, got %s", key, dray_srv_kind_of(v));
    *out = json_string_value(v);
    return 0;
}
