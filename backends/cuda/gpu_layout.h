/*
 * gpu_layout.h — where weight_create puts packed weights (backend.h, "Packed
 * weights") in device memory. Plain C, no runtime: tests/test_gpu_host.c checks
 * it on machines without a GPU.
 *
 * One device allocation per handle, the host's arrays as given, back to back:
 *   codes  at 0            [n_out][G][B] bytes, G = k/32 groups per row, B = 16
 *                          (4 bits), 20 (5 bits), 32 (8 bits): row-major groups,
 *                          codes packed exactly as backend.h describes
 *   d      at d_off        [n_out][G] in the format's type (an f16 stays binary16)
 *   m      at m_off        [n_out][G] the same type, has_min only (else m_bytes 0)
 * total = codes + d + m bytes, no padding: the device holds what the host gave.
 * Why this layout: the dot kernel gives each lane whole groups of one row, so
 * the lanes of a warp read consecutive groups (coalesced 16/20/32-byte loads)
 * and no repacking is needed. Alignment holds without padding: the allocation
 * is 256-byte aligned, B is 16 or 32 (16-byte vector loads) or 20 (4-byte
 * loads), so codes bytes are a multiple of 4 and d, m start aligned for their
 * 4- or 2-byte values.
 */
#ifndef DRAY_GPU_LAYOUT_H
#define DRAY_GPU_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dray/backend.h"
#include "dray/backend_util.h"

struct gpu_wlayout {
    uint32_t group_bytes;  /* B */
    uint32_t scale_bytes;  /* 4 (f32) or 2 (f16) per d or m value */
    uint64_t n_groups;     /* n_out * k/32 */
    uint64_t codes_bytes;  /* n_groups * B, at offset 0 */
    uint64_t d_off, d_bytes;
    uint64_t m_off, m_bytes; /* m_bytes 0 without a min */
    uint64_t total;        /* device bytes of the handle */
};

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
    l->group_bytes = dray_util_wformat_group_bytes(desc->format);
    l->scale_bytes = dray_util_wformat_scale_bytes(desc->format);
    l->n_groups = (uint64_t)desc->n_out * (desc->k / 32u); /* < 2^43: no overflow below */
    l->codes_bytes = l->n_groups * l->group_bytes;
    l->d_off = l->codes_bytes;
    l->d_bytes = l->n_groups * l->scale_bytes;
    l->m_off = l->d_off + l->d_bytes;
    l->m_bytes = desc->format.has_min ? l->d_bytes : 0;
    l->total = l->m_off + l->m_bytes;
    if (l->total > SIZE_MAX)
        return dray_util_fail(why, len, DRAY_ERANGE, "weight_create: %llu bytes do not fit in memory",
                              (unsigned long long)l->total);
    return 0;
}

#endif
