/* GGUF reader and writer: malformed files are rejected with a reason that names the
 * byte offset and what was expected; valid files (v2 and v3) round-trip through the
 * writer. Malformed inputs are built byte by byte here (not with the writer) and
 * opened from an exact-size heap copy, so ASan flags any read past the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "dray/backend.h"
#include "gguf.h"
#include "gguf_write.h"
#include "testutil.h"

/* ------------------------------------------------------------ byte builder */

struct bb {
    uint8_t *p;
    size_t n, cap;
};

static void bb_put(struct bb *b, const void *v, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, v, n);
    b->n += n;
}

static void bb_u8(struct bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(struct bb *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(struct bb *b, uint64_t v) { bb_put(b, &v, 8); }

static void bb_str(struct bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static void bb_header(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}

static void bb_kv_u32(struct bb *b, const char *key, uint32_t v)
{
    bb_str(b, key);
    bb_u32(b, DRAY_GGUF_UINT32);
    bb_u32(b, v);
}

/* Tensor info with n_dims dims from ne. */
static void bb_tinfo(struct bb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                     uint32_t type, uint64_t offset)
{
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}

static const uint8_t zeros[256];

static void bb_pad(struct bb *b, size_t align)
{
    while (b->n % align)
        bb_u8(b, 0);
}

/* ------------------------------------------------------------ open helpers */

struct opened {
    struct dray_gguf *g;
    void *buf;
    char err[512];
    int rc;
};

/* Open an exact-size heap copy of the first n bytes of b. */
static struct opened open_n(const struct bb *b, size_t n)
{
    struct opened o = {0};
    o.buf = malloc(n ? n : 1);
    assert_non_null(o.buf);
    if (n)
        memcpy(o.buf, b->p, n);
    o.rc = dray_gguf_open_mem(o.buf, n, "t.gguf", &o.g, o.err, sizeof(o.err));
    return o;
}

static void close_o(struct opened *o)
{
    dray_gguf_close(o->g);
    free(o->buf);
}

/* The file must be rejected with rc, and the reason must contain every given piece. */
static void expect_reject(struct bb *b, int rc, const char *p1, const char *p2)
{
    struct opened o = open_n(b, b->n);
    if (o.rc != rc || (p1 && !strstr(o.err, p1)) || (p2 && !strstr(o.err, p2)))
        print_error("rc %d (want %d), err: %s (want '%s', '%s')\n", o.rc, rc, o.err,
                    p1 ? p1 : "", p2 ? p2 : "");
    assert_int_equal(o.rc, rc);
    assert_null(o.g);
    if (p1)
        assert_non_null(strstr(o.err, p1));
    if (p2)
        assert_non_null(strstr(o.err, p2));
    assert_non_null(strstr(o.err, "t.gguf"));
    close_o(&o);
    free(b->p);
}

/* ------------------------------------------------------------ header */

static void test_gguf_rejects_truncated_header(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_put(&b, "GGU", 3);
    expect_reject(&b, DRAY_EFORMAT, "offset 0:", "truncated header");

    b = (struct bb){0};
    bb_put(&b, "GGUF", 4);
    expect_reject(&b, DRAY_EFORMAT, "offset 4:", "version");

    b = (struct bb){0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u32(&b, 0); /* half of the kv count */
    expect_reject(&b, DRAY_EFORMAT, "offset 8:", "truncated header");

    b = (struct bb){0};
    expect_reject(&b, DRAY_EFORMAT, "offset 0:", "file has 0 bytes");
}

static void test_gguf_rejects_bad_magic(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_put(&b, "GGML", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 0: bad magic 47 47 4d 4c", "expected \"GGUF\"");
}

static void test_gguf_rejects_bad_versions(void **state)
{
    (void)state;
    struct { uint32_t v; int rc; const char *why; } cases[] = {
        {0, DRAY_EFORMAT, "version 0 is invalid"},
        {1, DRAY_EINCOMPAT, "no longer supported"},
        {4, DRAY_EINCOMPAT, "version 4 is newer"},
        {0x03000000u, DRAY_EFORMAT, "byte-swapped"},
        {0x00020000u, DRAY_EFORMAT, "byte-swapped"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct bb b = {0};
        bb_header(&b, cases[i].v, 0, 0);
        expect_reject(&b, cases[i].rc, "offset 4:", cases[i].why);
    }
}

static void test_gguf_rejects_absurd_counts(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_header(&b, 3, 1ull << 40, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 8:", "tensor count 1099511627776 cannot fit");

    b = (struct bb){0};
    bb_header(&b, 3, 0, UINT64_MAX);
    expect_reject(&b, DRAY_EFORMAT, "offset 16:", "metadata count");

    /* 3 kvs need >= 42 bytes; give it 2 real ones (41 bytes) */
    b = (struct bb){0};
    bb_header(&b, 3, 0, 3);
    bb_kv_u32(&b, "a.b", 1);
    bb_kv_u32(&b, "c.d", 2);
    bb_put(&b, "xxx", 3); /* 2 * 19 + 3 = 41 bytes */
    expect_reject(&b, DRAY_EFORMAT, "offset 16:", "cannot fit");

    /* tensor count overflows the multiplication */
    b = (struct bb){0};
    bb_header(&b, 3, UINT64_MAX / 2, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 8:", "cannot fit");
}

/* ------------------------------------------------------------ metadata */

static void test_gguf_rejects_string_past_eof(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1000); /* key length */
    bb_put(&b, "abcdefghijklmnopq", 17);
    expect_reject(&b, DRAY_EFORMAT, "offset 24: key has length 1000", "past the end");

    /* string value, length near 2^64 (offset + len would wrap) */
    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, DRAY_GGUF_STRING);
    bb_u64(&b, UINT64_MAX - 3);
    bb_put(&b, "abcd", 4);
    expect_reject(&b, DRAY_EFORMAT, "offset 37: string value has length", "past the end");

    /* second element of a string array runs past the end */
    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, DRAY_GGUF_ARRAY);
    bb_u32(&b, DRAY_GGUF_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "one");
    bb_u64(&b, 50);
    bb_put(&b, "two", 3);
    expect_reject(&b, DRAY_EFORMAT, "offset 60: string array element has length 50",
                  "(element 1 of 'k')");
}

static void test_gguf_rejects_empty_and_duplicate_keys(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "");
    bb_u32(&b, DRAY_GGUF_UINT16);
    bb_u8(&b, 1);
    bb_u8(&b, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 24: key 0 is empty", NULL);

    b = (struct bb){0};
    bb_header(&b, 3, 0, 3);
    bb_kv_u32(&b, "a.x", 1);
    bb_kv_u32(&b, "a.y", 1);
    bb_kv_u32(&b, "a.x", 2); /* at 24 + 2 * 19 = 62 */
    expect_reject(&b, DRAY_EFORMAT, "offset 62: duplicate key 'a.x'", "first at index 0");
}

static void test_gguf_rejects_bad_value_types(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, 13);
    bb_u64(&b, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 33: value type 13 in key 'k'", "expected 0..12");

    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, DRAY_GGUF_ARRAY);
    bb_u32(&b, 0xFFFFFFFFu);
    bb_u64(&b, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 37: array element type 4294967295", NULL);

    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, DRAY_GGUF_ARRAY);
    bb_u32(&b, DRAY_GGUF_ARRAY);
    bb_u64(&b, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 37: nested array in key 'k'", NULL);

    /* scalar truncated: a UINT64 with 3 bytes left */
    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, DRAY_GGUF_UINT64);
    bb_put(&b, "abc", 3);
    expect_reject(&b, DRAY_EFORMAT, "offset 37: truncated: expected UINT64 (8 bytes)",
                  "only 3 bytes left");
}

static void test_gguf_rejects_bool_not_0_or_1(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "flag");
    bb_u32(&b, DRAY_GGUF_BOOL);
    bb_u8(&b, 2);
    expect_reject(&b, DRAY_EFORMAT, "offset 40: bool value 2 in key 'flag'", "expected 0 or 1");

    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "flags");
    bb_u32(&b, DRAY_GGUF_ARRAY);
    bb_u32(&b, DRAY_GGUF_BOOL);
    bb_u64(&b, 3);
    bb_u8(&b, 1);
    bb_u8(&b, 0);
    bb_u8(&b, 0xFF);
    expect_reject(&b, DRAY_EFORMAT, "offset 55: bool value 255", NULL);
}

static void test_gguf_rejects_array_longer_than_file(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, DRAY_GGUF_ARRAY);
    bb_u32(&b, DRAY_GGUF_FLOAT32);
    bb_u64(&b, 5);
    bb_put(&b, "0123456789abcdef", 16); /* 4 floats, not 5 */
    expect_reject(&b, DRAY_EFORMAT, "offset 41: array 'k' claims 5 FLOAT32 elements", NULL);

    /* count * 8 overflows: string array of 2^61 */
    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, DRAY_GGUF_ARRAY);
    bb_u32(&b, DRAY_GGUF_STRING);
    bb_u64(&b, 1ull << 61);
    expect_reject(&b, DRAY_EFORMAT, "claims 2305843009213693952 STRING elements", NULL);
}

static void test_gguf_rejects_bad_alignment(void **state)
{
    (void)state;
    struct bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    expect_reject(&b, DRAY_EFORMAT, "offset 53: general.alignment is 48", "power of two");

    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0);
    expect_reject(&b, DRAY_EFORMAT, "general.alignment is 0", NULL);

    b = (struct bb){0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, DRAY_GGUF_UINT64);
    bb_u64(&b, 64);
    expect_reject(&b, DRAY_EFORMAT, "general.alignment has type UINT64", "expected UINT32");
}

/* ------------------------------------------------------------ tensor infos */

/* One tensor, no kvs; data (if any) appended after padding to 32. */
static void bb_one_tensor(struct bb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                          uint32_t type, uint64_t offset, size_t data_bytes)
{
    bb_header(b, 3, 1, 0);
    bb_tinfo(b, name, n_dims, ne, type, offset);
    bb_pad(b, 32);
    for (size_t i = 0; i < data_bytes; i++)
        bb_u8(b, (uint8_t)i);
}

static void test_gguf_rejects_long_or_duplicate_tensor_names(void **state)
{
    (void)state;
    char name[65];
    uint64_t ne[1] = {4};
    memset(name, 'n', 64);
    name[64] = 0;
    struct bb b = {0};
    bb_one_tensor(&b, name, 1, ne, DRAY_GGML_F32, 0, 16);
    expect_reject(&b, DRAY_EFORMAT, "offset 24: tensor 0 has a name of 64 bytes",
                  "expected 1..63");

    name[63] = 0; /* 63 bytes is the longest allowed */
    b = (struct bb){0};
    bb_one_tensor(&b, name, 1, ne, DRAY_GGML_F32, 0, 16);
    struct opened o = open_n(&b, b.n);
    assert_int_equal(o.rc, 0);
    assert_string_equal(dray_gguf_tensor_at(o.g, 0)->name, name);
    assert_non_null(dray_gguf_find_tensor(o.g, name));
    close_o(&o);
    free(b.p);

    b = (struct bb){0};
    bb_header(&b, 3, 2, 0);
    bb_tinfo(&b, "w", 1, ne, DRAY_GGML_F32, 0);
    bb_tinfo(&b, "w", 1, ne, DRAY_GGML_F32, 32); /* at 24 + 33 = 57 */
    bb_pad(&b, 32);
    bb_put(&b, zeros, 64);
    expect_reject(&b, DRAY_EFORMAT, "offset 57: duplicate tensor name 'w'", NULL);
}

static void test_gguf_rejects_bad_dims(void **state)
{
    (void)state;
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    struct bb b = {0};
    bb_one_tensor(&b, "t", 5, ne5, DRAY_GGML_F32, 0, 4);
    expect_reject(&b, DRAY_EFORMAT, "offset 33: tensor 't' has 5 dimensions", "at most 4");

    uint64_t big[2] = {1ull << 32, 1ull << 32}; /* 2^64 elements */
    b = (struct bb){0};
    bb_one_tensor(&b, "t", 2, big, DRAY_GGML_F32, 0, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 45: dimension 1 of tensor 't'", "overflows");

    uint64_t neg[1] = {1ull << 63}; /* negative as int64 */
    b = (struct bb){0};
    bb_one_tensor(&b, "t", 1, neg, DRAY_GGML_F32, 0, 0);
    expect_reject(&b, DRAY_EFORMAT, "offset 37: dimension 0 of tensor 't'", NULL);

    /* elements fit in int64 but bytes do not: 2^62 F32 elements */
    uint64_t wide[2] = {1ull << 31, 1ull << 31};
    b = (struct bb){0};
    bb_one_tensor(&b, "t", 2, wide, DRAY_GGML_F32, 0, 0);
    expect_reject(&b, DRAY_EFORMAT, "tensor 't' of type F32 with dimensions [2147483648 x "
                  "2147483648]", "more than 2^64 bytes");

    /* one dimension whose byte size wraps to 32 (2^62 + 8 elements * 4 bytes),
     * which used to pass the end-of-file check with 32 bytes of data present */
    uint64_t wrap[1] = {(1ull << 62) + 8};
    b = (struct bb){0};
    bb_one_tensor(&b, "t", 1, wrap, DRAY_GGML_F32, 0, 32);
    expect_reject(&b, DRAY_EFORMAT, "dimensions [4611686018427387912]", "more than 2^64 bytes");
}

static void test_gguf_rejects_ne0_not_multiple_of_block(void **state)
{
    (void)state;
    uint64_t ne[2] = {48, 2};
    struct bb b = {0};
    bb_one_tensor(&b, "q", 2, ne, DRAY_GGML_Q4_0, 0, 64);
    expect_reject(&b, DRAY_EFORMAT, "offset 53: tensor 'q' of type Q4_0 has ne[0] = 48",
                  "multiple of the block size 32");
}

static void test_gguf_rejects_misaligned_tensor_offset(void **state)
{
    (void)state;
    uint64_t ne[1] = {2};
    struct bb b = {0};
    bb_one_tensor(&b, "t", 1, ne, DRAY_GGML_F32, 8, 64);
    expect_reject(&b, DRAY_EFORMAT, "offset 49: tensor 't' data offset 8",
                  "multiple of the alignment 32");
}

static void test_gguf_rejects_tensor_data_past_eof(void **state)
{
    (void)state;
    uint64_t ne[2] = {4, 4}; /* 64 bytes */
    struct bb b = {0};
    bb_one_tensor(&b, "t", 2, ne, DRAY_GGML_F32, 0, 63);
    expect_reject(&b, DRAY_EFORMAT, "tensor 't' data (64 bytes at data offset 0",
                  "past the end of the file");

    /* offset so large that data_start + offset wraps */
    b = (struct bb){0};
    bb_one_tensor(&b, "t", 2, ne, DRAY_GGML_F32, UINT64_MAX - 31, 64);
    expect_reject(&b, DRAY_EFORMAT, "offset 57: tensor 't' data", "past the end");
}

static void test_gguf_accepts_unknown_tensor_type_as_unsupported(void **state)
{
    (void)state;
    uint32_t ids[] = {4, 99, DRAY_GGML_Q4_0 + 21 /* IQ4_XS: known size, not decoded */};
    for (size_t k = 0; k < 3; k++) {
        uint64_t ne[1] = {256};
        struct bb b = {0};
        bb_one_tensor(&b, "odd", 1, ne, ids[k], 0, 256);
        struct opened o = open_n(&b, b.n);
        assert_int_equal(o.rc, 0);
        const struct dray_gguf_tensor *t = dray_gguf_find_tensor(o.g, "odd");
        assert_non_null(t);
        assert_int_equal(t->type, ids[k]);
        assert_false(dray_ggml_type_supported(t->type));
        float out[256];
        assert_int_equal(dray_gguf_tensor_row_f32(t, 0, out), DRAY_ENOTSUP);
        assert_int_equal(dray_dequant_row(t->type, t->data, out, 256), DRAY_ENOTSUP);
        close_o(&o);
        free(b.p);
    }
    assert_null(dray_ggml_type_name(99));
    assert_int_equal(dray_ggml_block_elems(99), 0);
    assert_string_equal(dray_ggml_type_name(23), "IQ4_XS");
    assert_int_equal(dray_ggml_block_bytes(23), 136);
}

static void test_gguf_honours_general_alignment(void **state)
{
    (void)state;
    uint64_t ne[1] = {4};
    struct bb b = {0};
    bb_header(&b, 2, 2, 1);
    bb_kv_u32(&b, "general.alignment", 64);
    bb_tinfo(&b, "a", 1, ne, DRAY_GGML_F32, 0);
    bb_tinfo(&b, "b", 1, ne, DRAY_GGML_F32, 64);
    bb_pad(&b, 64);
    size_t data_start = b.n;
    for (int i = 0; i < 32; i++)
        bb_u32(&b, 0x3F800000u + (uint32_t)i); /* 1.0f and neighbours */
    struct opened o = open_n(&b, b.n);
    assert_int_equal(o.rc, 0);
    assert_int_equal(dray_gguf_version(o.g), 2);
    const struct dray_gguf_tensor *t = dray_gguf_find_tensor(o.g, "b");
    assert_ptr_equal(t->data, (uint8_t *)o.buf + data_start + 64);
    float row[4];
    assert_int_equal(dray_gguf_tensor_row_f32(t, 0, row), 0);
    uint32_t bits;
    memcpy(&bits, &row[0], 4);
    assert_int_equal(bits, 0x3F800000u + 16);
    close_o(&o);
    free(b.p);

    /* offset 32 is fine with the default alignment but not with 64 */
    b = (struct bb){0};
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 64);
    bb_tinfo(&b, "a", 1, ne, DRAY_GGML_F32, 32);
    bb_pad(&b, 64);
    bb_put(&b, zeros, 128);
    expect_reject(&b, DRAY_EFORMAT, "data offset 32 is not a multiple of the alignment 64", NULL);
}

/* ------------------------------------------------------------ writer round trip */

static const char *const vocab[] = {"<pad>", "", "h\xc3\xa9llo", "\xe2\x96\x81world"};

static void fill_writer(struct dray_gguf_writer *w)
{
    uint8_t u8 = 250;
    int8_t i8 = -100;
    uint16_t u16 = 65000;
    int16_t i16 = -32000;
    int64_t i64 = INT64_MIN;
    double f64 = 3.141592653589793;
    assert_int_equal(dray_gguf_add_scalar(w, "t.u8", DRAY_GGUF_UINT8, &u8), 0);
    assert_int_equal(dray_gguf_add_scalar(w, "t.i8", DRAY_GGUF_INT8, &i8), 0);
    assert_int_equal(dray_gguf_add_scalar(w, "t.u16", DRAY_GGUF_UINT16, &u16), 0);
    assert_int_equal(dray_gguf_add_scalar(w, "t.i16", DRAY_GGUF_INT16, &i16), 0);
    assert_int_equal(dray_gguf_add_u32(w, "t.u32", 4000000000u), 0);
    assert_int_equal(dray_gguf_add_i32(w, "t.i32", -2000000000), 0);
    assert_int_equal(dray_gguf_add_f32(w, "t.f32", 1e-6f), 0);
    assert_int_equal(dray_gguf_add_bool(w, "t.bool", true), 0);
    assert_int_equal(dray_gguf_add_str(w, "t.str", "gemma3"), 0);
    assert_int_equal(dray_gguf_add_u64(w, "t.u64", UINT64_MAX), 0);
    assert_int_equal(dray_gguf_add_scalar(w, "t.i64", DRAY_GGUF_INT64, &i64), 0);
    assert_int_equal(dray_gguf_add_scalar(w, "t.f64", DRAY_GGUF_FLOAT64, &f64), 0);
    assert_int_equal(dray_gguf_add_str(w, "t.empty", ""), 0);

    float scores[3] = {-1000.0f, 0.5f, 2.0f};
    int32_t ttype[4] = {3, 3, 1, 6};
    uint8_t flags[3] = {1, 0, 1};
    uint64_t big[2] = {0, UINT64_MAX};
    assert_int_equal(dray_gguf_add_arr(w, "a.f32", DRAY_GGUF_FLOAT32, scores, 3), 0);
    assert_int_equal(dray_gguf_add_arr(w, "a.i32", DRAY_GGUF_INT32, ttype, 4), 0);
    assert_int_equal(dray_gguf_add_arr(w, "a.bool", DRAY_GGUF_BOOL, flags, 3), 0);
    assert_int_equal(dray_gguf_add_arr(w, "a.u64", DRAY_GGUF_UINT64, big, 2), 0);
    assert_int_equal(dray_gguf_add_arr(w, "a.none", DRAY_GGUF_UINT8, NULL, 0), 0);
    assert_int_equal(dray_gguf_add_arr_str(w, "a.str", vocab, 4), 0);

    float f[6] = {1, -2, 3.5f, 0, -0.25f, 1e30f};
    uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
    uint8_t q8[2 * 34], q4k[144];
    for (size_t i = 0; i < sizeof(q8); i++)
        q8[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(q4k); i++)
        q4k[i] = (uint8_t)(i * 13 + 5);
    uint64_t ne_f[2] = {3, 2}, ne_h[1] = {4}, ne_q8[2] = {32, 2}, ne_q4k[4] = {256, 1, 1, 1};
    assert_int_equal(dray_gguf_add_tensor(w, "w.f32", DRAY_GGML_F32, 2, ne_f, f), 0);
    assert_int_equal(dray_gguf_add_tensor(w, "w.f16", DRAY_GGML_F16, 1, ne_h, h), 0);
    assert_int_equal(dray_gguf_add_tensor(w, "w.bf16", DRAY_GGML_BF16, 1, ne_h, h), 0);
    assert_int_equal(dray_gguf_add_tensor(w, "w.q8_0", DRAY_GGML_Q8_0, 2, ne_q8, q8), 0);
    assert_int_equal(dray_gguf_add_tensor(w, "w.q4_k", DRAY_GGML_Q4_K, 4, ne_q4k, q4k), 0);
}

static void check_str(struct dray_str s, const char *want)
{
    assert_int_equal(s.len, strlen(want));
    if (s.len)
        assert_memory_equal(s.ptr, want, s.len);
}

static void check_metadata(const struct dray_gguf *g)
{
    uint32_t u32;
    int64_t i64;
    float f;
    bool b;
    struct dray_str s;
    const void *data;
    uint64_t n;
    assert_int_equal(dray_gguf_get_u32(g, "t.u8", &u32, NULL, 0), 0);
    assert_int_equal(u32, 250);
    assert_int_equal(dray_gguf_get_i64(g, "t.i8", &i64, NULL, 0), 0);
    assert_int_equal(i64, -100);
    assert_int_equal(dray_gguf_get_u32(g, "t.u16", &u32, NULL, 0), 0);
    assert_int_equal(u32, 65000);
    assert_int_equal(dray_gguf_get_i64(g, "t.i16", &i64, NULL, 0), 0);
    assert_int_equal(i64, -32000);
    assert_int_equal(dray_gguf_get_u32(g, "t.u32", &u32, NULL, 0), 0);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(dray_gguf_get_i64(g, "t.i32", &i64, NULL, 0), 0);
    assert_int_equal(i64, -2000000000);
    assert_int_equal(dray_gguf_get_f32(g, "t.f32", &f, NULL, 0), 0);
    assert_true(f == 1e-6f);
    assert_int_equal(dray_gguf_get_bool(g, "t.bool", &b, NULL, 0), 0);
    assert_true(b);
    assert_int_equal(dray_gguf_get_str(g, "t.str", &s, NULL, 0), 0);
    assert_true(dray_str_eq(s, "gemma3"));
    assert_int_equal(dray_gguf_get_str(g, "t.empty", &s, NULL, 0), 0);
    assert_int_equal(s.len, 0);
    const struct dray_gguf_kv *kv = dray_gguf_find(g, "t.u64");
    uint64_t u64;
    memcpy(&u64, kv->data, 8);
    assert_int_equal(kv->type, DRAY_GGUF_UINT64);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(dray_gguf_get_i64(g, "t.i64", &i64, NULL, 0), 0);
    assert_true(i64 == INT64_MIN);
    double d;
    kv = dray_gguf_find(g, "t.f64");
    memcpy(&d, kv->data, 8);
    assert_true(d == 3.141592653589793);

    assert_int_equal(dray_gguf_get_arr(g, "a.f32", DRAY_GGUF_FLOAT32, &data, &n, NULL, 0), 0);
    assert_int_equal(n, 3);
    float sc[3];
    memcpy(sc, data, sizeof(sc));
    assert_true(sc[0] == -1000.0f && sc[1] == 0.5f && sc[2] == 2.0f);
    assert_int_equal(dray_gguf_get_arr(g, "a.i32", DRAY_GGUF_INT32, &data, &n, NULL, 0), 0);
    int32_t tt[4];
    memcpy(tt, data, sizeof(tt));
    assert_int_equal(n, 4);
    assert_int_equal(tt[3], 6);
    assert_int_equal(dray_gguf_get_arr(g, "a.bool", DRAY_GGUF_BOOL, &data, &n, NULL, 0), 0);
    assert_memory_equal(data, "\1\0\1", 3);
    assert_int_equal(dray_gguf_get_arr(g, "a.u64", DRAY_GGUF_UINT64, &data, &n, NULL, 0), 0);
    assert_int_equal(n, 2);
    assert_int_equal(dray_gguf_get_arr(g, "a.none", DRAY_GGUF_UINT8, &data, &n, NULL, 0), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dray_gguf_get_arr(g, "a.str", DRAY_GGUF_STRING, &data, &n, NULL, 0), 0);
    assert_int_equal(n, 4);
    const struct dray_str *strs = data;
    for (int i = 0; i < 4; i++)
        assert_true(dray_str_eq(strs[i], vocab[i]));
    assert_ptr_equal(strs, dray_gguf_find(g, "a.str")->strs);
    check_str(strs[1], "");
}

static void check_tensors(const struct dray_gguf *g)
{
    assert_int_equal(dray_gguf_n_tensors(g), 5);
    const struct dray_gguf_tensor *t = dray_gguf_find_tensor(g, "w.f32");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 3);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->nbytes, 24);
    float row[3];
    assert_int_equal(dray_gguf_tensor_row_f32(t, 1, row), 0);
    assert_true(row[0] == 0.0f && row[1] == -0.25f && row[2] == 1e30f);
    assert_int_equal(dray_gguf_tensor_row_f32(t, 2, row), DRAY_EINVAL);

    t = dray_gguf_find_tensor(g, "w.f16");
    float h[4];
    assert_int_equal(dray_gguf_tensor_row_f32(t, 0, h), 0);
    assert_true(h[0] == 1.0f && h[1] == -2.0f && h[2] == 0x1p-24f && h[3] == 65504.0f);

    t = dray_gguf_find_tensor(g, "w.q8_0");
    assert_int_equal(t->nbytes, 68);
    for (int i = 0; i < 68; i++)
        assert_int_equal(((const uint8_t *)t->data)[i], (uint8_t)(i * 7 + 1));
    t = dray_gguf_find_tensor(g, "w.q4_k");
    assert_int_equal(t->type, DRAY_GGML_Q4_K);
    assert_int_equal(t->n_dims, 4);
    assert_int_equal(t->nbytes, 144);
    assert_int_equal(((const uint8_t *)t->data)[143], (uint8_t)(143 * 13 + 5));
    assert_int_equal(dray_gguf_tensor_nelems(t), 256);
    assert_null(dray_gguf_find_tensor(g, "w.missing"));
}

static void round_trip(uint32_t version, uint32_t alignment)
{
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(dray_gguf_writer_set_version(w, version), 0);
    if (alignment)
        assert_int_equal(dray_gguf_writer_set_alignment(w, alignment), 0);
    fill_writer(w);
    void *buf;
    size_t size;
    assert_int_equal(dray_gguf_writer_to_mem(w, &buf, &size), 0);
    struct dray_gguf *g;
    char err[256] = "";
    int rc = dray_gguf_open_mem(buf, size, "rt", &g, err, sizeof(err));
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(dray_gguf_version(g), version);
    assert_int_equal(dray_gguf_n_kv(g), 19 + (alignment ? 1 : 0));
    check_metadata(g);
    check_tensors(g);
    uint32_t a = alignment ? alignment : 32;
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++) {
        const struct dray_gguf_tensor *t = dray_gguf_tensor_at(g, i);
        assert_int_equal(t->offset % a, 0);
        assert_int_equal(((const uint8_t *)t->data - (const uint8_t *)buf) % a, 0);
    }
    dray_gguf_close(g);

    /* The same through a file and mmap. */
    const char *path = dray_test_path(version == 2 ? "rt2.gguf" : "rt3.gguf");
    assert_int_equal(dray_gguf_writer_write(w, path, err, sizeof(err)), 0);
    assert_int_equal(dray_gguf_open(path, &g, err, sizeof(err)), 0);
    assert_int_equal(dray_gguf_file_size(g), size);
    assert_string_equal(dray_gguf_name(g), path);
    check_metadata(g);
    check_tensors(g);
    /* released pages read back as the file: dropping them is only a hint */
    dray_gguf_release(g, dray_gguf_bytes(g), dray_gguf_file_size(g));
    assert_memory_equal(dray_gguf_bytes(g), buf, size);
    check_tensors(g);
    dray_gguf_close(g);
    /* a buffer the caller owns is never released: it would read back as zeros */
    assert_int_equal(dray_gguf_open_mem(buf, size, "rt", &g, err, sizeof(err)), 0);
    void *copy = malloc(size);
    memcpy(copy, buf, size);
    dray_gguf_release(g, dray_gguf_bytes(g), dray_gguf_file_size(g));
    assert_memory_equal(buf, copy, size);
    free(copy);
    dray_gguf_close(g);
    free(buf);
    dray_gguf_writer_free(w);
}

static void test_gguf_writer_round_trips_v3(void **state)
{
    (void)state;
    round_trip(3, 0);
    round_trip(3, 64);
}

static void test_gguf_writer_round_trips_v2(void **state)
{
    (void)state;
    round_trip(2, 0);
    round_trip(2, 8);
}

static void test_gguf_writer_rejects_bad_input(void **state)
{
    (void)state;
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    uint8_t two = 2, bools[2] = {0, 3};
    uint64_t ne[1] = {33};
    float data[33] = {0};
    char longname[65];
    memset(longname, 'x', 64);
    longname[64] = 0;
    assert_int_equal(dray_gguf_writer_set_version(w, 1), DRAY_EINVAL);
    assert_int_equal(dray_gguf_writer_set_version(w, 4), DRAY_EINVAL);
    assert_int_equal(dray_gguf_writer_set_alignment(w, 48), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_u32(w, "general.alignment", 0), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_u32(w, "k", 1), 0);
    assert_int_equal(dray_gguf_add_u32(w, "k", 2), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_str(w, "", "v"), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_scalar(w, "b", DRAY_GGUF_BOOL, &two), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_scalar(w, "s", DRAY_GGUF_STRING, "x"), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_arr(w, "ab", DRAY_GGUF_BOOL, bools, 2), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_arr(w, "aa", DRAY_GGUF_ARRAY, bools, 2), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_tensor(w, "q", DRAY_GGML_Q8_0, 1, ne, data), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_tensor(w, "u", 99, 1, ne, data), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_tensor(w, longname, DRAY_GGML_F32, 1, ne, data), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_tensor(w, "f", DRAY_GGML_F32, 5, ne, data), DRAY_EINVAL);
    assert_int_equal(dray_gguf_add_tensor(w, "f", DRAY_GGML_F32, 1, ne, data), 0);
    assert_int_equal(dray_gguf_add_tensor(w, "f", DRAY_GGML_F32, 1, ne, data), DRAY_EINVAL);
    /* what was accepted still writes a valid file */
    void *buf;
    size_t size;
    struct dray_gguf *g;
    assert_int_equal(dray_gguf_writer_to_mem(w, &buf, &size), 0);
    assert_int_equal(dray_gguf_open_mem(buf, size, "w", &g, NULL, 0), 0);
    assert_int_equal(dray_gguf_n_kv(g), 1);
    assert_int_equal(dray_gguf_n_tensors(g), 1);
    dray_gguf_close(g);
    free(buf);
    dray_gguf_writer_free(w);
}

/* ------------------------------------------------------------ getters */

static void test_gguf_typed_getters_check_range_and_type(void **state)
{
    (void)state;
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    int64_t neg = -5;
    double big = 1e300;
    dray_gguf_add_scalar(w, "neg", DRAY_GGUF_INT64, &neg);
    dray_gguf_add_u64(w, "huge", 1ull << 40);
    dray_gguf_add_u64(w, "huger", UINT64_MAX);
    dray_gguf_add_scalar(w, "f64", DRAY_GGUF_FLOAT64, &big);
    dray_gguf_add_str(w, "s", "x");
    dray_gguf_add_u32(w, "n", 7);
    void *buf;
    size_t size;
    struct dray_gguf *g;
    char err[256];
    assert_int_equal(dray_gguf_writer_to_mem(w, &buf, &size), 0);
    assert_int_equal(dray_gguf_open_mem(buf, size, "g.gguf", &g, err, sizeof(err)), 0);
    uint32_t u;
    int64_t i;
    float f;
    bool b;
    struct dray_str s;
    const void *d;
    uint64_t n;
    assert_int_equal(dray_gguf_get_u32(g, "neg", &u, err, sizeof(err)), DRAY_EFORMAT);
    assert_non_null(strstr(err, "key 'neg' = -5 does not fit"));
    assert_int_equal(dray_gguf_get_u32(g, "huge", &u, err, sizeof(err)), DRAY_EFORMAT);
    assert_int_equal(dray_gguf_get_i64(g, "huge", &i, NULL, 0), 0);
    assert_true(i == 1ll << 40);
    assert_int_equal(dray_gguf_get_i64(g, "huger", &i, err, sizeof(err)), DRAY_EFORMAT);
    assert_int_equal(dray_gguf_get_i64(g, "neg", &i, NULL, 0), 0);
    assert_true(i == -5);
    assert_int_equal(dray_gguf_get_f32(g, "neg", &f, NULL, 0), 0);
    assert_true(f == -5.0f);
    assert_int_equal(dray_gguf_get_f32(g, "n", &f, NULL, 0), 0);
    assert_true(f == 7.0f);
    assert_int_equal(dray_gguf_get_f32(g, "f64", &f, NULL, 0), 0);
    assert_true(f > 3e38f); /* inf: an f64 beyond f32 range */
    assert_int_equal(dray_gguf_get_u32(g, "s", &u, err, sizeof(err)), DRAY_EFORMAT);
    assert_non_null(strstr(err, "g.gguf: key 's' has type STRING, expected an integer"));
    assert_int_equal(dray_gguf_get_f32(g, "s", &f, NULL, 0), DRAY_EFORMAT);
    assert_int_equal(dray_gguf_get_bool(g, "n", &b, NULL, 0), DRAY_EFORMAT);
    assert_int_equal(dray_gguf_get_str(g, "n", &s, NULL, 0), DRAY_EFORMAT);
    assert_int_equal(dray_gguf_get_arr(g, "n", DRAY_GGUF_UINT32, &d, &n, err, sizeof(err)),
                     DRAY_EFORMAT);
    assert_non_null(strstr(err, "expected ARRAY of UINT32"));
    assert_int_equal(dray_gguf_get_u32(g, "absent", &u, err, sizeof(err)), DRAY_ENOTFOUND);
    assert_non_null(strstr(err, "'absent' not found"));
    assert_null(dray_gguf_find(g, "absen"));
    assert_null(dray_gguf_kv_at(g, 6));
    assert_null(dray_gguf_tensor_at(g, 0));
    dray_gguf_close(g);
    free(buf);
    dray_gguf_writer_free(w);
}

static void test_gguf_finds_every_key_among_many(void **state)
{
    (void)state;
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    char key[32];
    for (uint32_t i = 0; i < 3000; i++) {
        snprintf(key, sizeof(key), "k.%u", i);
        assert_int_equal(dray_gguf_add_u32(w, key, i * 3), 0);
    }
    void *buf;
    size_t size;
    struct dray_gguf *g;
    assert_int_equal(dray_gguf_writer_to_mem(w, &buf, &size), 0);
    assert_int_equal(dray_gguf_open_mem(buf, size, "many", &g, NULL, 0), 0);
    for (uint32_t i = 0; i < 3000; i++) {
        uint32_t v;
        snprintf(key, sizeof(key), "k.%u", i);
        assert_int_equal(dray_gguf_get_u32(g, key, &v, NULL, 0), 0);
        assert_int_equal(v, i * 3);
        assert_ptr_equal(dray_gguf_find(g, key), dray_gguf_kv_at(g, i));
    }
    assert_null(dray_gguf_find(g, "k.3000"));
    dray_gguf_close(g);
    free(buf);
    dray_gguf_writer_free(w);
}

/* ------------------------------------------------------------ robustness */

static void *valid_file(size_t *size)
{
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    void *buf;
    fill_writer(w);
    assert_int_equal(dray_gguf_writer_to_mem(w, &buf, size), 0);
    dray_gguf_writer_free(w);
    return buf;
}

static void test_gguf_rejects_every_truncation(void **state)
{
    (void)state;
    size_t size;
    void *full = valid_file(&size);
    struct bb b = {full, size, size};
    /* The last tensor's padding is not needed; every cut inside the data is. */
    size_t last_data_end = 0;
    {
        struct opened o = open_n(&b, size);
        assert_int_equal(o.rc, 0);
        for (uint64_t i = 0; i < dray_gguf_n_tensors(o.g); i++) {
            const struct dray_gguf_tensor *t = dray_gguf_tensor_at(o.g, i);
            size_t end = (size_t)((const uint8_t *)t->data - (const uint8_t *)o.buf) + t->nbytes;
            if (end > last_data_end)
                last_data_end = end;
        }
        close_o(&o);
    }
    for (size_t n = 0; n < last_data_end; n++) {
        struct opened o = open_n(&b, n);
        if (o.rc != DRAY_EFORMAT)
            print_error("cut at %zu: rc %d\n", n, o.rc);
        assert_int_equal(o.rc, DRAY_EFORMAT);
        assert_null(o.g);
        assert_non_null(strstr(o.err, "offset "));
        close_o(&o);
    }
    free(full);
}

/* Touch everything a caller could read, so ASan sees any out-of-file pointer. */
static uint64_t read_all(const struct dray_gguf *g)
{
    uint64_t sum = 0;
    for (uint64_t i = 0; i < dray_gguf_n_kv(g); i++) {
        const struct dray_gguf_kv *kv = dray_gguf_kv_at(g, i);
        for (uint64_t k = 0; k < kv->key.len; k++)
            sum += (uint8_t)kv->key.ptr[k];
        if (kv->type == DRAY_GGUF_STRING || (kv->type == DRAY_GGUF_ARRAY &&
                                             kv->arr_type == DRAY_GGUF_STRING)) {
            uint64_t n = kv->type == DRAY_GGUF_STRING ? 1 : kv->arr_n;
            for (uint64_t j = 0; j < n; j++)
                for (uint64_t k = 0; k < kv->strs[j].len; k++)
                    sum += (uint8_t)kv->strs[j].ptr[k];
        }
    }
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++) {
        const struct dray_gguf_tensor *t = dray_gguf_tensor_at(g, i);
        for (uint64_t k = 0; k < t->nbytes; k++)
            sum += ((const uint8_t *)t->data)[k];
        if (dray_ggml_type_supported(t->type) && t->ne[0] && t->ne[0] < 100000) {
            float *row = malloc(t->ne[0] * sizeof(float));
            uint64_t rows = dray_gguf_tensor_nelems(t) / t->ne[0];
            for (uint64_t r = 0; r < rows && r < 64; r++)
                assert_int_equal(dray_gguf_tensor_row_f32(t, r, row), 0);
            free(row);
        }
    }
    return sum;
}

static void test_gguf_survives_random_corruption(void **state)
{
    (void)state;
    size_t size;
    uint8_t *full = valid_file(&size);
    int accepted = 0;
    dray_test_seed(1234);
    for (int iter = 0; iter < 3000; iter++) {
        struct bb b = {malloc(size), size, size};
        memcpy(b.p, full, size);
        int flips = 1 + (int)(dray_test_rand() % 4);
        for (int k = 0; k < flips; k++) {
            /* Most structure is in the first few hundred bytes: aim there. */
            size_t at = dray_test_rand() % (iter & 1 ? size : 400);
            b.p[at] = (uint8_t)(iter & 2 ? dray_test_rand() : b.p[at] ^ (1u << (dray_test_rand() % 8)));
        }
        struct opened o = open_n(&b, b.n);
        if (o.rc == 0) {
            accepted++;
            (void)read_all(o.g);
        } else {
            assert_true(o.rc < 0);
            assert_true(strlen(o.err) > 0);
        }
        close_o(&o);
        free(b.p);
    }
    /* Flips inside tensor data leave the file valid: some must be accepted. */
    assert_true(accepted > 0);
    free(full);
}

static void test_gguf_open_reports_missing_dir_and_empty_files(void **state)
{
    (void)state;
    struct dray_gguf *g = (void *)1;
    char err[256];
    assert_int_equal(dray_gguf_open(dray_test_path("nope.gguf"), &g, err, sizeof(err)),
                     DRAY_ENOTFOUND);
    assert_null(g);
    assert_non_null(strstr(err, "nope.gguf: cannot open"));
    assert_int_equal(dray_gguf_open(dray_test_tmpdir(), &g, err, sizeof(err)), DRAY_EIO);
    assert_non_null(strstr(err, "not a regular file"));
    const char *empty = dray_test_path("empty.gguf");
    assert_int_equal(dray_test_write_file(empty, "", 0), 0);
    assert_int_equal(dray_gguf_open(empty, &g, err, sizeof(err)), DRAY_EFORMAT);
    assert_non_null(strstr(err, "truncated header"));
    assert_null(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_rejects_truncated_header),
        cmocka_unit_test(test_gguf_rejects_bad_magic),
        cmocka_unit_test(test_gguf_rejects_bad_versions),
        cmocka_unit_test(test_gguf_rejects_absurd_counts),
        cmocka_unit_test(test_gguf_rejects_string_past_eof),
        cmocka_unit_test(test_gguf_rejects_empty_and_duplicate_keys),
        cmocka_unit_test(test_gguf_rejects_bad_value_types),
        cmocka_unit_test(test_gguf_rejects_bool_not_0_or_1),
        cmocka_unit_test(test_gguf_rejects_array_longer_than_file),
        cmocka_unit_test(test_gguf_rejects_bad_alignment),
        cmocka_unit_test(test_gguf_rejects_long_or_duplicate_tensor_names),
        cmocka_unit_test(test_gguf_rejects_bad_dims),
        cmocka_unit_test(test_gguf_rejects_ne0_not_multiple_of_block),
        cmocka_unit_test(test_gguf_rejects_misaligned_tensor_offset),
        cmocka_unit_test(test_gguf_rejects_tensor_data_past_eof),
        cmocka_unit_test(test_gguf_accepts_unknown_tensor_type_as_unsupported),
        cmocka_unit_test(test_gguf_honours_general_alignment),
        cmocka_unit_test(test_gguf_writer_round_trips_v3),
        cmocka_unit_test(test_gguf_writer_round_trips_v2),
        cmocka_unit_test(test_gguf_writer_rejects_bad_input),
        cmocka_unit_test(test_gguf_typed_getters_check_range_and_type),
        cmocka_unit_test(test_gguf_finds_every_key_among_many),
        cmocka_unit_test(test_gguf_rejects_every_truncation),
        cmocka_unit_test(test_gguf_survives_random_corruption),
        cmocka_unit_test(test_gguf_open_reports_missing_dir_and_empty_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
