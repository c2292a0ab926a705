/* Strict numbers for the bench drivers' flags (bench.h): the whole string must be
 * the number and it must be in range, or the error names the flag and the text
 * (atoi once turned `--prefill -1` into 4294967295 tokens). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

int dray_bench_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end = NULL;
    unsigned long long v = 0;
    errno = 0;
    if (isdigit((unsigned char)s[0])) /* strtoull would take "-1" as 2^64 - 1 */
        v = strtoull(s, &end, 10);
    if (!end || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "dray: %s expects a whole number from %u to %u, got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int dray_bench_f64(const char *flag, const char *s, double lo, double hi, double *out)
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
