/* Certification of the serving path (`dray conformance --model FILE`): a real
 * model through the engine and the scheduler on the plugin under test, against
 * the same model on the CPU plugin, and the certificate written as JSON. The
 * op-level half is the conformance kit's (plugins/conformance). */
#ifndef DRAY_TOOLS_CERTIFY_H
#define DRAY_TOOLS_CERTIFY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conformance.h"
#include "dray/dray.h"

/* One end-to-end check. `measured` and `tolerance` are in the check's own unit
 * (docs/PORTING.md, "Certifying the serving path", has the table). */
struct dray_cert_check {
    char name[32];
    int ran, passed;
    double measured, tolerance;
    char unit[64];
    char detail[640];
};

#define DRAY_CERT_MAX_CHECKS 8

struct dray_cert_model {
    int ran;                  /* 1 when both engines opened and the checks ran */
    char error[1024];         /* why they did not run */
    char model[1024], model_name[128], arch[32];
    char plugin[64], device[128];      /* as the engine reports them */
    char precision[16], kv_dtype[16];
    uint32_t n_prompts, prompt_tokens, gen_tokens;
    size_t n_checks;
    struct dray_cert_check checks[DRAY_CERT_MAX_CHECKS];
};

/* Open `base` (model set, any --set keys applied) on the subject plugin and on
 * the CPU plugin, and run the checks: logits, greedy tokens through the
 * scheduler, batched = single-sequence decode, prefix-cache reuse. gen_tokens
 * new tokens per request. Prints a line per check to log. Returns 0 when every
 * check that ran passed, 1 when one failed or the engines could not open. */
int dray_certify_model(const struct dray_config *base, const char *plugin, const char *device,
                       uint32_t gen_tokens, struct dray_cert_model *out, FILE *log);

/* Write the certificate: dray's version, the date, the subject (plugin, file,
 * ABI, device), every op variant with its measured error (ops_rc: the op
 * suite's result, 0 = pass), the model checks when model is non-NULL (model_rc:
 * dray_certify_model's result) and the verdict, "pass" when both passed.
 * Written to path.tmp, then renamed. Returns 0, or -1 with err set. */
int dray_cert_write(const char *path, const struct dray_conformance_report *ops, int ops_rc,
                    const struct dray_cert_model *model, int model_rc, char *err, size_t errlen);

#endif
