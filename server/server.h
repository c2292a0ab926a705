/* server/server.h — `dray serve`: an OpenAI-compatible HTTP server over one
 * engine, through the scheduler API of dray.h. The one header tools/ includes. */
#ifndef DRAY_SERVER_SERVER_H
#define DRAY_SERVER_SERVER_H

#include <stddef.h>

#include "dray/dray.h"

/* Block SIGINT and SIGTERM in the calling thread, so every thread started after
 * it (the engine's, the server's) inherits the mask and dray_serve alone takes
 * them. Call first, before opening the engine. */
void dray_serve_block_signals(void);

/* Serve e on cfg's host and port until SIGINT or SIGTERM, then stop accepting,
 * let in-flight requests run for cfg->shutdown_grace seconds, cancel the rest
 * (their streams end with an error event) and return 0. A second signal cancels
 * at once. Startup failures return a DRAY_E* code with a reason in err. */
int dray_serve(struct dray_engine *e, const struct dray_config *cfg, char *err, size_t errlen);

#endif
