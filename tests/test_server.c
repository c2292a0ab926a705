/* Server pieces that need no model and no socket: request parsing and
 * validation, the OpenAI response/SSE bodies, the API key and size limits, and
 * the Prometheus metrics page. (tests/e2e/test_serve.py drives the real server.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "dray/dray.h"
#include "policy.h"
#include "metrics.h"
#include "mhderr.h"
#include "models.h"
#include "route.h"
#include "server.h"
#include "logprobs_json.h"
#include "request.h"
#include "response.h"

static struct dray_config cfg;

static int setup(void **state)
{
    (void)state;
    dray_config_defaults(&cfg);
    return 0;
}

#define assert_contains(hay, needle)                                                              \
    do {                                                                                          \
        if (!strstr((hay), (needle)))                                                             \
            fail_msg("'%s' does not contain '%s'", (hay), (needle));                              \
    } while (0)

static int parse(enum dray_srv_kind kind, const char *body, struct dray_srv_request *q,
                 struct dray_srv_error *e)
{
    memset(e, 0, sizeof(*e));
    return dray_srv_request_parse(kind, body, strlen(body), &cfg, q, e);
}

/* body must be refused with 400, naming param (NULL: JSON null) and saying msg */
static void assert_refused(enum dray_srv_kind kind, const char *body, const char *param, const char *msg)
{
    struct dray_srv_request q;
    struct dray_srv_error e;
    if (parse(kind, body, &q, &e) == 0) {
        dray_srv_request_free(&q);
        fail_msg("accepted: %s", body);
    }
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    assert_string_equal(e.param, param ? param : "");
    assert_contains(e.message, msg);
}

static void test_chat_request_fields(void **state)
{
    (void)state;
    struct dray_srv_request q;
    struct dray_srv_error e;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":\"hi <end_of_turn>\"}],\"temperature\":0.5,"
                       "\"top_p\":0.9,\"top_k\":-1,\"min_p\":0.1,\"seed\":0,\"stop\":[\"\\n\",\"END\"],"
                       "\"max_tokens\":7,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"user\":\"u1\",\"presence_penalty\":0,\"n\":1,\"cache_salt\":\"t9\"}";
    if (parse(DRAY_SRV_CHAT, body, &q, &e))
        fail_msg("%s", e.message);
    assert_int_equal(q.n_msgs, 2);
    assert_string_equal(q.msgs[0].role, "system");
    assert_string_equal(q.msgs[1].content, "hi <end_of_turn>");
    assert_string_equal(q.model, "m");
    assert_string_equal(q.user, "u1");
    assert_string_equal(q.cache_salt, "t9");
    assert_true(q.gen.temperature == 0.5f && q.gen.top_p == 0.9f && q.gen.min_p == 0.1f);
    assert_int_equal(q.gen.top_k, 0);                /* -1 = off */
    assert_true(q.gen.seed != 0);                    /* 0 would mean "from the clock" */
    assert_int_equal(q.gen.max_tokens, 7);
    assert_int_equal(q.gen.n_stop, 2);
    assert_string_equal(q.gen.stop[1], "END");
    assert_true(q.stream && q.include_usage);
    dray_srv_request_free(&q);
    /* top_p 0 is OpenAI's "the most likely token only", not an error */
    if (parse(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"top_p\":0}", &q, &e))
        fail_msg("top_p 0: %s", e.message);
    assert_true(q.gen.top_p == 0.0f);
    dray_srv_request_free(&q);
}

static void test_defaults_come_from_config(void **state)
{
    (void)state;
    struct dray_srv_request q;
    struct dray_srv_error e;
    cfg.temperature = 0;
    cfg.max_tokens = 50;
    cfg.max_completion_tokens = 20;
    if (parse(DRAY_SRV_COMPLETION, "{\"prompt\":[\"Once upon\"],\"seed\":42}", &q, &e))
        fail_msg("%s", e.message);
    assert_string_equal(q.prompt, "Once upon");
    assert_null(q.model);
    assert_null(q.cache_salt);
    assert_true(q.gen.temperature == 0.0f);
    assert_int_equal(q.gen.max_tokens, 20); /* the default is capped by the limit */
    assert_int_equal(q.gen.seed, 42);
    assert_false(q.stream);
    dray_srv_request_free(&q);
    /* max_completion_tokens is the newer name and wins */
    cfg.max_completion_tokens = 4096;
    if (parse(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":5,\"max_completion_tokens\":9,"
              "\"stop\":\"x\"}", &q, &e))
        fail_msg("%s", e.message);
    assert_int_equal(q.gen.max_tokens, 9);
    assert_int_equal(q.gen.n_stop, 1);
    assert_string_equal(q.gen.stop[0], "x");
    dray_srv_request_free(&q);
}

static void test_content_parts_are_joined(void **state)
{
    (void)state;
    struct dray_srv_request q;
    struct dray_srv_error e;
    if (parse(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\","
              "\"text\":\"one\"},{\"type\":\"text\",\"text\":\"two\"}]}]}", &q, &e))
        fail_msg("%s", e.message);
    assert_string_equal(q.msgs[0].role, "system");
    assert_string_equal(q.msgs[0].content, "one\ntwo");
    dray_srv_request_free(&q);
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                   "messages[0].content[0]", "only parts of the form");
}

static void test_malformed_bodies_are_refused(void **state)
{
    (void)state;
    assert_refused(DRAY_SRV_CHAT, "{\"messages\": [", NULL, "the body is not valid JSON");
    assert_refused(DRAY_SRV_CHAT, "", NULL, "not valid JSON");
    assert_refused(DRAY_SRV_CHAT, "[1,2]", NULL, "the body must be a JSON object, got an array");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[],\"messages\":[]}", NULL, "duplicate");
    assert_refused(DRAY_SRV_CHAT, "{}", "messages", "'messages' is required");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":{}}", "messages", "must be an array, got an object");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[]}", "messages", "is empty");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[\"hi\"]}", "messages[0]", "got a string");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"bot\","
                   "\"content\":\"b\"}]}", "messages[1].role", "got \"bot\"");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content",
                   "got nothing");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
                   "messages[0].content", "got an integer");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":[1.5,2]}", "prompt", "must be a string");
    assert_refused(DRAY_SRV_COMPLETION, "{}", "prompt", "'prompt' is required");
}

static void test_wrong_types_and_ranges_are_refused(void **state)
{
    (void)state;
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature",
                   "must be a number, got a string");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"temperature\":3}", "temperature",
                   "between 0 and 2, got 3");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens",
                   "must be an integer, got a number");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens",
                   "must be at least 1");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"max_completion_tokens\":5000}",
                   "max_completion_tokens", "between 0 and 4096");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"top_k\":-2}", "top_k", "got -2");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"seed\":\"1\"}", "seed", "must be an integer");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"stream\":1}", "stream", "true or false");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":\"y\"}}",
                   "stream_options.include_usage", "true or false");
    /* integers past int64 are valid JSON: the field is named, not "not valid JSON" */
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"seed\": 9223372036854775808}", "seed",
                   "'seed' holds an integer past what 64 bits hold");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":-99999999999999999999}",
                   "max_tokens", "64 bits");
    assert_refused(DRAY_SRV_DETOKENIZE, "{\"tokens\": [1, 2, 18446744073709551616]}", "tokens", "64 bits");
    /* stream_options asks about a stream: without one it is refused, as OpenAI does */
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}",
                   "stream_options", "only allowed when 'stream' is enabled");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stream\":false,"
                   "\"stream_options\":{\"include_usage\":true}}", "stream_options", "only allowed");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"a\",\"\"]}", "stop[1]",
                   "got an empty string");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"stop\":7}", "stop", "a string or an array");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\","
                   "\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
                   "stop", "has 17 strings");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"model\":3}", "model", "must be a string");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"cache_salt\":[]}", "cache_salt", "must be a string");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"n\":17}", "n", "between 1 and 16");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"n\":0}", "n", "between 1 and 16");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"n\":2,\"best_of\":3}", "best_of",
                   "must equal 'n' (2)");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs", "between 0 and 5");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":6}", "logprobs", "legacy API");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"echo\":1}", "echo", "true or false");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens", "with 'echo'");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":[]}", "prompt", "must be a string");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":[2,-1]}", "prompt", "prompt[1] must be a token id");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":[2,\"a\"]}", "prompt", "prompt[1] must be a token id");
    assert_refused(DRAY_SRV_TOKENIZE, "{\"prompt\":[2,3]}", "prompt", "must be a string");
}

static void test_too_many_messages(void **state)
{
    (void)state;
    cfg.max_messages = 2;
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                   "\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]}", "messages",
                   "3 messages is more than this server accepts (2");
}

static void assert_accepted(enum dray_srv_kind kind, const char *body)
{
    struct dray_srv_request q;
    struct dray_srv_error e;
    if (parse(kind, body, &q, &e))
        fail_msg("refused (%s): %s", e.message, body);
    dray_srv_request_free(&q);
}

/* One table (server/fields.c) says which fields each endpoint takes; any other
 * is refused by name, as OpenAI does, instead of being ignored. */
static void test_unknown_fields_are_refused_by_name(void **state)
{
    (void)state;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],";
    char body[512];
    snprintf(body, sizeof(body), "%s\"temprature\":0}", chat);
    assert_refused(DRAY_SRV_CHAT, body, "temprature", "Unrecognized request argument supplied: temprature");
    snprintf(body, sizeof(body), "%s\"echo\":false}", chat); /* a text completion's field */
    assert_refused(DRAY_SRV_CHAT, body, "echo", "POST /v1/completions takes it");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"messages\":[]}", "messages",
                   "Unrecognized request argument supplied: messages (POST /v1/chat/completions takes it");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true,"
                   "\"continuous_usage_stats\":true}}", "stream_options.continuous_usage_stats",
                   "Unrecognized request argument supplied");
    /* fields dray knows and never honours say why */
    snprintf(body, sizeof(body), "%s\"functions\":[]}", chat);
    assert_refused(DRAY_SRV_CHAT, body, "functions", "use 'tools'");
    snprintf(body, sizeof(body), "%s\"prediction\":{\"type\":\"content\",\"content\":\"x\"}}", chat);
    assert_refused(DRAY_SRV_CHAT, body, "prediction", "predicted outputs");
    assert_refused(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"suffix\":\"b\"}", "suffix", "not supported");
    /* null is "not given", for any key: clients send it for unset fields */
    snprintf(body, sizeof(body), "%s\"stop\":null,\"logit_bias\":null,\"tools\":null,\"n\":null,"
             "\"response_format\":null,\"parallel_tool_calls\":null,\"seed\":null,\"no_such\":null,"
             "\"stream_options\":{\"include_usage\":null,\"other\":null}}", chat);
    assert_accepted(DRAY_SRV_CHAT, body);
}

static void test_sampling_fields_are_read(void **state)
{
    (void)state;
    struct dray_srv_request q;
    struct dray_srv_error e;
    if (parse(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"frequency_penalty\":0.5,\"presence_penalty\":-1,"
              "\"repetition_penalty\":1.25,\"logit_bias\":{\"5\":-100,\"17\":2.5},\"stop_token_ids\":[1,106],"
              "\"ignore_eos\":true,\"min_tokens\":3,\"max_tokens\":8}", &q, &e))
        fail_msg("%s", e.message);
    assert_true(q.gen.frequency_penalty == 0.5f && q.gen.presence_penalty == -1.0f);
    assert_true(q.gen.repeat_penalty == 1.25f);
    assert_int_equal(q.gen.n_logit_bias, 2);
    assert_int_equal(q.gen.logit_bias[0].id, 5);
    assert_true(q.gen.logit_bias[0].bias == -100.0f);
    assert_int_equal(q.gen.logit_bias[1].id, 17);
    assert_true(q.gen.logit_bias[1].bias == 2.5f);
    assert_int_equal(q.gen.n_stop_ids, 2);
    assert_int_equal(q.gen.stop_ids[1], 106);
    assert_true(q.gen.ignore_eos);
    assert_int_equal(q.gen.min_tokens, 3);
    assert_int_equal(dray_srv_request_check_vocab(&q, 262144, &e), 0);
    assert_int_equal(dray_srv_request_check_vocab(&q, 106, &e), -1); /* 106 is past the end */
    assert_string_equal(e.param, "stop_token_ids");
    assert_int_equal(dray_srv_request_check_vocab(&q, 10, &e), -1);
    assert_string_equal(e.param, "logit_bias");
    assert_contains(e.message, "token 17");
    dray_srv_request_free(&q);
    /* absent: off, and repetition_penalty the config's */
    cfg.repeat_penalty = 1.1f;
    if (parse(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &q, &e))
        fail_msg("%s", e.message);
    assert_true(q.gen.frequency_penalty == 0 && q.gen.presence_penalty == 0 && q.gen.repeat_penalty == 1.1f);
    assert_true(q.gen.n_logit_bias == 0 && q.gen.n_stop_ids == 0 && !q.gen.ignore_eos && q.gen.min_tokens == 0);
    dray_srv_request_free(&q);
}

static void test_sampling_fields_out_of_range_are_refused(void **state)
{
    (void)state;
    static const struct {
        const char *fields, *param, *msg;
    } cases[] = {
        {"\"frequency_penalty\":2.5", "frequency_penalty", "between -2 and 2, got 2.5"},
        {"\"presence_penalty\":\"x\"", "presence_penalty", "must be a number"},
        {"\"repetition_penalty\":0", "repetition_penalty", "greater than 0"},
        {"\"repetition_penalty\":3", "repetition_penalty", "between 0 and 2"},
        {"\"logit_bias\":[1]", "logit_bias", "must be an object"},
        {"\"logit_bias\":{\"abc\":1}", "logit_bias", "keys must be token ids"},
        {"\"logit_bias\":{\"-1\":1}", "logit_bias", "keys must be token ids"},
        {"\"logit_bias\":{\"5\":101}", "logit_bias", "between -100 and 100"},
        {"\"logit_bias\":{\"5\":\"up\"}", "logit_bias", "got a string"},
        {"\"stop_token_ids\":7", "stop_token_ids", "must be an array"},
        {"\"stop_token_ids\":[1,\"2\"]", "stop_token_ids", "stop_token_ids[1] must be a token id"},
        {"\"ignore_eos\":1", "ignore_eos", "true or false"},
        {"\"min_tokens\":-1", "min_tokens", "between 0 and"},
        {"\"max_tokens\":8,\"min_tokens\":9", "min_tokens", "(9) is more than max_tokens (8)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char body[256];
        snprintf(body, sizeof(body), "{\"prompt\":\"a\",%s}", cases[i].fields);
        assert_refused(DRAY_SRV_COMPLETION, body, cases[i].param, cases[i].msg);
    }
}

/* What dray parses but cannot honour is refused naming the field; the values
 * that ask for what it does anyway pass. */
static void test_what_cannot_be_honoured_is_refused(void **state)
{
    (void)state;
    static const struct {
        const char *fields, *param, *msg; /* param NULL: accepted */
    } cases[] = {
        {"\"response_format\":{\"type\":\"text\"}", NULL, NULL},
        {"\"response_format\":{\"type\":\"json_object\"}", NULL, NULL},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}", "response_format.json_schema.name",
         "name"},
        {"\"response_format\":{\"type\":\"xml\"}", "response_format.type", "got \"xml\""},
        {"\"response_format\":\"text\"", "response_format", "must be an object"},
        {"\"tool_choice\":\"none\"", NULL, NULL},
        {"\"tool_choice\":\"auto\"", "tool_choice", "'tools' lists no function"},
        {"\"tools\":[]", NULL, NULL},
        {"\"tools\":[{\"type\":\"function\"}]", "tools[0].function", "must be an object"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"parallel_tool_calls\":false",
         NULL, NULL},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
         "{\"type\":\"object\",\"not\":{}}}}]", "tools[0].function.parameters.not", "not"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":"
         "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}", "tool_choice", "does not list"},
        {"\"grammar\":\"root ::= \\\"a\\\"\"", NULL, NULL},
        {"\"grammar\":\"root ::= (\"", "grammar", "not a GBNF grammar dray can follow: line 1, column 10"},
        {"\"grammar\":3", "grammar", "must be a string"},
        {"\"n\":1", NULL, NULL},
        {"\"n\":3", NULL, NULL},
        {"\"n\":2.5", "n", "integer"},
        {"\"logprobs\":false", NULL, NULL},
        {"\"logprobs\":true,\"top_logprobs\":20", NULL, NULL},
        {"\"logprobs\":2", "logprobs", "true or false"},
        {"\"logprobs\":true,\"top_logprobs\":21", "top_logprobs", "between 0 and 20"},
        {"\"top_logprobs\":2", "top_logprobs", "only allowed when 'logprobs' is true"},
        {"\"logprobs\":false,\"top_logprobs\":0", "top_logprobs", "only allowed"},
        {"\"max_completion_tokens\":0", "max_completion_tokens", "at least 1"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char body[512];
        snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}",
                 cases[i].fields);
        if (cases[i].param)
            assert_refused(DRAY_SRV_CHAT, body, cases[i].param, cases[i].msg);
        else
            assert_accepted(DRAY_SRV_CHAT, body);
    }
    /* a tool loop's history: assistant tool_calls, then the tool's result */
    assert_accepted(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":"
                    "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                    "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
                    "\"tool_call_id\":\"c1\",\"content\":\"18C\"}]}");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"r\",\"tool_call_id\":"
                   "\"c\"}]}", "messages[0].tool_call_id", "Unrecognized");
    assert_refused(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":"
                   "\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{\"}}]}]}",
                   "messages[1].tool_calls[0]", "not JSON");
}

/* logprobs, top_logprobs, echo and token-id prompts are read into the request */
static void test_logprobs_fields_are_read(void **state)
{
    (void)state;
    struct dray_srv_request q;
    struct dray_srv_error e;
    if (parse(DRAY_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,"
              "\"top_logprobs\":3}", &q, &e))
        fail_msg("%s", e.message);
    assert_true(q.logprobs);
    assert_int_equal(q.top_logprobs, 3);
    dray_srv_request_free(&q);
    /* what lm-evaluation-harness sends: ids, a batch of one, logprobs 1, echo, 0 tokens */
    if (parse(DRAY_SRV_COMPLETION, "{\"prompt\":[[2,651,6037]],\"logprobs\":1,\"echo\":true,"
              "\"max_tokens\":0}", &q, &e))
        fail_msg("%s", e.message);
    assert_true(q.logprobs && q.echo);
    assert_int_equal(q.top_logprobs, 1);
    assert_string_equal(q.zero_tokens, "max_tokens");
    assert_int_equal(q.n_prompt_ids, 3);
    assert_int_equal(q.prompt_ids[1], 651);
    assert_null(q.prompt);
    assert_int_equal(dray_srv_request_check_vocab(&q, 7000, &e), 0);
    assert_int_equal(dray_srv_request_check_vocab(&q, 6000, &e), -1);
    assert_string_equal(e.param, "prompt");
    assert_non_null(strstr(e.message, "prompt[2] is token 6037"));
    dray_srv_request_free(&q);
    if (parse(DRAY_SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":0}", &q, &e))
        fail_msg("%s", e.message);
    assert_true(q.logprobs && !q.echo && !q.zero_tokens);
    assert_int_equal(q.top_logprobs, 0);
    dray_srv_request_free(&q);
}

/* a fake vocabulary for the shapes: id 1 "He", 2 "llo", 3 a lone byte 0xC3, 4 " w" */
static size_t fake_piece(const void *user, int32_t id, char *out, size_t cap)
{
    (void)user;
    static const char *p[] = {"", "He", "llo", "\xC3", " w"};
    size_t n = id >= 0 && id < 5 ? strlen(p[id]) : 0;
    if (n <= cap)
        memcpy(out, p[id], n);
    return n;
}

static void test_logprobs_shapes(void **state)
{
    (void)state;
    struct dray_token_logprob lp[3] = {
        {.id = 1, .logprob = NAN},
        {.id = 2, .logprob = -0.5f, .n_top = 2, .top = {{2, -0.5f}, {4, -1.25f}}},
        {.id = 3, .logprob = -INFINITY, .n_top = 1, .top = {{1, -0.25f}}},
    };
    json_t *c = dray_srv_chat_logprobs_json(lp + 1, 2, fake_piece, NULL);
    char *t = json_dumps(c, JSON_COMPACT);
    assert_string_equal(t, "{\"content\":[{\"token\":\"llo\",\"logprob\":-0.5,\"bytes\":[108,108,111],"
                        "\"top_logprobs\":[{\"token\":\"llo\",\"logprob\":-0.5,\"bytes\":[108,108,111]},"
                        "{\"token\":\" w\",\"logprob\":-1.25,\"bytes\":[32,119]}]},"
                        "{\"token\":\"\xEF\xBF\xBD\",\"logprob\":-9999.0,\"bytes\":[195],"
                        "\"top_logprobs\":[{\"token\":\"He\",\"logprob\":-0.25,\"bytes\":[72,101]}]}]}");
    free(t);
    json_decref(c);
    size_t end = 0;
    c = dray_srv_text_logprobs_json(lp, 3, 0, &end, fake_piece, NULL);
    t = json_dumps(c, JSON_COMPACT);
    assert_string_equal(t, "{\"tokens\":[\"He\",\"llo\",\"\xEF\xBF\xBD\"],\"token_logprobs\":[null,-0.5,-9999.0],"
                        "\"top_logprobs\":[null,{\"llo\":-0.5,\" w\":-1.25},{\"He\":-0.25,\"\xEF\xBF\xBD\":-9999.0}],"
                        "\"text_offset\":[0,2,5]}");
    assert_int_equal(end, 6);
    free(t);
    json_decref(c);
    /* in a body: the choice's logprobs */
    struct dray_srv_ident id = {.kind = DRAY_SRV_COMPLETION, .id = "cmpl-1", .created = 1, .model = "m"};
    struct dray_srv_usage u = {2, 1, 0};
    t = dray_srv_completion_json_lp(&id, "Hello", 5, "length", &u,
                                    dray_srv_text_logprobs_json(lp, 2, 0, NULL, fake_piece, NULL));
    json_t *root = json_loads(t, 0, NULL);
    json_t *l = json_object_get(json_array_get(json_object_get(root, "choices"), 0), "logprobs");
    assert_int_equal(json_array_size(json_object_get(l, "tokens")), 2);
    assert_true(json_is_null(json_array_get(json_object_get(l, "token_logprobs"), 0)));
    json_decref(root);
    free(t);
    struct dray_srv_buf b = {0};
    id.kind = DRAY_SRV_CHAT;
    assert_int_equal(dray_srv_sse_chunk_lp(&b, &id, false, "llo", 3, NULL, false,
                                           dray_srv_chat_logprobs_json(lp + 1, 1, fake_piece, NULL)), 0);
    assert_non_null(strstr(b.data, "\"delta\":{\"content\":\"llo\"}"));
    assert_non_null(strstr(b.data, "\"logprobs\":{\"content\":[{\"token\":\"llo\""));
    dray_srv_buf_free(&b);
}

/* vLLM's /tokenize and /detokenize bodies */
static void test_tokenize_bodies(void **state)
{
    (void)state;
    struct dray_srv_request q;
    struct dray_srv_error e;
    if (parse(DRAY_SRV_TOKENIZE, "{\"model\":\"m\",\"prompt\":\"hi there\"}", &q, &e))
        fail_msg("%s", e.message);
    assert_string_equal(q.prompt, "hi there");
    assert_string_equal(q.model, "m");
    assert_true(q.add_special_tokens);
    dray_srv_request_free(&q);
    if (parse(DRAY_SRV_TOKENIZE, "{\"prompt\":\"x\",\"add_special_tokens\":false}", &q, &e))
        fail_msg("%s", e.message);
    assert_false(q.add_special_tokens);
    dray_srv_request_free(&q);
    if (parse(DRAY_SRV_TOKENIZE, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
              "\"add_generation_prompt\":false,\"add_special_tokens\":false}", &q, &e))
        fail_msg("%s", e.message);
    assert_null(q.prompt);
    assert_int_equal(q.n_msgs, 1);
    assert_false(q.add_generation_prompt);
    dray_srv_request_free(&q);
    assert_refused(DRAY_SRV_TOKENIZE, "{\"prompt\":\"a\",\"messages\":[]}", "messages", "not both");
    assert_refused(DRAY_SRV_TOKENIZE, "{}", "prompt", "is required");
    assert_refused(DRAY_SRV_TOKENIZE, "{\"prompt\":\"a\",\"add_generation_prompt\":true}",
                   "add_generation_prompt", "applies to 'messages'");
    assert_refused(DRAY_SRV_TOKENIZE, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                   "\"add_special_tokens\":true}", "add_special_tokens", "the chat template");
    assert_refused(DRAY_SRV_TOKENIZE, "{\"prompt\":\"a\",\"max_tokens\":3}", "max_tokens",
                   "Unrecognized request argument supplied: max_tokens");

    if (parse(DRAY_SRV_DETOKENIZE, "{\"tokens\":[2,105,0]}", &q, &e))
        fail_msg("%s", e.message);
    assert_int_equal(q.n_tokens, 3);
    assert_int_equal(q.tokens[1], 105);
    assert_int_equal(dray_srv_request_check_vocab(&q, 106, &e), 0);
    assert_int_equal(dray_srv_request_check_vocab(&q, 105, &e), -1);
    assert_string_equal(e.param, "tokens");
    assert_contains(e.message, "tokens[1] is 105");
    dray_srv_request_free(&q);
    assert_accepted(DRAY_SRV_DETOKENIZE, "{\"tokens\":[]}");
    assert_refused(DRAY_SRV_DETOKENIZE, "{}", "tokens", "is required");
    assert_refused(DRAY_SRV_DETOKENIZE, "{\"tokens\":\"12\"}", "tokens", "must be an array");
    assert_refused(DRAY_SRV_DETOKENIZE, "{\"tokens\":[1,-2]}", "tokens", "tokens[1] must be a token id");
    assert_refused(DRAY_SRV_DETOKENIZE, "{\"tokens\":[1],\"prompt\":\"a\"}", "prompt",
                   "POST /v1/completions takes it");
}

static json_t *load(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("not JSON (%s): %s", je.text, text);
    return j;
}

static void test_error_body_has_openai_shape(void **state)
{
    (void)state;
    struct dray_srv_error e;
    dray_srv_bad(&e, "messages[0].role", "bad role \"%s\"", "bot");
    char *text = dray_srv_error_json(&e);
    json_t *j = load(text), *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "bad role \"bot\"");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "messages[0].role");
    assert_true(json_is_null(json_object_get(err, "code")));
    json_decref(j);
    free(text);
    dray_srv_fail(&e, 404, "invalid_request_error", "model_not_found", NULL, "no");
    text = dray_srv_error_json(&e);
    j = load(text);
    err = json_object_get(j, "error");
    assert_true(json_is_null(json_object_get(err, "param")));
    assert_string_equal(json_string_value(json_object_get(err, "code")), "model_not_found");
    json_decref(j);
    free(text);
}

static const struct dray_srv_usage usage = {.prompt = 12, .completion = 5, .cached = 8};

static void test_completion_bodies(void **state)
{
    (void)state;
    struct dray_srv_ident id = {.kind = DRAY_SRV_CHAT, .id = "chatcmpl-1", .created = 1700000000, .model = "g"};
    char *text = dray_srv_completion_json(&id, "Hi \"there\"\n", 11, "length", &usage);
    json_t *j = load(text);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_int_equal(json_integer_value(json_object_get(j, "created")), 1700000000);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Hi \"there\"\n");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_t *u = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 17);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                        "cached_tokens")), 8);
    json_decref(j);
    free(text);
    id.kind = DRAY_SRV_COMPLETION;
    text = dray_srv_completion_json(&id, "abc", 2, "stop", &usage);
    j = load(text);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "text")), "ab");
    json_decref(j);
    free(text);
    /* bytes that are not UTF-8 cannot become a JSON string */
    assert_null(dray_srv_completion_json(&id, "\xff", 1, "stop", &usage));
}

/* The SSE events in buf: each "data: X\n\n"; returns how many, X's in ev. */
static size_t split_events(const char *buf, char ev[][1024], size_t max)
{
    size_t n = 0;
    while (*buf && n < max) {
        if (strncmp(buf, "data: ", 6))
            fail_msg("event does not start with 'data: ': %s", buf);
        const char *end = strstr(buf, "\n\n");
        if (!end)
            fail_msg("event not ended by a blank line: %s", buf);
        snprintf(ev[n++], 1024, "%.*s", (int)(end - buf - 6), buf + 6);
        buf = end + 2;
    }
    return n;
}

static void test_sse_chat_stream(void **state)
{
    (void)state;
    struct dray_srv_ident id = {.kind = DRAY_SRV_CHAT, .id = "chatcmpl-2", .created = 5, .model = "g"};
    struct dray_srv_buf b = {0};
    assert_int_equal(dray_srv_sse_chunk(&b, &id, true, NULL, 0, NULL, true), 0);
    assert_int_equal(dray_srv_sse_chunk(&b, &id, false, "Hel", 3, NULL, true), 0);
    assert_int_equal(dray_srv_sse_chunk(&b, &id, false, NULL, 0, "stop", true), 0);
    assert_int_equal(dray_srv_sse_usage(&b, &id, &usage), 0);
    assert_int_equal(dray_srv_sse_done(&b), 0);
    char ev[8][1024];
    assert_int_equal(split_events(b.data, ev, 8), 5);
    json_t *j = load(ev[0]);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0), *d = json_object_get(c, "delta");
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    assert_string_equal(json_string_value(json_object_get(d, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(d, "content")), "");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    assert_true(json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    j = load(ev[1]);
    d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    assert_string_equal(json_string_value(json_object_get(d, "content")), "Hel");
    assert_null(json_object_get(d, "role"));
    json_decref(j);
    j = load(ev[2]);
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(c, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "stop");
    json_decref(j);
    j = load(ev[3]);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 5);
    json_decref(j);
    assert_string_equal(ev[4], "[DONE]");
    dray_srv_buf_free(&b);
}

static void test_sse_text_stream_and_error_event(void **state)
{
    (void)state;
    struct dray_srv_ident id = {.kind = DRAY_SRV_COMPLETION, .id = "cmpl-3", .created = 5, .model = "g"};
    struct dray_srv_buf b = {0};
    struct dray_srv_error e;
    assert_int_equal(dray_srv_sse_chunk(&b, &id, false, "x", 1, NULL, false), 0);
    dray_srv_fail(&e, 503, "server_error", "shutting_down", NULL, "bye");
    assert_int_equal(dray_srv_sse_error(&b, &e), 0);
    char ev[4][1024];
    assert_int_equal(split_events(b.data, ev, 4), 2);
    json_t *j = load(ev[0]);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                          "text")), "x");
    assert_null(json_object_get(j, "usage")); /* only with include_usage */
    json_decref(j);
    j = load(ev[1]);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "shutting_down");
    json_decref(j);
    dray_srv_buf_free(&b);
}

static void test_models_body(void **state)
{
    (void)state;
    struct dray_srv_models m;
    char err[256];
    assert_int_equal(dray_srv_models_init(&m, "", "gemma-3-270m-q4_k_m", 1024, 9, err, sizeof(err)), 0);
    char *text = dray_srv_models_json(&m);
    json_t *j = load(text);
    json_t *d = json_object_get(j, "data"), *o = json_array_get(d, 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    assert_int_equal(json_array_size(d), 1);
    assert_string_equal(json_string_value(json_object_get(o, "id")), "gemma-3-270m-q4_k_m");
    assert_string_equal(json_string_value(json_object_get(o, "object")), "model");
    assert_int_equal(json_integer_value(json_object_get(o, "max_model_len")), 1024);
    assert_int_equal(json_integer_value(json_object_get(o, "created")), 9);
    json_decref(j);
    free(text);
}

static void test_tokenize_response_bodies(void **state)
{
    (void)state;
    int32_t ids[3] = {2, 9259, 1};
    char *text = dray_srv_tokens_json(ids, 3, 1024);
    json_t *j = load(text), *t = json_object_get(j, "tokens");
    assert_int_equal(json_array_size(t), 3);
    assert_int_equal(json_integer_value(json_array_get(t, 1)), 9259);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), 3);
    assert_int_equal(json_integer_value(json_object_get(j, "max_model_len")), 1024);
    json_decref(j);
    free(text);
    text = dray_srv_detokenized_json("Hi \"you\"", 8);
    j = load(text);
    assert_string_equal(json_string_value(json_object_get(j, "prompt")), "Hi \"you\"");
    json_decref(j);
    free(text);
}

/* served_model_name: a list of names; the first is reported, any of them or
 * the file's name is accepted, anything else is 404 naming `model`. */
static void test_served_model_names(void **state)
{
    (void)state;
    struct dray_srv_models m;
    struct dray_srv_error e;
    char err[256];
    assert_int_equal(dray_srv_models_init(&m, " gpt-4o-mini , org/gemma-270m", "gemma-3-270m-q4_k_m",
                                          2048, 9, err, sizeof(err)), 0);
    assert_int_equal(m.n, 2);
    assert_string_equal(m.name[0], "gpt-4o-mini");
    assert_string_equal(m.name[1], "org/gemma-270m");
    const char *ok[] = {NULL, "gpt-4o-mini", "org/gemma-270m", "gemma-3-270m-q4_k_m"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        assert_int_equal(dray_srv_check_model(&m, ok[i], &e), 0);
    memset(&e, 0, sizeof(e));
    assert_int_equal(dray_srv_check_model(&m, "gpt-4", &e), -1);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.code, "model_not_found");
    assert_string_equal(e.param, "model");
    assert_contains(e.message, "this server runs 'gpt-4o-mini'");

    char *text = dray_srv_models_json(&m);
    json_t *j = load(text), *d = json_object_get(j, "data");
    assert_int_equal(json_array_size(d), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(d, 0), "id")), "gpt-4o-mini");
    assert_string_equal(json_string_value(json_object_get(json_array_get(d, 1), "root")),
                        "gemma-3-270m-q4_k_m");
    json_decref(j);
    free(text);
    /* GET /v1/models/{id}: the object of that name, 404 for others */
    text = dray_srv_model_json(&m, "org/gemma-270m", &e);
    j = load(text);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "org/gemma-270m");
    assert_int_equal(json_integer_value(json_object_get(j, "max_model_len")), 2048);
    json_decref(j);
    free(text);
    assert_null(dray_srv_model_json(&m, "nope", &e));
    assert_int_equal(e.status, 404);

    assert_int_equal(dray_srv_models_init(&m, "a,,b", "f", 1, 0, err, sizeof(err)), -1);
    assert_contains(err, "name 2 is empty");
    assert_int_equal(dray_srv_models_init(&m, "a,", "f", 1, 0, err, sizeof(err)), -1);
    assert_int_equal(dray_srv_models_init(&m, "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "f", 1, 0,
                                          err, sizeof(err)), -1);
    assert_contains(err, "at most 16 names");
}

static void test_api_key(void **state)
{
    (void)state;
    struct dray_srv_error e;
    assert_int_equal(dray_srv_check_auth(NULL, "", &e), 0);           /* no key configured */
    assert_int_equal(dray_srv_check_auth("Bearer k3y", "k3y", &e), 0);
    assert_int_equal(dray_srv_check_auth("bearer k3y", "k3y", &e), 0); /* the scheme is case-insensitive */
    const char *bad[] = {NULL, "k3y", "Basic k3y", "Bearer k3", "Bearer k3yy", "Bearer K3Y", "Bearer "};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&e, 0, sizeof(e));
        if (dray_srv_check_auth(bad[i], "k3y", &e) == 0)
            fail_msg("'%s' was let in", bad[i] ? bad[i] : "(no header)");
        assert_int_equal(e.status, 401);
        assert_string_equal(e.code, "invalid_api_key");
    }
}

static void test_size_limits(void **state)
{
    (void)state;
    struct dray_srv_error e;
    assert_int_equal(dray_srv_check_body(1024, 1024, &e), 0);
    assert_int_not_equal(dray_srv_check_body(1025, 1024, &e), 0);
    assert_int_equal(e.status, 413);
    assert_contains(e.message, "1024 bytes, config key max_body");
    assert_int_equal(dray_srv_check_prompt(10, 0, 11, "prompt", &e), 0);
    assert_int_not_equal(dray_srv_check_prompt(11, 0, 11, "prompt", &e), 0);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "context_length_exceeded");
    assert_string_equal(e.param, "prompt");
    assert_int_not_equal(dray_srv_check_prompt(6, 5, 100, "messages", &e), 0);
    assert_contains(e.message, "the prompt is 6 tokens; this server accepts at most 5");
}

/* The value of the sample line that starts with `series ` (exactly), or -1. */
static double sample(const char *page, const char *series)
{
    char key[256];
    snprintf(key, sizeof(key), "\n%s ", series);
    const char *p = strstr(page, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

static void test_metrics_page(void **state)
{
    (void)state;
    /* the process counts responses; two replicas count their own tokens */
    struct dray_srv_metrics http, m, m1;
    dray_srv_metrics_init(&http);
    dray_srv_metrics_init(&m);
    dray_srv_metrics_init(&m1);
    dray_srv_metrics_count_status(&http, 200);
    dray_srv_metrics_count_status(&http, 200);
    dray_srv_metrics_count_status(&http, 429);
    /* 11 tokens: first after 0.3 s, then 10 gaps of 0.03 s */
    struct dray_request_output o = {.done = true, .n_prompt = 20, .n_cached = 16, .n_generated = 11,
                                    .ttft_s = 0.3, .total_s = 0.6};
    dray_srv_metrics_observe(&m, &o);
    o.ttft_s = 3;
    o.total_s = 3.05; /* gaps of 5 ms */
    dray_srv_metrics_observe(&m, &o);
    struct dray_request_output o1 = {.done = true, .n_prompt = 7, .n_cached = 0, .n_generated = 1,
                                     .ttft_s = 0.02, .total_s = 0.02};
    dray_srv_metrics_observe(&m1, &o1);
    struct dray_sched_stats st[2] = {{.waiting = 3, .running = 8, .max_seqs = 8, .kv_blocks_used = 100,
                                  .kv_blocks_total = 640, .preemptions = 2, .steps = 77,
                                  .requests_done = 5, .requests_cancelled = 1},
                                 {.running = 1, .max_seqs = 8, .kv_blocks_total = 640,
                                  .cache_lookup_tokens = 7, .requests_done = 1}};
    struct dray_srv_metrics *reps[2] = {&m, &m1};
    struct dray_srv_buf b = {0};
    assert_int_equal(dray_srv_metrics_format(&http, reps, st, 2, &b), 0);
    const char *p = b.data;
    assert_true(sample(p, "dray_http_requests_total{code=\"200\"}") == 2);
    assert_true(sample(p, "dray_http_requests_total{code=\"429\"}") == 1);
    assert_true(sample(p, "dray_http_requests_total{code=\"404\"}") == -1); /* only codes seen */
    assert_true(sample(p, "dray_prompt_tokens_total{replica=\"0\"}") == 40);
    assert_true(sample(p, "dray_prompt_tokens_cached_total{replica=\"0\"}") == 32);
    assert_true(sample(p, "dray_completion_tokens_total{replica=\"0\"}") == 22);
    assert_true(sample(p, "dray_time_to_first_token_seconds_bucket{replica=\"0\",le=\"0.25\"}") == 0);
    assert_true(sample(p, "dray_time_to_first_token_seconds_bucket{replica=\"0\",le=\"0.5\"}") == 1);
    assert_true(sample(p, "dray_time_to_first_token_seconds_bucket{replica=\"0\",le=\"2.5\"}") == 1);
    assert_true(sample(p, "dray_time_to_first_token_seconds_bucket{replica=\"0\",le=\"5\"}") == 2);
    assert_true(sample(p, "dray_time_to_first_token_seconds_bucket{replica=\"0\",le=\"+Inf\"}") == 2);
    assert_true(sample(p, "dray_time_to_first_token_seconds_count{replica=\"0\"}") == 2);
    assert_true(sample(p, "dray_time_to_first_token_seconds_sum{replica=\"0\"}") > 3.29);
    assert_true(sample(p, "dray_inter_token_latency_seconds_bucket{replica=\"0\",le=\"0.005\"}") == 10);
    assert_true(sample(p, "dray_inter_token_latency_seconds_bucket{replica=\"0\",le=\"0.02\"}") == 10);
    assert_true(sample(p, "dray_inter_token_latency_seconds_bucket{replica=\"0\",le=\"0.04\"}") == 20);
    assert_true(sample(p, "dray_inter_token_latency_seconds_count{replica=\"0\"}") == 20);
    assert_true(sample(p, "dray_queue_depth{replica=\"0\"}") == 3);
    assert_true(sample(p, "dray_running_sequences{replica=\"0\"}") == 8);
    assert_true(sample(p, "dray_kv_blocks_used{replica=\"0\"}") == 100);
    assert_true(sample(p, "dray_kv_blocks_total{replica=\"0\"}") == 640);
    assert_true(sample(p, "dray_preemptions_total{replica=\"0\"}") == 2);
    assert_true(sample(p, "dray_scheduler_requests_total{replica=\"0\",outcome=\"done\"}") == 5);
    assert_true(sample(p, "dray_scheduler_requests_total{replica=\"0\",outcome=\"failed\"}") == 0);
    assert_true(sample(p, "dray_scheduler_requests_total{replica=\"0\",outcome=\"cancelled\"}") == 1);
    /* replica 1's own series, under the same family headers */
    assert_true(sample(p, "dray_prompt_tokens_total{replica=\"1\"}") == 7);
    assert_true(sample(p, "dray_completion_tokens_total{replica=\"1\"}") == 1);
    assert_true(sample(p, "dray_time_to_first_token_seconds_bucket{replica=\"1\",le=\"0.025\"}") == 1);
    assert_true(sample(p, "dray_time_to_first_token_seconds_count{replica=\"1\"}") == 1);
    assert_true(sample(p, "dray_running_sequences{replica=\"1\"}") == 1);
    assert_true(sample(p, "dray_prefix_cache_lookup_tokens_total{replica=\"1\"}") == 7);
    assert_true(sample(p, "dray_scheduler_requests_total{replica=\"1\",outcome=\"done\"}") == 1);
    const char *fam = strstr(p, "# TYPE dray_running_sequences gauge\n");
    assert_non_null(fam);
    assert_null(strstr(fam + 1, "# TYPE dray_running_sequences gauge\n")); /* one header per family */
    assert_contains(p, "# TYPE dray_inter_token_latency_seconds histogram\n");
    assert_contains(p, "# TYPE dray_preemptions_total counter\n");
    assert_contains(p, "# TYPE dray_queue_depth gauge\n");
    /* every line is a comment or `name{labels} number` */
    for (const char *line = p; *line;) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        if (*line != '#') {
            const char *sp = memchr(line, ' ', (size_t)(nl - line));
            assert_non_null(sp);
            char *end;
            strtod(sp + 1, &end);
            if (end != nl)
                fail_msg("bad sample line: %.*s", (int)(nl - line), line);
        }
        line = nl + 1;
    }
    dray_srv_buf_free(&b);
    dray_srv_metrics_destroy(&m);
    dray_srv_metrics_destroy(&m1);
    dray_srv_metrics_destroy(&http);
}

/* A conversation's key picks one replica, always the same one; keys spread
 * over all replicas; and going from 3 to 4 replicas moves only the keys the
 * new replica wins (rendezvous hashing), not most of them as `mod n` would. */
static void test_route_pick(void **state)
{
    (void)state;
    uint32_t seen[4] = {0}, moved = 0, to_new = 0;
    char key[32];
    for (int i = 0; i < 1000; i++) {
        int n = snprintf(key, sizeof(key), "conv-%d", i);
        uint32_t r3 = dray_srv_pick_replica(key, (size_t)n, 3);
        assert_true(r3 < 3);
        assert_int_equal(dray_srv_pick_replica(key, (size_t)n, 3), r3);
        seen[r3]++;
        uint32_t r4 = dray_srv_pick_replica(key, (size_t)n, 4);
        moved += r4 != r3;
        to_new += r4 == 3;
    }
    for (int r = 0; r < 3; r++)
        assert_true(seen[r] > 250 && seen[r] < 420); /* about 333 each */
    assert_int_equal(moved, to_new);               /* every moved key went to the new one */
    assert_true(moved > 180 && moved < 320);       /* about a quarter */
    assert_int_equal(dray_srv_pick_replica("x", 1, 1), 0);
    assert_int_equal(dray_srv_pick_replica("", 0, 0), 0);
}

static void test_route_key(void **state)
{
    (void)state;
    const char *key;
    assert_int_equal(dray_srv_route_key("s1", "u1", "10.0.0.1", &key), DRAY_SRV_KEY_SESSION);
    assert_string_equal(key, "s1");
    assert_int_equal(dray_srv_route_key("", "u1", "10.0.0.1", &key), DRAY_SRV_KEY_USER);
    assert_string_equal(key, "u1");
    assert_int_equal(dray_srv_route_key(NULL, NULL, "10.0.0.1", &key), DRAY_SRV_KEY_ADDRESS);
    assert_string_equal(key, "10.0.0.1");
}

/* Each replica's device and threads, from the server's config. */
static void test_replica_config(void **state)
{
    (void)state;
    struct dray_config cfg, out;
    char err[256];
    dray_config_defaults(&cfg);
    cfg.replicas = 2;
    /* one device: shared; threads 0 = the cores split */
    assert_int_equal(dray_serve_replica_config(&cfg, 1, 8, &out, err, sizeof(err)), 0);
    assert_string_equal(out.device, "");
    assert_int_equal(out.threads, 4);
    assert_int_equal(dray_serve_replica_config(&cfg, 1, 1, &out, err, sizeof(err)), 0);
    assert_int_equal(out.threads, 1); /* never 0 (which would mean all cores) */
    cfg.threads = 3; /* set: per replica */
    assert_int_equal(dray_serve_replica_config(&cfg, 0, 8, &out, err, sizeof(err)), 0);
    assert_int_equal(out.threads, 3);
    /* a list: one device each */
    snprintf(cfg.device, sizeof(cfg.device), "0, h200");
    assert_int_equal(dray_serve_replica_config(&cfg, 0, 8, &out, err, sizeof(err)), 0);
    assert_string_equal(out.device, "0");
    assert_int_equal(dray_serve_replica_config(&cfg, 1, 8, &out, err, sizeof(err)), 0);
    assert_string_equal(out.device, "h200");
    cfg.replicas = 3;
    assert_int_equal(dray_serve_replica_config(&cfg, 0, 8, &out, err, sizeof(err)), DRAY_EINVAL);
    assert_contains(err, "lists 2 devices but replicas is 3");
    snprintf(cfg.device, sizeof(cfg.device), "0,,1");
    assert_int_equal(dray_serve_replica_config(&cfg, 1, 8, &out, err, sizeof(err)), DRAY_EINVAL);
    assert_contains(err, "entry 2 (replica 1) is empty");
}



/* libmicrohttpd's log read as its error answers: the status, the HTML title; and
 * the raw JSON response that stands for it */
static int mhd_read(char *text, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int mhd_read(char *text, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int st = dray_srv_mhd_log_read(fmt, ap, text, len);
    va_end(ap);
    return st;
}

static void test_mhd_errors(void **state)
{
    (void)state;
    char text[128];
    assert_int_equal(mhd_read(text, sizeof(text), DRAY_SRV_MHD_ERR_FMT "Closing connection.\n", 431u,
                              "<html><head><title>Request too big</title></head></html>"), 431);
    assert_string_equal(text, "Request too big");
    assert_int_equal(mhd_read(text, sizeof(text), "Failed to parse `%s' header.\n", "Content-Length"), 0);
    assert_string_equal(text, "Failed to parse `Content-Length' header.");
    size_t len = 0;
    char *r = dray_srv_mhd_error_response(413, "Too large value", &len);
    assert_non_null(r);
    assert_int_equal(len, strlen(r));
    assert_true(!strncmp(r, "HTTP/1.1 413 Content Too Large\r\n", 32));
    const char *body = strstr(r, "\r\n\r\n") + 4;
    json_t *j = json_loads(body, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "request_too_large");
    char cl[48];
    snprintf(cl, sizeof(cl), "Content-Length: %zu\r\n", strlen(body));
    assert_non_null(strstr(r, cl));
    json_decref(j);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_chat_request_fields, setup),
        cmocka_unit_test_setup(test_defaults_come_from_config, setup),
        cmocka_unit_test_setup(test_content_parts_are_joined, setup),
        cmocka_unit_test_setup(test_malformed_bodies_are_refused, setup),
        cmocka_unit_test_setup(test_wrong_types_and_ranges_are_refused, setup),
        cmocka_unit_test_setup(test_too_many_messages, setup),
        cmocka_unit_test_setup(test_unknown_fields_are_refused_by_name, setup),
        cmocka_unit_test_setup(test_sampling_fields_are_read, setup),
        cmocka_unit_test_setup(test_sampling_fields_out_of_range_are_refused, setup),
        cmocka_unit_test_setup(test_what_cannot_be_honoured_is_refused, setup),
        cmocka_unit_test_setup(test_logprobs_fields_are_read, setup),
        cmocka_unit_test_setup(test_logprobs_shapes, setup),
        cmocka_unit_test_setup(test_tokenize_bodies, setup),
        cmocka_unit_test_setup(test_error_body_has_openai_shape, setup),
        cmocka_unit_test_setup(test_completion_bodies, setup),
        cmocka_unit_test_setup(test_sse_chat_stream, setup),
        cmocka_unit_test_setup(test_sse_text_stream_and_error_event, setup),
        cmocka_unit_test_setup(test_models_body, setup),
        cmocka_unit_test_setup(test_served_model_names, setup),
        cmocka_unit_test_setup(test_tokenize_response_bodies, setup),
        cmocka_unit_test_setup(test_api_key, setup),
        cmocka_unit_test_setup(test_size_limits, setup),
        cmocka_unit_test_setup(test_metrics_page, setup),
        cmocka_unit_test(test_route_pick),
        cmocka_unit_test(test_route_key),
        cmocka_unit_test(test_replica_config),
        cmocka_unit_test(test_mhd_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
