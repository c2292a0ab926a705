/*
 * gpu_layout.h — where weight_create puts packed weights (backend.h, "Packed
 * weights") in device memory. Plain C, no runtime: tests/test_gpu_host.c checks
 * it on machines without a GPU.
 *
 * One device allocation per handle, sections back to back:
 *   codes  at 0            [n_out][G][B] bytes, G = k/32 groups per row, B = 16
 *                          (4 bits), 20 (5 bits), 24 (6 bits), 32 (8 bits):
 *                          row-major groups, codes packed exactly as backend.h
 *                          describes
 *   sub    at sub_off      two-level formats only (else sub_bytes 0):
 *                          [n_out][S][12] for 4 and 5 bits, S = k/256: each
 *                          super-block's eight 6-bit (s, n) pairs in GGUF's
 *                          12-byte packing (kernels/cuda/gpu_kscales.h);
 *                          [n_out][k/16] int8 for 6 bits, as given
 *   d      at d_off        [n_out][G] in the format's type (an f16 stays
 *                          binary16); two levels: [n_out][S] f16 D
 *   m      at m_off        the same shape and type as d, has_min only (else
 *                          m_bytes 0); two levels: M
 * total = the sections' bytes, no padding. One level holds what the host gave;
 * two levels hold exactly GGUF's bytes: per 256 weights 128 + 12 + 2 + 2 = 144
 * (Q4_K), 160 + 12 + 4 = 176 (Q5_K), 192 + 16 + 2 = 210 (Q6_K), where the
 * host's one byte per s or n would need 148 and 180.
 * Why this layout: the dot kernel gives each lane whole groups of one row, so
 * the lanes of a warp read consecutive groups (coalesced 16/20/24/32-byte
 * loads), and a group finds its scales by index alone (super-block gi/8 of
 * group gi = o*G + g, since G = 8S). Alignment holds without padding: the
 * allocation is 256-byte aligned, every B and the 12- or 16-byte sub rows are
 * multiples of 4, so sub and d start 4-aligned and m 2-aligned for its f16 (or
 * 4-aligned for f32: one level has no sub).
 */
#ifndef DRAY_GPU_LAYOUT_H
#define DRAY_GPU_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dray/backend.h"
#include "dray/backend_util.h"
#include "gpu_kscales.h"

struct gpu_wlayout {
    uint32_t group_bytes;        /* B */
    uint32_t scale_bytes;        /* 4 (f32) or 2 (f16) per d or m value */
    uint64_t n_groups;           /* n_out * k/32 */
    uint64_t n_scales;           /* entries of d (and m): n_groups, or n_out * k/256 */
    uint64_t codes_bytes;        /* n_groups * B, at offset 0 */
    uint64_t sub_off, sub_bytes; /* sub_bytes 0 for one-level formats */
    uint64_t d_off, d_bytes;
    uint64_t m_off, m_bytes;     /* m_bytes 0 without a min */
    uint64_t total;              /* device bytes of the handle */
};

/* Device bytes of sub per row of k inputs: GGUF's 12 per 256 (4, 5 bits) or
 * the host's int8 per 16 (6 bits); 0 for one-level formats. */
static inline uint64_t gpu_wlayout_sub_row(struct dray_wformat f, uint32_t k)
{
    if (!f.super)
        return 0;
    return f.bits == 6 ? k / 16u : (uint64_t)(k / 256u) * GK_KSCALE_BYTES;
}

/* weight_create's host half: check desc against backend.h's rules and the
 * formats declared (dray_util_check_weight_desc), then fill the layout.
 * Returns 0 or the check's code, with its reason in why. */
static inline int gpu_wlayout_plan(const struct dray_weight_desc *desc, uint32_t formats,
                                   struct gpu_wlayout *l, char *why, size_t len)
{
    memset(l, 0, sizeof(*l));
    int rc = dray_util_check_weight_desc(desc, formats, why, len);
    if (rc)
        return rc;
    const struct dray_wformat f = desc->format;
    l->group_bytes = dray_util_wformat_group_bytes(f);
    l->scale_bytes = dray_util_wformat_scale_bytes(f);
    l->n_groups = (uint64_t)desc->n_out * (desc->k / 32u); /* < 2^43: no overflow below */
    l->n_scales = (uint64_t)desc->n_out * dray_util_wformat_scales_per_row(f, desc->k);
    l->codes_bytes = l->n_groups * l->group_bytes;
    l->sub_off = l->codes_bytes;
    l->sub_bytes = (uint64_t)desc->n_out * gpu_wlayout_sub_row(f, desc->k);
    l->d_off = l->sub_off + l->sub_bytes;
    l->d_bytes = l->n_scales * l->scale_bytes;
    l->m_off = l->d_off + l->d_bytes;
    l->m_bytes = f.has_min ? l->d_bytes : 0;
    l->total = l->m_off + l->m_bytes;
    if (l->total > SIZE_MAX)
        return dray_util_fail(why, len, DRAY_ERANGE, "weight_create: %llu bytes do not fit in memory",
                              (unsigned long long)l->total);
    return 0;
}

/* The device's sub section (l->sub_bytes into out) from desc's sub: 4 and 5
 * bits repacked to 12 bytes a super-block, 6 bits copied. desc passed the plan. */
static inline void gpu_wlayout_sub(const struct dray_weight_desc *desc, const struct gpu_wlayout *l,
                                   uint8_t *out)
{
    const uint8_t *sub = (const uint8_t *)desc->sub;
    if (desc->format.bits == 6) {
        memcpy(out, sub, (size_t)l->sub_bytes);
        return;
    }
    const uint64_t n_super = l->sub_bytes / GK_KSCALE_BYTES; /* 16 sub bytes each */
    for (uint64_t i = 0; i < n_super; i++)
        gk_kscale_pack(sub + 16u * i, out + GK_KSCALE_BYTES * i);
}

#endif
