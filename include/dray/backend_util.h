/*
 * dray/backend_util.h — header-only helpers for plugin authors, installed beside
 * backend.h (same pkg-config package, dray-backend). Optional: a plugin that
 * does not include it is just as valid. What it gives:
 *
 *  - dray_util_negotiate(): answers dray_plugin_negotiate with the version the
 *    plugin's table implements (never the header's DRAY_ABI_VERSION, which may
 *    be newer than the code), refusing hosts that are too old with a reason.
 *  - DRAY_UTIL_OPT_HAS(): whether a caller's struct dray_open_options (which
 *    grows by size) carries a member; dray_util_caps_answer() writes a plugin's
 *    struct dray_op_caps only as far as the caller's size.
 *  - f16 and bf16 <-> f32 conversions, round to nearest even, bit-exact.
 *  - one argument validator per op, dray_util_check_<op>(): every rule of the
 *    op's contract in backend.h that can be checked without reading device
 *    memory (dtypes, strides, n_rot, k limit, activation, pool shape, aliasing),
 *    returning the documented code (DRAY_EINVAL for a bad argument, DRAY_ENOTSUP
 *    for a dtype the contract does not define, DRAY_ERANGE when a span does not
 *    fit in memory) with a one-line reason, and the list of views the op will
 *    touch with the bytes each needs. The plugin then checks each view against
 *    its own buffers (dray_util_check_views() does the loop given the buffer's
 *    size). Checks that need the data (ids < n_rows, slots < n_slots, outlier
 *    channels increasing) have host-side helpers for plugins that can read it.
 *
 * Everything is static inline and depends on libc only. Names: dray_util_*.
 */
#ifndef DRAY_BACKEND_UTIL_H
#define DRAY_BACKEND_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dray/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors */

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static inline int dray_util_fail(char *why, size_t len, int rc, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ---------------------------------------------------------------- negotiation */

/* For dray_plugin_negotiate: the host offers *version (the newest it speaks);
 * the plugin answers with its table's version, the one its code implements.
 * A host older than that is refused (DRAY_EINCOMPAT) with a reason naming both
 * versions; the registry shows it and goes on with the other plugins. */
static inline int dray_util_negotiate(uint32_t *version, const struct dray_ops *table,
                                      const struct dray_ops **ops, char *err, size_t errlen)
{
    const char *name = table && table->name ? table->name : "plugin";
    if (!version || !ops || !table)
        return dray_util_fail(err, errlen, DRAY_EINVAL,
                              "%s: negotiate called with NULL version or ops", name);
    if (*version < table->version)
        return dray_util_fail(err, errlen, DRAY_EINCOMPAT,
                              "%s implements ABI %u; this host speaks at most %u: upgrade dray",
                              name, table->version, *version);
    *version = table->version;
    *ops = table;
    return DRAY_OK;
}

/* ---------------------------------------------------------------- capabilities */

/* Start a plugin's version-2 answer from its version-1 props: the op_dtypes of
 * the eight version-1 ops, no limits, partial rotation supported (the version-1
 * rope contract). The plugin then sets its limits and the dtypes of ops added
 * later. */
static inline void dray_util_caps_from_props(struct dray_op_caps *c,
                                             const struct dray_device_props *p)
{
    memset(c, 0, sizeof(*c));
    c->size = (uint32_t)sizeof(*c);
    c->n_ops = DRAY_OP_COUNT;
    c->rope_partial = 1;
    for (int i = 0; i < DRAY_OP_COUNT_V1; i++)
        c->op_dtypes[i] = p->op_dtypes[i];
}

/* Hand the plugin's full answer `mine` to the caller's caps, writing only below
 * the caller's size (an older host has a shorter struct). DRAY_EINVAL when the
 * caller's struct cannot even hold its size. */
static inline int dray_util_caps_answer(struct dray_op_caps *caps, const struct dray_op_caps *mine)
{
    if (!caps || caps->size < sizeof(caps->size))
        return DRAY_EINVAL;
    uint32_t size = caps->size;
    memcpy(caps, mine, size < sizeof(*mine) ? size : sizeof(*mine));
    caps->size = size;
    return DRAY_OK;
}

/* The limits a plugin declares in version 2 (0 = none); whole_heads_only: its
 * rope rotates whole heads only (n_rot must equal head_dim). */
struct dray_util_limits {
    uint32_t max_head_dim, max_n_rot, max_k, max_heads;
    int whole_heads_only;
    /* version 3: packed weight formats (DRAY_WFORMAT_BIT masks; DRAY_UTIL_WF_*)
     * and activation passes (bit p-1) */
    uint32_t matmul_wformats, embed_wformats, matmul_passes;
};

/* A whole op_caps member: the dtypes from the plugin's device_props, its
 * limits, answered only as far as the caller's size. */
static inline int dray_util_op_caps(uint32_t index, struct dray_op_caps *caps,
                                    int (*device_props)(uint32_t, struct dray_device_props *),
                                    const struct dray_util_limits *lim)
{
    struct dray_device_props props;
    struct dray_op_caps mine;
    memset(&props, 0, sizeof(props));
    int rc = device_props(index, &props);
    if (rc)
        return rc;
    dray_util_caps_from_props(&mine, &props);
    mine.max_head_dim = lim->max_head_dim;
    mine.max_n_rot = lim->max_n_rot;
    mine.max_k = lim->max_k;
    mine.max_heads = lim->max_heads;
    mine.rope_partial = !lim->whole_heads_only;
    mine.matmul_wformats = lim->matmul_wformats;
    mine.embed_wformats = lim->embed_wformats;
    mine.matmul_passes = lim->matmul_wformats ? (lim->matmul_passes ? lim->matmul_passes : 1u) : 0u;
    return dray_util_caps_answer(caps, &mine);
}

/* True when the caller's open options (size = sizeof of its struct) carry m. */
#define DRAY_UTIL_OPT_HAS(opt, m)                                                           \
    ((opt) && (opt)->size >= offsetof(struct dray_open_options, m) + sizeof((opt)->m))

/* ---------------------------------------------------------------- f16 / bf16 */

/* IEEE binary32 -> binary16, round to nearest even; overflow gives infinity, NaN
 * stays a (quiet) NaN. Pure integer arithmetic: the same bits on every host. */
static inline uint16_t dray_util_f32_to_f16(float f)
{
    uint32_t x, ax, q, rem;
    memcpy(&x, &f, sizeof(x));
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* infinity or NaN */
        return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (ax >= 0x477ff000u) /* >= 65520: rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax <= 0x33000000u) /* <= 2^-25: rounds to zero (2^-25 is a tie, zero is even) */
        return sign;
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, units of 2^-24 */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - (ax >> 23);
        q = m >> shift;
        rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        q += rem > halfway || (rem == halfway && (q & 1u));
        return (uint16_t)(sign | q); /* 0x400 when it rounds up to 2^-14: right */
    }
    /* normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits; a carry
     * out of the mantissa correctly bumps the exponent */
    ax -= 0x38000000u;
    q = ax >> 13;
    rem = ax & 0x1fffu;
    q += rem > 0x1000u || (rem == 0x1000u && (q & 1u));
    return (uint16_t)(sign | q);
}

static inline float dray_util_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in f32 */
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 0x1f) /* infinity or NaN, payload kept */
        bits = sign | 0x7f800000u | man << 13;
    else
        bits = sign | (exp + 112u) << 23 | man << 13;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* bfloat16: the top half of a binary32, round to nearest even; NaN stays NaN. */
static inline uint16_t dray_util_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float dray_util_bf16_to_f32(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

/* ---------------------------------------------------------------- spans and views */

/* Bytes of `rows` rows of `used` elements, `stride` elements apart, `elem` bytes
 * each: ((rows-1)*stride + used) * elem; 0 when rows or used is 0. DRAY_ERANGE
 * when that does not fit in size_t. */
static inline int dray_util_span(const char *what, uint64_t rows, uint64_t stride, uint64_t used,
                                 size_t elem, size_t *bytes, char *why, size_t len)
{
    uint64_t n;
    *bytes = 0;
    if (rows == 0 || used == 0)
        return DRAY_OK;
    if (__builtin_mul_overflow(rows - 1, stride, &n) || __builtin_add_overflow(n, used, &n) ||
        __builtin_mul_overflow(n, (uint64_t)elem, &n) || n > SIZE_MAX)
        return dray_util_fail(why, len, DRAY_ERANGE,
                              "%s: %llu rows of stride %llu span more bytes than fit in memory",
                              what, (unsigned long long)rows, (unsigned long long)stride);
    *bytes = (size_t)n;
    return DRAY_OK;
}

/* One view an op touches: the plugin checks that nbytes from v.offset lie in
 * v.buf and that the offset is a multiple of align. nbytes = 0 needs no buffer. */
struct dray_util_need {
    const char *what; /* "matmul x" */
    struct dray_view v;
    size_t nbytes;
    size_t align;
};

#define DRAY_UTIL_MAX_NEEDS 10
struct dray_util_needs {
    uint32_t n;
    struct dray_util_need at[DRAY_UTIL_MAX_NEEDS];
};

/* Append a view of `rows` rows (see dray_util_span) to the list. */
static inline int dray_util_need(struct dray_util_needs *nd, const char *what, struct dray_view v,
                                 uint64_t rows, uint64_t stride, uint64_t used, size_t elem,
                                 char *why, size_t len)
{
    size_t bytes;
    int rc = dray_util_span(what, rows, stride, used, elem, &bytes, why, len);
    if (rc)
        return rc;
    if (nd->n >= DRAY_UTIL_MAX_NEEDS)
        return dray_util_fail(why, len, DRAY_EINVAL, "%s: too many views", what);
    nd->at[nd->n++] = (struct dray_util_need){what, v, bytes, elem};
    return DRAY_OK;
}

/* True when byte ranges [a, a+na) and [b, b+nb) of two views share memory. */
static inline int dray_util_overlap(struct dray_view a, size_t na, struct dray_view b, size_t nb)
{
    if (!na || !nb || a.buf != b.buf)
        return 0;
    return a.offset < b.offset + nb && b.offset < a.offset + na;
}

/* An output may alias an input only exactly (same buffer, offset and stride):
 * then each element is read before it is written. Any other overlap is refused. */
static inline int dray_util_alias_ok(struct dray_view out, size_t nout, uint32_t sout,
                                     struct dray_view in, size_t nin, uint32_t sin)
{
    if (!dray_util_overlap(out, nout, in, nin))
        return 1;
    return out.offset == in.offset && sout == sin;
}

/* Check every need against its buffer. buf_size(buf, &live) returns the
 * buffer's size in bytes, and sets *live = 0 for a handle that is not a live
 * buffer of this plugin (freed, foreign). Returns DRAY_EINVAL with the first
 * problem: no buffer, dead buffer, misaligned offset, or out of bounds. */
typedef size_t (*dray_util_buf_size_fn)(const struct dray_buf *buf, int *live);

static inline int dray_util_check_views(const struct dray_util_needs *nd,
                                        dray_util_buf_size_fn buf_size, char *why, size_t len)
{
    for (uint32_t i = 0; i < nd->n; i++) {
        const struct dray_util_need *u = &nd->at[i];
        int live = 1;
        if (u->nbytes == 0)
            continue;
        if (!u->v.buf)
            return dray_util_fail(why, len, DRAY_EINVAL, "%s: no buffer given for %zu bytes",
                                  u->what, u->nbytes);
        size_t size = buf_size(u->v.buf, &live);
        if (!live)
            return dray_util_fail(why, len, DRAY_EINVAL,
                                  "%s: not a live buffer of this plugin (freed, or from another "
                                  "plugin)", u->what);
        if (u->align > 1 && u->v.offset % u->align)
            return dray_util_fail(why, len, DRAY_EINVAL,
                                  "%s: offset %zu is not a multiple of the element size %zu",
                                  u->what, u->v.offset, u->align);
        if (u->v.offset > size || u->nbytes > size - u->v.offset)
            return dray_util_fail(why, len, DRAY_EINVAL,
                                  "%s: needs %zu bytes at offset %zu but the buffer holds %zu",
                                  u->what, u->nbytes, u->v.offset, size);
    }
    return DRAY_OK;
}

/* ---------------------------------------------------------------- per-op validators */
/* Each fills nd (zeroed first) with the views the op touches, in the order of
 * the argument struct, and checks the rules of backend.h's comment on it. */

#define DRAY_UTIL_TRY(expr)     \
    do {                        \
        int rc_ = (expr);       \
        if (rc_)                \
            return rc_;         \
    } while (0)

/* Version 2's grouped weight dtypes (backend.h, matmul): Q8G32, Q4G32, Q5G32,
 * Q4G32H (the last two matmul weights only, never an embedding table). */
static inline int dray_util_grouped(uint32_t dtype)
{
    return dtype == DRAY_Q8G32 || dtype == DRAY_Q4G32 || dtype == DRAY_Q5G32 || dtype == DRAY_Q4G32H;
}

/* The grouped dtypes whose d and m are f16 pairs (Q5G32, Q4G32H). */
static inline int dray_util_half_scales(uint32_t dtype)
{
    return dtype == DRAY_Q5G32 || dtype == DRAY_Q4G32H;
}

/* Version 2's two-pass activation forms of them (matmul only). */
static inline int dray_util_x2(uint32_t dtype)
{
    return dtype == DRAY_Q8G32_X2 || dtype == DRAY_Q4G32_X2 || dtype == DRAY_Q5G32_X2 ||
           dtype == DRAY_Q4G32H_X2;
}

/* The weight layout a matmul wdtype reads: a two-pass form reads its grouped
 * dtype's; every other dtype is its own. */
static inline uint32_t dray_util_wlayout(uint32_t wdtype)
{
    return wdtype == DRAY_Q8G32_X2   ? DRAY_Q8G32
           : wdtype == DRAY_Q4G32_X2 ? DRAY_Q4G32
           : wdtype == DRAY_Q5G32_X2 ? DRAY_Q5G32
           : wdtype == DRAY_Q4G32H_X2 ? DRAY_Q4G32H
                                     : wdtype;
}

/* A grouped dtype's two-pass form (what the host asks for when the device has it). */
static inline uint32_t dray_util_x2_of(uint32_t dtype)
{
    return dtype == DRAY_Q8G32   ? DRAY_Q8G32_X2
           : dtype == DRAY_Q4G32 ? DRAY_Q4G32_X2
           : dtype == DRAY_Q5G32 ? DRAY_Q5G32_X2
           : dtype == DRAY_Q4G32H ? DRAY_Q4G32H_X2
                                 : dtype;
}

/* Bytes of one weight row of k inputs in dtype (k a multiple of 32 if grouped):
 * Q5G32 is its nibbles (k/2) and high bits (k/8); its f16 scales are wscale's. */
static inline uint32_t dray_util_wrow_bytes(uint32_t dtype, uint32_t k)
{
    return dtype == DRAY_F32                               ? k * 4u
           : dtype == DRAY_Q4G32 || dtype == DRAY_Q4G32H ? k / 2u
           : dtype == DRAY_Q5G32                         ? k / 2u + k / 8u
                                                         : k;
}

/* f32-sized scale values per weight row: 1 (I8), 0 (F32), k/32 (Q8G32), k/16
 * (Q4G32: scale and min per group), k/32 (Q5G32, Q4G32H: an f16 scale and min
 * per group, 4 bytes). */
static inline uint32_t dray_util_wscale_floats(uint32_t dtype, uint32_t k)
{
    return dtype == DRAY_I8 ? 1u
           : dtype == DRAY_Q8G32 || dray_util_half_scales(dtype) ? k / 32u
           : dtype == DRAY_Q4G32 ? k / 16u
                                 : 0u;
}

/* grouped: the plugin runs DRAY_Q8G32/DRAY_Q4G32 tables (else DRAY_ENOTSUP). */
static inline int dray_util_check_embed_g(const struct dray_embed_args *a, int grouped,
                                          struct dray_util_needs *nd, char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    if (a->dtype != DRAY_I8 && a->dtype != DRAY_F32 &&
        !(grouped && (a->dtype == DRAY_Q8G32 || a->dtype == DRAY_Q4G32)))
        return dray_util_fail(why, len, DRAY_ENOTSUP,
                              "embed: table dtype %u is not I8 or F32", a->dtype);
    if (dray_util_grouped(a->dtype) && (a->dim % 32 || a->n_rows % 16))
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "embed: a grouped table needs dim %% 32 == 0 (dim = %u) and n_rows %% 16 "
                              "== 0 (n_rows = %u)", a->dim, a->n_rows);
    uint32_t row = dray_util_wrow_bytes(a->dtype, a->dim);
    DRAY_UTIL_TRY(dray_util_need(nd, "embed ids", a->ids, 1, 0, a->n_tok, 4, why, len));
    if (a->dtype == DRAY_F32)
        DRAY_UTIL_TRY(dray_util_need(nd, "embed table", a->table, a->n_rows, a->dim, a->dim, 4, why, len));
    else
        DRAY_UTIL_TRY(dray_util_need(nd, "embed table", a->table, a->n_rows, row, row, 1, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "embed row_scale", a->row_scale, a->n_rows,
                                 dray_util_wscale_floats(a->dtype, a->dim),
                                 dray_util_wscale_floats(a->dtype, a->dim), 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "embed out", a->out, a->n_tok, a->dim, a->dim, 4, why, len));
    return DRAY_OK;
}

/* The version-1 dtypes only (I8, F32). */
static inline int dray_util_check_embed(const struct dray_embed_args *a,
                                        struct dray_util_needs *nd, char *why, size_t len)
{
    return dray_util_check_embed_g(a, 0, nd, why, len);
}

static inline int dray_util_check_rmsnorm(const struct dray_rmsnorm_args *a,
                                          struct dray_util_needs *nd, char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    uint64_t row = (uint64_t)a->n_head * a->n;
    if (a->n_tok && (a->n == 0 || a->n_head == 0))
        return dray_util_fail(why, len, DRAY_EINVAL, "rmsnorm: n = %u and n_head = %u must be > 0",
                              a->n, a->n_head);
    if (a->stride_x < row || a->stride_out < row)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "rmsnorm: strides %u/%u are below n_head*n = %llu", a->stride_x,
                              a->stride_out, (unsigned long long)row);
    DRAY_UTIL_TRY(dray_util_need(nd, "rmsnorm x", a->x, a->n_tok, a->stride_x, row, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "rmsnorm w", a->w, 1, 0, a->n_tok ? a->n : 0, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "rmsnorm out", a->out, a->n_tok, a->stride_out, row, 4, why, len));
    if (!dray_util_alias_ok(a->out, nd->at[2].nbytes, a->stride_out, a->x, nd->at[0].nbytes,
                            a->stride_x))
        return dray_util_fail(why, len, DRAY_EINVAL, "rmsnorm: out overlaps x without being x");
    return DRAY_OK;
}

/* Views: x, w, wscale, out, outlier_idx, outlier_w (outliers only for I8).
 * grouped: 1 = the plugin runs DRAY_Q8G32/DRAY_Q4G32 weights, 2 = also their
 * two-pass forms DRAY_Q8G32_X2/DRAY_Q4G32_X2, 3 = also DRAY_Q5G32 and
 * DRAY_Q5G32_X2, 4 = also DRAY_Q4G32H and DRAY_Q4G32H_X2 (else DRAY_ENOTSUP). */
static inline int dray_util_check_matmul_g(const struct dray_matmul_args *a, int grouped,
                                           struct dray_util_needs *nd, char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    uint32_t lay = dray_util_wlayout(a->wdtype);
    if ((a->wdtype != DRAY_I8 && a->wdtype != DRAY_F32 && !(grouped && dray_util_grouped(a->wdtype)) &&
         !(grouped >= 2 && dray_util_x2(a->wdtype))) ||
        (lay == DRAY_Q5G32 && grouped < 3) || (lay == DRAY_Q4G32H && grouped < 4))
        return dray_util_fail(why, len, DRAY_ENOTSUP,
                              "matmul: weight dtype %u is not %s", a->wdtype,
                              grouped >= 4   ? "I8, F32, Q8G32, Q4G32, Q5G32, Q4G32H or their _X2 forms"
                              : grouped >= 3 ? "I8, F32, Q8G32, Q4G32, Q5G32 or their _X2 forms"
                              : grouped >= 2 ? "I8, F32, Q8G32, Q4G32, Q8G32_X2 or Q4G32_X2"
                                             : "I8, F32, Q8G32 or Q4G32");
    int i8 = a->wdtype == DRAY_I8;
    uint32_t wl = dray_util_wlayout(a->wdtype); /* the layout the weights are in */
    uint32_t n_outlier = i8 ? a->n_outlier : 0; /* ignored for F32 weights */
    if (a->k > 65536)
        return dray_util_fail(why, len, DRAY_EINVAL, "matmul: k = %u exceeds 65536 (int32 sums)",
                              a->k);
    if (dray_util_grouped(wl) && (a->k % 32 || a->n_out % 16 || a->n_outlier))
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "matmul: grouped weights need k %% 32 == 0 (k = %u), n_out %% 16 == 0 "
                              "(n_out = %u) and no outlier channels (n_outlier = %u)", a->k, a->n_out,
                              a->n_outlier);
    if (a->stride_x < a->k || a->stride_out < a->n_out)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "matmul: stride_x %u < k %u or stride_out %u < n_out %u",
                              a->stride_x, a->k, a->stride_out, a->n_out);
    if (n_outlier > a->k)
        return dray_util_fail(why, len, DRAY_EINVAL, "matmul: %u outliers but k = %u", n_outlier,
                              a->k);
    DRAY_UTIL_TRY(dray_util_need(nd, "matmul x", a->x, a->n_tok, a->stride_x, a->k, 4, why, len));
    uint32_t wrow = dray_util_wrow_bytes(wl, a->k);
    uint32_t srow = dray_util_wscale_floats(wl, a->k);
    if (a->wdtype == DRAY_F32)
        DRAY_UTIL_TRY(dray_util_need(nd, "matmul w", a->w, a->n_out, a->k, a->k, 4, why, len));
    else
        DRAY_UTIL_TRY(dray_util_need(nd, "matmul w", a->w, a->n_out, wrow, wrow, 1, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "matmul wscale", a->wscale, a->n_out, srow, srow, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "matmul out", a->out, a->n_tok, a->stride_out, a->n_out, 4,
                                 why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "matmul outlier_idx", a->outlier_idx, 1, 0, n_outlier, 4, why,
                                 len));
    DRAY_UTIL_TRY(dray_util_need(nd, "matmul outlier_w", a->outlier_w, a->n_out, n_outlier,
                                 n_outlier, 4, why, len));
    if (dray_util_overlap(a->out, nd->at[3].nbytes, a->x, nd->at[0].nbytes))
        return dray_util_fail(why, len, DRAY_EINVAL, "matmul: out overlaps x");
    return DRAY_OK;
}

/* The version-1 weight dtypes only (I8, F32). */
static inline int dray_util_check_matmul(const struct dray_matmul_args *a,
                                         struct dray_util_needs *nd, char *why, size_t len)
{
    return dray_util_check_matmul_g(a, 0, nd, why, len);
}

/* Version 4's rope arguments: attn_factor finite and >= 0 (0 means 1), and
 * freq_factors, when its buffer is not NULL, n_rot/2 floats (the third view;
 * 0 bytes, so no check, when NULL). A host never sets them below version 4,
 * so a plugin of any version may run this check. */
static inline int dray_util_check_rope_v4(const struct dray_rope_args *a, struct dray_util_needs *nd,
                                          char *why, size_t len)
{
    if (!isfinite(a->attn_factor) || a->attn_factor < 0.0f)
        return dray_util_fail(why, len, DRAY_EINVAL, "rope: attn_factor %g must be finite and >= 0",
                              (double)a->attn_factor);
    uint64_t n_ff = a->freq_factors.buf ? a->n_rot / 2 : 0;
    return dray_util_need(nd, "rope freq_factors", a->freq_factors, 1, 0, n_ff, 4, why, len);
}

/* The magnitude factor rope applies: attn_factor, where 0 means 1. */
static inline float dray_util_rope_mscale(const struct dray_rope_args *a)
{
    return a->attn_factor == 0.0f ? 1.0f : a->attn_factor;
}

/* Views: x, pos, freq_factors (0 bytes when its buffer is NULL). */
static inline int dray_util_check_rope(const struct dray_rope_args *a, struct dray_util_needs *nd,
                                       char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    uint64_t row = (uint64_t)a->n_head * a->head_dim;
    if (a->n_rot % 2 || a->n_rot > a->head_dim)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "rope: n_rot = %u must be even and <= head_dim = %u", a->n_rot,
                              a->head_dim);
    if (a->stride < row)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "rope: stride %u is below n_head*head_dim = %llu", a->stride,
                              (unsigned long long)row);
    DRAY_UTIL_TRY(dray_util_need(nd, "rope x", a->x, a->n_tok, a->stride, row, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "rope pos", a->pos, 1, 0, a->n_tok, 4, why, len));
    DRAY_UTIL_TRY(dray_util_check_rope_v4(a, nd, why, len));
    return DRAY_OK;
}

/* The pool's shape and its four arrays (scales only for I8). */
static inline int dray_util_check_pool(const char *op, const struct dray_kv_pool *p,
                                       struct dray_util_needs *nd, char *why, size_t len)
{
    if (!p)
        return dray_util_fail(why, len, DRAY_EINVAL, "%s: no KV pool given", op);
    if (p->dtype != DRAY_I8 && p->dtype != DRAY_F16)
        return dray_util_fail(why, len, DRAY_ENOTSUP, "%s: KV dtype %u is not I8 or F16", op,
                              p->dtype);
    if (!p->n_kv_head || !p->head_dim || !p->block_size || p->n_slots % p->block_size)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "%s: pool n_kv_head %u, head_dim %u, block_size %u must be > 0 and "
                              "n_slots %u a multiple of block_size",
                              op, p->n_kv_head, p->head_dim, p->block_size, p->n_slots);
    int i8 = p->dtype == DRAY_I8;
    uint64_t rows = (uint64_t)p->n_slots * p->n_kv_head; /* one scale per row */
    DRAY_UTIL_TRY(dray_util_need(nd, "KV pool k", p->k, rows, p->head_dim, p->head_dim, i8 ? 1 : 2,
                                 why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "KV pool v", p->v, rows, p->head_dim, p->head_dim, i8 ? 1 : 2,
                                 why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "KV pool k_scale", p->k_scale, 1, 0, i8 ? rows : 0, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "KV pool v_scale", p->v_scale, 1, 0, i8 ? rows : 0, 4, why, len));
    return DRAY_OK;
}

/* Views: pool k, v, k_scale, v_scale, then k, v, slots. */
static inline int dray_util_check_kv_store(const struct dray_kv_store_args *a,
                                           struct dray_util_needs *nd, char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    DRAY_UTIL_TRY(dray_util_check_pool("kv_store", a->pool, nd, why, len));
    const struct dray_kv_pool *p = a->pool;
    uint64_t row = (uint64_t)p->n_kv_head * p->head_dim;
    if (a->stride_k < row || a->stride_v < row)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "kv_store: strides %u/%u are below n_kv_head*head_dim = %llu",
                              a->stride_k, a->stride_v, (unsigned long long)row);
    DRAY_UTIL_TRY(dray_util_need(nd, "kv_store k", a->k, a->n_tok, a->stride_k, row, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "kv_store v", a->v, a->n_tok, a->stride_v, row, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "kv_store slots", a->slots, 1, 0, a->n_tok, 4, why, len));
    return DRAY_OK;
}

/* Views: pool k, v, k_scale, v_scale, then q, out, seqs, and the first entry of
 * block_table (its extent depends on seqs: see dray_util_check_seq). */
static inline int dray_util_check_attention(const struct dray_attention_args *a,
                                            struct dray_util_needs *nd, char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    DRAY_UTIL_TRY(dray_util_check_pool("attention", a->pool, nd, why, len));
    const struct dray_kv_pool *p = a->pool;
    if (!isfinite(a->softcap) || a->softcap < 0.0f) /* v4; 0 = none */
        return dray_util_fail(why, len, DRAY_EINVAL, "attention: softcap %g must be finite and >= 0",
                              (double)a->softcap);
    if (!a->n_head || a->n_head % p->n_kv_head)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "attention: n_head %u is not a positive multiple of n_kv_head %u",
                              a->n_head, p->n_kv_head);
    uint64_t row = (uint64_t)a->n_head * p->head_dim;
    if (a->stride_q < row || a->stride_out < row)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "attention: strides %u/%u are below n_head*head_dim = %llu",
                              a->stride_q, a->stride_out, (unsigned long long)row);
    DRAY_UTIL_TRY(dray_util_need(nd, "attention q", a->q, a->n_tok, a->stride_q, row, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "attention out", a->out, a->n_tok, a->stride_out, row, 4, why,
                                 len));
    DRAY_UTIL_TRY(dray_util_need(nd, "attention seqs", a->seqs, 1, 0, (uint64_t)a->n_seq * 4, 4,
                                 why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "attention block_table", a->block_table, 1, 0,
                                 a->n_seq ? 1 : 0, 4, why, len));
    if (dray_util_overlap(a->out, nd->at[5].nbytes, a->q, nd->at[4].nbytes))
        return dray_util_fail(why, len, DRAY_EINVAL, "attention: out overlaps q");
    return DRAY_OK;
}

/* seqs[s] = e[0..3] = {q_start, n_q, kv_len, bt_start}, read on the host: the
 * ranges backend.h states. Block-table entries are the plugin's to check. */
static inline int dray_util_check_seq(const struct dray_attention_args *a, const int32_t *e,
                                      uint32_t s, char *why, size_t len)
{
    if (e[0] < 0 || e[1] < 0 || e[2] < 0 || e[3] < 0 ||
        (uint64_t)(uint32_t)e[0] + (uint32_t)e[1] > a->n_tok || e[1] > e[2] ||
        (uint32_t)e[2] > a->max_kv_len)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "attention: seqs[%u] = {q_start %d, n_q %d, kv_len %d, bt_start %d}: "
                              "need q_start+n_q <= n_tok %u and n_q <= kv_len <= max_kv_len %u",
                              s, e[0], e[1], e[2], e[3], a->n_tok, a->max_kv_len);
    return DRAY_OK;
}

static inline int dray_util_check_gated_act(const struct dray_gated_act_args *a,
                                            struct dray_util_needs *nd, char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    if (a->act != DRAY_ACT_GELU_TANH && a->act != DRAY_ACT_SILU)
        return dray_util_fail(why, len, DRAY_EINVAL, "gated_act: unknown activation %u", a->act);
    if (a->stride_gate < a->n || a->stride_up < a->n || a->stride_out < a->n)
        return dray_util_fail(why, len, DRAY_EINVAL, "gated_act: strides %u/%u/%u must be >= n = %u",
                              a->stride_gate, a->stride_up, a->stride_out, a->n);
    DRAY_UTIL_TRY(dray_util_need(nd, "gated_act gate", a->gate, a->n_tok, a->stride_gate, a->n, 4,
                                 why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "gated_act up", a->up, a->n_tok, a->stride_up, a->n, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "gated_act out", a->out, a->n_tok, a->stride_out, a->n, 4, why,
                                 len));
    size_t ng = nd->at[0].nbytes, nu = nd->at[1].nbytes, no = nd->at[2].nbytes;
    if (!dray_util_alias_ok(a->out, no, a->stride_out, a->gate, ng, a->stride_gate) ||
        !dray_util_alias_ok(a->out, no, a->stride_out, a->up, nu, a->stride_up))
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "gated_act: out overlaps gate or up without being it");
    return DRAY_OK;
}

static inline int dray_util_check_add(const struct dray_add_args *a, struct dray_util_needs *nd,
                                      char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    DRAY_UTIL_TRY(dray_util_need(nd, "add a", a->a, 1, 0, a->n, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "add b", a->b, 1, 0, a->n, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "add out", a->out, 1, 0, a->n, 4, why, len));
    size_t n = nd->at[0].nbytes;
    if (!dray_util_alias_ok(a->out, n, 0, a->a, n, 0) || !dray_util_alias_ok(a->out, n, 0, a->b, n, 0))
        return dray_util_fail(why, len, DRAY_EINVAL, "add: out overlaps a or b without being it");
    return DRAY_OK;
}

/* ---------------------------------------------------------------- packed weights */
/* Version 3 (backend.h, "Packed weights"): the format's sizes, a reference
 * decoding of its groups, and the checks of weight_create and of matmul and
 * embed on a handle. */

/* Every one of the twelve one-level formats, and the three of two levels (v4). */
#define DRAY_UTIL_WF_ALL 0xfffu
#define DRAY_UTIL_WF_K 0x7000u
/* The bit of one format, a constant expression (for static tables). */
#define DRAY_UTIL_WF(bits, scale, has_min)                                                   \
    (1u << (((bits) == 4 ? 0u : (bits) == 5 ? 1u : 2u) * 4u + ((scale) ? 2u : 0u) + ((has_min) ? 1u : 0u)))
/* ... and of a two-level one: 4, 5 (with a min) or 6 bits. */
#define DRAY_UTIL_WFK(bits) (1u << (12u + ((bits) == 4 ? 0u : (bits) == 5 ? 1u : 2u)))

static inline int dray_util_wformat_valid(struct dray_wformat f)
{
    if (f.super == 1)
        return f.scale == DRAY_WSCALE_F16 && ((f.has_min == 1 && (f.bits == 4 || f.bits == 5)) ||
                                              (f.has_min == 0 && f.bits == 6));
    return (f.bits == 4 || f.bits == 5 || f.bits == 8) && f.scale <= DRAY_WSCALE_F16 &&
           f.has_min <= 1 && f.super == 0;
}

/* Bytes of one group's codes (B in backend.h): 16, 20, 24 or 32. */
static inline uint32_t dray_util_wformat_group_bytes(struct dray_wformat f)
{
    return f.bits == 4 ? 16u : f.bits == 5 ? 20u : f.bits == 6 ? 24u : 32u;
}

/* Bytes of one d (or m) value: of a group, or of a super-block (two levels). */
static inline uint32_t dray_util_wformat_scale_bytes(struct dray_wformat f)
{
    return f.scale == DRAY_WSCALE_F16 ? 2u : 4u;
}

/* The zero point of a format without a min: 8, 16, 32 (6 bits), 0. */
static inline int dray_util_wformat_z(struct dray_wformat f)
{
    return f.bits == 4 ? 8 : f.bits == 5 ? 16 : f.bits == 6 ? 32 : 0;
}

/* Scale units per group: 2 for 6-bit two-level weights (a scale per 16), else 1. */
static inline uint32_t dray_util_wformat_units(struct dray_wformat f)
{
    return f.super && f.bits == 6 ? 2u : 1u;
}

/* Entries of d (and m) per row of k inputs: one per group, or per 256 (two levels). */
static inline uint32_t dray_util_wformat_scales_per_row(struct dray_wformat f, uint32_t k)
{
    return f.super ? k / 256u : k / 32u;
}

/* Bytes of sub per row of k inputs (two levels; else 0). */
static inline uint32_t dray_util_wformat_sub_bytes(struct dray_wformat f, uint32_t k)
{
    return f.super ? k / 16u : 0u; /* (s, n) per 32, or one int8 per 16 */
}

/* "q4 f16 +min", "q6 two-level": for messages and `dray devices -v`. */
static inline const char *dray_util_wformat_name(struct dray_wformat f, char *buf, size_t len)
{
    if (f.super)
        snprintf(buf, len, "q%u two-level%s", (unsigned)f.bits, f.has_min ? " +min" : "");
    else
        snprintf(buf, len, "q%u %s%s", (unsigned)f.bits, f.scale == DRAY_WSCALE_F16 ? "f16" : "f32",
                 f.has_min ? " +min" : "");
    return buf;
}

/* The format of bit i (0..14) of a wformats mask. */
static inline struct dray_wformat dray_util_wformat_of_bit(uint32_t i)
{
    if (i >= 12) {
        struct dray_wformat k = {(uint8_t)(i == 12 ? 4 : i == 13 ? 5 : 6), DRAY_WSCALE_F16, (uint8_t)(i < 14), 1};
        return k;
    }
    struct dray_wformat f = {(uint8_t)(i / 4 == 0 ? 4 : i / 4 == 1 ? 5 : 8),
                             (uint8_t)((i >> 1) & 1u), (uint8_t)(i & 1u), 0};
    return f;
}

/* Code j (0..31) of one group's bytes (unsigned for 4, 5 and 6 bits, signed for 8). */
static inline int dray_util_packed_code(struct dray_wformat f, const uint8_t *group, uint32_t j)
{
    if (f.bits == 8)
        return (int8_t)group[j];
    int c = j < 16 ? group[j] & 15 : group[j - 16] >> 4;
    if (f.bits == 5) {
        uint32_t hi = (uint32_t)group[16] | (uint32_t)group[17] << 8 | (uint32_t)group[18] << 16 |
                      (uint32_t)group[19] << 24;
        c |= (int)((hi >> j) & 1u) << 4;
    } else if (f.bits == 6) {
        c |= (int)((group[16 + j / 4] >> (2 * (j % 4))) & 3u) << 4;
    }
    return c;
}

/* Value i of a d or m array in the format's scale type, widened to f32 exactly. */
static inline float dray_util_packed_scale(struct dray_wformat f, const void *arr, uint64_t i)
{
    if (f.scale == DRAY_WSCALE_F16)
        return dray_util_f16_to_f32(((const uint16_t *)arr)[i]);
    return ((const float *)arr)[i];
}

/* d and the m' of backend.h's matmul (m, or -z*d without a min) of group i of
 * a one-level format. */
static inline void dray_util_packed_dm(struct dray_wformat f, const void *d, const void *m, uint64_t i,
                                       float *dd, float *mm)
{
    *dd = dray_util_packed_scale(f, d, i);
    *mm = f.has_min ? dray_util_packed_scale(f, m, i) : -(float)dray_util_wformat_z(f) * *dd;
}

/* d and m' of scale unit u (a group, or a half-group: dray_util_wformat_units)
 * of row o of k inputs, for every format: backend.h's products in f32. */
static inline void dray_util_packed_unit_dm(struct dray_wformat f, uint32_t k, const void *d, const void *m,
                                            const void *sub, uint64_t o, uint32_t u, float *dd, float *mm)
{
    if (!f.super) {
        dray_util_packed_dm(f, d, m, o * (k / 32u) + u, dd, mm);
        return;
    }
    uint64_t s = o * (k / 256u) + (f.bits == 6 ? u / 16u : u / 8u);
    float D = dray_util_packed_scale(f, d, s);
    if (f.bits == 6) {
        *dd = D * (float)((const int8_t *)sub)[o * (k / 16u) + u];
        *mm = -32.0f * *dd;
        return;
    }
    const uint8_t *sn = (const uint8_t *)sub + (o * (k / 32u) + u) * 2u;
    *dd = D * (float)sn[0];
    *mm = -(dray_util_packed_scale(f, m, s) * (float)sn[1]);
}

/* Row o of W in f32 (k inputs): code * d + m'. The embed op's reference. */
static inline void dray_util_packed_row(struct dray_wformat f, uint32_t k, const uint8_t *codes,
                                        const void *d, const void *m, const void *sub, uint64_t o,
                                        float *out)
{
    uint32_t G = k / 32u, B = dray_util_wformat_group_bytes(f), U = dray_util_wformat_units(f);
    for (uint32_t g = 0; g < G; g++) {
        const uint8_t *grp = codes + (o * G + g) * B;
        for (uint32_t h = 0; h < U; h++) {
            float dd, mm;
            dray_util_packed_unit_dm(f, k, d, m, sub, o, g * U + h, &dd, &mm);
            for (uint32_t j = 32u / U * h; j < 32u / U * (h + 1); j++)
                out[32 * g + j] = (float)dray_util_packed_code(f, grp, j) * dd + mm;
        }
    }
}

/* backend.h's activation rule on one group of 32: q and sx (0 for a zero group).
 * Round to nearest even through nearbyintf in the default rounding mode. */
static inline float dray_util_quant_group(const float *x, int8_t *q)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float sx = amax / 127.0f;
    for (int j = 0; j < 32; j++) {
        float v = sx > 0.0f ? nearbyintf(x[j] / sx) : 0.0f;
        q[j] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
    }
    return sx;
}

/* The reference of one output of matmul on packed weights, one pass: group g of
 * x is (q + 32g, sx[g]); row o of the handle's arrays. */
static inline float dray_util_packed_dot(struct dray_wformat f, uint32_t k, const uint8_t *codes,
                                         const void *d, const void *m, const void *sub, uint64_t o,
                                         const int8_t *q, const float *sx)
{
    uint32_t G = k / 32u, B = dray_util_wformat_group_bytes(f), U = dray_util_wformat_units(f);
    float acc = 0.0f;
    for (uint32_t g = 0; g < G; g++) {
        const uint8_t *grp = codes + (o * G + g) * B;
        float part = 0.0f;
        for (uint32_t h = 0; h < U; h++) {
            int32_t sqc = 0, sq = 0;
            for (uint32_t j = 32u / U * h; j < 32u / U * (h + 1); j++) {
                sqc += q[32 * g + j] * dray_util_packed_code(f, grp, j);
                sq += q[32 * g + j];
            }
            float dd, mm;
            dray_util_packed_unit_dm(f, k, d, m, sub, o, g * U + h, &dd, &mm);
            part += dd * (float)sqc + mm * (float)sq;
        }
        acc += sx[g] * part;
    }
    return acc;
}

/* weight_create's argument rules; formats = the plugin's declared mask for the
 * uses asked (matmul_wformats, embed_wformats, or both ANDed). */
static inline int dray_util_check_weight_desc(const struct dray_weight_desc *w, uint32_t formats,
                                              char *why, size_t len)
{
    char name[32];
    if (!w || w->size < offsetof(struct dray_weight_desc, m) + sizeof(w->m))
        return dray_util_fail(why, len, DRAY_EINVAL, "weight_create: no descriptor, or one too old");
    if (!dray_util_wformat_valid(w->format))
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "weight_create: format bits %u scale %u has_min %u is not one of backend.h's",
                              w->format.bits, w->format.scale, w->format.has_min);
    if (!(formats & DRAY_WFORMAT_BIT(w->format)))
        return dray_util_fail(why, len, DRAY_ENOTSUP, "weight_create: format %s is not declared for %s",
                              dray_util_wformat_name(w->format, name, sizeof(name)),
                              w->uses == DRAY_WUSE_EMBED    ? "embed"
                              : w->uses == DRAY_WUSE_MATMUL ? "matmul"
                                                            : "matmul and embed");
    if (!w->n_out || !w->k || w->k % 32 || w->k > 65536)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "weight_create: %u x %u: k must be a positive multiple of 32 up to 65536 "
                              "and n_out positive", w->n_out, w->k);
    if (!w->uses || (w->uses & ~(uint32_t)(DRAY_WUSE_MATMUL | DRAY_WUSE_EMBED)))
        return dray_util_fail(why, len, DRAY_EINVAL, "weight_create: uses %#x is not matmul and/or embed",
                              w->uses);
    if (!w->codes || !w->d || (w->format.has_min != (w->m != NULL)))
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "weight_create: codes and d are required, m exactly when the format has a min");
    if (w->format.super && (w->k % 256 || w->size < offsetof(struct dray_weight_desc, sub) + sizeof(w->sub) ||
                            !w->sub))
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "weight_create: a two-level format needs k a multiple of 256 (k = %u) and sub",
                              w->k);
    for (uint64_t i = 0; w->format.super && w->format.bits != 6 && i < (uint64_t)w->n_out * (w->k / 16u); i++)
        if (((const uint8_t *)w->sub)[i] > 63)
            return dray_util_fail(why, len, DRAY_EINVAL,
                                  "weight_create: sub-scale %llu of row %llu is %u (6 bits: 0..63)",
                                  (unsigned long long)(i % (w->k / 16u)),
                                  (unsigned long long)(i / (w->k / 16u)), ((const uint8_t *)w->sub)[i]);
    return DRAY_OK;
}

/* Matmul on a handle of n_out x k (the plugin's record of it): views x, out.
 * passes = the plugin's matmul_passes mask, or 0 when the handle was not
 * created for matmul. */
static inline int dray_util_check_matmul_packed(const struct dray_matmul_args *a, uint32_t n_out,
                                                uint32_t k, uint32_t passes, struct dray_util_needs *nd,
                                                char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    uint32_t p = a->passes ? a->passes : 1u;
    if (!a->packed || !passes)
        return dray_util_fail(why, len, DRAY_EINVAL, "matmul: wdtype PACKED needs a handle created for matmul");
    if (p > 2)
        return dray_util_fail(why, len, DRAY_EINVAL, "matmul: passes = %u (1 or 2)", p);
    if (!(passes & (1u << (p - 1))))
        return dray_util_fail(why, len, DRAY_ENOTSUP, "matmul: %u activation passes are not declared", p);
    if (a->n_out != n_out || a->k != k || a->n_outlier)
        return dray_util_fail(why, len, DRAY_EINVAL,
                              "matmul: n_out %u, k %u, n_outlier %u against the handle's %u x %u "
                              "(no outliers)", a->n_out, a->k, a->n_outlier, n_out, k);
    if (a->stride_x < a->k || a->stride_out < a->n_out)
        return dray_util_fail(why, len, DRAY_EINVAL, "matmul: stride_x %u < k %u or stride_out %u < n_out %u",
                              a->stride_x, a->k, a->stride_out, a->n_out);
    DRAY_UTIL_TRY(dray_util_need(nd, "matmul x", a->x, a->n_tok, a->stride_x, a->k, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "matmul out", a->out, a->n_tok, a->stride_out, a->n_out, 4, why, len));
    if (dray_util_overlap(a->out, nd->at[1].nbytes, a->x, nd->at[0].nbytes))
        return dray_util_fail(why, len, DRAY_EINVAL, "matmul: out overlaps x");
    return DRAY_OK;
}

/* Embed from a handle of n_rows x dim created for embed (uses_embed): views ids, out. */
static inline int dray_util_check_embed_packed(const struct dray_embed_args *a, uint32_t n_rows,
                                               uint32_t dim, int uses_embed, struct dray_util_needs *nd,
                                               char *why, size_t len)
{
    memset(nd, 0, sizeof(*nd));
    if (!a->packed || !uses_embed)
        return dray_util_fail(why, len, DRAY_EINVAL, "embed: dtype PACKED needs a handle created for embed");
    if (a->n_rows != n_rows || a->dim != dim)
        return dray_util_fail(why, len, DRAY_EINVAL, "embed: %u rows of %u against the handle's %u of %u",
                              a->n_rows, a->dim, n_rows, dim);
    DRAY_UTIL_TRY(dray_util_need(nd, "embed ids", a->ids, 1, 0, a->n_tok, 4, why, len));
    DRAY_UTIL_TRY(dray_util_need(nd, "embed out", a->out, a->n_tok, a->dim, a->dim, 4, why, len));
    return DRAY_OK;
}

/* ---------------------------------------------------------------- data checks */
/* For plugins that can read these arrays on the host (before launching). */

static inline int dray_util_check_ids(const int32_t *ids, uint32_t n_tok, uint32_t n_rows,
                                      char *why, size_t len)
{
    for (uint32_t t = 0; t < n_tok; t++)
        if (ids[t] < 0 || (uint32_t)ids[t] >= n_rows)
            return dray_util_fail(why, len, DRAY_EINVAL,
                                  "embed: ids[%u] = %d is outside the table's %u rows", t, ids[t],
                                  n_rows);
    return DRAY_OK;
}

static inline int dray_util_check_outliers(const int32_t *idx, uint32_t n_outlier, uint32_t k,
                                           char *why, size_t len)
{
    for (uint32_t j = 0; j < n_outlier; j++)
        if (idx[j] < 0 || (uint32_t)idx[j] >= k || (j && idx[j] <= idx[j - 1]))
            return dray_util_fail(why, len, DRAY_EINVAL,
                                  "matmul: outlier_idx[%u] = %d: channels must be strictly "
                                  "increasing and below k = %u",
                                  j, idx[j], k);
    return DRAY_OK;
}

static inline int dray_util_check_slots(const int32_t *slots, uint32_t n_tok, uint32_t n_slots,
                                        char *why, size_t len)
{
    for (uint32_t t = 0; t < n_tok; t++)
        if (slots[t] >= 0 && (uint32_t)slots[t] >= n_slots)
            return dray_util_fail(why, len, DRAY_EINVAL,
                                  "kv_store: slots[%u] = %d but the pool has %u slots", t, slots[t],
                                  n_slots);
    return DRAY_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* DRAY_BACKEND_UTIL_H */
