/* Private state of the Vulkan plugin, shared by its .c files. */
#ifndef DRAY_VK_INTERNAL_H
#define DRAY_VK_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <vulkan/vulkan.h>

#include "dray/backend.h"
#include "dray/backend_util.h"

#define VK_ERRLEN 512
#define VK_MAX_BIND 8         /* storage buffers per kernel */
#define VK_PUSH_BYTES 128     /* push block: uint boff[8] then kernel args */
#define VK_PUSH_ARGS 96       /* bytes left for kernel args */
#define VK_MAX_GROUPS 65535u  /* per grid dimension, the Vulkan minimum */
#define VK_SETS_PER_POOL 512  /* descriptor sets per submit before a flush */
#define VK_MAX_RECORDED 4096  /* commands per submit: bounds an unsynchronized queue */
#define VK_DSET_CACHE 1024   /* cached descriptor sets */
#define VK_STAGING_BYTES (16u << 20)
#define VK_CHUNK_BYTES (64u << 20) /* sub-allocation granule; bigger buffers get their own */
#define VK_ROPE_SLOTS 8       /* cached frequency tables */
#define VK_ROPE_MAX_PAIRS 512 /* n_rot/2 limit */
/* packed formats, matmul and embed, every device: one level and two (v4) */
#define VK_WFORMATS (DRAY_UTIL_WF_ALL | DRAY_UTIL_WF_K)
#define VK_PASSES 3u          /* matmul on packed weights: one and two activation passes */

/* Kernel variants, in the order of vk_kernel_names in vk_exec.c. */
enum vk_kernel {
    VK_K_ADD,
    VK_K_GATED_ACT,
    VK_K_RMSNORM,
    VK_K_ROPE,
    VK_K_EMBED_F32,
    VK_K_EMBED_I8,
    VK_K_QUANT_ROWS,
    VK_K_MATMUL_I8,
    VK_K_MATMUL_DP4A,
    VK_K_MATMUL_F32,
    VK_K_KV_STORE_I8,
    VK_K_KV_STORE_F16,
    VK_K_ATTENTION_I8,
    VK_K_ATTENTION_F16,
    VK_K_QUANT_GROUPS, /* packed weights (vk_packed.c) from here on */
    VK_K_MATMUL_Q4,
    VK_K_MATMUL_Q5,
    VK_K_MATMUL_Q8,
    VK_K_MATMUL_Q4K, /* two-level scales (v4): Q4_K, Q5_K, Q6_K's shapes */
    VK_K_MATMUL_Q5K,
    VK_K_MATMUL_Q6K,
    VK_K_MATMUL_Q4_DOT, /* the same six with the packed int8 dot product */
    VK_K_MATMUL_Q5_DOT,
    VK_K_MATMUL_Q8_DOT,
    VK_K_MATMUL_Q4K_DOT,
    VK_K_MATMUL_Q5K_DOT,
    VK_K_MATMUL_Q6K_DOT,
    VK_K_EMBED_PACKED,
    VK_K_COUNT
};

/* One device memory allocation that buffers are carved from (first fit). */
struct vk_span {
    VkDeviceSize off, size;
    struct vk_span *next;
};
struct vk_chunk {
    VkDeviceMemory mem;
    VkDeviceSize size;
    struct vk_span *free_list; /* sorted by offset, coalesced */
    uint32_t n_live;           /* buffers carved from it */
    struct vk_chunk *next;
};

struct dray_buf {
    VkBuffer buf;
    struct vk_chunk *chunk;
    VkDeviceSize off, span; /* place in chunk->mem */
    size_t nbytes;          /* as asked by the caller */
    uint64_t writes;        /* bumped by every upload, copy, fill or kernel that may write it */
};

/* A window of a buffer one descriptor binds: bytes [start, start+len). */
struct vk_bind {
    struct dray_buf *buf;
    size_t start, len;
    uint32_t esize; /* element size the shader indexes with: 1, 2 or 4 */
};

struct vk_rope_key {
    uint32_t n_rot;
    float base, freq_scale;
    bool valid;
    bool has_ff;                   /* v4: made with freq_factors (ff below) */
    float ff[VK_ROPE_MAX_PAIRS];   /* their values, n_rot/2 of them */
    /* where they were read from, and that buffer's write count then: the same
     * view unwritten since needs no read-back */
    const struct dray_buf *ff_buf;
    size_t ff_off;
    uint64_t ff_writes;
};

struct dray_ctx {
    VkInstance inst;
    VkDebugUtilsMessengerEXT msgr;
    VkPhysicalDevice pdev;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    VkDeviceSize max_range;  /* maxStorageBufferRange */
    VkDeviceSize off_align;  /* minStorageBufferOffsetAlignment */
    uint32_t mem_dev;        /* memory type for buffers */
    uint32_t mem_host;       /* host-visible coherent type for staging */
    bool has_i8, has_f16, has_dp4a;

    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    bool recording;
    uint32_t n_recorded; /* commands since the last submit */

    VkDescriptorPool dpool; /* per-submit sets, reset by dray_vk_flush */
    uint32_t sets_used;
    VkDescriptorPool dcache_pool; /* cached sets (vk_dset.c) */
    struct vk_dset *dcache;
    uint64_t epoch; /* submits so far */
    uint64_t dcache_hits, dcache_misses;
    VkDescriptorSetLayout dsl[VK_MAX_BIND + 1]; /* by binding count */
    VkPipelineLayout plo[VK_MAX_BIND + 1];
    VkPipeline pipe[VK_K_COUNT];

    VkBuffer sbuf; /* staging, host visible, persistently mapped */
    VkDeviceMemory smem;
    uint8_t *smap;
    size_t sused;

    struct vk_chunk *chunks;
    struct dray_buf *scratch; /* matmul activations, overlapping copies */
    struct dray_buf *rope_tab; /* VK_ROPE_SLOTS tables of VK_ROPE_MAX_PAIRS uvec2 */
    struct vk_rope_key rope_key[VK_ROPE_SLOTS];
    uint32_t rope_next;

    bool validation;
    bool vk_flag;           /* a validation message arrived */
    char vk_msg[VK_ERRLEN]; /* the first one */
    char err[VK_ERRLEN];
};

/* vk_util.c: the host's services from negotiation on (NULL before: libc, no log) */
void dray_vk_set_host(const struct dray_host *host);
void *dray_vk_alloc(size_t n);
void dray_vk_free(void *p);
void dray_vk_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int dray_vk_fail(struct dray_ctx *ctx, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int dray_vk_check(struct dray_ctx *ctx, VkResult r, const char *what);
const char *dray_vk_result_str(VkResult r);

/* vk_device.c */
int dray_vk_device_count(uint32_t *count);
int dray_vk_device_props(uint32_t index, struct dray_device_props *props);
int dray_vk_open(uint32_t index, const struct dray_open_options *opt, struct dray_ctx **out,
                 char *err, size_t errlen);
void dray_vk_close(struct dray_ctx *ctx);

/* vk_mem.c */
int dray_vk_buf_alloc(struct dray_ctx *ctx, size_t nbytes, struct dray_buf **out);
void dray_vk_buf_free(struct dray_ctx *ctx, struct dray_buf *buf);
void dray_vk_mem_release(struct dray_ctx *ctx);
int dray_vk_upload(struct dray_ctx *ctx, struct dray_view dst, const void *src, size_t nbytes);
int dray_vk_download(struct dray_ctx *ctx, void *dst, struct dray_view src, size_t nbytes);
int dray_vk_copy(struct dray_ctx *ctx, struct dray_view dst, struct dray_view src, size_t nbytes);
int dray_vk_fill(struct dray_ctx *ctx, struct dray_view dst, uint32_t pattern, size_t nbytes);
int dray_vk_scratch(struct dray_ctx *ctx, size_t nbytes);
/* An op's contract checks: rc is what the shared validator (dray_util_check_<op>,
 * which wrote its reason into ctx->err) returned; when 0, every view it listed
 * is checked against its buffer. */
int dray_vk_check_args(struct dray_ctx *ctx, int rc, const struct dray_util_needs *nd);
int dray_vk_check_view(struct dray_ctx *ctx, const char *what, struct dray_view v, size_t nbytes,
                       size_t align);

/* vk_exec.c */
int dray_vk_exec_init(struct dray_ctx *ctx);
void dray_vk_exec_release(struct dray_ctx *ctx);
int dray_vk_begin(struct dray_ctx *ctx);
void dray_vk_barrier(struct dray_ctx *ctx);
int dray_vk_flush(struct dray_ctx *ctx);
int dray_vk_dispatch(struct dray_ctx *ctx, enum vk_kernel k, const struct vk_bind *binds,
                     uint32_t n_bind, const void *args, size_t args_size, uint32_t gx, uint32_t gy,
                     uint32_t gz);
uint32_t dray_vk_tok_chunk(struct dray_ctx *ctx, size_t stride_bytes, size_t row_bytes);
bool dray_vk_overlap(struct dray_view a, size_t na, struct dray_view b, size_t nb);
struct vk_bind dray_vk_bind(struct dray_view v, size_t first, size_t len, uint32_t esize);

/* vk_dset.c */
int dray_vk_dset_init(struct dray_ctx *ctx);
void dray_vk_dset_release(struct dray_ctx *ctx);
void dray_vk_dset_forget(struct dray_ctx *ctx, VkBuffer b);
int dray_vk_dset_get(struct dray_ctx *ctx, uint32_t n, const VkDescriptorBufferInfo *di,
                     VkDescriptorSet *out);

/* vk_ops.c, vk_attn.c */
int dray_vk_embed(struct dray_ctx *ctx, const struct dray_embed_args *a);
int dray_vk_rmsnorm(struct dray_ctx *ctx, const struct dray_rmsnorm_args *a);
int dray_vk_matmul(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_vk_rope(struct dray_ctx *ctx, const struct dray_rope_args *a);
int dray_vk_gated_act(struct dray_ctx *ctx, const struct dray_gated_act_args *a);
int dray_vk_add(struct dray_ctx *ctx, const struct dray_add_args *a);
int dray_vk_kv_store(struct dray_ctx *ctx, const struct dray_kv_store_args *a);
int dray_vk_attention(struct dray_ctx *ctx, const struct dray_attention_args *a);
/* embed's ids read back and checked against n_rows; *out is freed by the caller */
int dray_vk_embed_ids(struct dray_ctx *ctx, const struct dray_embed_args *a, int32_t **out);
/* Whether any of the n ids falls in the row window [r0, r0 + nw): a gather
 * skips the windows no token reads. */
static inline bool dray_vk_ids_in(const int32_t *ids, uint32_t n, uint32_t r0, uint32_t nw)
{
    for (uint32_t t = 0; t < n; t++)
        if ((uint32_t)ids[t] >= r0 && (uint32_t)ids[t] < r0 + nw)
            return true;
    return false;
}

/* vk_packed.c: packed weights (version 3) */
int dray_vk_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                          struct dray_packed **out, uint64_t *device_bytes);
void dray_vk_weight_free(struct dray_ctx *ctx, struct dray_packed *w);
int dray_vk_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a);
int dray_vk_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a);

#endif
