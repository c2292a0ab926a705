/* The CPU plugin's kernel-set choice (backends/cpu/cpu_isa.c) over a table of
 * CPUs, through a CPUID provider that answers as each would. No hardware is
 * needed: a Zen 4 and a Sapphire Rapids are checked here on any machine, so a
 * choice that would run an instruction the CPU lacks (a SIGILL) fails here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_isa.h"
#include "dray/backend.h"

/* CPUID bits the table sets (Intel SDM vol. 2A, CPUID; AMD APM vol. 3, E.3) */
#define L1_FMA (1u << 12)
#define L1_OSXSAVE (1u << 27)
#define L1_F16C (1u << 29)
#define L7B_AVX2 (1u << 5)
#define L7B_AVX512F (1u << 16)
#define L7B_AVX512DQ (1u << 17)
#define L7B_AVX512BW (1u << 30)
#define L7B_AVX512VL (1u << 31)
#define L7C_AVX512VBMI (1u << 1)
#define L7C_AVX512VNNI (1u << 11)
#define L7D_AMX_BF16 (1u << 22)
#define L7D_AMX_TILE (1u << 24)
#define L7D_AMX_INT8 (1u << 25)
#define L71A_AVX_VNNI (1u << 4)
#define L71A_AVX512BF16 (1u << 5)
#define XCR0_YMM 0x7ull      /* x87, xmm, ymm */
#define XCR0_ZMM 0xe7ull     /* + opmask, zmm0-15 upper halves, zmm16-31 */
#define XCR0_TILE 0x600e7ull /* + tile config, tile data */

#define L1_AVX2_ERA (L1_FMA | L1_OSXSAVE | L1_F16C)
#define L7B_AVX512 (L7B_AVX2 | L7B_AVX512F | L7B_AVX512DQ | L7B_AVX512BW | L7B_AVX512VL)

struct fake_cpu {
    const char *name;
    uint32_t max_leaf, ecx1, max_sub7, ebx7, ecx7, edx7, eax71;
    uint64_t xcr0;
    int grant; /* the kernel grants the AMX tile data */
    /* what the choice must give: the default, and DRAY_CPU_ISA=avxvnni, avx512vnni, amx */
    int want_default, want_avxvnni, want_avx512vnni, want_amx;
};

static const struct fake_cpu cpus[] = {
    {"AMD Zen 4 (EPYC 9004): AVX-512 VNNI, no AVX-VNNI, no AMX", 16, L1_AVX2_ERA, 1, L7B_AVX512,
     L7C_AVX512VBMI | L7C_AVX512VNNI, 0, L71A_AVX512BF16, XCR0_ZMM, 0, DRAY_CPU_ISA_AVX512VNNI,
     DRAY_CPU_ISA_AVX512VNNI, DRAY_CPU_ISA_AVX512VNNI, DRAY_CPU_ISA_AVX512VNNI},
    {"Intel Sapphire Rapids, AMX granted", 32, L1_AVX2_ERA, 1, L7B_AVX512, L7C_AVX512VBMI | L7C_AVX512VNNI,
     L7D_AMX_BF16 | L7D_AMX_TILE | L7D_AMX_INT8, L71A_AVX_VNNI | L71A_AVX512BF16, XCR0_TILE, 1,
     DRAY_CPU_ISA_AVX512VNNI, DRAY_CPU_ISA_AVXVNNI, DRAY_CPU_ISA_AVX512VNNI, DRAY_CPU_ISA_AMX},
    {"Intel Sapphire Rapids, the kernel refuses the tile data", 32, L1_AVX2_ERA, 1, L7B_AVX512,
     L7C_AVX512VNNI, L7D_AMX_TILE | L7D_AMX_INT8, L71A_AVX_VNNI, XCR0_TILE, 0, DRAY_CPU_ISA_AVX512VNNI,
     DRAY_CPU_ISA_AVXVNNI, DRAY_CPU_ISA_AVX512VNNI, DRAY_CPU_ISA_AVX512VNNI},
    {"Intel Sapphire Rapids, an OS that does not save the tile state", 32, L1_AVX2_ERA, 1, L7B_AVX512,
     L7C_AVX512VNNI, L7D_AMX_TILE | L7D_AMX_INT8, L71A_AVX_VNNI, XCR0_ZMM, 1, DRAY_CPU_ISA_AVX512VNNI,
     DRAY_CPU_ISA_AVXVNNI, DRAY_CPU_ISA_AVX512VNNI, DRAY_CPU_ISA_AVX512VNNI},
    {"Intel Alder Lake: AVX-VNNI, no AVX-512", 32, L1_AVX2_ERA, 1, L7B_AVX2, 0, 0, L71A_AVX_VNNI, XCR0_YMM, 0,
     DRAY_CPU_ISA_AVXVNNI, DRAY_CPU_ISA_AVXVNNI, DRAY_CPU_ISA_AVXVNNI, DRAY_CPU_ISA_AVXVNNI},
    {"Intel Skylake-X: AVX-512 without VNNI", 22, L1_AVX2_ERA, 0, L7B_AVX512, 0, 0, 0, XCR0_ZMM, 0,
     DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2},
    {"Intel Ice Lake under an OS that does not save the zmm state", 27, L1_AVX2_ERA, 0, L7B_AVX512,
     L7C_AVX512VNNI, 0, 0, XCR0_YMM, 0, DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2,
     DRAY_CPU_ISA_AVX2},
    {"AMD Zen 3 (EPYC 7003): AVX2 only", 16, L1_AVX2_ERA, 0, L7B_AVX2, 0, 0, 0, XCR0_YMM, 0,
     DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2},
    {"Intel Haswell: AVX2 only", 13, L1_AVX2_ERA, 0, L7B_AVX2, 0, 0, 0, XCR0_YMM, 0, DRAY_CPU_ISA_AVX2,
     DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2, DRAY_CPU_ISA_AVX2},
    {"Intel Ivy Bridge: AVX and F16C, no AVX2 or FMA", 13, L1_OSXSAVE | L1_F16C, 0, 0, 0, 0, 0, XCR0_YMM, 0,
     DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE},
    {"AVX2 bits under an OS that saves no ymm state (no OSXSAVE)", 13, L1_FMA | L1_F16C, 0, L7B_AVX2, 0, 0, 0,
     XCR0_YMM, 0, DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE,
     DRAY_CPU_ISA_REFERENCE},
    {"an old CPU whose CPUID stops below leaf 7", 5, L1_AVX2_ERA, 0, L7B_AVX512, L7C_AVX512VNNI, 0, 0, XCR0_ZMM,
     0, DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE, DRAY_CPU_ISA_REFERENCE},
};
#define N_CPUS (sizeof(cpus) / sizeof(cpus[0]))

/* ------------------------------------------------------------ the fake provider */

static const struct fake_cpu *cur;
static int xcr0_reads, grant_asks;

static void fake_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    r[0] = r[1] = r[2] = r[3] = 0;
    if (leaf > cur->max_leaf) /* real CPUs answer the highest leaf's data; 0s are as harmless here */
        return;
    if (leaf == 0)
        r[0] = cur->max_leaf;
    else if (leaf == 1)
        r[2] = cur->ecx1;
    else if (leaf == 7 && sub == 0)
        r[0] = cur->max_sub7, r[1] = cur->ebx7, r[2] = cur->ecx7, r[3] = cur->edx7;
    else if (leaf == 7 && sub == 1 && sub <= cur->max_sub7)
        r[0] = cur->eax71;
}

static uint64_t fake_xcr0(void)
{
    xcr0_reads++;
    return cur->xcr0;
}

static int fake_grant(void)
{
    grant_asks++;
    return cur->grant;
}

static const struct dray_cpu_id_provider fake = {fake_cpuid, fake_xcr0, fake_grant};

static uint32_t all_built(void)
{
    return (1u << DRAY_CPU_ISA_COUNT) - 1;
}

/* The set DRAY_CPU_ISA=want gives on cpu c; *warn gets the warning. */
static int choose_on(const struct fake_cpu *c, const char *want, char *warn, size_t n)
{
    cur = c;
    dray_cpu_set_id_provider(&fake);
    int ask_amx = want && !strcmp(want, "amx");
    char err[256] = "";
    int isa = dray_cpu_isa_choose(want, dray_cpu_features(ask_amx), all_built(), warn, n, err, sizeof(err));
    dray_cpu_set_id_provider(NULL);
    if (isa < 0)
        fail_msg("%s: DRAY_CPU_ISA=%s: %s", c->name, want ? want : "", err);
    return isa;
}

/* ------------------------------------------------------------ the table */

static void test_each_cpu_gets_the_best_set_it_has_and_never_one_it_lacks(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CPUS; i++) {
        const struct fake_cpu *c = &cpus[i];
        const char *want[] = {NULL, "avxvnni", "avx512vnni", "amx", "avx2", "reference"};
        int expect[] = {c->want_default, c->want_avxvnni, c->want_avx512vnni, c->want_amx,
                        c->want_default == DRAY_CPU_ISA_REFERENCE ? DRAY_CPU_ISA_REFERENCE : DRAY_CPU_ISA_AVX2,
                        DRAY_CPU_ISA_REFERENCE};
        for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
            char warn[320];
            int isa = choose_on(c, want[w], warn, sizeof(warn));
            if (isa != expect[w])
                fail_msg("%s: DRAY_CPU_ISA=%s gave %s, want %s", c->name, want[w] ? want[w] : "(unset)",
                         dray_cpu_isa_name(isa), dray_cpu_isa_name(expect[w]));
            /* the set chosen is one the CPU runs: every feature it needs is there */
            cur = c;
            dray_cpu_set_id_provider(&fake);
            uint32_t f = dray_cpu_features(isa == DRAY_CPU_ISA_AMX);
            dray_cpu_set_id_provider(NULL);
            assert_true(dray_cpu_isa_runs(isa, f, all_built()));
            /* a warning exactly when the set asked for was not the one given */
            int asked = -1;
            for (int s = 0; want[w] && s < DRAY_CPU_ISA_COUNT; s++)
                if (!strcmp(want[w], dray_cpu_isa_env(s)))
                    asked = s;
            if (asked >= 0 && asked != isa) {
                if (!strstr(warn, "this CPU lacks") || !strstr(warn, dray_cpu_isa_name(isa)))
                    fail_msg("%s: DRAY_CPU_ISA=%s: warning \"%s\"", c->name, want[w], warn);
            } else if (warn[0]) {
                fail_msg("%s: DRAY_CPU_ISA=%s warned \"%s\" although it got that set", c->name,
                         want[w] ? want[w] : "(unset)", warn);
            }
        }
    }
}

/* The warning names the feature that is missing, not just "unsupported". */
static void test_the_warning_names_what_the_cpu_lacks(void **state)
{
    (void)state;
    char warn[320];
    assert_int_equal(choose_on(&cpus[0], "avxvnni", warn, sizeof(warn)), DRAY_CPU_ISA_AVX512VNNI);
    assert_string_equal(warn, "DRAY_CPU_ISA=avxvnni: this CPU lacks AVX-VNNI; using avx512-vnni");
    choose_on(&cpus[0], "amx", warn, sizeof(warn));
    assert_non_null(strstr(warn, "AMX-TILE, AMX-INT8, OS tile state (XCR0)"));
    choose_on(&cpus[2], "amx", warn, sizeof(warn)); /* SPR, tile data refused */
    assert_string_equal(warn, "DRAY_CPU_ISA=amx: this CPU lacks the kernel's tile-data permission; using avx512-vnni");
    choose_on(&cpus[5], "avx512vnni", warn, sizeof(warn)); /* Skylake-X */
    assert_string_equal(warn, "DRAY_CPU_ISA=avx512vnni: this CPU lacks AVX512_VNNI; using avx2+fma");
    choose_on(&cpus[6], "avx512vnni", warn, sizeof(warn)); /* zmm state off */
    assert_string_equal(warn, "DRAY_CPU_ISA=avx512vnni: this CPU lacks OS zmm state (XCR0); using avx2+fma");
    choose_on(&cpus[9], "avx2", warn, sizeof(warn)); /* Ivy Bridge */
    assert_string_equal(warn, "DRAY_CPU_ISA=avx2: this CPU lacks AVX2, FMA; using scalar");
}

static void test_amx_is_opt_in_and_its_permission_asked_only_when_picked(void **state)
{
    (void)state;
    char warn[320];
    grant_asks = 0;
    assert_int_equal(choose_on(&cpus[1], NULL, warn, sizeof(warn)), DRAY_CPU_ISA_AVX512VNNI);
    assert_int_equal(choose_on(&cpus[1], "avx512vnni", warn, sizeof(warn)), DRAY_CPU_ISA_AVX512VNNI);
    assert_int_equal(grant_asks, 0);
    assert_int_equal(choose_on(&cpus[1], "amx", warn, sizeof(warn)), DRAY_CPU_ISA_AMX);
    assert_int_equal(grant_asks, 1);
    /* a CPU without AMX is never asked */
    choose_on(&cpus[0], "amx", warn, sizeof(warn));
    assert_int_equal(grant_asks, 1);
}

static void test_xgetbv_runs_only_where_osxsave_says_it_exists(void **state)
{
    (void)state;
    char warn[320];
    xcr0_reads = 0;
    choose_on(&cpus[10], NULL, warn, sizeof(warn)); /* no OSXSAVE: xgetbv would fault */
    assert_int_equal(xcr0_reads, 0);
    choose_on(&cpus[8], NULL, warn, sizeof(warn));
    assert_int_equal(xcr0_reads, 1);
}

static void test_a_set_this_build_lacks_gives_the_best_built_one(void **state)
{
    (void)state;
    cur = &cpus[0];
    dray_cpu_set_id_provider(&fake);
    uint32_t f = dray_cpu_features(0);
    dray_cpu_set_id_provider(NULL);
    uint32_t no512 = (1u << DRAY_CPU_ISA_REFERENCE) | (1u << DRAY_CPU_ISA_AVX2);
    char warn[320], err[256];
    assert_int_equal(dray_cpu_isa_default(f, no512), DRAY_CPU_ISA_AVX2);
    assert_int_equal(dray_cpu_isa_choose("avx512vnni", f, no512, warn, sizeof(warn), err, sizeof(err)),
                     DRAY_CPU_ISA_AVX2);
    assert_non_null(strstr(warn, "this build has no avx512-vnni kernels"));
}

static void test_names_and_unknown_names(void **state)
{
    (void)state;
    char warn[320], err[256] = "";
    uint32_t all = all_built();
    /* the shown name works as well as the DRAY_CPU_ISA name */
    assert_int_equal(dray_cpu_isa_choose("avx2+fma", ~0u, all, warn, sizeof(warn), err, sizeof(err)),
                     DRAY_CPU_ISA_AVX2);
    assert_int_equal(dray_cpu_isa_choose("avx512-vnni", ~0u, all, warn, sizeof(warn), err, sizeof(err)),
                     DRAY_CPU_ISA_AVX512VNNI);
    assert_int_equal(dray_cpu_isa_choose("", ~0u, all, warn, sizeof(warn), err, sizeof(err)),
                     DRAY_CPU_ISA_AVX512VNNI);
    assert_int_equal(dray_cpu_isa_choose("avx512", ~0u, all, warn, sizeof(warn), err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "DRAY_CPU_ISA=avx512"));
    assert_non_null(strstr(err, "avx512vnni"));
}

/* The real provider agrees with the compiler's own CPU detection, on whatever
 * machine runs this. */
static void test_this_cpu_reads_as_the_compiler_sees_it(void **state)
{
    (void)state;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    uint32_t f = dray_cpu_features(0);
    assert_int_equal(!!(f & DRAY_CPU_BIT(DRAY_CPU_F_AVX2)), !!__builtin_cpu_supports("avx2"));
    assert_int_equal(!!(f & DRAY_CPU_BIT(DRAY_CPU_F_FMA)), !!__builtin_cpu_supports("fma"));
    /* libgcc counts AVX-512 only where the OS saves the zmm state */
    int zmm = !!(f & DRAY_CPU_BIT(DRAY_CPU_F_OS_ZMM));
    assert_int_equal(zmm && (f & DRAY_CPU_BIT(DRAY_CPU_F_AVX512F)), !!__builtin_cpu_supports("avx512f"));
    assert_int_equal(zmm && (f & DRAY_CPU_BIT(DRAY_CPU_F_AVX512VNNI)), !!__builtin_cpu_supports("avx512vnni"));
    printf("# this CPU runs:");
    for (int isa = 0; isa < DRAY_CPU_ISA_COUNT; isa++)
        if (dray_cpu_isa_runs(isa, f | DRAY_CPU_BIT(DRAY_CPU_F_AMX_GRANT), all_built()))
            printf(" %s", dray_cpu_isa_name(isa));
    printf("\n");
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_cpu_gets_the_best_set_it_has_and_never_one_it_lacks),
        cmocka_unit_test(test_the_warning_names_what_the_cpu_lacks),
        cmocka_unit_test(test_amx_is_opt_in_and_its_permission_asked_only_when_picked),
        cmocka_unit_test(test_xgetbv_runs_only_where_osxsave_says_it_exists),
        cmocka_unit_test(test_a_set_this_build_lacks_gives_the_best_built_one),
        cmocka_unit_test(test_names_and_unknown_names),
        cmocka_unit_test(test_this_cpu_reads_as_the_compiler_sees_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
