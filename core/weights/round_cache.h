/* Rounded-weights cache: the 4-bit codes and scales the least-squares rounding
 * (quant.c) picks for a tensor that is wider than 4 bits in the file, stored once
 * per model file so later starts read them instead of rounding again. Gemma 3
 * 270M's rescored head is a 4-bit copy of its Q8_0 token_embd: 5.2M groups,
 * whose rounding was 71% of a start's CPU time.
 *
 * The rows are stored as quant.c returns them (codes packed two per byte, i low
 * and i+16 high, then d and m per group in f32), before any device layout, so
 * every plugin reads the same file. Key: the XXH3-128 of the tensor's bytes in
 * the file (so the same tensor in another file shares it; 20-40 ms for Gemma's
 * 178 MB table), its shape and type, the format (q4g: f32 d and m; q4gh: fitted
 * to f16 d and m) and DRAY_ROUND_VERSION. File:
 *     <cache dir>/round-<hash>-<tensor name>-<q4g|q4gh>-v<version>.bin
 * little-endian: "DRAYRND1", u32 version, u32 dtype, u8 tensor_hash[16],
 * u32 ggml type, u32 0, u64 rows, u64 k, u64 XXH3_64(codes), u64 XXH3_64(scales),
 * codes [rows][k/2], scales f32 [rows][k/16]. A file that does not match is
 * reported and written again; writes go to a temporary file renamed into place. */
#ifndef DRAY_CORE_ROUND_CACHE_H
#define DRAY_CORE_ROUND_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bump whenever quant.c's 4-bit rounding picks other codes or scales. */
#define DRAY_ROUND_VERSION 1u

struct dray_gguf_tensor;
struct dray_round_cache;

/* The cache of the 2-D tensor t (rows ne[1] x k ne[0], k a multiple of 32)
 * rounded to dtype (DRAY_Q4G32 or DRAY_Q4G32H), rows in the file's order; NULL
 * when the cache is off or cannot be had. *hit: every row is there (read them
 * with get), else they are to be put. */
struct dray_round_cache *dray_round_cache_open(const struct dray_gguf_tensor *t, uint32_t dtype, bool *hit);
/* A hit: rows [row0, row0 + n) into q (n*k/2 bytes) and sc (n*k/16 floats). */
void dray_round_cache_get(const struct dray_round_cache *c, uint64_t row0, uint64_t n, uint8_t *q,
                          float *sc);
/* A miss: rows [row0, row0 + n), in order from row 0. A write that fails is
 * reported once and the cache given up; the load goes on. */
void dray_round_cache_put(struct dray_round_cache *c, uint64_t row0, uint64_t n, const uint8_t *q,
                          const float *sc);
/* Commit a miss whose every row was put (else drop it), and free c (NULL ok). */
void dray_round_cache_close(struct dray_round_cache *c);

#endif
