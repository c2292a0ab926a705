/* The messages between rank 0 and another rank (core/dist.h). Every request
 * is a dist_req header and a payload; every answer a dist_ans header, an error
 * text of err_len bytes and a payload. Structs travel as bytes: all ranks run
 * the same dray build, which the greeting checks (DIST_BUILD). Buffers on the
 * rank are named by their address there, checked against what it allocated. */
#ifndef DRAY_CORE_DIST_PROTO_H
#define DRAY_CORE_DIST_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dray/backend.h"
#include "kv.h"
#include "model.h"

/* Changes when a struct that travels changes, so mismatched builds refuse. */
#define DIST_BUILD                                                                                     \
    (((uint64_t)sizeof(struct dray_kv_layer_step) << 48 | (uint64_t)sizeof(struct dray_kv_pool) << 32 |  \
      (uint64_t)sizeof(struct dray_model_opts) << 16 | (uint64_t)sizeof(struct dray_device_props)) ^     \
     (uint64_t)sizeof(struct dist_ans) << 56 ^ (uint64_t)sizeof(struct dist_hello) << 40)

/* A rank at work on a request says it is alive this often, so rank 0 tells a
 * long step from a dead rank within distributed_timeout, however long steps are. */
#define DIST_BEAT_S 1.0
/* The goodbye waits this long for a rank to take it (a rank lost meanwhile). */
#define DIST_BYE_TIMEOUT_S 5.0

enum dist_op {
    DIST_HELLO = 1,    /* -> build, plugin name, props, caps */
    DIST_ALLOC,        /* a = bytes -> a = buffer */
    DIST_FREE,         /* a = buffer (no answer) */
    DIST_UPLOAD,       /* a = buffer, b = offset, payload bytes */
    DIST_DOWNLOAD,     /* a = buffer, b = offset, c = bytes -> payload */
    DIST_COPY,         /* a = dst buffer, b = dst offset, c = src buffer, d = src offset, e = bytes */
    DIST_SYNC,
    DIST_LOAD,         /* payload: opts, path, scores */
    DIST_UNLOAD,
    DIST_FORWARD,      /* a = layer_begin, b = layer_end, c = n_tok, d = n_embd, e = 1: no x_out back
                        * (tensor parallel); payload: pos, steps and pools of each layer, x_in
                        * -> a = compute ns, payload x_out */
    DIST_CALIB_BEGIN,  /* a = n, b = n_outlier, c = smooth_k */
    DIST_CALIB_END,    /* a = ok */
    DIST_CALIB_SCORES, /* -> payload floats */
    DIST_BYE,          /* no answer: the rank leaves its loop */
};

struct dist_req {
    uint32_t op, pad;
    uint64_t a, b, c, d, e;
};

enum dist_ans_kind {
    DIST_ANSWER = 0, /* the request's answer */
    DIST_ALIVE,      /* still working on it (every DIST_BEAT_S) */
};

struct dist_ans {
    int32_t rc;
    uint32_t err_len;
    uint32_t kind, pad; /* enum dist_ans_kind */
    uint64_t a, b, c;
};

/* The greeting's answer: what rank 0 shows and plans with. */
struct dist_hello {
    char plugin[64], host[64];
    /* The rank's plugin's negotiated ABI: rank 0's proxy declares it, so a host
     * that sets version-4 op arguments (rope freq_factors and attn_factor,
     * attention softcap) only for plugins that take them sees what the rank's
     * own forward will run on. */
    uint32_t abi, pad;
    struct dray_device_props props;
    struct dray_op_caps caps;
};

/* A growing message. */
struct dist_msg {
    unsigned char *p;
    size_t n, cap;
    int oom;
};

static inline void dist_put(struct dist_msg *m, const void *src, size_t n)
{
    if (m->oom || !n)
        return;
    if (m->n + n > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < m->n + n)
            cap *= 2;
        unsigned char *p = realloc(m->p, cap);
        if (!p) {
            m->oom = 1;
            return;
        }
        m->p = p;
        m->cap = cap;
    }
    memcpy(m->p + m->n, src, n);
    m->n += n;
}

/* A message being read: take n bytes, or NULL when fewer are left. */
struct dist_rd {
    const unsigned char *p;
    size_t n, at;
};

static inline const void *dist_take(struct dist_rd *r, size_t n)
{
    if (n > r->n - r->at)
        return NULL;
    const void *p = r->p + r->at;
    r->at += n;
    return p;
}

#endif
