/* `dray plugin new`: find the plugin template, copy it renamed, and say where
 * dray-backend.pc is. The template is plain text: the rename is a substitution
 * of "template" and of the template's symbol prefix "tpl" (each in lower, upper
 * and capitalised case) by the new name, in file names and contents alike, so
 * that nothing in the copy still calls itself "template": not ops->name, not
 * the device or vendor strings, not the file libdray-<name>.so. */
#include "plugin_new.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dray/dray.h"

#ifndef DRAY_TOOLS_BUILD_ROOT
#define DRAY_TOOLS_BUILD_ROOT ""
#endif
#ifndef DRAY_TEMPLATE_SOURCE
#define DRAY_TEMPLATE_SOURCE ""
#endif
#ifndef DRAY_TEMPLATE_FROM_BINDIR
#define DRAY_TEMPLATE_FROM_BINDIR ""
#endif
#ifndef DRAY_TEMPLATE_INSTALLED
#define DRAY_TEMPLATE_INSTALLED ""
#endif
#ifndef DRAY_PC_FROM_BINDIR
#define DRAY_PC_FROM_BINDIR ""
#endif
#ifndef DRAY_PC_INSTALLED
#define DRAY_PC_INSTALLED ""
#endif

#define MAX_NAME 32
#define MAX_FILE (1u << 20) /* the template's files are a few KiB each */

/* The plugins dray ships: a vendor's copy under one of these names would
 * shadow or be shadowed by it on the plugin path. */
static const char *const taken[] = {"cpu", "opencl", "vulkan", "cuda", "hip", "template"};

int dray_plugin_name_check(const char *name, char *err, size_t errlen)
{
    size_t n = strlen(name);
    if (n == 0 || n > MAX_NAME || !islower((unsigned char)name[0])) {
        snprintf(err, errlen, "plugin name '%s': it must start with a lower-case letter and have "
                 "1..%d characters", name, MAX_NAME);
        return DRAY_EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if (!islower((unsigned char)name[i]) && !isdigit((unsigned char)name[i]) && name[i] != '_') {
            snprintf(err, errlen, "plugin name '%s': character %zu ('%c') is not a-z, 0-9 or '_' "
                     "(the name becomes C symbols and the file libdray-<name>.so)", name, i + 1,
                     isprint((unsigned char)name[i]) ? name[i] : '?');
            return DRAY_EINVAL;
        }
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        if (!strcmp(name, taken[i])) {
            snprintf(err, errlen, "plugin name '%s' is taken by a plugin dray ships: choose "
                     "another (for example your company's or your device's name)", name);
            return DRAY_EINVAL;
        }
    if (strstr(name, "template") || strstr(name, "tpl")) {
        snprintf(err, errlen, "plugin name '%s' contains 'template' or 'tpl', the words the copy "
                 "replaces: choose another", name);
        return DRAY_EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------ finding things */

/* The folder of the running binary, or "" when /proc/self/exe cannot say. */
static void exe_dir(char *dir, size_t len)
{
    char exe[PATH_MAX];
    dir[0] = '\0';
    if (!realpath("/proc/self/exe", exe))
        return;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(dir, len, "%s", exe);
}

static int in_build_tree(const char *bindir)
{
    size_t root = strlen(DRAY_TOOLS_BUILD_ROOT);
    return root && !strncmp(bindir, DRAY_TOOLS_BUILD_ROOT, root) &&
           (bindir[root] == '/' || bindir[root] == '\0');
}

static int is_template(const char *dir)
{
    char p[PATH_MAX + 32];
    struct stat st;
    snprintf(p, sizeof(p), "%s/meson.build", dir);
    if (stat(p, &st) || !S_ISREG(st.st_mode))
        return 0;
    snprintf(p, sizeof(p), "%s/template.h", dir);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The build's answers as objects, not literals: an empty one means "not configured",
 * and testing a literal's first byte is a constant expression clang rejects. */
static const char template_source[] = DRAY_TEMPLATE_SOURCE;
static const char template_from_bindir[] = DRAY_TEMPLATE_FROM_BINDIR;
static const char template_installed[] = DRAY_TEMPLATE_INSTALLED;

int dray_plugin_template_dir(const char *override, char *dir, size_t dirlen, char *err, size_t errlen)
{
    char bin[PATH_MAX], cand[4][PATH_MAX + 64];
    int n = 0;
    exe_dir(bin, sizeof(bin));
    if (override && override[0])
        snprintf(cand[n++], sizeof(cand[0]), "%s", override);
    else {
        if (bin[0] && in_build_tree(bin) && template_source[0])
            snprintf(cand[n++], sizeof(cand[0]), "%s", template_source);
        if (bin[0] && template_from_bindir[0])
            snprintf(cand[n++], sizeof(cand[0]), "%s/%s", bin, template_from_bindir);
        if (template_installed[0])
            snprintf(cand[n++], sizeof(cand[0]), "%s", template_installed);
    }
    char tried[1300] = "";
    for (int i = 0; i < n; i++) {
        char real[PATH_MAX];
        if (realpath(cand[i], real) && is_template(real)) {
            snprintf(dir, dirlen, "%s", real);
            return 0;
        }
        size_t used = strlen(tried);
        if (used + 2 < sizeof(tried))
            snprintf(tried + used, sizeof(tried) - used, "%s%.300s", i ? ", " : "", cand[i]);
    }
    snprintf(err, errlen, "no plugin template (a folder with template.h and meson.build) at %s: "
             "install dray (`meson install`; it installs <datadir>/dray/template) or pass "
             "--template DIR", n ? tried : "(no place known)");
    return DRAY_ENOTFOUND;
}

int dray_plugin_pkgconfig(char *pc_dir, size_t pclen, char *sysroot, size_t rootlen)
{
    char bin[PATH_MAX], cand[PATH_MAX + 64], real[PATH_MAX], pc[PATH_MAX + 32];
    struct stat st;
    exe_dir(bin, sizeof(bin));
    pc_dir[0] = sysroot[0] = '\0';
    if (!bin[0] || in_build_tree(bin))
        return DRAY_ENOTFOUND; /* a build tree has no installed dray-backend.pc */
    if (DRAY_PC_FROM_BINDIR[0])
        snprintf(cand, sizeof(cand), "%s/%s", bin, DRAY_PC_FROM_BINDIR);
    else
        snprintf(cand, sizeof(cand), "%s", DRAY_PC_INSTALLED);
    if (!realpath(cand, real))
        return DRAY_ENOTFOUND;
    snprintf(pc, sizeof(pc), "%s/dray-backend.pc", real);
    if (stat(pc, &st) || !S_ISREG(st.st_mode))
        return DRAY_ENOTFOUND;
    snprintf(pc_dir, pclen, "%s", real);
    /* Staged with --destdir ROOT: the .pc says prefix=<configured prefix> while it
     * lies under ROOT<configured prefix>; pkg-config then needs the sysroot. */
    size_t nr = strlen(real), nc = strlen(DRAY_PC_INSTALLED);
    if (nc && nr > nc && !strcmp(real + nr - nc, DRAY_PC_INSTALLED))
        snprintf(sysroot, rootlen, "%.*s", (int)(nr - nc), real);
    return 0;
}

/* ------------------------------------------------------------ the copy */

struct growbuf {
    char *p;
    size_t n, cap;
};

static int put(struct growbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return DRAY_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* Replace every "template"/"tpl" in src (n bytes) by the name in the same case:
 * lower -> name, UPPER -> NAME, Capitalised -> Name. */
static int rename_text(const char *src, size_t n, const char *name, struct growbuf *out)
{
    static const char *const words[] = {"template", "tpl"};
    char lower[MAX_NAME + 1], upper[MAX_NAME + 1], cap[MAX_NAME + 1];
    size_t ln = strlen(name);
    for (size_t i = 0; i <= ln; i++) {
        lower[i] = name[i];
        upper[i] = (char)toupper((unsigned char)name[i]);
        cap[i] = i == 0 ? upper[i] : name[i];
    }
    size_t i = 0, run = 0; /* bytes [run, i) are copied as they are */
    while (i < n) {
        const char *with = NULL;
        size_t wl = 0;
        for (size_t w = 0; w < 2 && !with; w++) {
            wl = strlen(words[w]);
            if (i + wl > n || strncasecmp(src + i, words[w], wl))
                continue;
            int all_up = 1, all_low = 1;
            for (size_t k = 0; k < wl; k++) {
                all_up &= isupper((unsigned char)src[i + k]) != 0;
                all_low &= islower((unsigned char)src[i + k]) != 0;
            }
            with = all_up ? upper : all_low ? lower : cap;
        }
        if (!with) {
            i++;
            continue;
        }
        if (put(out, src + run, i - run) || put(out, with, ln))
            return DRAY_ENOMEM;
        i += wl;
        run = i;
    }
    return put(out, src + run, n - run);
}

static int read_file(const char *path, struct growbuf *b, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return DRAY_EIO;
    }
    char chunk[8192];
    size_t got;
    int rc = 0;
    while (rc == 0 && (got = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        rc = put(b, chunk, got);
        if (rc == 0 && b->n > MAX_FILE) {
            snprintf(err, errlen, "%s: larger than %u bytes: not a template file", path, MAX_FILE);
            rc = DRAY_ERANGE;
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        rc = DRAY_EIO;
    }
    if (rc == DRAY_ENOMEM)
        snprintf(err, errlen, "%s: out of memory", path);
    fclose(f);
    return rc;
}

static int write_file(const char *path, const struct growbuf *b, char *err, size_t errlen)
{
    FILE *f = fopen(path, "wx"); /* never overwrite: the folder was empty */
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return DRAY_EIO;
    }
    int bad = b->n && fwrite(b->p, 1, b->n, f) != b->n;
    bad |= fclose(f) != 0;
    if (bad) {
        snprintf(err, errlen, "%s: write error (disk full?)", path);
        return DRAY_EIO;
    }
    return 0;
}

/* out_dir may exist when it is empty (a vendor's fresh checkout folder). */
static int make_out_dir(const char *out_dir, char *err, size_t errlen)
{
    if (mkdir(out_dir, 0777) == 0)
        return 0;
    if (errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", out_dir, strerror(errno));
        return DRAY_EIO;
    }
    DIR *d = opendir(out_dir);
    if (!d) {
        snprintf(err, errlen, "%s exists and is not a folder I can read: %s", out_dir, strerror(errno));
        return DRAY_EIO;
    }
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    if (!empty) {
        snprintf(err, errlen, "%s exists and is not empty: nothing was written (give a new folder)",
                 out_dir);
        return DRAY_EIO;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int dray_plugin_new(const char *template_dir, const char *name, const char *out_dir, char *err,
                    size_t errlen)
{
    int rc = dray_plugin_name_check(name, err, errlen);
    if (rc)
        return rc;
    DIR *d = opendir(template_dir);
    if (!d) {
        snprintf(err, errlen, "cannot read the template folder %s: %s", template_dir, strerror(errno));
        return DRAY_EIO;
    }
    /* the file names first, sorted, so a failure names the same file every time */
    char *names[64];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < sizeof(names) / sizeof(names[0])) {
        char p[PATH_MAX + 256];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", template_dir, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode) && !(names[n++] = strdup(e->d_name)))
            rc = DRAY_ENOMEM;
    }
    closedir(d);
    if (rc == 0 && n == 0) {
        snprintf(err, errlen, "the template folder %s holds no files", template_dir);
        rc = DRAY_ENOTFOUND;
    }
    if (rc == 0)
        rc = make_out_dir(out_dir, err, errlen);
    qsort(names, n, sizeof(names[0]), cmp_str);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct growbuf src = {0}, dst = {0}, fname = {0};
        char in[PATH_MAX + 256], outp[PATH_MAX + 256];
        snprintf(in, sizeof(in), "%s/%s", template_dir, names[i]);
        rc = read_file(in, &src, err, errlen);
        if (rc == 0 && (rename_text(src.p ? src.p : "", src.n, name, &dst) ||
                        rename_text(names[i], strlen(names[i]), name, &fname))) {
            snprintf(err, errlen, "%s: out of memory", in);
            rc = DRAY_ENOMEM;
        }
        if (rc == 0) {
            snprintf(outp, sizeof(outp), "%s/%s", out_dir, fname.p);
            rc = write_file(outp, &dst, err, errlen);
        }
        free(src.p);
        free(dst.p);
        free(fname.p);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    return rc;
}
