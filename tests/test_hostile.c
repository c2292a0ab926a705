/* Hostile input against the `dray` command: files and flags a
 * careless or malicious user could give. Each case runs the real binary in a child
 * process with a deadline, so a hang fails the test instead of blocking CI, and checks
 * the exit status and that the message names what was wrong. */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"
#include "tiny_gemma.h"

#define OUT_CAP 8192

/* Output of one run: stdout and stderr interleaved, truncated to OUT_CAP - 1. */
struct result {
    int status; /* exit code, 128 + signal, or -1 if it ran past the deadline */
    char out[OUT_CAP];
};

static const char *dray_exe(void)
{
    static char path[1024];
    const char *root = getenv("DRAY_BUILD_ROOT");
    snprintf(path, sizeof(path), "%s/tools/dray", root ? root : ".");
    return path;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads the child's output until EOF or the deadline; keeps the first OUT_CAP - 1 bytes. */
static void drain(int fd, struct result *r, double deadline)
{
    size_t n = 0;
    char sink[4096];
    for (;;) {
        double left = deadline - now_s();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) == 0) {
            r->status = -1;
            break;
        }
        char *dst = n < OUT_CAP - 1 ? r->out + n : sink;
        size_t room = n < OUT_CAP - 1 ? OUT_CAP - 1 - n : sizeof(sink);
        ssize_t got = read(fd, dst, room);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        if (dst != sink)
            n += (size_t)got;
    }
    r->out[n] = 0;
}

/* Runs dray with the NULL-terminated args (args[0] is the subcommand); stdin is
 * /dev/null. A child still running after secs seconds is killed. */
static void run_dray(struct result *r, int secs, const char *const *args)
{
    const char *argv[64] = {dray_exe()};
    size_t n = 1;
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    memset(r, 0, sizeof(*r));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    drain(fds[0], r, now_s() + secs);
    close(fds[0]);
    int st = 0;
    if (r->status == -1)
        kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    if (r->status != -1)
        r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    print_message("$ dray %s ... -> %d\n%s", args[0], r->status, r->out);
}

/* The run failed cleanly (exit 1 or 2, no signal, no hang) and said each of the words. */
static void expect_error(const struct result *r, const char *w1, const char *w2)
{
    assert_true(r->status == 1 || r->status == 2);
    assert_non_null(strstr(r->out, w1));
    if (w2)
        assert_non_null(strstr(r->out, w2));
}

/* ------------------------------------------------------------ files */

static const char *tiny_model(void)
{
    const char *path = dray_test_path("tiny.gguf");
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    return path;
}

static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*size ? *size : 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *size, f), *size);
    fclose(f);
    return b;
}

/* Sets ne[0] of the tensor called name (its info record: u64 name length, name,
 * u32 n_dims, u64 ne[0], ...) in the GGUF at path. */
static void patch_ne0(const char *path, const char *name, uint64_t ne0)
{
    size_t size, len = strlen(name);
    uint8_t *b = slurp(path, &size);
    size_t at = 0;
    for (size_t i = 8; i + len + 12 <= size && !at; i++) {
        uint64_t l;
        memcpy(&l, b + i - 8, 8);
        if (l == len && !memcmp(b + i, name, len))
            at = i + len + 4;
    }
    assert_true(at != 0);
    memcpy(b + at, &ne0, 8);
    assert_int_equal(dray_test_write_file(path, b, size), 0);
    free(b);
}

/* Overwrites the value of metadata key (record: u64 key length, key, u32 type,
 * value) with n bytes, keeping its type. */
static void patch_kv(const char *path, const char *key, const void *val, size_t n)
{
    size_t size, len = strlen(key);
    uint8_t *b = slurp(path, &size);
    size_t at = 0;
    for (size_t i = 8; i + len + 4 + n <= size && !at; i++) {
        uint64_t l;
        memcpy(&l, b + i - 8, 8);
        if (l == len && !memcmp(b + i, key, len))
            at = i + len + 4;
    }
    assert_true(at != 0);
    memcpy(b + at, val, n);
    assert_int_equal(dray_test_write_file(path, b, size), 0);
    free(b);
}

/* ------------------------------------------------------------ wrapped size */

/* An F32 tensor of 2^62 + 8 elements needs 2^64 + 32 bytes, which wrapped to 32 and
 * passed the end-of-file check; info then counted 4.6e18 parameters and
 * --dump-tensor wrote past a wrapped malloc. */
static void test_wrapped_tensor_size_is_refused(void **state)
{
    (void)state;
    const char *model = tiny_model();
    patch_ne0(model, "output_norm.weight", (1ull << 62) + 8);
    struct result r;
    run_dray(&r, 60, (const char *[]){"info", model, NULL});
    expect_error(&r, "output_norm.weight", "4611686018427387912");
    assert_non_null(strstr(r.out, "2^64 bytes"));
    run_dray(&r, 60, (const char *[]){"info", model, "--dump-tensor", "output_norm.weight", NULL});
    expect_error(&r, "output_norm.weight", "4611686018427387912");
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-p", "hello", "-n", "2", NULL});
    expect_error(&r, "output_norm.weight", "4611686018427387912");
}

/* ------------------------------------------------------------ prompt bytes */

/* A prompt that cannot fit in the context even at the longest token is refused before
 * tokenizing (which costs memory in proportion to its bytes). The tiny model has a
 * 256-token context and 15-byte longest token. */
static void test_prompt_longer_than_context_refused_before_tokenizing(void **state)
{
    (void)state;
    const char *model = tiny_model(), *prompt = dray_test_path("newlines.txt");
    size_t n = 1 << 20;
    char *text = malloc(n);
    assert_non_null(text);
    memset(text, '\n', n);
    assert_int_equal(dray_test_write_file(prompt, text, n), 0);
    free(text);
    struct result r;
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-f", prompt, "-n", "1", NULL});
    expect_error(&r, "the prompt is 1048576 bytes", "context of 256 tokens");
}

/* ------------------------------------------------------------ hangs */

/* open() of a FIFO without a writer blocks; the model and the config must be refused
 * as not regular files instead (the deadline turns a hang into a failure). */
static void test_fifo_model_or_config_refused_without_blocking(void **state)
{
    (void)state;
    const char *fifo = dray_test_path("fifo");
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    struct result r;
    run_dray(&r, 20, (const char *[]){"run", "-m", fifo, "-p", "hi", NULL});
    expect_error(&r, fifo, "not a regular file");
    run_dray(&r, 20, (const char *[]){"info", fifo, NULL});
    expect_error(&r, fifo, "not a regular file");
    run_dray(&r, 20, (const char *[]){"run", "--config", fifo, "-p", "hi", NULL});
    expect_error(&r, fifo, "not a regular file");
}

/* libyaml's loader takes time quadratic in the nesting depth: 100k levels of flow
 * sequences ran for minutes. The depth is refused first. */
static void test_deeply_nested_config_refused_quickly(void **state)
{
    (void)state;
    const char *path = dray_test_path("deep.yaml");
    size_t depth = 100000, n = 9 + 2 * depth + 1;
    char *y = malloc(n + 1);
    assert_non_null(y);
    memcpy(y, "threads: ", 9);
    memset(y + 9, '[', depth);
    memset(y + 9 + depth, ']', depth);
    y[n - 1] = '\n';
    assert_int_equal(dray_test_write_file(path, y, n), 0);
    free(y);
    struct result r;
    run_dray(&r, 20, (const char *[]){"config", "--config", path, NULL});
    expect_error(&r, path, "nesting deeper than 32 levels");
}

/* ------------------------------------------------------------ hparams */

/* Runs `dray run` on the tiny model with key's value replaced; expects an error naming
 * the file, the key and the bad value. */
static void expect_bad_hparam(const char *key, const void *val, size_t n, const char *shown)
{
    const char *model = tiny_model();
    patch_kv(model, key, val, n);
    struct result r;
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-p", "hello", "-n", "2", NULL});
    expect_error(&r, model, key);
    assert_non_null(strstr(r.out, shown));
}

static void test_model_hparams_validated_at_load(void **state)
{
    (void)state;
    uint32_t u;
    float f;
    u = 4000000000u; /* above the 16,777,216 cap: used to allocate 7.9 GB of KV */
    expect_bad_hparam("gemma3.context_length", &u, 4, "= 4000000000, expected an integer 1..16777216");
    u = 0; /* used to fail later with a KV error naming neither file nor key */
    expect_bad_hparam("gemma3.context_length", &u, 4, "= 0, expected");
    f = NAN; /* used to load and emit token 0 forever */
    expect_bad_hparam("gemma3.attention.layer_norm_rms_epsilon", &f, 4, "= nan, expected a finite");
    f = -1e-6f;
    expect_bad_hparam("gemma3.attention.layer_norm_rms_epsilon", &f, 4, "= -1e-06, expected");
    f = INFINITY;
    expect_bad_hparam("gemma3.rope.freq_base", &f, 4, "= inf, expected");
    u = 3; /* kv heads must divide the 4 query heads */
    expect_bad_hparam("gemma3.attention.head_count_kv", &u, 4, "= 3 does not divide");
    u = 100000;
    expect_bad_hparam("gemma3.embedding_length", &u, 4, "= 100000, expected an integer 1..65536");
}

/* Numbers on the command line are parsed whole and range-checked, and the error
 * names the flag: atoi made `--prefill -1` 4294967295 (16 GiB) and `--decode abc` 0. */
static void test_cli_numbers_are_strict(void **state)
{
    (void)state;
    const char *model = tiny_model();
    static const char *const cases[][3] = {
        {"--prefill", "-1", "got '-1'"}, {"--decode", "abc", "got 'abc'"},
        {"--batch", "0", "got '0'"},     {"--mem-bw", "nan", "got 'nan'"},
        {"--prefill", "12x", "got '12x'"}, {"-n", "abc", "got 'abc'"},
        {"-t", "-2", "got '-2'"},
    };
    struct result r;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run_dray(&r, 60, (const char *[]){"bench", "model", "-m", model, cases[i][0], cases[i][1],
                                          NULL});
        expect_error(&r, cases[i][0], cases[i][2]);
    }
    run_dray(&r, 60, (const char *[]){"bench", "ops", "--threads", "-1", NULL});
    expect_error(&r, "--threads", "got '-1'");
    run_dray(&r, 60, (const char *[]){"info", model, "--dump-tensor", "output_norm.weight",
                                      "--rows", "-1:2", NULL});
    expect_error(&r, "--rows", "-1:2");
}

/* ------------------------------------------------------------ silently wrong */

/* `run -f` on a folder ran an empty prompt with exit 0; a NUL byte cut the prompt. */
static void test_prompt_file_folder_or_nul_refused(void **state)
{
    (void)state;
    const char *model = tiny_model(), *nul = dray_test_path("nul.txt");
    assert_int_equal(dray_test_write_file(nul, "hello\0world", 11), 0);
    struct result r;
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-f", dray_test_tmpdir(), NULL});
    expect_error(&r, dray_test_tmpdir(), "folder");
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-f", nul, NULL});
    expect_error(&r, nul, "byte 5 is NUL");
}

/* log_level from the config or --set was applied by `dray devices` only. The tiny
 * model's 256-token training context makes -c 512 warn; log_level error hides it. */
static void test_log_level_applies_to_run(void **state)
{
    (void)state;
    const char *model = tiny_model(), *cfg = dray_test_path("quiet.yaml");
    const char *warn = "longer than the model was trained for";
    assert_int_equal(dray_test_write_file(cfg, "log_level: error\n", 17), 0);
    struct result r;
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-p", "hi", "-n", "1", "-c", "512", NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, warn));
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-p", "hi", "-n", "1", "-c", "512",
                                      "--set", "log_level=error", NULL});
    assert_int_equal(r.status, 0);
    assert_null(strstr(r.out, warn));
    run_dray(&r, 60, (const char *[]){"run", "--config", cfg, "-m", model, "-p", "hi", "-n", "1",
                                      "-c", "512", NULL});
    assert_int_equal(r.status, 0);
    assert_null(strstr(r.out, warn));
}

/* threads: 1024 on 2 cores made decode 50x slower without a word. */
static void test_threads_above_cores_warns(void **state)
{
    (void)state;
    const char *model = tiny_model();
    struct result r;
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-p", "hi", "-n", "1", "-t", "1024", NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "threads 1024 is more than the"));
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-p", "hi", "-n", "1", "-t", "1", NULL});
    assert_int_equal(r.status, 0);
    assert_null(strstr(r.out, "threads 1 is more than"));
}

/* ------------------------------------------------------------ messages */

/* A full device said only "writing logits failed": name the path and errno. */
static void test_dump_logits_to_full_device_names_path_and_errno(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0) {
        print_message("SKIP: no /dev/full here\n");
        skip();
    }
    const char *model = tiny_model();
    struct result r;
    run_dray(&r, 60, (const char *[]){"run", "-m", model, "-p", "hello world", "--dump-logits",
                                      "/dev/full", NULL});
    expect_error(&r, "--dump-logits /dev/full", strerror(ENOSPC));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrapped_tensor_size_is_refused),
        cmocka_unit_test(test_prompt_longer_than_context_refused_before_tokenizing),
        cmocka_unit_test(test_fifo_model_or_config_refused_without_blocking),
        cmocka_unit_test(test_deeply_nested_config_refused_quickly),
        cmocka_unit_test(test_model_hparams_validated_at_load),
        cmocka_unit_test(test_cli_numbers_are_strict),
        cmocka_unit_test(test_prompt_file_folder_or_nul_refused),
        cmocka_unit_test(test_log_level_applies_to_run),
        cmocka_unit_test(test_threads_above_cores_warns),
        cmocka_unit_test(test_dump_logits_to_full_device_names_path_and_errno),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
