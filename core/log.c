#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_level = -1; /* -1: not yet read from DRAY_LOG */

static const char *level_name[] = {"error", "warning", "info", "debug"};

int dray_log_get_level(void)
{
    if (log_level < 0) {
        const char *e = getenv("DRAY_LOG");
        log_level = DRAY_LOG_WARN;
        for (int i = 0; e && i < 4; i++)
            if (!strcmp(e, level_name[i]))
                log_level = i;
    }
    return log_level;
}

void dray_log_set_level(int level)
{
    log_level = level;
}

void dray_log(int level, const char *fmt, ...)
{
    if (level > dray_log_get_level())
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dray: %s: ", level_name[level < 0 ? 0 : level > 3 ? 3 : level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void dray_log_plugin(int level, const char *plugin, const char *msg)
{
    if (level > dray_log_get_level())
        return;
    fprintf(stderr, "dray[%s]: %s: %s\n", plugin ? plugin : "?",
            level_name[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}
