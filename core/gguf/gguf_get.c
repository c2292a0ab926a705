/* The GGUF reader's accessors and typed metadata getters (gguf.h): each getter
 * checks the key's type and range and says what it found instead. */
#include "gguf_internal.h"

#include <inttypes.h>
#include <string.h>

#include "error.h"

/* ------------------------------------------------------------ accessors */

uint32_t dray_gguf_version(const struct dray_gguf *g) { return g->version; }
uint64_t dray_gguf_file_size(const struct dray_gguf *g) { return g->size; }
const void *dray_gguf_bytes(const struct dray_gguf *g) { return g->base; }
const char *dray_gguf_name(const struct dray_gguf *g) { return g->name; }
uint64_t dray_gguf_n_kv(const struct dray_gguf *g) { return g->n_kv; }
uint64_t dray_gguf_n_tensors(const struct dray_gguf *g) { return g->n_tensors; }

const struct dray_gguf_kv *dray_gguf_kv_at(const struct dray_gguf *g, uint64_t i)
{
    return i < g->n_kv ? &g->kv[i] : NULL;
}

const struct dray_gguf_tensor *dray_gguf_tensor_at(const struct dray_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

uint64_t dray_gguf_tensor_nelems(const struct dray_gguf_tensor *t)
{
    /* The reader checked that this product fits in int64. */
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

/* ------------------------------------------------------------ typed getters */

static int lookup(const struct dray_gguf *g, const char *key, const struct dray_gguf_kv **kv,
                  char *err, size_t errlen)
{
    if (!(*kv = dray_gguf_find(g, key)))
        return dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: key '%s' not found", g->name, key);
    return 0;
}

static int wrong_type(const struct dray_gguf *g, const char *key, uint32_t type,
                      const char *expected, char *err, size_t errlen)
{
    return dray_fail(err, errlen, DRAY_EFORMAT, "%s: key '%s' has type %s, expected %s",
                     g->name, key, gguf_vtype_name(type), expected);
}

/* Integer value widened: *neg set if negative (then *mag = -value). */
static bool int_value(const struct dray_gguf_kv *kv, uint64_t *mag, bool *neg)
{
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            uint64_t u64; int64_t i64; } v;
    int64_t s = 0;
    *neg = false;
    switch (kv->type) { /* only an integer's bytes are read: another record's value may
                         * be shorter (an empty array at the end of the file: none) */
    case DRAY_GGUF_UINT8: case DRAY_GGUF_UINT16: case DRAY_GGUF_UINT32: case DRAY_GGUF_UINT64:
    case DRAY_GGUF_INT8: case DRAY_GGUF_INT16: case DRAY_GGUF_INT32: case DRAY_GGUF_INT64:
        memcpy(&v, kv->data, gguf_vtype_size(kv->type));
        break;
    default:
        return false;
    }
    switch (kv->type) {
    case DRAY_GGUF_UINT8: *mag = v.u8; return true;
    case DRAY_GGUF_UINT16: *mag = v.u16; return true;
    case DRAY_GGUF_UINT32: *mag = v.u32; return true;
    case DRAY_GGUF_UINT64: *mag = v.u64; return true;
    case DRAY_GGUF_INT8: s = v.i8; break;
    case DRAY_GGUF_INT16: s = v.i16; break;
    case DRAY_GGUF_INT32: s = v.i32; break;
    case DRAY_GGUF_INT64: s = v.i64; break;
    default: return false;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return true;
}

/* The key's value as an integer (any integer type, widened as int_value does). */
static int lookup_int(const struct dray_gguf *g, const char *key, uint64_t *mag, bool *neg, char *err,
                      size_t errlen)
{
    const struct dray_gguf_kv *kv;
    int rc = lookup(g, key, &kv, err, errlen);
    if (!rc && !int_value(kv, mag, neg))
        rc = wrong_type(g, key, kv->type, "an integer", err, errlen);
    return rc;
}

/* The key's record, which must have exactly this value type. */
static int lookup_typed(const struct dray_gguf *g, const char *key, uint32_t type,
                        const struct dray_gguf_kv **kv, char *err, size_t errlen)
{
    int rc = lookup(g, key, kv, err, errlen);
    if (!rc && (*kv)->type != type)
        rc = wrong_type(g, key, (*kv)->type, gguf_vtype_name(type), err, errlen);
    return rc;
}

int dray_gguf_get_u32(const struct dray_gguf *g, const char *key, uint32_t *out, char *err,
                      size_t errlen)
{
    uint64_t mag;
    bool neg;
    int rc = lookup_int(g, key, &mag, &neg, err, errlen);
    if (rc)
        return rc;
    if (neg || mag > UINT32_MAX)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: key '%s' = %s%" PRIu64
                         " does not fit in an unsigned 32-bit value", g->name, key,
                         neg ? "-" : "", mag);
    *out = (uint32_t)mag;
    return 0;
}

int dray_gguf_get_i64(const struct dray_gguf *g, const char *key, int64_t *out, char *err,
                      size_t errlen)
{
    uint64_t mag;
    bool neg;
    int rc = lookup_int(g, key, &mag, &neg, err, errlen);
    if (rc)
        return rc;
    if (!neg && mag > INT64_MAX)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: key '%s' = %" PRIu64
                         " does not fit in a signed 64-bit value", g->name, key, mag);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag; /* mag <= 2^63 when neg */
    return 0;
}

int dray_gguf_get_f32(const struct dray_gguf *g, const char *key, float *out, char *err,
                      size_t errlen)
{
    const struct dray_gguf_kv *kv;
    uint64_t mag;
    bool neg;
    int rc = lookup(g, key, &kv, err, errlen);
    if (rc)
        return rc;
    if (kv->type == DRAY_GGUF_FLOAT32) {
        memcpy(out, kv->data, 4);
    } else if (kv->type == DRAY_GGUF_FLOAT64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
    } else if (int_value(kv, &mag, &neg)) {
        *out = neg ? -(float)mag : (float)mag;
    } else {
        return wrong_type(g, key, kv->type, "a number", err, errlen);
    }
    return 0;
}

int dray_gguf_get_bool(const struct dray_gguf *g, const char *key, bool *out, char *err,
                       size_t errlen)
{
    const struct dray_gguf_kv *kv;
    int rc = lookup_typed(g, key, DRAY_GGUF_BOOL, &kv, err, errlen);
    if (rc)
        return rc;
    *out = *(const uint8_t *)kv->data != 0;
    return 0;
}

int dray_gguf_get_str(const struct dray_gguf *g, const char *key, struct dray_str *out, char *err,
                      size_t errlen)
{
    const struct dray_gguf_kv *kv;
    int rc = lookup_typed(g, key, DRAY_GGUF_STRING, &kv, err, errlen);
    if (rc)
        return rc;
    *out = *kv->strs;
    return 0;
}

int dray_gguf_get_arr(const struct dray_gguf *g, const char *key, uint32_t elem_type,
                      const void **data, uint64_t *n, char *err, size_t errlen)
{
    const struct dray_gguf_kv *kv;
    int rc = lookup(g, key, &kv, err, errlen);
    if (rc)
        return rc;
    if (kv->type != DRAY_GGUF_ARRAY || kv->arr_type != elem_type)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: key '%s' has type %s%s%s, expected "
                         "ARRAY of %s", g->name, key, gguf_vtype_name(kv->type),
                         kv->type == DRAY_GGUF_ARRAY ? " of " : "",
                         kv->type == DRAY_GGUF_ARRAY ? gguf_vtype_name(kv->arr_type) : "",
                         gguf_vtype_name(elem_type));
    /* For strings hand out the (ptr, len) index rather than the raw bytes. */
    *data = elem_type == DRAY_GGUF_STRING ? (const void *)kv->strs : kv->data;
    *n = kv->arr_n;
    return 0;
}
