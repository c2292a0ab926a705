/* Configuration: defaults, a YAML file over them, single-key overrides (printing
 * is config_print.c).
 *
 * Schema (the table `keys` below is the one source of the key table in
 * docs/config.md, written by `dray config --markdown`): a YAML mapping whose keys are
 * the flat key names below ("threads: 4"), or section mappings that group them
 * ("backend: {threads: 4}"). Three sections share their name with a key; inside
 * the section that key is spelled differently:
 *     model:     path      (= model)
 *     backend:   plugin    (= backend)
 *     precision: weights   (= precision)
 * A section name followed by a scalar is that key ("backend: cpu"), followed by a
 * mapping it is the section. log_level has no section. Every error names the file,
 * the line, the key and the expected form; the config is left untouched on error. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

#include "dray/dray.h"
#include "config_keys.h"
#include "error.h"

#define CONFIG_MAX_BYTES (1u << 20) /* a config file is a page of text, not a data set */
/* Sections are one level below the root; values are scalars. 32 leaves room for any
 * honest file while stopping libyaml's document loader, whose time grows with the
 * square of the depth (docs/performance.md). */
#define CONFIG_MAX_DEPTH 32u

static const struct enum_name precision_names[] = {
    {"int8", DRAY_PRECISION_INT8}, {"f32", DRAY_PRECISION_F32}, {"int8g", DRAY_PRECISION_INT8G},
    {"w4a8", DRAY_PRECISION_W4A8}, {NULL, 0}};
static const struct enum_name head_precision_names[] = {
    {"auto", DRAY_HEAD_AUTO}, {"int8g", DRAY_HEAD_INT8G}, {"w4a8", DRAY_HEAD_W4A8}, {NULL, 0}};
static const struct enum_name activations_names[] = {
    {"auto", DRAY_ACTIVATIONS_AUTO}, {"int8", DRAY_ACTIVATIONS_INT8}, {"int8x2", DRAY_ACTIVATIONS_INT8X2},
    {NULL, 0}};
static const struct enum_name kv_dtype_names[] = {{"int8", DRAY_I8}, {"f16", DRAY_F16}, {NULL, 0}};
static const struct enum_name log_level_names[] = {{"error", DRAY_LOG_ERROR},
                                                   {"warn", DRAY_LOG_WARN},
                                                   {"info", DRAY_LOG_INFO},
                                                   {"debug", DRAY_LOG_DEBUG},
                                                   {NULL, 0}};


#define F(field) offsetof(struct dray_config, field), sizeof(((struct dray_config *)0)->field)
const struct key dray_config_keys[] = {
    {"log_level", NULL, NULL, T_ENUM, F(log_level), 0, 0, log_level_names, 0,
     "least severe message printed to stderr", KEY_USER},
    {"model", "model", "path", T_STR, F(model), 0, 0, NULL, 0,
     "GGUF model file, relative to the config file's folder; `\"\"` = the model the README's "
     "set-up installs", KEY_USER},
    {"context", "model", "context", T_U32, F(context), 0, 1 << 24, NULL, 0,
     "most tokens per sequence (prompt + output); 0 = the model's training context", KEY_USER},
    {"chat_template", "model", "chat_template", T_STR, F(chat_template), 0, 0, NULL, 0,
     "chat format for `dray chat` and the server, one of the names in [Chat templates](#chat-templates) "
     "(`gemma`, `chatml`, `llama3`, ...); `\"\"` = recognised from the model file", KEY_USER},
    {"backend", "backend", "plugin", T_STR, F(backend), 0, 0, NULL, 1,
     "plugin to run on: a name (`cpu`, `opencl`, `vulkan`, `cuda`, `hip`) or a path to a "
     "`libdray-<name>.so`; a comma-separated list (`cuda,cpu`) splits the layers over them "
     "([Several devices](#several-devices))", KEY_USER},
    {"fallback", "backend", "fallback", T_STR, F(fallback), 0, 0, NULL, 0,
     "plugin used, with a warning, when `backend` cannot be loaded or opened or does not run "
     "the configured `precision` or `kv_dtype`; `\"\"` = fail with the reason", KEY_USER},
    {"device", "backend", "device", T_STR, F(device), 0, 0, NULL, 0,
     "device of the plugin, an index (`\"1\"`) or a case-insensitive part of its name "
     "(`h200`), or a comma-separated list of one per replica (`\"0,1\"`), or of one per "
     "plugin when `backend` lists several; `\"\"` = the first device", KEY_USER},
    {"layer_split", "backend", "layer_split", T_STR, F(layer_split), 0, 0, NULL, 0,
     "with several plugins in `backend`: the share of the layers each runs, comma-separated "
     "(`3,1`); `\"\"` = by `device_memory`, else by the devices' free memory "
     "([Several devices](#several-devices)); with `tensor_parallel`, each rank's share of the FFN "
     "columns, for ranks of unequal speed (`1,3`: the second three times the first's); `\"\"` = even",
     KEY_USER},
    {"device_memory", "backend", "device_memory", T_STR, F(device_memory), 0, 0, NULL, 0,
     "with several plugins in `backend`: bytes of weights and KV each device may hold "
     "(`8G,0`; 0 = no cap), so the uncapped ones (the CPU) take the rest "
     "([Several devices](#several-devices))", KEY_USER},
    {"head_device", "backend", "head_device", T_U32, F(head_device), 0, 8, NULL, 0,
     "with several plugins in `backend`: which one (1-based) holds the embedding and output "
     "head; 0 = the one with the last layers, or the roomiest under `device_memory`", KEY_EXPERT},
    {"micro_batches", "backend", "micro_batches", T_U32, F(micro_batches), 0, 16, NULL, 0,
     "with several plugins in `backend`: micro-batches a step of several sequences is cut into, "
     "so the devices work at once; 0 = one per device, 1 = no pipelining", KEY_EXPERT},
    {"distributed", "backend", "distributed", T_STR, F(distributed), 0, 0, NULL, 0,
     "`mpi`: run under `mpirun`, each rank holding a range of `layer_split`'s layers on its own "
     "`backend`, rank 0 the server, the embedding and the head ([Across hosts](#across-hosts)); "
     "`\"\"` = one process", KEY_USER},
    {"distributed_timeout", "backend", "distributed_timeout", T_U32, F(distributed_timeout), 0, 86400, NULL, 0,
     "with `distributed`: seconds of silence after which a rank is lost (a rank at work says it is "
     "alive every second, so long steps are fine); rank 0 then fails the running requests naming "
     "it, and every later one; 0 = wait for ever", KEY_EXPERT},
    {"tensor_parallel", "backend", "tensor_parallel", T_U32, F(tensor_parallel), 1, 8, NULL, 0,
     "with `distributed`: ranks that each hold a slice of every layer's heads and FFN columns, "
     "summed by an all-reduce after the attention output and the FFN down projection; it must "
     "equal the ranks of `mpirun -np N` ([Across hosts](#across-hosts)); 1 = a pipeline of "
     "layer ranges", KEY_EXPERT},
    {"plugin_path", "backend", "plugin_path", T_STR, F(plugin_path), 0, 0, NULL, 0,
     "extra `:`-separated folders searched for plugins before `$DRAY_PLUGIN_PATH` and the "
     "built-in folders", KEY_USER},
    {"threads", "backend", "threads", T_U32, F(threads), 0, 1024, NULL, 0,
     "host threads for the CPU plugin; 0 = all cores (split between `replicas`)", KEY_USER},
    {"reference_kernels", "backend", "reference_kernels", T_BOOL, F(reference_kernels), 0, 0, NULL, 0,
     "use the plugin's portable scalar kernels (for checking, slow)", KEY_EXPERT},
    {"precision", "precision", "weights", T_ENUM, F(precision), 0, 0, precision_names, 0,
     "weights and matmuls: `int8` (per-channel scales), `int8g` (a scale per group of 32 "
     "inputs), `w4a8` (the file's 4-, 5- and 6-bit weights exact, `int8g` elsewhere) or `f32` (the "
     "checking path) ([Precision](#precision))", KEY_USER},
    {"head_precision", "precision", "head_precision", T_ENUM, F(head_precision), 0, 0, head_precision_names, 0,
     "output head under `int8g` or `w4a8`: `int8g`, `w4a8` (4-bit) or `auto` (the rescored "
     "4-bit head where it costs no accuracy) ([Precision](#precision))", KEY_EXPERT},
    {"head_rescore", "precision", "head_rescore", T_U32, F(head_rescore), 0, 1 << 20, NULL, 0,
     "most tokens per row whose logits the rescored 4-bit head computes again from the 8-bit "
     "embedding table; 0 = the 4-bit logits as they are, lossy ([Precision](#precision))", KEY_EXPERT},
    {"head_rescore_tail", "precision", "head_rescore_tail", T_FLOAT, F(head_rescore_tail), 0, 1, NULL, 0,
     "probability of the 4-bit head a row may leave unrescored ([Precision](#precision))", KEY_EXPERT},
    {"kv_dtype", "precision", "kv_dtype", T_ENUM, F(kv_dtype), 0, 0, kv_dtype_names, 0,
     "KV cache element type (int8 with a scale per token and head)", KEY_USER},
    {"outlier_channels", "precision", "outlier_channels", T_U32, F(outlier_channels), 0, 65536, NULL, 0,
     "input channels per int8 matmul kept in f32, found at load by a short calibration pass "
     "(half as many for the output head); 0 = off", KEY_EXPERT},
    {"activations", "precision", "activations", T_ENUM, F(activations), 0, 0, activations_names, 0,
     "activations of the layer matmuls under `int8g` or `w4a8`: `int8` (one pass), `int8x2` (a "
     "second pass over the first's rounding error) or `auto` (the model family's choice) "
     "([Precision](#precision))", KEY_EXPERT},
    {"kv_budget", "memory", "kv_budget", T_SIZE, F(kv_budget), 0, 0, NULL, 0,
     "device memory for the KV cache; 0 = enough for `max_seqs` sequences of the full "
     "`context`", KEY_USER},
    {"host_cache", "memory", "host_cache", T_SIZE, F(host_cache), 0, 0, NULL, 0,
     "host memory for the prefix cache's host tier (KV blocks spilled from the device)", KEY_USER},
    {"kv_block", "memory", "kv_block", T_U32, F(kv_block), 1, 1024, NULL, 0,
     "tokens per KV block", KEY_EXPERT},
    {"prefix_cache", "memory", "prefix_cache", T_BOOL, F(prefix_cache), 0, 0, NULL, 0,
     "reuse the KV of shared prompt prefixes across requests and chat turns", KEY_USER},
    {"prepared_layouts", "memory", "prepared_layouts", T_BOOL, F(prepared_layouts), 0, 0, NULL, 0,
     "keep the plugin's packed weights in the cache folder and map them at later starts (plugins of "
     "ABI 5 with one device; `DRAY_CACHE_DIR=none` turns every cache off); false = pack at every start",
     KEY_EXPERT},
    {"max_seqs", "scheduler", "max_seqs", T_U32, F(max_seqs), 1, 4096, NULL, 0,
     "sequences decoded together in one batch (`dray run` and `dray perplexity` size the KV "
     "for 1 unless this is set)", KEY_USER},
    {"chunk", "scheduler", "chunk", T_U32, F(chunk), 1, 1 << 20, NULL, 0,
     "prefill tokens per step (long prompts are split so decoding keeps going)", KEY_USER},
    {"temperature", "sampling", "temperature", T_FLOAT, F(temperature), 0, 100, NULL, 0,
     "sampling temperature; 0 = greedy (always the most likely token)", KEY_USER},
    {"top_k", "sampling", "top_k", T_U32, F(top_k), 0, 1 << 20, NULL, 0,
     "keep the k most likely tokens; 0 = off", KEY_USER},
    {"top_p", "sampling", "top_p", T_FLOAT, F(top_p), 0, 1, NULL, 0,
     "keep the smallest set of tokens whose probability sums to p; 1 = off, 0 = the most "
     "likely token only", KEY_USER},
    {"min_p", "sampling", "min_p", T_FLOAT, F(min_p), 0, 1, NULL, 0,
     "drop tokens less likely than min_p × the most likely one; 0 = off", KEY_USER},
    {"repeat_penalty", "sampling", "repeat_penalty", T_FLOAT, F(repeat_penalty), 0.01, 100, NULL, 0,
     "divide the logits of tokens already in the context by this; 1 = off", KEY_USER},
    {"seed", "sampling", "seed", T_U64, F(seed), 0, 0, NULL, 0,
     "random seed; 0 = a new seed from the clock on each run", KEY_USER},
    {"max_tokens", "sampling", "max_tokens", T_U32, F(max_tokens), 1, 1 << 24, NULL, 0,
     "most new tokens per request", KEY_USER},
    {"lookup_draft", "sampling", "lookup_draft", T_U32, F(lookup_draft), 0, 32, NULL, 0,
     "speculative decoding by prompt lookup in `dray run`: up to this many tokens copied from the "
     "context are verified in one step (the output is unchanged); 0 = off", KEY_EXPERT},
    {"grammar_max_elements", "sampling", "grammar_max_elements", T_U32, F(grammar_max_elements), 16, 65536, NULL, 0,
     "most elements of a grammar (a request's `grammar`, or what `response_format` and `tools` "
     "compile to) once repetitions are expanded; more → 400 ([Hostile grammars](server.md#hostile-grammars))",
     KEY_USER},
    {"grammar_max_alternatives", "sampling", "grammar_max_alternatives", T_U32, F(grammar_max_alternatives), 2, 65536, NULL, 0,
     "most alternatives of one grammar rule (a group is a rule); more → 400", KEY_USER},
    {"grammar_max_depth", "sampling", "grammar_max_depth", T_U32, F(grammar_max_depth), 1, 4096, NULL, 0,
     "deepest nesting of parentheses in a grammar; deeper → 400", 
     KEY_USER},
    {"grammar_step_stacks", "sampling", "grammar_step_stacks", T_U32, F(grammar_step_stacks), 1024, 1 << 28, NULL, 0,
     "most parse-stack entries (4 bytes each) a grammar may build in one transition; a request "
     "over it ends with an error (400 when its start state is)", KEY_USER},
    {"grammar_step_ms", "sampling", "grammar_step_ms", T_U32, F(grammar_step_ms), 1, 60000, NULL, 0,
     "most milliseconds of grammar work (tests, mask, advance) for one token; a request over it "
     "ends with an error, the others in the batch go on", KEY_USER},
    {"grammar_cache", "sampling", "grammar_cache", T_SIZE, F(grammar_cache), 65536, 0, NULL, 0,
     "bytes of one sequence's grammar automaton (its cache of states and masks' transitions); "
     "over it, the automaton is rebuilt from the states in use", KEY_EXPERT},
    {"host", "server", "host", T_STR, F(host), 0, 0, NULL, 1,
     "address `dray serve` listens on; `0.0.0.0` or `::` opens it to other machines", KEY_USER},
    {"port", "server", "port", T_U32, F(port), 1, 65535, NULL, 0,
     "TCP port of `dray serve`", KEY_USER},
    {"replicas", "server", "replicas", T_U32, F(replicas), 1, 256, NULL, 0,
     "engines `dray serve` runs in one process, each with its own scheduler and KV cache "
     "([Serving](#serving))", KEY_USER},
    {"api_key", "server", "api_key", T_STR, F(api_key), 0, 0, NULL, 0,
     "when set, every request except `GET /health` needs `Authorization: Bearer <key>` (else "
     "401); `dray config` does not print it", KEY_USER},
    {"served_model_name", "server", "served_model_name", T_STR, F(served_model_name), 0, 0, NULL, 0,
     "comma-separated names of the model for `dray serve`, the first one in every response "
     "([Serving](#serving)); `\"\"` = the file's name", KEY_USER},
    {"max_body", "server", "max_body", T_SIZE, F(max_body), 1024, 0, NULL, 0,
     "largest request body; larger → 413", KEY_USER},
    {"max_queue", "server", "max_queue", T_U32, F(max_queue), 1, 65536, NULL, 0,
     "requests waiting for a sequence slot beyond the `max_seqs` running; one more → 429 with "
     "`Retry-After`", KEY_USER},
    {"max_messages", "server", "max_messages", T_U32, F(max_messages), 1, 1 << 20, NULL, 0,
     "most messages in one chat request; more → 400", KEY_USER},
    {"max_prompt_tokens", "server", "max_prompt_tokens", T_U32, F(max_prompt_tokens), 0, 1 << 24, NULL, 0,
     "most tokens of a rendered prompt; more → 400 (`context_length_exceeded`); 0 = the "
     "context", KEY_USER},
    {"max_completion_tokens", "server", "max_completion_tokens", T_U32, F(max_completion_tokens), 1, 1 << 24, NULL, 0,
     "largest `max_tokens` a request may ask for; more → 400", KEY_USER},
    {"shutdown_grace", "server", "shutdown_grace", T_U32, F(shutdown_grace), 0, 3600, NULL, 0,
     "seconds that in-flight requests may run on after SIGINT/SIGTERM before they are "
     "cancelled", KEY_USER},
    {"max_connections", "server", "max_connections", T_U32, F(max_connections), 8, 65536, NULL, 0,
     "open HTTP connections `dray serve` keeps, one thread each, within the open-file limit "
     "(`ulimit -n`); more are closed as they are accepted", KEY_USER},
    {"max_connections_per_ip", "server", "max_connections_per_ip", T_U32, F(max_connections_per_ip), 0, 65536, NULL, 0,
     "open connections from one client address, so one client cannot take every slot; 0 = no "
     "cap ([Serving](#serving): behind a proxy)", KEY_USER},
    {"header_timeout", "server", "header_timeout", T_U32, F(header_timeout), 1, 3600, NULL, 0,
     "seconds a connection may sit idle while it is not being answered ([Serving](#serving))", KEY_USER},
};
#undef F
#define N_KEYS (sizeof(dray_config_keys) / sizeof(dray_config_keys[0]))
const size_t dray_config_n_keys = N_KEYS;

const char *const dray_config_sections[] = {"model",     "backend",  "precision", "memory",
                                       "scheduler", "sampling", "server"};
#define N_SECTIONS (sizeof(dray_config_sections) / sizeof(dray_config_sections[0]))
const size_t dray_config_n_sections = N_SECTIONS;

_Static_assert(sizeof(enum dray_precision) == sizeof(int32_t), "enums are stored as 32 bits");

void dray_config_defaults(struct dray_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->backend, sizeof(cfg->backend), "cpu");
    /* exact 4-bit where the file is 4-bit, grouped int8 elsewhere: closer to f32
     * than int8 per row with outlier channels (README, accuracy) and no slower;
     * int8 on a device without grouped weights */
    cfg->precision = DRAY_PRECISION_W4A8;
    /* the family decides (its dray_arch.activations): the second pass is what
     * takes SmolLM2 from 96.3% to 98.7% top-1, but Gemma 3 is already close to f32
     * with one and would pay 37% of its prefill speed (README, accuracy) */
    cfg->activations = DRAY_ACTIVATIONS_AUTO;
    cfg->kv_dtype = DRAY_I8;
    cfg->outlier_channels = 32; /* per matmul input (16 for the output head), found at load */
    cfg->head_rescore = 4096;   /* most candidates per row of logits (models/head_rescore.c) */
    cfg->head_rescore_tail = 0.005f; /* ~1000 candidates a row on real text */
    cfg->host_cache = 1ull << 30;
    cfg->kv_block = 16;
    cfg->prefix_cache = true;
    cfg->prepared_layouts = true;
    cfg->max_seqs = 8;
    cfg->distributed_timeout = 30;
    cfg->tensor_parallel = 1;
    cfg->chunk = 512;
    cfg->temperature = 0.7f;
    cfg->top_k = 40;
    cfg->top_p = 0.95f;
    cfg->min_p = 0.05f;
    cfg->repeat_penalty = 1.0f;
    cfg->max_tokens = 256;
    cfg->grammar_max_elements = 65536;
    cfg->grammar_max_alternatives = 1024;
    cfg->grammar_max_depth = 1024;
    cfg->grammar_step_stacks = 1u << 22;
    cfg->grammar_step_ms = 200;
    cfg->grammar_cache = 8u << 20;
    snprintf(cfg->host, sizeof(cfg->host), "127.0.0.1");
    cfg->port = 8080;
    cfg->replicas = 1;
    cfg->max_body = 1u << 20;
    cfg->max_queue = 64;
    cfg->max_messages = 256;
    cfg->max_completion_tokens = 4096;
    cfg->shutdown_grace = 10;
    cfg->max_connections = 512;       /* under Debian's default 1024 open files */
    cfg->max_connections_per_ip = 32;
    cfg->header_timeout = 15;
    cfg->log_level = DRAY_LOG_WARN;
}

/* ------------------------------------------------------------ value parsing */

/* The form a key expects, for error messages: "an integer 0..1024". */
static void expected_form(const struct key *k, char *buf, size_t len)
{
    switch (k->type) {
    case T_STR:
        snprintf(buf, len, "a %sstring of at most %zu bytes", k->nonempty ? "non-empty " : "",
                 k->size - 1);
        break;
    case T_U32: snprintf(buf, len, "an integer %.0f..%.0f", k->lo, k->hi); break;
    case T_U64: snprintf(buf, len, "an integer 0..18446744073709551615"); break;
    case T_SIZE:
        if (k->lo > 0)
            snprintf(buf, len, "a size of at least %.0f bytes such as 512MiB, 1MB or 1000000", k->lo);
        else
            snprintf(buf, len, "a size such as 512MiB, 2GiB, 1.5GB or 1000000 (bytes)");
        break;
    case T_BOOL: snprintf(buf, len, "true or false"); break;
    case T_FLOAT: snprintf(buf, len, "a number %g..%g", k->lo, k->hi); break;
    case T_ENUM: {
        size_t used = (size_t)snprintf(buf, len, "one of ");
        for (const struct enum_name *e = k->names; e->name && used < len; e++)
            used += (size_t)snprintf(buf + used, len - used, "%s%s", e == k->names ? "" : "|", e->name);
        break;
    }
    }
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* "512MiB", "2 GiB", "1.5GB", "1000000": binary units are powers of 1024, the
 * plain SI ones powers of 1000. */
static int parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {
        {"", 1},  {"B", 1},  {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
        {"TiB", 1099511627776.0}, {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
    };
    if (!isdigit((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !isfinite(v) || v < 0)
        return -1;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].unit))
            continue;
        double bytes = v * units[i].mult;
        if (bytes >= 18446744073709551615.0 || bytes != floor(bytes))
            return -1; /* too big, or a fraction of a byte */
        *out = (uint64_t)bytes;
        return 0;
    }
    return -1;
}

/* Write text into field k of cfg. On failure `why` says "expected X, got 'text'". */
static int set_value(struct dray_config *cfg, const struct key *k, const char *text, char *why,
                     size_t whylen)
{
    char *field = (char *)cfg + k->offset;
    uint64_t u = 0;
    switch (k->type) {
    case T_STR:
        if (strlen(text) < k->size && (!k->nonempty || text[0])) {
            memcpy(field, text, strlen(text) + 1);
            return 0;
        }
        break;
    case T_U32:
        if (parse_u64(text, &u) == 0 && (double)u >= k->lo && (double)u <= k->hi) {
            uint32_t v = (uint32_t)u;
            memcpy(field, &v, sizeof(v));
            return 0;
        }
        break;
    case T_U64:
        if (parse_u64(text, &u) == 0) {
            memcpy(field, &u, sizeof(u));
            return 0;
        }
        break;
    case T_SIZE:
        if (parse_size(text, &u) == 0 && (double)u >= k->lo) {
            memcpy(field, &u, sizeof(u));
            return 0;
        }
        break;
    case T_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "false")) {
            bool b = text[0] == 't';
            memcpy(field, &b, sizeof(b));
            return 0;
        }
        break;
    case T_FLOAT: {
        char *end;
        errno = 0;
        double d = strtod(text, &end);
        if (text[0] && !*end && !errno && isfinite(d) && d >= k->lo && d <= k->hi) {
            float f = (float)d;
            memcpy(field, &f, sizeof(f));
            return 0;
        }
        break;
    }
    case T_ENUM:
        for (const struct enum_name *e = k->names; e->name; e++)
            if (!strcmp(text, e->name)) {
                int32_t v = e->value;
                memcpy(field, &v, sizeof(v));
                return 0;
            }
        break;
    }
    char form[160];
    expected_form(k, form, sizeof(form));
    if (!text[0])
        return dray_fail(why, whylen, DRAY_EINVAL, "expected %s, got nothing", form);
    return dray_fail(why, whylen, DRAY_EINVAL, "expected %s, got '%.80s'", form, text);
}

/* ------------------------------------------------------------ key lookup */

static const struct key *key_by_name(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(dray_config_keys[i].name, name))
            return &dray_config_keys[i];
    return NULL;
}

static const struct key *key_in_section(const char *section, const char *inner)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (dray_config_keys[i].section && !strcmp(dray_config_keys[i].section, section) && !strcmp(dray_config_keys[i].inner, inner))
            return &dray_config_keys[i];
    return NULL;
}

static int section_index(const char *name)
{
    for (size_t i = 0; i < N_SECTIONS; i++)
        if (!strcmp(dray_config_sections[i], name))
            return (int)i;
    return -1;
}

/* Edit distance, for "did you mean" on a misspelt key (names are short). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 31 || lb > 31)
        return 99;
    size_t row[32];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* " (did you mean 'threads'?)" or "" */
static void suggest(const char *section, const char *name, char *buf, size_t len)
{
    const char *best = NULL;
    size_t bestd = 3;
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *cand = section ? dray_config_keys[i].inner : dray_config_keys[i].name;
        if (section && (!dray_config_keys[i].section || strcmp(dray_config_keys[i].section, section)))
            continue;
        size_t d = edit_distance(name, cand);
        if (d < bestd) {
            bestd = d;
            best = cand;
        }
    }
    buf[0] = '\0';
    if (best)
        snprintf(buf, len, " (did you mean '%s'?)", best);
}

/* ------------------------------------------------------------ YAML walk */

struct loader {
    const char *path;
    yaml_document_t *doc;
    struct dray_config *cfg;
    unsigned key_line[N_KEYS];         /* line a key was set on; 0 = not yet */
    unsigned section_line[N_SECTIONS]; /* same for sections */
    char *err;
    size_t errlen;
};

static unsigned line_of(const yaml_node_t *n)
{
    return (unsigned)n->start_mark.line + 1;
}

static const char *node_kind(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a scalar";
    }
}

static int apply_key(struct loader *l, const struct key *k, const yaml_node_t *kn,
                     const yaml_node_t *vn, const char *written)
{
    char form[160], why[256];
    size_t idx = (size_t)(k - dray_config_keys);
    if (l->key_line[idx])
        return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                         "%s:%u: key '%s' given twice (first on line %u): keep one", l->path,
                         line_of(kn), written, l->key_line[idx]);
    if (vn->type != YAML_SCALAR_NODE) {
        expected_form(k, form, sizeof(form));
        return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                         "%s:%u: key '%s': expected a single value (%s), got %s", l->path,
                         line_of(vn), written, form, node_kind(vn));
    }
    if (set_value(l->cfg, k, (const char *)vn->data.scalar.value, why, sizeof(why)) != 0)
        return dray_fail(l->err, l->errlen, DRAY_EFORMAT, "%s:%u: key '%s': %s", l->path,
                         line_of(vn), written, why);
    l->key_line[idx] = line_of(kn);
    return 0;
}

/* The keys of one section, "path, context", for messages. */
static void section_keys(const char *section, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_KEYS && used < len; i++)
        if (dray_config_keys[i].section && !strcmp(dray_config_keys[i].section, section))
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "", dray_config_keys[i].inner);
}

static int load_section(struct loader *l, const char *section, const yaml_node_t *kn,
                        const yaml_node_t *map)
{
    int si = section_index(section);
    if (l->section_line[si])
        return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                         "%s:%u: section '%s:' given twice (first on line %u): merge them", l->path,
                         line_of(kn), section, l->section_line[si]);
    l->section_line[si] = line_of(kn);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(l->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(l->doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                             "%s:%u: in section '%s:': expected a key name, got %s", l->path,
                             line_of(k), section, node_kind(k));
        const char *name = (const char *)k->data.scalar.value;
        const struct key *key = key_in_section(section, name);
        if (!key) {
            char hint[96], list[256];
            const struct key *elsewhere = key_by_name(name);
            if (elsewhere && elsewhere->section && strcmp(elsewhere->inner, name) == 0)
                return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                                 "%s:%u: key '%s' belongs in section '%s:', not '%s:'", l->path,
                                 line_of(k), name, elsewhere->section, section);
            if (elsewhere && !elsewhere->section)
                return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                                 "%s:%u: key '%s' belongs at the top level, not in '%s:'", l->path,
                                 line_of(k), name, section);
            suggest(section, name, hint, sizeof(hint));
            section_keys(section, list, sizeof(list));
            return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                             "%s:%u: unknown key '%s' in section '%s:'%s; it holds: %s", l->path,
                             line_of(k), name, section, hint, list);
        }
        char written[160];
        snprintf(written, sizeof(written), "%s.%s", section, name);
        int rc = apply_key(l, key, k, v, written);
        if (rc)
            return rc;
    }
    return 0;
}

static int load_root(struct loader *l, const yaml_node_t *root)
{
    if (root->type != YAML_MAPPING_NODE)
        return dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                         "%s:%u: expected a mapping of `key: value` lines at the top, got %s",
                         l->path, line_of(root), node_kind(root));
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(l->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(l->doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return dray_fail(l->err, l->errlen, DRAY_EFORMAT, "%s:%u: expected a key name, got %s",
                             l->path, line_of(k), node_kind(k));
        const char *name = (const char *)k->data.scalar.value;
        const struct key *key = key_by_name(name);
        int rc;
        if (section_index(name) >= 0 && v->type == YAML_MAPPING_NODE)
            rc = load_section(l, name, k, v);
        else if (key)
            rc = apply_key(l, key, k, v, name);
        else if (section_index(name) >= 0 && v->type == YAML_SCALAR_NODE && !v->data.scalar.length)
            rc = 0; /* "memory:" with nothing under it: an empty section */
        else if (section_index(name) >= 0) {
            char list[256];
            section_keys(name, list, sizeof(list));
            rc = dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                           "%s:%u: section '%s:' must be a mapping of its keys (%s), got %s",
                           l->path, line_of(v), name, list, node_kind(v));
        } else {
            char hint[96];
            suggest(NULL, name, hint, sizeof(hint));
            rc = dray_fail(l->err, l->errlen, DRAY_EFORMAT,
                           "%s:%u: unknown key '%s'%s; the keys are listed in docs/config.md",
                           l->path, line_of(k), name, hint);
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int syntax_error(const char *path, const yaml_parser_t *ps, char *err, size_t errlen)
{
    const yaml_mark_t *m = ps->problem ? &ps->problem_mark : &ps->context_mark;
    if (ps->error == YAML_MEMORY_ERROR)
        return dray_fail(err, errlen, DRAY_ENOMEM, "%s: out of memory while parsing", path);
    if (ps->context)
        return dray_fail(err, errlen, DRAY_EFORMAT,
                         "%s:%zu: YAML syntax error: %s (%s on line %zu); expected `key: value` "
                         "lines, sections indented below `section:`",
                         path, m->line + 1, ps->problem ? ps->problem : "unknown problem",
                         ps->context, ps->context_mark.line + 1);
    return dray_fail(err, errlen, DRAY_EFORMAT,
                     "%s:%zu: YAML syntax error: %s; expected `key: value` lines, sections "
                     "indented below `section:`",
                     path, m->line + 1, ps->problem ? ps->problem : "unknown problem");
}

/* Walk the events once, refusing nesting deeper than CONFIG_MAX_DEPTH before the
 * document loader sees the file. libyaml looks ahead at most a line or 1024 bytes,
 * so this stops within a few KiB of a deep prefix. */
static int check_depth(const char *path, const char *data, size_t size, char *err, size_t errlen)
{
    yaml_parser_t ps;
    yaml_event_t ev;
    unsigned depth = 0;
    int rc = 0;
    bool done = false;
    if (!yaml_parser_initialize(&ps))
        return dray_fail(err, errlen, DRAY_ENOMEM, "%s: out of memory", path);
    yaml_parser_set_input_string(&ps, (const unsigned char *)data, size);
    while (!done && !rc) {
        if (!yaml_parser_parse(&ps, &ev)) {
            rc = syntax_error(path, &ps, err, errlen);
            break;
        }
        if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT)
            depth++;
        else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT)
            depth--;
        if (depth > CONFIG_MAX_DEPTH)
            rc = dray_fail(err, errlen, DRAY_EFORMAT, "%s:%zu: nesting deeper than %u levels; "
                           "expected `key: value` lines, sections indented below `section:`",
                           path, ev.start_mark.line + 1, CONFIG_MAX_DEPTH);
        done = ev.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&ps);
    return rc;
}

/* Read the whole file (small by nature) so that I/O errors are reported as such. */
static int read_file(const char *path, char **data, size_t *size, char *err, size_t errlen)
{
    int rc_errno;
    struct stat st;
    /* O_NONBLOCK: opening a FIFO without a writer would block forever; only a
     * regular file passes the check below, and reads of one never block. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        rc_errno = errno;
        if (fd >= 0)
            close(fd);
        return dray_fail(err, errlen, DRAY_EIO,
                         "%s: cannot read config: %s (give an existing YAML file, or no --config "
                         "for the defaults)",
                         path, strerror(rc_errno));
    }
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = dray_fail(err, errlen, DRAY_EIO, "%s: cannot read config: not a regular file",
                       path);
        goto out;
    }
    if (st.st_size > CONFIG_MAX_BYTES) {
        rc = dray_fail(err, errlen, DRAY_ERANGE, "%s: config is %lld bytes; at most %u expected",
                       path, (long long)st.st_size, CONFIG_MAX_BYTES);
        goto out;
    }
    *data = malloc((size_t)st.st_size + 1);
    if (!*data) {
        rc = dray_fail(err, errlen, DRAY_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    *size = fread(*data, 1, (size_t)st.st_size, f);
    if (ferror(f)) {
        rc = dray_fail(err, errlen, DRAY_EIO, "%s: cannot read config: %s", path, strerror(errno));
        free(*data);
        *data = NULL;
    }
out:
    fclose(f);
    return rc;
}

int dray_config_load(const char *path, struct dray_config *cfg, char *err, size_t errlen)
{
    char *data = NULL;
    size_t size = 0;
    if (!path || !cfg)
        return dray_fail(err, errlen, DRAY_EINVAL, "dray_config_load: no path or config");
    int rc = read_file(path, &data, &size, err, errlen);
    if (!rc)
        rc = check_depth(path, data, size, err, errlen);
    if (rc) {
        free(data);
        return rc;
    }

    yaml_parser_t ps;
    yaml_document_t doc, extra;
    struct dray_config work = *cfg; /* cfg changes only when the whole file is good */
    if (!yaml_parser_initialize(&ps)) {
        free(data);
        return dray_fail(err, errlen, DRAY_ENOMEM, "%s: out of memory", path);
    }
    yaml_parser_set_input_string(&ps, (const unsigned char *)data, size);
    if (!yaml_parser_load(&ps, &doc)) {
        rc = syntax_error(path, &ps, err, errlen);
        goto out_parser;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        struct loader l = {.path = path, .doc = &doc, .cfg = &work, .err = err, .errlen = errlen};
        rc = load_root(&l, root);
    }
    if (rc == 0 && root) { /* a second document would be silently ignored: refuse it */
        if (!yaml_parser_load(&ps, &extra)) {
            rc = syntax_error(path, &ps, err, errlen);
        } else {
            yaml_node_t *r2 = yaml_document_get_root_node(&extra);
            if (r2)
                rc = dray_fail(err, errlen, DRAY_EFORMAT,
                               "%s:%u: a second YAML document ('---'): expected one mapping",
                               path, line_of(r2));
            yaml_document_delete(&extra);
        }
    }
    yaml_document_delete(&doc);
    if (rc == 0) {
        snprintf(work.source, sizeof(work.source), "%s", path);
        *cfg = work;
    }
out_parser:
    yaml_parser_delete(&ps);
    free(data);
    return rc;
}

int dray_config_set(struct dray_config *cfg, const char *key, const char *value, char *err,
                    size_t errlen)
{
    if (!cfg || !key || !value)
        return dray_fail(err, errlen, DRAY_EINVAL, "dray_config_set: NULL argument");
    const struct key *k = key_by_name(key);
    const char *dot = strchr(key, '.');
    if (!k && dot) { /* "backend.plugin", "memory.kv_budget" */
        char section[32];
        size_t n = (size_t)(dot - key);
        if (n < sizeof(section)) {
            memcpy(section, key, n);
            section[n] = '\0';
            k = key_in_section(section, dot + 1);
        }
    }
    if (!k) {
        char hint[96];
        suggest(NULL, key, hint, sizeof(hint));
        return dray_fail(err, errlen, DRAY_ENOTFOUND,
                         "unknown key '%s'%s; the keys are listed in docs/config.md", key, hint);
    }
    char why[256];
    if (set_value(cfg, k, value, why, sizeof(why)) != 0)
        return dray_fail(err, errlen, DRAY_EINVAL, "key '%s': %s", key, why);
    return 0;
}

/* The sampling defaults of a config, as a request starts from them (here, not in
 * the engine, so that what parses requests needs no engine). */
void dray_gen_params_from_config(const struct dray_config *cfg, struct dray_gen_params *p)
{
    memset(p, 0, sizeof(*p));
    p->temperature = cfg->temperature;
    p->top_k = cfg->top_k;
    p->top_p = cfg->top_p;
    p->min_p = cfg->min_p;
    p->repeat_penalty = cfg->repeat_penalty;
    p->repeat_last_n = 64;
    p->seed = cfg->seed;
    p->max_tokens = cfg->max_tokens;
    p->lookup_draft = cfg->lookup_draft;
    dray_grammar_limits_from_config(cfg, &p->grammar_limits);
}

void dray_grammar_limits_from_config(const struct dray_config *cfg, struct dray_grammar_limits *l)
{
    *l = (struct dray_grammar_limits){
        .max_elements = cfg->grammar_max_elements, .max_alternatives = cfg->grammar_max_alternatives,
        .max_depth = cfg->grammar_max_depth, .step_stacks = cfg->grammar_step_stacks,
        .step_ms = cfg->grammar_step_ms, .cache = cfg->grammar_cache};
}

uint32_t dray_config_list_len(const char *list)
{
    uint32_t n = *list ? 1 : 0;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    return n;
}

void dray_config_list_entry(const char *list, uint32_t i, char *out, size_t cap)
{
    const char *p = list;
    for (; i && p; i--)
        if ((p = strchr(p, ',')))
            p++;
    size_t n = p ? strcspn(p, ",") : 0;
    while (n && (*p == ' ' || *p == '\t'))
        p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    snprintf(out, cap, "%.*s", (int)n, p ? p : "");
}
