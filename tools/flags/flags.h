/* Strict numbers for command-line flags: the whole text must be the number
 * (digits only for integers: no sign, space, suffix or empty string) and lie in
 * [lo, hi]; otherwise print "dray: FLAG expects ..., got 'TEXT'" to stderr and
 * return -1 (atoi once turned `--prefill -1` into 4294967295 tokens). One parser
 * for the dray command (tools/) and the bench drivers (bench/): a libc-only
 * library, so neither reaches into the other's folder for it. */
#ifndef DRAY_FLAGS_H
#define DRAY_FLAGS_H

#include <stdint.h>

int dray_flag_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
int dray_flag_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* A finite decimal number ("22", "0.5", ".5", "1e3") in [lo, hi]. */
int dray_flag_f64(const char *flag, const char *s, double lo, double hi, double *out);

#endif
