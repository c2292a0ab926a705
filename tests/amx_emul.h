/* A software model of the AMX tile instructions the AMX matmul kernel uses,
 * written from the Intel SDM's description (palette 1: 8 tiles of at most 16
 * rows x 64 bytes), so tests/test_amx_emul.c can run kernels/cpu/amx_matmul.c
 * on a CPU without AMX. Force-included (-include) before that file, which is
 * then built without -mamx-tile, so these macros stand in for the intrinsics.
 * One tile state per thread, as in hardware. */
#ifndef DRAY_AMX_EMUL_H
#define DRAY_AMX_EMUL_H

#include <immintrin.h> /* first: it may define the real names, replaced below */
#include <stddef.h>
#include <stdint.h>

void dray_emul_tile_loadconfig(const void *cfg);
void dray_emul_tile_release(void);
void dray_emul_tile_zero(int t);
void dray_emul_tile_loadd(int t, const void *base, size_t stride);
void dray_emul_tile_stored(int t, void *base, size_t stride);
/* dst[m][n] += sum over the 4-byte groups k of a (s8) x b (u8), int32 wrapping */
void dray_emul_tile_dpbsud(int dst, int a, int b);

#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbsud
#define _tile_loadconfig(p) dray_emul_tile_loadconfig(p)
#define _tile_release() dray_emul_tile_release()
#define _tile_zero(t) dray_emul_tile_zero(t)
#define _tile_loadd(t, base, stride) dray_emul_tile_loadd(t, base, (size_t)(stride))
#define _tile_stored(t, base, stride) dray_emul_tile_stored(t, base, (size_t)(stride))
#define _tile_dpbsud(d, a, b) dray_emul_tile_dpbsud(d, a, b)

#endif
