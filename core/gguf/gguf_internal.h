/* What the GGUF reader's files share (gguf.c: mapping, validation, the tables and
 * the name index; gguf_get.c: accessors and typed getters): the reader's state.
 * The gguf room only. */
#ifndef DRAY_CORE_GGUF_INTERNAL_H
#define DRAY_CORE_GGUF_INTERNAL_H

#include <stdint.h>

#include "gguf.h"

/* Open-addressing hash index over names: slot holds item index + 1, 0 = empty. */
struct name_index {
    uint64_t *slot;
    uint64_t mask; /* capacity - 1; capacity is a power of two >= 2 * items */
};

struct dray_gguf {
    const uint8_t *base; /* file bytes */
    uint64_t size;
    void *map; /* mmap'd region (dray_gguf_open) or NULL (open_mem) */
    char *name;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start; /* file offset of the tensor data section */
    uint64_t n_kv;
    struct dray_gguf_kv *kv;
    struct dray_str *kv_str; /* [n_kv]: the value of each STRING kv */
    uint64_t n_tensors;
    struct dray_gguf_tensor *tensors;
    struct name_index kv_index;
    struct name_index tensor_index;
};

/* A value type's name ("UINT32"), "invalid" out of range. */
const char *gguf_vtype_name(uint32_t t);
/* Bytes of a fixed-size value type; 0 for STRING/ARRAY/invalid. */
uint32_t gguf_vtype_size(uint32_t t);

#endif
