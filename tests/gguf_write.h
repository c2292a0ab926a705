/* The GGUF writer of the tests' helper library (tests/gguf_write.c). */
#ifndef DRAY_TESTS_GGUF_WRITE_H
#define DRAY_TESTS_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/gguf.h"

/* Builds a GGUF (v3, or v2 on request) in memory and writes it. Only the tests
 * use it (tiny models, hostile files), so it lives in the tests' helper library,
 * not in libdray. Every add copies its inputs. */
struct dray_gguf_writer;
struct dray_gguf_writer *dray_gguf_writer_new(void);
void dray_gguf_writer_free(struct dray_gguf_writer *w);
int dray_gguf_writer_set_version(struct dray_gguf_writer *w, uint32_t version); /* 2 or 3 */
int dray_gguf_writer_set_alignment(struct dray_gguf_writer *w, uint32_t alignment);
int dray_gguf_add_u32(struct dray_gguf_writer *w, const char *key, uint32_t v);
int dray_gguf_add_i32(struct dray_gguf_writer *w, const char *key, int32_t v);
int dray_gguf_add_u64(struct dray_gguf_writer *w, const char *key, uint64_t v);
int dray_gguf_add_f32(struct dray_gguf_writer *w, const char *key, float v);
int dray_gguf_add_bool(struct dray_gguf_writer *w, const char *key, bool v);
int dray_gguf_add_str(struct dray_gguf_writer *w, const char *key, const char *v);
/* Any scalar type from enum dray_gguf_vtype, value bytes as stored (little-endian). */
int dray_gguf_add_scalar(struct dray_gguf_writer *w, const char *key, uint32_t type, const void *v);
/* Array of scalars (elem_type not STRING/ARRAY): n elements, packed. */
int dray_gguf_add_arr(struct dray_gguf_writer *w, const char *key, uint32_t elem_type,
                      const void *data, uint64_t n);
int dray_gguf_add_arr_str(struct dray_gguf_writer *w, const char *key, const char *const *strs,
                          uint64_t n);
/* Tensor: data holds exactly the bytes its type and dims imply. */
int dray_gguf_add_tensor(struct dray_gguf_writer *w, const char *name, uint32_t type,
                         uint32_t n_dims, const uint64_t *ne, const void *data);
/* Serialize: to a file, or to a malloc'd buffer (*out, *size; caller frees). */
int dray_gguf_writer_write(struct dray_gguf_writer *w, const char *path, char *err, size_t errlen);
int dray_gguf_writer_to_mem(struct dray_gguf_writer *w, void **out, size_t *size);

#endif
