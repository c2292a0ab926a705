/* GGUF reader: maps a file (or takes a caller's buffer), validates every field and
 * builds the metadata and tensor tables. Layout facts: docs/reference/gemma3-gguf.md §1.
 *
 * After a successful open nothing is read outside [base, base + size):
 *  - every length, count and offset is checked against the bytes left before use,
 *    multiplications and additions are overflow-checked;
 *  - each tensor's data range [data_start + offset, + nbytes) lies inside the file.
 * Pointers handed out (kv->data, dray_str.ptr, tensor->data) point into the mapping
 * and may be unaligned: read multi-byte values through memcpy.
 *
 * kv->data points at the value as stored: a scalar's bytes; for STRING the
 * uint64 length prefix; for ARRAY the first element (for strings: its length prefix).
 * STRING values and ARRAY-of-STRING elements are indexed at open as (ptr, len) in
 * kv->strs, so a 262144-entry vocabulary costs one pass, not one per lookup. */
#include "gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host (GGUF files are little-endian)"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_NAME 64u     /* tensor names are < 64 bytes (ggml GGML_MAX_NAME) */
#define GGUF_MAX_DIMS 4u
#define GGUF_HEADER_BYTES 24u /* magic 4 + version 4 + tensor count 8 + kv count 8 */
/* Smallest possible records, used to reject counts that cannot fit in the file:
 * kv = key length 8 + key >= 1 byte + type 4 + value >= 1 byte;
 * tensor info = name length 8 + name >= 1 + n_dims 4 + type 4 + offset 8. */
#define GGUF_MIN_KV_BYTES 14u
#define GGUF_MIN_TENSOR_BYTES 25u

/* ------------------------------------------------------------ byte cursor */

/* Reads little-endian fields from the file; every read checks the bytes left. */
struct cursor {
    const uint8_t *p;
    uint64_t size;
    uint64_t off;
    const char *name; /* file name for errors */
    char *err;
    size_t errlen;
};

static int need(struct cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->off)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": truncated: expected %s (%" PRIu64
                         " bytes), only %" PRIu64 " bytes left in the file",
                         c->name, c->off, what, n, c->size - c->off);
    return 0;
}

/* n bytes at the cursor into v (little-endian scalars: the host is too). */
static int rd_bytes(struct cursor *c, void *v, size_t n, const char *what)
{
    int rc = need(c, n, what);
    if (rc)
        return rc;
    memcpy(v, c->p + c->off, n);
    c->off += n;
    return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v, const char *what)
{
    return rd_bytes(c, v, 4, what);
}

static int rd_u64(struct cursor *c, uint64_t *v, const char *what)
{
    return rd_bytes(c, v, 8, what);
}

/* A gguf string: uint64 length, then that many bytes (no NUL). */
static int rd_str(struct cursor *c, struct dray_str *s, const char *what)
{
    uint64_t at = c->off, len;
    int rc = rd_u64(c, &len, what);
    if (rc)
        return rc;
    if (len > c->size - c->off)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": %s has length %" PRIu64
                         ", past the end of the file (%" PRIu64 " bytes left)",
                         c->name, at, what, len, c->size - c->off);
    s->ptr = (const char *)c->p + c->off;
    s->len = len;
    c->off += len;
    return 0;
}

/* ------------------------------------------------------------ name index */

static uint64_t hash_bytes(const char *s, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int index_init(struct name_index *ix, uint64_t items)
{
    uint64_t cap = 16;
    while (cap < 2 * items) /* items <= file size / 14, so this cannot overflow */
        cap *= 2;
    ix->slot = calloc(cap, sizeof(*ix->slot));
    ix->mask = cap - 1;
    return ix->slot ? 0 : DRAY_ENOMEM;
}

typedef struct dray_str (*key_fn)(const struct dray_gguf *g, uint64_t i);

static struct dray_str kv_key(const struct dray_gguf *g, uint64_t i)
{
    return g->kv[i].key;
}

static struct dray_str tensor_key(const struct dray_gguf *g, uint64_t i)
{
    struct dray_str s = {g->tensors[i].name, strlen(g->tensors[i].name)};
    return s;
}

static bool str_eq_n(struct dray_str a, const char *b, uint64_t n)
{
    return a.len == n && memcmp(a.ptr, b, n) == 0;
}

/* Slot of name: holds its index + 1 if present, else 0 (where it would go). */
static uint64_t *index_slot(const struct dray_gguf *g, const struct name_index *ix, key_fn key,
                            const char *name, uint64_t len)
{
    uint64_t h = hash_bytes(name, len) & ix->mask;
    for (;; h = (h + 1) & ix->mask) {
        uint64_t *s = &ix->slot[h];
        if (!*s || str_eq_n(key(g, *s - 1), name, len))
            return s;
    }
}

/* ------------------------------------------------------------ metadata */

const char *gguf_vtype_name(uint32_t t)
{
    static const char *const names[DRAY_GGUF_VTYPE_COUNT] = {
        "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
        "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
    };
    return t < DRAY_GGUF_VTYPE_COUNT ? names[t] : "invalid";
}

/* Bytes of a fixed-size value type; 0 for STRING/ARRAY/invalid. */
uint32_t gguf_vtype_size(uint32_t t)
{
    static const uint8_t sz[DRAY_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < DRAY_GGUF_VTYPE_COUNT ? sz[t] : 0;
}

static int check_bool(struct cursor *c, uint64_t at, struct dray_str key)
{
    uint8_t b = c->p[at];
    if (b > 1)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": bool value %u in key '%.*s', expected 0 or 1",
                         c->name, at, b, (int)key.len, key.ptr);
    return 0;
}

static int bad_vtype(struct cursor *c, uint64_t at, uint32_t t, struct dray_str key, const char *role)
{
    return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                     "%s: offset %" PRIu64 ": %s type %" PRIu32 " in key '%.*s', expected 0..12 "
                     "(UINT8..FLOAT64)", c->name, at, role, t, (int)key.len, key.ptr);
}

/* Array value: element type, count, elements. Strings get an index in kv->strs. */
static int parse_array(struct cursor *c, struct dray_gguf_kv *kv)
{
    uint64_t at = c->off, bytes;
    int rc = rd_u32(c, &kv->arr_type, "array element type");
    if (rc)
        return rc;
    if (kv->arr_type == DRAY_GGUF_ARRAY)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": nested array in key '%.*s': arrays of arrays "
                         "are not supported", c->name, at, (int)kv->key.len, kv->key.ptr);
    if (kv->arr_type >= DRAY_GGUF_VTYPE_COUNT)
        return bad_vtype(c, at, kv->arr_type, kv->key, "array element");
    at = c->off;
    if ((rc = rd_u64(c, &kv->arr_n, "array element count")))
        return rc;
    kv->data = c->p + c->off;
    uint32_t esz = gguf_vtype_size(kv->arr_type);
    /* A string element takes at least its 8-byte length. */
    if (__builtin_mul_overflow(kv->arr_n, esz ? esz : 8, &bytes) || bytes > c->size - c->off)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": array '%.*s' claims %" PRIu64 " %s elements, "
                         "more than the %" PRIu64 " bytes left in the file can hold",
                         c->name, at, (int)kv->key.len, kv->key.ptr, kv->arr_n,
                         gguf_vtype_name(kv->arr_type), c->size - c->off);
    if (esz) {
        if (kv->arr_type == DRAY_GGUF_BOOL)
            for (uint64_t i = 0; i < kv->arr_n; i++)
                if ((rc = check_bool(c, c->off + i, kv->key)))
                    return rc;
        c->off += bytes;
        return 0;
    }
    struct dray_str *strs = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof(*strs));
    if (!strs)
        return dray_fail(c->err, c->errlen, DRAY_ENOMEM, "%s: no memory for %" PRIu64
                         " strings of '%.*s'", c->name, kv->arr_n, (int)kv->key.len, kv->key.ptr);
    kv->strs = strs; /* owned; freed by gguf_free */
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        if ((rc = rd_str(c, &strs[i], "string array element"))) {
            size_t l = c->err ? strlen(c->err) : 0; /* say which array and element */
            if (c->err && l + 1 < c->errlen)
                snprintf(c->err + l, c->errlen - l, " (element %" PRIu64 " of '%.*s')", i,
                         (int)kv->key.len, kv->key.ptr);
            return rc;
        }
    }
    return 0;
}

static int parse_value(struct cursor *c, struct dray_gguf *g, uint64_t i)
{
    struct dray_gguf_kv *kv = &g->kv[i];
    uint64_t at = c->off;
    int rc = rd_u32(c, &kv->type, "value type");
    if (rc)
        return rc;
    if (kv->type >= DRAY_GGUF_VTYPE_COUNT)
        return bad_vtype(c, at, kv->type, kv->key, "value");
    if (kv->type == DRAY_GGUF_ARRAY)
        return parse_array(c, kv);
    kv->data = c->p + c->off;
    if (kv->type == DRAY_GGUF_STRING) {
        kv->strs = &g->kv_str[i];
        return rd_str(c, &g->kv_str[i], "string value");
    }
    if ((rc = need(c, gguf_vtype_size(kv->type), gguf_vtype_name(kv->type))))
        return rc;
    if (kv->type == DRAY_GGUF_BOOL && (rc = check_bool(c, c->off, kv->key)))
        return rc;
    c->off += gguf_vtype_size(kv->type);
    return 0;
}

static int parse_kvs(struct cursor *c, struct dray_gguf *g)
{
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct dray_gguf_kv *kv = &g->kv[i];
        uint64_t at = c->off;
        int rc = rd_str(c, &kv->key, "key");
        if (rc)
            return rc;
        if (kv->key.len == 0)
            return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                             "%s: offset %" PRIu64 ": key %" PRIu64 " is empty, expected a "
                             "non-empty name", c->name, at, i);
        uint64_t *slot = index_slot(g, &g->kv_index, kv_key, kv->key.ptr, kv->key.len);
        if (*slot)
            return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                             "%s: offset %" PRIu64 ": duplicate key '%.*s' (first at index %"
                             PRIu64 "), expected unique keys", c->name, at,
                             (int)kv->key.len, kv->key.ptr, *slot - 1);
        *slot = i + 1;
        if ((rc = parse_value(c, g, i)))
            return rc;
    }
    return 0;
}

/* general.alignment: UINT32, a power of two; 32 if absent. */
static int read_alignment(struct cursor *c, struct dray_gguf *g)
{
    const struct dray_gguf_kv *kv = dray_gguf_find(g, "general.alignment");
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv)
        return 0;
    uint64_t at = (uint64_t)((const uint8_t *)kv->data - c->p);
    if (kv->type != DRAY_GGUF_UINT32)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": general.alignment has type %s, expected UINT32",
                         c->name, at, gguf_vtype_name(kv->type));
    memcpy(&g->alignment, kv->data, 4);
    if (g->alignment == 0 || (g->alignment & (g->alignment - 1)))
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": general.alignment is %" PRIu32
                         ", expected a power of two", c->name, at, g->alignment);
    return 0;
}

/* ------------------------------------------------------------ tensor infos */

static int parse_dims(struct cursor *c, struct dray_gguf_tensor *t)
{
    uint64_t at = c->off;
    int rc = rd_u32(c, &t->n_dims, "tensor n_dims");
    if (rc)
        return rc;
    if (t->n_dims > GGUF_MAX_DIMS)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": tensor '%s' has %" PRIu32 " dimensions, "
                         "expected at most 4", c->name, at, t->name, t->n_dims);
    int64_t prod = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims)
            continue;
        at = c->off;
        if ((rc = rd_u64(c, &t->ne[d], "tensor dimension")))
            return rc;
        if (t->ne[d] > INT64_MAX || __builtin_mul_overflow(prod, (int64_t)t->ne[d], &prod))
            return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                             "%s: offset %" PRIu64 ": dimension %" PRIu32 " of tensor '%s' is %"
                             PRIu64 ": the element count overflows, expected a product "
                             "< 2^63", c->name, at, d, t->name, t->ne[d]);
    }
    return 0;
}

/* "ne[0] x ne[1] x ..." of t's first n_dims dimensions, for error messages. */
static const char *dims_str(const struct dray_gguf_tensor *t, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (uint32_t d = 0; d < t->n_dims && d < GGUF_MAX_DIMS && o < len; d++) {
        int w = snprintf(buf + o, len - o, "%s%" PRIu64, d ? " x " : "", t->ne[d]);
        if (w < 0)
            break;
        o += (size_t)w;
    }
    return buf;
}

/* Byte size from type and dims, overflow-checked: blocks per row times block bytes
 * times the other dimensions must fit in 64 bits (parse_dims already bounded the
 * element count by 2^63, but a 4-byte F32 element can still push the bytes past
 * 2^64, and a wrapped size would pass the end-of-file check below).
 * Unknown types get nbytes 0 (not checkable; they are refused when used). */
static int tensor_size(struct cursor *c, uint64_t at, struct dray_gguf_tensor *t)
{
    uint32_t be = dray_ggml_block_elems(t->type), bb = dray_ggml_block_bytes(t->type);
    uint64_t n;
    char dims[128];
    t->nbytes = 0;
    if (!be)
        return 0;
    if (t->ne[0] % be)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": tensor '%s' of type %s has ne[0] = %" PRIu64
                         ", expected a multiple of the block size %" PRIu32,
                         c->name, at, t->name, dray_ggml_type_name(t->type), t->ne[0], be);
    bool over = __builtin_mul_overflow(t->ne[0] / be, (uint64_t)bb, &n);
    for (int d = 1; d < 4 && !over; d++)
        over = __builtin_mul_overflow(n, t->ne[d], &n);
    if (over)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": tensor '%s' of type %s with dimensions [%s] "
                         "needs more than 2^64 bytes, expected a size that fits in the file",
                         c->name, at, t->name, dray_ggml_type_name(t->type),
                         dims_str(t, dims, sizeof(dims)));
    t->nbytes = n;
    return 0;
}

static int parse_tensor(struct cursor *c, struct dray_gguf *g, uint64_t i, uint64_t *off_at)
{
    struct dray_gguf_tensor *t = &g->tensors[i];
    struct dray_str name = {NULL, 0};
    uint64_t at = c->off, type_at;
    int rc = rd_str(c, &name, "tensor name");
    if (rc)
        return rc;
    if (name.len == 0 || name.len >= GGUF_MAX_NAME || memchr(name.ptr, 0, name.len))
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": tensor %" PRIu64 " has a name of %" PRIu64
                         " bytes, expected 1..63 bytes without NUL", c->name, at, i, name.len);
    memcpy(t->name, name.ptr, name.len);
    t->name[name.len] = 0;
    uint64_t *slot = index_slot(g, &g->tensor_index, tensor_key, name.ptr, name.len);
    if (*slot)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset %" PRIu64 ": duplicate tensor name '%s', expected unique names",
                         c->name, at, t->name);
    *slot = i + 1;
    if ((rc = parse_dims(c, t)))
        return rc;
    type_at = c->off;
    if ((rc = rd_u32(c, &t->type, "tensor type")))
        return rc;
    if ((rc = tensor_size(c, type_at, t)))
        return rc;
    *off_at = c->off;
    return rd_u64(c, &t->offset, "tensor data offset");
}

/* Offsets aligned, data inside the file. off_at[i] = file offset of tensor i's
 * offset field, for the error message. */
static int place_tensors(struct cursor *c, struct dray_gguf *g, const uint64_t *off_at)
{
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct dray_gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        if (t->offset % g->alignment)
            return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                             "%s: offset %" PRIu64 ": tensor '%s' data offset %" PRIu64
                             " is not a multiple of the alignment %" PRIu32,
                             c->name, off_at[i], t->name, t->offset, g->alignment);
        if (__builtin_add_overflow(g->data_start, t->offset, &start) ||
            __builtin_add_overflow(start, t->nbytes, &end) || end > c->size)
            return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                             "%s: offset %" PRIu64 ": tensor '%s' data (%" PRIu64 " bytes at "
                             "data offset %" PRIu64 ", data section at %" PRIu64 ") runs past "
                             "the end of the file (%" PRIu64 " bytes)", c->name, off_at[i],
                             t->name, t->nbytes, t->offset, g->data_start, c->size);
        t->data = c->p + start;
        t->file = g;
    }
    return 0;
}

static int parse_tensors(struct cursor *c, struct dray_gguf *g)
{
    uint64_t *off_at = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof(*off_at));
    int rc = 0;
    if (!off_at)
        return dray_fail(c->err, c->errlen, DRAY_ENOMEM, "%s: no memory for the tensor table",
                         c->name);
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++)
        rc = parse_tensor(c, g, i, &off_at[i]);
    if (!rc) {
        uint64_t pad = (g->alignment - c->off % g->alignment) % g->alignment;
        if (__builtin_add_overflow(c->off, pad, &g->data_start))
            rc = dray_fail(c->err, c->errlen, DRAY_EFORMAT, "%s: data section offset overflows",
                           c->name);
        else
            rc = place_tensors(c, g, off_at);
    }
    free(off_at);
    return rc;
}

/* ------------------------------------------------------------ header */

static int parse_version(struct cursor *c, struct dray_gguf *g)
{
    int rc = rd_u32(c, &g->version, "4-byte version in the header");
    if (rc)
        return rc;
    if (g->version == 0)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset 4: GGUF version 0 is invalid, expected 2 or 3", c->name);
    if (g->version == 1)
        return dray_fail(c->err, c->errlen, DRAY_EINCOMPAT,
                         "%s: offset 4: GGUF version 1 is no longer supported, expected 2 or 3 "
                         "(convert the file again with a current converter)", c->name);
    if ((g->version & 0xFFFF) == 0)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset 4: version field 0x%08" PRIx32 " looks byte-swapped "
                         "(big-endian file?), expected little-endian version 2 or 3",
                         c->name, g->version);
    if (g->version > 3)
        return dray_fail(c->err, c->errlen, DRAY_EINCOMPAT,
                         "%s: offset 4: GGUF version %" PRIu32 " is newer than this reader, "
                         "expected 2 or 3", c->name, g->version);
    return 0;
}

static int parse_counts(struct cursor *c, struct dray_gguf *g)
{
    uint64_t min_t, min_kv, min_all, left;
    int rc = rd_u64(c, &g->n_tensors, "8-byte tensor count in the header");
    if (rc || (rc = rd_u64(c, &g->n_kv, "8-byte metadata count in the header")))
        return rc;
    left = c->size - c->off;
    if (__builtin_mul_overflow(g->n_tensors, GGUF_MIN_TENSOR_BYTES, &min_t) || min_t > left)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset 8: tensor count %" PRIu64 " cannot fit in the %" PRIu64
                         " bytes after the header (each tensor info takes >= %u bytes)",
                         c->name, g->n_tensors, left, GGUF_MIN_TENSOR_BYTES);
    if (__builtin_mul_overflow(g->n_kv, GGUF_MIN_KV_BYTES, &min_kv) ||
        __builtin_add_overflow(min_kv, min_t, &min_all) || min_all > left)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset 16: metadata count %" PRIu64 " cannot fit in the %" PRIu64
                         " bytes after the header (each key/value takes >= %u bytes)",
                         c->name, g->n_kv, left, GGUF_MIN_KV_BYTES);
    return 0;
}

static int parse_header(struct cursor *c, struct dray_gguf *g)
{
    if (c->size < 4)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset 0: truncated header: expected the 4-byte magic \"GGUF\", "
                         "file has %" PRIu64 " bytes", c->name, c->size);
    if (memcmp(c->p, GGUF_MAGIC, 4))
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset 0: bad magic %02x %02x %02x %02x, expected \"GGUF\" "
                         "(47 47 55 46)", c->name, c->p[0], c->p[1], c->p[2], c->p[3]);
    c->off = 4;
    int rc = parse_version(c, g);
    if (rc)
        return rc;
    if (c->size < GGUF_HEADER_BYTES)
        return dray_fail(c->err, c->errlen, DRAY_EFORMAT,
                         "%s: offset 8: truncated header: expected %u header bytes (magic, "
                         "version, tensor count, metadata count), file has %" PRIu64,
                         c->name, GGUF_HEADER_BYTES, c->size);
    return parse_counts(c, g);
}

/* ------------------------------------------------------------ open / close */

void dray_gguf_close(struct dray_gguf *g)
{
    if (!g)
        return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++)
        if (g->kv[i].type == DRAY_GGUF_ARRAY)
            free((void *)g->kv[i].strs);
    free(g->kv);
    free(g->kv_str);
    free(g->tensors);
    free(g->kv_index.slot);
    free(g->tensor_index.slot);
    if (g->map)
        munmap(g->map, g->size);
    free(g->name);
    free(g);
}

static int alloc_tables(struct cursor *c, struct dray_gguf *g)
{
    /* Counts are bounded by the file size (parse_counts), so these sizes cannot overflow. */
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
    g->kv_str = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv_str));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    if (!g->kv || !g->kv_str || !g->tensors || index_init(&g->kv_index, g->n_kv) ||
        index_init(&g->tensor_index, g->n_tensors))
        return dray_fail(c->err, c->errlen, DRAY_ENOMEM,
                         "%s: no memory for %" PRIu64 " keys and %" PRIu64 " tensors",
                         c->name, g->n_kv, g->n_tensors);
    return 0;
}

/* Parse and validate g->base[0..size); g->name set. */
static int parse(struct dray_gguf *g, char *err, size_t errlen)
{
    struct cursor c = {g->base, g->size, 0, g->name, err, errlen};
    int rc = parse_header(&c, g);
    if (!rc)
        rc = alloc_tables(&c, g);
    if (!rc)
        rc = parse_kvs(&c, g);
    if (!rc)
        rc = read_alignment(&c, g);
    if (!rc)
        rc = parse_tensors(&c, g);
    return rc;
}

static struct dray_gguf *gguf_new(const char *name)
{
    struct dray_gguf *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->name = strdup(name ? name : "(memory)");
    if (!g->name) {
        free(g);
        return NULL;
    }
    return g;
}

int dray_gguf_open_mem(const void *data, size_t size, const char *name, struct dray_gguf **out,
                       char *err, size_t errlen)
{
    struct dray_gguf *g;
    int rc;
    *out = NULL;
    if (!data && size)
        return dray_fail(err, errlen, DRAY_EINVAL, "%s: NULL buffer", name ? name : "(memory)");
    if (!(g = gguf_new(name)))
        return dray_fail(err, errlen, DRAY_ENOMEM, "no memory to open %s", name ? name : "GGUF");
    g->base = data ? data : (const uint8_t *)"";
    g->size = size;
    if ((rc = parse(g, err, errlen))) {
        dray_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int dray_gguf_open(const char *path, struct dray_gguf **out, char *err, size_t errlen)
{
    struct dray_gguf *g;
    struct stat st;
    int fd, rc = 0;
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO without a writer would block forever; the type
     * check below refuses it (and devices, sockets, folders) before any read. */
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0)
        return dray_fail(err, errlen, errno == ENOENT ? DRAY_ENOTFOUND : DRAY_EIO,
                         "%s: cannot open: %s", path, strerror(errno));
    if (!(g = gguf_new(path))) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "%s: no memory", path);
        goto out_close;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        rc = dray_fail(err, errlen, DRAY_EIO, "%s: not a regular file (a GGUF model file is "
                       "expected, not a %s)", path, S_ISDIR(st.st_mode) ? "folder" :
                       S_ISFIFO(st.st_mode) ? "pipe" : "device or socket");
        goto out_free;
    }
    g->size = (uint64_t)st.st_size;
    if (g->size) { /* mmap of 0 bytes fails; an empty file is reported by parse() */
        g->map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (g->map == MAP_FAILED) {
            g->map = NULL;
            rc = dray_fail(err, errlen, DRAY_EIO, "%s: mmap of %" PRIu64 " bytes failed: %s",
                           path, g->size, strerror(errno));
            goto out_free;
        }
    }
    g->base = g->map ? g->map : (const uint8_t *)"";
    rc = parse(g, err, errlen);
out_free:
    if (rc)
        dray_gguf_close(g);
    else
        *out = g;
out_close:
    close(fd);
    return rc;
}

void dray_gguf_release(const struct dray_gguf *g, const void *p, uint64_t n)
{
    const uint8_t *b = p, *map = g ? g->map : NULL;
    if (!map || !n || b < map || b > map + g->size || n > (uint64_t)(map + g->size - b))
        return;
    /* the whole pages under the range: a private, read-only mapping's pages are
     * the file's, so dropping one never loses data */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)b & ~(page - 1);
    madvise((void *)lo, (uintptr_t)(b + n) - lo, MADV_DONTNEED);
}

/* ------------------------------------------------------------ lookup by name */

const struct dray_gguf_kv *dray_gguf_find(const struct dray_gguf *g, const char *key)
{
    uint64_t *s = index_slot(g, &g->kv_index, kv_key, key, strlen(key));
    return *s ? &g->kv[*s - 1] : NULL;
}

const struct dray_gguf_tensor *dray_gguf_find_tensor(const struct dray_gguf *g, const char *name)
{
    uint64_t *s = index_slot(g, &g->tensor_index, tensor_key, name, strlen(name));
    return *s ? &g->tensors[*s - 1] : NULL;
}

bool dray_str_eq(struct dray_str s, const char *c)
{
    return str_eq_n(s, c, strlen(c));
}
