/* libFuzzer target: the GGUF reader (core/gguf/gguf.c) on arbitrary bytes, then every
 * accessor on what it accepted. Invariants checked beyond "no crash, no leak":
 *  - each tensor of a known type records nbytes = elements / block * block bytes,
 *    recomputed here in 128 bits, so a wrapped 64-bit size is a finding;
 *  - each tensor's data lies inside the buffer;
 *  - dequantizing its first row stays inside the data (ASan checks the reads).
 * Build and run: ci/fuzz.sh gguf SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static void check_tensor(const struct dray_gguf_tensor *t, const uint8_t *base, size_t size)
{
    uint32_t be = dray_ggml_block_elems(t->type), bb = dray_ggml_block_bytes(t->type);
    if (!be)
        return; /* unknown type: the reader records no size and it is refused when used */
    unsigned __int128 bytes = (unsigned __int128)(t->ne[0] / be) * bb;
    for (int d = 1; d < 4; d++)
        bytes *= t->ne[d];
    if (bytes != t->nbytes) {
        fprintf(stderr, "tensor '%s': nbytes %llu, expected %llu x %u / %u x ...\n", t->name,
                (unsigned long long)t->nbytes, (unsigned long long)t->ne[0], bb, be);
        abort();
    }
    const uint8_t *d = t->data;
    if (d < base || (size_t)(d - base) > size || t->nbytes > size - (size_t)(d - base))
        abort();
    /* one row of a small tensor: the reader promised rows * stride bytes exist */
    if (dray_ggml_type_supported(t->type) && t->ne[0] && t->ne[0] <= 4096 && t->nbytes) {
        float row[4096];
        if (dray_gguf_tensor_row_f32(t, 0, row))
            abort();
    }
}

static void touch_kv(const struct dray_gguf *g, const struct dray_gguf_kv *kv)
{
    char key[256], err[256];
    uint32_t u;
    int64_t i;
    float f;
    bool b;
    struct dray_str s;
    const void *data;
    uint64_t n;
    snprintf(key, sizeof(key), "%.*s", (int)(kv->key.len < 255 ? kv->key.len : 255), kv->key.ptr);
    if (dray_gguf_find(g, key) == NULL && kv->key.len < 255 && !memchr(kv->key.ptr, 0, kv->key.len))
        abort(); /* every key must be found by its own name */
    dray_gguf_get_u32(g, key, &u, err, sizeof(err));
    dray_gguf_get_i64(g, key, &i, err, sizeof(err));
    dray_gguf_get_f32(g, key, &f, err, sizeof(err));
    dray_gguf_get_bool(g, key, &b, err, sizeof(err));
    if (!dray_gguf_get_str(g, key, &s, err, sizeof(err)) && s.len)
        (void)*(volatile const char *)(s.ptr + s.len - 1);
    if (kv->type == DRAY_GGUF_ARRAY &&
        !dray_gguf_get_arr(g, key, kv->arr_type, &data, &n, err, sizeof(err)) &&
        kv->arr_type == DRAY_GGUF_STRING)
        for (uint64_t k = 0; k < n; k++) {
            const struct dray_str *e = &((const struct dray_str *)data)[k];
            if (e->len)
                (void)*(volatile const char *)(e->ptr + e->len - 1);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dray_gguf *g = NULL;
    char err[512];
    /* an exact-size heap copy, so ASan sees a read one byte past the end */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    if (dray_gguf_open_mem(copy, size, "fuzz.gguf", &g, err, sizeof(err)) == 0) {
        for (uint64_t k = 0; k < dray_gguf_n_kv(g); k++)
            touch_kv(g, dray_gguf_kv_at(g, k));
        for (uint64_t k = 0; k < dray_gguf_n_tensors(g); k++) {
            const struct dray_gguf_tensor *t = dray_gguf_tensor_at(g, k);
            if (dray_gguf_find_tensor(g, t->name) != t)
                abort();
            check_tensor(t, copy, size);
        }
        dray_gguf_close(g);
    } else if (!err[0]) {
        abort(); /* a refusal always says why */
    }
    free(copy);
    return 0;
}
