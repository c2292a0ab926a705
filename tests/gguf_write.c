/* GGUF writer: collects metadata and tensors (copying every input), then lays the
 * file out as the reader expects (docs/reference/gemma3-gguf.md §1.2): header,
 * key/values, tensor infos, zero padding to the alignment, tensor data with each
 * tensor starting at a multiple of the alignment. Little-endian host assumed
 * (gguf.c refuses to build otherwise). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "gguf_write.h"

#define DEFAULT_ALIGNMENT 32u

struct wkv {
    char *key;
    uint32_t type;   /* enum dray_gguf_vtype */
    uint8_t *val;    /* value bytes as written after the type field */
    size_t val_len;
};

struct wtensor {
    char name[64];
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint8_t *data;   /* nbytes, owned */
    uint64_t nbytes;
};

struct dray_gguf_writer {
    uint32_t version;
    uint32_t alignment;
    struct wkv *kv;
    size_t n_kv, cap_kv;
    struct wtensor *t;
    size_t n_t, cap_t;
};

static const uint8_t scalar_size[DRAY_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static size_t vsize(uint32_t t)
{
    return t < DRAY_GGUF_VTYPE_COUNT ? scalar_size[t] : 0;
}

struct dray_gguf_writer *dray_gguf_writer_new(void)
{
    struct dray_gguf_writer *w = calloc(1, sizeof(*w));
    if (w) {
        w->version = 3;
        w->alignment = DEFAULT_ALIGNMENT;
    }
    return w;
}

void dray_gguf_writer_free(struct dray_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].data);
    free(w->kv);
    free(w->t);
    free(w);
}

int dray_gguf_writer_set_version(struct dray_gguf_writer *w, uint32_t version)
{
    if (version != 2 && version != 3)
        return DRAY_EINVAL;
    w->version = version;
    return 0;
}

/* ------------------------------------------------------------ metadata */

static struct wkv *find_kv(struct dray_gguf_writer *w, const char *key)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key))
            return &w->kv[i];
    return NULL;
}

static bool pow2(uint32_t a)
{
    return a && !(a & (a - 1));
}

/* Takes ownership of val (freed on failure too). */
static int push_kv(struct dray_gguf_writer *w, const char *key, uint32_t type, uint8_t *val,
                   size_t val_len)
{
    int rc = DRAY_EINVAL;
    if (!key || !*key || find_kv(w, key))
        goto out_free;
    rc = DRAY_ENOMEM;
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        struct wkv *kv = realloc(w->kv, cap * sizeof(*kv));
        if (!kv)
            goto out_free;
        w->kv = kv;
        w->cap_kv = cap;
    }
    struct wkv *kv = &w->kv[w->n_kv];
    if (!(kv->key = strdup(key)))
        goto out_free;
    kv->type = type;
    kv->val = val;
    kv->val_len = val_len;
    w->n_kv++;
    return 0;
out_free:
    free(val);
    return rc;
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    if (b && n)
        memcpy(b, p, n);
    return b;
}

int dray_gguf_add_scalar(struct dray_gguf_writer *w, const char *key, uint32_t type, const void *v)
{
    size_t n = vsize(type);
    uint8_t *val;
    if (!n || !v || (type == DRAY_GGUF_BOOL && *(const uint8_t *)v > 1))
        return DRAY_EINVAL; /* STRING/ARRAY have their own adders */
    bool is_align = key && !strcmp(key, "general.alignment");
    uint32_t a = 0;
    if (is_align) { /* the reader requires UINT32, a power of two */
        if (type != DRAY_GGUF_UINT32)
            return DRAY_EINVAL;
        memcpy(&a, v, 4);
        if (!pow2(a))
            return DRAY_EINVAL;
    }
    if (!(val = dup_bytes(v, n)))
        return DRAY_ENOMEM;
    int rc = push_kv(w, key, type, val, n);
    if (!rc && is_align)
        w->alignment = a;
    return rc;
}

int dray_gguf_writer_set_alignment(struct dray_gguf_writer *w, uint32_t alignment)
{
    struct wkv *kv = find_kv(w, "general.alignment");
    if (!pow2(alignment))
        return DRAY_EINVAL;
    if (!kv)
        return dray_gguf_add_u32(w, "general.alignment", alignment);
    memcpy(kv->val, &alignment, 4);
    w->alignment = alignment;
    return 0;
}

int dray_gguf_add_u32(struct dray_gguf_writer *w, const char *key, uint32_t v)
{
    return dray_gguf_add_scalar(w, key, DRAY_GGUF_UINT32, &v);
}

int dray_gguf_add_i32(struct dray_gguf_writer *w, const char *key, int32_t v)
{
    return dray_gguf_add_scalar(w, key, DRAY_GGUF_INT32, &v);
}

int dray_gguf_add_u64(struct dray_gguf_writer *w, const char *key, uint64_t v)
{
    return dray_gguf_add_scalar(w, key, DRAY_GGUF_UINT64, &v);
}

int dray_gguf_add_f32(struct dray_gguf_writer *w, const char *key, float v)
{
    return dray_gguf_add_scalar(w, key, DRAY_GGUF_FLOAT32, &v);
}

int dray_gguf_add_bool(struct dray_gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return dray_gguf_add_scalar(w, key, DRAY_GGUF_BOOL, &b);
}

/* A gguf string (uint64 length + bytes) at p; returns bytes written. */
static size_t put_str(uint8_t *p, const char *s, uint64_t len)
{
    memcpy(p, &len, 8);
    memcpy(p + 8, s, len);
    return 8 + len;
}

int dray_gguf_add_str(struct dray_gguf_writer *w, const char *key, const char *v)
{
    size_t len;
    uint8_t *val;
    if (!v)
        return DRAY_EINVAL;
    len = strlen(v);
    if (!(val = malloc(8 + len)))
        return DRAY_ENOMEM;
    put_str(val, v, len);
    return push_kv(w, key, DRAY_GGUF_STRING, val, 8 + len);
}

/* Array value bytes: uint32 element type, uint64 count, then the elements. */
int dray_gguf_add_arr(struct dray_gguf_writer *w, const char *key, uint32_t elem_type,
                      const void *data, uint64_t n)
{
    size_t esz = vsize(elem_type), bytes, total;
    uint8_t *val;
    if (!esz || (n && !data))
        return DRAY_EINVAL;
    if (__builtin_mul_overflow(n, esz, &bytes) || __builtin_add_overflow(bytes, 12, &total))
        return DRAY_ERANGE;
    if (elem_type == DRAY_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return DRAY_EINVAL;
    if (!(val = malloc(total)))
        return DRAY_ENOMEM;
    memcpy(val, &elem_type, 4);
    memcpy(val + 4, &n, 8);
    if (bytes)
        memcpy(val + 12, data, bytes);
    return push_kv(w, key, DRAY_GGUF_ARRAY, val, total);
}

int dray_gguf_add_arr_str(struct dray_gguf_writer *w, const char *key, const char *const *strs,
                          uint64_t n)
{
    size_t total = 12, off = 12;
    uint32_t et = DRAY_GGUF_STRING;
    uint8_t *val;
    if (n && !strs)
        return DRAY_EINVAL;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i])
            return DRAY_EINVAL;
        if (__builtin_add_overflow(total, 8 + strlen(strs[i]), &total))
            return DRAY_ERANGE;
    }
    if (!(val = malloc(total)))
        return DRAY_ENOMEM;
    memcpy(val, &et, 4);
    memcpy(val + 4, &n, 8);
    for (uint64_t i = 0; i < n; i++)
        off += put_str(val + off, strs[i], strlen(strs[i]));
    return push_kv(w, key, DRAY_GGUF_ARRAY, val, total);
}

/* ------------------------------------------------------------ tensors */

static int tensor_bytes(uint32_t type, uint32_t n_dims, const uint64_t *ne, uint64_t *nbytes)
{
    uint32_t be = dray_ggml_block_elems(type);
    uint64_t n, elems = 1;
    if (!be || n_dims > 4 || (n_dims && !ne))
        return DRAY_EINVAL;
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] > INT64_MAX || __builtin_mul_overflow(elems, ne[d], &elems) || elems > INT64_MAX)
            return DRAY_ERANGE;
    uint64_t ne0 = n_dims ? ne[0] : 1;
    if (ne0 % be)
        return DRAY_EINVAL;
    n = ne0 / be * dray_ggml_block_bytes(type);
    for (uint32_t d = 1; d < n_dims; d++)
        if (__builtin_mul_overflow(n, ne[d], &n))
            return DRAY_ERANGE;
    *nbytes = n;
    return 0;
}

int dray_gguf_add_tensor(struct dray_gguf_writer *w, const char *name, uint32_t type,
                         uint32_t n_dims, const uint64_t *ne, const void *data)
{
    uint64_t nbytes;
    size_t len = name ? strlen(name) : 0;
    int rc = tensor_bytes(type, n_dims, ne, &nbytes);
    if (rc)
        return rc;
    if (len == 0 || len >= 64 || (nbytes && !data))
        return DRAY_EINVAL;
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return DRAY_EINVAL;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 16;
        struct wtensor *t = realloc(w->t, cap * sizeof(*t));
        if (!t)
            return DRAY_ENOMEM;
        w->t = t;
        w->cap_t = cap;
    }
    struct wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof(*t));
    if (!(t->data = dup_bytes(data, nbytes)))
        return DRAY_ENOMEM;
    memcpy(t->name, name, len + 1);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    w->n_t++;
    return 0;
}

/* ------------------------------------------------------------ serialize */

static uint64_t pad_to(uint64_t x, uint32_t a)
{
    return (a - x % a) % a;
}

/* Total file size; *data_start = where the data section begins. */
static int layout(const struct dray_gguf_writer *w, size_t *total, size_t *data_start)
{
    size_t n = 24, sz;
    for (size_t i = 0; i < w->n_kv; i++)
        if (__builtin_add_overflow(n, 8 + strlen(w->kv[i].key) + 4 + w->kv[i].val_len, &n))
            return DRAY_ERANGE;
    for (size_t i = 0; i < w->n_t; i++)
        n += 8 + strlen(w->t[i].name) + 4 + 8 * (size_t)w->t[i].n_dims + 4 + 8;
    n += pad_to(n, w->alignment);
    *data_start = n;
    for (size_t i = 0; i < w->n_t; i++)
        if (__builtin_add_overflow(w->t[i].nbytes, pad_to(w->t[i].nbytes, w->alignment), &sz) ||
            __builtin_add_overflow(n, sz, &n))
            return DRAY_ERANGE;
    *total = n;
    return 0;
}

static size_t put(uint8_t *p, const void *v, size_t n)
{
    memcpy(p, v, n);
    return n;
}

static void fill(const struct dray_gguf_writer *w, uint8_t *b, size_t data_start)
{
    uint64_t n_t = w->n_t, n_kv = w->n_kv, data_off = 0;
    size_t o = put(b, "GGUF", 4);
    o += put(b + o, &w->version, 4);
    o += put(b + o, &n_t, 8);
    o += put(b + o, &n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        o += put_str(b + o, w->kv[i].key, strlen(w->kv[i].key));
        o += put(b + o, &w->kv[i].type, 4);
        o += put(b + o, w->kv[i].val, w->kv[i].val_len);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        o += put_str(b + o, t->name, strlen(t->name));
        o += put(b + o, &t->n_dims, 4);
        o += put(b + o, t->ne, 8 * (size_t)t->n_dims);
        o += put(b + o, &t->type, 4);
        o += put(b + o, &data_off, 8);
        memcpy(b + data_start + data_off, t->data, t->nbytes);
        data_off += t->nbytes + pad_to(t->nbytes, w->alignment);
    }
}

int dray_gguf_writer_to_mem(struct dray_gguf_writer *w, void **out, size_t *size)
{
    size_t total, data_start;
    int rc = layout(w, &total, &data_start);
    *out = NULL;
    if (rc)
        return rc;
    uint8_t *b = calloc(1, total); /* zeroed: the padding is 0x00 */
    if (!b)
        return DRAY_ENOMEM;
    fill(w, b, data_start);
    *out = b;
    *size = total;
    return 0;
}

int dray_gguf_writer_write(struct dray_gguf_writer *w, const char *path, char *err, size_t errlen)
{
    void *buf;
    size_t size;
    FILE *f;
    int rc = dray_gguf_writer_to_mem(w, &buf, &size);
    if (rc)
        return dray_fail(err, errlen, rc, "%s: cannot lay out the GGUF: %s", path,
                         rc == DRAY_ENOMEM ? "out of memory" : "too large");
    if (!(f = fopen(path, "wb"))) {
        rc = dray_fail(err, errlen, DRAY_EIO, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    if (fwrite(buf, 1, size, f) != size)
        rc = dray_fail(err, errlen, DRAY_EIO, "%s: write failed: %s", path, strerror(errno));
    if (fclose(f) && !rc)
        rc = dray_fail(err, errlen, DRAY_EIO, "%s: close failed: %s", path, strerror(errno));
out:
    free(buf);
    return rc;
}
