/* The CPU plugin: negotiation, the operator table, contexts and memory.
 * Ops run synchronously on the caller's thread (plus the pool), so the queue
 * order of the ABI holds trivially and synchronize() has nothing to wait for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "cpu_layout.h"

static int cpu_device_count(uint32_t *count)
{
    if (!count)
        return DRAY_EINVAL;
    *count = 1;
    return 0;
}

static void pick_kernels(struct dray_ctx *ctx)
{
    struct dray_cpu_kernels ref = {
        dray_cpu_ref_embed,    dray_cpu_ref_rmsnorm,  dray_cpu_ref_quantize,  dray_cpu_ref_matmul,
        dray_cpu_ref_rope,     dray_cpu_ref_kv_store, dray_cpu_ref_attention, dray_cpu_ref_gated_act,
        dray_cpu_ref_gquantize, dray_cpu_ref_gmatmul,
    };
    ctx->k = ref;
#ifdef DRAY_CPU_AVX2
    if (ctx->isa == DRAY_CPU_ISA_REFERENCE)
        return;
    ctx->k.embed = dray_cpu_avx2_embed;
    ctx->k.rmsnorm = dray_cpu_avx2_rmsnorm;
    ctx->k.quantize = dray_cpu_avx2_quantize;
    ctx->k.matmul = dray_cpu_avx2_matmul;
    ctx->k.rope = dray_cpu_avx2_rope;
    ctx->k.attention = dray_cpu_avx2_attention;
    ctx->k.gated_act = dray_cpu_avx2_gated_act;
    ctx->k.gmatmul = dray_cpu_avx2_gmatmul; /* AVX-VNNI too: the AVX-512 one below */
    ctx->k.gquantize = dray_cpu_avx2_gquantize; /* every set from here on */
#endif
#ifdef DRAY_CPU_AVXVNNI
    if (ctx->isa == DRAY_CPU_ISA_AVXVNNI) {
        ctx->k.quantize = dray_cpu_avxvnni_quantize; /* a pair: q is stored biased */
        ctx->k.matmul = dray_cpu_avxvnni_matmul;
    }
#endif
#ifdef DRAY_CPU_AVX512VNNI
    if (ctx->isa == DRAY_CPU_ISA_AVX512VNNI) {
        ctx->k.quantize = dray_cpu_avx512vnni_quantize; /* the same biased q */
        ctx->k.matmul = dray_cpu_avx512vnni_matmul;
    }
    if (ctx->isa >= DRAY_CPU_ISA_AVX512VNNI) {
        ctx->k.attention = dray_cpu_avx512_attention;
        ctx->k.gmatmul = dray_cpu_avx512vnni_gmatmul;
    }
#endif
#ifdef DRAY_CPU_AMX
    if (ctx->isa == DRAY_CPU_ISA_AMX) {
        ctx->k.quantize = dray_cpu_amx_quantize; /* biased q plus the packed tile copy */
        ctx->k.matmul = dray_cpu_amx_matmul;
    }
#endif
}

static int cpu_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out, char *err,
                    size_t errlen)
{
    if (!out) {
        if (err)
            snprintf(err, errlen, "cpu: open: out is NULL");
        return DRAY_EINVAL;
    }
    *out = NULL;
    if (index != 0) {
        if (err)
            snprintf(err, errlen, "cpu: no device %u (the CPU plugin has one device, 0)", index);
        return DRAY_EINVAL;
    }
    struct dray_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        if (err)
            snprintf(err, errlen, "cpu: out of memory for the context");
        return DRAY_ENOMEM;
    }
    uint32_t n = DRAY_UTIL_OPT_HAS(opt, n_threads) ? opt->n_threads : 0;
    if (n == 0) {
        long np = sysconf(_SC_NPROCESSORS_ONLN);
        n = np > 0 ? (uint32_t)np : 1;
    }
    if (n > 256)
        n = 256;
    ctx->n_threads = n;
    int isa = dray_cpu_pick_isa(DRAY_UTIL_OPT_HAS(opt, reference) && opt->reference, err, errlen);
    if (isa < 0) {
        free(ctx);
        return isa;
    }
    ctx->isa = isa; /* REFERENCE when built without the AVX2 kernels */
    ctx->reference = isa == DRAY_CPU_ISA_REFERENCE;
    pick_kernels(ctx);
    int rc = dray_cpu_pool_create(n, &ctx->pool);
    if (rc) {
        if (err)
            snprintf(err, errlen, "cpu: cannot start %u threads", n);
        free(ctx);
        return rc;
    }
    dray_cpu_pool_set_idle(ctx->pool, dray_cpu_fetch_ahead, ctx);
    *out = ctx;
    return 0;
}

static void cpu_close(struct dray_ctx *ctx)
{
    if (!ctx)
        return;
    dray_cpu_pool_destroy(ctx->pool);
    free(ctx->scratch);
    for (uint32_t i = 0; i < DRAY_CPU_ROPE_TABLES; i++) {
        free(ctx->rope[i].cs);
        free(ctx->rope[i].pos);
        free(ctx->rope[i].ff);
    }
    free(ctx);
}

static const char *cpu_last_error(struct dray_ctx *ctx)
{
    return ctx ? ctx->err : "cpu: NULL context";
}

/* Buffers this large (KV pools, activations) are mapped pages, so that a KV
 * sized for a whole context is resident only where tokens were written. */
#define CPU_MAP_MIN ((size_t)1 << 20)

static int cpu_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    ctx->err[0] = '\0';
    if (!out)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "alloc: out is NULL");
    *out = NULL;
    struct dray_buf *b = malloc(sizeof(*b));
    if (!b)
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "alloc: out of host memory");
    /* Round up to 64 so vector tails never read past the allocation. */
    size_t sz = nbytes + 63 < nbytes ? nbytes : (nbytes + 63) & ~(size_t)63;
    b->mapped = b->advised = 0;
    if (sz >= CPU_MAP_MIN) { /* pages of their own: a zero fill can give them back */
        /* whole 2 MiB pages from 2 MiB up: Linux then aligns the mapping for them */
        size_t page = sz >= ((size_t)2 << 20) ? (size_t)2 << 20 : (size_t)sysconf(_SC_PAGESIZE);
        size_t len = (sz + page - 1) & ~(page - 1);
        b->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b->mapped = b->p == MAP_FAILED ? 0 : len;
    }
    if (sz < nbytes || (!b->mapped && posix_memalign(&b->p, 64, sz ? sz : 64) != 0)) {
        free(b);
        return dray_cpu_fail(ctx, DRAY_ENOMEM, "alloc: cannot allocate %zu bytes", nbytes);
    }
    b->size = nbytes;
    *out = b;
    return 0;
}

static void cpu_free(struct dray_ctx *ctx, struct dray_buf *buf)
{
    (void)ctx;
    if (!buf)
        return;
    if (buf->mapped)
        munmap(buf->p, buf->mapped);
    else
        free(buf->p);
    free(buf);
}

/* A mapped buffer's uploaded range (weights, slab by slab) is resident anyway:
 * advise it for huge pages before the copy first touches it, rounded out to
 * 2 MiB. Gathers from a big table (the rescored head's rows) then miss the TLB
 * 512 times less. What only kernels write (KV pools) keeps small pages, and is
 * resident only where tokens were written. */
static void advise_uploaded(struct dray_buf *b, size_t off, size_t n)
{
#ifdef MADV_HUGEPAGE
    const size_t huge = (size_t)2 << 20;
    uintptr_t base = (uintptr_t)b->p, lo = (base + off) & ~(uintptr_t)(huge - 1);
    uintptr_t hi = (base + off + n + huge - 1) & ~(uintptr_t)(huge - 1);
    lo = lo < base + b->advised ? base + b->advised : lo;
    hi = hi > base + b->mapped ? base + b->mapped : hi;
    if (b->mapped < huge || hi <= lo)
        return;
    madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint: failing changes nothing */
    if (lo <= base + b->advised)
        b->advised = hi - base;
#else
    (void)b, (void)off, (void)n;
#endif
}

static int cpu_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    ctx->err[0] = '\0';
    void *d;
    int rc = dray_cpu_view(ctx, "upload dst", dst, nbytes, 1, &d);
    if (rc)
        return rc;
    if (!src && nbytes)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "upload: src is NULL");
    if (nbytes && dst.buf->mapped)
        advise_uploaded(dst.buf, dst.offset, nbytes);
    if (nbytes)
        memcpy(d, src, nbytes);
    return 0;
}

static int cpu_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    ctx->err[0] = '\0';
    void *s;
    int rc = dray_cpu_view(ctx, "download src", src, nbytes, 1, &s);
    if (rc)
        return rc;
    if (!dst && nbytes)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "download: dst is NULL");
    if (nbytes)
        memcpy(dst, s, nbytes);
    return 0;
}

static int cpu_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    ctx->err[0] = '\0';
    void *d, *s;
    int rc = dray_cpu_view(ctx, "copy dst", dst, nbytes, 1, &d);
    if (!rc)
        rc = dray_cpu_view(ctx, "copy src", src, nbytes, 1, &s);
    if (rc)
        return rc;
    memmove(d, s, nbytes); /* views of one buffer may overlap */
    return 0;
}

static int cpu_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes)
{
    ctx->err[0] = '\0';
    if (nbytes % 4)
        return dray_cpu_fail(ctx, DRAY_EINVAL, "fill: %zu bytes is not a multiple of 4", nbytes);
    void *d;
    int rc = dray_cpu_view(ctx, "fill dst", dst, nbytes, 1, &d);
    if (rc)
        return rc;
    if (!pattern && dst.buf->mapped) { /* whole pages are handed back: zero, not resident */
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)d, b = a + nbytes;
        uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
        if (hi > lo && !madvise((void *)lo, hi - lo, MADV_DONTNEED)) {
            memset(d, 0, lo - a);
            memset((void *)hi, 0, b - hi);
            return 0;
        }
    }
    for (size_t i = 0; i < nbytes; i += 4)
        memcpy((char *)d + i, &pattern, 4);
    return 0;
}

static int cpu_synchronize(struct dray_ctx *ctx)
{
    ctx->err[0] = '\0';
    return 0; /* every call has finished by the time it returns */
}

/* The props' dtypes, the packed weight formats the kernels run (cpu_packed.c)
 * with one and two activation passes, and the one limit of the contract:
 * k <= 65536. */
static int cpu_op_caps(uint32_t index, struct dray_op_caps *caps)
{
    const struct dray_util_limits lim = {.max_k = 65536, .matmul_wformats = dray_cpu_wformats(0),
                                         .embed_wformats = dray_cpu_wformats(1), .matmul_passes = 3};
    return dray_util_op_caps(index, caps, dray_cpu_device_props, &lim);
}

static const struct dray_host *g_host;
static char describe_line[640]; /* written by negotiate: the kernel sets this CPU runs */

void dray_cpu_log(int level, const char *msg)
{
    if (g_host && g_host->log)
        g_host->log(level, "cpu", msg);
}

/* "host CPU: kernel sets here: scalar, avx2+fma (default); lacking: avx-vnni (AVX-VNNI),
 * ...; DRAY_CPU_ISA picks one". AMX is listed as opt-in where the CPU and OS
 * have it: the kernel's tile permission is asked only when it is picked. */
static void describe_kernel_sets(void)
{
    uint32_t f = dray_cpu_features(0), built = dray_cpu_isa_built();
    int def = dray_cpu_isa_default(f, built);
    size_t n = sizeof(describe_line), len = 0;
    len += snprintf(describe_line, n, "host CPU: kernel sets here:");
    for (int isa = 0; isa < DRAY_CPU_ISA_COUNT && len < n; isa++) {
        int amx_hw = isa == DRAY_CPU_ISA_AMX && dray_cpu_isa_runs(isa, f | DRAY_CPU_BIT(DRAY_CPU_F_AMX_GRANT), built);
        if (dray_cpu_isa_runs(isa, f, built) || amx_hw)
            len += snprintf(describe_line + len, n - len, "%s %s%s", isa ? "," : "", dray_cpu_isa_name(isa),
                            isa == def ? " (default)" : amx_hw ? " (opt-in)" : "");
    }
    const char *sep = "; lacking:";
    for (int isa = 0; isa < DRAY_CPU_ISA_COUNT && len < n; isa++) {
        if (dray_cpu_isa_runs(isa, f | DRAY_CPU_BIT(DRAY_CPU_F_AMX_GRANT), built))
            continue;
        char missing[256];
        dray_cpu_isa_missing(isa, f | DRAY_CPU_BIT(DRAY_CPU_F_AMX_GRANT), missing, sizeof(missing));
        if (!((built >> isa) & 1))
            snprintf(missing, sizeof(missing), "not in this build");
        len += snprintf(describe_line + len, n - len, "%s %s (%s)", sep, dray_cpu_isa_name(isa), missing);
        sep = ",";
    }
    if (len < n)
        snprintf(describe_line + len, n - len, "; DRAY_CPU_ISA picks one");
}

static const struct dray_ops cpu_ops = {
    .version = 5, /* v4: rope freq_factors and attn_factor, attention softcap; v5: prepared layouts */
    .name = "cpu",
    .describe = describe_line,
    .device_count = cpu_device_count,
    .device_props = dray_cpu_device_props,
    .open = cpu_open,
    .close = cpu_close,
    .last_error = cpu_last_error,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .synchronize = cpu_synchronize,
    .embed = dray_cpu_embed,
    .rmsnorm = dray_cpu_rmsnorm,
    .matmul = dray_cpu_matmul,
    .rope = dray_cpu_rope,
    .kv_store = dray_cpu_kv_store,
    .attention = dray_cpu_attention,
    .gated_act = dray_cpu_gated_act,
    .add = dray_cpu_add,
    .op_caps = cpu_op_caps,
    .weight_create = dray_cpu_weight_create,
    .weight_free = dray_cpu_weight_free,
    .weight_export = dray_cpu_weight_export,
    .weight_import = dray_cpu_weight_import,
    .layout_id = "cpu-1",
};

/* Answers with the version cpu_ops implements (its .version), whatever the
 * host offers above it. The host's log carries the one warning of a
 * DRAY_CPU_ISA the CPU cannot run. */
DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *host,
                                      const struct dray_ops **ops, char *err, size_t errlen)
{
    g_host = host;
    describe_kernel_sets();
    return dray_util_negotiate(version, &cpu_ops, ops, err, errlen);
}
