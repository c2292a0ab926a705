/* The certificate file of `dray conformance --certify FILE`: JSON, one object,
 * written to FILE.tmp and renamed so a reader never sees half of it. The keys
 * are listed in docs/PORTING.md ("Certifying the serving path"); "format" names
 * their version, so a later dray can add keys without breaking readers. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "certify.h"
#include "dray/backend.h"

#define CERT_FORMAT "dray-certificate/1"

static void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f); /* UTF-8 passes through */
    }
    fputc('"', f);
}

/* JSON has no Inf/NaN: an unmeasurable error is written as null. */
static void jnum(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

static void write_ops(FILE *f, const struct dray_conformance_report *o, int ops_rc)
{
    fprintf(f, "  \"ops\": {\n    \"reference\": \"cpu (scalar reference kernels)\",\n");
    fprintf(f, "    \"seed\": %llu,\n    \"cases_per_variant\": %u,\n",
            (unsigned long long)o->seed, o->reps);
    fprintf(f, "    \"variants_run\": %zu,\n    \"variants_passed\": %zu,\n", o->n_run, o->n_pass);
    fprintf(f, "    \"passed\": %s,\n    \"variants\": [", ops_rc == 0 ? "true" : "false");
    for (size_t i = 0; i < o->n_rows; i++) {
        const struct dray_conformance_row *r = &o->rows[i];
        fprintf(f, "%s\n      {\"op\": ", i ? "," : "");
        jstr(f, r->op);
        fputs(", \"dtype\": ", f);
        jstr(f, r->dtype);
        fprintf(f, ", \"passed\": %s, \"verdict\": ", r->passed ? "true" : "false");
        jstr(f, r->verdict);
        fprintf(f, ", \"cases\": %u, \"failed\": %u, \"max_abs\": ", r->cases, r->failed);
        jnum(f, r->max_abs);
        fputs(", \"max_rel\": ", f);
        jnum(f, r->max_rel);
        fputs(", \"nmse\": ", f);
        jnum(f, r->nmse);
        fputs(", \"tolerance\": ", f);
        jstr(f, r->tolerance);
        fputc('}', f);
    }
    fprintf(f, "\n    ]\n  }");
}

static void write_model(FILE *f, const struct dray_cert_model *m, int pass)
{
    fputs(",\n  \"model\": {\n    \"file\": ", f);
    jstr(f, m->model);
    fputs(",\n    \"name\": ", f);
    jstr(f, m->model_name);
    fputs(",\n    \"arch\": ", f);
    jstr(f, m->arch);
    fputs(",\n    \"precision\": ", f);
    jstr(f, m->precision);
    fputs(",\n    \"kv_dtype\": ", f);
    jstr(f, m->kv_dtype);
    fprintf(f, ",\n    \"prompts\": %u,\n    \"prompt_tokens\": %u,\n    \"tokens_per_request\": %u,\n",
            m->n_prompts, m->prompt_tokens, m->gen_tokens);
    fprintf(f, "    \"passed\": %s,\n    \"error\": ", pass ? "true" : "false");
    if (m->error[0])
        jstr(f, m->error);
    else
        fputs("null", f);
    fputs(",\n    \"checks\": [", f);
    for (size_t i = 0; i < m->n_checks; i++) {
        const struct dray_cert_check *c = &m->checks[i];
        fprintf(f, "%s\n      {\"name\": ", i ? "," : "");
        jstr(f, c->name);
        fprintf(f, ", \"ran\": %s, \"passed\": %s", c->ran ? "true" : "false",
                c->ran && c->passed ? "true" : "false");
        if (c->ran) {
            fputs(", \"measured\": ", f);
            jnum(f, c->measured);
            fputs(", \"tolerance\": ", f);
            jnum(f, c->tolerance);
            fputs(", \"unit\": ", f);
            jstr(f, c->unit);
        }
        fputs(", \"detail\": ", f);
        jstr(f, c->detail);
        fputc('}', f);
    }
    fputs("\n    ]\n  }", f);
}

int dray_cert_write(const char *path, const struct dray_conformance_report *ops, int ops_rc,
                    const struct dray_cert_model *model, int model_rc, char *err, size_t errlen)
{
    int pass = ops_rc == 0 && (!model || model_rc == 0);
    char tmp[4096], date[32];
    time_t now = time(NULL);
    struct tm tm;
    struct utsname un;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    if (uname(&un))
        snprintf(un.machine, sizeof(un.machine), "unknown");
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"result\": \"%s\",\n  \"dray_version\": ", CERT_FORMAT,
            pass ? "pass" : "fail");
    jstr(f, dray_version());
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"host_arch\": ", date);
    jstr(f, un.machine);
    fprintf(f, ",\n  \"abi\": {\"host\": %u, \"host_min\": %u, \"plugin\": %u},\n  \"plugin\": {\"name\": ",
            DRAY_ABI_VERSION, DRAY_ABI_VERSION_MIN, ops->abi);
    jstr(f, ops->plugin);
    fputs(", \"file\": ", f);
    jstr(f, ops->path);
    fprintf(f, "},\n  \"device\": {\"index\": %u, \"name\": ", ops->device_index);
    jstr(f, ops->device);
    fputs(", \"vendor\": ", f);
    jstr(f, ops->vendor);
    fputs("},\n", f);
    write_ops(f, ops, ops_rc);
    if (model)
        write_model(f, model, model->ran && model_rc == 0);
    else
        fputs(",\n  \"model\": null", f);
    fputs("\n}\n", f);
    int bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        snprintf(err, errlen, "cannot write %s: %s", bad ? tmp : path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}
