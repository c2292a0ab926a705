/* Plugin registry: search path -> dlopen -> negotiate -> validate -> probe devices.
 *
 * Scanning only lists the files; a plugin is loaded when it is first needed: a
 * name looks in the file named after it (libdray-<name>.so) first, and every
 * file is loaded only to list them all or to find a name no file carries. So
 * `dray run` on the CPU does not start the OpenCL or Vulkan runtimes (their
 * LLVM alone is 57 MB of resident libraries and a tenth of a second).
 *
 * A plugin that cannot be used is dlclosed and recorded in `skipped` with one
 * sentence naming the file, what was wrong (both ABI versions where versions are
 * the problem) and what to do about it; loading goes on with the next file.
 * A plugin that loads but has no device (a CUDA plugin on a machine without a
 * driver) stays loaded with n_devices = 0 and the reason in nodev, so that
 * `dray devices` can say why and `dray_device_open` can fail with that reason. */
#include "dray/plugins.h"
#include "caps.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "error.h"
#include "log.h"

#ifndef DRAY_BUILD_ROOT
#define DRAY_BUILD_ROOT ""
#endif
#ifndef DRAY_PLUGIN_BUILD_PATH
#define DRAY_PLUGIN_BUILD_PATH ""
#endif
#ifndef DRAY_PLUGIN_DIR_FROM_BINDIR
#define DRAY_PLUGIN_DIR_FROM_BINDIR ""
#endif
#ifndef DRAY_PLUGIN_INSTALL_DIR
#define DRAY_PLUGIN_INSTALL_DIR ""
#endif

#define PLUGIN_PREFIX "libdray-"
#define PLUGIN_SUFFIX ".so"

struct dray_registry {
    struct dray_plugin **plugins; /* heap objects: pointers handed out stay valid */
    size_t n_plugins, cap_plugins;
    struct dray_skipped *skipped;
    size_t n_skipped, cap_skipped;
    char **pending; /* files scanned but not loaded yet, in search-path order */
    size_t n_pending, cap_pending;
};

/* ------------------------------------------------------------ host services */

/* While the registry probes a plugin's devices, messages it logs are kept here
 * (the last one wins) and shown only at debug level: "no CUDA driver" becomes the
 * plugin's nodev reason instead of a warning on every start-up. */
static __thread char *probe_capture;
static __thread size_t probe_capture_len;

static void *host_alloc(size_t nbytes)
{
    return malloc(nbytes ? nbytes : 1);
}

static void host_free(void *p)
{
    free(p);
}

static void host_log(int level, const char *plugin, const char *msg)
{
    if (probe_capture && msg) {
        snprintf(probe_capture, probe_capture_len, "%s", msg);
        level = DRAY_LOG_DEBUG;
    }
    dray_log_plugin(level, plugin, msg ? msg : "");
}

static const struct dray_host host_services = {
    .version = DRAY_ABI_VERSION,
    .alloc = host_alloc,
    .free = host_free,
    .log = host_log,
};

/* ------------------------------------------------------------ small helpers */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static const struct dray_skipped *find_skipped(const struct dray_registry *reg, const char *real);
/* What to do about a plugin file dlopen refused. Missing libraries are the usual
 * cause for a real plugin; an empty or non-ELF file (a failed copy, a text file named
 * .so) needs replacing instead, and ldd would only confuse. */
static const char *dlopen_advice(const char *path, const char *dlerr, char *buf, size_t len)
{
    unsigned char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(magic, 1, sizeof(magic), f) : 0;
    if (f)
        fclose(f);
    if (f && n == 0)
        snprintf(buf, len, "the file is empty (0 bytes); replace it with a built plugin or "
                 "remove it from the plugin folder");
    else if (f && (n < 4 || memcmp(magic, "\x7f" "ELF", 4)))
        snprintf(buf, len, "the file is not an ELF shared library (it starts with %02x %02x %02x "
                 "%02x); replace it with a built plugin or remove it from the plugin folder",
                 magic[0], magic[1], magic[2], magic[3]);
    else if (dlerr && strstr(dlerr, "wrong ELF class"))
        snprintf(buf, len, "it was built for another architecture; rebuild it for this machine");
    else
        snprintf(buf, len, "install the libraries it needs (see `ldd %s`)", path);
    return buf;
}

static int add_skipped(struct dray_registry *reg, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int add_skipped(struct dray_registry *reg, const char *path, const char *fmt, ...)
{
    if (reg->n_skipped == reg->cap_skipped) {
        size_t cap = reg->cap_skipped ? 2 * reg->cap_skipped : 8;
        struct dray_skipped *s = realloc(reg->skipped, cap * sizeof(*s));
        if (!s)
            return DRAY_ENOMEM;
        reg->skipped = s;
        reg->cap_skipped = cap;
    }
    struct dray_skipped *s = (struct dray_skipped *)find_skipped(reg, path);
    if (!s) /* a file tried twice keeps one record, with the newest reason */
        s = &reg->skipped[reg->n_skipped++];
    snprintf(s->path, sizeof(s->path), "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->reason, sizeof(s->reason), fmt, ap);
    va_end(ap);
    dray_info("skipped plugin %s", s->reason);
    return 0;
}

static int add_plugin(struct dray_registry *reg, struct dray_plugin *p)
{
    if (reg->n_plugins == reg->cap_plugins) {
        size_t cap = reg->cap_plugins ? 2 * reg->cap_plugins : 8;
        struct dray_plugin **a = realloc(reg->plugins, cap * sizeof(*a));
        if (!a)
            return DRAY_ENOMEM;
        reg->plugins = a;
        reg->cap_plugins = cap;
    }
    reg->plugins[reg->n_plugins++] = p;
    return 0;
}

/* A file skipped on the search path and then loaded by explicit path is no longer skipped. */
static void forget_skipped(struct dray_registry *reg, const char *real)
{
    const struct dray_skipped *s = find_skipped(reg, real);
    if (!s)
        return;
    size_t i = (size_t)(s - reg->skipped);
    memmove(&reg->skipped[i], &reg->skipped[i + 1], (reg->n_skipped - i - 1) * sizeof(*s));
    reg->n_skipped--;
}

static const struct dray_plugin *find_by_name(const struct dray_registry *reg, const char *name)
{
    for (size_t i = 0; i < reg->n_plugins; i++)
        if (!strcmp(reg->plugins[i]->name, name))
            return reg->plugins[i];
    return NULL;
}

static const struct dray_plugin *find_by_path(const struct dray_registry *reg, const char *real)
{
    for (size_t i = 0; i < reg->n_plugins; i++)
        if (!strcmp(reg->plugins[i]->path, real))
            return reg->plugins[i];
    return NULL;
}

static const struct dray_skipped *find_skipped(const struct dray_registry *reg, const char *real)
{
    for (size_t i = 0; i < reg->n_skipped; i++)
        if (!strcmp(reg->skipped[i].path, real))
            return &reg->skipped[i];
    return NULL;
}

/* ------------------------------------------------------------ validation */

#define REMEDY_REBUILD "rebuild the plugin against this dray's backend.h"
#define REMEDY_UPGRADE "upgrade dray to a version that speaks it, or use a build of the plugin for this dray's ABI"

/* Members a table must set, with the version that added them (docs/plugin-abi.md).
 * The version-1 slot after add (host_ptr, reserved since version 2) is the one
 * a table may leave NULL. */
static const struct {
    const char *name;
    size_t offset;
    uint32_t since;
} mandatory[] = {
#define M(m, v) {#m, offsetof(struct dray_ops, m), v}
    M(device_count, 1), M(device_props, 1), M(open, 1), M(close, 1), M(last_error, 1),
    M(alloc, 1), M(free, 1), M(upload, 1), M(download, 1), M(copy, 1), M(fill, 1),
    M(synchronize, 1), M(embed, 1), M(rmsnorm, 1), M(matmul, 1), M(rope, 1), M(kv_store, 1),
    M(attention, 1), M(gated_act, 1), M(add, 1),
    M(op_caps, 2),
#undef M
};

/* Name of the first mandatory member that is NULL, or NULL when all are set. */
static const char *missing_member(const struct dray_ops *ops)
{
    if (!ops->name || !ops->name[0])
        return "name";
    if (!ops->describe)
        return "describe";
    for (size_t i = 0; i < sizeof(mandatory) / sizeof(mandatory[0]); i++) {
        void (*fn)(void);
        if (mandatory[i].since > ops->version)
            continue; /* an older table ends before this member: never read it */
        /* function pointers all have one size on the platforms dray runs on */
        memcpy(&fn, (const char *)ops + mandatory[i].offset, sizeof(fn));
        if (!fn)
            return mandatory[i].name;
    }
    return NULL;
}

/* Negotiate and validate. On success *ops and *abi are set and the reason is
 * empty; on refusal `why` holds the sentence for the skipped list. */
static int negotiate(void *handle, const char *file, const struct dray_ops **ops, uint32_t *abi,
                     char *why, size_t whylen)
{
    dray_plugin_negotiate_fn neg;
    void *sym = dlsym(handle, DRAY_PLUGIN_SYMBOL);
    memcpy(&neg, &sym, sizeof(neg)); /* POSIX: dlsym results convert to functions */
    if (!neg)
        return dray_fail(why, whylen, DRAY_EINCOMPAT,
                         "%s exports no symbol %s: it is not a dray plugin, or it was built "
                         "without DRAY_EXPORT on that function; build it from backend.h",
                         file, DRAY_PLUGIN_SYMBOL);

    uint32_t v = DRAY_ABI_VERSION;
    char perr[256] = "";
    *ops = NULL;
    int rc = neg(&v, &host_services, ops, perr, sizeof(perr));
    perr[sizeof(perr) - 1] = '\0';
    /* a refusing plugin may leave in v the oldest ABI it can speak: when that is
     * newer than this dray, the remedy is a newer dray, not a rebuild */
    if (rc == DRAY_EINCOMPAT)
        return dray_fail(why, whylen, rc, "%s refused this dray's ABI %u..%u: %s: %s", file,
                         DRAY_ABI_VERSION_MIN, DRAY_ABI_VERSION, perr[0] ? perr : "no reason given",
                         v > DRAY_ABI_VERSION ? REMEDY_UPGRADE : REMEDY_REBUILD);
    if (rc != 0)
        return dray_fail(why, whylen, rc ? rc : DRAY_EBACKEND,
                         "%s refused to load (%s): %s: install or fix its runtime, or remove "
                         "the file from the plugin path",
                         file, dray_strerror(rc), perr[0] ? perr : "no reason given");
    if (v < DRAY_ABI_VERSION_MIN || v > DRAY_ABI_VERSION)
        return dray_fail(why, whylen, DRAY_EINCOMPAT, "%s speaks ABI %u, this dray speaks %u..%u: %s",
                         file, v, DRAY_ABI_VERSION_MIN, DRAY_ABI_VERSION,
                         v > DRAY_ABI_VERSION ? REMEDY_UPGRADE : REMEDY_REBUILD);
    if (!*ops)
        return dray_fail(why, whylen, DRAY_EINCOMPAT,
                         "%s negotiated ABI %u but returned no operator table: fix the plugin's "
                         "%s", file, v, DRAY_PLUGIN_SYMBOL);
    if ((*ops)->version != v)
        return dray_fail(why, whylen, DRAY_EINCOMPAT,
                         "%s negotiated ABI %u but its table says version %u (this dray speaks "
                         "%u..%u): the two must agree; %s",
                         file, v, (*ops)->version, DRAY_ABI_VERSION_MIN, DRAY_ABI_VERSION,
                         REMEDY_REBUILD);
    const char *miss = missing_member(*ops);
    if (miss)
        return dray_fail(why, whylen, DRAY_EINCOMPAT,
                         "%s (ABI %u, this dray speaks %u..%u) leaves mandatory member '%s' NULL: "
                         "implement it (an op the device cannot run may return DRAY_ENOTSUP and "
                         "report 0 in op_dtypes)",
                         file, v, DRAY_ABI_VERSION_MIN, DRAY_ABI_VERSION, miss);
    if (strlen((*ops)->name) >= sizeof(((struct dray_plugin *)0)->name))
        return dray_fail(why, whylen, DRAY_EINCOMPAT,
                         "%s has a name of %zu bytes; at most %zu are allowed: shorten ops->name",
                         file, strlen((*ops)->name), sizeof(((struct dray_plugin *)0)->name) - 1);
    *abi = v;
    return 0;
}

/* Ask the plugin how many devices it has; keep what it logged as the reason. */
static void probe_devices(struct dray_plugin *p)
{
    uint32_t n = 0;
    char logged[sizeof(p->nodev)] = "";
    probe_capture = logged;
    probe_capture_len = sizeof(logged);
    int rc = p->ops->device_count(&n);
    probe_capture = NULL;
    probe_capture_len = 0;

    p->n_devices = rc == 0 ? n : 0;
    p->nodev[0] = '\0';
    if (rc != 0)
        snprintf(p->nodev, sizeof(p->nodev), "%s", logged[0] ? logged : dray_strerror(rc));
    else if (n == 0)
        snprintf(p->nodev, sizeof(p->nodev), "%s", logged[0] ? logged : "the plugin reports 0 devices");
    if (p->nodev[0])
        dray_info("plugin %s (%s): no device: %s", p->name, p->path, p->nodev);
}

/* Load one file. Returns DRAY_ENOMEM only on out-of-memory; a plugin that cannot
 * be used is recorded as skipped and 0 is returned. `explicit_path` is set when a
 * caller named the file: then a name already taken does not skip it. */
static int load_file(struct dray_registry *reg, const char *path, int explicit_path,
                     const struct dray_plugin **loaded)
{
    char real[PATH_MAX];
    const char *file = base_name(path);
    *loaded = NULL;
    if (!realpath(path, real))
        return add_skipped(reg, path, "%s cannot be resolved: %s: check the path", file,
                           strerror(errno));
    if (strlen(real) >= sizeof(((struct dray_plugin *)0)->path))
        return add_skipped(reg, path, "%s: its full path is longer than %zu bytes: move it to a "
                           "shorter folder", file, sizeof(((struct dray_plugin *)0)->path) - 1);
    /* the same file reached twice (env path and compiled-in default overlap); a
     * file named explicitly is tried again: a duplicate name does not stop it */
    if ((*loaded = find_by_path(reg, real)) || (!explicit_path && find_skipped(reg, real)))
        return 0;

    dlerror();
    void *handle = dlopen(real, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *e = dlerror();
        char advice[256];
        return add_skipped(reg, real, "%s cannot be loaded: dlopen said \"%s\": %s", file,
                           e ? e : "unknown error", dlopen_advice(real, e, advice, sizeof(advice)));
    }
    const struct dray_ops *ops = NULL;
    uint32_t abi = 0;
    char why[512];
    if (negotiate(handle, file, &ops, &abi, why, sizeof(why)) != 0) {
        dlclose(handle);
        return add_skipped(reg, real, "%s", why);
    }
    const struct dray_plugin *prev = find_by_name(reg, ops->name);
    if (prev && !explicit_path) {
        int rc = add_skipped(reg, real,
                             "%s is named '%s' like %s, loaded first: the first plugin on the "
                             "search path wins; remove one of the two or reorder DRAY_PLUGIN_PATH",
                             file, ops->name, prev->path);
        dlclose(handle);
        return rc;
    }
    struct dray_plugin *p = calloc(1, sizeof(*p));
    if (!p || add_plugin(reg, p) != 0) {
        free(p);
        dlclose(handle);
        return DRAY_ENOMEM;
    }
    memcpy(p->path, real, strlen(real) + 1); /* length checked above */
    snprintf(p->name, sizeof(p->name), "%s", ops->name);
    p->abi = abi;
    p->ops = ops;
    p->handle = handle;
    forget_skipped(reg, real);
    probe_devices(p);
    dray_debug("loaded plugin %s (ABI %u) from %s", p->name, abi, real);
    *loaded = p;
    return 0;
}

static int add_pending(struct dray_registry *reg, const char *path)
{
    if (reg->n_pending == reg->cap_pending) {
        size_t cap = reg->cap_pending ? 2 * reg->cap_pending : 8;
        char **p = realloc(reg->pending, cap * sizeof(*p));
        if (!p)
            return DRAY_ENOMEM;
        reg->pending = p;
        reg->cap_pending = cap;
    }
    if (!(reg->pending[reg->n_pending] = strdup(path)))
        return DRAY_ENOMEM;
    reg->n_pending++;
    return 0;
}

/* Load the pending files named libdray-<name>.so (name NULL: all of them), in
 * search-path order; DRAY_ENOMEM only on out-of-memory. */
static int load_pending(struct dray_registry *reg, const char *name)
{
    char want[128];
    snprintf(want, sizeof(want), "%s%s%s", PLUGIN_PREFIX, name ? name : "", PLUGIN_SUFFIX);
    int rc = 0;
    size_t kept = 0;
    for (size_t i = 0; i < reg->n_pending; i++) {
        char *path = reg->pending[i];
        if (rc || (name && strcmp(base_name(path), want))) {
            reg->pending[kept++] = path;
            continue;
        }
        const struct dray_plugin *p;
        if ((rc = load_file(reg, path, 0, &p)))
            reg->pending[kept++] = path; /* out of memory: tried again next time */
        else
            free(path);
    }
    reg->n_pending = kept;
    return rc;
}

/* Listing needs every file loaded. The registry is logically const to its
 * readers: loading a pending file only fills in what the scan already named. */
static void load_all(const struct dray_registry *reg)
{
    if (reg && reg->n_pending && load_pending((struct dray_registry *)reg, NULL))
        dray_warn("plugin registry: out of memory while loading plugins");
}

static int is_plugin_file(const char *name)
{
    size_t n = strlen(name), np = strlen(PLUGIN_PREFIX), ns = strlen(PLUGIN_SUFFIX);
    return n > np + ns && !strncmp(name, PLUGIN_PREFIX, np) && !strcmp(name + n - ns, PLUGIN_SUFFIX);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Load every libdray-*.so of one folder, in name order so that results do not
 * depend on the file system's directory order. A missing folder is normal. */
static int scan_dir(struct dray_registry *reg, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_plugin_file(e->d_name))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, cap * sizeof(*nn));
            if (!nn) { rc = DRAY_ENOMEM; goto out; }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) { rc = DRAY_ENOMEM; goto out; }
        n++;
    }
    if (n)
        qsort(names, n, sizeof(*names), cmp_str); /* names is NULL when the folder has none */
    for (size_t i = 0; i < n && rc == 0; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        rc = add_pending(reg, path);
    }
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    closedir(d);
    return rc;
}

static int scan_path(struct dray_registry *reg, const char *list)
{
    if (!list)
        return 0;
    char *copy = strdup(list);
    if (!copy)
        return DRAY_ENOMEM;
    int rc = 0;
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir && rc == 0; dir = strtok_r(NULL, ":", &save))
        rc = scan_dir(reg, dir);
    free(copy);
    return rc;
}

/* The default folders: a binary inside the build tree uses the in-tree backends'
 * build folders; any other binary the plugin folder of the install it lives in
 * (found from its own path, so a relocated install works), then the configured
 * install folder (for applications that embed dray from elsewhere). */
static int scan_default_path(struct dray_registry *reg)
{
    char exe[PATH_MAX], dir[PATH_MAX + sizeof(DRAY_PLUGIN_DIR_FROM_BINDIR) + 2];
    size_t root = strlen(DRAY_BUILD_ROOT);
    if (!realpath("/proc/self/exe", exe))
        exe[0] = 0;
    if (root && !strncmp(exe, DRAY_BUILD_ROOT, root) && exe[root] == '/')
        return scan_path(reg, DRAY_PLUGIN_BUILD_PATH);
    char *slash = strrchr(exe, '/');
    if (slash && DRAY_PLUGIN_DIR_FROM_BINDIR[0]) {
        *slash = 0;
        snprintf(dir, sizeof(dir), "%s/%s", exe, DRAY_PLUGIN_DIR_FROM_BINDIR);
        char real[PATH_MAX];
        if (realpath(dir, real) && strcmp(real, DRAY_PLUGIN_INSTALL_DIR)) {
            int rc = scan_path(reg, real);
            if (rc)
                return rc;
        }
    }
    return scan_path(reg, DRAY_PLUGIN_INSTALL_DIR);
}

/* ------------------------------------------------------------ public API */

int dray_registry_open(const char *extra_path, struct dray_registry **out, char *err, size_t errlen)
{
    *out = NULL;
    struct dray_registry *reg = calloc(1, sizeof(*reg));
    if (!reg)
        return dray_fail(err, errlen, DRAY_ENOMEM, "plugin registry: out of memory");
    int rc = scan_path(reg, extra_path);
    if (rc == 0)
        rc = scan_path(reg, getenv("DRAY_PLUGIN_PATH"));
    if (rc == 0)
        rc = scan_default_path(reg);
    if (rc != 0) {
        dray_registry_close(reg);
        return dray_fail(err, errlen, rc, "plugin registry: out of memory while scanning");
    }
    *out = reg;
    return 0;
}

void dray_registry_close(struct dray_registry *reg)
{
    if (!reg)
        return;
    /* DRAY_NO_DLCLOSE=1 keeps loaded plugins (and the vendor runtimes they pulled
     * in) mapped, so a leak checker can still name the library a leak is in */
    const char *keep = getenv("DRAY_NO_DLCLOSE");
    for (size_t i = 0; i < reg->n_plugins; i++) {
        if (reg->plugins[i]->handle && !(keep && keep[0] == '1'))
            dlclose(reg->plugins[i]->handle);
        free(reg->plugins[i]);
    }
    for (size_t i = 0; i < reg->n_pending; i++)
        free(reg->pending[i]);
    free(reg->pending);
    free(reg->plugins);
    free(reg->skipped);
    free(reg);
}

size_t dray_registry_count(const struct dray_registry *reg)
{
    load_all(reg);
    return reg ? reg->n_plugins : 0;
}

const struct dray_plugin *dray_registry_at(const struct dray_registry *reg, size_t i)
{
    load_all(reg);
    return reg && i < reg->n_plugins ? reg->plugins[i] : NULL;
}

size_t dray_registry_n_skipped(const struct dray_registry *reg)
{
    load_all(reg);
    return reg ? reg->n_skipped : 0;
}

const struct dray_skipped *dray_registry_skipped_at(const struct dray_registry *reg, size_t i)
{
    load_all(reg);
    return reg && i < reg->n_skipped ? &reg->skipped[i] : NULL;
}

static int looks_like_path(const char *s)
{
    size_t n = strlen(s), ns = strlen(PLUGIN_SUFFIX);
    return strchr(s, '/') || (n > ns && !strcmp(s + n - ns, PLUGIN_SUFFIX));
}

/* "cpu, opencl" or "none" for error messages. */
static void list_names(const struct dray_registry *reg, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < reg->n_plugins && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", reg->plugins[i]->name);
    if (!reg->n_plugins)
        snprintf(buf, len, "none");
}

const struct dray_plugin *dray_registry_find(struct dray_registry *reg, const char *name_or_path,
                                             char *err, size_t errlen)
{
    if (!reg || !name_or_path || !name_or_path[0]) {
        dray_fail(err, errlen, DRAY_EINVAL, "no plugin name given");
        return NULL;
    }
    if (looks_like_path(name_or_path)) {
        const struct dray_plugin *p = NULL;
        char real[PATH_MAX];
        if (load_file(reg, name_or_path, 1, &p) != 0) {
            dray_fail(err, errlen, DRAY_ENOMEM, "%s: out of memory while loading", name_or_path);
            return NULL;
        }
        if (!p) {
            const struct dray_skipped *s =
                find_skipped(reg, realpath(name_or_path, real) ? real : name_or_path);
            dray_fail(err, errlen, DRAY_ENOTFOUND, "plugin %s not usable: %s", name_or_path,
                      s ? s->reason : "unknown reason");
        }
        return p;
    }
    const struct dray_plugin *p = find_by_name(reg, name_or_path);
    /* its own file first, then the others: a file of another name may carry it */
    for (int pass = 0; !p && pass < 2; pass++) {
        if (load_pending(reg, pass ? NULL : name_or_path)) {
            dray_fail(err, errlen, DRAY_ENOMEM, "plugin '%s': out of memory while loading", name_or_path);
            return NULL;
        }
        p = find_by_name(reg, name_or_path);
    }
    if (p)
        return p;
    /* Was a file of that name skipped? Then its reason is the useful answer. */
    char want[128];
    snprintf(want, sizeof(want), PLUGIN_PREFIX "%s" PLUGIN_SUFFIX, name_or_path);
    for (size_t i = 0; i < reg->n_skipped; i++)
        if (!strcmp(base_name(reg->skipped[i].path), want)) {
            dray_fail(err, errlen, DRAY_ENOTFOUND, "plugin '%s' was skipped: %s", name_or_path,
                      reg->skipped[i].reason);
            return NULL;
        }
    char names[256];
    list_names(reg, names, sizeof(names));
    dray_fail(err, errlen, DRAY_ENOTFOUND,
              "no plugin named '%s' (loaded: %s): build it, or put its libdray-%s.so on "
              "DRAY_PLUGIN_PATH or plugin_path",
              name_or_path, names, name_or_path);
    return NULL;
}

static int all_digits(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

/* Resolve "" / "2" / "h200" to a device index of p. */
static int pick_device(const struct dray_plugin *p, const char *device, uint32_t *index,
                       struct dray_device_props *props, char *err, size_t errlen)
{
    if (!device || !device[0] || all_digits(device)) {
        unsigned long i = device && device[0] ? strtoul(device, NULL, 10) : 0;
        if (i >= p->n_devices)
            return dray_fail(err, errlen, DRAY_ENOTFOUND,
                             "plugin '%s' has no device %lu (it has %u): use an index below %u "
                             "(see `dray devices`)",
                             p->name, i, p->n_devices, p->n_devices);
        *index = (uint32_t)i;
        int rc = p->ops->device_props(*index, props);
        if (rc != 0)
            return dray_fail(err, errlen, rc, "plugin '%s': device %u: cannot read properties: %s",
                             p->name, *index, dray_strerror(rc));
        return 0;
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
    return dray_fail(err, errlen, DRAY_ENOTFOUND,
                     "plugin '%s' has no device whose name contains '%s': give an index or a part "
                     "of a name listed by `dray devices`",
                     p->name, device);
}

int dray_device_open(struct dray_registry *reg, const char *plugin, const char *device,
                     const struct dray_open_options *opt, struct dray_device *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof(*out));
    const struct dray_plugin *p = dray_registry_find(reg, plugin, err, errlen);
    if (!p)
        return DRAY_ENOTFOUND;
    if (p->n_devices == 0)
        return dray_fail(err, errlen, DRAY_ENODEV, "%s: no device: %s", p->name, p->nodev);

    uint32_t index = 0;
    struct dray_device_props props;
    memset(&props, 0, sizeof(props));
    int rc = pick_device(p, device, &index, &props, err, errlen);
    if (rc != 0)
        return rc;

    struct dray_open_options defaults = {.size = sizeof(defaults)};
    struct dray_ctx *ctx = NULL;
    char perr[256] = "";
    rc = p->ops->open(index, opt ? opt : &defaults, &ctx, perr, sizeof(perr));
    perr[sizeof(perr) - 1] = '\0';
    if (rc != 0 || !ctx) {
        if (ctx)
            p->ops->close(ctx);
        return dray_fail(err, errlen, rc ? rc : DRAY_EBACKEND, "%s: cannot open device %u (%s): %s",
                         p->name, index, props.name, perr[0] ? perr : dray_strerror(rc));
    }
    out->plugin = p;
    out->ops = p->ops;
    out->ctx = ctx;
    out->index = index;
    out->props = props;
    rc = dray_plugin_caps(p, index, &out->caps, err, errlen);
    if (rc)
        dray_device_close(out);
    return rc;
}

/* Open as configured and check the device runs the configured dtypes. */
static int open_checked(struct dray_registry *reg, const char *plugin, const char *device,
                        const struct dray_open_options *opt, const struct dray_config *cfg,
                        struct dray_device *out, char *err, size_t errlen)
{
    int rc = dray_device_open(reg, plugin, device, opt, out, err, errlen);
    if (rc)
        return rc;
    char why[256];
    rc = dray_caps_check_config(&out->caps, cfg, why, sizeof(why));
    if (rc) {
        dray_fail(err, errlen, rc, "%s device %u (%s): %s", out->plugin->name, out->index,
                  out->props.name, why);
        dray_device_close(out);
    }
    return rc;
}

int dray_device_open_config(struct dray_registry *reg, const struct dray_config *cfg,
                            struct dray_device *out, char *err, size_t errlen)
{
    struct dray_open_options opt = {
        .size = sizeof(opt),
        .n_threads = cfg->threads,
        .reference = cfg->reference_kernels ? 1 : 0,
    };
    char why[512];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* more workers than cores take turns at every barrier of every op, which slows
     * decode by orders of magnitude (docs/performance.md) */
    if (cfg->threads && cores > 0 && cfg->threads > (unsigned long)cores)
        dray_warn("threads %u is more than the %ld cores here, which makes every op wait on "
                  "descheduled threads; set threads to 0 (one per core) or at most %ld",
                  cfg->threads, cores, cores);
    int rc = open_checked(reg, cfg->backend, cfg->device, &opt, cfg, out, why, sizeof(why));
    if (rc == 0)
        return 0;
    if (!cfg->fallback[0] || !strcmp(cfg->fallback, cfg->backend))
        return dray_fail(err, errlen, rc,
                         "backend '%s' failed: %s (no fallback configured: set `fallback: cpu` "
                         "to run on the CPU instead)",
                         cfg->backend, why);
    dray_warn("backend '%s' failed: %s; falling back to '%s' as configured", cfg->backend, why,
              cfg->fallback);
    /* the configured device names a device of the backend, not of the fallback */
    char why2[512];
    int rc2 = open_checked(reg, cfg->fallback, "", &opt, cfg, out, why2, sizeof(why2));
    if (rc2 == 0)
        return 0;
    return dray_fail(err, errlen, rc, "backend '%s' failed: %s; fallback '%s' failed too: %s",
                     cfg->backend, why, cfg->fallback, why2);
}

void dray_device_close(struct dray_device *dev)
{
    if (!dev)
        return;
    if (dev->ops && dev->ctx)
        dev->ops->close(dev->ctx);
    memset(dev, 0, sizeof(*dev));
}
