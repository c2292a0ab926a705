/*
 * DRAY_HOST_CLONES: host loops over a whole vocabulary (the max, the greedy
 * pick, the rescored head's candidates) compiled for AVX-512 and AVX2 as well
 * and picked when the program loads (ifunc, by the CPU's features: x86-64-v4 is
 * AVX-512 F/BW/DQ/VL, v3 AVX2), so the compiler's vectorizing of them runs 16 or
 * 8 lanes wide where the CPU has them. Only for loops whose every operation is
 * exact or rounded elementwise with nothing to fuse into an FMA: every clone
 * computes the same. On static functions only (clang resolves a clone set
 * within its own file).
 */
#ifndef DRAY_CORE_HOST_CLONES_H
#define DRAY_CORE_HOST_CLONES_H

#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define DRAY_HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DRAY_HOST_CLONES
#endif

#endif
