/* Logging: one line per message to stderr, prefixed "dray: " (or the plugin's
 * name). The level threshold comes from config (log_level) or DRAY_LOG. */
#ifndef DRAY_CORE_LOG_H
#define DRAY_CORE_LOG_H

#include "dray/backend.h"
#include "dray/dray.h" /* dray_log_set_level */

int dray_log_get_level(void);
void dray_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The host service handed to plugins (struct dray_host.log). */
void dray_log_plugin(int level, const char *plugin, const char *msg);

#define dray_error(...) dray_log(DRAY_LOG_ERROR, __VA_ARGS__)
#define dray_warn(...) dray_log(DRAY_LOG_WARN, __VA_ARGS__)
#define dray_info(...) dray_log(DRAY_LOG_INFO, __VA_ARGS__)
#define dray_debug(...) dray_log(DRAY_LOG_DEBUG, __VA_ARGS__)

#endif
