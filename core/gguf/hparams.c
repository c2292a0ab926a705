/* Checked hyper-parameter reads (see hparams.h). */
#include "hparams.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "error.h"
#include "gguf.h"

/* "arch.key" into buf; keys are short, so truncation would be a caller bug. */
static const char *full_key(const char *arch, const char *key, char *buf, size_t len)
{
    snprintf(buf, len, "%s.%s", arch, key);
    return buf;
}

int dray_hparam_u32(const struct dray_gguf *g, const char *arch, const char *key, uint32_t lo,
                    uint32_t hi, const uint32_t *dflt, uint32_t *out, char *err, size_t errlen)
{
    char k[160];
    int64_t v;
    int rc = dray_gguf_get_i64(g, full_key(arch, key, k, sizeof(k)), &v, err, errlen);
    if (rc == DRAY_ENOTFOUND && dflt) {
        *out = *dflt;
        return 0;
    }
    if (rc == DRAY_ENOTFOUND)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: missing metadata key %s (an integer "
                         "%u..%u)", dray_gguf_name(g), k, lo, hi);
    if (rc)
        return rc; /* wrong type: the getter named file and key */
    if (v < (int64_t)lo || v > (int64_t)hi)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: metadata key %s = %lld, expected an "
                         "integer %u..%u", dray_gguf_name(g), k, (long long)v, lo, hi);
    *out = (uint32_t)v;
    return 0;
}

int dray_hparam_f32(const struct dray_gguf *g, const char *arch, const char *key, float lo,
                    float hi, const float *dflt, float *out, char *err, size_t errlen)
{
    char k[160];
    float v;
    int rc = dray_gguf_get_f32(g, full_key(arch, key, k, sizeof(k)), &v, err, errlen);
    if (rc == DRAY_ENOTFOUND && dflt) {
        *out = *dflt;
        return 0;
    }
    if (rc == DRAY_ENOTFOUND)
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: missing metadata key %s (a number "
                         "%g..%g)", dray_gguf_name(g), k, lo, hi);
    if (rc)
        return rc;
    if (!isfinite(v) || v < lo || v > hi) /* NaN fails every comparison: test it first */
        return dray_fail(err, errlen, DRAY_EFORMAT, "%s: metadata key %s = %g, expected a "
                         "finite number %g..%g", dray_gguf_name(g), k, v, lo, hi);
    *out = v;
    return 0;
}

int dray_hparam_divides(const struct dray_gguf *g, const char *arch, const char *key_a,
                        uint32_t a, const char *key_b, uint32_t b, char *err, size_t errlen)
{
    if (a && b % a == 0)
        return 0;
    return dray_fail(err, errlen, DRAY_EFORMAT, "%s: metadata key %s.%s = %u does not divide "
                     "%s.%s = %u, expected a divisor", dray_gguf_name(g), arch, key_a, a, arch,
                     key_b, b);
}
