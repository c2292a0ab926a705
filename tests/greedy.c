/* Greedy generation for the engine tests (greedy.h). */
#include "greedy.h"

#include <string.h>

#include "tiny_gemma.h"

static int collect(void *user, const char *text, size_t len, int32_t id)
{
    (void)text;
    (void)len;
    struct dray_test_tokens *t = user;
    if (id >= 0 && t->n < DRAY_TEST_MAX_GEN)
        t->ids[t->n++] = id;
    return 0;
}

void dray_test_greedy_params(struct dray_gen_params *g, uint32_t max_tokens)
{
    memset(g, 0, sizeof(*g));
    g->top_p = 1;
    g->repeat_penalty = 1;
    g->max_tokens = max_tokens;
}

int dray_test_generate(struct dray_session *s, const int32_t *ids, size_t n, uint32_t max_tokens,
                       struct dray_test_tokens *out, char *err, size_t errlen)
{
    struct dray_gen_params g;
    dray_test_greedy_params(&g, max_tokens);
    struct dray_gen_stats st;
    out->n = 0;
    err[0] = '\0';
    return dray_session_generate(s, ids, n, &g, collect, out, &st, err, errlen);
}

int dray_test_generate_fresh(struct dray_engine *e, const int32_t *ids, size_t n, uint32_t max_tokens,
                             struct dray_test_tokens *out, char *err, size_t errlen)
{
    struct dray_session *s = NULL;
    out->n = 0;
    err[0] = '\0';
    int rc = dray_session_new(e, &s, err, errlen);
    if (!rc)
        rc = dray_test_generate(s, ids, n, max_tokens, out, err, errlen);
    dray_session_free(s);
    return rc;
}

void dray_test_tiny_prompt(int32_t *ids, size_t n)
{
    ids[0] = 2;
    for (size_t i = 1; i < n; i++)
        ids[i] = (int32_t)(6 + (i * 41) % (TINY_GEMMA_VOCAB - 6));
}
