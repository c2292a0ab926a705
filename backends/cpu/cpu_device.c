/* The one device of the CPU plugin: the host CPU. Its name comes from
 * /proc/cpuinfo plus the kernel set a context will pick; memory from sysinfo(2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "cpu_internal.h"

/* One warning per DRAY_CPU_ISA value that names a set this CPU lacks: props
 * and every open ask again, and the answer does not change. */
static void warn_once(const char *msg)
{
    static char last[320];
    if (!strcmp(last, msg))
        return;
    snprintf(last, sizeof(last), "%s", msg);
    dray_cpu_log(DRAY_LOG_WARN, msg);
}

int dray_cpu_pick_isa(int want_reference, char *err, size_t errlen)
{
    if (want_reference || dray_cpu_env_reference())
        return DRAY_CPU_ISA_REFERENCE;
    const char *e = getenv("DRAY_CPU_ISA");
    int ask_amx = e && (!strcmp(e, "amx") || !strcmp(e, "amx-int8"));
    char warn[320];
    int isa = dray_cpu_isa_choose(e, dray_cpu_features(ask_amx), dray_cpu_isa_built(), warn, sizeof(warn), err,
                                  errlen);
    if (warn[0])
        warn_once(warn);
    return isa;
}

int dray_cpu_env_reference(void)
{
    const char *e = getenv("DRAY_CPU_REFERENCE");
    return e && e[0] && strcmp(e, "0") != 0;
}

/* Value of the first "key : value" line of /proc/cpuinfo, or def. */
static void cpuinfo_field(const char *key, char *dst, size_t n, const char *def)
{
    snprintf(dst, n, "%s", def);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    size_t klen = strlen(key);
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, klen) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\n")] = '\0';
        if (*v)
            snprintf(dst, n, "%s", v);
        break;
    }
    fclose(f);
}

int dray_cpu_device_props(uint32_t index, struct dray_device_props *props)
{
    if (!props || index != 0)
        return DRAY_EINVAL;
    memset(props, 0, sizeof(*props));
    int isa = dray_cpu_pick_isa(0, NULL, 0);
    if (isa < 0) /* bad DRAY_CPU_ISA: open() reports it; describe the default here */
        isa = dray_cpu_isa_default(dray_cpu_features(0), dray_cpu_isa_built());
    int ref = isa == DRAY_CPU_ISA_REFERENCE;
    char model[100];
    cpuinfo_field("model name", model, sizeof(model), "CPU");
    snprintf(props->name, sizeof(props->name), "%s (%s)", model, dray_cpu_isa_name(isa));
    cpuinfo_field("vendor_id", props->vendor, sizeof(props->vendor), "unknown");

    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        props->mem_total = (uint64_t)si.totalram * si.mem_unit;
        props->mem_free = ((uint64_t)si.freeram + si.bufferram) * si.mem_unit;
    }
    props->max_alloc = props->mem_total;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    props->compute_units = n > 0 ? (uint32_t)n : 1;
    props->flags = DRAY_DEV_UNIFIED | (ref ? DRAY_DEV_REFERENCE : 0);

    props->op_dtypes[DRAY_OP_EMBED] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_RMSNORM] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_MATMUL] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ROPE] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_KV_STORE] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_ATTENTION] = DRAY_DTYPE_BIT(DRAY_I8) | DRAY_DTYPE_BIT(DRAY_F16);
    props->op_dtypes[DRAY_OP_GATED_ACT] = DRAY_DTYPE_BIT(DRAY_F32);
    props->op_dtypes[DRAY_OP_ADD] = DRAY_DTYPE_BIT(DRAY_F32);
    return 0;
}
