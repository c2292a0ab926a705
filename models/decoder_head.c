/* The decoder's embedding table and output head, and the policy that picks the
 * head's precision (4-bit rescored, 8-bit, two-pass or not). */
#include "decoder_internal.h"

#include "caps.h"
#include "dray/backend_util.h"
#include "error.h"
#include "log.h"

/* Two-pass activations in the output head too (model opts two_pass), unless the
 * head holds more weight bytes than all layers together: then it is most of a
 * decode step's reads and its second pass is not free, while a smaller head pays
 * for itself (docs/performance.md, "Two-pass activations"). */
bool dec_head_two_pass(const struct dray_model *m)
{
    uint64_t layers = 0;
    for (uint32_t il = m->l0; il < m->l1; il++)
        for (int w = 0; w < MM_COUNT; w++)
            layers += dec_weight_bytes(dec_layer_matrix(&m->layer[il], w));
    if (m->l1 > m->l0) /* a part of a split: as if it held every layer, like their sizes */
        layers = layers * m->info.n_layer / (m->l1 - m->l0);
    return m->two_pass && dec_weight_bytes(m->output.n_out ? &m->output : &m->embd) <= layers;
}

/* Whether the device declares dtype for the op (ABI v2 caps, or v1's props). */
static bool dev_runs(const struct dray_model *m, int op, uint32_t dtype)
{
    return dray_caps_runs(&m->dev->caps, op, dtype);
}

/* The head's precision (config head_precision, head_rescore), for grouped
 * weights only. A head tied to an 8-bit embedding table (table8) can be 4-bit
 * and rescored: its own 4-bit copy is read in full each step, and the most likely
 * tokens of each row get their logits from the 8-bit table again
 * (head_rescore.c). w4a8 takes the 4-bit head, rescored where it can be (a
 * separate output.weight wider than 4 bits is rounded: lossy). auto takes it
 * where it costs no accuracy that matters: rescored, and with one-pass
 * activations, whose own error the rescored head's tail noise hardly adds to;
 * with two-pass activations the 8-bit head, whose much smaller error the tail
 * noise would add to markedly (docs/performance.md, "The output head's
 * precision"). Sets *rescore to the most candidates per row (0 = none). */
static enum dray_wrole head_role(const struct dray_model *m, uint32_t dtype, bool tied, bool table8,
                                  const struct dray_model_opts *o, uint32_t *rescore)
{
    *rescore = 0;
    if (!dray_util_grouped(dtype) || !dev_runs(m, DRAY_OP_MATMUL, DRAY_Q4G32))
        return DRAY_WROLE_MATMUL; /* plugins without the 4-bit matmul keep the 8-bit head */
    if (tied && table8 && dev_runs(m, DRAY_OP_MATMUL, DRAY_F32))
        *rescore = o->head_rescore;
    if (o->head_precision == DRAY_HEAD_W4A8 ||
        (o->head_precision == DRAY_HEAD_AUTO && *rescore && !m->two_pass))
        return DRAY_WROLE_HEAD4;
    *rescore = 0;
    return DRAY_WROLE_MATMUL;
}

/* Whether the weight policy makes token_embd an 8-bit grouped table under
 * dtype (dray_wformat_pick: whole groups of 32, 4-bit only where the file is). */
static bool table_is_q8g(const struct dray_gguf_tensor *te, uint32_t dtype)
{
    return dray_util_grouped(dtype) && te->ne[0] % 32 == 0 &&
           (dtype == DRAY_Q8G32 || !dray_ggml_is_4bit(te->type));
}

/* The vocabulary size from token_embd's shape (checked like dec_load_embeddings). */
static int vocab_of(struct dray_model *m, const struct dray_gguf_tensor **te, char *err, size_t errlen)
{
    struct dray_gguf *g = m->g;
    *te = dec_find_tensor(g, -1, "token_embd", "weight", true, err, errlen);
    if (!*te)
        return DRAY_ENOTFOUND;
    const struct dray_gguf_tensor *t = *te;
    if (t->n_dims != 2 || t->ne[0] != m->info.n_embd || t->ne[1] == 0 || t->ne[1] > INT32_MAX) {
        int rc = dec_check_shape(g, t, m->info.n_embd, t->ne[1], err, errlen);
        return rc ? rc : dray_fail(err, errlen, DRAY_EFORMAT, "%s: token_embd has a bad vocabulary size",
                                   dray_gguf_name(g));
    }
    m->info.n_vocab = (uint32_t)t->ne[1];
    return 0;
}

int dec_read_vocab(struct dray_model *m, char *err, size_t errlen)
{
    const struct dray_gguf_tensor *te;
    return vocab_of(m, &te, err, errlen);
}

/* token_embd, and output.weight when the family uses a separate head. */
int dec_load_embeddings(struct dray_model *m, uint32_t dtype, const struct dray_model_opts *o,
                        char *err, size_t errlen)
{
    struct dray_model_info *in = &m->info;
    struct dray_gguf *g = m->g;
    const struct dray_gguf_tensor *te;
    int vrc = vocab_of(m, &te, err, errlen);
    if (vrc)
        return vrc;
    /* a separate head where the family has one and the file carries it */
    const struct dray_gguf_tensor *out = dec_family_slot(m->fam, DEC_S_OUTPUT, 0, 0)
                                             ? dec_find_tensor(g, -1, "output", "weight", false, err, errlen)
                                             : NULL;
    /* a 4-bit head: the head is the bulk of a decode step's weight bytes */
    /* the EMBED op gathers 8- and 4-bit grouped tables, not 5-bit ones: a 5-bit
     * table (Q5_0, Q5_1) becomes 8-bit groups */
    uint32_t tdtype = dtype == DRAY_Q4G32 && dray_ggml_is_5bit(te->type) ? DRAY_Q8G32 : dtype;
    bool table8 = table_is_q8g(te, tdtype);
    uint32_t rescore = 0;
    enum dray_wrole hd = head_role(m, dtype, !out, table8, o, &rescore);
    enum dray_precision prec = dec_precision_of(dtype);
    /* A tied head with its own 4-bit copy leaves the 8-bit table to gathers
     * only (the embedding, the rescored candidates): group rows, so a gathered
     * row reads its own bytes. Otherwise the table may be the head itself, and
     * calibration gives it outlier channels without changing it
     * (dray_weight_set_outliers). */
    m->head_copy = !out && hd == DRAY_WROLE_HEAD4 && table8;
    int rc = dray_weight_prepare(m->dev, &te, 1, prec, m->head_copy ? DRAY_WROLE_GROUP_ROWS : DRAY_WROLE_TABLE,
                                 NULL, 0, &m->embd, err, errlen);
    if (!rc && m->head_copy)
        m->embd_groups = in->n_embd / 32;
    if (!rc && out) {
        rc = dec_check_shape(g, out, in->n_embd, in->n_vocab, err, errlen);
        if (!rc)
            rc = dray_weight_prepare(m->dev, &out, 1, prec, hd, NULL, 0, &m->output, err, errlen);
    }
    if (!rc && m->head_copy)
        rc = dray_weight_prepare(m->dev, &te, 1, prec, hd, NULL, 0, &m->output, err, errlen);
    if (!rc && m->head_copy && rescore)
        rc = dec_rescore_init(m, rescore, o->head_rescore_tail, err, errlen);
    if (!rc)
        rc = dec_load_vector(m, -1, "output_norm", in->n_embd, &m->output_norm, err, errlen);
    return rc;
}
