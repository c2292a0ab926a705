/* chat_render: renders a conversation with dray's chat templates, for
 * tests/test_chat_templates.py to compare with the models' own Jinja.
 *
 *   chat_render [--no-gen] [--name NAME] TEMPLATE_FILE [ROLE CONTENT]...
 *
 * TEMPLATE_FILE's text becomes tokenizer.chat_template of an in-memory GGUF
 * (general.architecture "llama"), so the template is chosen as dray chooses it
 * for a model file (NAME: the configured chat_template). Writes the rendered
 * prompt, exactly, to stdout and "template: NAME" to stderr; exit 1 on error. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "gguf.h"
#include "gguf_write.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n)
        buf[n] = 0;
    else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* An in-memory GGUF carrying the template; *mem must outlive *g. */
static int model_with(const char *tmpl, struct dray_gguf **g, void **mem, char *err, size_t errlen)
{
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    size_t size;
    int rc = w ? 0 : 1;
    if (!rc)
        rc = dray_gguf_add_str(w, "general.architecture", "llama") ||
             dray_gguf_add_str(w, "tokenizer.chat_template", tmpl) ||
             dray_gguf_writer_to_mem(w, mem, &size);
    dray_gguf_writer_free(w);
    if (rc)
        return snprintf(err, errlen, "cannot build the GGUF"), 1;
    return dray_gguf_open_mem(*mem, size, "template.gguf", g, err, errlen) ? 1 : 0;
}

static int render(const char *tmpl, const char *name, bool gen, struct dray_chat_msg *m, size_t n)
{
    struct dray_gguf *g = NULL;
    struct dray_chat_template t;
    void *mem = NULL;
    char err[512] = "", *out = NULL;
    int rc = model_with(tmpl, &g, &mem, err, sizeof(err));
    if (!rc)
        rc = dray_chat_template_pick(g, name, &t, err, sizeof(err)) ? 1 : 0;
    if (!rc) {
        fprintf(stderr, "template: %s\n", t.name ? t.name : "(none)");
        rc = dray_chat_render(&t, m, n, gen, &out, err, sizeof(err)) ? 1 : 0;
        dray_chat_template_free(&t);
    }
    if (!rc)
        fwrite(out, 1, strlen(out), stdout);
    else
        fprintf(stderr, "chat_render: %s\n", err);
    free(out);
    if (g)
        dray_gguf_close(g);
    free(mem);
    return rc;
}

int main(int argc, char **argv)
{
    bool gen = true;
    const char *name = NULL;
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--no-gen"))
            gen = false;
        else if (!strcmp(argv[i], "--name") && i + 1 < argc)
            name = argv[++i];
        else
            break;
    }
    if (i >= argc || (argc - i - 1) % 2) {
        fprintf(stderr, "usage: chat_render [--no-gen] [--name NAME] TEMPLATE_FILE [ROLE CONTENT]...\n");
        return 2;
    }
    char *tmpl = slurp(argv[i]);
    if (!tmpl) {
        fprintf(stderr, "chat_render: cannot read %s\n", argv[i]);
        return 1;
    }
    size_t n = (size_t)(argc - i - 1) / 2;
    struct dray_chat_msg *m = calloc(n ? n : 1, sizeof(*m));
    for (size_t k = 0; m && k < n; k++)
        m[k] = (struct dray_chat_msg){argv[i + 1 + 2 * k], argv[i + 2 + 2 * k]};
    int rc = m ? render(tmpl, name, gen, m, n) : 1;
    free(m);
    free(tmpl);
    return rc;
}
