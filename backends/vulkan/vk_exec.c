/* Command recording and submission, pipelines, descriptors, binding windows.
 *
 * Ops are recorded into one command buffer, each followed by a full
 * compute+transfer memory barrier (every op may depend on the one before).
 * The buffer is submitted, and its fence waited on, only when the host needs
 * results (download, synchronize, free) or a per-submit resource runs out
 * (descriptor sets, staging bytes). Pipelines are built on first use and kept;
 * descriptor sets come from the cache in vk_dset.c. */
#include <string.h>

#include "vk_internal.h"
#include "vk_spv.h"

/* In enum vk_kernel order; binding counts match the kernels' layouts. */
static const struct {
    const char *name;
    uint32_t n_bind;
} vk_kernels[VK_K_COUNT] = {
    [VK_K_ADD] = {"add", 3},
    [VK_K_GATED_ACT] = {"gated_act", 3},
    [VK_K_RMSNORM] = {"rmsnorm", 3},
    [VK_K_ROPE] = {"rope", 3},
    [VK_K_EMBED_F32] = {"embed_f32", 4},
    [VK_K_EMBED_I8] = {"embed_i8", 4},
    [VK_K_QUANT_ROWS] = {"quant_rows", 4},
    [VK_K_MATMUL_I8] = {"matmul_i8", 8},
    [VK_K_MATMUL_DP4A] = {"matmul_dp4a", 8},
    [VK_K_MATMUL_F32] = {"matmul_f32", 3},
    [VK_K_KV_STORE_I8] = {"kv_store_i8", 4},
    [VK_K_KV_STORE_F16] = {"kv_store_f16", 4},
    [VK_K_ATTENTION_I8] = {"attention_i8", 8},
    [VK_K_ATTENTION_F16] = {"attention_f16", 8},
    [VK_K_QUANT_GROUPS] = {"quant_groups", 3},
    [VK_K_MATMUL_Q4] = {"matmul_q4", 6},
    [VK_K_MATMUL_Q5] = {"matmul_q5", 6},
    [VK_K_MATMUL_Q8] = {"matmul_q8", 6},
    [VK_K_MATMUL_Q4K] = {"matmul_q4k", 7},
    [VK_K_MATMUL_Q5K] = {"matmul_q5k", 7},
    [VK_K_MATMUL_Q6K] = {"matmul_q6k", 7},
    [VK_K_MATMUL_Q4_DOT] = {"matmul_q4_dot", 6},
    [VK_K_MATMUL_Q5_DOT] = {"matmul_q5_dot", 6},
    [VK_K_MATMUL_Q8_DOT] = {"matmul_q8_dot", 6},
    [VK_K_MATMUL_Q4K_DOT] = {"matmul_q4k_dot", 7},
    [VK_K_MATMUL_Q5K_DOT] = {"matmul_q5k_dot", 7},
    [VK_K_MATMUL_Q6K_DOT] = {"matmul_q6k_dot", 7},
    [VK_K_EMBED_PACKED] = {"embed_packed", 6},
};

static int vk_make_layouts(struct dray_ctx *ctx)
{
    VkDescriptorSetLayoutBinding b[VK_MAX_BIND];
    VkPushConstantRange pc = {VK_SHADER_STAGE_COMPUTE_BIT, 0, VK_PUSH_BYTES};
    int rc;

    for (uint32_t i = 0; i < VK_MAX_BIND; i++)
        b[i] = (VkDescriptorSetLayoutBinding){i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                              VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    for (uint32_t n = 1; n <= VK_MAX_BIND; n++) {
        VkDescriptorSetLayoutCreateInfo li = {
            .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
            .bindingCount = n,
            .pBindings = b,
        };
        rc = dray_vk_check(ctx, vkCreateDescriptorSetLayout(ctx->dev, &li, NULL, &ctx->dsl[n]),
                           "vkCreateDescriptorSetLayout");
        if (rc)
            return rc;
        VkPipelineLayoutCreateInfo pi = {
            .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
            .setLayoutCount = 1,
            .pSetLayouts = &ctx->dsl[n],
            .pushConstantRangeCount = 1,
            .pPushConstantRanges = &pc,
        };
        rc = dray_vk_check(ctx, vkCreatePipelineLayout(ctx->dev, &pi, NULL, &ctx->plo[n]),
                           "vkCreatePipelineLayout");
        if (rc)
            return rc;
    }
    return 0;
}

static int vk_make_staging(struct dray_ctx *ctx)
{
    VkBufferCreateInfo bi = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = VK_STAGING_BYTES,
        .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
    };
    VkMemoryRequirements req;
    int rc = dray_vk_check(ctx, vkCreateBuffer(ctx->dev, &bi, NULL, &ctx->sbuf), "vkCreateBuffer");
    if (rc)
        return rc;
    vkGetBufferMemoryRequirements(ctx->dev, ctx->sbuf, &req);
    VkMemoryAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = req.size,
        .memoryTypeIndex = ctx->mem_host,
    };
    rc = dray_vk_check(ctx, vkAllocateMemory(ctx->dev, &ai, NULL, &ctx->smem), "vkAllocateMemory");
    if (rc)
        return rc;
    rc = dray_vk_check(ctx, vkBindBufferMemory(ctx->dev, ctx->sbuf, ctx->smem, 0),
                       "vkBindBufferMemory");
    if (rc)
        return rc;
    void *p;
    rc = dray_vk_check(ctx, vkMapMemory(ctx->dev, ctx->smem, 0, VK_WHOLE_SIZE, 0, &p),
                       "vkMapMemory");
    ctx->smap = p;
    return rc;
}

int dray_vk_exec_init(struct dray_ctx *ctx)
{
    VkCommandPoolCreateInfo cpi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = ctx->qfam,
    };
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, VK_SETS_PER_POOL * VK_MAX_BIND};
    VkDescriptorPoolCreateInfo dpi = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        .maxSets = VK_SETS_PER_POOL,
        .poolSizeCount = 1,
        .pPoolSizes = &ps,
    };
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    int rc = dray_vk_check(ctx, vkCreateCommandPool(ctx->dev, &cpi, NULL, &ctx->cmd_pool),
                           "vkCreateCommandPool");
    if (rc)
        return rc;
    VkCommandBufferAllocateInfo cai = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = ctx->cmd_pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1,
    };
    rc = dray_vk_check(ctx, vkAllocateCommandBuffers(ctx->dev, &cai, &ctx->cmd),
                       "vkAllocateCommandBuffers");
    if (!rc)
        rc = dray_vk_check(ctx, vkCreateFence(ctx->dev, &fi, NULL, &ctx->fence), "vkCreateFence");
    if (!rc)
        rc = dray_vk_check(ctx, vkCreateDescriptorPool(ctx->dev, &dpi, NULL, &ctx->dpool),
                           "vkCreateDescriptorPool");
    if (!rc)
        rc = vk_make_layouts(ctx);
    if (!rc)
        rc = vk_make_staging(ctx);
    if (!rc)
        rc = dray_vk_dset_init(ctx);
    return rc;
}

void dray_vk_exec_release(struct dray_ctx *ctx)
{
    dray_vk_dset_release(ctx);
    for (int k = 0; k < VK_K_COUNT; k++)
        if (ctx->pipe[k])
            vkDestroyPipeline(ctx->dev, ctx->pipe[k], NULL);
    for (int n = 1; n <= VK_MAX_BIND; n++) {
        if (ctx->plo[n])
            vkDestroyPipelineLayout(ctx->dev, ctx->plo[n], NULL);
        if (ctx->dsl[n])
            vkDestroyDescriptorSetLayout(ctx->dev, ctx->dsl[n], NULL);
    }
    if (ctx->sbuf)
        vkDestroyBuffer(ctx->dev, ctx->sbuf, NULL);
    if (ctx->smem)
        vkFreeMemory(ctx->dev, ctx->smem, NULL); /* unmaps implicitly */
    if (ctx->dpool)
        vkDestroyDescriptorPool(ctx->dev, ctx->dpool, NULL);
    if (ctx->fence)
        vkDestroyFence(ctx->dev, ctx->fence, NULL);
    if (ctx->cmd_pool)
        vkDestroyCommandPool(ctx->dev, ctx->cmd_pool, NULL); /* frees ctx->cmd */
}

static int vk_pipeline(struct dray_ctx *ctx, enum vk_kernel k)
{
    const struct dray_vk_spv *s = dray_vk_spv;
    VkShaderModule mod;

    if (ctx->pipe[k])
        return 0;
    while (s->name && strcmp(s->name, vk_kernels[k].name) != 0)
        s++;
    if (!s->name)
        return dray_vk_fail(ctx, DRAY_EBACKEND, "kernel %s is not embedded", vk_kernels[k].name);
    VkShaderModuleCreateInfo mi = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
        .codeSize = s->size,
        .pCode = s->words,
    };
    int rc = dray_vk_check(ctx, vkCreateShaderModule(ctx->dev, &mi, NULL, &mod),
                           "vkCreateShaderModule");
    if (rc)
        return rc;
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod,
                  .pName = "main"},
        .layout = ctx->plo[vk_kernels[k].n_bind],
    };
    rc = dray_vk_check(ctx,
                       vkCreateComputePipelines(ctx->dev, VK_NULL_HANDLE, 1, &ci, NULL,
                                                &ctx->pipe[k]),
                       "vkCreateComputePipelines");
    vkDestroyShaderModule(ctx->dev, mod, NULL);
    if (rc)
        ctx->pipe[k] = VK_NULL_HANDLE;
    return rc;
}

int dray_vk_begin(struct dray_ctx *ctx)
{
    if (ctx->recording)
        return 0;
    VkCommandBufferBeginInfo bi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
    };
    int rc = dray_vk_check(ctx, vkBeginCommandBuffer(ctx->cmd, &bi), "vkBeginCommandBuffer");
    if (!rc)
        ctx->recording = true;
    return rc;
}

/* Everything recorded before is visible to everything recorded after. */
void dray_vk_barrier(struct dray_ctx *ctx)
{
    const VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                                    VK_PIPELINE_STAGE_TRANSFER_BIT;
    VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
        .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                         VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
    };
    vkCmdPipelineBarrier(ctx->cmd, st, st, 0, 1, &mb, 0, NULL, 0, NULL);
    ctx->n_recorded++;
}

/* Submit what was recorded and wait for it; resets per-submit resources. */
int dray_vk_flush(struct dray_ctx *ctx)
{
    int rc = 0;

    if (!ctx->recording)
        return 0;
    ctx->recording = false;
    rc = dray_vk_check(ctx, vkEndCommandBuffer(ctx->cmd), "vkEndCommandBuffer");
    if (!rc && ctx->n_recorded) {
        VkPipelineStageFlags st = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        VkSubmitInfo si = {
            .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
            .commandBufferCount = 1,
            .pCommandBuffers = &ctx->cmd,
            .pWaitDstStageMask = &st,
        };
        rc = dray_vk_check(ctx, vkQueueSubmit(ctx->queue, 1, &si, ctx->fence), "vkQueueSubmit");
        if (!rc)
            rc = dray_vk_check(ctx, vkWaitForFences(ctx->dev, 1, &ctx->fence, VK_TRUE, UINT64_MAX),
                               "vkWaitForFences");
        vkResetFences(ctx->dev, 1, &ctx->fence);
    }
    vkResetCommandBuffer(ctx->cmd, 0);
    vkResetDescriptorPool(ctx->dev, ctx->dpool, 0);
    ctx->sets_used = 0;
    ctx->sused = 0;
    ctx->n_recorded = 0;
    ctx->epoch++;
    return rc;
}

/* Tokens per dispatch so that a window of rows stride_bytes apart, each
 * row_bytes long, fits one binding and the grid; 0 if one row does not fit. */
uint32_t dray_vk_tok_chunk(struct dray_ctx *ctx, size_t stride_bytes, size_t row_bytes)
{
    size_t room = ctx->max_range - ctx->off_align;
    if (row_bytes > room)
        return 0;
    size_t n = stride_bytes ? 1 + (room - row_bytes) / stride_bytes : VK_MAX_GROUPS;
    return n < VK_MAX_GROUPS ? (uint32_t)n : VK_MAX_GROUPS;
}

/* Do byte ranges [a, a+na) and [b, b+nb) of the same buffer intersect? */
bool dray_vk_overlap(struct dray_view a, size_t na, struct dray_view b, size_t nb)
{
    return a.buf == b.buf && a.offset < b.offset + nb && b.offset < a.offset + na;
}

/* The window [first, first+len) bytes of view v, relative to v.offset. */
struct vk_bind dray_vk_bind(struct dray_view v, size_t first, size_t len, uint32_t esize)
{
    return (struct vk_bind){v.buf, v.offset + first, len, esize};
}

/* Descriptor window for b: aligned down start, range <= maxStorageBufferRange.
 * *boff is the element index of b->start inside the bound range. */
static int vk_window(struct dray_ctx *ctx, const struct vk_bind *b, VkDescriptorBufferInfo *di,
                     uint32_t *boff)
{
    size_t base = b->start - b->start % ctx->off_align;
    size_t delta = b->start - base;
    size_t range = delta + (b->len ? b->len : b->esize);

    if (!b->buf)
        return dray_vk_fail(ctx, DRAY_EINVAL, "NULL buffer in a view");
    if (b->start > b->buf->nbytes || b->len > b->buf->nbytes - b->start)
        return dray_vk_fail(ctx, DRAY_EINVAL,
                            "view bytes [%zu, %zu) lie outside a buffer of %zu bytes", b->start,
                            b->start + b->len, b->buf->nbytes);
    if (delta % b->esize)
        return dray_vk_fail(ctx, DRAY_EINVAL, "view offset %zu is not aligned to %u bytes",
                            b->start, b->esize);
    range = (range + 3) & ~(size_t)3;
    if (base + range > b->buf->span)
        range = b->buf->span - base;
    if (range > ctx->max_range)
        return dray_vk_fail(ctx, DRAY_ENOTSUP,
                            "a binding of %zu bytes exceeds maxStorageBufferRange %llu", range,
                            (unsigned long long)ctx->max_range);
    *di = (VkDescriptorBufferInfo){b->buf->buf, base, range};
    *boff = (uint32_t)(delta / b->esize);
    return 0;
}

int dray_vk_dispatch(struct dray_ctx *ctx, enum vk_kernel k, const struct vk_bind *binds,
                     uint32_t n_bind, const void *args, size_t args_size, uint32_t gx, uint32_t gy,
                     uint32_t gz)
{
    VkDescriptorBufferInfo di[VK_MAX_BIND];
    uint32_t push[VK_PUSH_BYTES / 4] = {0};
    VkDescriptorSet set;
    int rc;

    if (n_bind != vk_kernels[k].n_bind || args_size > VK_PUSH_ARGS)
        return dray_vk_fail(ctx, DRAY_EBACKEND, "kernel %s: bad binding count or push size",
                            vk_kernels[k].name);
    if (gx == 0 || gy == 0 || gz == 0)
        return 0;
    if (gx > VK_MAX_GROUPS || gy > VK_MAX_GROUPS || gz > VK_MAX_GROUPS)
        return dray_vk_fail(ctx, DRAY_EBACKEND, "kernel %s: grid %ux%ux%u too large",
                            vk_kernels[k].name, gx, gy, gz);
    for (uint32_t i = 0; i < n_bind; i++) {
        rc = vk_window(ctx, &binds[i], &di[i], &push[i]);
        if (rc)
            return rc;
        binds[i].buf->writes++; /* a kernel may write any buffer it binds */
    }
    memcpy(push + VK_MAX_BIND, args, args_size);
    rc = vk_pipeline(ctx, k);
    if (!rc && (ctx->sets_used >= VK_SETS_PER_POOL || ctx->n_recorded >= VK_MAX_RECORDED))
        rc = dray_vk_flush(ctx);
    if (!rc)
        rc = dray_vk_begin(ctx);
    if (rc)
        return rc;
    rc = dray_vk_dset_get(ctx, n_bind, di, &set);
    if (rc)
        return rc;
    vkCmdBindPipeline(ctx->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, ctx->pipe[k]);
    vkCmdBindDescriptorSets(ctx->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, ctx->plo[n_bind], 0, 1, &set,
                            0, NULL);
    vkCmdPushConstants(ctx->cmd, ctx->plo[n_bind], VK_SHADER_STAGE_COMPUTE_BIT, 0, VK_PUSH_BYTES,
                       push);
    vkCmdDispatch(ctx->cmd, gx, gy, gz);
    dray_vk_barrier(ctx);
    return 0;
}
