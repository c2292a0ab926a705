/* One configuration per replica, from the server's: which device it opens and
 * how many host threads it runs. */
#include <stdio.h>
#include <string.h>

#include "server.h"

int dray_serve_replica_config(const struct dray_config *cfg, uint32_t i, long cores,
                              struct dray_config *out, char *err, size_t errlen)
{
    *out = *cfg;
    uint32_t n = cfg->replicas ? cfg->replicas : 1;
    /* a split (backend lists plugins) takes the device list whole, one per plugin */
    if (strchr(cfg->device, ',') && !strchr(cfg->backend, ',')) {
        uint32_t listed = dray_config_list_len(cfg->device);
        if (listed != n) {
            snprintf(err, errlen, "device '%s' lists %u devices but replicas is %u: list one "
                     "device per replica, or give one device for all of them", cfg->device,
                     listed, n);
            return DRAY_EINVAL;
        }
        dray_config_list_entry(cfg->device, i, out->device, sizeof(out->device));
        if (!out->device[0]) {
            snprintf(err, errlen, "device '%s': entry %u (replica %u) is empty", cfg->device,
                     i + 1, i);
            return DRAY_EINVAL;
        }
    }
    /* replicas sharing the host's cores split them, or each would start one
     * worker per core and they would wait on each other at every barrier */
    if (!cfg->threads && n > 1 && cores > 0)
        out->threads = cores / (long)n > 1 ? (uint32_t)(cores / (long)n) : 1;
    return 0;
}
