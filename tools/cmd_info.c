/* dray info FILE [-v] [--dump-tensor NAME [--rows A:B]]
 * Describes a GGUF file: format, architecture, size, parameter and type counts,
 * the main hyper-parameters and whether dray runs it (and if not, why); -v adds
 * the metadata and the tensor table.
 * --dump-tensor prints rows A..B-1 (default all) of a tensor dequantized to f32,
 * one value per line with 9 significant digits (enough to round-trip an f32), so
 * tests/reference/check_dequant.py can compare them with an independent decoder.
 * Uses the public GGUF reader (dray/gguf.h): no engine, no device. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "dray/dray.h"
#include "dray/gguf.h"

struct info_opts {
    const char *path;
    bool verbose;
    const char *dump;      /* tensor name or NULL */
    const char *rows;      /* "A:B" or NULL */
};

static void info_usage(FILE *f)
{
    fprintf(f, "usage: dray info FILE [-v] [--dump-tensor NAME [--rows A:B]]\n"
               "  -v                 also list metadata and tensors (type, dims, offset)\n"
               "  --dump-tensor NAME print the tensor's values as f32, one per line\n"
               "  --rows A:B         only rows A..B-1 (a row is ne[0] values)\n");
}

static int parse_opts(int argc, char **argv, struct info_opts *o)
{
    memset(o, 0, sizeof(*o));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            info_usage(stdout);
            return 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbose = true;
        } else if (!strcmp(a, "--dump-tensor") && i + 1 < argc) {
            o->dump = argv[++i];
        } else if (!strcmp(a, "--rows") && i + 1 < argc) {
            o->rows = argv[++i];
        } else if (a[0] == '-' || o->path) {
            fprintf(stderr, "dray info: unexpected argument '%s'\n", a);
            return -1;
        } else {
            o->path = a;
        }
    }
    if (!o->path || (o->rows && !o->dump)) {
        fprintf(stderr, "dray info: %s\n", o->path ? "--rows needs --dump-tensor" : "no FILE");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ summary */

/* 268098176 -> "268,098,176" */
static const char *commas(uint64_t v, char *buf, size_t n)
{
    char tmp[32];
    int len = snprintf(tmp, sizeof(tmp), "%" PRIu64, v), o = 0;
    for (int i = 0; i < len && o + 2 < (int)n; i++) {
        if (i && (len - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
    return buf;
}

static void print_str(struct dray_str s, uint64_t max)
{
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch < 0x20 || ch == 0x7f || ch == '"' || ch == '\\')
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    printf(s.len > max ? "\"..." : "\"");
}

/* Print "<arch>.<suffix>" as an integer row of the summary, if present. */
static void print_hparam(const struct dray_gguf *g, struct dray_str arch, const char *label,
                         const char *suffix)
{
    char key[256];
    int64_t v;
    snprintf(key, sizeof(key), "%.*s.%s", (int)(arch.len < 128 ? arch.len : 128), arch.ptr, suffix);
    if (!dray_gguf_get_i64(g, key, &v, NULL, 0))
        printf("%-18s %" PRId64 "\n", label, v);
}

static void print_types(const struct dray_gguf *g)
{
    uint64_t count[64] = {0}, other = 0;
    printf("%-18s", "tensor types");
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++) {
        uint32_t t = dray_gguf_tensor_at(g, i)->type;
        if (t < 64)
            count[t]++;
        else
            other++;
    }
    for (uint32_t t = 0; t < 64; t++) {
        if (!count[t])
            continue;
        const char *name = dray_ggml_type_name(t);
        if (name)
            printf(" %s %" PRIu64 "%s", name, count[t],
                   dray_ggml_type_supported(t) ? "" : " (unsupported)");
        else
            printf(" type#%u %" PRIu64 " (unknown)", t, count[t]);
    }
    if (other)
        printf(" type>=64 %" PRIu64 " (unknown)", other);
    printf("\n");
}

static void print_summary(const struct dray_gguf *g)
{
    char b[40];
    struct dray_str arch = {"?", 1}, name;
    uint64_t params = 0;
    uint32_t align = 32;
    bool params_over = false; /* tensors of unknown types have unchecked sizes */
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g) && !params_over; i++)
        params_over = __builtin_add_overflow(params, dray_gguf_tensor_nelems(dray_gguf_tensor_at(g, i)),
                                             &params);
    dray_gguf_get_str(g, "general.architecture", &arch, NULL, 0);
    dray_gguf_get_u32(g, "general.alignment", &align, NULL, 0);
    printf("%-18s %s\n", "file", dray_gguf_name(g));
    printf("%-18s %s bytes (%.1f MiB)\n", "file size", commas(dray_gguf_file_size(g), b, sizeof(b)),
           (double)dray_gguf_file_size(g) / (1024.0 * 1024.0));
    printf("%-18s %" PRIu32 " (alignment %" PRIu32 ")\n", "GGUF version", dray_gguf_version(g),
           align);
    printf("%-18s %.*s\n", "architecture", (int)arch.len, arch.ptr);
    if (!dray_gguf_get_str(g, "general.name", &name, NULL, 0))
        printf("%-18s %.*s\n", "name", (int)(name.len < 200 ? name.len : 200), name.ptr);
    printf("%-18s %" PRIu64 "\n", "metadata keys", dray_gguf_n_kv(g));
    printf("%-18s %" PRIu64 "\n", "tensors", dray_gguf_n_tensors(g));
    if (params_over)
        printf("%-18s more than 2^64 (tensors of unknown types claim huge sizes)\n", "parameters");
    else
        printf("%-18s %s (%.1fM)\n", "parameters", commas(params, b, sizeof(b)), (double)params / 1e6);
    print_types(g);
    print_hparam(g, arch, "context length", "context_length");
    print_hparam(g, arch, "embedding length", "embedding_length");
    print_hparam(g, arch, "layers", "block_count");
    print_hparam(g, arch, "heads", "attention.head_count");
    print_hparam(g, arch, "kv heads", "attention.head_count_kv");
    char why[512];
    if (dray_model_check(g, why, sizeof(why)))
        printf("runs with dray : no: %s\n", why);
    else
        printf("runs with dray : yes\n");
}

/* ------------------------------------------------------------ -v */

static void print_scalar(uint32_t type, const void *p)
{
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            uint64_t u64; int64_t i64; float f; double d; } v;
    static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    memcpy(&v, p, sz[type]); /* type is a checked fixed-size type */
    switch (type) {
    case DRAY_GGUF_UINT8: printf("%u", v.u8); break;
    case DRAY_GGUF_INT8: printf("%d", v.i8); break;
    case DRAY_GGUF_UINT16: printf("%u", v.u16); break;
    case DRAY_GGUF_INT16: printf("%d", v.i16); break;
    case DRAY_GGUF_UINT32: printf("%" PRIu32, v.u32); break;
    case DRAY_GGUF_INT32: printf("%" PRId32, v.i32); break;
    case DRAY_GGUF_FLOAT32: printf("%.9g", v.f); break;
    case DRAY_GGUF_BOOL: printf("%s", v.u8 ? "true" : "false"); break;
    case DRAY_GGUF_UINT64: printf("%" PRIu64, v.u64); break;
    case DRAY_GGUF_INT64: printf("%" PRId64, v.i64); break;
    case DRAY_GGUF_FLOAT64: printf("%.17g", v.d); break;
    }
}

static const char *vtname(uint32_t t)
{
    static const char *const n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                    "str", "arr", "u64", "i64", "f64"};
    return t < sizeof(n) / sizeof(n[0]) ? n[t] : "?";
}

static void print_kv(const struct dray_gguf_kv *kv)
{
    static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    printf("  %-44.*s ", (int)(kv->key.len < 200 ? kv->key.len : 200), kv->key.ptr);
    if (kv->type == DRAY_GGUF_STRING) {
        printf("str  ");
        print_str(*kv->strs, 60);
    } else if (kv->type == DRAY_GGUF_ARRAY) {
        printf("arr[%s x %" PRIu64 "] ", vtname(kv->arr_type), kv->arr_n);
        for (uint64_t i = 0; i < kv->arr_n && i < 4; i++) {
            printf(i ? ", " : "");
            if (kv->arr_type == DRAY_GGUF_STRING)
                print_str(kv->strs[i], 20);
            else
                print_scalar(kv->arr_type, (const uint8_t *)kv->data + i * sz[kv->arr_type]);
        }
        printf(kv->arr_n > 4 ? ", ..." : "");
    } else {
        printf("%-4s ", vtname(kv->type));
        print_scalar(kv->type, kv->data);
    }
    printf("\n");
}

static void print_verbose(const struct dray_gguf *g)
{
    printf("\nmetadata:\n");
    for (uint64_t i = 0; i < dray_gguf_n_kv(g); i++)
        print_kv(dray_gguf_kv_at(g, i));
    printf("\ntensors:\n  %-5s %-36s %-8s %-26s %12s %12s\n", "#", "name", "type", "dims",
           "offset", "bytes");
    for (uint64_t i = 0; i < dray_gguf_n_tensors(g); i++) {
        const struct dray_gguf_tensor *t = dray_gguf_tensor_at(g, i);
        char dims[96], tn[16];
        int o = snprintf(dims, sizeof(dims), "[");
        for (uint32_t d = 0; d < t->n_dims; d++)
            o += snprintf(dims + o, sizeof(dims) - (size_t)o, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
        snprintf(dims + o, sizeof(dims) - (size_t)o, "]");
        const char *name = dray_ggml_type_name(t->type);
        if (!name)
            snprintf(tn, sizeof(tn), "#%" PRIu32 "?", t->type);
        printf("  %-5" PRIu64 " %-36s %-8s %-26s %12" PRIu64 " %12" PRIu64 "\n", i, t->name,
               name ? name : tn, dims, t->offset, t->nbytes);
    }
}

/* ------------------------------------------------------------ --dump-tensor */

/* "A:B", "A:", ":B" or "A" against n rows -> [*a, *b). */
static int parse_rows(const char *s, uint64_t n, uint64_t *a, uint64_t *b)
{
    char *end;
    *a = 0;
    *b = n;
    if (!s)
        return 0;
    if (*s != ':') {
        if (!isdigit((unsigned char)*s)) /* strtoull takes signs and spaces */
            return -1;
        *a = strtoull(s, &end, 10);
        s = end;
        *b = *s ? *b : *a + 1;
    }
    if (*s == ':' && s[1]) {
        if (!isdigit((unsigned char)s[1]))
            return -1;
        errno = 0;
        *b = strtoull(s + 1, &end, 10);
        if (*end || errno)
            return -1;
    } else if (*s && strcmp(s, ":")) {
        return -1;
    }
    return *a <= *b && *b <= n ? 0 : -1;
}

static int dump_tensor(const struct dray_gguf *g, const char *name, const char *rows)
{
    const struct dray_gguf_tensor *t = dray_gguf_find_tensor(g, name);
    uint64_t a, b, n_rows;
    if (!t) {
        fprintf(stderr, "dray info: %s: no tensor named '%s'\n", dray_gguf_name(g), name);
        return 1;
    }
    if (!dray_ggml_type_supported(t->type)) {
        const char *tn = dray_ggml_type_name(t->type);
        fprintf(stderr, "dray info: tensor '%s' has ggml type %" PRIu32 " (%s), which dray "
                "cannot dequantize\n", name, t->type, tn ? tn : "unknown");
        return 1;
    }
    n_rows = t->ne[0] ? dray_gguf_tensor_nelems(t) / t->ne[0] : 0;
    if (parse_rows(rows, n_rows, &a, &b)) {
        fprintf(stderr, "dray info: bad --rows '%s': tensor '%s' has %" PRIu64 " rows, expected "
                "A:B with A <= B <= %" PRIu64 "\n", rows, name, n_rows, n_rows);
        return 2;
    }
    /* One row of f32: ne[0] comes from the file, so the byte count is checked. */
    size_t row_bytes;
    float *buf = NULL;
    if (__builtin_mul_overflow(t->ne[0] ? t->ne[0] : 1, sizeof(float), &row_bytes) ||
        !(buf = malloc(row_bytes))) {
        fprintf(stderr, "dray info: no memory for one row of tensor '%s' (%" PRIu64 " f32 "
                "values)\n", name, t->ne[0]);
        return 1;
    }
    static char obuf[1 << 16];
    setvbuf(stdout, obuf, _IOFBF, sizeof(obuf));
    int rc = 0;
    for (uint64_t r = a; r < b && !rc; r++) {
        if ((rc = dray_gguf_tensor_row_f32(t, r, buf)))
            break;
        for (uint64_t i = 0; i < t->ne[0]; i++)
            printf("%.9g\n", buf[i]);
    }
    free(buf);
    if (rc)
        fprintf(stderr, "dray info: dequantizing '%s': %s\n", name, dray_strerror(rc));
    return rc ? 1 : (fflush(stdout) ? 1 : 0);
}

int dray_cmd_info(int argc, char **argv)
{
    struct info_opts o;
    struct dray_gguf *g;
    char err[512];
    int rc = parse_opts(argc, argv, &o);
    if (rc) {
        if (rc < 0)
            info_usage(stderr);
        return rc < 0 ? 2 : 0;
    }
    if (dray_gguf_open(o.path, &g, err, sizeof(err))) {
        fprintf(stderr, "dray info: %s\n", err);
        return 1;
    }
    if (o.dump) {
        rc = dump_tensor(g, o.dump, o.rows);
    } else {
        print_summary(g);
        if (o.verbose)
            print_verbose(g);
    }
    dray_gguf_close(g);
    return rc;
}
