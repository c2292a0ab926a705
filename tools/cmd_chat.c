/* dray chat: a multi-turn conversation on stdin/stdout. The conversation's KV
 * stays in one session, so each turn prefills only its own new tokens.
 *
 * Ctrl-C (SIGINT) never kills the conversation: during a reply it stops the reply
 * after the token being generated; what was printed stays in the conversation
 * (the engine fed those tokens to the KV, and the next turn closes the cut reply
 * with the end-of-turn marker, as for a reply cut by max tokens). At the prompt,
 * Ctrl-C right after an interrupted reply, or twice in a row, exits; so does
 * end of input (Ctrl-D). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cmd.h"
#include "dray/dray.h"

static void usage(void)
{
    printf("usage: dray chat [options]\n"
           "  -s, --system TEXT     system prompt (folded into the first user turn)\n"
           "  -q, --quiet           no per-turn speed report\n"
           "Type a message and press enter. /reset starts over, /exit (or end of input) quits.\n");
    dray_cli_help();
}

/* What Ctrl-C means depends on where the loop is, and the handler decides it
 * itself: a flag cleared by the loop after printing the prompt would lose a
 * Ctrl-C that lands between the prompt and the read (then getline blocks and the
 * key seems dead). Only sig_atomic_t flags, write() and _exit() are used here,
 * which is all a handler may use.
 *   at the prompt, armed  -> exit 0 (the second Ctrl-C, or the first after a stopped reply)
 *   at the prompt         -> arm, say how to quit and show the prompt again; the
 *                            loop goes back to reading without a prompt of its own
 *                            (the Ctrl-C may land before the read, which then
 *                            just goes on waiting)
 *   anywhere else         -> stop the reply at the next token (g_interrupted) */
static volatile sig_atomic_t g_interrupted, g_at_prompt, g_armed, g_tty;

static void on_sigint(int sig)
{
    (void)sig;
    if (g_at_prompt) {
        if (g_armed) {
            static const char nl[] = "\n";
            ssize_t w = write(STDOUT_FILENO, nl, sizeof(nl) - 1);
            (void)w;
            _exit(0);
        }
        /* Armed before the message: once "> " is on the screen the user may press
         * Ctrl-C again, and that signal may reach another thread (the plugin's
         * workers do not block SIGINT) while this one is still between its
         * write and the next statement. */
        g_armed = 1;
        static const char msg[] = "\n(Ctrl-C again, /exit or Ctrl-D quits)\n> ";
        /* the prompt only on a terminal, like the loop's */
        ssize_t w = write(STDOUT_FILENO, msg, sizeof(msg) - (g_tty ? 1 : 3));
        (void)w;
        return;
    }
    g_interrupted = 1;
}

/* No SA_RESTART: a Ctrl-C at the prompt must make getline return (EINTR). */
static void catch_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/* Prints the text of each token; non-zero (stop) once Ctrl-C was pressed. The
 * token whose text is printed here is in the KV either way, so the screen and
 * the conversation agree. */
static int on_token(void *user, const char *text, size_t len, int32_t id)
{
    (void)user;
    (void)id;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return g_interrupted ? 1 : 0;
}

/* The turn failed or stopped because the conversation fills the context: say so
 * and how to go on, since every later turn would fail the same way. */
static void suggest_reset(const struct dray_session *s, const struct dray_engine *e)
{
    fprintf(stderr, "dray: the conversation holds %u of the %u tokens of the context: "
            "/reset starts a new one (or raise -c)\n", dray_session_len(s), dray_engine_get_info(e)->context);
}

static void chomp(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = 0;
}

int dray_cmd_chat(int argc, char **argv)
{
    struct dray_config cfg;
    char *rest[argc + 1], err[2048];
    int n_rest;
    if (dray_cli_parse(argc, argv, &cfg, rest, &n_rest))
        return 2;
    const char *system = NULL;
    bool quiet = false;
    for (int i = 1; i < n_rest; i++) {
        if ((!strcmp(rest[i], "-s") || !strcmp(rest[i], "--system")) && i + 1 < n_rest) system = rest[++i];
        else if (!strcmp(rest[i], "-q") || !strcmp(rest[i], "--quiet")) quiet = true;
        else if (!strcmp(rest[i], "-h") || !strcmp(rest[i], "--help")) { usage(); return 0; }
        else {
            fprintf(stderr, "dray chat: unknown or incomplete option '%s' (dray chat -h lists them)\n", rest[i]);
            return 2;
        }
    }
    struct dray_engine *e = dray_cli_open_engine(&cfg, quiet);
    if (!e)
        return 1;
    struct dray_session *s = NULL;
    if (dray_session_new(e, &s, err, sizeof(err))) {
        fprintf(stderr, "dray: %s\n", err);
        dray_engine_close(e);
        return 1;
    }
    struct dray_gen_params p;
    dray_gen_params_from_config(&cfg, &p);
    bool tty = isatty(0);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    g_tty = tty;
    catch_sigint();
    bool prompt = true;
    for (;;) {
        /* at the prompt before it shows: a Ctrl-C the user presses once "> " is
         * on the screen must find the handler in its prompt mode */
        fflush(stdout);
        g_at_prompt = 1;
        if (tty && prompt)
            printf("> ");
        fflush(stdout);
        errno = 0;
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) {
            if (errno != EINTR)
                break; /* end of input */
            /* a Ctrl-C at the prompt: the handler armed and reprompted. Still at
             * the prompt (g_at_prompt stays set), so a second Ctrl-C that lands
             * before the next read exits instead of counting as a stopped reply. */
            clearerr(stdin);
            prompt = false;
            continue;
        }
        g_at_prompt = 0;
        prompt = true;
        g_armed = 0;
        chomp(line);
        if (!line[0])
            continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            dray_session_free(s);
            s = NULL;
            if (dray_session_new(e, &s, err, sizeof(err))) {
                fprintf(stderr, "dray: %s\n", err);
                rc = 1;
                break;
            }
            continue;
        }
        struct dray_gen_stats st;
        g_interrupted = 0;
        int trc = dray_chat_turn(s, system, line, &p, on_token, NULL, &st, err, sizeof(err));
        if (trc) {
            /* a bad turn (too long, ...) is reported; the conversation goes on */
            fprintf(stderr, "dray: %s\n", err);
            if (trc == DRAY_ERANGE && dray_session_len(s) > 0)
                suggest_reset(s, e);
            continue;
        }
        printf("\n");
        fflush(stdout); /* the reply's newline before what goes to stderr */
        if (!strcmp(st.stop_reason, "caller")) {
            g_armed = 1; /* the next Ctrl-C at the prompt exits */
            fprintf(stderr, "[reply stopped by Ctrl-C; it stays in the conversation. "
                    "Ctrl-C again at the prompt quits]\n");
        }
        if (!quiet)
            fprintf(stderr, "[turn: %u new tokens prefilled (%u already cached) at %.1f tok/s; "
                    "%u generated at %.1f tok/s; stopped: %s; context %u/%u]\n",
                    st.n_prefilled, st.n_reused, st.n_prefilled / (st.prefill_s > 0 ? st.prefill_s : 1e-9),
                    st.n_generated, st.n_generated / (st.decode_s > 0 ? st.decode_s : 1e-9), st.stop_reason,
                    dray_session_len(s), dray_engine_get_info(e)->context);
        if (!strcmp(st.stop_reason, "context full"))
            suggest_reset(s, e);
        fflush(stdout);
    }
    free(line);
    dray_session_free(s);
    dray_engine_close(e);
    return rc;
}
