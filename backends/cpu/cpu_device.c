/* The one device of the CPU plugin: the host CPU. Its name comes from
 * /proc/cpuinfo plus the kernel set a context will pick; memory from sysinfo(2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int dray_cpu_pick_isa(int want_reference, char *err, size_t errlen)
{
    int best = DRAY_CPU_ISA_REFERENCE;
    if (dray_cpu_have_avx2())
        best = dray_cpu_have_avxvnni() ? DRAY_CPU_ISA_AVXVNNI : DRAY_CPU_ISA_AVX2;
    if (want_reference || dray_cpu_env_reference())
        return DRAY_CPU_ISA_REFERENCE;
    const char *e = getenv("DRAY_CPU_ISA");
    if (!e || !e[0])
        return best;
    int want;
    if (!strcmp(e, "reference") || !strcmp(e, "scalar"))
        want = DRAY_CPU_ISA_REFERENCE;
    else if (!strcmp(e, "avx2"))
        want = DRAY_CPU_ISA_AVX2;
    else if (!strcmp(e, "avxvnni") || !strcmp(e, "avx-vnni"))
        want = DRAY_CPU_ISA_AVXVNNI;
    else {
        if (err)
            snprintf(err, errlen, "cpu: DRAY_CPU_ISA=%s (want reference, avx2 or avxvnni)", e);
        return DRAY_EINVAL;
    }
    return want < best ? want : best;
}

const char *dray_cpu_isa_name(int isa)
{
    return isa == DRAY_CPU_ISA_AVXVNNI ? "avx-vnni" : isa == DRAY_CPU_ISA_AVX2 ? "avx2+fma" : "scalar";
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
        isa = dray_cpu_have_avx2() ? (dray_cpu_have_avxvnni() ? DRAY_CPU_ISA_AVXVNNI : DRAY_CPU_ISA_AVX2)
                                   : DRAY_CPU_ISA_REFERENCE;
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
