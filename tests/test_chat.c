/* Gemma 3 chat template: full render, errors, and incremental turns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chat.h"
#include "dray/backend.h"
#include "gguf.h"

static char *render(const struct dray_chat_msg *m, size_t n, bool gen)
{
    char *out = NULL, err[256] = "";
    int rc = dray_chat_render(NULL, m, n, gen, &out, err, sizeof(err));
    if (rc)
        fprintf(stderr, "render: %s\n", err);
    assert_int_equal(rc, 0);
    return out;
}

static void test_chat_single_user_turn_matches_reference(void **state)
{
    (void)state;
    const struct dray_chat_msg m[] = {{"user", "Test"}};
    char *s = render(m, 1, true);
    assert_string_equal(s, "<bos><start_of_turn>user\nTest<end_of_turn>\n<start_of_turn>model\n");
    free(s);
    s = render(m, 1, false);
    assert_string_equal(s, "<bos><start_of_turn>user\nTest<end_of_turn>\n");
    free(s);
}

/* llama.cpp tests/test-chat-template.cpp gemma case, plus the <bos> of Gemma 3. */
static void test_chat_folds_system_and_trims_like_reference(void **state)
{
    (void)state;
    const struct dray_chat_msg m[] = {
        {"system", "You are a helpful assistant"}, {"user", "Hello"},
        {"assistant", "Hi there"},                 {"user", "Who are you"},
        {"assistant", "   I am an assistant   "},  {"user", "Another question"},
    };
    char *s = render(m, 6, true);
    assert_string_equal(s, "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
                           "<start_of_turn>model\nHi there<end_of_turn>\n"
                           "<start_of_turn>user\nWho are you<end_of_turn>\n"
                           "<start_of_turn>model\nI am an assistant<end_of_turn>\n"
                           "<start_of_turn>user\nAnother question<end_of_turn>\n"
                           "<start_of_turn>model\n");
    free(s);
}

static void test_chat_system_prompt_is_not_trimmed_but_user_content_is(void **state)
{
    (void)state;
    const struct dray_chat_msg m[] = {{"system", " Be brief. "}, {"user", "\n\t hi \xE3\x80\x80"}};
    char *s = render(m, 2, false);
    assert_string_equal(s, "<bos><start_of_turn>user\n Be brief. \n\nhi<end_of_turn>\n");
    free(s);
}

static void test_chat_rejects_non_alternating_roles(void **state)
{
    (void)state;
    char *out = (char *)1, err[256] = "";
    const struct dray_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    assert_int_equal(dray_chat_render(NULL, two_users, 2, true, &out, err, sizeof(err)), DRAY_EINVAL);
    assert_null(out);
    assert_non_null(strstr(err, "message 1"));
    assert_non_null(strstr(err, "alternate"));

    const struct dray_chat_msg model_first[] = {{"assistant", "a"}};
    assert_int_equal(dray_chat_render(NULL, model_first, 1, true, &out, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "message 0"));

    const struct dray_chat_msg late_system[] = {{"user", "a"}, {"system", "b"}};
    assert_int_equal(dray_chat_render(NULL, late_system, 2, true, &out, err, sizeof(err)), DRAY_EINVAL);

    const struct dray_chat_msg unknown[] = {{"user", "a"}, {"tool", "b"}};
    assert_int_equal(dray_chat_render(NULL, unknown, 2, true, &out, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "tool"));
}

static void test_chat_rejects_empty_and_lone_system(void **state)
{
    (void)state;
    char *out = NULL, err[256] = "";
    assert_int_equal(dray_chat_render(NULL, NULL, 0, true, &out, err, sizeof(err)), DRAY_EINVAL);
    const struct dray_chat_msg sys[] = {{"system", "x"}};
    assert_int_equal(dray_chat_render(NULL, sys, 1, true, &out, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "system"));
    const struct dray_chat_msg nul[] = {{"user", NULL}};
    assert_int_equal(dray_chat_render(NULL, nul, 1, true, &out, err, sizeof(err)), DRAY_EINVAL);
}

static void test_chat_rejects_unknown_template_by_name(void **state)
{
    (void)state;
    char *out = NULL, err[256] = "";
    const struct dray_chat_msg m[] = {{"user", "x"}};
    assert_int_equal(dray_chat_render("chatml", m, 1, true, &out, err, sizeof(err)), DRAY_ENOTSUP);
    assert_non_null(strstr(err, "chatml"));
    assert_int_equal(dray_chat_render("gemma3", m, 1, true, &out, err, sizeof(err)), 0);
    free(out);
}

static char *cat(char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    a = realloc(a, na + nb + 1);
    memcpy(a + na, b, nb + 1);
    return a;
}

/* Simulate a chat that keeps its KV: first render, then per turn the model's reply
 * (+ <end_of_turn> when the engine fed it) and the incremental render. */
static void check_incremental(bool eot_in_kv)
{
    const struct dray_chat_msg m[] = {
        {"system", "Sys"}, {"user", "one"},  {"assistant", "reply one"},
        {"user", "two "},  {"assistant", "reply two"}, {"user", "three"},
    };
    char err[256];
    char *kv = render(m, 2, true); /* system + first user */
    for (size_t next = 2; next + 1 < 6; next += 2) {
        kv = cat(kv, m[next].content); /* what the model generated */
        if (eot_in_kv)
            kv = cat(kv, "<end_of_turn>");
        char *turn = NULL;
        assert_int_equal(dray_chat_render_turn(NULL, &m[next + 1], 1, eot_in_kv, true, &turn, err,
                                               sizeof(err)), 0);
        kv = cat(kv, turn);
        free(turn);
        char *full = render(m, next + 2, true);
        assert_string_equal(kv, full);
        free(full);
    }
    free(kv);
}

static void test_chat_incremental_turns_equal_full_render(void **state)
{
    (void)state;
    check_incremental(false);
    check_incremental(true);
}

static void test_chat_turn_text_and_errors(void **state)
{
    (void)state;
    char *out = NULL, err[256] = "";
    const struct dray_chat_msg u[] = {{"user", " hi "}};
    assert_int_equal(dray_chat_render_turn(NULL, u, 1, false, true, &out, err, sizeof(err)), 0);
    assert_string_equal(out, "<end_of_turn>\n<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n");
    free(out);
    assert_int_equal(dray_chat_render_turn(NULL, u, 1, true, false, &out, err, sizeof(err)), 0);
    assert_string_equal(out, "\n<start_of_turn>user\nhi<end_of_turn>\n");
    free(out);
    const struct dray_chat_msg a[] = {{"assistant", "x"}};
    assert_int_equal(dray_chat_render_turn(NULL, a, 1, false, true, &out, err, sizeof(err)), DRAY_EINVAL);
    const struct dray_chat_msg s[] = {{"system", "x"}, {"user", "y"}};
    assert_int_equal(dray_chat_render_turn(NULL, s, 2, false, true, &out, err, sizeof(err)), DRAY_EINVAL);
    assert_int_equal(dray_chat_render_turn(NULL, u, 0, false, true, &out, err, sizeof(err)), DRAY_EINVAL);
}

static struct dray_gguf *gguf_with(const char *arch, const char *tmpl, void **mem)
{
    struct dray_gguf_writer *w = dray_gguf_writer_new();
    struct dray_gguf *g = NULL;
    size_t size;
    char err[256];
    dray_gguf_add_str(w, "general.architecture", arch);
    if (tmpl)
        dray_gguf_add_str(w, "tokenizer.chat_template", tmpl);
    assert_int_equal(dray_gguf_writer_to_mem(w, mem, &size), 0);
    dray_gguf_writer_free(w);
    assert_int_equal(dray_gguf_open_mem(*mem, size, "t.gguf", &g, err, sizeof(err)), 0);
    return g;
}

static void test_chat_template_detected_from_metadata(void **state)
{
    (void)state;
    void *mem;
    struct dray_gguf *g = gguf_with("gemma3", NULL, &mem); /* base model: no template */
    assert_string_equal(dray_chat_template_for(g), "gemma");
    dray_gguf_close(g);
    free(mem);
    g = gguf_with("llama", "{{ bos_token }}{% for m in messages %}<start_of_turn>{% endfor %}", &mem);
    assert_string_equal(dray_chat_template_for(g), "gemma");
    dray_gguf_close(g);
    free(mem);
    g = gguf_with("gemma3", "<|im_start|>{{ m }}", &mem);
    assert_null(dray_chat_template_for(g));
    dray_gguf_close(g);
    free(mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_single_user_turn_matches_reference),
        cmocka_unit_test(test_chat_folds_system_and_trims_like_reference),
        cmocka_unit_test(test_chat_system_prompt_is_not_trimmed_but_user_content_is),
        cmocka_unit_test(test_chat_rejects_non_alternating_roles),
        cmocka_unit_test(test_chat_rejects_empty_and_lone_system),
        cmocka_unit_test(test_chat_rejects_unknown_template_by_name),
        cmocka_unit_test(test_chat_incremental_turns_equal_full_render),
        cmocka_unit_test(test_chat_turn_text_and_errors),
        cmocka_unit_test(test_chat_template_detected_from_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
