/* dray plugin: the vendor kit's commands.
 *   dray plugin new NAME [DIR]   a renamed copy of the plugin template in DIR
 *                                (default ./NAME) and the lines that build it
 *                                against this dray's installed SDK. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "plugin_new.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dray plugin new NAME [DIR] [--template TEMPLATE_DIR]\n"
            "  Write a new backend plugin NAME into DIR (default: ./NAME): dray's plugin\n"
            "  template with every file, symbol, plugin name, device and vendor string\n"
            "  renamed, and a meson.build that finds this dray's SDK through pkg-config.\n"
            "  NAME: a-z, 0-9, '_', starting with a letter; the plugin is libdray-NAME.so.\n"
            "  --template DIR  copy this template folder instead of the installed one\n");
}

/* The next steps, with this install's own paths: what docs/PORTING.md says. */
static void print_next(const char *name, const char *dir)
{
    char pc[4096], root[4096];
    printf("wrote plugin '%s' to %s\n\nbuild it against this dray:\n", name, dir);
    if (dray_plugin_pkgconfig(pc, sizeof(pc), root, sizeof(root)) == 0) {
        printf("  export PKG_CONFIG_PATH=%s\n", pc);
        if (root[0])
            printf("  export PKG_CONFIG_SYSROOT_DIR=%s   # dray was staged with --destdir %s\n",
                   root, root);
    } else {
        printf("  export PKG_CONFIG_PATH=<prefix>/<libdir>/pkgconfig   # where dray-backend.pc "
               "was installed (this dray is not an installed one)\n");
    }
    printf("  meson setup %s/build %s && ninja -C %s/build\n", dir, dir, dir);
    printf("  dray conformance --plugin %s/build/libdray-%s.so\n", dir, name);
    printf("  meson install -C %s/build   # into dray-backend.pc's plugindir%s: then `dray devices` "
           "lists '%s'\n", dir, root[0] ? " under the sysroot" : "", name);
}

static int cmd_new(int argc, char **argv)
{
    const char *name = NULL, *dir = NULL, *tpl = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--template")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dray plugin new: --template needs a folder\n");
                return 2;
            }
            tpl = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "dray plugin new: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (!name) {
            name = argv[i];
        } else if (!dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "dray plugin new: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    char err[2048], from[4096];
    if (!name) {
        fprintf(stderr, "dray plugin new: NAME is required\n");
        usage(stderr);
        return 2;
    }
    if (dray_plugin_name_check(name, err, sizeof(err))) {
        fprintf(stderr, "dray plugin new: %s\n", err);
        return 2;
    }
    if (!dir)
        dir = name;
    if (dray_plugin_template_dir(tpl, from, sizeof(from), err, sizeof(err)) ||
        dray_plugin_new(from, name, dir, err, sizeof(err))) {
        fprintf(stderr, "dray plugin new: %s\n", err);
        return 1;
    }
    print_next(name, dir);
    return 0;
}

int dray_cmd_plugin(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "new"))
        return cmd_new(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2)
        fprintf(stderr, "dray plugin: unknown subcommand '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
