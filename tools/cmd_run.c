/* dray run: one prompt in, a continuation out, with prefill and decode speed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cmd.h"
#include "dray/dray.h"

static void usage(void)
{
    printf("usage: dray run [options] -p TEXT | -f FILE | --prompt-ids 2,651,...\n"
           "  -p, --prompt TEXT     prompt text (BOS is added as the model says)\n"
           "  -f, --file FILE       read the prompt from FILE\n"
           "  --prompt-ids LIST     comma-separated token ids, used as given\n"
           "  --stop STRING         stop when the output contains STRING (repeatable)\n"
           "  --grammar FILE        the output follows the GBNF grammar in FILE (start rule root)\n"
           "  --print-token-ids     print the generated ids on the last line of stdout\n"
           "  --dump-logits FILE    write f32 logits [n_prompt][n_vocab] of the prompt and exit\n"
           "  -q, --quiet           no model or speed report on stderr\n");
    dray_cli_help();
}

struct out {
    int32_t *ids;
    size_t n, cap;
    const char *echo; /* the prompt, shown once the prefill has succeeded */
};

static void echo_prompt(struct out *o)
{
    if (o->echo)
        fputs(o->echo, stdout);
    o->echo = NULL;
}

static int on_token(void *user, const char *text, size_t len, int32_t id)
{
    struct out *o = user;
    echo_prompt(o);
    if (len)
        fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (id >= 0) {
        if (o->n == o->cap) {
            size_t cap = o->cap ? 2 * o->cap : 256;
            int32_t *p = realloc(o->ids, cap * sizeof(*p));
            if (!p)
                return 1;
            o->ids = p;
            o->cap = cap;
        }
        o->ids[o->n++] = id;
    }
    return 0;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof(**ids));
    while (*ids && *s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "dray: --prompt-ids: bad id at '%.20s' (expected comma-separated integers)\n", s);
            free(*ids);
            *ids = NULL;
            return 2;
        }
        if (*n == cap && !(*ids = realloc(*ids, (cap *= 2) * sizeof(**ids))))
            break;
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return *ids ? 0 : 1;
}

#define PROMPT_FILE_MAX ((size_t)512 << 20) /* the tokenizer's limit */

/* Reads the whole file (what: "prompt", "grammar"). Refused, with the reason: a folder (fread fails and
 * the prompt was silently empty), a read error, more than PROMPT_FILE_MAX bytes, and
 * a NUL byte (the prompt is a C string: everything after it was silently dropped). */
static char *read_file(const char *path, const char *what)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    size_t cap = 4096, n = 0, r;
    char *buf = NULL, why[160] = "";
    const char *nul;
    if (!f) {
        fprintf(stderr, "dray: cannot read %s file %s: %s\n", what, path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(why, sizeof(why), "it is a folder, expected a text file");
        goto out;
    }
    buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 < cap)
            continue;
        char *grown = cap <= PROMPT_FILE_MAX ? realloc(buf, cap *= 2) : NULL;
        if (!grown) {
            snprintf(why, sizeof(why), cap > PROMPT_FILE_MAX ? "more than %zu MiB, the most a "
                     "prompt can be" : "out of memory at %zu MiB", cap >> 21);
            goto out;
        }
        buf = grown;
    }
    if (!buf)
        snprintf(why, sizeof(why), "out of memory");
    else if (ferror(f))
        snprintf(why, sizeof(why), "%s", strerror(errno));
    else if ((nul = memchr(buf, 0, n)))
        snprintf(why, sizeof(why), "byte %zu is NUL; a prompt is text, and the rest of the file "
                 "would be lost", (size_t)(nul - buf));
    else
        buf[n] = 0;
out:
    fclose(f);
    if (!why[0])
        return buf;
    fprintf(stderr, "dray: %s file %s: %s\n", what, path, why);
    free(buf);
    return NULL;
}

int dray_cmd_run(int argc, char **argv)
{
    struct dray_config cfg;
    char *rest[argc + 1], err[2048];
    int n_rest;
    if (dray_cli_parse_seqs(argc, argv, &cfg, rest, &n_rest, 1))
        return 2;
    const char *prompt = NULL, *prompt_ids = NULL, *dump = NULL, *stops[16];
    char *file_text = NULL, *grammar = NULL;
    bool print_ids = false, quiet = false;
    uint32_t n_stop = 0;
    for (int i = 1; i < n_rest; i++) {
        const char *a = rest[i];
        bool has = i + 1 < n_rest;
        if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && has) prompt = rest[++i];
        else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && has) {
            if (!(file_text = read_file(rest[++i], "prompt")))
                return 1;
            prompt = file_text;
        } else if (!strcmp(a, "--prompt-ids") && has) prompt_ids = rest[++i];
        else if (!strcmp(a, "--dump-logits") && has) dump = rest[++i];
        else if (!strcmp(a, "--stop") && has && n_stop < 16) stops[n_stop++] = rest[++i];
        else if (!strcmp(a, "--grammar") && has) {
            free(grammar);
            if (!(grammar = read_file(rest[++i], "grammar")) ||
                dray_grammar_check(grammar, strlen(grammar), err, sizeof(err))) {
                if (grammar)
                    fprintf(stderr, "dray: grammar file %s: %s\n", rest[i], err);
                free(grammar);
                free(file_text);
                return 2;
            }
        }
        else if (!strcmp(a, "--print-token-ids")) print_ids = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else {
            fprintf(stderr, "dray run: unknown or incomplete option '%s' (dray run -h lists them)\n", a);
            free(file_text);
            free(grammar);
            return 2;
        }
    }
    if (!prompt == !prompt_ids) {
        fprintf(stderr, "dray run: give exactly one of -p TEXT, -f FILE or --prompt-ids LIST\n");
        free(file_text);
        free(grammar);
        return 2;
    }
    struct dray_engine *e = dray_cli_open_engine(&cfg, quiet);
    int rc = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    struct dray_session *s = NULL;
    struct out o = {0};
    if (!e)
        goto out;
    if (prompt_ids ? parse_ids(prompt_ids, &ids, &n)
                   : dray_engine_tokenize(e, prompt, true, true, &ids, &n, err, sizeof(err))) {
        if (!prompt_ids)
            fprintf(stderr, "dray: %s\n", err);
        goto out;
    }
    if (dray_session_new(e, &s, err, sizeof(err))) {
        fprintf(stderr, "dray: %s\n", err);
        goto out;
    }
    if (dump) {
        FILE *f = fopen(dump, "wb");
        if (!f) {
            fprintf(stderr, "dray: cannot write %s: %s\n", dump, strerror(errno));
            goto out;
        }
        int r = dray_session_dump_logits(s, ids, n, f, err, sizeof(err));
        /* stdio buffers: a full disk often shows only when fclose flushes */
        int closed = fclose(f), close_errno = errno;
        if (r || closed) {
            fprintf(stderr, "dray: --dump-logits %s: %s\n", dump,
                    r ? err : strerror(close_errno));
            goto out;
        }
        rc = 0;
        goto out;
    }
    struct dray_gen_params p;
    struct dray_gen_stats st;
    dray_gen_params_from_config(&cfg, &p);
    p.stop = stops;
    p.n_stop = n_stop;
    p.grammar = grammar;
    o.echo = prompt_ids ? NULL : prompt;
    if (dray_session_generate(s, ids, n, &p, on_token, &o, &st, err, sizeof(err))) {
        fprintf(stderr, "dray: %s\n", err);
        goto out;
    }
    echo_prompt(&o);
    printf("\n");
    if (print_ids) {
        for (size_t i = 0; i < o.n; i++)
            printf("%s%d", i ? " " : "", o.ids[i]);
        printf("\n");
    }
    /* the text and its newline reach the terminal or log before the stats on
     * stderr, so the stats stand on a line of their own (stdout is buffered when
     * it is not a terminal, stderr never is) */
    fflush(stdout);
    if (!quiet)
        fprintf(stderr, "dray: prefill %u tokens in %.3f s (%.1f tok/s); decode %u tokens in %.3f s "
                "(%.1f tok/s); stopped: %s\n",
                st.n_prefilled, st.prefill_s, st.n_prefilled / (st.prefill_s > 0 ? st.prefill_s : 1e-9),
                st.n_generated, st.decode_s, st.n_generated / (st.decode_s > 0 ? st.decode_s : 1e-9),
                st.stop_reason);
    if (!quiet && st.n_drafted)
        fprintf(stderr, "dray: lookup drafts: %u of %u drafted tokens kept\n", st.n_draft_kept,
                st.n_drafted);
    rc = 0;
out:
    free(o.ids);
    free(ids);
    free(file_text);
    free(grammar);
    dray_session_free(s);
    dray_engine_close(e);
    return rc;
}
