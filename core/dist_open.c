/* The process's transport module (core/dist.h): libdray-<name>.so from
 * $DRAY_TRANSPORT_PATH, else the build tree's transports/, else the
 * installed transports folder beside the plugins. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist.h"
#include "dist_proto.h"
#include "error.h"
#include "log.h"

#ifndef DRAY_BUILD_ROOT
#define DRAY_BUILD_ROOT ""
#endif
#ifndef DRAY_TRANSPORT_INSTALL_DIR
#define DRAY_TRANSPORT_INSTALL_DIR ""
#endif

static struct dray_dist *the_dist;
static struct dray_dist opened;
static uint8_t told[256]; /* rank 0: the ranks said goodbye to (1) or lost (2) */
static bool any_lost;

void dray_dist_use(struct dray_dist *t)
{
    the_dist = t;
}

struct dray_dist *dray_dist_get(void)
{
    return the_dist;
}

void dray_dist_bye(struct dray_dist *t, uint32_t r)
{
    static const struct dist_req q = {.op = DIST_BYE}; /* static: a failed send may still read it */
    char why[512];
    if (r >= sizeof(told) || told[r])
        return;
    told[r] = 1;
    if (t->send(t->self, r, &q, sizeof(q), DIST_BYE_TIMEOUT_S, why, sizeof(why)))
        dray_warn("rank %u: %s", r, why);
}

void dray_dist_lost(uint32_t r)
{
    if (r < sizeof(told))
        told[r] = 2;
    any_lost = true;
}

void dray_dist_close(void)
{
    struct dray_dist *t = the_dist;
    if (!t)
        return;
    for (uint32_t r = 1; t->rank == 0 && r < t->size; r++)
        dray_dist_bye(t, r);
    if (!any_lost) /* MPI_Finalize would wait for the lost rank for ever */
        t->close(t->self);
    the_dist = NULL;
}

static void *try_dir(const char *dir, size_t n, const char *name, char *tried, size_t cap)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%.*s/libdray-%s.so", (int)n, dir, name);
    size_t at = strlen(tried);
    snprintf(tried + at, cap - at, "%s%.400s", at ? ", " : "", path);
    return access(path, R_OK) ? NULL : dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

int dray_dist_open(const struct dray_config *cfg, struct dray_dist **out, char *err, size_t errlen)
{
    *out = the_dist;
    if (the_dist)
        return 0;
    const char *name = cfg->distributed;
    char tried[2048] = "", build[PATH_MAX];
    void *h = NULL;
    const char *env = getenv("DRAY_TRANSPORT_PATH");
    for (const char *p = env; p && *p && !h;) {
        size_t n = strcspn(p, ":");
        if (n)
            h = try_dir(p, n, name, tried, sizeof(tried));
        p += n + (p[n] == ':');
    }
    snprintf(build, sizeof(build), "%s/transports", DRAY_BUILD_ROOT);
    static const char root[] = DRAY_BUILD_ROOT, installed[] = DRAY_TRANSPORT_INSTALL_DIR;
    if (!h && root[0])
        h = try_dir(build, strlen(build), name, tried, sizeof(tried));
    if (!h && installed[0])
        h = try_dir(installed, strlen(installed), name, tried, sizeof(tried));
    const char *dl = h ? NULL : dlerror();
    if (!h)
        return dray_fail(err, errlen, DRAY_ENOTFOUND, "distributed '%s': no transport module (tried %s; %s)",
                         name, tried, dl ? dl : "none is there: build dray with Open MPI installed");
    dray_dist_open_fn open_fn = (dray_dist_open_fn)(uintptr_t)dlsym(h, DRAY_DIST_OPEN_SYMBOL);
    if (!open_fn)
        return dray_fail(err, errlen, DRAY_EINCOMPAT, "distributed '%s': the module has no %s", name,
                         DRAY_DIST_OPEN_SYMBOL);
    char why[512] = "";
    if (open_fn(&opened, why, sizeof(why)))
        return dray_fail(err, errlen, DRAY_EBACKEND, "distributed '%s': %s", name, why);
    if (opened.abi != DRAY_DIST_ABI)
        return dray_fail(err, errlen, DRAY_EINCOMPAT, "distributed '%s': the module speaks transport ABI %u, "
                         "dray %u", name, opened.abi, DRAY_DIST_ABI);
    the_dist = &opened;
    *out = the_dist;
    dray_info("distributed over %s: rank %u of %u on %s", name, opened.rank, opened.size, opened.host);
    return 0;
}
