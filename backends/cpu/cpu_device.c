/* The one device of the CPU plugin: the host CPU. Its name comes from
 * /proc/cpuinfo plus the kernel set a context will pick; memory from sysinfo(2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

int dray_cpu_have_avx2(void)
{
#if defined(DRAY_CPU_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    /* clang 14 has no "f16c" name for __builtin_cpu_supports: CPUID.1:ECX bit 29. */
    unsigned eax, ebx, ecx = 0, edx;
    int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return 0;
#endif
}

int dray_cpu_have_avxvnni(void)
{
#if defined(DRAY_CPU_AVXVNNI) && (defined(__x86_64__) || defined(__i386__))
    /* clang 14 has no "avxvnni" name for __builtin_cpu_supports: CPUID.(7,1):EAX
     * bit 4. It is a VEX (ymm) extension, so the OS support AVX2 needs suffices. */
    unsigned eax = 0, ebx, ecx, edx;
    if (!dray_cpu_have_avx2() || !__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx))
        return 0;
    return (eax >> 4) & 1;
#else
    return 0;
#endif
}

#if defined(__x86_64__) || defined(__i386__)
/* XCR0: which register state the OS saves (xgetbv needs CPUID.1:ECX.OSXSAVE). */
static uint64_t xcr0(void)
{
    unsigned eax, ebx, ecx = 0, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27)))
        return 0;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

int dray_cpu_have_avx512vnni(void)
{
#if defined(DRAY_CPU_AVX512VNNI) && (defined(__x86_64__) || defined(__i386__))
    /* CPUID.(7,0): EBX 16 = F, 30 = BW, 31 = VL; ECX 11 = VNNI. XCR0 bits 1, 2
     * (xmm, ymm) and 5, 6, 7 (opmask, upper zmm halves, zmm16-31). */
    unsigned eax, ebx = 0, ecx = 0, edx;
    if (!dray_cpu_have_avx2() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    unsigned need_b = (1u << 16) | (1u << 30) | (1u << 31);
    return (ebx & need_b) == need_b && (ecx & (1u << 11)) && (xcr0() & 0xe6) == 0xe6;
#else
    return 0;
#endif
}

#if defined(DRAY_CPU_AMX) && defined(__x86_64__) && defined(SYS_arch_prctl)
/* Linux asks each process to request the 8 KiB AMX tile data state before its
 * first tile instruction (which would otherwise fault): arch_prctl with
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA. Asked once; the answer holds for
 * every thread of the process. */
#define DRAY_ARCH_REQ_XCOMP_PERM 0x1023
#define DRAY_XFEATURE_XTILEDATA 18
static int amx_permitted(void)
{
    static int answer = -1; /* -1 not asked yet; racing first calls ask twice, harmlessly */
    if (answer < 0)
        answer = syscall(SYS_arch_prctl, DRAY_ARCH_REQ_XCOMP_PERM, DRAY_XFEATURE_XTILEDATA) == 0;
    return answer;
}
#endif

int dray_cpu_have_amx(void)
{
#if defined(DRAY_CPU_AMX) && defined(__x86_64__) && defined(SYS_arch_prctl)
    /* CPUID.(7,0):EDX 24 = AMX-TILE, 25 = AMX-INT8; XCR0 17, 18 = tile config, data. */
    unsigned eax, ebx, ecx, edx = 0;
    if (!dray_cpu_have_avx512vnni() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    unsigned need = (1u << 24) | (1u << 25);
    if ((edx & need) != need || (xcr0() & 0x60000) != 0x60000)
        return 0;
    return amx_permitted();
#else
    return 0;
#endif
}

/* AMX is not in the default: the kernel has been checked bit for bit on a
 * software model of the tile instructions (tests/test_amx_emul.c) but not yet
 * on a machine that grants the tile state (the development VM hides AMX), so it
 * runs only when DRAY_CPU_ISA=amx asks for it; test_cpu_ops checks it there. */
int dray_cpu_best_isa(void)
{
    if (!dray_cpu_have_avx2())
        return DRAY_CPU_ISA_REFERENCE;
    if (dray_cpu_have_avx512vnni())
        return DRAY_CPU_ISA_AVX512VNNI;
    return dray_cpu_have_avxvnni() ? DRAY_CPU_ISA_AVXVNNI : DRAY_CPU_ISA_AVX2;
}

/* The kernel sets by name, in enum order. */
static const char *const isa_env[] = {"reference", "avx2", "avxvnni", "avx512vnni", "amx"};
static const char *const isa_shown[] = {"scalar", "avx2+fma", "avx-vnni", "avx512-vnni", "amx-int8"};

int dray_cpu_pick_isa(int want_reference, char *err, size_t errlen)
{
    int best = dray_cpu_best_isa();
    if (want_reference || dray_cpu_env_reference())
        return DRAY_CPU_ISA_REFERENCE;
    const char *e = getenv("DRAY_CPU_ISA");
    if (!e || !e[0])
        return best;
    int want = -1;
    for (int i = 0; i <= DRAY_CPU_ISA_AMX; i++)
        if (!strcmp(e, isa_env[i]) || !strcmp(e, isa_shown[i]))
            want = i;
    if (want < 0) {
        if (err)
            snprintf(err, errlen, "cpu: DRAY_CPU_ISA=%s (want reference, avx2, avxvnni, avx512vnni or amx)", e);
        return DRAY_EINVAL;
    }
    /* AMX needs the tile permission as well as the CPU: asking for it where the
     * CPU lacks it or the kernel refused gives the default, like any set the CPU
     * lacks */
    if (want == DRAY_CPU_ISA_AMX)
        return dray_cpu_have_amx() ? want : best;
    return want < best ? want : best;
}

const char *dray_cpu_isa_name(int isa)
{
    return isa >= 0 && isa <= DRAY_CPU_ISA_AMX ? isa_shown[isa] : "scalar";
}

int dray_cpu_env_reference(void)
{
    const char *e = getenv("DRAY_CPU_REFERENCE");
    return e && e[0] && strcmp(e, "0") != 0;
}

/* Value of the first "key : value" line of /proc/cpuinfo, or def. */
static void cpuinfo_field(const char *key, char *dst, size_t n, const char *def)
{
    snprintf(dst, n, "%s", def);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    size_t klen = strlen(key);
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, klen) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\n")] = '\0';
        if (*v)
            snprintf(dst, n, "%s", v);
        break;
    }
    fclose(f);
}

int dray_cpu_device_props(uint32_t index, struct dray_device_props *props)
{
    if (!props || index != 0)
        return DRAY_EINVAL;
    memset(props, 0, sizeof(*props));
    int isa = dray_cpu_pick_isa(0, NULL, 0);
    if (isa < 0) /* bad DRAY_CPU_ISA: open() reports it; describe the default here */
        isa = dray_cpu_best_isa();
    int ref = isa == DRAY_CPU_ISA_REFERENCE;
    char model[100];
    cpuinfo_field("model name", model, sizeof(model), "CPU");
    snprintf(props->name, sizeof(props->name), "%s (%s)", model, dray_cpu_isa_name(isa));
    cpuinfo_field("vendor_id", props->vendor, sizeof(props->vendor), "unknown");

    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        props->mem_total = (uint64_t)si.totalram * si.mem_unit;
        props->mem_free = ((uint64_t)si.freeram + si.bufferram) * si.mem_unit;
    }
    props->max_alloc = props->mem_total;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    props->compute_units = n > 0 ? (uint32_t)n : 1;
    props->flags = DRAY_DEV_UNIFIED | (ref ? DRAY_DEV_REFERENCE : 0);

    props->op_dtypes[DRAY_OP_EMBED] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_RMSNORM] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_MATMUL] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ROPE] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_KV_STORE] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_ATTENTION] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_GATED_ACT] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ADD] = DRAY_DTYPE_BIT(DRAY_F32);
    return 0;
}
