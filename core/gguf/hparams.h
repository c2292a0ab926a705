/* Checked reads of model hyper-parameters from GGUF metadata, shared by every
 * architecture in models/. A file's numbers size allocations and loops, so each one
 * is checked at load against a range (finite, positive, below a cap) and errors
 * name the file, the key, the value and the range expected. */
#ifndef DRAY_CORE_HPARAMS_H
#define DRAY_CORE_HPARAMS_H

#include <stddef.h>
#include <stdint.h>

struct dray_gguf;

/* Caps far above any released model, low enough that products such as
 * context x layers x kv width cannot overflow 64 bits or ask for absurd memory. */
#define DRAY_HP_MAX_CONTEXT 16777216u /* tokens; also the `context` config cap */
#define DRAY_HP_MAX_EMBD 65536u
#define DRAY_HP_MAX_FF 1048576u
#define DRAY_HP_MAX_HEADS 1024u
#define DRAY_HP_MAX_HEAD_DIM 1024u

/* ARCH.KEY as an integer in [lo, hi]. dflt: value if the key is absent, or NULL if
 * the key is required. */
int dray_hparam_u32(const struct dray_gguf *g, const char *arch, const char *key, uint32_t lo,
                    uint32_t hi, const uint32_t *dflt, uint32_t *out, char *err, size_t errlen);
/* ARCH.KEY as a finite number in [lo, hi]; dflt as above. */
int dray_hparam_f32(const struct dray_gguf *g, const char *arch, const char *key, float lo,
                    float hi, const float *dflt, float *out, char *err, size_t errlen);
/* ARCH.KEY_A (a) must divide ARCH.KEY_B (b), e.g. kv heads into heads. */
int dray_hparam_divides(const struct dray_gguf *g, const char *arch, const char *key_a,
                        uint32_t a, const char *key_b, uint32_t b, char *err, size_t errlen);

#endif
