/* The conformance kit's own plugin loader (conf_loader.c): search path ->
 * dlopen -> negotiate -> check the table -> pick and open a device, through
 * backend.h only. Besides the kit, `dray bench ops` uses it: both see a plugin
 * as a vendor does, without dray's engine (docs/design.md, rooms). */
#ifndef DRAY_CONF_LOADER_H
#define DRAY_CONF_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"

/* A plugin the kit loaded itself (conf_loader.c: backend.h and dlopen only). */
struct conf_plugin {
    char path[1024];
    void *handle;
    const struct dray_ops *ops;
    uint32_t abi;        /* negotiated version */
    uint32_t n_devices;
};

struct conf_device {
    const struct conf_plugin *plugin;
    struct dray_ctx *ctx;
    uint32_t index;
    struct dray_device_props props;
    struct dray_op_caps caps; /* per-op dtypes, from either ABI version */
};

/* name ("cpu": libdray-cpu.so searched in extra_path, $DRAY_PLUGIN_PATH, then
 * the build's default) or a path to a .so. */
int conf_plugin_load(const char *name_or_path, const char *extra_path, struct conf_plugin *p,
                     char *err, size_t errlen);
void conf_plugin_unload(struct conf_plugin *p);
/* device: ""/NULL = first, digits = index, else a part of the device's name. */
int conf_device_open(const struct conf_plugin *p, const char *device,
                     const struct dray_open_options *opt, struct conf_device *d, char *err,
                     size_t errlen);
void conf_device_close(struct conf_device *d);
/* "invalid argument" for DRAY_EINVAL, ... */
const char *conf_status_name(int rc);

#endif
