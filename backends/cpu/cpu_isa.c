/* The CPU kernel sets and what each needs, the real CPUID provider, and the
 * choice of a set (cpu_isa.h). */
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dray/backend.h"
#include "cpu_isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#define B DRAY_CPU_BIT
#define NEEDS_AVX2 (B(DRAY_CPU_F_AVX2) | B(DRAY_CPU_F_FMA) | B(DRAY_CPU_F_F16C) | B(DRAY_CPU_F_OS_YMM))
#define NEEDS_AVX512VNNI                                                                          \
    (NEEDS_AVX2 | B(DRAY_CPU_F_AVX512F) | B(DRAY_CPU_F_AVX512BW) | B(DRAY_CPU_F_AVX512VL) |     \
     B(DRAY_CPU_F_AVX512VNNI) | B(DRAY_CPU_F_OS_ZMM))

/* Each set's needs are the instructions its kernels and the kernels it
 * borrows use: AVX-VNNI reuses the AVX2 quantize and f32 kernels; AMX runs
 * the AVX-512 VNNI kernels for everything but prefill-shaped int8 matmuls. */
static const struct {
    const char *env, *shown;
    uint32_t needs;
} sets[DRAY_CPU_ISA_COUNT] = {
    [DRAY_CPU_ISA_REFERENCE] = {"reference", "scalar", 0},
    [DRAY_CPU_ISA_AVX2] = {"avx2", "avx2+fma", NEEDS_AVX2},
    [DRAY_CPU_ISA_AVXVNNI] = {"avxvnni", "avx-vnni", NEEDS_AVX2 | B(DRAY_CPU_F_AVX_VNNI)},
    [DRAY_CPU_ISA_AVX512VNNI] = {"avx512vnni", "avx512-vnni", NEEDS_AVX512VNNI},
    [DRAY_CPU_ISA_AMX] = {"amx", "amx-int8",
                          NEEDS_AVX512VNNI | B(DRAY_CPU_F_AMX_TILE) | B(DRAY_CPU_F_AMX_INT8) |
                              B(DRAY_CPU_F_OS_TILE) | B(DRAY_CPU_F_AMX_GRANT)},
};

static const char *const feature_names[DRAY_CPU_F_COUNT] = {
    [DRAY_CPU_F_AVX2] = "AVX2",
    [DRAY_CPU_F_FMA] = "FMA",
    [DRAY_CPU_F_F16C] = "F16C",
    [DRAY_CPU_F_OS_YMM] = "OS ymm state (XCR0)",
    [DRAY_CPU_F_AVX_VNNI] = "AVX-VNNI",
    [DRAY_CPU_F_AVX512F] = "AVX512F",
    [DRAY_CPU_F_AVX512BW] = "AVX512BW",
    [DRAY_CPU_F_AVX512VL] = "AVX512VL",
    [DRAY_CPU_F_AVX512VNNI] = "AVX512_VNNI",
    [DRAY_CPU_F_OS_ZMM] = "OS zmm state (XCR0)",
    [DRAY_CPU_F_AMX_TILE] = "AMX-TILE",
    [DRAY_CPU_F_AMX_INT8] = "AMX-INT8",
    [DRAY_CPU_F_OS_TILE] = "OS tile state (XCR0)",
    [DRAY_CPU_F_AMX_GRANT] = "the kernel's tile-data permission",
};

/* ------------------------------------------------------------ the real CPU */

#if defined(__x86_64__) || defined(__i386__)
static void real_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4])
{
    r[0] = r[1] = r[2] = r[3] = 0;
    __cpuid_count(leaf, subleaf, r[0], r[1], r[2], r[3]);
}

static uint64_t real_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#else
static void real_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4])
{
    (void)leaf, (void)subleaf;
    r[0] = r[1] = r[2] = r[3] = 0; /* no x86 features */
}

static uint64_t real_xcr0(void)
{
    return 0;
}
#endif

/* Linux asks each process to request the 8 KiB AMX tile data state before its
 * first tile instruction (which would otherwise fault): arch_prctl with
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA. Asked once; the answer holds for
 * every thread of the process (racing first calls ask twice, harmlessly). */
static int real_amx_grant(void)
{
#if defined(__x86_64__) && defined(SYS_arch_prctl)
    static int answer = -1;
    if (answer < 0)
        answer = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return answer;
#else
    return 0;
#endif
}

static const struct dray_cpu_id_provider real_cpu = {real_cpuid, real_xcr0, real_amx_grant};
static const struct dray_cpu_id_provider *provider = &real_cpu;

void dray_cpu_set_id_provider(const struct dray_cpu_id_provider *p)
{
    provider = p ? p : &real_cpu;
}

/* ------------------------------------------------------------ decoding */

static int bit(uint32_t v, int n)
{
    return (v >> n) & 1;
}

uint32_t dray_cpu_features(int ask_amx)
{
    uint32_t r[4], f = 0;
    provider->cpuid(0, 0, r);
    uint32_t max_leaf = r[0];
    if (max_leaf < 1)
        return 0;
    provider->cpuid(1, 0, r);
    uint32_t ecx1 = r[2];
    uint64_t xcr0 = bit(ecx1, 27) ? provider->xcr0() : 0; /* OSXSAVE: xgetbv exists */
    f |= bit(ecx1, 12) ? B(DRAY_CPU_F_FMA) : 0;
    f |= bit(ecx1, 29) ? B(DRAY_CPU_F_F16C) : 0;
    f |= (xcr0 & 0x6) == 0x6 ? B(DRAY_CPU_F_OS_YMM) : 0;
    f |= (xcr0 & 0xe6) == 0xe6 ? B(DRAY_CPU_F_OS_ZMM) : 0;
    f |= (xcr0 & 0x60000) == 0x60000 ? B(DRAY_CPU_F_OS_TILE) : 0;
    if (max_leaf >= 7) {
        provider->cpuid(7, 0, r);
        uint32_t max_sub = r[0], ebx = r[1], ecx = r[2], edx = r[3];
        f |= bit(ebx, 5) ? B(DRAY_CPU_F_AVX2) : 0;
        f |= bit(ebx, 16) ? B(DRAY_CPU_F_AVX512F) : 0;
        f |= bit(ebx, 30) ? B(DRAY_CPU_F_AVX512BW) : 0;
        f |= bit(ebx, 31) ? B(DRAY_CPU_F_AVX512VL) : 0;
        f |= bit(ecx, 11) ? B(DRAY_CPU_F_AVX512VNNI) : 0;
        f |= bit(edx, 24) ? B(DRAY_CPU_F_AMX_TILE) : 0;
        f |= bit(edx, 25) ? B(DRAY_CPU_F_AMX_INT8) : 0;
        if (max_sub >= 1) {
            provider->cpuid(7, 1, r);
            f |= bit(r[0], 4) ? B(DRAY_CPU_F_AVX_VNNI) : 0;
        }
    }
    uint32_t amx_hw = sets[DRAY_CPU_ISA_AMX].needs & ~B(DRAY_CPU_F_AMX_GRANT);
    if (ask_amx && (f & amx_hw) == amx_hw && provider->amx_grant())
        f |= B(DRAY_CPU_F_AMX_GRANT);
    return f;
}

/* ------------------------------------------------------------ the choice */

uint32_t dray_cpu_isa_built(void)
{
    uint32_t m = 1u << DRAY_CPU_ISA_REFERENCE;
#ifdef DRAY_CPU_AVX2
    m |= 1u << DRAY_CPU_ISA_AVX2;
#endif
#ifdef DRAY_CPU_AVXVNNI
    m |= 1u << DRAY_CPU_ISA_AVXVNNI;
#endif
#ifdef DRAY_CPU_AVX512VNNI
    m |= 1u << DRAY_CPU_ISA_AVX512VNNI;
#endif
#ifdef DRAY_CPU_AMX
    m |= 1u << DRAY_CPU_ISA_AMX;
#endif
    return m;
}

uint32_t dray_cpu_isa_needs(int isa)
{
    return isa >= 0 && isa < DRAY_CPU_ISA_COUNT ? sets[isa].needs : ~0u;
}

int dray_cpu_isa_runs(int isa, uint32_t features, uint32_t built)
{
    if (isa < 0 || isa >= DRAY_CPU_ISA_COUNT || !((built >> isa) & 1))
        return 0;
    return (features & sets[isa].needs) == sets[isa].needs;
}

/* AMX is not in the default: the kernel has been checked bit for bit on a
 * software model of the tile instructions (tests/test_amx_emul.c) but not yet
 * on a machine that grants the tile state, so it runs only when DRAY_CPU_ISA=amx
 * asks for it. */
int dray_cpu_isa_default(uint32_t features, uint32_t built)
{
    for (int isa = DRAY_CPU_ISA_AMX - 1; isa > DRAY_CPU_ISA_REFERENCE; isa--)
        if (dray_cpu_isa_runs(isa, features, built))
            return isa;
    return DRAY_CPU_ISA_REFERENCE;
}

void dray_cpu_isa_missing(int isa, uint32_t features, char *buf, size_t n)
{
    if (!n)
        return;
    buf[0] = '\0';
    if (isa < 0 || isa >= DRAY_CPU_ISA_COUNT)
        return;
    size_t len = 0;
    uint32_t lack = sets[isa].needs & ~features;
    if (lack & ~B(DRAY_CPU_F_AMX_GRANT)) /* the permission is asked only of a CPU with AMX */
        lack &= ~B(DRAY_CPU_F_AMX_GRANT);
    for (int f = 0; f < DRAY_CPU_F_COUNT && len < n; f++)
        if ((lack >> f) & 1)
            len += snprintf(buf + len, n - len, "%s%s", len ? ", " : "", feature_names[f]);
}

int dray_cpu_isa_choose(const char *want, uint32_t features, uint32_t built, char *warn, size_t warnlen,
                        char *err, size_t errlen)
{
    if (warn && warnlen)
        warn[0] = '\0';
    int def = dray_cpu_isa_default(features, built);
    if (!want || !want[0])
        return def;
    int isa = -1;
    for (int i = 0; i < DRAY_CPU_ISA_COUNT; i++)
        if (!strcmp(want, sets[i].env) || !strcmp(want, sets[i].shown))
            isa = i;
    if (isa < 0) {
        if (err)
            snprintf(err, errlen, "cpu: DRAY_CPU_ISA=%s (want reference, avx2, avxvnni, avx512vnni or amx)", want);
        return DRAY_EINVAL;
    }
    if (dray_cpu_isa_runs(isa, features, built))
        return isa;
    if (warn && warnlen && !((built >> isa) & 1)) {
        snprintf(warn, warnlen, "DRAY_CPU_ISA=%s: this build has no %s kernels (its compiler lacked the flags); "
                 "using %s", want, sets[isa].shown, sets[def].shown);
    } else if (warn && warnlen) {
        char missing[256];
        dray_cpu_isa_missing(isa, features, missing, sizeof(missing));
        snprintf(warn, warnlen, "DRAY_CPU_ISA=%s: this CPU lacks %s; using %s", want, missing, sets[def].shown);
    }
    return def;
}

const char *dray_cpu_isa_name(int isa)
{
    return isa >= 0 && isa < DRAY_CPU_ISA_COUNT ? sets[isa].shown : "scalar";
}

const char *dray_cpu_isa_env(int isa)
{
    return isa >= 0 && isa < DRAY_CPU_ISA_COUNT ? sets[isa].env : "reference";
}
