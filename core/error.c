#include "error.h"

#include <stdarg.h>
#include <stdio.h>

#include "dray/dray.h"

int dray_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

const char *dray_strerror(int rc)
{
    switch (rc) {
    case DRAY_OK: return "success";
    case DRAY_EINVAL: return "invalid argument";
    case DRAY_ENOMEM: return "out of memory";
    case DRAY_EIO: return "I/O error";
    case DRAY_ENOTSUP: return "not supported";
    case DRAY_EINCOMPAT: return "incompatible version";
    case DRAY_ENODEV: return "no usable device";
    case DRAY_EFORMAT: return "malformed input";
    case DRAY_ERANGE: return "out of range";
    case DRAY_EBACKEND: return "device runtime failure";
    case DRAY_ENOTFOUND: return "not found";
    case DRAY_EBUSY: return "busy";
    case DRAY_ECANCELED: return "cancelled";
    }
    return "unknown error";
}

const char *dray_version(void)
{
    return "0.1.0";
}
