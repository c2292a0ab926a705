/*
 * dray/plugins.h — the plugin registry, public for tools that list or drive
 * devices directly (dray devices, dray bench ops) rather than through an engine.
 *
 * Plugin registry: finds libdray-<name>.so on a search path, dlopens it, negotiates
 * the ABI, and opens devices (with the configured fallback). A plugin that cannot
 * be used (wrong ABI, missing symbol, failing runtime) is recorded as skipped with
 * a reason naming the file, both versions and the remedy; the others still load. */
#ifndef DRAY_PLUGINS_H
#define DRAY_PLUGINS_H

#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/dray.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dray_plugin {
    char path[1024];
    char name[64];            /* ops->name */
    uint32_t abi;             /* negotiated version */
    const struct dray_ops *ops;
    void *handle;             /* dlopen handle */
    /* appended: device probe at load time */
    uint32_t n_devices;       /* from ops->device_count; 0 if it failed */
    char nodev[256];          /* why n_devices is 0 ("no CUDA driver"); "" otherwise */
};

struct dray_skipped {
    char path[1024];
    char reason[512];
};

struct dray_registry;

/* Scan extra_path (':'-separated, may be NULL), then $DRAY_PLUGIN_PATH, then the
 * compiled-in default (build tree, install dir). Fails only on out-of-memory. */
int dray_registry_open(const char *extra_path, struct dray_registry **out, char *err, size_t errlen);
void dray_registry_close(struct dray_registry *reg);

size_t dray_registry_count(const struct dray_registry *reg);
const struct dray_plugin *dray_registry_at(const struct dray_registry *reg, size_t i);
size_t dray_registry_n_skipped(const struct dray_registry *reg);
const struct dray_skipped *dray_registry_skipped_at(const struct dray_registry *reg, size_t i);
/* By name ("cpu"), or by path to a .so (loaded on demand). NULL if none; err says why
 * (including the skip reason when the plugin was found but skipped). */
const struct dray_plugin *dray_registry_find(struct dray_registry *reg, const char *name_or_path,
                                             char *err, size_t errlen);

/* Device index's per-op dtypes and limits, from either ABI version: op_caps
 * (version 2), or built from device_props (version 1: the eight version-1 ops,
 * no limits declared). err says why when the plugin fails to answer. */
int dray_plugin_caps(const struct dray_plugin *p, uint32_t index, struct dray_op_caps *caps,
                     char *err, size_t errlen);

/* An opened device. */
struct dray_device {
    const struct dray_plugin *plugin;
    const struct dray_ops *ops;
    struct dray_ctx *ctx;
    uint32_t index;
    struct dray_device_props props;
    struct dray_op_caps caps; /* per-op dtypes and limits (dray_plugin_caps) */
};

/* device: "" or NULL = first device, digits = index, else a case-insensitive
 * substring of the device name. */
int dray_device_open(struct dray_registry *reg, const char *plugin, const char *device,
                     const struct dray_open_options *opt, struct dray_device *out, char *err,
                     size_t errlen);
/* From config: backend, device, threads, reference_kernels. A device that
 * cannot be opened, or that does not declare the dtypes the configuration
 * needs (kv_dtype for kv_store and attention, precision for matmul and embed),
 * counts as failed: then cfg->fallback is tried (logging why), else it fails
 * with both reasons. */
int dray_device_open_config(struct dray_registry *reg, const struct dray_config *cfg,
                            struct dray_device *out, char *err, size_t errlen);
void dray_device_close(struct dray_device *dev);

#ifdef __cplusplus
}
#endif
#endif /* DRAY_PLUGINS_H */
