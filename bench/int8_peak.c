/* See int8_peak.h. Each loop keeps 16 accumulators in flight, more than the
 * dot instruction's latency times its issue rate on current cores, so it runs
 * at the instruction's throughput; the inputs come through volatile loads so
 * the compiler cannot fold the chains away. */
#include "int8_peak.h"

#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define ITERS 200000u
#define N_ACC 16

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static volatile int8_t g_x = 1, g_y = 2;
static volatile int32_t g_sink;

/* Multiply-adds of one call: ITERS x N_ACC instructions of `per` each. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double run_vnni512(void)
{
    __m512i x = _mm512_set1_epi8(g_x), y = _mm512_set1_epi8(g_y), a[N_ACC];
    for (int j = 0; j < N_ACC; j++)
        a[j] = _mm512_setzero_si512();
    for (uint32_t i = 0; i < ITERS; i++)
        for (int j = 0; j < N_ACC; j++)
            a[j] = _mm512_dpbusd_epi32(a[j], x, y);
    for (int j = 1; j < N_ACC; j++)
        a[0] = _mm512_add_epi32(a[0], a[j]);
    g_sink = _mm512_reduce_add_epi32(a[0]);
    return (double)ITERS * N_ACC * 64;
}

__attribute__((target("avx2,avxvnni"))) static double run_avxvnni(void)
{
    __m256i x = _mm256_set1_epi8(g_x), y = _mm256_set1_epi8(g_y), a[N_ACC];
    for (int j = 0; j < N_ACC; j++)
        a[j] = _mm256_setzero_si256();
    for (uint32_t i = 0; i < ITERS; i++)
        for (int j = 0; j < N_ACC; j++)
            a[j] = _mm256_dpbusd_avx_epi32(a[j], x, y);
    for (int j = 1; j < N_ACC; j++)
        a[0] = _mm256_add_epi32(a[0], a[j]);
    g_sink = _mm256_extract_epi32(a[0], 0);
    return (double)ITERS * N_ACC * 32;
}

/* AVX2's int8 dot as dray's grouped kernels run it: maddubs (u8 x s8 pairs
 * into int16) added in int16, widened once per group (not counted here). Eight
 * accumulators (AVX2 has 16 registers: more spill), and x passes an empty asm
 * before every product so none can be hoisted out of the loop or shared, which
 * left the first version of this loop timing its adds and spills. */
__attribute__((target("avx2"))) static double run_avx2(void)
{
    __m256i x = _mm256_set1_epi8(g_x), y0 = _mm256_set1_epi8(g_y), y1 = _mm256_set1_epi8((int8_t)(g_y + 1));
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
#define DOT(acc, y)                                                                                 \
    do {                                                                                            \
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(x, y));                                    \
        __asm__("" : "+x"(x));                                                                      \
    } while (0)
    for (uint32_t i = 0; i < ITERS * 2; i++) {
        DOT(a0, y0); DOT(a1, y1); DOT(a2, y0); DOT(a3, y1);
        DOT(a4, y0); DOT(a5, y1); DOT(a6, y0); DOT(a7, y1);
    }
#undef DOT
    a0 = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(a0, a1), _mm256_add_epi16(a2, a3)),
                          _mm256_add_epi16(_mm256_add_epi16(a4, a5), _mm256_add_epi16(a6, a7)));
    g_sink = _mm256_extract_epi16(a0, 0);
    return (double)ITERS * 2 * 8 * 32;
}

/* CPUID.(7,1):EAX bit 4 (not every compiler's __builtin_cpu_supports knows it);
 * the AVX state it needs is the AVX2 check's. */
static int has_avxvnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1) && __builtin_cpu_supports("avx2");
}

double dray_bench_int8_peak(const char **isa)
{
    double (*fn)(void) = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
        fn = run_vnni512, *isa = "avx512-vnni";
    else if (has_avxvnni())
        fn = run_avxvnni, *isa = "avx-vnni";
    else if (__builtin_cpu_supports("avx2"))
        fn = run_avx2, *isa = "avx2";
    if (!fn) {
        *isa = "none";
        return 0;
    }
    double best = 0;
    for (int rep = 0; rep < 4; rep++) { /* the first pass also wakes the wide units up */
        double t0 = now_s(), macs = fn(), t = now_s() - t0;
        double gops = 2.0 * macs / t / 1e9;
        if (rep > 0 && gops > best)
            best = gops;
    }
    return best;
}
#else
double dray_bench_int8_peak(const char **isa)
{
    *isa = "none";
    return 0;
}
#endif
