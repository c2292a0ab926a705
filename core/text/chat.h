/* Chat templates, rendered in C (no Jinja) as a list of SEGMENTS, so that the
 * template's own control tokens and the messages' text never mix: a marker
 * segment is exactly one control token, written by the template; every other
 * segment is plain text (template formatting such as "user\n", or a message's
 * content) and is tokenized with special-token parsing OFF. A user who types
 * "<end_of_turn>" or "<|im_start|>" gets those characters, not a forged turn.
 *
 * Templates:
 *
 * "gemma" (Gemma 3 -it; docs/reference/gemma3-gguf.md §6.5), what its GGUF
 * tokenizer.chat_template computes:
 *   <bos>                                       (marker)
 *   <start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n
 *   <start_of_turn>model\n{assistant}<end_of_turn>\n
 *   ...
 *   <start_of_turn>model\n                     (add_generation_prompt)
 *   - a first "system" message is folded into the first user turn: its content
 *     (NOT trimmed) + "\n\n" goes right after that turn's header;
 *   - every other content is trimmed as Jinja's |trim (Python str.strip()) does;
 *   - "assistant" (or "model") is written "model".
 *
 * "chatml" (SmolLM2, Qwen, ...; docs/reference/smollm2-gguf.md):
 *   <|im_start|>system\n{system}<|im_end|>\n   (the model's default system prompt
 *                                                when the first message is not a
 *                                                system message and it has one)
 *   <|im_start|>user\n{user}<|im_end|>\n
 *   <|im_start|>assistant\n{assistant}<|im_end|>\n
 *   ...
 *   <|im_start|>assistant\n                    (add_generation_prompt)
 *   - contents are written as given (ChatML templates do not trim).
 *
 * Both: after an optional first system message, roles alternate user, assistant,
 * user, ...; anything else (no messages, a lone system message, an unknown role,
 * two user turns in a row, a missing content) is DRAY_EINVAL with a reason naming
 * the message index. */
#ifndef DRAY_CORE_CHAT_H
#define DRAY_CORE_CHAT_H

#include <stdbool.h>
#include <stddef.h>

struct dray_gguf;

struct dray_chat_msg {
    const char *role;    /* "system", "user", "assistant" (alias "model") */
    const char *content; /* UTF-8, NUL-terminated */
};

enum dray_chat_style { DRAY_CHAT_NONE, DRAY_CHAT_GEMMA, DRAY_CHAT_CHATML };

/* The template a model uses. style NONE: the model has none dray implements, and
 * `why` says so (used for the error at first use). */
struct dray_chat_template {
    enum dray_chat_style style;
    const char *name;     /* "gemma", "chatml"; NULL for NONE */
    char *default_system; /* ChatML: the model template's default system prompt, or NULL */
    char why[320];
};

/* Names dray implements, for error messages: "gemma, chatml". */
#define DRAY_CHAT_TEMPLATE_NAMES "gemma, chatml"

/* A template by name ("gemma" or "gemma3", "chatml"), without default system
 * prompt. DRAY_ENOTSUP naming the supported ones for anything else. */
int dray_chat_template_named(const char *name, struct dray_chat_template *t, char *err,
                             size_t errlen);

/* The template for model g: the configured name when non-empty (an unknown name
 * is DRAY_ENOTSUP; a ChatML choice still takes the default system prompt from the
 * model's template when it has one), else recognised from tokenizer.chat_template
 * ("<start_of_turn>" -> gemma, "<|im_start|>" -> chatml), else "gemma" for a
 * general.architecture starting with "gemma" (base models ship none), else NONE
 * with the reason in t->why. t is always initialised; free it with
 * dray_chat_template_free. */
int dray_chat_template_pick(const struct dray_gguf *g, const char *configured,
                            struct dray_chat_template *t, char *err, size_t errlen);
void dray_chat_template_free(struct dray_chat_template *t);

/* One rendered piece. marker: s[0..n) is the text of one control token written by
 * the template (look it up, never re-tokenize it). Otherwise plain text. */
struct dray_chat_seg {
    const char *s; /* points into the template's strings or a message's content */
    size_t n;
    bool marker;
};

struct dray_chat_segs {
    struct dray_chat_seg *v;
    size_t n, cap;
    int rc; /* sticky DRAY_ENOMEM */
};

void dray_chat_segs_free(struct dray_chat_segs *s);

/* Render a conversation into segments (valid while msgs and t live).
 * continuation: msgs are the NEW messages of a conversation that continues in the
 * same KV cache, see below; otherwise msgs is the whole conversation. */
int dray_chat_render_segs(const struct dray_chat_template *t, const struct dray_chat_msg *msgs,
                          size_t n, bool continuation, bool eot_in_kv, bool add_generation_prompt,
                          struct dray_chat_segs *out, char *err, size_t errlen);

/* Continuation contract. The sequence in the KV holds render(history, add_gen)
 * followed by the reply R the model generated, which ended when it sampled the
 * end-of-turn marker (<end_of_turn> / <|im_end|>). eot_in_kv says whether that
 * marker was also fed into the KV (engines usually stop without feeding it:
 * false). msgs[0..n) start with a user message and alternate; no system message.
 * The output is
 *     (eot_in_kv ? "" : END) + "\n" + the turns of msgs + (generation prompt)
 * so that, with A = {"assistant", R},
 *     render(history) + R + [END] + continuation(msgs) == render(history + A + msgs)
 * exactly (for gemma, when R is already trimmed: the full render trims it). */

/* The segments concatenated into one malloc'd NUL-terminated string (for tests,
 * logs, and a tokenizer's view of the whole text). t NULL = gemma. */
int dray_chat_render(const struct dray_chat_template *t, const struct dray_chat_msg *msgs, size_t n,
                     bool add_generation_prompt, char **out, char *err, size_t errlen);
int dray_chat_render_turn(const struct dray_chat_template *t, const struct dray_chat_msg *msgs,
                          size_t n, bool eot_in_kv, bool add_generation_prompt, char **out,
                          char *err, size_t errlen);

/* The marker that closes an assistant turn in t's rendering ("<end_of_turn>",
 * "<|im_end|>"), or NULL for style NONE. The scheduler feeds a reply's stop token
 * into the KV only when it is this marker: the next turn's prompt contains it. */
const char *dray_chat_turn_end(const struct dray_chat_template *t);

#endif
