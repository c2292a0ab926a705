/*
 * dray/gguf.h — the GGUF reader (mmap, v2 and v3): typed metadata access, the
 * tensor table, the ggml type table and row dequantization to f32. Public so that
 * tools which inspect a model file (dray info, dray tokenize) need no engine.
 * Facts: docs/reference/gemma3-gguf.md §1. Every length, count, offset and
 * dimension of a file is bounds- and overflow-checked; a malformed file gets
 * DRAY_EFORMAT/DRAY_EINCOMPAT and a reason naming the byte offset and what was
 * expected. Nothing is ever read outside the mapping.
 */
#ifndef DRAY_GGUF_H
#define DRAY_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
    const struct dray_gguf *file; /* the file it lies in (for dray_gguf_release) */
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
/* The whole file's bytes (dray_gguf_file_size of them), e.g. to hash its content. */
const void *dray_gguf_bytes(const struct dray_gguf *g);
const char *dray_gguf_name(const struct dray_gguf *g); /* path or name given at open */
/* Done with bytes [p, p + n) for now: their pages leave the process's resident
 * set and are read again (from the page cache) if touched. Only a hint: a range
 * outside the mapped file (a copy, dray_gguf_open_mem's buffer) is left alone. */
void dray_gguf_release(const struct dray_gguf *g, const void *p, uint64_t n);

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
/* True for the types that store 4-bit codes with a scale (and min) per group of
 * 32 (Q4_0, Q4_1, Q4_K): the ones dray's 4-bit weights (W4A8) hold without loss. */
bool dray_ggml_is_4bit(uint32_t type);
/* True for Q5_0 and Q5_1: 5-bit codes with an f16 scale (and min) per group of
 * 32, which dray's 5-bit weights (Q5G32, under W4A8) hold without loss. */
bool dray_ggml_is_5bit(uint32_t type);
bool dray_ggml_type_supported(uint32_t type);

/* Dequantize row r of a 2-D tensor (ne[0] elements) into dst. */
int dray_gguf_tensor_row_f32(const struct dray_gguf_tensor *t, uint64_t r, float *dst);

#ifdef __cplusplus
}
#endif
#endif /* DRAY_GGUF_H */
