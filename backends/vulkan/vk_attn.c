/* Host side of the paged KV store and paged attention (kernels in
 * kernels/vulkan/kv_store.comp and attention.comp). The whole K or V pool is
 * one binding, so a pool must fit maxStorageBufferRange (else DRAY_ENOTSUP). */

#include "vk_internal.h"

#define F32 4u

/* Beyond the contract (checked first by the shared validator): device storage
 * support and one binding per pool. */
static int vk_pool_check(struct dray_ctx *ctx, const struct dray_kv_pool *p, const char *op)
{
    if ((p->dtype == DRAY_I8 && !ctx->has_i8) || (p->dtype == DRAY_F16 && !ctx->has_f16))
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "%s: device lacks %s storage buffers", op,
                            p->dtype == DRAY_I8 ? "8-bit" : "16-bit");
    if (p->n_kv_head > VK_MAX_GROUPS)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "%s: n_kv_head %u is more than %u", op,
                            p->n_kv_head, VK_MAX_GROUPS);
    size_t esz = p->dtype == DRAY_I8 ? 1 : 2;
    size_t kv = (size_t)p->n_slots * p->n_kv_head * p->head_dim * esz;
    if (kv + ctx->off_align > ctx->max_range)
        return dray_vk_fail(ctx, DRAY_ENOTSUP,
                            "%s: a K/V pool of %zu bytes exceeds maxStorageBufferRange %llu", op, kv,
                            (unsigned long long)ctx->max_range);
    return 0;
}

static size_t vk_rows(uint32_t n, uint32_t stride, size_t row)
{
    return n ? ((size_t)(n - 1) * stride + row) * F32 : 0;
}

int dray_vk_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a)
{
    const struct dray_kv_pool *p = a->pool;
    struct dray_util_needs nd;
    int rc = dray_vk_check_args(ctx, dray_util_check_kv_store(a, &nd, ctx->err, sizeof(ctx->err)), &nd);
    if (!rc)
        rc = vk_pool_check(ctx, p, "kv_store");
    if (rc)
        return rc;
    bool i8 = p->dtype == DRAY_I8;
    size_t esz = i8 ? 1 : 2, row = (size_t)p->n_kv_head * p->head_dim;
    size_t pool_bytes = (size_t)p->n_slots * row * esz, sc_bytes = (size_t)p->n_slots * p->n_kv_head * F32;
    if (rc || a->n_tok == 0 || p->n_slots == 0)
        return rc;
    uint32_t smax = a->stride_k > a->stride_v ? a->stride_k : a->stride_v;
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)smax * F32, row * F32);
    if (!nt)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "kv_store: a token row exceeds a binding");
    struct {
        uint32_t head_dim, n_kv_head, stride, n_slots;
    } pc = {p->head_dim, p->n_kv_head, 0, p->n_slots};
    enum vk_kernel k = i8 ? VK_K_KV_STORE_I8 : VK_K_KV_STORE_F16;
    for (uint32_t t = 0; !rc && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        for (int which = 0; !rc && which < 2; which++) {
            struct dray_view src = which ? a->v : a->k, pool = which ? p->v : p->k;
            struct dray_view sc = which ? p->v_scale : p->k_scale;
            pc.stride = which ? a->stride_v : a->stride_k;
            struct vk_bind b[4] = {
                dray_vk_bind(src, (size_t)t * pc.stride * F32, vk_rows(c, pc.stride, row), F32),
                dray_vk_bind(a->slots, (size_t)t * 4, (size_t)c * 4, 4),
                dray_vk_bind(pool, 0, pool_bytes, (uint32_t)esz),
                i8 ? dray_vk_bind(sc, 0, sc_bytes, F32) : dray_vk_bind(a->slots, 0, 4, 4)};
            rc = dray_vk_dispatch(ctx, k, b, 4, &pc, sizeof(pc), p->n_kv_head, c, 1);
        }
    }
    return rc;
}

static int vk_attn_check(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    const struct dray_kv_pool *p = a->pool;
    struct dray_util_needs nd;
    int rc = dray_vk_check_args(ctx, dray_util_check_attention(a, &nd, ctx->err, sizeof(ctx->err)), &nd);
    if (!rc)
        rc = vk_pool_check(ctx, p, "attention");
    if (rc)
        return rc;
    if (a->n_head > VK_MAX_GROUPS)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "attention: n_head %u is more than %u", a->n_head,
                            VK_MAX_GROUPS);
    if (p->head_dim > 512)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "attention: head_dim %u > 512", p->head_dim);
    return 0;
}

int dray_vk_attention(struct dray_ctx *ctx, const struct dray_attention_args *a)
{
    const struct dray_kv_pool *p = a->pool;
    int rc = vk_attn_check(ctx, a);
    if (rc || a->n_tok == 0 || a->n_seq == 0)
        return rc;
    bool i8 = p->dtype == DRAY_I8;
    size_t esz = i8 ? 1 : 2, row = (size_t)a->n_head * p->head_dim;
    size_t pool_bytes = (size_t)p->n_slots * p->n_kv_head * p->head_dim * esz;
    size_t sc_bytes = (size_t)p->n_slots * p->n_kv_head * F32;
    /* The block table's length is not an argument: bind to the buffer's end. */
    size_t bt_bytes = a->block_table.buf->nbytes - a->block_table.offset;
    size_t room = ctx->max_range - ctx->off_align;
    bt_bytes = (bt_bytes < room ? bt_bytes : room) / 4 * 4;
    uint32_t smax = a->stride_q > a->stride_out ? a->stride_q : a->stride_out;
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)smax * F32, row * F32);
    if (!nt)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "attention: a token row exceeds a binding");
    struct {
        uint32_t n_seq, n_head, n_kv_head, head_dim, stride_q, stride_o;
        uint32_t window, block_size, n_slots, n_bt, t_base;
        float scale, softcap;
    } pc = {a->n_seq,  a->n_head,      p->n_kv_head, p->head_dim,         a->stride_q, a->stride_out,
            a->window, p->block_size, p->n_slots,   (uint32_t)(bt_bytes / 4), 0,           a->scale, a->softcap};
    for (uint32_t t = 0; !rc && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        pc.t_base = t;
        struct vk_bind b[8] = {
            dray_vk_bind(a->q, (size_t)t * a->stride_q * F32, vk_rows(c, a->stride_q, row), F32),
            dray_vk_bind(a->out, (size_t)t * a->stride_out * F32, vk_rows(c, a->stride_out, row),
                         F32),
            dray_vk_bind(a->seqs, 0, (size_t)a->n_seq * 16, 4),
            dray_vk_bind(a->block_table, 0, bt_bytes, 4),
            dray_vk_bind(p->k, 0, pool_bytes, (uint32_t)esz),
            dray_vk_bind(p->v, 0, pool_bytes, (uint32_t)esz),
            i8 ? dray_vk_bind(p->k_scale, 0, sc_bytes, F32) : dray_vk_bind(a->seqs, 0, 4, 4),
            i8 ? dray_vk_bind(p->v_scale, 0, sc_bytes, F32) : dray_vk_bind(a->seqs, 0, 4, 4)};
        rc = dray_vk_dispatch(ctx, i8 ? VK_K_ATTENTION_I8 : VK_K_ATTENTION_F16, b, 8, &pc,
                              sizeof(pc), a->n_head, c, 1);
    }
    return rc;
}
