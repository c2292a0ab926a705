/* Capability checks: what a device declares it can run (struct dray_op_caps,
 * ABI version 2, or built from version-1 props) against what the configuration
 * and the model will ask of it, so that a missing dtype or a shape beyond a
 * declared limit is found when the device is opened, not at the first forward
 * pass. The query itself (dray_plugin_caps) is public in dray/plugins.h. */
#ifndef DRAY_CORE_CAPS_H
#define DRAY_CORE_CAPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/backend.h"
#include "dray/dray.h"

/* The dtypes the configuration needs: KV dtype for kv_store and attention, the
 * weights' dtype for matmul and embed, F32 for the rest. 0, or DRAY_ENOTSUP with
 * the first op and dtype missing in why ("attention with KV dtype f16"). */
int dray_caps_check_config(const struct dray_op_caps *c, const struct dray_config *cfg, char *why,
                           size_t whylen);

/* The precision to run: cfg's, or INT8 when cfg asks for grouped weights
 * (INT8G, W4A8) the device does not declare for matmul and embed; then why says
 * so in one line. */
/* The activations to run under precision p (the one dray_caps_precision chose):
 * want, or INT8 with the reason in why when p is grouped and the device does not
 * declare the two-pass forms of its matmul dtypes (why "" otherwise). Only the
 * grouped precisions have a choice; for the others want comes back unchanged. */
enum dray_activations dray_caps_activations(const struct dray_op_caps *c, enum dray_precision p,
                                            enum dray_activations want, char *why, size_t whylen);
enum dray_precision dray_caps_precision(const struct dray_op_caps *c, enum dray_precision want,
                                        char *why, size_t whylen);

/* The layout-neutral format (backend.h) of a grouped dtype as the host names
 * it (model.h): DRAY_Q8G32 = q8 (f32 d), DRAY_Q4G32 = q4m (f32 d and m),
 * DRAY_Q4G32H = q4hm, DRAY_Q5G32 = q5hm; bits 0 for any other dtype. */
struct dray_wformat dray_caps_wformat(uint32_t dtype);

/* The two-level formats (ABI v4) by their host names: GGUF's Q4_K, Q5_K and
 * Q6_K blocks as the file has them (dray_caps_wformat gives q4/q5 two-level
 * +min and q6 two-level). */
enum { DRAY_Q4K = 64, DRAY_Q5K = 65, DRAY_Q6K = 66 };

/* Whether dtype is a format the device packs (weight_create): a grouped one
 * or a two-level one. */
bool dray_caps_packed(uint32_t dtype);

/* Whether the device runs op in dtype: op_dtypes for the plain dtypes; for a
 * grouped one, the packed formats it declares for matmul or embed (ABI v3). */
bool dray_caps_runs(const struct dray_op_caps *c, int op, uint32_t dtype);

/* Whether tensors stored 5-bit in the file (Q5_0, Q5_1) load as DRAY_Q5G32 (q5hm)
 * under W4A8 (else as Q8G32): the device declares q5hm for matmul. */
bool dray_caps_q5(const struct dray_op_caps *c);

/* Whether 4-bit weights with f16 scales (GGUF Q4_0 / Q4_1, and the rounded
 * 4-bit head) load as DRAY_Q4G32H (q4hm; else as Q4G32, f32 d and m): the
 * device declares q4hm for matmul. */
bool dray_caps_q4h(const struct dray_op_caps *c);

/* The shapes a model will use. */
struct dray_caps_shape {
    uint32_t head_dim;
    uint32_t n_rot;   /* rotary dimensions per head (= head_dim for a full rotation) */
    uint32_t n_head;  /* query heads */
    uint32_t max_k;   /* the largest input width of any matmul */
};

/* 0, or DRAY_ENOTSUP naming the limit and both values. */
int dray_caps_check_shape(const struct dray_op_caps *c, const struct dray_caps_shape *s, char *why,
                          size_t whylen);

#endif
