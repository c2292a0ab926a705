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

/* Whether tensors stored 5-bit in the file (Q5_0, Q5_1) load as DRAY_Q5G32 under
 * W4A8 (else as Q8G32): the device declares Q5G32 for matmul, and its two-pass
 * form too where it declares Q4G32's (so two-pass activations, which need that,
 * never meet a 5-bit weight they cannot run). */
bool dray_caps_q5(const struct dray_op_caps *c);

/* Whether 4-bit weights with f16 scales (GGUF Q4_0 / Q4_1, and the rounded
 * 4-bit head) load as DRAY_Q4G32H (else as Q4G32, f32 d and m): the device
 * declares Q4G32H for matmul, and its two-pass form where it declares Q4G32's,
 * as dray_caps_q5. */
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
