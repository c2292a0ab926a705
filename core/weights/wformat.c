/* The weight policy (wformat.h). */
#include "wformat.h"

#include <stdio.h>
#include <string.h>

#include "caps.h"
#include "gguf.h"

/* The two-level host name every part shares (Q4_K, Q5_K or Q6_K in the file,
 * whole super-blocks of 256), else 0. */
static uint32_t kquant_of(const struct dray_gguf_tensor *const *parts, uint32_t n_parts)
{
    uint32_t type = parts[0]->type;
    for (uint32_t i = 0; i < n_parts; i++)
        if (parts[i]->type != type || parts[i]->ne[0] % 256)
            return 0;
    return type == DRAY_GGML_Q4_K ? DRAY_Q4K : type == DRAY_GGML_Q5_K ? DRAY_Q5K : type == DRAY_GGML_Q6_K ? DRAY_Q6K : 0;
}

void dray_wformat_pick(const struct dray_op_caps *c, enum dray_precision p, enum dray_wrole role,
                       const struct dray_gguf_tensor *const *parts, uint32_t n_parts, struct dray_wpick *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t k = parts[0]->ne[0];
    bool table = role == DRAY_WROLE_TABLE;
    out->uses = table ? DRAY_WUSE_EMBED | DRAY_WUSE_MATMUL : DRAY_WUSE_MATMUL;
    if (role == DRAY_WROLE_GROUP_ROWS) { /* the 8-bit groups as rows of an I8 table */
        out->dtype = DRAY_I8;
        out->group_rows = true;
        return;
    }
    if (p == DRAY_PRECISION_F32 || p == DRAY_PRECISION_INT8) {
        out->dtype = p == DRAY_PRECISION_F32 ? DRAY_F32 : DRAY_I8;
        return;
    }
    if (k % 32) { /* int8 per row takes any k */
        out->dtype = DRAY_I8;
        snprintf(out->why, sizeof(out->why), "%s: %llu inputs are not whole groups of 32; int8 rows",
                 parts[0]->name, (unsigned long long)k);
        return;
    }
    /* W4A8: GGUF's K quants as they are, where the device takes their
     * two-level format (ABI v4) for every use of the matrix */
    uint32_t kq = p == DRAY_PRECISION_W4A8 ? kquant_of(parts, n_parts) : 0;
    if (kq && (role != DRAY_WROLE_HEAD4 || kq == DRAY_Q4K) && dray_caps_runs(c, DRAY_OP_MATMUL, kq) &&
        (!table || dray_caps_runs(c, DRAY_OP_EMBED, kq))) {
        out->dtype = kq;
        return;
    }
    if (p == DRAY_PRECISION_INT8G && role != DRAY_WROLE_HEAD4) {
        out->dtype = DRAY_Q8G32;
        return;
    }
    /* W4A8 (and the 4-bit head of either grouped precision): 4-bit only where
     * every part is 4-bit in the file (never a wider source rounded onto a
     * coarser grid) unless the role asks for the 4-bit head; 5-bit files
     * exactly in 5-bit groups; the rest 8-bit groups */
    bool all4 = true, all5 = true, allh = true;
    for (uint32_t i = 0; i < n_parts; i++) {
        all4 = all4 && dray_ggml_is_4bit(parts[i]->type);
        all5 = all5 && dray_ggml_is_5bit(parts[i]->type);
        /* f16 d and m: rounded here (fitted to f16), or Q4_0 / Q4_1 in the file */
        allh = allh && (!dray_ggml_is_4bit(parts[i]->type) || dray_gguf_tensor_q4_half(parts[i]));
    }
    if (role == DRAY_WROLE_HEAD4 || all4) {
        out->round = !all4;
        /* f16 d and m where they fit and the device runs them (20 bytes per 32
         * weights against 24); a gather table keeps f32 d and m */
        out->dtype = !table && allh && dray_caps_q4h(c) ? DRAY_Q4G32H : DRAY_Q4G32;
        return;
    }
    /* the embed op gathers 8- and 4-bit groups: a 5-bit table is 8-bit groups */
    out->dtype = all5 && !table && dray_caps_q5(c) ? DRAY_Q5G32 : DRAY_Q8G32;
    if (all5 && !table && out->dtype == DRAY_Q8G32)
        snprintf(out->why, sizeof(out->why), "%s: the device does not declare q5hm; 8-bit groups",
                 parts[0]->name);
}
