/* GGUF: reader (mmap, v2 and v3), typed metadata access, tensor table, and a small
 * writer. Facts: ../shared/reference/gemma3-gguf.md §1. Every length, count,
 * offset and dimension of a file is bounds- and overflow-checked; a malformed
 * file gets DRAY_EFORMAT/DRAY_EINCOMPAT and a reason naming the byte offset and
 * what was expected. Nothing is ever read outside the mapping. */
#ifndef DRAY_CORE_GGUF_H
#define DRAY_CORE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Metadata value types, as stored in the file. */
enum dray_gguf_vtype {
    DRAY_GGUF_UINT8 = 0, DRAY_GGUF_INT8 = 1, DRAY_GGUF_UINT16 = 2, DRAY_GGUF_INT16 = 3,
    DRAY_GGUF_UINT32 = 4, DRAY_GGUF_INT32 = 5, DRAY_GGUF_FLOAT32 = 6, DRAY_GGUF_BOOL = 7,
    DRAY_GGUF_STRING = 8, DRAY_GGUF_ARRAY = 9, DRAY_GGUF_UINT64 = 10, DRAY_GGUF_INT64 = 11,
    DRAY_GGUF_FLOAT64 = 12, DRAY_GGUF_VTYPE_COUNT
};

/* Tensor element types (ggml numbering). Only these are dequantized. */
enum dray_ggml_type {
    DRAY_GGML_F32 = 0, DRAY_GGML_F16 = 1, DRAY_GGML_Q4_0 = 2, DRAY_GGML_Q4_1 = 3,
    DRAY_GGML_Q5_0 = 6, DRAY_GGML_Q5_1 = 7, DRAY_GGML_Q8_0 = 8,
    DRAY_GGML_Q4_K = 12, DRAY_GGML_Q5_K = 13, DRAY_GGML_Q6_K = 14,
    DRAY_GGML_BF16 = 30,
};

/* A string inside the mapped file: NOT NUL-terminated. */
struct dray_str {
    const char *ptr;
    uint64_t len;
};

struct dray_gguf_kv {
    struct dray_str key;
    uint32_t type;      /* enum dray_gguf_vtype */
    uint32_t arr_type;  /* element type when type == ARRAY */
    uint64_t arr_n;     /* element count when type == ARRAY */
    const void *data;   /* the value (scalar) or first element (array) in the mapping */
    const struct dray_str *strs; /* type STRING: &one string; ARRAY of STRING: arr_n strings */
};

struct dray_gguf_tensor {
    char name[64];      /* NUL-terminated (names are < 64 bytes) */
    uint32_t type;      /* enum dray_ggml_type (or another ggml id: then unsupported) */
    uint32_t n_dims;
    uint64_t ne[4];     /* ne[0] innermost; missing dims are 1 */
    uint64_t offset;    /* from the start of the data section */
    uint64_t nbytes;
    const void *data;   /* in the mapping; checked to lie inside the file */
};

struct dray_gguf;

/* Open and validate. On failure *out is NULL, err says why, nothing leaks. */
int dray_gguf_open(const char *path, struct dray_gguf **out, char *err, size_t errlen);
/* Same over a caller-owned buffer that must outlive the handle. name is used in errors. */
int dray_gguf_open_mem(const void *data, size_t size, const char *name, struct dray_gguf **out,
                       char *err, size_t errlen);
void dray_gguf_close(struct dray_gguf *g);

uint32_t dray_gguf_version(const struct dray_gguf *g);
uint64_t dray_gguf_file_size(const struct dray_gguf *g);
const char *dray_gguf_name(const struct dray_gguf *g); /* path or name given at open */

/* Metadata */
uint64_t dray_gguf_n_kv(const struct dray_gguf *g);
const struct dray_gguf_kv *dray_gguf_kv_at(const struct dray_gguf *g, uint64_t i);
const struct dray_gguf_kv *dray_gguf_find(const struct dray_gguf *g, const char *key);
/* Typed getters: DRAY_ENOTFOUND if absent, DRAY_EFORMAT (reason in err) if the stored
 * type cannot represent the request. get_u32/get_i64 accept any integer type and
 * range-check; get_f32 accepts FLOAT32/FLOAT64 and integers. */
int dray_gguf_get_u32(const struct dray_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen);
int dray_gguf_get_i64(const struct dray_gguf *g, const char *key, int64_t *out, char *err, size_t errlen);
int dray_gguf_get_f32(const struct dray_gguf *g, const char *key, float *out, char *err, size_t errlen);
int dray_gguf_get_bool(const struct dray_gguf *g, const char *key, bool *out, char *err, size_t errlen);
int dray_gguf_get_str(const struct dray_gguf *g, const char *key, struct dray_str *out, char *err, size_t errlen);
/* Array of a given element type: *data points at the first element, *n its count.
 * For ARRAY of STRING use kv->strs. */
int dray_gguf_get_arr(const struct dray_gguf *g, const char *key, uint32_t elem_type,
                      const void **data, uint64_t *n, char *err, size_t errlen);
bool dray_str_eq(struct dray_str s, const char *c);

/* Tensors */
uint64_t dray_gguf_n_tensors(const struct dray_gguf *g);
const struct dray_gguf_tensor *dray_gguf_tensor_at(const struct dray_gguf *g, uint64_t i);
const struct dray_gguf_tensor *dray_gguf_find_tensor(const struct dray_gguf *g, const char *name);
uint64_t dray_gguf_tensor_nelems(const struct dray_gguf_tensor *t);

/* ggml types: block size (elements), block bytes, name ("Q4_K"); 0/NULL if unknown. */
uint32_t dray_ggml_block_elems(uint32_t type);
uint32_t dray_ggml_block_bytes(uint32_t type);
const char *dray_ggml_type_name(uint32_t type);
bool dray_ggml_type_supported(uint32_t type);

/* Dequantize n elements (a multiple of the block size) of type from src to f32. */
int dray_dequant_row(uint32_t type, const void *src, float *dst, uint64_t n);
/* Dequantize row r of a 2-D tensor (ne[0] elements) into dst. */
int dray_gguf_tensor_row_f32(const struct dray_gguf_tensor *t, uint64_t r, float *dst);

/* float <-> half helpers (IEEE binary16, round to nearest even) */
float dray_f16_to_f32(uint16_t h);
uint16_t dray_f32_to_f16(float f);

/* dray's int8 layout: per-output-channel (row) symmetric int8.
 * scale[r] = max|w[r][:]| / 127, q = round-nearest-even(w/scale) in [-127,127],
 * a zero row gets scale 0. w is [rows][cols] f32. */
void dray_quantize_rows_i8(const float *w, uint64_t rows, uint64_t cols, int8_t *q, float *scale);

/* ---------------------------------------------------------------- writer */
/* Builds a GGUF (v3) in memory and writes it. Tests write tiny models with it;
 * `dray quantize` uses it. Every add copies its inputs. */
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
