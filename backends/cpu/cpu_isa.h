/* Which CPU kernel set a context runs. Each set states the CPUID features and
 * OS register state it needs; the choice picks the best set whose needs this
 * CPU meets, never by rank alone (a Zen 4 has AVX-512 VNNI but not AVX-VNNI).
 * The CPUID reads sit behind a provider a test can replace (tests/test_cpu_isa.c
 * runs the choice over a table of CPUs). */
#ifndef DRAY_CPU_ISA_H
#define DRAY_CPU_ISA_H

#include <stddef.h>
#include <stdint.h>

#define DRAY_CPU_HIDDEN __attribute__((visibility("hidden")))

/* Kernel sets, best last. */
enum dray_cpu_isa {
    DRAY_CPU_ISA_REFERENCE,
    DRAY_CPU_ISA_AVX2,
    DRAY_CPU_ISA_AVXVNNI,
    DRAY_CPU_ISA_AVX512VNNI,
    DRAY_CPU_ISA_AMX,
    DRAY_CPU_ISA_COUNT,
};

/* What a kernel set can need: CPUID bits, OS-saved register state (XCR0) and,
 * for AMX, the kernel's grant of the tile data to this process. */
enum dray_cpu_feature {
    DRAY_CPU_F_AVX2,       /* CPUID.(7,0):EBX[5] */
    DRAY_CPU_F_FMA,        /* CPUID.1:ECX[12] */
    DRAY_CPU_F_F16C,       /* CPUID.1:ECX[29] */
    DRAY_CPU_F_OS_YMM,     /* OSXSAVE and XCR0 bits 1, 2 (xmm, ymm) */
    DRAY_CPU_F_AVX_VNNI,   /* CPUID.(7,1):EAX[4], the VEX form */
    DRAY_CPU_F_AVX512F,    /* CPUID.(7,0):EBX[16] */
    DRAY_CPU_F_AVX512BW,   /* EBX[30] */
    DRAY_CPU_F_AVX512VL,   /* EBX[31] */
    DRAY_CPU_F_AVX512VNNI, /* CPUID.(7,0):ECX[11] */
    DRAY_CPU_F_OS_ZMM,     /* XCR0 bits 5, 6, 7 (opmask, zmm0-15 upper, zmm16-31) */
    DRAY_CPU_F_AMX_TILE,   /* CPUID.(7,0):EDX[24] */
    DRAY_CPU_F_AMX_INT8,   /* EDX[25] */
    DRAY_CPU_F_OS_TILE,    /* XCR0 bits 17, 18 (tile config, tile data) */
    DRAY_CPU_F_AMX_GRANT,  /* arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded */
    DRAY_CPU_F_COUNT,
};
#define DRAY_CPU_BIT(f) (1u << (f))

/* Where the facts come from. The default reads the real CPU; a test installs
 * its own with dray_cpu_set_id_provider. */
struct dray_cpu_id_provider {
    /* CPUID leaf, subleaf -> r = {eax, ebx, ecx, edx} */
    void (*cpuid)(uint32_t leaf, uint32_t subleaf, uint32_t r[4]);
    /* XCR0; called only when CPUID.1:ECX.OSXSAVE says xgetbv exists */
    uint64_t (*xcr0)(void);
    /* ask the kernel for the AMX tile data; 1 granted. Called only on a CPU
     * and OS with AMX, and only when the AMX set is asked for. */
    int (*amx_grant)(void);
};

/* NULL restores the real CPU. */
DRAY_CPU_HIDDEN void dray_cpu_set_id_provider(const struct dray_cpu_id_provider *p);

/* The features the provider reports (a DRAY_CPU_BIT mask); AMX_GRANT only
 * when ask_amx and the CPU and OS have AMX. */
DRAY_CPU_HIDDEN uint32_t dray_cpu_features(int ask_amx);

/* The mask of kernel sets compiled into this build (bit = enum dray_cpu_isa). */
DRAY_CPU_HIDDEN uint32_t dray_cpu_isa_built(void);

/* The features set isa needs. */
DRAY_CPU_HIDDEN uint32_t dray_cpu_isa_needs(int isa);

/* Whether the CPU (features) and the build (built) can run isa. */
DRAY_CPU_HIDDEN int dray_cpu_isa_runs(int isa, uint32_t features, uint32_t built);

/* The default: the best set features and built allow, AMX excepted (opt-in,
 * see cpu_isa.c). */
DRAY_CPU_HIDDEN int dray_cpu_isa_default(uint32_t features, uint32_t built);

/* The choice. want is DRAY_CPU_ISA's value (NULL or "" for the default), by
 * its name ("avx512vnni") or its shown name ("avx512-vnni"). A set the CPU or
 * build lacks gives the default with a reason in warn ("" otherwise) naming
 * what is missing. An unknown name returns DRAY_EINVAL with a reason in err. */
DRAY_CPU_HIDDEN int dray_cpu_isa_choose(const char *want, uint32_t features, uint32_t built, char *warn,
                                        size_t warnlen, char *err, size_t errlen);

/* "scalar", "avx2+fma", "avx-vnni", "avx512-vnni", "amx-int8" (the device name
 * shows it); dray_cpu_isa_env: the DRAY_CPU_ISA name ("reference", "avx2", ...). */
DRAY_CPU_HIDDEN const char *dray_cpu_isa_name(int isa);
DRAY_CPU_HIDDEN const char *dray_cpu_isa_env(int isa);

/* The features isa needs that features lacks, as "AVX-VNNI, ..." into buf ("" when nothing is). */
DRAY_CPU_HIDDEN void dray_cpu_isa_missing(int isa, uint32_t features, char *buf, size_t n);

#endif /* DRAY_CPU_ISA_H */
