/* A session's KV moved between engines (dray.h: dray_session_kv_export/import).
 *
 * The buffer, in host byte order:
 *   struct image_head                      the layout it was written in
 *   int32  ids[n_tok]                      the tokens whose KV follows
 *   for each group g, for each table entry first[g] .. n_tok / block_size - 1:
 *          block_bytes[g] bytes            one block in kv.h's host layout
 * first[g] is dray_kv_live_from(g, n_tok): window groups have already dropped
 * the blocks no later query sees, and the importer skips the same entries.
 * n_tok is a whole number of blocks, so no block is partial and the importer
 * writes from position n_tok on into blocks of its own. */
#include <stdlib.h>
#include <string.h>

#include "dray/dray.h"
#include "engine_internal.h"
#include "error.h"
#include "kv.h"

#define IMAGE_MAGIC "DRAYKV1"

struct image_head {
    char magic[8];
    struct dray_kv_layout layout;
    uint32_t n_group, n_tok, n_vocab, pad;
    uint32_t first[DRAY_KV_MAX_GROUPS];       /* first live table entry per group */
    uint64_t block_bytes[DRAY_KV_MAX_GROUPS]; /* host bytes of one block per group */
};

/* The header an engine's KV would write for n_tok tokens, and the buffer's size. */
static size_t image_plan(const struct dray_session *s, uint32_t n_tok, struct image_head *h)
{
    struct dray_kv *kv = s->e->kv;
    const struct dray_kv_plan *p = dray_kv_get_plan(kv);
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, IMAGE_MAGIC, sizeof(IMAGE_MAGIC));
    dray_kv_get_layout(kv, &h->layout);
    h->n_group = p->n_group;
    h->n_tok = n_tok;
    h->n_vocab = s->e->info.n_vocab;
    size_t bytes = sizeof(*h) + (size_t)n_tok * sizeof(int32_t);
    uint32_t n_entry = n_tok / h->layout.block_size;
    for (uint32_t g = 0; g < p->n_group; g++) {
        h->first[g] = dray_kv_live_from(kv, g, n_tok);
        h->block_bytes[g] = dray_kv_block_host_bytes(kv, g);
        if (h->first[g] < n_entry)
            bytes += (size_t)(n_entry - h->first[g]) * h->block_bytes[g];
    }
    return bytes;
}

int dray_session_kv_export(struct dray_session *s, void **data, size_t *bytes, char *err,
                           size_t errlen)
{
    *data = NULL;
    *bytes = 0;
    struct dray_kv *kv = s->e->kv;
    uint32_t bs = dray_kv_block_size(kv);
    uint32_t n_tok = (uint32_t)(s->n_hist / bs * bs);
    if (n_tok == 0)
        return dray_fail(err, errlen, DRAY_ERANGE, "the session holds %zu tokens, less than one "
                         "KV block (%u tokens): nothing to export", s->n_hist, bs);
    struct image_head h;
    size_t total = image_plan(s, n_tok, &h);
    unsigned char *buf = malloc(total), *p = buf;
    if (!buf)
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory for %zu bytes of KV", total);
    memcpy(p, &h, sizeof(h));
    p += sizeof(h);
    memcpy(p, s->hist, (size_t)n_tok * sizeof(int32_t));
    p += (size_t)n_tok * sizeof(int32_t);
    for (uint32_t g = 0; g < h.n_group; g++)
        for (uint32_t k = h.first[g]; k < n_tok / bs; k++) {
            int32_t b = dray_kv_seq_block(kv, s->seq, g, k);
            int rc = b < 0 ? DRAY_EINVAL : dray_kv_block_download(kv, g, (uint32_t)b, p);
            if (rc) {
                free(buf);
                return dray_fail(err, errlen, rc, b < 0 ? "group %u has no block at entry %u"
                                 : "the plugin's download of group %u entry %u failed", g, k);
            }
            p += h.block_bytes[g];
        }
    *data = buf;
    *bytes = total;
    return 0;
}

/* Why the image in h (of `bytes` bytes) cannot go into s, or 0. */
static int image_check(const struct dray_session *s, const struct image_head *h,
                       const unsigned char *data, size_t bytes, char *err, size_t errlen)
{
    struct image_head want;
    if (memcmp(h->magic, IMAGE_MAGIC, sizeof(IMAGE_MAGIC)))
        return dray_fail(err, errlen, DRAY_EINVAL, "KV import: not a dray KV export (bad magic)");
    uint32_t bs = h->layout.block_size;
    if (bs == 0 || h->n_tok == 0 || h->n_tok % bs || h->n_tok > s->e->info.context)
        return dray_fail(err, errlen, DRAY_EINVAL, "KV import: %u tokens in blocks of %u do not "
                         "fit this engine's context of %u", h->n_tok, bs, s->e->info.context);
    size_t total = image_plan(s, h->n_tok, &want);
    const struct dray_kv_layout *a = &h->layout, *b = &want.layout;
    if (memcmp(a, b, sizeof(*a)))
        return dray_fail(err, errlen, DRAY_EINVAL, "KV import: written as dtype %u, block %u, %u KV "
                         "heads of %u, but this engine has dtype %u, block %u, %u heads of %u "
                         "(same model, kv_dtype and kv_block needed)", a->dtype, a->block_size,
                         a->n_kv_head, a->head_dim, b->dtype, b->block_size, b->n_kv_head,
                         b->head_dim);
    if (h->n_group != want.n_group || h->n_vocab != want.n_vocab ||
        memcmp(h->first, want.first, sizeof(h->first)) ||
        memcmp(h->block_bytes, want.block_bytes, sizeof(h->block_bytes)))
        return dray_fail(err, errlen, DRAY_EINVAL, "KV import: written by a model with %u layer "
                         "groups and %u tokens of vocabulary, this engine's has %u and %u, or "
                         "their layers differ", h->n_group, h->n_vocab, want.n_group, want.n_vocab);
    if (bytes != total)
        return dray_fail(err, errlen, DRAY_EINVAL, "KV import: %zu bytes, but its header "
                         "describes %zu (truncated or padded)", bytes, total);
    if (s->n_hist)
        return dray_fail(err, errlen, DRAY_EINVAL, "KV import: the session already holds %zu "
                         "tokens; import into a new session", s->n_hist);
    for (uint32_t i = 0; i < h->n_tok; i++) {
        int32_t id;
        memcpy(&id, data + sizeof(*h) + (size_t)i * sizeof(id), sizeof(id));
        if (id < 0 || (uint32_t)id >= h->n_vocab)
            return dray_fail(err, errlen, DRAY_EINVAL, "KV import: token %u is id %d, outside "
                             "the vocabulary of %u", i, id, h->n_vocab);
    }
    return 0;
}

int dray_session_kv_import(struct dray_session *s, const void *data, size_t bytes, char *err,
                           size_t errlen)
{
    struct image_head h;
    if (bytes < sizeof(h))
        return dray_fail(err, errlen, DRAY_EINVAL, "KV import: %zu bytes, shorter than the "
                         "header (%zu)", bytes, sizeof(h));
    memcpy(&h, data, sizeof(h));
    int rc = image_check(s, &h, data, bytes, err, errlen);
    if (rc)
        return rc;
    struct dray_kv *kv = s->e->kv;
    uint32_t n_entry = h.n_tok / h.layout.block_size;
    int32_t *rows = malloc((size_t)h.n_group * n_entry * sizeof(int32_t));
    int32_t *ids = malloc((size_t)h.n_tok * sizeof(int32_t));
    if (!rows || !ids) {
        free(rows);
        free(ids);
        return dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    }
    const unsigned char *p = (const unsigned char *)data + sizeof(h);
    memcpy(ids, p, (size_t)h.n_tok * sizeof(int32_t));
    p += (size_t)h.n_tok * sizeof(int32_t);
    const int32_t *rp[DRAY_KV_MAX_GROUPS];
    uint32_t done_g = 0, done_k = 0; /* blocks allocated so far: groups < done_g, then done_k */
    for (uint32_t g = 0; g < h.n_group && !rc; g++) {
        int32_t *row = rows + (size_t)g * n_entry;
        rp[g] = row;
        for (uint32_t k = h.first[g]; k < n_entry && !rc; k++) {
            uint32_t b;
            rc = dray_kv_block_alloc(kv, g, &b);
            if (rc) {
                rc = dray_fail(err, errlen, DRAY_ENOMEM, "KV import: no free block for group %u "
                               "entry %u (the KV pool is full)", g, k);
                break;
            }
            row[k] = (int32_t)b;
            done_g = g;
            done_k = k + 1;
            if (dray_kv_block_upload(kv, g, b, p))
                rc = dray_fail(err, errlen, DRAY_EBACKEND, "KV import: the plugin's upload of "
                               "group %u entry %u failed", g, k);
            p += h.block_bytes[g];
        }
    }
    if (!rc && dray_kv_seq_attach(kv, s->seq, h.n_tok, rp))
        rc = dray_fail(err, errlen, DRAY_EINVAL, "KV import: the engine refused the blocks");
    if (!rc && dray_session_adopt(s, ids, h.n_tok)) {
        dray_kv_seq_truncate(kv, s->seq, 0);
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "out of memory");
    }
    /* the sequence holds its own reference now (or failed): drop the allocation's */
    for (uint32_t g = 0; g < h.n_group && g <= done_g; g++)
        for (uint32_t k = h.first[g]; k < (g < done_g ? n_entry : done_k); k++)
            dray_kv_block_unref(kv, g, (uint32_t)rows[(size_t)g * n_entry + k]);
    free(rows);
    free(ids);
    return rc;
}
