/* Strict numbers for command-line flags (flags.h). */
#include "flags.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int dray_flag_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v = 0;
    errno = 0;
    if (isdigit((unsigned char)s[0])) /* strtoull would take "-1" as 2^64 - 1 */
        v = strtoull(s, &end, 10);
    if (!end || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "dray: %s expects a whole number from %" PRIu64 " to %" PRIu64
                ", got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int dray_flag_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t v;
    if (dray_flag_u64(flag, s, lo, hi, &v))
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int dray_flag_f64(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    double v = 0;
    errno = 0;
    if (isdigit((unsigned char)s[0]) || (s[0] == '.' && isdigit((unsigned char)s[1])))
        v = strtod(s, &end);
    if (!end || *end || errno || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "dray: %s expects a number from %g to %g, got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}
