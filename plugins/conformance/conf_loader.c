/* The conformance kit's own plugin loader: search path -> dlopen -> negotiate ->
 * check the table -> pick and open a device. It uses backend.h only, so a vendor
 * can certify a plugin with the kit alone, without dray's engine; it is the
 * smallest loader that follows the rules of docs/plugin-abi.md (the engine's
 * registry adds the skipped list, fallbacks and device probing on top). */
#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_internal.h"

/* The default folders, as the engine's registry has them (core/registry.c): the
 * build tree's backend folders for a binary inside the build tree; otherwise the
 * plugin folder of the install the binary lives in, then the configured one. */
#ifndef DRAY_CONF_BUILD_ROOT
#define DRAY_CONF_BUILD_ROOT ""
#endif
#ifndef DRAY_CONF_PLUGIN_BUILD_PATH
#define DRAY_CONF_PLUGIN_BUILD_PATH ""
#endif
#ifndef DRAY_CONF_PLUGIN_DIR_FROM_BINDIR
#define DRAY_CONF_PLUGIN_DIR_FROM_BINDIR ""
#endif
#ifndef DRAY_CONF_PLUGIN_INSTALL_DIR
#define DRAY_CONF_PLUGIN_INSTALL_DIR ""
#endif

const char *conf_status_name(int rc)
{
    switch (rc) {
    case DRAY_OK: return "ok";
    case DRAY_EINVAL: return "invalid argument";
    case DRAY_ENOMEM: return "out of memory";
    case DRAY_EIO: return "I/O error";
    case DRAY_ENOTSUP: return "not supported";
    case DRAY_EINCOMPAT: return "incompatible version";
    case DRAY_ENODEV: return "no device";
    case DRAY_EFORMAT: return "malformed input";
    case DRAY_ERANGE: return "out of range";
    case DRAY_EBACKEND: return "device runtime error";
    case DRAY_ENOTFOUND: return "not found";
    }
    return "unknown error";
}

/* every refusal: the reason into err, the code back (dray/backend_util.h) */
#define fail dray_util_fail

/* ------------------------------------------------------------ host services */

static void *host_alloc(size_t nbytes)
{
    return malloc(nbytes ? nbytes : 1);
}

static void host_free(void *p)
{
    free(p);
}

/* Plugins report problems through here: warnings and errors go to stderr so a
 * vendor sees them next to the verdict table; info and debug are dropped. */
static void host_log(int level, const char *plugin, const char *msg)
{
    if (level <= DRAY_LOG_WARN)
        fprintf(stderr, "%s: %s\n", plugin ? plugin : "plugin", msg ? msg : "");
}

static const struct dray_host conf_host = {
    .version = DRAY_ABI_VERSION,
    .alloc = host_alloc,
    .free = host_free,
    .log = host_log,
};

/* ------------------------------------------------------------ finding the file */

static int looks_like_path(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 3 && !strcmp(s + n - 3, ".so"));
}

/* First folder of `list` (':'-separated) holding libdray-<name>.so. */
static int search_list(const char *list, const char *name, char *path, size_t len)
{
    const char *p = list;
    while (p && *p) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n && snprintf(path, len, "%.*s/libdray-%s.so", (int)n, p, name) < (int)len) {
            FILE *f = fopen(path, "rb");
            if (f) {
                fclose(f);
                return 1;
            }
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* The default search list for this binary (see DRAY_CONF_BUILD_ROOT above). */
static void default_path(char *out, size_t len)
{
    char exe[PATH_MAX];
    size_t root = strlen(DRAY_CONF_BUILD_ROOT);
    if (!realpath("/proc/self/exe", exe))
        exe[0] = '\0';
    if (root && !strncmp(exe, DRAY_CONF_BUILD_ROOT, root) && exe[root] == '/') {
        snprintf(out, len, "%s", DRAY_CONF_PLUGIN_BUILD_PATH);
        return;
    }
    char *slash = strrchr(exe, '/');
    if (slash && DRAY_CONF_PLUGIN_DIR_FROM_BINDIR[0]) {
        *slash = '\0';
        snprintf(out, len, "%s/%s:%s", exe, DRAY_CONF_PLUGIN_DIR_FROM_BINDIR, DRAY_CONF_PLUGIN_INSTALL_DIR);
    } else {
        snprintf(out, len, "%s", DRAY_CONF_PLUGIN_INSTALL_DIR);
    }
}

/* extra (the caller's), then $DRAY_PLUGIN_PATH, then the default folders. */
static int find_file(const char *name, const char *extra, char *path, size_t len, char *err,
                     size_t errlen)
{
    if (looks_like_path(name)) {
        snprintf(path, len, "%s", name);
        return 0;
    }
    const char *env = getenv("DRAY_PLUGIN_PATH");
    char def[2 * PATH_MAX + 2048];
    default_path(def, sizeof(def));
    if (search_list(extra, name, path, len) || search_list(env, name, path, len) ||
        search_list(def, name, path, len))
        return 0;
    return fail(err, errlen, DRAY_ENOTFOUND,
                "no plugin named '%s' (no libdray-%s.so in %s%s$DRAY_PLUGIN_PATH%s%s): give a "
                "path to the .so or add its folder to the plugin path",
                name, name, extra && *extra ? extra : "", extra && *extra ? ", " : "",
                def[0] ? " or " : "", def);
}

/* ------------------------------------------------------------ negotiation */

/* Every member the kit calls; a table must set those of its version. A member
 * newer than the table's version is never read (an old table ends before it). */
static const char *missing_member(const struct dray_ops *o)
{
    const struct {
        const char *name;
        int set;
    } m[] = {
        {"name", o->name && o->name[0]}, {"device_count", !!o->device_count},
        {"device_props", !!o->device_props}, {"open", !!o->open}, {"close", !!o->close},
        {"last_error", !!o->last_error}, {"alloc", !!o->alloc}, {"free", !!o->free},
        {"upload", !!o->upload}, {"download", !!o->download}, {"synchronize", !!o->synchronize},
        {"embed", !!o->embed}, {"rmsnorm", !!o->rmsnorm}, {"matmul", !!o->matmul},
        {"rope", !!o->rope}, {"kv_store", !!o->kv_store}, {"attention", !!o->attention},
        {"gated_act", !!o->gated_act}, {"add", !!o->add},
        {"op_caps", o->version < 2 || o->op_caps},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        if (!m[i].set)
            return m[i].name;
    return NULL;
}

static int negotiate(struct conf_plugin *p, char *err, size_t errlen)
{
    dray_plugin_negotiate_fn neg;
    void *sym = dlsym(p->handle, DRAY_PLUGIN_SYMBOL);
    memcpy(&neg, &sym, sizeof(neg)); /* POSIX: dlsym results convert to functions */
    if (!neg)
        return fail(err, errlen, DRAY_EINCOMPAT, "%s exports no symbol %s: it is not a dray plugin",
                    p->path, DRAY_PLUGIN_SYMBOL);
    uint32_t v = DRAY_ABI_VERSION;
    char perr[256] = "";
    int rc = neg(&v, &conf_host, &p->ops, perr, sizeof(perr));
    perr[sizeof(perr) - 1] = '\0';
    if (rc)
        return fail(err, errlen, rc, "%s refused to load (%s): %s", p->path, conf_status_name(rc),
                    perr[0] ? perr : "no reason given");
    if (v < DRAY_ABI_VERSION_MIN || v > DRAY_ABI_VERSION || !p->ops || p->ops->version != v)
        return fail(err, errlen, DRAY_EINCOMPAT,
                    "%s answered ABI %u with a table of version %d; this kit speaks %u..%u and "
                    "needs the two to agree: rebuild the plugin against this backend.h",
                    p->path, v, p->ops ? (int)p->ops->version : -1, DRAY_ABI_VERSION_MIN,
                    DRAY_ABI_VERSION);
    const char *miss = missing_member(p->ops);
    if (miss)
        return fail(err, errlen, DRAY_EINCOMPAT, "%s (ABI %u) leaves mandatory member '%s' NULL",
                    p->path, v, miss);
    p->abi = v;
    return 0;
}

int conf_plugin_load(const char *name_or_path, const char *extra_path, struct conf_plugin *p,
                     char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    int rc = find_file(name_or_path, extra_path, p->path, sizeof(p->path), err, errlen);
    if (rc)
        return rc;
    p->handle = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
    if (!p->handle)
        return fail(err, errlen, DRAY_ENOTFOUND, "cannot load %s: %s", p->path, dlerror());
    if ((rc = negotiate(p, err, errlen)) == 0 && (rc = p->ops->device_count(&p->n_devices)))
        fail(err, errlen, rc, "%s: cannot count devices: %s", p->path, conf_status_name(rc));
    if (rc == 0 && p->n_devices == 0)
        rc = fail(err, errlen, DRAY_ENODEV, "%s: the plugin has no device", p->path);
    if (rc) {
        dlclose(p->handle);
        p->handle = NULL;
    }
    return rc;
}

void conf_plugin_unload(struct conf_plugin *p)
{
    /* DRAY_NO_DLCLOSE=1 keeps the plugin (and the vendor runtime it pulled in)
     * mapped, as the engine's registry does, so a leak checker can still name the
     * library a leak is in and see the plugin's one-time tables as reachable */
    const char *keep = getenv("DRAY_NO_DLCLOSE");
    if (p->handle && !(keep && keep[0] == '1'))
        dlclose(p->handle);
    memset(p, 0, sizeof(*p));
}

/* ------------------------------------------------------------ devices */

static int all_digits(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

/* "" / "2" / a case-insensitive part of the device name. */
static int pick_device(const struct conf_plugin *p, const char *device, uint32_t *index,
                       struct dray_device_props *props, char *err, size_t errlen)
{
    if (!device || !device[0] || all_digits(device)) {
        unsigned long i = device && device[0] ? strtoul(device, NULL, 10) : 0;
        if (i >= p->n_devices)
            return fail(err, errlen, DRAY_ENOTFOUND, "plugin '%s' has no device %lu (it has %u)",
                        p->ops->name, i, p->n_devices);
        *index = (uint32_t)i;
        int rc = p->ops->device_props(*index, props);
        return rc ? fail(err, errlen, rc, "plugin '%s': device %u: cannot read properties: %s",
                         p->ops->name, *index, conf_status_name(rc))
                  : 0;
    }
    for (uint32_t i = 0; i < p->n_devices; i++) {
        if (p->ops->device_props(i, props) != 0)
            continue;
        props->name[sizeof(props->name) - 1] = '\0';
        if (strcasestr(props->name, device)) {
            *index = i;
            return 0;
        }
    }
    return fail(err, errlen, DRAY_ENOTFOUND, "plugin '%s' has no device whose name contains '%s'",
                p->ops->name, device);
}

/* Per-op dtypes: op_caps for a version-2 plugin, else the version-1 props. */
static int read_caps(const struct conf_plugin *p, uint32_t index,
                     const struct dray_device_props *props, struct dray_op_caps *caps)
{
    dray_util_caps_from_props(caps, props);
    caps->n_ops = DRAY_OP_COUNT_V1;
    if (!DRAY_HAS(p->ops, op_caps, 2))
        return 0;
    memset(caps, 0, sizeof(*caps));
    caps->size = (uint32_t)sizeof(*caps);
    int rc = p->ops->op_caps(index, caps);
    caps->size = (uint32_t)sizeof(*caps);
    if (caps->n_ops > DRAY_OP_COUNT)
        caps->n_ops = DRAY_OP_COUNT;
    return rc;
}

int conf_device_open(const struct conf_plugin *p, const char *device,
                     const struct dray_open_options *opt, struct conf_device *d, char *err,
                     size_t errlen)
{
    memset(d, 0, sizeof(*d));
    int rc = pick_device(p, device, &d->index, &d->props, err, errlen);
    if (rc)
        return rc;
    d->props.name[sizeof(d->props.name) - 1] = '\0';
    if ((rc = read_caps(p, d->index, &d->props, &d->caps)))
        return fail(err, errlen, rc, "plugin '%s': device %u: cannot read capabilities: %s",
                    p->ops->name, d->index, conf_status_name(rc));
    char perr[256] = "";
    rc = p->ops->open(d->index, opt, &d->ctx, perr, sizeof(perr));
    perr[sizeof(perr) - 1] = '\0';
    if (rc || !d->ctx) {
        if (d->ctx)
            p->ops->close(d->ctx);
        d->ctx = NULL;
        return fail(err, errlen, rc ? rc : DRAY_EBACKEND, "%s: cannot open device %u (%s): %s",
                    p->ops->name, d->index, d->props.name, perr[0] ? perr : conf_status_name(rc));
    }
    d->plugin = p;
    return 0;
}

void conf_device_close(struct conf_device *d)
{
    if (d->plugin && d->ctx)
        d->plugin->ops->close(d->ctx);
    memset(d, 0, sizeof(*d));
}
