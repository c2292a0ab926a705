/* The configuration schema shared by the parser (config.c) and the printers
 * (config_print.c): one row per key, the one source of docs/config.md's table. */
#ifndef DRAY_CORE_CONFIG_KEYS_H
#define DRAY_CORE_CONFIG_KEYS_H

#include <stddef.h>

enum key_type { T_STR, T_U32, T_U64, T_SIZE, T_BOOL, T_FLOAT, T_ENUM };

/* Who sets a key: anyone, or someone tuning accuracy against speed (docs/config.md
 * lists these apart, as tuning knobs). */
enum key_level { KEY_USER, KEY_EXPERT };

struct enum_name {
    const char *name;
    int value;
};

struct key {
    const char *name;    /* flat name, also the name for dray_config_set */
    const char *section; /* section it may be written in; NULL = top level only */
    const char *inner;   /* its name inside the section */
    enum key_type type;
    size_t offset, size; /* field in struct dray_config; size of a string buffer */
    double lo, hi;       /* range of numbers */
    const struct enum_name *names;
    int nonempty;        /* strings: "" is not allowed */
    const char *help;    /* the meaning column of docs/config.md (Markdown): one sentence */
    enum key_level level;
};

extern const struct key dray_config_keys[];
extern const size_t dray_config_n_keys;
extern const char *const dray_config_sections[];
extern const size_t dray_config_n_sections;

#endif
