/* Capability checks against the configuration and the model (see caps.h), and
 * the query that reads a device's capabilities from either ABI version. */
#include "caps.h"

#include <string.h>

#include "dray/backend_util.h"
#include "dray/plugins.h"
#include "error.h"

/* The v2 grouped dtype bits, retired in version 3: the host lays out no
 * weights for a plugin any more (a v2 plugin that declares them runs int8). */
#define V2_GROUPED                                                                            \
    (DRAY_DTYPE_BIT(DRAY_Q8G32) | DRAY_DTYPE_BIT(DRAY_Q4G32) | DRAY_DTYPE_BIT(DRAY_Q5G32) |       \
     DRAY_DTYPE_BIT(DRAY_Q4G32H) | DRAY_DTYPE_BIT(DRAY_Q8G32_X2) | DRAY_DTYPE_BIT(DRAY_Q4G32_X2) | \
     DRAY_DTYPE_BIT(DRAY_Q5G32_X2) | DRAY_DTYPE_BIT(DRAY_Q4G32H_X2) | DRAY_DTYPE_BIT(DRAY_PACKED))

struct dray_wformat dray_caps_wformat(uint32_t dtype)
{
    return dtype == DRAY_Q8G32   ? (struct dray_wformat){8, DRAY_WSCALE_F32, 0, 0}
           : dtype == DRAY_Q4G32 ? (struct dray_wformat){4, DRAY_WSCALE_F32, 1, 0}
           : dtype == DRAY_Q4G32H ? (struct dray_wformat){4, DRAY_WSCALE_F16, 1, 0}
           : dtype == DRAY_Q5G32 ? (struct dray_wformat){5, DRAY_WSCALE_F16, 1, 0}
           : dtype == DRAY_Q4K   ? (struct dray_wformat){4, DRAY_WSCALE_F16, 1, 1}
           : dtype == DRAY_Q5K   ? (struct dray_wformat){5, DRAY_WSCALE_F16, 1, 1}
           : dtype == DRAY_Q6K   ? (struct dray_wformat){6, DRAY_WSCALE_F16, 0, 1}
                                 : (struct dray_wformat){0, 0, 0, 0};
}

bool dray_caps_packed(uint32_t dtype)
{
    return dray_util_grouped(dtype) || dtype == DRAY_Q4K || dtype == DRAY_Q5K || dtype == DRAY_Q6K;
}

bool dray_caps_runs(const struct dray_op_caps *c, int op, uint32_t dtype)
{
    if (dray_caps_packed(dtype)) {
        uint32_t mask = op == DRAY_OP_MATMUL ? c->matmul_wformats : op == DRAY_OP_EMBED ? c->embed_wformats : 0;
        return (mask & DRAY_WFORMAT_BIT(dray_caps_wformat(dtype))) != 0;
    }
    return (uint32_t)op < c->n_ops && (c->op_dtypes[op] & DRAY_DTYPE_BIT(dtype));
}

int dray_plugin_caps(const struct dray_plugin *p, uint32_t index, struct dray_op_caps *caps,
                     char *err, size_t errlen)
{
    memset(caps, 0, sizeof(*caps));
    caps->size = (uint32_t)sizeof(*caps);
    int rc;
    if (DRAY_HAS(p->ops, op_caps, 2)) {
        rc = p->ops->op_caps(index, caps);
        caps->size = (uint32_t)sizeof(*caps); /* whatever the plugin did to it */
        if (caps->n_ops > DRAY_OP_COUNT)
            caps->n_ops = DRAY_OP_COUNT;
        if (p->ops->version < 3 || !DRAY_HAS(p->ops, weight_create, 3) || !DRAY_HAS(p->ops, weight_free, 3))
            caps->matmul_wformats = caps->embed_wformats = caps->matmul_passes = 0;
        caps->op_dtypes[DRAY_OP_MATMUL] &= ~V2_GROUPED;
        caps->op_dtypes[DRAY_OP_EMBED] &= ~V2_GROUPED;
    } else {
        /* version 1: the eight ops of the props, no declared limits */
        struct dray_device_props props;
        memset(&props, 0, sizeof(props));
        rc = p->ops->device_props(index, &props);
        if (rc == 0) {
            dray_util_caps_from_props(caps, &props);
            caps->n_ops = DRAY_OP_COUNT_V1;
        }
    }
    if (rc)
        return dray_fail(err, errlen, rc, "plugin '%s': device %u: cannot read capabilities: %s",
                         p->name, index, dray_strerror(rc));
    return 0;
}

static const char *dtype_name(uint32_t t)
{
    return t == DRAY_I8 ? "int8" : t == DRAY_F16 ? "f16" : t == DRAY_F32 ? "f32" : "?";
}

int dray_caps_check_config(const struct dray_op_caps *c, const struct dray_config *cfg, char *why,
                           size_t whylen)
{
    uint32_t w = cfg->precision == DRAY_PRECISION_F32 ? DRAY_F32 : DRAY_I8;
    static const char *const what[] = {"embed", "rmsnorm", "matmul", "rope", "kv_store",
                                       "attention", "gated_act", "add"};
    const uint32_t need[DRAY_OP_COUNT_V1] = {
        [DRAY_OP_EMBED] = w,          [DRAY_OP_RMSNORM] = DRAY_F32, [DRAY_OP_MATMUL] = w,
        [DRAY_OP_ROPE] = DRAY_F32,    [DRAY_OP_KV_STORE] = cfg->kv_dtype,
        [DRAY_OP_ATTENTION] = cfg->kv_dtype, [DRAY_OP_GATED_ACT] = DRAY_F32,
        [DRAY_OP_ADD] = DRAY_F32,
    };
    for (int op = 0; op < DRAY_OP_COUNT_V1; op++) {
        if (op < (int)c->n_ops && (c->op_dtypes[op] & DRAY_DTYPE_BIT(need[op])))
            continue;
        const char *key = op == DRAY_OP_KV_STORE || op == DRAY_OP_ATTENTION ? " (config kv_dtype)"
                          : op == DRAY_OP_MATMUL || op == DRAY_OP_EMBED     ? " (config precision)"
                                                                            : "";
        return dray_fail(why, whylen, DRAY_ENOTSUP, "the device does not run %s in %s%s", what[op],
                         dtype_name(need[op]), key);
    }
    return 0;
}

/* Both ops run the host's grouped format dtype. */
static bool runs_both(const struct dray_op_caps *c, uint32_t dtype)
{
    return dray_caps_runs(c, DRAY_OP_MATMUL, dtype) && dray_caps_runs(c, DRAY_OP_EMBED, dtype);
}

enum dray_precision dray_caps_precision(const struct dray_op_caps *c, enum dray_precision want,
                                        char *why, size_t whylen)
{
    why[0] = '\0';
    if ((want != DRAY_PRECISION_INT8G && want != DRAY_PRECISION_W4A8) ||
        (runs_both(c, DRAY_Q8G32) && (want == DRAY_PRECISION_INT8G || runs_both(c, DRAY_Q4G32))))
        return want;
    dray_fail(why, whylen, DRAY_ENOTSUP,
              "precision %s: the device does not declare the packed weights it needs (%s for matmul "
              "and embed); using int8", want == DRAY_PRECISION_W4A8 ? "w4a8" : "int8g",
              want == DRAY_PRECISION_W4A8 ? "q8 and q4m" : "q8");
    return DRAY_PRECISION_INT8;
}

enum dray_activations dray_caps_activations(const struct dray_op_caps *c, enum dray_precision p,
                                            enum dray_activations want, char *why, size_t whylen)
{
    why[0] = '\0';
    if (want != DRAY_ACTIVATIONS_INT8X2 || (p != DRAY_PRECISION_INT8G && p != DRAY_PRECISION_W4A8) ||
        (c->matmul_passes & 2u))
        return want;
    dray_fail(why, whylen, DRAY_ENOTSUP,
              "activations int8x2: the device does not declare two-pass activations for "
              "matmul; using int8");
    return DRAY_ACTIVATIONS_INT8;
}

bool dray_caps_q5(const struct dray_op_caps *c)
{
    return dray_caps_runs(c, DRAY_OP_MATMUL, DRAY_Q5G32);
}

bool dray_caps_q4h(const struct dray_op_caps *c)
{
    return dray_caps_runs(c, DRAY_OP_MATMUL, DRAY_Q4G32H);
}

/* One limit: 0 = none declared. */
static int over(uint32_t limit, uint32_t value)
{
    return limit && value > limit;
}

int dray_caps_check_shape(const struct dray_op_caps *c, const struct dray_caps_shape *s, char *why,
                          size_t whylen)
{
    if (over(c->max_head_dim, s->head_dim))
        return dray_fail(why, whylen, DRAY_ENOTSUP,
                         "the model's head_dim %u is above the device's limit %u (attention, "
                         "kv_store, rope)", s->head_dim, c->max_head_dim);
    if (over(c->max_n_rot, s->n_rot))
        return dray_fail(why, whylen, DRAY_ENOTSUP,
                         "the model rotates %u dimensions per head; the device's rope takes at "
                         "most %u", s->n_rot, c->max_n_rot);
    if (s->n_rot < s->head_dim && !c->rope_partial)
        return dray_fail(why, whylen, DRAY_ENOTSUP,
                         "the model rotates %u of %u dimensions per head; the device's rope "
                         "rotates whole heads only", s->n_rot, s->head_dim);
    if (over(c->max_heads, s->n_head))
        return dray_fail(why, whylen, DRAY_ENOTSUP,
                         "the model's %u heads are above the device's limit %u", s->n_head,
                         c->max_heads);
    if (over(c->max_k ? c->max_k : 65536, s->max_k))
        return dray_fail(why, whylen, DRAY_ENOTSUP,
                         "the model's widest matmul input (k = %u) is above the device's limit %u",
                         s->max_k, c->max_k ? c->max_k : 65536);
    return 0;
}
