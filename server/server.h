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

/* The configuration replica i (0..cfg->replicas-1) opens its engine with.
 * device: a comma-separated list names one device per replica ("0,1,2,3" on a
 * machine with four GPUs; it must have cfg->replicas entries); a single device
 * (or "", the first) is shared by all of them (the CPU plugin's one device).
 * threads: a set value is per replica; 0 (all cores) becomes cores/replicas,
 * at least 1, so replicas sharing the host's cores do not oversubscribe them.
 * Returns 0, or DRAY_EINVAL with the reason in err. */
int dray_serve_replica_config(const struct dray_config *cfg, uint32_t i, long cores,
                              struct dray_config *out, char *err, size_t errlen);

/* Serve the n engines (replicas of one model, n >= 1) on cfg's host and port
 * until SIGINT or SIGTERM, then stop accepting, let in-flight requests run for
 * cfg->shutdown_grace seconds, cancel the rest (their streams end with an
 * error event) and return 0. A second signal cancels at once. Each engine gets
 * its own scheduler; a request goes to the replica its conversation hashes to
 * (server/route.h). Startup failures return a DRAY_E* code with a reason in err. */
int dray_serve(struct dray_engine *const *engines, uint32_t n, const struct dray_config *cfg,
               char *err, size_t errlen);

#endif
