/* Descriptor set cache. A decode step binds the same windows of the same
 * buffers (weights, activations, KV pools) every token, so sets are kept
 * across submits in a direct-mapped table keyed by the bound windows. A set is
 * freed when its slot is taken by another key (only if no unsubmitted command
 * uses it) or when one of its buffers is freed. When a slot cannot be evicted,
 * or the persistent pool is exhausted, the set comes from the per-submit pool
 * that dray_vk_flush resets. */
#include <string.h>

#include "vk_internal.h"

struct vk_dset {
    VkDescriptorSet set; /* VK_NULL_HANDLE: slot empty */
    uint32_t n_bind;
    uint64_t epoch; /* submit that last used it; ctx->epoch = the one being recorded */
    VkDescriptorBufferInfo di[VK_MAX_BIND];
};

static uint64_t vk_dset_hash(uint32_t n, const VkDescriptorBufferInfo *di)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t w[3] = {(uint64_t)(uintptr_t)di[i].buffer, di[i].offset, di[i].range};
        for (int j = 0; j < 3; j++)
            h = (h ^ w[j]) * 1099511628211ull;
    }
    return h ^ (h >> 29);
}

int dray_vk_dset_init(struct dray_ctx *ctx)
{
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, VK_DSET_CACHE * VK_MAX_BIND};
    VkDescriptorPoolCreateInfo pi = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        .flags = VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT,
        .maxSets = VK_DSET_CACHE,
        .poolSizeCount = 1,
        .pPoolSizes = &ps,
    };
    ctx->dcache = dray_vk_alloc(VK_DSET_CACHE * sizeof(struct vk_dset));
    if (!ctx->dcache)
        return dray_vk_fail(ctx, DRAY_ENOMEM, "out of host memory");
    memset(ctx->dcache, 0, VK_DSET_CACHE * sizeof(struct vk_dset));
    return dray_vk_check(ctx, vkCreateDescriptorPool(ctx->dev, &pi, NULL, &ctx->dcache_pool),
                         "vkCreateDescriptorPool");
}

void dray_vk_dset_release(struct dray_ctx *ctx)
{
    if (ctx->dcache_pool)
        vkDestroyDescriptorPool(ctx->dev, ctx->dcache_pool, NULL); /* frees its sets */
    dray_vk_free(ctx->dcache);
    ctx->dcache = NULL;
}

/* Drop every cached set that binds buffer b (called after a flush). */
void dray_vk_dset_forget(struct dray_ctx *ctx, VkBuffer b)
{
    for (uint32_t s = 0; ctx->dcache && s < VK_DSET_CACHE; s++) {
        struct vk_dset *e = &ctx->dcache[s];
        bool hit = false;
        for (uint32_t i = 0; e->set && i < e->n_bind && !hit; i++)
            hit = e->di[i].buffer == b;
        if (hit) {
            vkFreeDescriptorSets(ctx->dev, ctx->dcache_pool, 1, &e->set);
            e->set = VK_NULL_HANDLE;
        }
    }
}

static int vk_dset_alloc(struct dray_ctx *ctx, VkDescriptorPool pool, uint32_t n,
                         VkDescriptorSet *out)
{
    VkDescriptorSetAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
        .descriptorPool = pool,
        .descriptorSetCount = 1,
        .pSetLayouts = &ctx->dsl[n],
    };
    return vkAllocateDescriptorSets(ctx->dev, &ai, out) == VK_SUCCESS ? 0 : -1;
}

static void vk_dset_write(struct dray_ctx *ctx, VkDescriptorSet set, uint32_t n,
                          const VkDescriptorBufferInfo *di)
{
    VkWriteDescriptorSet w[VK_MAX_BIND];
    for (uint32_t i = 0; i < n; i++)
        w[i] = (VkWriteDescriptorSet){
            .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
            .dstSet = set,
            .dstBinding = i,
            .descriptorCount = 1,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .pBufferInfo = &di[i],
        };
    vkUpdateDescriptorSets(ctx->dev, n, w, 0, NULL);
}

/* A set with n storage buffers bound to di[]; valid for the submit being recorded. */
int dray_vk_dset_get(struct dray_ctx *ctx, uint32_t n, const VkDescriptorBufferInfo *di,
                     VkDescriptorSet *out)
{
    struct vk_dset *e = &ctx->dcache[vk_dset_hash(n, di) % VK_DSET_CACHE];

    if (e->set && e->n_bind == n && memcmp(e->di, di, n * sizeof(*di)) == 0) {
        e->epoch = ctx->epoch;
        ctx->dcache_hits++;
        *out = e->set;
        return 0;
    }
    ctx->dcache_misses++;
    if (!e->set || e->epoch != ctx->epoch) { /* free or evictable: cache the new set */
        if (e->set)
            vkFreeDescriptorSets(ctx->dev, ctx->dcache_pool, 1, &e->set);
        e->set = VK_NULL_HANDLE;
        if (vk_dset_alloc(ctx, ctx->dcache_pool, n, &e->set) == 0) {
            e->n_bind = n;
            e->epoch = ctx->epoch;
            memcpy(e->di, di, n * sizeof(*di));
            vk_dset_write(ctx, e->set, n, di);
            *out = e->set;
            return 0;
        }
        e->set = VK_NULL_HANDLE;
    }
    /* slot busy in this submit, or the cache pool is full: a one-submit set */
    if (vk_dset_alloc(ctx, ctx->dpool, n, out) != 0)
        return dray_vk_fail(ctx, DRAY_EBACKEND, "vkAllocateDescriptorSets failed");
    ctx->sets_used++;
    vk_dset_write(ctx, *out, n, di);
    return 0;
}
