/* Vulkan plugin entry: ABI negotiation and the operator table (errors, logging
 * and host memory are vk_util.c's, which every other file uses).
 *
 * Every table entry that takes a context goes through a wrapper that clears the
 * last error first and, after the call, turns any validation-layer message that
 * arrived meanwhile into DRAY_EBACKEND (see DRAY_VK_VALIDATION in vk_device.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

/* Start of every call on a context. */
static void vk_enter(struct dray_ctx *ctx)
{
    ctx->err[0] = '\0';
}

/* End of every call: a validation message makes the call fail. */
static int vk_leave(struct dray_ctx *ctx, int rc)
{
    if (ctx->vk_flag) {
        ctx->vk_flag = false;
        snprintf(ctx->err, sizeof(ctx->err), "validation: %.480s", ctx->vk_msg);
        return DRAY_EBACKEND;
    }
    return rc;
}

#define VK_WRAP(fn, impl, argtype)                                                                 \
    static int fn(struct dray_ctx *ctx, const argtype *a)                                         \
    {                                                                                              \
        if (!ctx)                                                                                  \
            return DRAY_EINVAL;                                                                    \
        vk_enter(ctx);                                                                             \
        if (!a)                                                                                    \
            return dray_vk_fail(ctx, DRAY_EINVAL, #fn ": NULL arguments");                       \
        return vk_leave(ctx, impl(ctx, a));                                                        \
    }

VK_WRAP(vk_op_embed, dray_vk_embed, struct dray_embed_args)
VK_WRAP(vk_op_rmsnorm, dray_vk_rmsnorm, struct dray_rmsnorm_args)
VK_WRAP(vk_op_matmul, dray_vk_matmul, struct dray_matmul_args)
VK_WRAP(vk_op_rope, dray_vk_rope, struct dray_rope_args)
VK_WRAP(vk_op_kv_store, dray_vk_kv_store, struct dray_kv_store_args)
VK_WRAP(vk_op_attention, dray_vk_attention, struct dray_attention_args)
VK_WRAP(vk_op_gated_act, dray_vk_gated_act, struct dray_gated_act_args)
VK_WRAP(vk_op_add, dray_vk_add, struct dray_add_args)

static const char *vk_last_error(struct dray_ctx *ctx)
{
    return ctx ? ctx->err : "no context";
}

static int vk_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out)
{
    if (!ctx || !out)
        return DRAY_EINVAL;
    vk_enter(ctx);
    return vk_leave(ctx, dray_vk_buf_alloc(ctx, nbytes, out));
}

static void vk_free_buf(struct dray_ctx *ctx, struct dray_buf *buf)
{
    if (!ctx)
        return;
    vk_enter(ctx);
    dray_vk_buf_free(ctx, buf);
    vk_leave(ctx, 0);
}

static int vk_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes)
{
    if (!ctx)
        return DRAY_EINVAL;
    vk_enter(ctx);
    return vk_leave(ctx, dray_vk_upload(ctx, dst, src, nbytes));
}

static int vk_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes)
{
    if (!ctx)
        return DRAY_EINVAL;
    vk_enter(ctx);
    return vk_leave(ctx, dray_vk_download(ctx, dst, src, nbytes));
}

static int vk_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes)
{
    if (!ctx)
        return DRAY_EINVAL;
    vk_enter(ctx);
    return vk_leave(ctx, dray_vk_copy(ctx, dst, src, nbytes));
}

static int vk_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes)
{
    if (!ctx)
        return DRAY_EINVAL;
    vk_enter(ctx);
    return vk_leave(ctx, dray_vk_fill(ctx, dst, pattern, nbytes));
}

static int vk_synchronize(struct dray_ctx *ctx)
{
    if (!ctx)
        return DRAY_EINVAL;
    vk_enter(ctx);
    return vk_leave(ctx, dray_vk_flush(ctx));
}

/* Version 3: packed weights (vk_packed.c). */
static int vk_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                            struct dray_packed **out, uint64_t *device_bytes)
{
    if (!ctx)
        return DRAY_EINVAL;
    vk_enter(ctx);
    return vk_leave(ctx, dray_vk_weight_create(ctx, desc, out, device_bytes));
}

static void vk_weight_free(struct dray_ctx *ctx, struct dray_packed *w)
{
    if (!ctx)
        return;
    vk_enter(ctx);
    dray_vk_weight_free(ctx, w);
    vk_leave(ctx, 0);
}

/* The props' dtypes, and the shader limits: head_dim (attention), n_rot (the
 * rope table), heads per grid dimension; since version 3 every packed format
 * for matmul and embed (the kernels need no optional device feature; version
 * 4: the two-level ones too) and one or two activation passes. */
static int vk_op_caps(uint32_t index, struct dray_op_caps *caps)
{
    static const struct dray_util_limits lim = {
        .max_head_dim = 512, .max_n_rot = 2 * VK_ROPE_MAX_PAIRS, .max_k = 65536,
        .max_heads = VK_MAX_GROUPS, .matmul_wformats = VK_WFORMATS,
        .embed_wformats = VK_WFORMATS, .matmul_passes = VK_PASSES};
    return dray_util_op_caps(index, caps, dray_vk_device_props, &lim);
}

static const struct dray_ops vk_ops = {
    .version = 4, /* v4: rope freq_factors and attn_factor, attention softcap */
    .name = "vulkan",
    .describe = "Vulkan compute (GLSL kernels compiled to SPIR-V at build time, "
                "int8 storage and packed int8 dot products where the device has them; "
                "packed 4/5/8-bit grouped weights and two-level Q4_K/Q5_K/Q6_K shapes)",
    .device_count = dray_vk_device_count,
    .device_props = dray_vk_device_props,
    .open = dray_vk_open,
    .close = dray_vk_close,
    .last_error = vk_last_error,
    .alloc = vk_alloc,
    .free = vk_free_buf,
    .upload = vk_upload,
    .download = vk_download,
    .copy = vk_copy,
    .fill = vk_fill,
    .synchronize = vk_synchronize,
    .embed = vk_op_embed,
    .rmsnorm = vk_op_rmsnorm,
    .matmul = vk_op_matmul,
    .rope = vk_op_rope,
    .kv_store = vk_op_kv_store,
    .attention = vk_op_attention,
    .gated_act = vk_op_gated_act,
    .add = vk_op_add,
    .op_caps = vk_op_caps,
    .weight_create = vk_weight_create,
    .weight_free = vk_weight_free,
};

/* Answers with vk_ops.version, the ABI this plugin implements. */
DRAY_EXPORT int dray_plugin_negotiate(uint32_t *version, const struct dray_host *host,
                                      const struct dray_ops **ops, char *err, size_t errlen)
{
    int rc = dray_util_negotiate(version, &vk_ops, ops, err, errlen);
    if (rc == 0)
        dray_vk_set_host(host);
    return rc;
}
