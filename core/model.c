/* Architecture dispatch and weight preparation shared by every model file. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

static const struct dray_arch *const archs[] = {&dray_arch_gemma3};
#define N_ARCHS (sizeof(archs) / sizeof(archs[0]))

const char *dray_model_supported(void)
{
    static char list[256];
    if (!list[0])
        for (size_t i = 0; i < N_ARCHS; i++)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
                     archs[i]->name);
    return list;
}

int dray_model_load(struct dray_gguf *g, struct dray_device *dev, const struct dray_model_opts *o,
                    const struct dray_arch **arch, struct dray_model **out, char *err, size_t errlen)
{
    struct dray_str name;
    *out = NULL;
    if (dray_gguf_get_str(g, "general.architecture", &name, err, errlen))
        return dray_fail(err, errlen, DRAY_EFORMAT,
                         "%s: no general.architecture key: not a model file?", dray_gguf_name(g));
    for (size_t i = 0; i < N_ARCHS; i++) {
        if (dray_str_eq(name, archs[i]->name)) {
            *arch = archs[i];
            return archs[i]->load(g, dev, o, out, err, errlen);
        }
    }
    return dray_fail(err, errlen, DRAY_ENOTSUP, "%s: architecture %.*s is not supported (supported: %s)",
                     dray_gguf_name(g), (int)(name.len > 64 ? 64 : name.len), name.ptr,
                     dray_model_supported());
}

/* Rows are converted in slabs so a 262144-row embedding never needs a full f32 copy. */
#define SLAB_ROWS 2048u

static int upload_part(struct dray_device *dev, const struct dray_gguf_tensor *t, uint32_t dtype,
                       struct dray_weight *w, uint32_t row0, float *f32, int8_t *q, float *sc,
                       char *err, size_t errlen)
{
    const struct dray_ops *ops = dev->ops;
    uint64_t k = t->ne[0], rows = t->ne[1];
    for (uint64_t r = 0; r < rows; r += SLAB_ROWS) {
        uint64_t n = rows - r < SLAB_ROWS ? rows - r : SLAB_ROWS;
        for (uint64_t i = 0; i < n; i++) {
            int rc = dray_gguf_tensor_row_f32(t, r + i, f32 + i * k);
            if (rc)
                return dray_fail(err, errlen, rc, "tensor %s: type %s (%u) cannot be dequantized",
                                 t->name, dray_ggml_type_name(t->type) ? dray_ggml_type_name(t->type) : "unknown",
                                 t->type);
        }
        uint64_t row = row0 + r;
        int rc;
        if (dtype == DRAY_I8) {
            dray_quantize_rows_i8(f32, n, k, q, sc);
            rc = ops->upload(dev->ctx, (struct dray_view){w->w, row * k}, q, n * k);
            if (!rc)
                rc = ops->upload(dev->ctx, (struct dray_view){w->scale, row * 4}, sc, n * 4);
        } else {
            rc = ops->upload(dev->ctx, (struct dray_view){w->w, row * k * 4}, f32, n * k * 4);
        }
        if (rc)
            return dray_fail(err, errlen, rc, "uploading %s: %s", t->name,
                             ops->last_error(dev->ctx));
    }
    return 0;
}

int dray_weight_prepare(struct dray_device *dev, const struct dray_gguf_tensor *const *parts,
                        uint32_t n_parts, uint32_t dtype, struct dray_weight *out, char *err,
                        size_t errlen)
{
    const struct dray_ops *ops = dev->ops;
    uint64_t k = parts[0]->ne[0], n_out = 0;
    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; i < n_parts; i++) {
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
    out->n_out = (uint32_t)n_out;
    out->k = (uint32_t)k;
    out->dtype = dtype;
    size_t esz = dtype == DRAY_I8 ? 1 : 4;
    float *f32 = malloc(SLAB_ROWS * k * sizeof(float));
    int8_t *q = dtype == DRAY_I8 ? malloc(SLAB_ROWS * k) : NULL;
    float *sc = malloc(SLAB_ROWS * sizeof(float));
    int rc = DRAY_ENOMEM;
    if (!f32 || !sc || (dtype == DRAY_I8 && !q)) {
        dray_fail(err, errlen, rc, "out of host memory preparing %s", parts[0]->name);
        goto out;
    }
    rc = ops->alloc(dev->ctx, n_out * k * esz, &out->w);
    if (!rc && dtype == DRAY_I8)
        rc = ops->alloc(dev->ctx, n_out * 4, &out->scale);
    if (rc) {
        dray_fail(err, errlen, rc, "device memory for %s (%llu bytes): %s", parts[0]->name,
                  (unsigned long long)(n_out * k * esz), ops->last_error(dev->ctx));
        goto out;
    }
    uint32_t row0 = 0;
    for (uint32_t i = 0; i < n_parts && !rc; i++) {
        rc = upload_part(dev, parts[i], dtype, out, row0, f32, q, sc, err, errlen);
        row0 += (uint32_t)parts[i]->ne[1];
    }
out:
    free(f32);
    free(q);
    free(sc);
    if (rc)
        dray_weight_release(dev, out);
    return rc;
}

void dray_weight_release(struct dray_device *dev, struct dray_weight *w)
{
    if (w->w)
        dev->ops->free(dev->ctx, w->w);
    if (w->scale)
        dev->ops->free(dev->ctx, w->scale);
    w->w = w->scale = NULL;
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
        return dray_fail(err, errlen, rc, "uploading %s: %s", t->name, dev->ops->last_error(dev->ctx));
    }
    return 0;
}
