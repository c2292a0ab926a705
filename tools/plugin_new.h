/* `dray plugin new`: a renamed copy of the plugin template (plugins/template,
 * installed as <datadir>/dray/template). */
#ifndef DRAY_TOOLS_PLUGIN_NEW_H
#define DRAY_TOOLS_PLUGIN_NEW_H

#include <stddef.h>

/* A plugin name is a C identifier in lower case, [a-z][a-z0-9_]*, at most 32
 * bytes: it becomes ops->name, the file libdray-<name>.so, and the prefix of
 * the plugin's symbols. 0 when valid, else DRAY_EINVAL with err saying why. */
int dray_plugin_name_check(const char *name, char *err, size_t errlen);

/* The template folder this dray uses: `override` when given, else the source
 * tree's for a binary run from its build tree, else <bindir>/../<datadir>/dray/
 * template beside the running binary, else the configured install folder.
 * Writes the folder to dir; DRAY_ENOTFOUND with err naming every place tried. */
int dray_plugin_template_dir(const char *override, char *dir, size_t dirlen, char *err, size_t errlen);

/* Copy every regular file of template_dir into out_dir (created; it must not
 * exist or be empty), replacing "template"/"Template"/"TEMPLATE" and the
 * template's symbol prefix "tpl"/"TPL" with name (in its case) in file names
 * and contents. Afterwards no file mentions "template" or "tpl" in any case.
 * Returns 0, or a DRAY_E* with err naming the file and the problem. */
int dray_plugin_new(const char *template_dir, const char *name, const char *out_dir, char *err,
                    size_t errlen);

/* What a vendor exports before building against this dray: the folder of
 * dray-backend.pc (pc_dir) and, for an install staged with --destdir, the root
 * it was staged into (sysroot, "" when the install is where it was configured
 * for). DRAY_ENOTFOUND when no dray-backend.pc belongs to this binary. */
int dray_plugin_pkgconfig(char *pc_dir, size_t pclen, char *sysroot, size_t rootlen);

#endif
