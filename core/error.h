/* Error reporting shared by the core: codes are enum dray_status (backend.h),
 * reasons are short sentences written into a caller's buffer. */
#ifndef DRAY_CORE_ERROR_H
#define DRAY_CORE_ERROR_H

#include <stddef.h>

#include "dray/backend.h"

/* Write a reason into err (if err != NULL, truncated to errlen) and return rc.
 * Typical use: return dray_fail(err, errlen, DRAY_EFORMAT, "%s: bad magic", path); */
int dray_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
