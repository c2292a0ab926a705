/* Architecture dispatch and weight preparation shared by every model file. */
#include "model.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "caps.h"
#include "error.h"
#include "log.h"
#include "quant.h"
#include "prep_cache.h"
#include "round_cache.h"
#include "wformat.h"
#include "dray/backend_util.h"


const char *dray_model_supported(void)
{
    static char list[256];
    if (!list[0])
        for (size_t i = 0; i < dray_n_archs; i++)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
                     dray_archs[i]->name);
    return list;
}

const struct dray_arch *dray_model_arch_of(struct dray_gguf *g)
{
    struct dray_str name;
    char err[8];
    if (dray_gguf_get_str(g, "general.architecture", &name, err, sizeof(err)))
        return NULL;
    for (size_t i = 0; i < dray_n_archs; i++)
        if (dray_str_eq(name, dray_archs[i]->name))
            return dray_archs[i];
    return NULL;
}

/* Why the file's architecture is not one dray runs. */
static int unsupported(struct dray_gguf *g, char *err, size_t errlen)
{
    struct dray_str name;
    if (dray_gguf_get_str(g, "general.architecture", &name, err, errlen))
        return dray_fail(err, errlen, DRAY_EFORMAT,
                         "%s: no general.architecture key: not a model file?", dray_gguf_name(g));
    return dray_fail(err, errlen, DRAY_ENOTSUP,
                     "%s: architecture \"%.*s\" is not supported; dray runs: %s", dray_gguf_name(g),
                     (int)(name.len > 64 ? 64 : name.len), name.ptr, dray_model_supported());
}

int dray_model_load(struct dray_gguf *g, struct dray_device *dev, const struct dray_model_opts *o,
                    const struct dray_arch **arch, struct dray_model **out, char *err, size_t errlen)
{
    *out = NULL;
    if ((*arch = dray_model_arch_of(g)) != NULL)
        return dray_model_load_family(*arch, g, dev, o, out, err, errlen);
    return unsupported(g, err, errlen);
}

int dray_model_check(const struct dray_gguf *gc, char *err, size_t errlen)
{
    struct dray_gguf *g = (struct dray_gguf *)gc; /* the check only reads it */
    const struct dray_arch *a = dray_model_arch_of(g);
    return a ? dray_model_check_family(a, g, err, errlen) : unsupported(g, err, errlen);
}

/* Rows are converted in slabs so a 262144-row embedding never needs a full f32 copy. */
#define SLAB_ROWS 2048u

/* The staging of one weight's preparation (slabs, the whole matrix's neutral
 * arrays), kept from one weight to the next of a load instead of allocated
 * each time: glibc maps a block over 32 MiB afresh at every malloc, and the
 * kernel zeroes it page by page, which was most of an 8B model's warm start
 * (1.48 million page faults). Per thread, so loads on several threads (server
 * replicas) never share it; dray_weight_scratch_free ends a load. */
enum { SCRATCH_F32, SCRATCH_Q, SCRATCH_SC, SCRATCH_CODES, SCRATCH_D, SCRATCH_M, SCRATCH_SUB, SCRATCH_COUNT };
static _Thread_local struct { void *p; size_t cap; } scratch[SCRATCH_COUNT];

static void *scratch_get(int slot, size_t bytes)
{
    if (scratch[slot].cap < bytes) {
        free(scratch[slot].p);
        scratch[slot].p = malloc(bytes);
        scratch[slot].cap = scratch[slot].p ? bytes : 0;
    }
    return scratch[slot].p;
}

static _Thread_local struct dray_load_times load_times;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dray_weight_load_times(struct dray_load_times *out)
{
    *out = load_times;
    memset(&load_times, 0, sizeof(load_times));
}

void dray_weight_scratch_free(void)
{
    for (int i = 0; i < SCRATCH_COUNT; i++) {
        free(scratch[i].p);
        scratch[i].p = NULL;
        scratch[i].cap = 0;
    }
}

/* Zero the outlier columns of f32 rows [n][k], saving them into ow (row-major
 * [n_out][n_outlier], rows row0..row0+n). */
static void split_outliers(float *f32, uint64_t n, uint64_t k, const int32_t *outliers,
                           uint32_t n_outlier, float *ow, uint64_t row0)
{
    for (uint64_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n_outlier; j++) {
            ow[(row0 + i) * n_outlier + j] = f32[i * k + (uint32_t)outliers[j]];
            f32[i * k + (uint32_t)outliers[j]] = 0.0f;
        }
}

struct prep {
    float *f32;        /* [SLAB_ROWS][k] */
    int8_t *q;         /* [SLAB_ROWS][k] (I8, grouped) */
    float *sc;         /* [SLAB_ROWS] (I8), [SLAB_ROWS][k/16] (grouped) */
    /* grouped: the whole matrix in backend.h's layout-neutral form, handed to
     * weight_create once every part is in */
    struct dray_wformat fmt;
    uint8_t *codes;    /* [n_out][k/32][B] */
    void *d, *m;       /* [n_out][k/32] f32 or f16; two-level: [n_out][k/256] f16 */
    uint8_t *sub;      /* two-level: [n_out][k/16] sub-scales (backend.h), else NULL */
    float *ow;         /* [n_out][n_outlier] or NULL */
    const int32_t *outliers;
    uint32_t n_outlier;
    bool group_rows;   /* DRAY_WROLE_GROUP_ROWS */
    /* a 4-bit rounding of a wider tensor: its cache, and whether it had the rows */
    struct dray_round_cache *round;
    bool round_hit;
};

uint64_t dray_rope_pair_row(uint64_t r, uint32_t head_dim)
{
    if (!head_dim)
        return r;
    /* NEOX row (h, j, i) = h*hd + j*hd/2 + i holds stored row h*hd + 2i + j */
    uint64_t h = r / head_dim, e = r % head_dim, half = head_dim / 2;
    return h * head_dim + 2 * (e % half) + e / half;
}

/* n rows of the slab (row-major codes, scales as {d} or {d, m} per group) into
 * the whole matrix's neutral arrays from row `row`. */
static void put_groups(struct prep *p, uint64_t row, uint64_t n, uint64_t k, uint64_t wb)
{
    uint64_t G = k / 32, per = p->fmt.has_min ? 2 : 1; /* p->sc: {d} or {d, m} per group */
    memcpy(p->codes + row * wb, p->q, n * wb);
    for (uint64_t i = 0; i < n * G; i++) {
        uint64_t at = row * G + i;
        float d = p->sc[i * per], m = per == 2 ? p->sc[i * per + 1] : 0.0f;
        if (p->fmt.scale == DRAY_WSCALE_F16) {
            ((uint16_t *)p->d)[at] = dray_f32_to_f16(d);
            if (p->m)
                ((uint16_t *)p->m)[at] = dray_f32_to_f16(m);
        } else {
            ((float *)p->d)[at] = d;
            if (p->m)
                ((float *)p->m)[at] = m;
        }
    }
}

/* Hand the neutral arrays to the device (ABI v3): it packs them its own way. */
static int create_packed(struct dray_device *dev, struct prep *p, struct dray_weight *w, uint32_t uses,
                         const char *name, char *err, size_t errlen)
{
    const struct dray_ops *ops = dev->ops;
    if (!DRAY_HAS(ops, weight_create, 3))
        return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: plugin '%s' has no weight_create (ABI %u)", name,
                         ops->name, ops->version);
    struct dray_weight_desc desc = {.size = sizeof(desc), .format = p->fmt, .n_out = w->n_out, .k = w->k,
                                    .uses = uses, .codes = p->codes, .d = p->d, .m = p->m, .sub = p->sub};
    int rc = ops->weight_create(dev->ctx, &desc, &w->packed, &w->packed_bytes);
    if (rc)
        return dray_fail(err, errlen, rc, "packing %s on %s: %s", name, ops->name, ops->last_error(dev->ctx));
    return 0;
}

/* Rows [i0, i1) of a slab from the file into the slab's arrays (each row its
 * own: two threads split a slab). The first failing row, or -1. */
struct slab_rows {
    const struct dray_gguf_tensor *t;
    struct prep *p;
    uint64_t row0, r, i0, i1; /* row0: the part's first row in the whole matrix */
    uint32_t pair_hd, dtype;
    int rc;
    uint64_t bad_row;
};

static void *convert_rows(void *arg)
{
    struct slab_rows *a = arg;
    const struct dray_gguf_tensor *t = a->t;
    struct prep *p = a->p;
    uint64_t k = t->ne[0];
    bool q8g = p->group_rows || a->dtype == DRAY_Q8G32; /* 8-bit groups: quantized row by row here */
    bool two = p->fmt.super; /* the file's blocks straight into the whole matrix's arrays */
    uint64_t B = dray_util_wformat_group_bytes(p->fmt), S = k / 256;
    for (uint64_t i = a->i0; i < a->i1; i++) {
        uint64_t src = dray_rope_pair_row(a->r + i, a->pair_hd);
        if (two) {
            uint64_t o = a->row0 + a->r + i;
            int rc = dray_gguf_tensor_row_k(t, src, p->codes + o * (k / 32) * B, p->sub + o * (k / 16),
                                            (uint16_t *)p->d + o * S, p->m ? (uint16_t *)p->m + o * S : NULL);
            if (rc) {
                a->rc = rc;
                a->bad_row = src;
                return NULL;
            }
            continue;
        }
        int8_t *q8 = p->q + i * k;
        float *s8 = p->sc + i * (k / 32);
        /* Q8_0 blocks are 8-bit groups already: read straight (exactly what the
         * quantizer would give), else through f32 */
        if (q8g && dray_gguf_tensor_row_q8g(t, src, q8, s8) == 0)
            continue;
        int rc = (a->dtype == DRAY_Q4G32 || a->dtype == DRAY_Q4G32H) && dray_ggml_is_4bit(t->type) /* the file's own codes */
                     ? dray_gguf_tensor_row_q4g(t, src, (uint8_t *)p->q + i * (k / 2), p->sc + i * (k / 16))
                 : a->dtype == DRAY_Q5G32 /* every part is 5-bit: its own codes too */
                     ? dray_gguf_tensor_row_q5g(t, src, (uint8_t *)p->q + i * (k / 32 * 20), p->sc + i * (k / 16))
                     : dray_gguf_tensor_row_f32(t, src, p->f32 + i * k);
        if (rc) {
            a->rc = rc;
            a->bad_row = src;
            return NULL;
        }
        if (q8g)
            dray_quantize_rows_q8g(p->f32 + i * k, 1, k, q8, s8);
    }
    return NULL;
}

/* A slab's n rows, on this thread and one more when the slab is big enough to
 * pay for it: dequantizing and regrouping a wide file (Q6_K into 8-bit groups)
 * was a third of an 8B model's warm start on one thread. */
static int convert_slab(const struct dray_gguf_tensor *t, struct prep *p, uint64_t row0, uint64_t r, uint64_t n,
                        uint32_t pair_hd, uint32_t dtype, uint64_t *bad_row)
{
    struct slab_rows a[2] = {{t, p, row0, r, 0, n / 2, pair_hd, dtype, 0, 0},
                             {t, p, row0, r, n / 2, n, pair_hd, dtype, 0, 0}};
    pthread_t th;
    bool two = n >= 64 && (uint64_t)t->ne[0] * n >= (1u << 20) && pthread_create(&th, NULL, convert_rows, &a[1]) == 0;
    if (!two)
        a[0].i1 = n;
    convert_rows(&a[0]);
    if (two)
        pthread_join(th, NULL);
    for (int j = 0; j < 2; j++)
        if (a[j].rc) {
            *bad_row = a[j].bad_row;
            return a[j].rc;
        }
    return 0;
}

static int upload_part(struct dray_device *dev, const struct dray_gguf_tensor *t, uint32_t pair_hd,
                       uint32_t dtype, struct dray_weight *w, uint32_t row0, struct prep *p,
                       char *err, size_t errlen)
{
    const struct dray_ops *ops = dev->ops;
    uint64_t k = t->ne[0], rows = t->ne[1];
    for (uint64_t r = 0; r < rows; r += SLAB_ROWS) {
        uint64_t n = rows - r < SLAB_ROWS ? rows - r : SLAB_ROWS, src = 0;
        int crc = p->round_hit ? 0 : convert_slab(t, p, row0, r, n, pair_hd, dtype, &src); /* a cache hit needs no source rows */
        if (crc == DRAY_ERANGE) /* dray_gguf_tensor_row_q5g */
            return dray_fail(err, errlen, crc, "tensor %s row %llu: a Q5_0 scale of 4096 or more (or not "
                             "finite) has no 5-bit group form (-16 d beyond f16)", t->name,
                             (unsigned long long)src);
        if (crc)
            return dray_fail(err, errlen, crc, "tensor %s: type %s (%u) cannot be dequantized",
                             t->name, dray_ggml_type_name(t->type) ? dray_ggml_type_name(t->type) : "unknown",
                             t->type);
        uint64_t row = row0 + r;
        int rc;
        if (p->group_rows) { /* row r's group g is table row r*k/32 + g */
            rc = ops->upload(dev->ctx, (struct dray_view){w->w, row * k}, p->q, n * k);
            if (!rc)
                rc = ops->upload(dev->ctx, (struct dray_view){w->scale, row * (k / 32) * 4}, p->sc, n * (k / 32) * 4);
        } else if (p->fmt.super) { /* already in place */
            continue;
        } else if (dray_caps_packed(dtype)) {
            uint64_t wb = dray_util_wrow_bytes(dtype, (uint32_t)k);
            if (p->round_hit)
                dray_round_cache_get(p->round, r, n, (uint8_t *)p->q, p->sc);
            else if (dtype == DRAY_Q4G32 && !dray_ggml_is_4bit(t->type)) /* the 4-bit head: rounds a wider file */
                dray_quantize_rows_q4g(p->f32, n, k, (uint8_t *)p->q, p->sc);
            else if (dtype == DRAY_Q4G32H && !dray_ggml_is_4bit(t->type)) /* the same, fitted to f16 d and m */
                dray_quantize_rows_q4gh(p->f32, n, k, (uint8_t *)p->q, p->sc);
            if (p->round && !p->round_hit)
                dray_round_cache_put(p->round, r, n, (uint8_t *)p->q, p->sc);
            put_groups(p, row, n, k, wb);
            continue;
        } else if (dtype == DRAY_I8) {
            if (p->n_outlier)
                split_outliers(p->f32, n, k, p->outliers, p->n_outlier, p->ow, row);
            dray_quantize_rows_i8(p->f32, n, k, p->q, p->sc);
            rc = ops->upload(dev->ctx, (struct dray_view){w->w, row * k}, p->q, n * k);
            if (!rc)
                rc = ops->upload(dev->ctx, (struct dray_view){w->scale, row * 4}, p->sc, n * 4);
        } else {
            rc = ops->upload(dev->ctx, (struct dray_view){w->w, row * k * 4}, p->f32, n * k * 4);
        }
        if (rc)
            return dray_fail(err, errlen, rc, "uploading %s to %s: %s", t->name, ops->name,
                             ops->last_error(dev->ctx));
    }
    return 0;
}

static int alloc_weight(struct dray_device *dev, struct dray_weight *w, const char *name, char *err,
                        size_t errlen)
{
    const struct dray_ops *ops = dev->ops;
    if (dray_caps_packed(w->dtype)) /* packed by the device: create_packed */
        return 0;
    size_t bytes = (size_t)w->n_out * dray_util_wrow_bytes(w->dtype, w->k);
    size_t sbytes = (size_t)w->n_out * dray_util_wscale_floats(w->dtype, w->k) * 4;
    int rc = ops->alloc(dev->ctx, bytes, &w->w);
    if (!rc && sbytes)
        rc = ops->alloc(dev->ctx, sbytes, &w->scale);
    if (!rc && w->n_outlier)
        rc = ops->alloc(dev->ctx, (size_t)w->n_outlier * 4, &w->outlier_idx);
    if (!rc && w->n_outlier)
        rc = ops->alloc(dev->ctx, (size_t)w->n_out * w->n_outlier * 4, &w->outlier_w);
    if (rc)
        return dray_fail(err, errlen, rc, "device memory for %s (%zu bytes) on %s: %s", name, bytes,
                         ops->name, ops->last_error(dev->ctx));
    return 0;
}

int dray_weight_prepare(struct dray_device *dev, const struct dray_gguf_tensor *const *parts,
                        uint32_t n_parts, enum dray_precision precision, enum dray_wrole role,
                        const int32_t *outliers, uint32_t n_outlier, struct dray_weight *out, char *err,
                        size_t errlen)
{
    return dray_weight_prepare_pairs(dev, parts, n_parts, NULL, precision, role, outliers, n_outlier, out,
                                     err, errlen);
}

/* The prepared-layout cache this thread's loads read and fill (prep_cache.h). */
static _Thread_local struct dray_prep_cache *prep_cache;

void dray_weight_use_prepared(struct dray_prep_cache *c)
{
    prep_cache = c;
}

/* A prepared weight's key: its first tensor, how it was put together, its
 * shape and format. */
static void prep_key(const char *name, uint32_t n_parts, const uint32_t *pair_hd, const struct dray_weight *w,
                     uint32_t uses, char *key, size_t len)
{
    snprintf(key, len, "%.64s|%u|%u|%u|%ux%u|%u", name, n_parts, pair_hd && pair_hd[0] ? pair_hd[0] : 0, w->dtype,
             w->n_out, w->k, uses);
}

/* w from the cache's bytes: 0 done, 1 not there (prepare it), else an error. */
static int import_prepared(struct dray_device *dev, const char *name, uint32_t n_parts, const uint32_t *pair_hd,
                           uint32_t uses, struct dray_weight *w)
{
    char key[160];
    prep_key(name, n_parts, pair_hd, w, uses, key, sizeof(key));
    uint64_t n = 0;
    const void *bytes = dray_prep_cache_find(prep_cache, key, &n);
    if (!bytes)
        return 1;
    double t0 = now_s();
    struct dray_weight_desc d = {.size = sizeof(d), .format = dray_caps_wformat(w->dtype), .n_out = w->n_out,
                                 .k = w->k, .uses = uses};
    int rc = dev->ops->weight_import(dev->ctx, &d, bytes, n, &w->packed, &w->packed_bytes);
    load_times.pack_s += now_s() - t0;
    return rc;
}

/* Whether the parts are best kept apart: together they would take a format
 * that some part does not need (a Q6_K V beside Q4_K Q and K makes the whole
 * Q|K|V 8-bit groups, where apart each stays at its file's size). */
static bool split_parts(struct dray_device *dev, const struct dray_gguf_tensor *const *parts, uint32_t n_parts,
                        enum dray_precision precision, enum dray_wrole role, uint32_t whole)
{
    if (n_parts < 2 || role != DRAY_WROLE_MATMUL || dray_caps_wformat(whole).super)
        return false;
    for (uint32_t i = 0; i < n_parts; i++) {
        struct dray_wpick one;
        dray_wformat_pick(&dev->caps, precision, role, &parts[i], 1, &one);
        if (dray_caps_wformat(one.dtype).super)
            return true;
    }
    return false;
}

static int prepare_split(struct dray_device *dev, const struct dray_gguf_tensor *const *parts, uint32_t n_parts,
                         const uint32_t *pair_hd, enum dray_precision precision, enum dray_wrole role,
                         struct dray_weight *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->split = calloc(n_parts, sizeof(*out->split));
    if (!out->split)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory preparing %s", parts[0]->name);
    out->n_split = n_parts;
    out->k = (uint32_t)parts[0]->ne[0];
    int rc = 0;
    for (uint32_t i = 0; i < n_parts && !rc; i++) {
        rc = dray_weight_prepare_pairs(dev, &parts[i], 1, pair_hd ? &pair_hd[i] : NULL, precision, role, NULL, 0,
                                       &out->split[i], err, errlen);
        out->n_out += out->split[i].n_out;
    }
    out->dtype = out->split[0].dtype;
    if (rc)
        dray_weight_release(dev, out);
    return rc;
}

int dray_weight_matmul(struct dray_device *dev, const struct dray_weight *w, struct dray_matmul_args a)
{
    a.w = (struct dray_view){w->w, 0};
    a.wscale = (struct dray_view){w->scale, 0};
    a.outlier_idx = (struct dray_view){w->outlier_idx, 0};
    a.outlier_w = (struct dray_view){w->outlier_w, 0};
    a.n_outlier = w->n_outlier;
    a.n_out = w->n_out;
    a.k = w->k;
    a.wdtype = w->packed ? DRAY_PACKED : w->dtype;
    a.packed = w->packed;
    if (!w->n_split)
        return dev->ops->matmul(dev->ctx, &a);
    int rc = 0;
    for (uint32_t i = 0; i < w->n_split && !rc; i++) {
        rc = dray_weight_matmul(dev, &w->split[i], a);
        a.out.offset += (size_t)w->split[i].n_out * 4;
    }
    return rc;
}

int dray_weight_prepare_pairs(struct dray_device *dev, const struct dray_gguf_tensor *const *parts,
                              uint32_t n_parts, const uint32_t *pair_hd, enum dray_precision precision,
                              enum dray_wrole role, const int32_t *outliers, uint32_t n_outlier,
                              struct dray_weight *out, char *err, size_t errlen)
{
    uint64_t k = parts[0]->ne[0], n_out = 0;
    struct dray_wpick pick;
    dray_wformat_pick(&dev->caps, precision, role, parts, n_parts, &pick);
    if (split_parts(dev, parts, n_parts, precision, role, pick.dtype))
        return prepare_split(dev, parts, n_parts, pair_hd, precision, role, out, err, errlen);
    uint32_t dtype = pick.dtype, uses = pick.uses;
    bool group_rows = pick.group_rows;
    if (group_rows && k % 32)
        return dray_fail(err, errlen, DRAY_EINVAL, "tensor %s: %llu inputs are not whole groups of 32",
                         parts[0]->name, (unsigned long long)k);
    if (pick.why[0])
        dray_info("%s", pick.why);
    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; i < n_parts; i++) {
        if (pair_hd && pair_hd[i] && (pair_hd[i] % 2 || parts[i]->ne[1] % pair_hd[i]))
            return dray_fail(err, errlen, DRAY_EFORMAT, "tensor %s: %llu rows are not whole heads of %u",
                             parts[i]->name, (unsigned long long)parts[i]->ne[1], pair_hd[i]);
        if (parts[i]->n_dims != 2 || parts[i]->ne[0] != k)
            return dray_fail(err, errlen, DRAY_EFORMAT,
                             "tensor %s: expected a 2-D weight with %llu inputs, got [%llu, %llu]",
                             parts[i]->name, (unsigned long long)k,
                             (unsigned long long)parts[i]->ne[0], (unsigned long long)parts[i]->ne[1]);
        n_out += parts[i]->ne[1];
    }
    if (k > 65536 || n_out > UINT32_MAX)
        return dray_fail(err, errlen, DRAY_ERANGE, "tensor %s: %llu x %llu is too large",
                         parts[0]->name, (unsigned long long)n_out, (unsigned long long)k);
    if (group_rows && n_out * (k / 32) > UINT32_MAX)
        return dray_fail(err, errlen, DRAY_ERANGE, "tensor %s: too many groups of 32 for a gather table",
                         parts[0]->name);
    out->n_out = (uint32_t)(group_rows ? n_out * (k / 32) : n_out);
    out->k = group_rows ? 32u : (uint32_t)k;
    out->dtype = dtype;
    out->n_outlier = dtype == DRAY_I8 && outliers && !group_rows ? n_outlier : 0;
    if (dray_caps_packed(dtype) && prep_cache && !out->n_outlier) {
        int rc = import_prepared(dev, parts[0]->name, n_parts, pair_hd, uses, out);
        if (rc == 0)
            return 0;
        if (rc < 0) /* the file is a cache: prepare it again */
            dray_warn("%s: the prepared layout on %s: %s; preparing it again", parts[0]->name, dev->ops->name,
                      dev->ops->last_error(dev->ctx));
    }
    int quantized = dtype != DRAY_F32;
    struct prep p = {
        .f32 = scratch_get(SCRATCH_F32, SLAB_ROWS * k * sizeof(float)),
        .q = quantized ? scratch_get(SCRATCH_Q, SLAB_ROWS * k) : NULL,
        .sc = scratch_get(SCRATCH_SC, SLAB_ROWS * (k / 16 + 1) * sizeof(float)),
        .fmt = dray_caps_wformat(dtype),
        .ow = out->n_outlier ? malloc(n_out * out->n_outlier * sizeof(float)) : NULL,
        .outliers = outliers,
        .n_outlier = out->n_outlier,
        .group_rows = group_rows,
    };
    if (dray_caps_packed(dtype)) {
        uint64_t groups = n_out * (k / 32), sb = dray_util_wformat_scale_bytes(p.fmt);
        uint64_t scales = n_out * dray_util_wformat_scales_per_row(p.fmt, (uint32_t)k);
        p.codes = scratch_get(SCRATCH_CODES, groups * dray_util_wformat_group_bytes(p.fmt));
        p.d = scratch_get(SCRATCH_D, scales * sb);
        p.m = p.fmt.has_min ? scratch_get(SCRATCH_M, scales * sb) : NULL;
        p.sub = p.fmt.super ? scratch_get(SCRATCH_SUB, n_out * dray_util_wformat_sub_bytes(p.fmt, (uint32_t)k)) : NULL;
    }
    int rc = DRAY_ENOMEM;
    if (!p.f32 || !p.sc || (quantized && !p.q) || (out->n_outlier && !p.ow) ||
        (dray_caps_packed(dtype) && (!p.codes || !p.d || (p.fmt.has_min && !p.m) || (p.fmt.super && !p.sub)))) {
        dray_fail(err, errlen, rc, "out of host memory preparing %s", parts[0]->name);
        goto out;
    }
    for (uint32_t j = 0; j < out->n_outlier; j++)
        if (outliers[j] < 0 || (uint64_t)outliers[j] >= k || (j && outliers[j] <= outliers[j - 1])) {
            rc = dray_fail(err, errlen, DRAY_EINVAL, "%s: outlier channels must increase within 0..%llu",
                           parts[0]->name, (unsigned long long)k - 1);
            goto out;
        }
    /* the 4-bit rounding of a wider tensor is slow and always the same: cached */
    if ((dtype == DRAY_Q4G32 || dtype == DRAY_Q4G32H) && n_parts == 1 && !(pair_hd && pair_hd[0]) &&
        !dray_ggml_is_4bit(parts[0]->type))
        p.round = dray_round_cache_open(parts[0], dtype, &p.round_hit);
    rc = alloc_weight(dev, out, parts[0]->name, err, errlen);
    uint32_t row0 = 0;
    double t0 = now_s();
    for (uint32_t i = 0; i < n_parts && !rc; i++) {
        rc = upload_part(dev, parts[i], pair_hd ? pair_hd[i] : 0, dtype, out, row0, &p, err, errlen);
        dray_gguf_release(parts[i]->file, parts[i]->data, parts[i]->nbytes); /* read once */
        row0 += (uint32_t)parts[i]->ne[1];
    }
    double t1 = now_s();
    load_times.convert_s += t1 - t0;
    if (!rc && dray_caps_packed(dtype))
        rc = create_packed(dev, &p, out, uses, parts[0]->name, err, errlen);
    load_times.pack_s += now_s() - t1;
    if (!rc && out->packed && prep_cache) {
        char key[160];
        prep_key(parts[0]->name, n_parts, pair_hd, out, uses, key, sizeof(key));
        double t2 = now_s();
        dray_prep_cache_put(prep_cache, key, out->packed);
        load_times.store_s += now_s() - t2;
    }
    if (!rc && out->n_outlier) {
        rc = dev->ops->upload(dev->ctx, (struct dray_view){out->outlier_idx, 0}, outliers, out->n_outlier * 4ull);
        if (!rc)
            rc = dev->ops->upload(dev->ctx, (struct dray_view){out->outlier_w, 0}, p.ow,
                                  n_out * out->n_outlier * 4);
        if (rc)
            dray_fail(err, errlen, rc, "uploading outliers of %s to %s: %s", parts[0]->name,
                      dev->ops->name, dev->ops->last_error(dev->ctx));
    }
out:
    dray_round_cache_close(p.round); /* commits only a file with every row */
    free(p.ow); /* the rest is the thread's scratch */
    if (rc)
        dray_weight_release(dev, out);
    return rc;
}

int dray_weight_set_outliers(struct dray_device *dev, const struct dray_gguf_tensor *t,
                             const int32_t *outliers, uint32_t n_outlier, struct dray_weight *w,
                             char *err, size_t errlen)
{
    const struct dray_ops *ops = dev->ops;
    uint64_t k = t->ne[0], rows = t->ne[1];
    if (w->dtype != DRAY_I8 || w->n_outlier || rows != w->n_out || k != w->k || !n_outlier || n_outlier > k)
        return dray_fail(err, errlen, DRAY_EINVAL, "%s: cannot add %u outlier channels here", t->name, n_outlier);
    float *row = malloc(k * sizeof(float)), *ow = malloc(rows * n_outlier * sizeof(float));
    int rc = row && ow ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    for (uint64_t r = 0; !rc && r < rows; r++) {
        rc = dray_gguf_tensor_row_f32(t, r, row);
        for (uint32_t j = 0; !rc && j < n_outlier; j++)
            ow[r * n_outlier + j] = row[(uint32_t)outliers[j]];
    }
    w->n_outlier = n_outlier;
    if (!rc)
        rc = ops->alloc(dev->ctx, (size_t)n_outlier * 4, &w->outlier_idx);
    if (!rc)
        rc = ops->alloc(dev->ctx, rows * n_outlier * 4, &w->outlier_w);
    if (!rc)
        rc = ops->upload(dev->ctx, (struct dray_view){w->outlier_idx, 0}, outliers, (size_t)n_outlier * 4);
    if (!rc)
        rc = ops->upload(dev->ctx, (struct dray_view){w->outlier_w, 0}, ow, rows * n_outlier * 4);
    if (rc) {
        dray_fail(err, errlen, rc, "outlier channels of %s on %s: %s", t->name, ops->name,
                  ops->last_error(dev->ctx));
        if (w->outlier_idx)
            ops->free(dev->ctx, w->outlier_idx);
        if (w->outlier_w)
            ops->free(dev->ctx, w->outlier_w);
        w->outlier_idx = w->outlier_w = NULL;
        w->n_outlier = 0;
    }
    free(row);
    free(ow);
    return rc;
}

/* Scores are compared in buckets of ~1.1% (1/64 of an octave), ties going to the
 * lower channel: every plugin computes the calibration activations in its own
 * summation order, and channels that differ by less than that must not be picked
 * differently on different devices. */
static int score_bucket(float s)
{
    return s > 0 ? (int)floorf(log2f(s) * 64.0f) : INT32_MIN;
}

int dray_pick_outliers(const float *score, uint32_t k, uint32_t n, int32_t *out)
{
    /* n is small (tens): repeated selection over a taken-mask is plenty */
    uint8_t *taken = calloc(k, 1);
    if (!taken)
        return DRAY_ENOMEM;
    for (uint32_t m = 0; m < n && m < k; m++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t c = 0; c < k; c++)
            if (!taken[c] && (best == UINT32_MAX || score_bucket(score[c]) > score_bucket(score[best])))
                best = c;
        taken[best] = 1;
    }
    for (uint32_t c = 0, j = 0; c < k; c++)
        if (taken[c])
            out[j++] = (int32_t)c;
    free(taken);
    return 0;
}

void dray_weight_release(struct dray_device *dev, struct dray_weight *w)
{
    for (uint32_t i = 0; i < w->n_split; i++)
        dray_weight_release(dev, &w->split[i]);
    free(w->split);
    w->split = NULL;
    w->n_split = 0;
    if (w->packed)
        dev->ops->weight_free(dev->ctx, w->packed);
    w->packed = NULL;
    w->packed_bytes = 0;
    if (w->w)
        dev->ops->free(dev->ctx, w->w);
    if (w->scale)
        dev->ops->free(dev->ctx, w->scale);
    if (w->outlier_idx)
        dev->ops->free(dev->ctx, w->outlier_idx);
    if (w->outlier_w)
        dev->ops->free(dev->ctx, w->outlier_w);
    w->w = w->scale = w->outlier_idx = w->outlier_w = NULL;
    w->n_outlier = 0;
}

int dray_vector_prepare(struct dray_device *dev, const struct dray_gguf_tensor *t, uint32_t n,
                        struct dray_buf **out, char *err, size_t errlen)
{
    *out = NULL;
    if (dray_gguf_tensor_nelems(t) != n)
        return dray_fail(err, errlen, DRAY_EFORMAT, "tensor %s: expected %u elements, got %llu",
                         t->name, n, (unsigned long long)dray_gguf_tensor_nelems(t));
    float *v = malloc((size_t)n * sizeof(float));
    if (!v)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    int rc = dray_dequant_row(t->type, t->data, v, n);
    if (rc) {
        free(v);
        return dray_fail(err, errlen, rc, "tensor %s: type %u cannot be dequantized", t->name,
                         t->type);
    }
    rc = dev->ops->alloc(dev->ctx, (size_t)n * 4, out);
    if (!rc)
        rc = dev->ops->upload(dev->ctx, (struct dray_view){*out, 0}, v, (size_t)n * 4);
    free(v);
    if (rc) {
        if (*out)
            dev->ops->free(dev->ctx, *out);
        *out = NULL;
        return dray_fail(err, errlen, rc, "uploading %s to %s: %s", t->name, dev->ops->name,
                         dev->ops->last_error(dev->ctx));
    }
    return 0;
}
