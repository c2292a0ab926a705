/* Greedy generation for the engine tests: the token ids a session produces, so
 * tests can compare runs (cold vs warm, one plugin vs another, clean vs faulted). */
#ifndef DRAY_TEST_GREEDY_H
#define DRAY_TEST_GREEDY_H

#include <stddef.h>
#include <stdint.h>

#include "dray/dray.h"

#define DRAY_TEST_MAX_GEN 128

struct dray_test_tokens {
    int32_t ids[DRAY_TEST_MAX_GEN];
    size_t n;
};

/* Greedy sampling (temperature 0, top_p 1, no repeat penalty) of max_tokens tokens. */
void dray_test_greedy_params(struct dray_gen_params *g, uint32_t max_tokens);
/* Continues session s with ids[0..n), then generates max_tokens (<= DRAY_TEST_MAX_GEN)
 * greedily into out. Returns dray's rc;
 * the reason is in err. */
int dray_test_generate(struct dray_session *s, const int32_t *ids, size_t n, uint32_t max_tokens,
                       struct dray_test_tokens *out, char *err, size_t errlen);
/* The same in a fresh session of e, freed before returning. */
int dray_test_generate_fresh(struct dray_engine *e, const int32_t *ids, size_t n, uint32_t max_tokens,
                             struct dray_test_tokens *out, char *err, size_t errlen);
/* ids[0] = 2 (BOS), then n-1 spread-out ids of the tiny models' vocabulary. */
void dray_test_tiny_prompt(int32_t *ids, size_t n);

#endif
