/* Host allocation failures ("fail the Nth malloc"), on a tiny
 * random-weight Gemma through the CPU plugin. This binary interposes malloc,
 * calloc, realloc and the aligned allocators (glibc's __libc_* do the work),
 * and fails the Nth allocation made by dray's own code: the test binary (libdray
 * is linked in) and the libdray-*.so plugins, as their return address tells.
 * Allocations of the C library and vendor runtimes are passed through (the
 * registry probes every plugin built here, and Mesa's Vulkan driver crashes in
 * its constructor when an allocation fails: not dray's to fix). The ramp fails
 * allocation N, for N over a whole model load and a whole generation, and
 * specifies:
 *   - the open or the generation fails with a message, or (where a failure is
 *     absorbed) succeeds with the tokens of a run without failures;
 *   - nothing crashes, and the next open and generation work;
 *   - allocations are balanced: after an attempt, reported or absorbed, as many
 *     blocks are live as before it (what a failure path forgets to free shows).
 *     The count leaves out blocks a vendor runtime allocates itself (a caller
 *     outside dray, the C library and the loader): Mesa's lavapipe leaks one
 *     block each time the Vulkan loader loads it, which the Vulkan plugin's
 *     probe does at every registry open (seen on an AMD EPYC with Mesa 22.3).
 * Not built under ASan, which brings its own allocator (test_fault runs there). */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "greedy.h"
#include "testutil.h"
#include "tiny_gemma.h"

/* ------------------------------------------------------------ the interposer */

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

static atomic_long g_countdown; /* > 0: the allocation that brings it to 0 fails */
static atomic_long g_live;      /* blocks allocated and not freed, vendor runtimes' own left out */

/* The file name of the object code at addr lies in, or NULL (JIT code, or a
 * library since unloaded). */
static const char *object_of(void *addr)
{
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname)
        return NULL;
    const char *base = strrchr(info.dli_fname, '/');
    return base ? base + 1 : info.dli_fname;
}

/* Whether code at addr belongs to dray: this binary or a libdray-*.so. */
static bool is_dray(void *addr)
{
    const char *base = object_of(addr);
    return base && (!strncmp(base, "libdray", 7) || !strcmp(base, "test_oom"));
}

/* Whether code at addr is a vendor runtime's: neither dray's nor the C
 * library's or the dynamic loader's (which allocate on dray's behalf). */
static bool is_vendor(void *addr)
{
    const char *base = object_of(addr);
    if (!base || !base[0])
        return !base; /* "" is this executable */
    return !(is_dray(addr) || !strncmp(base, "libc.so", 7) || !strncmp(base, "ld-linux", 8) ||
             !strncmp(base, "libm.so", 7) || !strncmp(base, "libcmocka", 9));
}

/* The live blocks vendor runtimes allocated, so that their frees are not
 * counted either: an open-addressed set under a mutex (no allocation). */
#define VENDOR_SLOTS (1u << 20)
static void *g_vendor[VENDOR_SLOTS]; /* NULL empty, TOMB deleted */
#define TOMB ((void *)1)
static pthread_mutex_t g_vendor_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(void *p)
{
    return (size_t)(((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull >> 44) & (VENDOR_SLOTS - 1);
}

static void vendor_add(void *p)
{
    pthread_mutex_lock(&g_vendor_mu);
    size_t i = slot_of(p), n = 0;
    while (g_vendor[i] && g_vendor[i] != TOMB && n++ < VENDOR_SLOTS)
        i = (i + 1) & (VENDOR_SLOTS - 1);
    if (n >= VENDOR_SLOTS) {
        static const char full[] = "test_oom: the vendor block set is full\n";
        (void)!write(2, full, sizeof(full) - 1);
        abort();
    }
    g_vendor[i] = p;
    pthread_mutex_unlock(&g_vendor_mu);
}

/* Removes p if it is a vendor block; returns whether it was. */
static bool vendor_take(void *p)
{
    pthread_mutex_lock(&g_vendor_mu);
    bool found = false;
    for (size_t i = slot_of(p), n = 0; g_vendor[i] && n < VENDOR_SLOTS; i = (i + 1) & (VENDOR_SLOTS - 1), n++)
        if (g_vendor[i] == p) {
            g_vendor[i] = TOMB;
            found = true;
            break;
        }
    pthread_mutex_unlock(&g_vendor_mu);
    return found;
}

/* caller: the return address of the allocator call */
static bool fail_now(void *caller)
{
    if (atomic_load_explicit(&g_countdown, memory_order_relaxed) <= 0 || !is_dray(caller))
        return false;
    return atomic_fetch_sub(&g_countdown, 1) == 1;
}

/* caller: as for fail_now */
static void *counted(void *p, void *caller)
{
    if (!p)
        return p;
    if (is_vendor(caller))
        vendor_add(p);
    else
        atomic_fetch_add_explicit(&g_live, 1, memory_order_relaxed);
    return p;
}

static void uncounted(void *p)
{
    if (p && !vendor_take(p))
        atomic_fetch_sub_explicit(&g_live, 1, memory_order_relaxed);
}

/* Each allocator passes its caller's address on: the caller decides whether the
 * allocation may fail (dray's) and whether it is counted (not a vendor's). */
static void *alloc_from(void *caller, size_t align, size_t n, const size_t *calloc_size)
{
    if (fail_now(caller)) {
        errno = ENOMEM;
        return NULL;
    }
    if (calloc_size)
        return counted(__libc_calloc(n, *calloc_size), caller);
    return counted(align ? __libc_memalign(align, n) : __libc_malloc(n), caller);
}

void *malloc(size_t n)
{
    return alloc_from(__builtin_return_address(0), 0, n, NULL);
}

void *calloc(size_t n, size_t size)
{
    return alloc_from(__builtin_return_address(0), 0, n, &size);
}

void *realloc(void *p, size_t n)
{
    if (!p)
        return alloc_from(__builtin_return_address(0), 0, n, NULL);
    if (fail_now(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    void *q = __libc_realloc(p, n);
    if (q != p && (q || n == 0)) { /* moved (the block keeps its owner) or freed */
        bool vendor = vendor_take(p);
        if (q && vendor)
            vendor_add(q);
        else if (!q && !vendor)
            atomic_fetch_sub_explicit(&g_live, 1, memory_order_relaxed);
    }
    return q;
}

void free(void *p)
{
    uncounted(p);
    __libc_free(p);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = alloc_from(__builtin_return_address(0), align, n, NULL);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
    return alloc_from(__builtin_return_address(0), align, n, NULL);
}

void *memalign(size_t align, size_t n)
{
    return alloc_from(__builtin_return_address(0), align, n, NULL);
}

/* Fail the nth allocation from now (0: none); the count left when disarmed says
 * whether it fired. */
static void arm(long n)
{
    atomic_store(&g_countdown, n);
}

static bool fired(void)
{
    bool f = atomic_load(&g_countdown) <= 0;
    atomic_store(&g_countdown, 0);
    return f;
}

/* ------------------------------------------------------------ the engine */

#define N_GEN 5
static const int32_t PROMPT[] = {2, 17, 40, 93, 120, 7, 250};
#define N_PROMPT (sizeof(PROMPT) / sizeof(PROMPT[0]))

static char g_model[1024];
static int32_t g_clean[N_GEN];

static struct dray_engine *open_tiny(char *err, size_t errlen)
{
    struct dray_config c;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", g_model);
    snprintf(c.backend, sizeof(c.backend), "cpu");
    c.fallback[0] = 0;
    c.context = 64;
    c.kv_block = 4;
    c.threads = 2; /* the pool's threads and their allocations are part of the ramp */
    struct dray_engine *e = NULL;
    err[0] = 0;
    return dray_engine_open(&c, &e, err, errlen) ? NULL : e;
}

static int generate(struct dray_engine *e, struct dray_test_tokens *out, char *err, size_t errlen)
{
    return dray_test_generate_fresh(e, PROMPT, N_PROMPT, N_GEN, out, err, errlen);
}

static bool clean_tokens(const struct dray_test_tokens *c)
{
    return c->n == N_GEN && !memcmp(c->ids, g_clean, sizeof(g_clean));
}

static int setup(void **state)
{
    (void)state;
    /* Plugins stay mapped after an engine closes: the vendor runtimes some of them
     * pull in (OpenCL, Vulkan loaders) keep state across a dlclose and reload
     * that is theirs, not a leak of a failure path. */
    setenv("DRAY_NO_DLCLOSE", "1", 1);
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    snprintf(g_model, sizeof(g_model), "%s", dray_test_path("tiny_oom.gguf"));
    if (tiny_gemma_write(&t, g_model))
        return -1;
    char err[1024];
    /* twice: the first open fills the calibration cache and runs one-time set-ups */
    for (int i = 0; i < 2; i++) {
        struct dray_engine *e = open_tiny(err, sizeof(err));
        struct dray_test_tokens c;
        if (!e || generate(e, &c, err, sizeof(err)) || c.n != N_GEN) {
            fprintf(stderr, "clean run: %s\n", err);
            return -1;
        }
        memcpy(g_clean, c.ids, sizeof(g_clean));
        dray_engine_close(e);
    }
    return 0;
}

/* A clean open, generation and close; returns the blocks live after it. The
 * C library keeps some state of a failed call until the next call of its kind
 * (dlerror's message, for one), so live blocks are compared after this. */
static long clean_cycle(long n)
{
    char err[1024];
    struct dray_engine *e = open_tiny(err, sizeof(err));
    if (!e)
        fail_msg("malloc %ld: the open after the failed attempt failed: %s", n, err);
    struct dray_test_tokens c;
    if (generate(e, &c, err, sizeof(err)) || !clean_tokens(&c))
        fail_msg("malloc %ld: the generation after the failed attempt failed: %s", n, err);
    dray_engine_close(e);
    return atomic_load(&g_live);
}

/* One attempt with allocation n failing: open, generate, close. Returns whether
 * the failure fired; fails the test on a silent or wrong outcome or a leak. */
static bool attempt(long n, long *live_before, unsigned *failed_open, unsigned *failed_gen)
{
    char err[1024] = "";
    long live = *live_before;
    arm(n);
    struct dray_engine *e = open_tiny(err, sizeof(err));
    if (!e) {
        bool f = fired();
        if (!f || !err[0])
            fail_msg("malloc %ld: the open failed without %s: \"%s\"", n,
                     f ? "a message" : "the failure having fired", err);
        ++*failed_open;
    } else {
        struct dray_test_tokens c;
        int rc = generate(e, &c, err, sizeof(err));
        bool f = fired();
        if (rc) {
            if (!f || !err[0])
                fail_msg("malloc %ld: the generation failed without %s: \"%s\"", n,
                         f ? "a message" : "the failure having fired", err);
            ++*failed_gen;
        } else if (!clean_tokens(&c)) {
            fail_msg("malloc %ld: the generation succeeded with other tokens", n);
        }
        /* the same engine goes on after a failed generation */
        if (rc && (generate(e, &c, err, sizeof(err)) || !clean_tokens(&c)))
            fail_msg("malloc %ld: the generation after the failed one failed: %s", n, err);
        dray_engine_close(e);
        if (!f)
            return false;
    }
    long now = clean_cycle(n);
    *live_before = now; /* the next attempt's baseline */
    if (now != live)
        fail_msg("malloc %ld: %ld blocks live after the attempt, %ld before (a failure path leaks); "
                 "the attempt said: \"%s\"", n, now, live, err);
    return true;
}

/* How many of dray's allocations a clean open makes, and an open plus a
 * generation: the counter runs down from a count that never reaches 0. */
static void count_allocations(long *n_open, long *n_total)
{
    char err[1024];
    const long big = 1L << 40;
    arm(big);
    struct dray_engine *e = open_tiny(err, sizeof(err));
    assert_non_null(e);
    *n_open = big - atomic_load(&g_countdown);
    struct dray_test_tokens c;
    assert_int_equal(generate(e, &c, err, sizeof(err)), 0);
    *n_total = big - atomic_load(&g_countdown);
    arm(0);
    dray_engine_close(e);
}

/* The ramp: every allocation of the first 150, then a stride through the rest of
 * the load, then every allocation of the generation (a handful, which a stride
 * sized for the load would jump over), to the end (where the failure no longer
 * fires). */
static void test_every_failing_allocation(void **state)
{
    (void)state;
    unsigned failed_open = 0, failed_gen = 0, tried = 0;
    long n_open, n_total;
    count_allocations(&n_open, &n_total);
    long n = 1, live = clean_cycle(0);
    while (attempt(n, &live, &failed_open, &failed_gen)) {
        tried++;
        if (n < 150 || n >= n_open)
            n++;
        else
            n = n + n / 20 < n_open ? n + n / 20 : n_open;
    }
    fprintf(stderr, "%u allocations failed in turn (up to #%ld; an open makes %ld, a generation %ld): "
            "%u opens and %u generations reported it\n", tried, n, n_open, n_total - n_open,
            failed_open, failed_gen);
    assert_true(tried > 100);
    assert_true(failed_open > 0 && failed_gen > 0);
    char err[1024];
    struct dray_engine *e = open_tiny(err, sizeof(err));
    assert_non_null(e);
    dray_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_failing_allocation),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
