/* Config: documented defaults, flat and sectioned YAML, value forms (sizes,
 * booleans, enums), and one test per error path, each with FILE:LINE and the
 * expected form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "testutil.h"

static void assert_contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle))
        fail_msg("expected \"%s\" in \"%s\"", needle, hay ? hay : "(null)");
}

static const char *write_cfg(const char *name, const char *text)
{
    const char *p = dray_test_path(name);
    assert_int_equal(dray_test_write_file(p, text, strlen(text)), 0);
    return p;
}

/* Load text over the defaults; returns rc, the message in err. */
static int load_text(const char *text, struct dray_config *cfg, char *err, size_t errlen)
{
    dray_config_defaults(cfg);
    err[0] = '\0';
    return dray_config_load(write_cfg("c.yaml", text), cfg, err, errlen);
}

/* Loading must fail with a message "<path>:<line>: ..." containing needle,
 * and leave the config exactly as it was. */
static void assert_load_error(const char *text, int line, const char *needle)
{
    struct dray_config cfg, before;
    char err[512], prefix[600];
    dray_config_defaults(&before);
    int rc = load_text(text, &cfg, err, sizeof(err));
    if (rc == 0)
        fail_msg("loading succeeded, expected an error with \"%s\"", needle);
    snprintf(prefix, sizeof(prefix), "%s:%d: ", dray_test_path("c.yaml"), line);
    if (strncmp(err, prefix, strlen(prefix)))
        fail_msg("expected prefix \"%s\" in \"%s\"", prefix, err);
    assert_contains(err, needle);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
}

/* libyaml's loader is quadratic in nesting depth (100k levels ran for minutes), so
 * depth is refused first: 32 levels still reach the key check, 33 do not. */
static void test_config_refuses_nesting_deeper_than_32(void **state)
{
    (void)state;
    char text[200];
    for (int depth = 31; depth <= 33; depth++) {
        int n = snprintf(text, sizeof(text), "threads: ");
        for (int i = 0; i < depth; i++)
            text[n++] = '[';
        for (int i = 0; i < depth; i++)
            text[n++] = ']';
        text[n++] = '\n';
        text[n] = 0;
        /* the root mapping is level 1 */
        assert_load_error(text, 1, depth + 1 <= 32 ? "key 'threads': expected a single value"
                                                   : "nesting deeper than 32 levels");
    }
}

static void test_config_defaults_are_the_documented_ones(void **state)
{
    (void)state;
    struct dray_config c;
    dray_config_defaults(&c);
    assert_string_equal(c.source, "");
    assert_string_equal(c.model, "");
    assert_int_equal(c.context, 0);
    assert_string_equal(c.backend, "cpu");
    assert_string_equal(c.fallback, "");
    assert_string_equal(c.device, "");
    assert_string_equal(c.plugin_path, "");
    assert_int_equal(c.threads, 0);
    assert_false(c.reference_kernels);
    assert_int_equal(c.precision, DRAY_PRECISION_W4A8);
    assert_int_equal(c.head_precision, DRAY_HEAD_AUTO);
    assert_int_equal(c.head_rescore, 4096);
    assert_float_equal(c.head_rescore_tail, 0.005, 1e-9);
    assert_int_equal(c.kv_dtype, DRAY_I8);
    assert_int_equal(c.outlier_channels, 32);
    assert_int_equal(c.activations, DRAY_ACTIVATIONS_AUTO);
    assert_int_equal(c.kv_budget, 0);
    assert_int_equal(c.host_cache, 1ull << 30);
    assert_int_equal(c.kv_block, 16);
    assert_true(c.prefix_cache);
    assert_int_equal(c.max_seqs, 8);
    assert_int_equal(c.chunk, 512);
    assert_true(c.temperature == 0.7f);
    assert_int_equal(c.top_k, 40);
    assert_true(c.top_p == 0.95f);
    assert_true(c.min_p == 0.05f);
    assert_true(c.repeat_penalty == 1.0f);
    assert_int_equal(c.seed, 0);
    assert_int_equal(c.max_tokens, 256);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.replicas, 1);
    assert_string_equal(c.api_key, "");
    assert_int_equal(c.max_body, 1u << 20);
    assert_int_equal(c.max_queue, 64);
    assert_int_equal(c.max_messages, 256);
    assert_int_equal(c.max_prompt_tokens, 0);
    assert_int_equal(c.max_completion_tokens, 4096);
    assert_int_equal(c.shutdown_grace, 10);
    assert_int_equal(c.max_connections, 512);
    assert_int_equal(c.max_connections_per_ip, 32);
    assert_int_equal(c.header_timeout, 15);
    assert_int_equal(c.log_level, DRAY_LOG_WARN);
}

static void test_config_loads_flat_keys(void **state)
{
    (void)state;
    struct dray_config c;
    char err[512];
    int rc = load_text("# comment\nbackend: opencl\nfallback: cpu\nthreads: 4\nkv_dtype: f16\n"
                       "temperature: 0\nport: 9000\nlog_level: debug\nmodel: /m/g.gguf\n"
                       "precision: f32\nprefix_cache: false\nseed: 18446744073709551615\n",
                       &c, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_string_equal(c.backend, "opencl");
    assert_string_equal(c.fallback, "cpu");
    assert_int_equal(c.threads, 4);
    assert_int_equal(c.kv_dtype, DRAY_F16);
    assert_true(c.temperature == 0.0f);
    assert_int_equal(c.port, 9000);
    assert_int_equal(c.log_level, DRAY_LOG_DEBUG);
    assert_string_equal(c.model, "/m/g.gguf");
    assert_int_equal(c.precision, DRAY_PRECISION_F32);
    assert_false(c.prefix_cache);
    assert_true(c.seed == UINT64_MAX);
    assert_string_equal(c.source, dray_test_path("c.yaml"));
    assert_int_equal(c.max_seqs, 8); /* untouched keys keep their defaults */
}

static void test_config_loads_sections(void **state)
{
    (void)state;
    struct dray_config c;
    char err[512];
    int rc = load_text("model:\n  path: g.gguf\n  context: 4096\n  chat_template: chatml\n"
                       "backend:\n  plugin: vulkan\n  device: \"1\"\n  reference_kernels: true\n"
                       "precision:\n  weights: int8\n  head_precision: w4a8\n  head_rescore: 64\n  outlier_channels: 8\n"
                       "memory:\n  kv_budget: 512MiB\n  host_cache: 2GiB\n  kv_block: 32\n"
                       "scheduler:\n  max_seqs: 16\n  chunk: 256\n"
                       "sampling:\n  top_k: 0\n  top_p: 1\n  min_p: 0\n  max_tokens: 64\n"
                       "server:\n  host: 0.0.0.0\n  replicas: 2\n",
                       &c, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_string_equal(c.model, "g.gguf");
    assert_int_equal(c.context, 4096);
    assert_string_equal(c.chat_template, "chatml");
    assert_string_equal(c.backend, "vulkan");
    assert_string_equal(c.device, "1");
    assert_true(c.reference_kernels);
    assert_int_equal(c.head_precision, DRAY_HEAD_W4A8);
    assert_int_equal(c.head_rescore, 64);
    assert_int_equal(c.outlier_channels, 8);
    assert_int_equal(c.kv_budget, 512ull << 20);
    assert_int_equal(c.host_cache, 2ull << 30);
    assert_int_equal(c.kv_block, 32);
    assert_int_equal(c.max_seqs, 16);
    assert_int_equal(c.chunk, 256);
    assert_int_equal(c.top_k, 0);
    assert_true(c.top_p == 1.0f);
    assert_int_equal(c.max_tokens, 64);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.replicas, 2);
}

static void test_config_loads_server_limits(void **state)
{
    (void)state;
    struct dray_config c;
    char err[512];
    int rc = load_text("server:\n  api_key: s3cret\n  max_body: 64KiB\n  max_queue: 3\n"
                       "  max_messages: 10\n  max_prompt_tokens: 500\n  max_completion_tokens: 20\n"
                       "  shutdown_grace: 0\n  served_model_name: \"gpt-4o-mini, org/gemma\"\n",
                       &c, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_string_equal(c.api_key, "s3cret");
    assert_string_equal(c.served_model_name, "gpt-4o-mini, org/gemma"); /* split by dray serve */
    assert_int_equal(c.max_body, 65536);
    assert_int_equal(c.max_queue, 3);
    assert_int_equal(c.max_messages, 10);
    assert_int_equal(c.max_prompt_tokens, 500);
    assert_int_equal(c.max_completion_tokens, 20);
    assert_int_equal(c.shutdown_grace, 0);
    assert_load_error("server:\n  max_body: 100\n", 2,
                      "key 'server.max_body': expected a size of at least 1024 bytes");
    assert_load_error("max_queue: 0\n", 1, "key 'max_queue': expected an integer 1..65536, got '0'");
    assert_load_error("max_completion_tokens: 0\n", 1, "expected an integer 1..16777216, got '0'");
}

static void test_config_print_hides_api_key(void **state)
{
    (void)state;
    struct dray_config c;
    char err[512];
    dray_config_defaults(&c);
    assert_int_equal(dray_config_set(&c, "api_key", "do-not-print-me", err, sizeof(err)), 0);
    const char *path = dray_test_path("secret.yaml");
    FILE *f = fopen(path, "w+");
    assert_non_null(f);
    dray_config_print(&c, f);
    rewind(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    assert_null(strstr(text, "do-not-print-me"));
    assert_contains(text, "\n  api_key: \"\"  # set, not shown");
}

static void test_config_sizes_accept_units(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        {"1000000", 1000000},       {"512MiB", 512ull << 20}, {"2GiB", 2ull << 30},
        {"2 GiB", 2ull << 30},      {"1.5GB", 1500000000},    {"64KiB", 65536},
        {"3kB", 3000},              {"1TiB", 1ull << 40},     {"0.5KiB", 512},
        {"100B", 100},              {"4mib", 4ull << 20},     {"0", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct dray_config c;
        char err[512];
        dray_config_defaults(&c);
        if (dray_config_set(&c, "kv_budget", cases[i].text, err, sizeof(err)))
            fail_msg("%s: %s", cases[i].text, err);
        if (c.kv_budget != cases[i].bytes)
            fail_msg("%s gave %llu", cases[i].text, (unsigned long long)c.kv_budget);
    }
    const char *bad[] = {"12XB", "-1", "0.3B", "GiB", "1e30GiB", "", "two"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct dray_config c;
        char err[512] = "";
        dray_config_defaults(&c);
        if (dray_config_set(&c, "host_cache", bad[i], err, sizeof(err)) == 0)
            fail_msg("size '%s' was accepted", bad[i]);
        assert_contains(err, "expected a size such as 512MiB");
    }
}

static void test_config_set_accepts_flat_and_dotted_names(void **state)
{
    (void)state;
    struct dray_config c;
    char err[512];
    dray_config_defaults(&c);
    assert_int_equal(dray_config_set(&c, "threads", "3", err, sizeof(err)), 0);
    assert_int_equal(c.threads, 3);
    assert_int_equal(dray_config_set(&c, "backend.plugin", "cuda", err, sizeof(err)), 0);
    assert_string_equal(c.backend, "cuda");
    assert_int_equal(dray_config_set(&c, "memory.kv_budget", "1GiB", err, sizeof(err)), 0);
    assert_int_equal(c.kv_budget, 1ull << 30);
    assert_int_equal(dray_config_set(&c, "thread", "3", err, sizeof(err)), DRAY_ENOTFOUND);
    assert_contains(err, "unknown key 'thread' (did you mean 'threads'?)");
    assert_int_equal(dray_config_set(&c, "prefix_cache", "yes", err, sizeof(err)), DRAY_EINVAL);
    assert_string_equal(err, "key 'prefix_cache': expected true or false, got 'yes'");
}

static void test_config_rejects_unknown_key_with_suggestion(void **state)
{
    (void)state;
    assert_load_error("backend: cpu\nthread: 4\n", 2, "unknown key 'thread' (did you mean 'threads'?)");
    assert_load_error("colour: red\n", 1, "unknown key 'colour'; the keys are listed in docs/config.md");
}

static void test_config_rejects_unknown_key_in_section(void **state)
{
    (void)state;
    assert_load_error("memory:\n  kv_budgt: 1GiB\n", 2,
                      "unknown key 'kv_budgt' in section 'memory:' (did you mean 'kv_budget'?); "
                      "it holds: kv_budget, host_cache, kv_block, prefix_cache");
}

static void test_config_rejects_key_in_wrong_section(void **state)
{
    (void)state;
    assert_load_error("memory:\n  kv_block: 16\n  port: 80\n", 3,
                      "key 'port' belongs in section 'server:', not 'memory:'");
    assert_load_error("server:\n  log_level: info\n", 2,
                      "key 'log_level' belongs at the top level, not in 'server:'");
}

static void test_config_rejects_bad_values_with_expected_form(void **state)
{
    (void)state;
    assert_load_error("threads: lots\n", 1, "key 'threads': expected an integer 0..1024, got 'lots'");
    assert_load_error("\nserver:\n  port: 70000\n", 3,
                      "key 'server.port': expected an integer 1..65535, got '70000'");
    assert_load_error("threads: -2\n", 1, "expected an integer 0..1024, got '-2'");
    assert_load_error("prefix_cache: yes\n", 1, "expected true or false, got 'yes'");
    assert_load_error("precision: fp16\n", 1, "key 'precision': expected one of int8|f32|int8g|w4a8, got 'fp16'");
    assert_load_error("head_precision: q4\n", 1,
                      "key 'head_precision': expected one of auto|int8g|w4a8, got 'q4'");
    assert_load_error("kv_dtype: f32\n", 1, "expected one of int8|f16, got 'f32'");
    assert_load_error("precision:\n  activations: int16\n", 2,
                      "key 'precision.activations': expected one of auto|int8|int8x2, got 'int16'");
    assert_load_error("log_level: verbose\n", 1, "expected one of error|warn|info|debug, got 'verbose'");
    assert_load_error("top_p: 1.5\n", 1, "key 'top_p': expected a number 0..1, got '1.5'");
    assert_load_error("temperature: hot\n", 1, "expected a number 0..100, got 'hot'");
    assert_load_error("memory:\n  host_cache: 2GB!\n", 2, "expected a size such as 512MiB");
    assert_load_error("kv_block: 0\n", 1, "expected an integer 1..1024, got '0'");
    assert_load_error("threads:\n", 1, "key 'threads': expected an integer 0..1024, got nothing");
    assert_load_error("backend: \"\"\n", 1, "expected a non-empty string of at most 255 bytes, got nothing");
}

static void test_config_rejects_too_long_string(void **state)
{
    (void)state;
    char text[256];
    snprintf(text, sizeof(text), "fallback: %070d\n", 7);
    assert_load_error(text, 1, "key 'fallback': expected a string of at most 63 bytes");
}

static void test_config_rejects_mapping_or_list_where_value_expected(void **state)
{
    (void)state;
    assert_load_error("threads:\n  a: 1\n", 2,
                      "key 'threads': expected a single value (an integer 0..1024), got a mapping");
    assert_load_error("port: [1, 2]\n", 1, "key 'port': expected a single value (an integer 1..65535), got a list");
    assert_load_error("sampling:\n  top_k:\n    - 1\n", 3, "key 'sampling.top_k': expected a single value");
    assert_load_error("memory: 5\n", 1,
                      "section 'memory:' must be a mapping of its keys (kv_budget, host_cache, "
                      "kv_block, prefix_cache, prepared_layouts), got a scalar");
    assert_load_error("- backend\n- cpu\n", 1, "expected a mapping of `key: value` lines at the top, got a list");
    assert_load_error("? [a, b]\n: 1\n", 1, "expected a key name, got a list");
}

static void test_config_rejects_yaml_syntax_error(void **state)
{
    (void)state;
    assert_load_error("backend: cpu\nthreads: [4\nport: 80\n", 3,
                      "YAML syntax error: did not find expected ',' or ']' (while parsing a flow sequence on line 2)");
    assert_load_error("backend: cpu\n  threads: 4\n", 2, "YAML syntax error: mapping values are not allowed");
    assert_load_error("model: \"unterminated\n", 2, "YAML syntax error: found unexpected end of stream");
}

static void test_config_rejects_duplicate_keys(void **state)
{
    (void)state;
    assert_load_error("threads: 1\nport: 80\nthreads: 2\n", 3, "key 'threads' given twice (first on line 1)");
    assert_load_error("threads: 1\nbackend:\n  threads: 2\n", 3,
                      "key 'backend.threads' given twice (first on line 1)");
    assert_load_error("backend: cpu\nbackend:\n  plugin: cuda\n", 3,
                      "key 'backend.plugin' given twice (first on line 1)");
    assert_load_error("memory:\n  kv_block: 8\nmemory:\n  host_cache: 0\n", 3,
                      "section 'memory:' given twice (first on line 1)");
}

static void test_config_rejects_second_document(void **state)
{
    (void)state;
    assert_load_error("threads: 1\n---\nthreads: 2\n", 3, "a second YAML document");
}

static void test_config_missing_or_unreadable_file_is_an_error(void **state)
{
    (void)state;
    struct dray_config c, before;
    char err[512];
    dray_config_defaults(&c);
    before = c;
    const char *missing = dray_test_path("nope.yaml");
    assert_int_equal(dray_config_load(missing, &c, err, sizeof(err)), DRAY_EIO);
    assert_contains(err, missing);
    assert_contains(err, "cannot read config: No such file or directory");
    assert_int_equal(dray_config_load(dray_test_tmpdir(), &c, err, sizeof(err)), DRAY_EIO);
    assert_contains(err, "not a regular file");
    assert_memory_equal(&c, &before, sizeof(c));
}

static void test_config_empty_file_keeps_defaults(void **state)
{
    (void)state;
    struct dray_config c, d;
    char err[512];
    assert_int_equal(load_text("# nothing set\n", &c, err, sizeof(err)), 0);
    dray_config_defaults(&d);
    snprintf(d.source, sizeof(d.source), "%s", dray_test_path("c.yaml"));
    assert_memory_equal(&c, &d, sizeof(c));
    assert_int_equal(load_text("", &c, err, sizeof(err)), 0);
    assert_memory_equal(&c, &d, sizeof(c));
    assert_int_equal(load_text("memory:\n", &c, err, sizeof(err)), 0); /* empty section */
    assert_memory_equal(&c, &d, sizeof(c));
}

static void test_config_print_reads_back_identically(void **state)
{
    (void)state;
    struct dray_config c, back;
    char err[512];
    dray_config_defaults(&c);
    const char *sets[][2] = {
        {"model", "/a \"quoted\" \\ path.gguf"}, {"backend", "opencl"}, {"fallback", "cpu"},
        {"device", "3"}, {"threads", "7"}, {"reference_kernels", "true"}, {"precision", "f32"},
        {"head_precision", "int8g"}, {"head_rescore", "5"}, {"head_rescore_tail", "0.01"}, {"kv_dtype", "f16"}, {"kv_budget", "123457"}, {"host_cache", "3MiB"}, {"temperature", "0.3"},
        {"top_p", "0.9"}, {"min_p", "0.123456"}, {"seed", "42"}, {"log_level", "info"},
        {"prefix_cache", "false"}, {"host", "::1"}, {"port", "1"}, {"context", "8192"}, {"chat_template", "gemma"},
        {"max_body", "2MiB"}, {"max_queue", "5"}, {"max_messages", "9"}, {"max_prompt_tokens", "77"},
        {"max_completion_tokens", "33"}, {"shutdown_grace", "4"}, {"activations", "int8"},
        {"max_connections", "900"}, {"max_connections_per_ip", "0"}, {"header_timeout", "3"},
    };
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++)
        if (dray_config_set(&c, sets[i][0], sets[i][1], err, sizeof(err)))
            fail_msg("%s", err);
    const char *path = dray_test_path("printed.yaml");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    dray_config_print(&c, f);
    fclose(f);
    dray_config_defaults(&back);
    if (dray_config_load(path, &back, err, sizeof(err)))
        fail_msg("printed config does not load: %s", err);
    snprintf(c.source, sizeof(c.source), "%s", path);
    assert_memory_equal(&c, &back, sizeof(c));
}

static void test_config_print_shows_units_and_short_floats(void **state)
{
    (void)state;
    struct dray_config c;
    dray_config_defaults(&c);
    const char *path = dray_test_path("defaults.yaml");
    FILE *f = fopen(path, "w+");
    assert_non_null(f);
    dray_config_print(&c, f);
    rewind(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    assert_contains(text, "\n  host_cache: 1GiB\n");
    assert_contains(text, "\n  temperature: 0.7\n");
    assert_contains(text, "\n  plugin: \"cpu\"\n");
    assert_contains(text, "\nlog_level: warn\n");
    assert_contains(text, "\nserver:\n  host: \"127.0.0.1\"\n  port: 8080\n");
}

/* List keys: entries counted by commas, each trimmed; past the end is "". */
static void test_config_list_entries_are_trimmed_and_counted(void **state)
{
    (void)state;
    char e[16];
    assert_int_equal(dray_config_list_len(""), 0);
    assert_int_equal(dray_config_list_len("cpu"), 1);
    assert_int_equal(dray_config_list_len("cpu, opencl,\tvulkan"), 3);
    dray_config_list_entry("cpu, opencl,\tvulkan ", 1, e, sizeof(e));
    assert_string_equal(e, "opencl");
    dray_config_list_entry("cpu, opencl,\tvulkan ", 2, e, sizeof(e));
    assert_string_equal(e, "vulkan");
    dray_config_list_entry("cpu,,x", 1, e, sizeof(e));
    assert_string_equal(e, "");
    dray_config_list_entry("cpu", 3, e, sizeof(e));
    assert_string_equal(e, "");
    dray_config_list_entry("a-very-long-entry-name,b", 0, e, 8);
    assert_string_equal(e, "a-very-");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_defaults_are_the_documented_ones),
        cmocka_unit_test(test_config_loads_flat_keys),
        cmocka_unit_test(test_config_loads_sections),
        cmocka_unit_test(test_config_loads_server_limits),
        cmocka_unit_test(test_config_print_hides_api_key),
        cmocka_unit_test(test_config_sizes_accept_units),
        cmocka_unit_test(test_config_set_accepts_flat_and_dotted_names),
        cmocka_unit_test(test_config_rejects_unknown_key_with_suggestion),
        cmocka_unit_test(test_config_rejects_unknown_key_in_section),
        cmocka_unit_test(test_config_rejects_key_in_wrong_section),
        cmocka_unit_test(test_config_rejects_bad_values_with_expected_form),
        cmocka_unit_test(test_config_rejects_too_long_string),
        cmocka_unit_test(test_config_rejects_mapping_or_list_where_value_expected),
        cmocka_unit_test(test_config_rejects_yaml_syntax_error),
        cmocka_unit_test(test_config_rejects_duplicate_keys),
        cmocka_unit_test(test_config_rejects_second_document),
        cmocka_unit_test(test_config_missing_or_unreadable_file_is_an_error),
        cmocka_unit_test(test_config_empty_file_keeps_defaults),
        cmocka_unit_test(test_config_print_reads_back_identically),
        cmocka_unit_test(test_config_print_shows_units_and_short_floats),
        cmocka_unit_test(test_config_refuses_nesting_deeper_than_32),
        cmocka_unit_test(test_config_list_entries_are_trimmed_and_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
