/* The weight policy: the one place that decides the format each matrix is
 * prepared in, from the file's tensor types, the precision the configuration
 * asks for, what the matrix is for (its role) and the packed formats the
 * device declares (ABI v3). Every fallback it takes is said in one line. */
#ifndef DRAY_CORE_WFORMAT_H
#define DRAY_CORE_WFORMAT_H

#include <stdbool.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/dray.h"
#include "dray/gguf.h"

/* What a prepared matrix is read by. */
enum dray_wrole {
    DRAY_WROLE_MATMUL = 0, /* a layer's matrix, or an output head of its own */
    DRAY_WROLE_TABLE,      /* token_embd: gathered by embed, and a tied head's matmul */
    DRAY_WROLE_HEAD4,      /* the 4-bit output head: a wider file is rounded (lossy, cached) */
    DRAY_WROLE_GROUP_ROWS, /* an 8-bit gather table whose rows are groups (head_rescore.c) */
};

/* Grouped formats are named on the host by the dtypes that were their ABI v2
 * layouts; the device receives their layout-neutral format (dray_caps_wformat):
 * DRAY_Q8G32 = q8, DRAY_Q4G32 = q4m, DRAY_Q4G32H = q4hm, DRAY_Q5G32 = q5hm. */
struct dray_wpick {
    uint32_t dtype;  /* DRAY_F32, DRAY_I8 or a grouped format */
    uint32_t uses;   /* DRAY_WUSE_* of a packed matrix */
    bool round;      /* 4-bit groups rounded from a wider file */
    bool group_rows; /* an I8 table of n_out * k/32 rows of 32 (DRAY_WROLE_GROUP_ROWS) */
    char why[200];   /* "" or the one line that explains a fallback */
};

/* The format of the matrix made of parts (stacked along the output; all with
 * k = parts[0]->ne[0] inputs) under precision p (the one the engine settled
 * on: dray_caps_precision) for role on device caps c. */
void dray_wformat_pick(const struct dray_op_caps *c, enum dray_precision p, enum dray_wrole role,
                       const struct dray_gguf_tensor *const *parts, uint32_t n_parts, struct dray_wpick *out);

#endif
