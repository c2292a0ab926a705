/* libdray-faulty.so: the CPU plugin with one injected failure, for tests that
 * show every device failure surfaces as a clear error, frees what was held and
 * leaves the engine usable (the fault-injection sweep).
 *
 * It dlopens the CPU plugin (DRAY_FAULT_INNER, else the build's
 * backends/cpu/libdray-cpu.so, compiled in) and passes every call through,
 * counting calls per kind over the whole process. The environment says which
 * call fails, read at open():
 *
 *   DRAY_FAULT=KIND:N[,KIND:N...]   the Nth call (1-based) of KIND fails, once
 *       KIND: alloc upload download copy fill synchronize weight_create (memory,
 *             queue and packed weights),
 *             embed rmsnorm matmul rope kv_store attention gated_act add (ops),
 *             op (the Nth op of any kind) or any (the Nth call of any kind)
 *   DRAY_FAULT_COUNTS=1             on close, log the calls counted per kind
 *                                   (a sweep's range of N)
 * The count starts at each open(). In-process tests (dlsym on this library) read
 * it with dray_faulty_calls(KIND) and re-arm with dray_faulty_arm(SETTING), which
 * starts the count again: one engine then takes a whole sweep.
 *
 * A failed call does not reach the CPU plugin: alloc returns DRAY_ENOMEM with
 * *out NULL, everything else DRAY_EBACKEND; last_error names the call, its
 * number and the setting, e.g. "matmul: injected fault (matmul call 5 of
 * DRAY_FAULT=matmul:5)". */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dray/backend.h"

#ifndef FAULTY_INNER
#error "build with -DFAULTY_INNER=\"path/to/libdray-cpu.so\""
#endif

enum kind {
    K_ALLOC, K_UPLOAD, K_DOWNLOAD, K_COPY, K_FILL, K_SYNC, K_WEIGHT_CREATE,
    K_EMBED, K_RMSNORM, K_MATMUL, K_ROPE, K_KV_STORE, K_ATTENTION, K_GATED_ACT, K_ADD,
    K_COUNT,
    K_OP = K_COUNT, /* pseudo kinds of a DRAY_FAULT entry */
    K_ANY,
};
#define K_FIRST_OP K_EMBED

static const char *const kind_names[] = {
    "alloc", "upload", "download", "copy", "fill", "synchronize", "weight_create",
    "embed", "rmsnorm", "matmul", "rope", "kv_store", "attention", "gated_act", "add",
    "op", "any",
};

#define MAX_FAULTS 8
struct fault {
    enum kind kind;
    unsigned long n;
};

static const struct dray_host *g_host;
static const struct dray_ops *g_inner;
static void *g_lib;
static struct fault g_faults[MAX_FAULTS];
static int g_n_faults;
static char g_setting[128];
/* calls so far, per kind and of the pseudo kinds; atomics: any thread may call */
static unsigned long g_calls[K_COUNT + 2];

struct dray_ctx {
    void *inner; /* the CPU plugin's context */
    char err[256];
    bool injected; /* the last call's error is ours */
};

static void say(int level, const char *msg)
{
    if (g_host && g_host->log)
        g_host->log(level, "faulty", msg);
    else
        fprintf(stderr, "faulty: %s\n", msg);
}

/* "matmul:5,alloc:2" into g_faults; 0, or -1 with a reason in err */
static int parse_setting(const char *s, char *err, size_t errlen)
{
    g_n_faults = 0;
    snprintf(g_setting, sizeof(g_setting), "%s", s ? s : "");
    if (!s || !*s)
        return 0;
    const char *p = s;
    while (*p) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : 0;
        int k = -1;
        for (int i = 0; colon && i < K_ANY + 1; i++)
            if (strlen(kind_names[i]) == len && !strncmp(kind_names[i], p, len))
                k = i;
        char *end = NULL;
        unsigned long n = colon ? strtoul(colon + 1, &end, 10) : 0;
        if (k < 0 || !end || end == colon + 1 || (*end && *end != ',') || n == 0 ||
            g_n_faults == MAX_FAULTS) {
            snprintf(err, errlen, "faulty: DRAY_FAULT='%s': expected KIND:N[,KIND:N...] (at most %d), "
                     "KIND one of alloc upload download copy fill synchronize weight_create embed rmsnorm matmul "
                     "rope kv_store attention gated_act add op any, N >= 1", s, MAX_FAULTS);
            return -1;
        }
        g_faults[g_n_faults++] = (struct fault){(enum kind)k, n};
        p = *end ? end + 1 : end;
    }
    return 0;
}

static void reset_counts(void)
{
    for (int k = 0; k < K_ANY + 1; k++)
        __atomic_store_n(&g_calls[k], 0, __ATOMIC_RELAXED);
}

/* Count a call of kind k on ctx; true when it is the one to fail (then ctx->err
 * says so). */
static bool inject(struct dray_ctx *ctx, enum kind k)
{
    unsigned long nk = __atomic_add_fetch(&g_calls[k], 1, __ATOMIC_RELAXED);
    unsigned long nop = k >= K_FIRST_OP ? __atomic_add_fetch(&g_calls[K_OP], 1, __ATOMIC_RELAXED) : 0;
    unsigned long nany = __atomic_add_fetch(&g_calls[K_ANY], 1, __ATOMIC_RELAXED);
    ctx->injected = false;
    for (int i = 0; i < g_n_faults; i++) {
        const struct fault *f = &g_faults[i];
        unsigned long n = f->kind == K_OP ? nop : f->kind == K_ANY ? nany : f->kind == k ? nk : 0;
        if (n == f->n) {
            snprintf(ctx->err, sizeof(ctx->err), "%s: injected fault (%s call %lu of DRAY_FAULT=%s)",
                     kind_names[k], kind_names[f->kind], n, g_setting);
            ctx->injected = true;
            return true;
        }
    }
    return false;
}

static struct dray_ctx *in(struct dray_ctx *ctx)
{
    return (struct dray_ctx *)ctx->inner;
}

/* ------------------------------------------------------------ devices */

static int f_device_count(uint32_t *count)
{
    return g_inner->device_count(count);
}

static int f_device_props(uint32_t index, struct dray_device_props *props)
{
    return g_inner->device_props(index, props);
}

static int f_op_caps(uint32_t index, struct dray_op_caps *caps)
{
    return g_inner->op_caps(index, caps);
}

static int f_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    if (parse_setting(getenv("DRAY_FAULT"), err, errlen))
        return DRAY_EINVAL;
    reset_counts();
    struct dray_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "faulty: out of memory");
        return DRAY_ENOMEM;
    }
    struct dray_ctx *inner = NULL;
    int rc = g_inner->open(index, opt, &inner, err, errlen);
    if (rc) {
        free(c);
        return rc;
    }
    c->inner = inner;
    *out = c;
    return 0;
}

static void f_close(struct dray_ctx *ctx)
{
    if (!ctx)
        return;
    if (getenv("DRAY_FAULT_COUNTS")) {
        char line[512];
        int o = snprintf(line, sizeof(line), "calls:");
        for (int k = 0; k < K_ANY + 1 && o < (int)sizeof(line); k++)
            o += snprintf(line + o, sizeof(line) - (size_t)o, " %s=%lu", kind_names[k],
                          __atomic_load_n(&g_calls[k], __ATOMIC_RELAXED));
        say(DRAY_LOG_WARN, line);
    }
    g_inner->close(in(ctx));
    free(ctx);
}

static const char *f_last_error(struct dray_ctx *ctx)
{
    return ctx->injected ? ctx->err : g_inner->last_error(in(ctx));
}

/* ------------------------------------------------------------ memory */

/* A view of ours is the inner plugin's view: buffers pass through untouched. */
static int f_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    if (inject(ctx, K_ALLOC)) {
        *out = NULL;
        return DRAY_ENOMEM;
    }
    return g_inner->alloc(in(ctx), nbytes, out);
}

static void f_free(struct dray_ctx *ctx, struct dray_buf *buf)
{
    g_inner->free(in(ctx), buf);
}

static int f_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *d, struct dray_packed **out,
                           uint64_t *device_bytes)
{
    if (inject(ctx, K_WEIGHT_CREATE)) {
        *out = NULL;
        return DRAY_ENOMEM;
    }
    return g_inner->weight_create(in(ctx), d, out, device_bytes);
}

static void f_weight_free(struct dray_ctx *ctx, struct dray_packed *w)
{
    g_inner->weight_free(in(ctx), w);
}

#define PASS(kind, call) return inject(ctx, kind) ? DRAY_EBACKEND : (call)

static int f_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    PASS(K_UPLOAD, g_inner->upload(in(ctx), dst, src, nbytes));
}

static int f_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    PASS(K_DOWNLOAD, g_inner->download(in(ctx), dst, src, nbytes));
}

static int f_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    PASS(K_COPY, g_inner->copy(in(ctx), dst, src, nbytes));
}

static int f_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes)
{
    PASS(K_FILL, g_inner->fill(in(ctx), dst, pattern, nbytes));
}

static int f_synchronize(struct dray_ctx *ctx)
{
    PASS(K_SYNC, g_inner->synchronize(in(ctx)));
}

/* ------------------------------------------------------------ ops */

static int f_embed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    PASS(K_EMBED, g_inner->embed(in(ctx), a));
}

static int f_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a)
{
    PASS(K_RMSNORM, g_inner->rmsnorm(in(ctx), a));
}

static int f_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    PASS(K_MATMUL, g_inner->matmul(in(ctx), a));
}

static int f_rope(struct dray_ctx *ctx, const struct dray_rope_args *a)
{
    PASS(K_ROPE, g_inner->rope(in(ctx), a));
}

static int f_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    PASS(K_KV_STORE, g_inner->kv_store(in(ctx), a));
}

static int f_attention(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    PASS(K_ATTENTION, g_inner->attention(in(ctx), a));
}

static int f_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a)
{
    PASS(K_GATED_ACT, g_inner->gated_act(in(ctx), a));
}

static int f_add(struct dray_ctx *ctx, const struct dray_add_args *a)
{
    PASS(K_ADD, g_inner->add(in(ctx), a));
}

static const struct dray_ops faulty_ops = {
    .version = DRAY_ABI_VERSION, /* the CPU plugin it wraps is built from the same header */
    .name = "faulty",
    .describe = "test only: the CPU plugin with the call DRAY_FAULT names failing",
    .device_count = f_device_count,
    .device_props = f_device_props,
    .open = f_open,
    .close = f_close,
    .last_error = f_last_error,
    .alloc = f_alloc,
    .free = f_free,
    .upload = f_upload,
    .download = f_download,
    .copy = f_copy,
    .fill = f_fill,
    .synchronize = f_synchronize,
    .embed = f_embed,
    .rmsnorm = f_rmsnorm,
    .matmul = f_matmul,
    .rope = f_rope,
    .kv_store = f_kv_store,
    .attention = f_attention,
    .gated_act = f_gated_act,
    .add = f_add,
    .op_caps = f_op_caps,
    .weight_create = f_weight_create,
    .weight_free = f_weight_free,
};

/* Calls of kind (a DRAY_FAULT kind name) since the last open(); 0 for an unknown name. */
DRAY_EXPORT unsigned long dray_faulty_calls(const char *kind);
DRAY_EXPORT unsigned long dray_faulty_calls(const char *kind)
{
    for (int k = 0; k < K_ANY + 1; k++)
        if (!strcmp(kind, kind_names[k]))
            return __atomic_load_n(&g_calls[k], __ATOMIC_RELAXED);
    return 0;
}

/* A new DRAY_FAULT setting, counted from now; call it only while no call of the
 * plugin is under way. 0, or -1 when the setting is malformed. */
DRAY_EXPORT int dray_faulty_arm(const char *setting);
DRAY_EXPORT int dray_faulty_arm(const char *setting)
{
    char err[256];
    if (parse_setting(setting, err, sizeof(err)))
        return -1;
    reset_counts();
    return 0;
}

DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *host,
                                      const struct dray_ops **ops, char *err, size_t errlen)
{
    if (!g_inner) {
        const char *path = getenv("DRAY_FAULT_INNER");
        if (!path || !*path)
            path = FAULTY_INNER;
        /* the handle is kept for the process: the registry never unloads us
         * before it stops using our table */
        g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        void *sym = g_lib ? dlsym(g_lib, DRAY_PLUGIN_SYMBOL) : NULL;
        dray_plugin_negotiate_fn neg;
        memcpy(&neg, &sym, sizeof(neg)); /* POSIX: dlsym results convert to functions */
        if (!neg) {
            snprintf(err, errlen, "faulty: cannot load the CPU plugin %s: %s", path, dlerror());
            return DRAY_ENODEV;
        }
        uint32_t v = DRAY_ABI_VERSION;
        const struct dray_ops *inner = NULL;
        int rc = neg(&v, host, &inner, err, errlen);
        if (rc)
            return rc;
        if (v != DRAY_ABI_VERSION || !inner->op_caps || !inner->weight_create) {
            snprintf(err, errlen, "faulty: %s speaks ABI %u, not %u", path, v, DRAY_ABI_VERSION);
            return DRAY_EINCOMPAT;
        }
        g_inner = inner;
    }
    g_host = host;
    if (*version < faulty_ops.version) {
        snprintf(err, errlen, "faulty implements ABI %u; this host speaks %u", faulty_ops.version, *version);
        return DRAY_EINCOMPAT;
    }
    *version = faulty_ops.version;
    *ops = &faulty_ops;
    return 0;
}
