/* Packed weights (ABI version 3; two-level scales, version 4):
 * weight_create/weight_free, and matmul and embed on a handle.
 *
 * Device layout: the host's own row-major order, one buffer holding
 *   codes  [n_out][G] groups of B = 16/20/24/32 bytes (backend.h's bit layout),
 *   sub    two levels only, [n_out][S] super-blocks of 256 inputs: 4/5 bits,
 *          the 8 groups' 6-bit (s, n) in 12 bytes as GGUF packs them; 6 bits,
 *          the 16 int8 half-group scales as given,
 *   d      [n_out][G] in the format's type (f32, or f16 read with unpackHalf2x16);
 *          two levels: the f16 D, [n_out][S],
 *   m      [n_out][G] likewise, has_min only (two levels: M),
 * back to back with no padding, so a decode reads exactly the weight bytes the
 * CPU plugin reads, and a two-level matrix GGUF's bytes (Q4_K 144, Q5_K 176,
 * Q6_K 210 per 256 weights). Kernels read codes as uint words: a group is B/4
 * words and the 32 lanes of one output row read 32 consecutive groups, one
 * contiguous run of memory (coalesced). An f16 array bound at a half-word
 * boundary is bound with 2-byte elements, so the kernel's index is in halves
 * and it picks the half of the word it reads (matmul_packed.comp,
 * embed_packed.comp).
 *
 * Matmul first quantizes the activations per (token, pass) and group into the
 * context's scratch buffer (quant_groups.comp), then runs the grouped int8 dot
 * (matmul_packed.comp) over windows of rows that fit one binding. */
#include <string.h>

#include "vk_internal.h"

#define F32 4u
#define VK_PACKED_MAGIC 0x56504b31u /* "VPK1": a live handle of this plugin */
#define VK_MMP_TT 4u                 /* tokens per workgroup in matmul_packed.comp */
#define VK_MMP_RG 4u                 /* rows per workgroup in matmul_packed.comp */
#define VK_QG_GROUPS 8u              /* groups per workgroup in quant_groups.comp */
#define VK_MMP_MAX_TOK 256u          /* tokens per quantize + matmul round (bounds scratch) */
#define VK_SN_CHUNK 65536u           /* super-blocks per staging round of packed (s, n) */

struct dray_packed {
    uint32_t magic;
    struct dray_wformat f;
    uint32_t n_out, k, uses;
    struct dray_buf *buf;
    size_t off_sub, off_d, off_m; /* bytes: codes start at 0 */
    uint64_t bytes;               /* codes + sub + d + m */
};

/* Bytes of one row of each array. */
struct vk_rows {
    size_t codes, sub, scales; /* scales: of d, and of m with a min */
};

static struct vk_rows vk_row_bytes(const struct dray_packed *w)
{
    size_t S = w->k / 256u;
    struct vk_rows r = {(size_t)(w->k / 32u) * dray_util_wformat_group_bytes(w->f),
                        w->f.super ? S * (w->f.bits == 6 ? 16u : 12u) : 0,
                        (size_t)dray_util_wformat_scales_per_row(w->f, w->k) *
                            dray_util_wformat_scale_bytes(w->f)};
    return r;
}

/* One super-block's 8 (s, n) pairs of 6 bits into GGUF's 12 bytes (the kernels
 * unpack them as its get_scale_min_k4): groups 0..3 in the low 6 bits of q[j]
 * and q[j+4], groups 4..7 as a nibble of q[j+8] each and their top 2 bits
 * above groups 0..3's. */
static void vk_pack_sn(const uint8_t sn[16], uint8_t q[12])
{
    for (int j = 0; j < 4; j++) {
        uint8_t s4 = sn[2 * (j + 4)], n4 = sn[2 * (j + 4) + 1];
        q[j] = (uint8_t)(sn[2 * j] | (s4 >> 4) << 6);
        q[j + 4] = (uint8_t)(sn[2 * j + 1] | (n4 >> 4) << 6);
        q[j + 8] = (uint8_t)((s4 & 15) | (n4 & 15) << 4);
    }
}

/* The sub array of a two-level handle from the host's: 6 bits as given, 4/5
 * bits packed 16 bytes to 12 per super-block, staged a chunk at a time. */
static int vk_upload_sub(struct dray_ctx *ctx, const struct dray_packed *w, const uint8_t *sub)
{
    uint64_t nsb = (uint64_t)w->n_out * (w->k / 256u);
    struct dray_view v = {w->buf, w->off_sub};
    if (w->f.bits == 6)
        return dray_vk_upload(ctx, v, sub, (size_t)nsb * 16u);
    uint64_t chunk = nsb < VK_SN_CHUNK ? nsb : VK_SN_CHUNK;
    uint8_t *st = dray_vk_alloc((size_t)chunk * 12u);
    if (!st)
        return dray_vk_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory for staging");
    int rc = 0;
    for (uint64_t s0 = 0; !rc && s0 < nsb; s0 += chunk) {
        uint64_t m = nsb - s0 < chunk ? nsb - s0 : chunk;
        for (uint64_t i = 0; i < m; i++)
            vk_pack_sn(sub + (s0 + i) * 16u, st + i * 12u);
        v.offset = w->off_sub + (size_t)(s0 * 12u);
        rc = dray_vk_upload(ctx, v, st, (size_t)m * 12u);
    }
    dray_vk_free(st);
    return rc;
}

/* Allocate w's buffer and copy the host's arrays into it. */
static int vk_upload_weight(struct dray_ctx *ctx, struct dray_packed *w,
                            const struct dray_weight_desc *desc)
{
    size_t nd = w->off_m - w->off_d;
    int rc = dray_vk_buf_alloc(ctx, (size_t)w->bytes, &w->buf);
    if (!rc)
        rc = dray_vk_upload(ctx, (struct dray_view){w->buf, 0}, desc->codes, w->off_sub);
    if (!rc && w->f.super)
        rc = vk_upload_sub(ctx, w, desc->sub);
    if (!rc)
        rc = dray_vk_upload(ctx, (struct dray_view){w->buf, w->off_d}, desc->d, nd);
    if (!rc && w->f.has_min)
        rc = dray_vk_upload(ctx, (struct dray_view){w->buf, w->off_m}, desc->m, nd);
    return rc;
}

int dray_vk_weight_create(struct dray_ctx *ctx, const struct dray_weight_desc *desc,
                          struct dray_packed **out, uint64_t *device_bytes)
{
    if (!out)
        return dray_vk_fail(ctx, DRAY_EINVAL, "weight_create: NULL handle pointer");
    *out = NULL;
    int rc = dray_util_check_weight_desc(desc, VK_WFORMATS, ctx->err, sizeof(ctx->err));
    if (rc)
        return rc;
    struct dray_packed *w = dray_vk_alloc(sizeof(*w));
    if (!w)
        return dray_vk_fail(ctx, DRAY_ENOMEM, "weight_create: out of host memory");
    *w = (struct dray_packed){VK_PACKED_MAGIC, desc->format, desc->n_out, desc->k, desc->uses,
                              NULL, 0, 0, 0, 0};
    struct vk_rows r = vk_row_bytes(w);
    uint64_t n = w->n_out, ns = n * r.scales;
    w->off_sub = (size_t)(n * r.codes);
    w->off_d = (size_t)(n * (r.codes + r.sub));
    w->off_m = (size_t)(w->off_d + ns);
    w->bytes = n * (r.codes + r.sub) + ns * (w->f.has_min ? 2u : 1u);
    if (w->bytes > SIZE_MAX)
        rc = dray_vk_fail(ctx, DRAY_ENOMEM, "weight_create: %llu bytes", (unsigned long long)w->bytes);
    if (!rc)
        rc = vk_upload_weight(ctx, w, desc);
    if (rc) {
        dray_vk_weight_free(ctx, w);
        return rc;
    }
    *out = w;
    if (device_bytes)
        *device_bytes = w->bytes;
    return 0;
}

void dray_vk_weight_free(struct dray_ctx *ctx, struct dray_packed *w)
{
    if (!w)
        return;
    dray_vk_buf_free(ctx, w->buf); /* flushes: queued ops may still read it */
    w->magic = 0;
    dray_vk_free(w);
}

/* A handle of this plugin, or NULL (then the shared checks say why). */
static const struct dray_packed *vk_handle(const struct dray_packed *w)
{
    return w && w->magic == VK_PACKED_MAGIC ? w : NULL;
}

/* The windows of rows [r, r+n) of codes, d and m (b[0..2]; m is d again
 * without a min) and of sub (*sub; d again with one level of scales). */
static void vk_weight_binds(const struct dray_packed *w, uint32_t r, uint32_t n, struct vk_bind *b,
                            struct vk_bind *sub)
{
    struct vk_rows rb = vk_row_bytes(w);
    uint32_t sb = dray_util_wformat_scale_bytes(w->f);
    struct dray_view v = {w->buf, 0};
    size_t ns = (size_t)n * rb.scales;
    b[0] = dray_vk_bind(v, (size_t)r * rb.codes, (size_t)n * rb.codes, F32);
    b[1] = dray_vk_bind(v, w->off_d + (size_t)r * rb.scales, ns, sb);
    b[2] = w->f.has_min ? dray_vk_bind(v, w->off_m + (size_t)r * rb.scales, ns, sb) : b[1];
    *sub = w->f.super ? dray_vk_bind(v, w->off_sub + (size_t)r * rb.sub, (size_t)n * rb.sub, F32)
                      : b[1];
}

/* Rows per dispatch: the codes of a window (the largest array) fit one binding. */
static uint32_t vk_weight_window(struct dray_ctx *ctx, const struct dray_packed *w, uint64_t cap)
{
    uint64_t nr = (ctx->max_range - ctx->off_align) / vk_row_bytes(w).codes;
    nr = nr < cap ? nr : cap;
    return (uint32_t)(nr < w->n_out ? nr : w->n_out);
}

/* The matmul variant of format f: Q4, Q5, Q8, then the two-level Q4K, Q5K,
 * Q6K (7 bindings, the sub-scales last) in enum order, with the packed int8
 * dot product where the device has it. */
static enum vk_kernel vk_matmul_kernel(struct dray_ctx *ctx, struct dray_wformat f)
{
    uint32_t i = (f.bits == 4 ? 0u : f.bits == 5 ? 1u : 2u) + (f.super ? 3u : 0u);
    enum vk_kernel k = (enum vk_kernel)(VK_K_MATMUL_Q4 + i);
    return ctx->has_dp4a ? k + (VK_K_MATMUL_Q4_DOT - VK_K_MATMUL_Q4) : k;
}

/* Tokens [t, t+c): quantize into scratch, then the dot over row windows. */
static int vk_matmul_packed_chunk(struct dray_ctx *ctx, const struct dray_matmul_args *a,
                                  const struct dray_packed *w, uint32_t passes, uint32_t t,
                                  uint32_t c)
{
    uint32_t G = a->k / 32u, R = c * passes;
    size_t qbytes = (size_t)R * a->k, sxoff = (qbytes + 63) / 64 * 64, sxbytes = (size_t)R * G * 8;
    struct dray_view scr = {ctx->scratch, 0}, sxv = {ctx->scratch, sxoff};
    struct {
        uint32_t k, stride_x, passes;
    } qp = {a->k, a->stride_x, passes};
    struct vk_bind qb[3] = {
        dray_vk_bind(a->x, (size_t)t * a->stride_x * F32,
                     ((size_t)(c - 1) * a->stride_x + a->k) * F32, F32),
        dray_vk_bind(scr, 0, qbytes, F32), dray_vk_bind(sxv, 0, sxbytes, F32)};
    int rc = dray_vk_dispatch(ctx, VK_K_QUANT_GROUPS, qb, 3, &qp, sizeof(qp),
                              (G + VK_QG_GROUPS - 1) / VK_QG_GROUPS, c, 1);
    uint32_t nr = vk_weight_window(ctx, w, (uint64_t)VK_MAX_GROUPS * VK_MMP_RG);
    struct {
        uint32_t k, n_tok, passes, stride_o, accumulate, n_rows, f16, has_min;
        float z;
    } mp = {a->k, c, passes, a->stride_out, a->accumulate, 0, w->f.scale == DRAY_WSCALE_F16,
            w->f.has_min, (float)dray_util_wformat_z(w->f)};
    for (uint32_t r = 0; !rc && r < a->n_out; r += nr) {
        uint32_t n = a->n_out - r < nr ? a->n_out - r : nr;
        struct vk_bind b[7] = {dray_vk_bind(scr, 0, qbytes, F32),
                               dray_vk_bind(sxv, 0, sxbytes, F32)};
        vk_weight_binds(w, r, n, b + 2, b + 6);
        b[5] = dray_vk_bind(a->out, ((size_t)t * a->stride_out + r) * F32,
                            ((size_t)(c - 1) * a->stride_out + n) * F32, F32);
        mp.n_rows = n;
        rc = dray_vk_dispatch(ctx, vk_matmul_kernel(ctx, w->f), b, w->f.super ? 7 : 6, &mp,
                              sizeof(mp), (n + VK_MMP_RG - 1) / VK_MMP_RG,
                              (c + VK_MMP_TT - 1) / VK_MMP_TT, 1);
    }
    return rc;
}

int dray_vk_matmul_packed(struct dray_ctx *ctx, const struct dray_matmul_args *a)
{
    const struct dray_packed *w = vk_handle(a->packed);
    struct dray_util_needs nd;
    int rc = dray_util_check_matmul_packed(a, w ? w->n_out : 0, w ? w->k : 0, VK_PASSES, &nd,
                                           ctx->err, sizeof(ctx->err));
    if ((rc = dray_vk_check_args(ctx, rc, &nd)))
        return rc;
    if (!w || !(w->uses & DRAY_WUSE_MATMUL))
        return dray_vk_fail(ctx, DRAY_EINVAL, "matmul: the handle is not a live one created "
                                              "for matmul");
    if (a->n_tok == 0)
        return 0;
    uint32_t passes = a->passes ? a->passes : 1u;
    /* tokens per round: q rows, x rows and out rows must each fit a binding */
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)passes * a->k, (size_t)passes * a->k);
    uint32_t n2 = dray_vk_tok_chunk(ctx, (size_t)a->stride_x * F32, (size_t)a->k * F32);
    uint32_t n3 = dray_vk_tok_chunk(ctx, (size_t)a->stride_out * F32, (size_t)a->n_out * F32);
    nt = nt < n2 ? nt : n2;
    nt = nt < n3 ? nt : n3;
    nt = nt < VK_MMP_MAX_TOK ? nt : VK_MMP_MAX_TOK;
    nt = nt < a->n_tok ? nt : a->n_tok;
    if (!nt)
        return dray_vk_fail(ctx, DRAY_ENOTSUP, "matmul: one row is larger than a binding");
    size_t R = (size_t)nt * passes;
    if ((rc = dray_vk_scratch(ctx, (R * a->k + 63) / 64 * 64 + R * (a->k / 32u) * 8)))
        return rc;
    for (uint32_t t = 0; !rc && t < a->n_tok; t += nt) {
        uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
        rc = vk_matmul_packed_chunk(ctx, a, w, passes, t, c);
    }
    return rc;
}

int dray_vk_embed_packed(struct dray_ctx *ctx, const struct dray_embed_args *a)
{
    const struct dray_packed *w = vk_handle(a->packed);
    struct dray_util_needs nd;
    int32_t *ids = NULL;
    int rc = dray_util_check_embed_packed(a, w ? w->n_out : 0, w ? w->k : 0,
                                          w && (w->uses & DRAY_WUSE_EMBED), &nd, ctx->err,
                                          sizeof(ctx->err));
    if ((rc = dray_vk_check_args(ctx, rc, &nd)) || a->n_tok == 0)
        return rc;
    if ((rc = dray_vk_embed_ids(ctx, a, &ids)))
        return rc;
    uint32_t win = vk_weight_window(ctx, w, UINT32_MAX);
    uint32_t nt = dray_vk_tok_chunk(ctx, (size_t)a->dim * F32, (size_t)a->dim * F32);
    struct {
        uint32_t dim, row0, n_win, bits, f16, has_min;
        float z, scale;
        uint32_t super;
    } pc = {a->dim, 0, 0, w->f.bits, w->f.scale == DRAY_WSCALE_F16, w->f.has_min,
            (float)dray_util_wformat_z(w->f), a->scale, w->f.super};
    if (!win || !nt)
        rc = dray_vk_fail(ctx, DRAY_ENOTSUP, "embed: one row is larger than a binding");
    for (uint32_t r0 = 0; !rc && r0 < a->n_rows; r0 += win) {
        uint32_t nw = a->n_rows - r0 < win ? a->n_rows - r0 : win;
        bool used = dray_vk_ids_in(ids, a->n_tok, r0, nw);
        pc.row0 = r0;
        pc.n_win = nw;
        for (uint32_t t = 0; used && !rc && t < a->n_tok; t += nt) {
            uint32_t c = a->n_tok - t < nt ? a->n_tok - t : nt;
            struct vk_bind b[6] = {dray_vk_bind(a->ids, (size_t)t * 4, (size_t)c * 4, 4)};
            vk_weight_binds(w, r0, nw, b + 1, b + 5);
            b[4] = dray_vk_bind(a->out, (size_t)t * a->dim * F32, (size_t)c * a->dim * F32, F32);
            rc = dray_vk_dispatch(ctx, VK_K_EMBED_PACKED, b, 6, &pc, sizeof(pc),
                                  (a->dim + 255) / 256, c, 1);
        }
    }
    dray_vk_free(ids);
    return rc;
}
