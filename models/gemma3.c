/*
 * Gemma 3 (text) — hyper-parameters from GGUF metadata, weights prepared for the
 * device, and the forward pass written as calls into the operator table.
 * Facts: ../shared/reference/gemma3-gguf.md §5. In PyTorch terms, per layer:
 *
 *   h = rmsnorm(x, attn_norm)
 *   q, k, v = Wq h, Wk h, Wv h;  q = rmsnorm_head(q, q_norm); k = rmsnorm_head(k, k_norm)
 *   q, k = rope(q, pos), rope(k, pos)       # NEOX; base 10k local, freq_base global
 *   a = attention(q, K, V, window if local) # MQA: every q head reads the one kv head
 *   x = x + rmsnorm(Wo a, post_attention_norm)
 *   h = rmsnorm(x, ffn_norm)
 *   x = x + rmsnorm(Wdown (gelu_tanh(Wgate h) * Wup h), post_ffw_norm)
 *
 * then logits = Wembd rmsnorm(x, output_norm) (tied embeddings), with the token
 * embedding scaled by sqrt(n_embd) on the way in.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "hparams.h"
#include "log.h"
#include "model.h"

/* The one hyper-parameter the file does not state: llama.cpp and HF both use a
 * RoPE base of 10000 on sliding-window layers (HF rope_local_base_freq). */
#define GEMMA3_ROPE_BASE_LOCAL 10000.0f
/* Gemma 3 alternates 5 sliding-window layers with 1 global layer. */
#define GEMMA3_SWA_PATTERN 6
/* Logits are produced in slabs of this many rows (1 MiB of f32 each at 262144 vocab). */
#define LOGIT_SLAB 32u

struct layer {
    struct dray_buf *attn_norm, *q_norm, *k_norm; /* F32 [n_embd], [head_dim], [head_dim] */
    struct dray_buf *post_attn_norm, *ffn_norm, *post_ffw_norm; /* F32 [n_embd] */
    struct dray_weight wqkv;  /* [(n_head + 2 n_kv_head) head_dim][n_embd]: Q rows, K rows, V rows */
    struct dray_weight wo;    /* [n_embd][n_head head_dim] */
    struct dray_weight wgu;   /* [2 n_ff][n_embd]: gate rows then up rows */
    struct dray_weight wdown; /* [n_embd][n_ff] */
    float rope_base;
    uint32_t window;          /* 0 = global */
};

/* Activations, each sized for max_batch tokens; rows are tokens. */
struct acts {
    struct dray_buf *x;      /* F32 [T][n_embd]  residual stream */
    struct dray_buf *h;      /* F32 [T][n_embd]  normed input of a block */
    struct dray_buf *qkv;    /* F32 [T][q_dim + 2 kv_dim] */
    struct dray_buf *att;    /* F32 [T][q_dim]   attention output */
    struct dray_buf *o;      /* F32 [T][n_embd]  block output before the residual add */
    struct dray_buf *gu;     /* F32 [T][2 n_ff]  gate | up */
    struct dray_buf *mid;    /* F32 [T][n_ff]    gelu(gate) * up */
    struct dray_buf *meta;   /* I32 [2][T]       token ids, positions */
    struct dray_buf *xl;     /* F32 [LOGIT_SLAB][n_embd] rows whose logits are wanted */
    struct dray_buf *logits; /* F32 [LOGIT_SLAB][n_vocab] */
};

struct dray_model {
    struct dray_model_info info;
    struct dray_device *dev;
    float eps, embd_scale, attn_scale;
    uint32_t q_dim, kv_dim, qkv_dim;
    uint32_t max_batch;
    struct dray_weight embd;          /* [n_vocab][n_embd]: embedding table and output head */
    struct dray_buf *output_norm;
    struct acts a;
    int32_t *meta_host;               /* [2][max_batch] staging for ids and positions */
    struct layer *layer;              /* [n_layer] */
    struct dray_gguf *g;              /* the file, for re-preparing weights after calibration */
    /* while calibrating: largest |x| per input channel of each layer matmul,
     * [n_layer][MM_COUNT][calib_k], and a host copy of one matmul input */
    float *calib, *calib_host;
    uint32_t calib_k;
};

/* ------------------------------------------------------------ hyper-parameters */

/* Every number is range-checked (core/hparams.c): it sizes buffers and loops, and a
 * NaN epsilon or a 4e9-token context must be an error naming the key, not a model
 * that emits token 0 or a 7.9 GB allocation. */
static int read_hparams(struct dray_model *m, struct dray_gguf *g, float *rope_base, char *err,
                        size_t errlen)
{
    static const char *const A = "gemma3";
    struct dray_model_info *in = &m->info;
    uint32_t key_len, val_len, window;
    int rc = dray_hparam_u32(g, A, "block_count", 1, DRAY_MAX_LAYERS, NULL, &in->n_layer, err,
                             errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "embedding_length", 1, DRAY_HP_MAX_EMBD, NULL, &in->n_embd,
                                  err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "feed_forward_length", 1, DRAY_HP_MAX_FF, NULL, &in->n_ff,
                                  err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "attention.head_count", 1, DRAY_HP_MAX_HEADS, NULL,
                                  &in->n_head, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "attention.head_count_kv", 1, DRAY_HP_MAX_HEADS, NULL,
                                  &in->n_kv_head, err, errlen);
    if (!rc) rc = dray_hparam_divides(g, A, "attention.head_count_kv", in->n_kv_head,
                                      "attention.head_count", in->n_head, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "attention.key_length", 2, DRAY_HP_MAX_HEAD_DIM, NULL,
                                  &key_len, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "attention.value_length", 2, DRAY_HP_MAX_HEAD_DIM, NULL,
                                  &val_len, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "context_length", 1, DRAY_HP_MAX_CONTEXT, NULL,
                                  &in->n_ctx_train, err, errlen);
    if (!rc) rc = dray_hparam_u32(g, A, "attention.sliding_window", 1, DRAY_HP_MAX_CONTEXT, NULL,
                                  &window, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, A, "attention.layer_norm_rms_epsilon", 1e-12f, 1.0f, NULL,
                                  &m->eps, err, errlen);
    if (!rc) rc = dray_hparam_f32(g, A, "rope.freq_base", 1.0f, 1e10f, NULL, rope_base, err,
                                  errlen);
    if (rc)
        return rc;
    /* RoPE rotates pairs; one attention kernel serves K and V of one width */
    if (key_len != val_len || key_len % 2)
        return dray_fail(err, errlen, DRAY_EFORMAT,
                         "%s: metadata keys gemma3.attention.key_length = %u and value_length = "
                         "%u, expected equal even numbers", dray_gguf_name(g), key_len, val_len);
    in->head_dim = key_len;
    for (uint32_t il = 0; il < in->n_layer; il++) {
        in->window[il] = il % GEMMA3_SWA_PATTERN < GEMMA3_SWA_PATTERN - 1 ? window : 0;
        in->share_kv[il] = -1;
    }
    struct dray_str name;
    if (!dray_gguf_get_str(g, "general.name", &name, NULL, 0))
        snprintf(in->name, sizeof(in->name), "%.*s", (int)(name.len > 127 ? 127 : name.len), name.ptr);
    return 0;
}

/* ------------------------------------------------------------------- weights */

static const struct dray_gguf_tensor *tensor(struct dray_gguf *g, int il, const char *what,
                                             char *err, size_t errlen)
{
    char name[64];
    if (il < 0)
        snprintf(name, sizeof(name), "%s.weight", what);
    else
        snprintf(name, sizeof(name), "blk.%d.%s.weight", il, what);
    const struct dray_gguf_tensor *t = dray_gguf_find_tensor(g, name);
    if (!t)
        dray_fail(err, errlen, DRAY_ENOTFOUND, "%s: tensor %s is missing", dray_gguf_name(g), name);
    return t;
}

static int check_shape(struct dray_gguf *g, const struct dray_gguf_tensor *t, uint64_t ne0,
                       uint64_t ne1, char *err, size_t errlen)
{
    if (t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1)
        return 0;
    return dray_fail(err, errlen, DRAY_EFORMAT, "%s: tensor %s has shape [%llu, %llu], expected [%llu, %llu]",
                     dray_gguf_name(g), t->name, (unsigned long long)t->ne[0],
                     (unsigned long long)t->ne[1], (unsigned long long)ne0, (unsigned long long)ne1);
}

static int load_vector(struct dray_model *m, struct dray_gguf *g, int il, const char *what,
                       uint32_t n, struct dray_buf **out, char *err, size_t errlen)
{
    const struct dray_gguf_tensor *t = tensor(g, il, what, err, errlen);
    if (!t)
        return DRAY_ENOTFOUND;
    return dray_vector_prepare(m->dev, t, n, out, err, errlen);
}

/* Stack named weights of layer il along the output dimension into one matmul. */
static int load_matrix(struct dray_model *m, struct dray_gguf *g, int il, const char *const *names,
                       const uint32_t *rows, uint32_t n, uint32_t k, struct dray_weight *w,
                       uint32_t dtype, const int32_t *outliers, uint32_t n_outlier, char *err,
                       size_t errlen)
{
    const struct dray_gguf_tensor *parts[4];
    for (uint32_t i = 0; i < n; i++) {
        parts[i] = tensor(g, il, names[i], err, errlen);
        if (!parts[i])
            return DRAY_ENOTFOUND;
        int rc = check_shape(g, parts[i], k, rows[i], err, errlen);
        if (rc)
            return rc;
    }
    return dray_weight_prepare(m->dev, parts, n, dtype, outliers, n_outlier, w, err, errlen);
}

/* The four matmuls of a layer, in the order calibration records their inputs. */
enum { MM_QKV, MM_O, MM_GU, MM_DOWN, MM_COUNT };

static int load_layer_matrix(struct dray_model *m, struct dray_gguf *g, uint32_t il, int which,
                             uint32_t dtype, const int32_t *outliers, uint32_t n_outlier, char *err,
                             size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    struct layer *L = &m->layer[il];
    static const char *const qkv[] = {"attn_q", "attn_k", "attn_v"};
    static const char *const gate_up[] = {"ffn_gate", "ffn_up"};
    static const char *const o[] = {"attn_output"}, *const down[] = {"ffn_down"};
    const uint32_t qkv_rows[] = {m->q_dim, m->kv_dim, m->kv_dim};
    const uint32_t gu_rows[] = {in->n_ff, in->n_ff};
    switch (which) {
    case MM_QKV:
        return load_matrix(m, g, (int)il, qkv, qkv_rows, 3, in->n_embd, &L->wqkv, dtype, outliers, n_outlier, err, errlen);
    case MM_O:
        return load_matrix(m, g, (int)il, o, &in->n_embd, 1, m->q_dim, &L->wo, dtype, outliers, n_outlier, err, errlen);
    case MM_GU:
        return load_matrix(m, g, (int)il, gate_up, gu_rows, 2, in->n_embd, &L->wgu, dtype, outliers, n_outlier, err, errlen);
    default:
        return load_matrix(m, g, (int)il, down, &in->n_embd, 1, in->n_ff, &L->wdown, dtype, outliers, n_outlier, err, errlen);
    }
}

static struct dray_weight *layer_matrix(struct layer *L, int which)
{
    struct dray_weight *w[MM_COUNT] = {&L->wqkv, &L->wo, &L->wgu, &L->wdown};
    return w[which];
}

static int load_layer(struct dray_model *m, struct dray_gguf *g, uint32_t il, uint32_t dtype,
                      char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    struct layer *L = &m->layer[il];
    int rc = load_vector(m, g, (int)il, "attn_norm", in->n_embd, &L->attn_norm, err, errlen);
    if (!rc) rc = load_vector(m, g, (int)il, "attn_q_norm", in->head_dim, &L->q_norm, err, errlen);
    if (!rc) rc = load_vector(m, g, (int)il, "attn_k_norm", in->head_dim, &L->k_norm, err, errlen);
    if (!rc) rc = load_vector(m, g, (int)il, "post_attention_norm", in->n_embd, &L->post_attn_norm, err, errlen);
    if (!rc) rc = load_vector(m, g, (int)il, "ffn_norm", in->n_embd, &L->ffn_norm, err, errlen);
    if (!rc) rc = load_vector(m, g, (int)il, "post_ffw_norm", in->n_embd, &L->post_ffw_norm, err, errlen);
    for (int w = 0; w < MM_COUNT && !rc; w++)
        rc = load_layer_matrix(m, g, il, w, dtype, NULL, 0, err, errlen);
    return rc;
}

static void free_acts(struct dray_model *m)
{
    struct dray_device *dev = m->dev;
    struct dray_buf **bufs = (struct dray_buf **)&m->a;
    for (size_t i = 0; i < sizeof(m->a) / sizeof(*bufs); i++)
        if (bufs[i])
            dev->ops->free(dev->ctx, bufs[i]);
    memset(&m->a, 0, sizeof(m->a));
    free(m->meta_host);
    m->meta_host = NULL;
}

/* Activations for steps of up to m->max_batch tokens (any held before are freed). */
static int alloc_acts(struct dray_model *m, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    const struct dray_ops *ops = m->dev->ops;
    size_t T = m->max_batch;
    free_acts(m);
    struct { struct dray_buf **buf; size_t bytes; } want[] = {
        {&m->a.x, T * in->n_embd * 4},     {&m->a.h, T * in->n_embd * 4},
        {&m->a.qkv, T * m->qkv_dim * 4},   {&m->a.att, T * m->q_dim * 4},
        {&m->a.o, T * in->n_embd * 4},     {&m->a.gu, T * 2 * in->n_ff * 4},
        {&m->a.mid, T * in->n_ff * 4},     {&m->a.meta, T * 2 * 4},
        {&m->a.xl, LOGIT_SLAB * in->n_embd * 4},
        {&m->a.logits, (size_t)LOGIT_SLAB * in->n_vocab * 4},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        int rc = ops->alloc(m->dev->ctx, want[i].bytes, want[i].buf);
        if (rc)
            return dray_fail(err, errlen, rc, "device memory for activations (%zu bytes): %s",
                             want[i].bytes, ops->last_error(m->dev->ctx));
    }
    m->meta_host = malloc(T * 2 * sizeof(int32_t));
    return m->meta_host ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
}

static void gemma3_free(struct dray_model *m)
{
    if (!m)
        return;
    struct dray_device *dev = m->dev;
    free_acts(m);
    for (uint32_t il = 0; m->layer && il < m->info.n_layer; il++) {
        struct layer *L = &m->layer[il];
        struct dray_buf *v[] = {L->attn_norm, L->q_norm, L->k_norm, L->post_attn_norm,
                                L->ffn_norm, L->post_ffw_norm};
        for (size_t i = 0; i < 6; i++)
            if (v[i])
                dev->ops->free(dev->ctx, v[i]);
        dray_weight_release(dev, &L->wqkv);
        dray_weight_release(dev, &L->wo);
        dray_weight_release(dev, &L->wgu);
        dray_weight_release(dev, &L->wdown);
    }
    dray_weight_release(dev, &m->embd);
    if (m->output_norm)
        dev->ops->free(dev->ctx, m->output_norm);
    free(m->layer);
    free(m);
}

static uint64_t weight_bytes(const struct dray_weight *w)
{
    return (uint64_t)w->n_out * w->k * (w->dtype == DRAY_I8 ? 1 : 4) + (w->scale ? w->n_out * 4ull : 0) +
           (uint64_t)w->n_outlier * (w->n_out + 1) * 4;
}

/* Parameter count and device bytes of the prepared weights. */
static void account(struct dray_model *m)
{
    struct dray_model_info *in = &m->info;
    in->weight_bytes = weight_bytes(&m->embd) + in->n_embd * 4ull;
    in->n_params = (uint64_t)in->n_vocab * in->n_embd + in->n_embd;
    for (uint32_t il = 0; il < in->n_layer; il++) {
        for (int w = 0; w < MM_COUNT; w++) {
            const struct dray_weight *mw = layer_matrix(&m->layer[il], w);
            in->weight_bytes += weight_bytes(mw);
            in->n_params += (uint64_t)mw->n_out * mw->k;
        }
        in->n_params += 4ull * in->n_embd + 2ull * in->head_dim;
        in->weight_bytes += (4ull * in->n_embd + 2ull * in->head_dim) * 4;
    }
}

static int gemma3_load(struct dray_gguf *g, struct dray_device *dev, const struct dray_model_opts *o,
                       struct dray_model **out, char *err, size_t errlen)
{
    struct dray_model *m = calloc(1, sizeof(*m));
    float rope_base;
    *out = NULL;
    if (!m)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
    m->dev = dev;
    m->g = g;
    m->info.arch = "gemma3";
    int rc = read_hparams(m, g, &rope_base, err, errlen);
    if (rc)
        goto fail;
    struct dray_model_info *in = &m->info;
    m->q_dim = in->n_head * in->head_dim;
    m->kv_dim = in->n_kv_head * in->head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    m->embd_scale = sqrtf((float)in->n_embd);
    m->attn_scale = 1.0f / sqrtf((float)in->head_dim);
    m->max_batch = o->max_batch ? o->max_batch : 512;
    uint32_t dtype = o->precision == DRAY_PRECISION_F32 ? DRAY_F32 : DRAY_I8;

    const struct dray_gguf_tensor *te = tensor(g, -1, "token_embd", err, errlen);
    if (!te) {
        rc = DRAY_ENOTFOUND;
        goto fail;
    }
    if (te->n_dims != 2 || te->ne[0] != in->n_embd || te->ne[1] == 0 || te->ne[1] > INT32_MAX) {
        rc = check_shape(g, te, in->n_embd, te->ne[1], err, errlen);
        if (!rc)
            rc = dray_fail(err, errlen, DRAY_EFORMAT, "%s: token_embd has a bad vocabulary size",
                           dray_gguf_name(g));
        goto fail;
    }
    in->n_vocab = (uint32_t)te->ne[1];
    if (dray_gguf_find_tensor(g, "output.weight"))
        dray_warn("%s: has output.weight; Gemma 3 ties the output to token_embd, using token_embd",
                  dray_gguf_name(g));
    m->layer = calloc(in->n_layer, sizeof(*m->layer));
    if (!m->layer) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of host memory");
        goto fail;
    }
    /* the output head shares this table with the embedding gather: calibration
     * gives it outlier channels without changing the table (dray_weight_set_outliers) */
    rc = dray_weight_prepare(dev, &te, 1, dtype, NULL, 0, &m->embd, err, errlen);
    if (!rc)
        rc = load_vector(m, g, -1, "output_norm", in->n_embd, &m->output_norm, err, errlen);
    /* With outlier channels to find, the layers start in f32: calibration then sees
     * the exact activations, so every plugin picks the same channels (an int8
     * calibration pass would carry each plugin's rounding into the choice), and
     * re-prepares them in int8. */
    uint32_t layer_dtype = dtype == DRAY_I8 && o->outlier_channels ? DRAY_F32 : dtype;
    for (uint32_t il = 0; !rc && il < in->n_layer; il++) {
        if (o->progress && isatty(2))
            fprintf(stderr, "\rdray: preparing weights (%s): layer %u/%u", dtype == DRAY_I8 ? "int8" : "f32",
                    il + 1, in->n_layer);
        m->layer[il].window = in->window[il];
        m->layer[il].rope_base = in->window[il] ? GEMMA3_ROPE_BASE_LOCAL : rope_base;
        rc = load_layer(m, g, il, layer_dtype, err, errlen);
    }
    if (o->progress && isatty(2))
        fprintf(stderr, "\n");
    if (!rc)
        rc = alloc_acts(m, err, errlen);
    if (rc)
        goto fail;
    account(m);
    *out = m;
    return 0;
fail:
    gemma3_free(m);
    return rc;
}

/* ------------------------------------------------------------------- forward */

static struct dray_view at(struct dray_buf *b, size_t floats)
{
    return (struct dray_view){b, floats * 4};
}

static int matmul(struct dray_model *m, struct dray_view x, uint32_t stride_x,
                  const struct dray_weight *w, struct dray_view out, uint32_t stride_out, uint32_t n_tok)
{
    struct dray_matmul_args a = {
        .x = x, .w = {w->w, 0}, .wscale = {w->scale, 0}, .out = out,
        .outlier_idx = {w->outlier_idx, 0}, .outlier_w = {w->outlier_w, 0}, .n_outlier = w->n_outlier,
        .n_tok = n_tok, .n_out = w->n_out, .k = w->k,
        .stride_x = stride_x, .stride_out = stride_out, .wdtype = w->dtype,
    };
    return m->dev->ops->matmul(m->dev->ctx, &a);
}

/* While calibrating, remember the largest |x| of every input channel of a layer
 * matmul (x: [T] rows of stride floats, k used): the largest value is what sets a
 * token's int8 scale. Costs nothing otherwise. */
static int observe(struct dray_model *m, uint32_t il, int which, struct dray_buf *x, uint32_t stride,
                   uint32_t k, uint32_t T)
{
    if (!m->calib)
        return 0;
    int rc = m->dev->ops->download(m->dev->ctx, m->calib_host, (struct dray_view){x, 0}, (size_t)T * stride * 4);
    float *amax = m->calib + ((size_t)il * MM_COUNT + (size_t)which) * m->calib_k;
    for (uint32_t t = 0; !rc && t < T; t++)
        for (uint32_t c = 0; c < k; c++) {
            float a = fabsf(m->calib_host[(size_t)t * stride + c]);
            amax[c] = a > amax[c] ? a : amax[c];
        }
    return rc;
}

static int rmsnorm(struct dray_model *m, struct dray_view x, uint32_t stride_x, struct dray_buf *w,
                   struct dray_view out, uint32_t stride_out, uint32_t n_tok, uint32_t n_head, uint32_t n)
{
    struct dray_rmsnorm_args a = {
        .x = x, .w = {w, 0}, .out = out, .n_tok = n_tok, .n_head = n_head, .n = n,
        .stride_x = stride_x, .stride_out = stride_out, .eps = m->eps,
    };
    return m->dev->ops->rmsnorm(m->dev->ctx, &a);
}

static int rope(struct dray_model *m, struct dray_view x, uint32_t n_head, uint32_t n_tok, float base)
{
    struct dray_rope_args a = {
        .x = x, .pos = {m->a.meta, (size_t)m->max_batch * 4}, .n_tok = n_tok, .n_head = n_head,
        .head_dim = m->info.head_dim, .n_rot = m->info.head_dim, .stride = m->qkv_dim,
        .base = base, .freq_scale = 1.0f,
    };
    return m->dev->ops->rope(m->dev->ctx, &a);
}

static int add(struct dray_model *m, struct dray_buf *a, struct dray_buf *b, uint32_t n_tok)
{
    struct dray_add_args args = {.a = {a, 0}, .b = {b, 0}, .out = {a, 0}, .n = (uint64_t)n_tok * m->info.n_embd};
    return m->dev->ops->add(m->dev->ctx, &args);
}

static int attention_block(struct dray_model *m, struct dray_kv *kv, uint32_t il, uint32_t T)
{
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const struct dray_model_info *in = &m->info;
    const struct layer *L = &m->layer[il];
    const struct dray_kv_layer_step *s = dray_kv_layer(kv, il);
    struct dray_view q = at(m->a.qkv, 0), k = at(m->a.qkv, m->q_dim), v = at(m->a.qkv, m->q_dim + m->kv_dim);
    int rc;

    /* h = rmsnorm(x, attn_norm); qkv = Wqkv h */
    if ((rc = rmsnorm(m, at(m->a.x, 0), in->n_embd, L->attn_norm, at(m->a.h, 0), in->n_embd, T, 1, in->n_embd)))
        return rc;
    if ((rc = observe(m, il, MM_QKV, m->a.h, in->n_embd, in->n_embd, T)) ||
        (rc = matmul(m, at(m->a.h, 0), in->n_embd, &L->wqkv, q, m->qkv_dim, T)))
        return rc;
    /* per-head norms of q and k, in place */
    if ((rc = rmsnorm(m, q, m->qkv_dim, L->q_norm, q, m->qkv_dim, T, in->n_head, in->head_dim)))
        return rc;
    if ((rc = rmsnorm(m, k, m->qkv_dim, L->k_norm, k, m->qkv_dim, T, in->n_kv_head, in->head_dim)))
        return rc;
    /* RoPE on q and k */
    if ((rc = rope(m, q, in->n_head, T, L->rope_base)) || (rc = rope(m, k, in->n_kv_head, T, L->rope_base)))
        return rc;
    /* append k, v to this layer's cache (layers that share KV read an earlier layer's) */
    if (s->store) {
        struct dray_kv_store_args st = {.k = k, .v = v, .slots = s->slots, .pool = s->pool,
                                        .n_tok = T, .stride_k = m->qkv_dim, .stride_v = m->qkv_dim};
        if ((rc = ops->kv_store(ctx, &st)))
            return rc;
    }
    /* att = softmax(q k^T * scale, causal [+ window]) v */
    struct dray_attention_args at_args = {
        .q = q, .out = at(m->a.att, 0), .seqs = s->seqs, .block_table = s->block_table, .pool = s->pool,
        .n_tok = T, .n_seq = s->n_seq, .n_head = in->n_head, .max_kv_len = s->max_kv_len,
        .stride_q = m->qkv_dim, .stride_out = m->q_dim, .window = L->window, .scale = m->attn_scale,
    };
    if ((rc = ops->attention(ctx, &at_args)))
        return rc;
    /* x = x + rmsnorm(Wo att, post_attention_norm) */
    if ((rc = observe(m, il, MM_O, m->a.att, m->q_dim, m->q_dim, T)) ||
        (rc = matmul(m, at(m->a.att, 0), m->q_dim, &L->wo, at(m->a.o, 0), in->n_embd, T)))
        return rc;
    if ((rc = rmsnorm(m, at(m->a.o, 0), in->n_embd, L->post_attn_norm, at(m->a.o, 0), in->n_embd, T, 1, in->n_embd)))
        return rc;
    return add(m, m->a.x, m->a.o, T);
}

static int ffn_block(struct dray_model *m, uint32_t il, uint32_t T)
{
    const struct dray_model_info *in = &m->info;
    const struct layer *L = &m->layer[il];
    int rc;
    /* h = rmsnorm(x, ffn_norm); gu = [Wgate; Wup] h */
    if ((rc = rmsnorm(m, at(m->a.x, 0), in->n_embd, L->ffn_norm, at(m->a.h, 0), in->n_embd, T, 1, in->n_embd)))
        return rc;
    if ((rc = observe(m, il, MM_GU, m->a.h, in->n_embd, in->n_embd, T)) ||
        (rc = matmul(m, at(m->a.h, 0), in->n_embd, &L->wgu, at(m->a.gu, 0), 2 * in->n_ff, T)))
        return rc;
    /* mid = gelu_tanh(gate) * up */
    struct dray_gated_act_args g = {
        .gate = at(m->a.gu, 0), .up = at(m->a.gu, in->n_ff), .out = at(m->a.mid, 0), .n_tok = T,
        .n = in->n_ff, .stride_gate = 2 * in->n_ff, .stride_up = 2 * in->n_ff, .stride_out = in->n_ff,
        .act = DRAY_ACT_GELU_TANH,
    };
    if ((rc = m->dev->ops->gated_act(m->dev->ctx, &g)))
        return rc;
    /* x = x + rmsnorm(Wdown mid, post_ffw_norm) */
    if ((rc = observe(m, il, MM_DOWN, m->a.mid, in->n_ff, in->n_ff, T)) ||
        (rc = matmul(m, at(m->a.mid, 0), in->n_ff, &L->wdown, at(m->a.o, 0), in->n_embd, T)))
        return rc;
    if ((rc = rmsnorm(m, at(m->a.o, 0), in->n_embd, L->post_ffw_norm, at(m->a.o, 0), in->n_embd, T, 1, in->n_embd)))
        return rc;
    return add(m, m->a.x, m->a.o, T);
}

/* logits of the wanted rows, LOGIT_SLAB rows at a time: gather, norm, tied output. */
static int output_logits(struct dray_model *m, const struct dray_batch *b)
{
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const struct dray_model_info *in = &m->info;
    for (uint32_t r0 = 0; r0 < b->n_logits; r0 += LOGIT_SLAB) {
        uint32_t n = b->n_logits - r0 < LOGIT_SLAB ? b->n_logits - r0 : LOGIT_SLAB;
        int rc = 0;
        for (uint32_t i = 0; i < n && !rc; i++)
            rc = ops->copy(ctx, at(m->a.xl, (size_t)i * in->n_embd),
                           at(m->a.x, (size_t)b->logit_rows[r0 + i] * in->n_embd), in->n_embd * 4u);
        if (!rc)
            rc = rmsnorm(m, at(m->a.xl, 0), in->n_embd, m->output_norm, at(m->a.xl, 0), in->n_embd, n, 1, in->n_embd);
        if (!rc)
            rc = observe(m, in->n_layer, 0, m->a.xl, in->n_embd, in->n_embd, n); /* the head's slot */
        if (!rc)
            rc = matmul(m, at(m->a.xl, 0), in->n_embd, &m->embd, at(m->a.logits, 0), in->n_vocab, n);
        if (!rc)
            rc = ops->download(ctx, b->logits + (size_t)r0 * in->n_vocab, at(m->a.logits, 0),
                               (size_t)n * in->n_vocab * 4);
        if (rc)
            return rc;
    }
    return 0;
}

static int gemma3_forward(struct dray_model *m, struct dray_kv *kv, const struct dray_batch *b,
                          char *err, size_t errlen)
{
    const struct dray_ops *ops = m->dev->ops;
    struct dray_ctx *ctx = m->dev->ctx;
    const struct dray_model_info *in = &m->info;
    uint32_t T = b->n_tok;
    int rc;
    if (T == 0 || T > m->max_batch)
        return dray_fail(err, errlen, DRAY_EINVAL, "forward: %u tokens, this model was prepared for 1..%u",
                         T, m->max_batch);
    for (uint32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] >= T)
            return dray_fail(err, errlen, DRAY_EINVAL, "forward: logit row %u of %u tokens", b->logit_rows[i], T);
    memcpy(m->meta_host, b->ids, T * sizeof(int32_t));
    memcpy(m->meta_host + m->max_batch, b->pos, T * sizeof(int32_t));
    rc = ops->upload(ctx, at(m->a.meta, 0), m->meta_host, (size_t)m->max_batch * 2 * 4);

    /* x = embed(ids) * sqrt(n_embd) */
    struct dray_embed_args e = {
        .ids = {m->a.meta, 0}, .table = {m->embd.w, 0}, .row_scale = {m->embd.scale, 0},
        .out = at(m->a.x, 0), .dtype = m->embd.dtype, .n_tok = T, .dim = in->n_embd,
        .n_rows = in->n_vocab, .scale = m->embd_scale,
    };
    if (!rc)
        rc = ops->embed(ctx, &e);
    for (uint32_t il = 0; !rc && il < in->n_layer; il++) {
        rc = attention_block(m, kv, il, T);
        if (!rc)
            rc = ffn_block(m, il, T);
    }
    if (!rc && b->n_logits)
        rc = output_logits(m, b);
    if (rc)
        return dray_fail(err, errlen, rc, "forward on %s: %s", m->dev->plugin->name, ops->last_error(ctx));
    return 0;
}

/* The calibration forward pass: ids as one sequence (a fresh one in kv) in one
 * step, recording per-channel |x| maxima into m->calib. The activations are
 * resized to n tokens for the step when the model was prepared for fewer (a small
 * --chunk must not cut the text), then back to max_batch. */
static int calib_forward(struct dray_model *m, struct dray_kv *kv, const int32_t *ids, uint32_t n,
                         char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    /* the head sees the last rows only: their logits are computed and dropped */
    uint32_t n_head_rows = n < 16 ? n : 16, rows[16], seq = 0, max_batch = m->max_batch;
    float *logits = malloc((size_t)n_head_rows * in->n_vocab * sizeof(float));
    int32_t *pos = malloc(n * sizeof(int32_t));
    int rc = logits && pos ? dray_kv_seq_new(kv, &seq) : DRAY_ENOMEM;
    if (rc) {
        dray_fail(err, errlen, rc, "calibration: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        pos[i] = (int32_t)i;
    for (uint32_t i = 0; i < n_head_rows; i++)
        rows[i] = n - n_head_rows + i;
    if (n > max_batch) {
        m->max_batch = n;
        rc = alloc_acts(m, err, errlen);
    }
    if (!rc)
        rc = dray_kv_step_begin(kv, 1, &seq, &n, err, errlen);
    if (!rc) {
        struct dray_batch b = {.n_tok = n, .ids = ids, .pos = pos, .n_logits = n_head_rows,
                               .logit_rows = rows, .logits = logits};
        rc = gemma3_forward(m, kv, &b, err, errlen);
        if (rc)
            dray_kv_step_abort(kv);
        else
            dray_kv_step_end(kv);
    }
    dray_kv_seq_free(kv, seq);
    if (m->max_batch != max_batch) {
        m->max_batch = max_batch;
        int rc2 = alloc_acts(m, rc ? NULL : err, rc ? 0 : errlen);
        rc = rc ? rc : rc2;
    }
out:
    free(pos);
    free(logits);
    return rc;
}

static void log_outliers(uint32_t il, int which, const int32_t *pick, uint32_t no)
{
    if (dray_log_get_level() < DRAY_LOG_DEBUG)
        return;
    char list[512];
    size_t len = 0;
    for (uint32_t j = 0; j < no && len < sizeof(list) - 8; j++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, " %d", pick[j]);
    dray_debug("layer %u matmul %d outlier channels:%s", il, which, list);
}

/* Pick each matmul's loudest input channels from m->calib and re-prepare the
 * layer matmuls in int8 with them; give the head half as many. pick: [calib_k]. */
static int calib_apply(struct dray_model *m, uint32_t n_outlier, int32_t *pick, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    const uint32_t ks[MM_COUNT] = {in->n_embd, m->q_dim, in->n_embd, in->n_ff};
    int rc = 0;
    for (uint32_t il = 0; !rc && il < in->n_layer; il++) {
        for (int w = 0; !rc && w < MM_COUNT; w++) {
            uint32_t k = ks[w], no = n_outlier < k / 8 ? n_outlier : k / 8;
            rc = dray_pick_outliers(m->calib + ((size_t)il * MM_COUNT + (size_t)w) * m->calib_k, k, no, pick);
            if (rc)
                return dray_fail(err, errlen, rc, "calibration: out of memory");
            log_outliers(il, w, pick, no);
            dray_weight_release(m->dev, layer_matrix(&m->layer[il], w));
            rc = load_layer_matrix(m, m->g, il, w, DRAY_I8, pick, no, err, errlen);
        }
    }
    if (rc)
        return rc;
    const struct dray_gguf_tensor *te = dray_gguf_find_tensor(m->g, "token_embd.weight");
    /* half as many for the head: its f32 columns are read for all n_vocab
     * outputs on every step (32 channels would add 12% to a decode step) */
    uint32_t no = n_outlier / 2 < in->n_embd / 8 ? n_outlier / 2 : in->n_embd / 8;
    rc = dray_pick_outliers(m->calib + (size_t)in->n_layer * MM_COUNT * m->calib_k, in->n_embd, no, pick);
    if (rc)
        return dray_fail(err, errlen, rc, "calibration: out of memory");
    return te ? dray_weight_set_outliers(m->dev, te, pick, no, &m->embd, err, errlen) : DRAY_ENOTFOUND;
}

/* Mixed precision without scheduling overhead: a few input channels of each
 * matmul carry activations far larger than the rest (Gemma's norm weights and
 * massive activations), and one of them sets the per-token int8 scale of all the
 * others. Calibration finds those channels once, on a short text; the matmul op
 * then keeps them in f32 inside the same kernel, so there is no second op. */
static int gemma3_calibrate(struct dray_model *m, struct dray_kv *kv, const int32_t *ids, uint32_t n,
                            uint32_t n_outlier, char *err, size_t errlen)
{
    const struct dray_model_info *in = &m->info;
    if (n_outlier == 0 || m->embd.dtype != DRAY_I8)
        return 0;
    if (n == 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "calibration: no tokens");
    m->calib_k = in->n_embd > m->q_dim ? in->n_embd : m->q_dim;
    m->calib_k = in->n_ff > m->calib_k ? in->n_ff : m->calib_k;
    /* slots: [n_layer][MM_COUNT] layer matmuls, then one for the output head */
    m->calib = calloc(((size_t)in->n_layer * MM_COUNT + 1) * m->calib_k, sizeof(float));
    m->calib_host = malloc((size_t)n * m->calib_k * sizeof(float));
    int32_t *pick = malloc(m->calib_k * sizeof(int32_t));
    int rc = m->calib && m->calib_host && pick ? 0 : dray_fail(err, errlen, DRAY_ENOMEM, "calibration: out of memory");
    if (!rc)
        rc = calib_forward(m, kv, ids, n, err, errlen);
    if (!rc)
        rc = calib_apply(m, n_outlier, pick, err, errlen);
    account(m);
    free(m->calib);
    free(m->calib_host);
    m->calib = m->calib_host = NULL;
    free(pick);
    return rc;
}

static const struct dray_model_info *gemma3_info(const struct dray_model *m)
{
    return &m->info;
}

const struct dray_arch dray_arch_gemma3 = {
    .name = "gemma3",
    .load = gemma3_load,
    .forward = gemma3_forward,
    .free = gemma3_free,
    .info = gemma3_info,
    .calibrate = gemma3_calibrate,
};
