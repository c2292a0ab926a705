/* Printing the configuration: as YAML that reads back unchanged (`dray config`),
 * and the key table of docs/config.md as Markdown (`dray config --markdown`),
 * both from the one table of keys in config.c (config_keys.h). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_keys.h"
#include "dray/dray.h"

/* ------------------------------------------------------------ YAML */

static void print_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* Shortest decimal that reads back as the same float: 0.7, not 0.699999988. */
static void print_float(FILE *f, float v)
{
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

static void print_size(FILE *f, uint64_t v)
{
    static const char *const unit[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int i = 0; i < 4 && v; i++) {
        uint64_t m = 1ull << (10 * (4 - i));
        if (v % m == 0) {
            fprintf(f, "%llu%s", (unsigned long long)(v / m), unit[i]);
            return;
        }
    }
    fprintf(f, "%llu", (unsigned long long)v);
}

static void print_value(FILE *f, const struct dray_config *cfg, const struct key *k)
{
    const char *field = (const char *)cfg + k->offset;
    uint32_t u32;
    uint64_t u64;
    int32_t e;
    float fl;
    bool b;
    if (k->offset == offsetof(struct dray_config, api_key) && field[0]) {
        fputs("\"\"  # set, not shown (a secret)", f);
        return;
    }
    switch (k->type) {
    case T_STR: print_string(f, field); break;
    case T_U32: memcpy(&u32, field, 4); fprintf(f, "%u", u32); break;
    case T_U64: memcpy(&u64, field, 8); fprintf(f, "%llu", (unsigned long long)u64); break;
    case T_SIZE: memcpy(&u64, field, 8); print_size(f, u64); break;
    case T_BOOL: memcpy(&b, field, sizeof(b)); fputs(b ? "true" : "false", f); break;
    case T_FLOAT: memcpy(&fl, field, 4); print_float(f, fl); break;
    case T_ENUM: {
        memcpy(&e, field, 4);
        const char *name = "?";
        for (const struct enum_name *n = k->names; n->name; n++)
            if (n->value == e)
                name = n->name;
        fputs(name, f);
        break;
    }
    }
}

void dray_config_print(const struct dray_config *cfg, void *file)
{
    FILE *f = file ? file : stdout;
    fprintf(f, "# effective dray configuration: defaults%s%s\n", cfg->source[0] ? " + " : "",
            cfg->source);
    for (size_t i = 0; i < dray_config_n_keys; i++)
        if (!dray_config_keys[i].section) {
            fprintf(f, "%s: ", dray_config_keys[i].name);
            print_value(f, cfg, &dray_config_keys[i]);
            fputc('\n', f);
        }
    for (size_t s = 0; s < dray_config_n_sections; s++) {
        fprintf(f, "%s:\n", dray_config_sections[s]);
        for (size_t i = 0; i < dray_config_n_keys; i++)
            if (dray_config_keys[i].section && !strcmp(dray_config_keys[i].section, dray_config_sections[s])) {
                fprintf(f, "  %s: ", dray_config_keys[i].inner);
                print_value(f, cfg, &dray_config_keys[i]);
                fputc('\n', f);
            }
    }
}

/* ------------------------------------------------------------ Markdown */

/* A bound of a range: integers without a fraction, else the shortest %g. */
static void md_number(FILE *f, double v)
{
    if (v == (double)(uint64_t)v)
        fprintf(f, "%" PRIu64, (uint64_t)v);
    else
        fprintf(f, "%g", v);
}

/* Text of a cell: a '|' would end the cell, so it is escaped. */
static void md_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', f);
        fputc(*s, f);
    }
}

/* The default column: strings bare ("cpu"), "" for an empty one. */
static void md_default(FILE *f, const struct dray_config *def, const struct key *k)
{
    const char *field = (const char *)def + k->offset;
    if (k->type == T_STR)
        fputs(field[0] ? field : "\"\"", f);
    else
        print_value(f, def, k);
}

/* The type column: "integer 0..1024", "enum `int8\\|f32`", "string, non-empty (≤ 63 bytes)". */
static void md_type(FILE *f, const struct key *k)
{
    switch (k->type) {
    case T_STR:
        fprintf(f, "string%s (≤ %zu bytes)", k->nonempty ? ", non-empty" : "", k->size - 1);
        break;
    case T_U32:
    case T_U64:
        if (k->type == T_U64 && k->lo == 0 && k->hi == 0) {
            fputs("integer 0..2^64-1", f);
            break;
        }
        fputs("integer ", f);
        md_number(f, k->lo);
        fputs("..", f);
        md_number(f, k->hi ? k->hi : 4294967295.0);
        break;
    case T_SIZE:
        fputs("size", f);
        if (k->lo > 0)
            fprintf(f, ", at least %.0f bytes", k->lo);
        break;
    case T_BOOL: fputs("bool", f); break;
    case T_FLOAT:
        fputs("number ", f);
        md_number(f, k->lo);
        fputs("..", f);
        md_number(f, k->hi);
        break;
    case T_ENUM:
        fputs("enum `", f);
        for (const struct enum_name *n = k->names; n->name; n++)
            fprintf(f, "%s%s", n == k->names ? "" : "\\|", n->name);
        fputc('`', f);
        break;
    }
}

/* The section column: "(top level only)", "`backend:`" or "`model: path`". */
static void md_section(FILE *f, const struct key *k)
{
    if (!k->section)
        fputs("(top level only)", f);
    else if (!strcmp(k->inner, k->name))
        fprintf(f, "`%s:`", k->section);
    else
        fprintf(f, "`%s: %s`", k->section, k->inner);
}

/* The table of the keys of one level, in table order. */
static void md_table(FILE *f, const struct dray_config *def, enum key_level level)
{
    fputs("| key (flat) | in section | type | default | meaning |\n"
          "| --- | --- | --- | --- | --- |\n", f);
    for (size_t i = 0; i < dray_config_n_keys; i++) {
        const struct key *k = &dray_config_keys[i];
        if (k->level != level)
            continue;
        fprintf(f, "| `%s` | ", k->name);
        md_section(f, k);
        fputs(" | ", f);
        md_type(f, k);
        fputs(" | `", f);
        md_default(f, def, k);
        fputs("` | ", f);
        md_text(f, k->help);
        fputs(" |\n", f);
    }
}

void dray_config_print_markdown(void *file)
{
    FILE *f = file ? file : stdout;
    struct dray_config def;
    dray_config_defaults(&def);
    md_table(f, &def, KEY_USER);
    fputs("\n### Tuning knobs\n\n"
          "Their defaults suit the models dray knows; they trade accuracy against speed or\n"
          "memory, or check the plugin ([Precision](#precision); the measurements:\n"
          "[performance.md](performance.md#measurements-behind-the-code)).\n\n", f);
    md_table(f, &def, KEY_EXPERT);
}
