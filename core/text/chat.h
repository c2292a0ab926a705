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
 *   Gemma 2's template renders the same, except that it refuses a system
 *   message (raise_exception) where dray folds it as Gemma 3 does.
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
 *   Default system prompts: SmolLM2's, Qwen2's "You are a helpful assistant.",
 *   Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a helpful
 *   assistant."; Qwen3 has none (and writes its assistant turns as here where
 *   they hold no <think>, without enable_thinking). SmolLM3's template is ChatML
 *   with a generated system turn (metadata, today's date, reasoning mode) that
 *   dray does NOT write: it renders plain ChatML for it.
 *
 * "llama3" (Llama 3.1, 3.2, 3.3 Instruct; "llama3.0" for Llama 3.0), as the
 * models' templates render without tools:
 *   <|begin_of_text|>                                     (marker)
 *   <|start_header_id|>system<|end_header_id|>\n\n{prefix}{system}<|eot_id|>
 *   <|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>
 *   <|start_header_id|>assistant<|end_header_id|>\n\n{assistant}<|eot_id|>
 *   ...
 *   <|start_header_id|>assistant<|end_header_id|>\n\n    (add_generation_prompt)
 *   - 3.1+: the system turn is always there and opens with the prefix
 *     "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n", date the
 *     3.1 template's default "26 Jul 2024", or today's ("%d %b %Y") where the
 *     model's template asks strftime_now (3.2, 3.3: what transformers renders);
 *     3.0: no prefix, a system turn only for a system message;
 *   - every content is trimmed (|trim).
 *
 * "mistral" (Mistral 7B Instruct v0.3, the v3 tokenizer):
 *   <s>[INST] {user}[/INST] {assistant}</s>[INST] {system}\n\n{user}[/INST]
 *   - the system prompt opens the LAST message when that is a user message (so
 *     a conversation ending in an assistant message drops it), as the template
 *     does; a continuation (below) never repeats it;
 *   - assistant contents are trimmed; nothing is added for the generation prompt.
 * "mistral-v1" (Mistral 7B Instruct v0.1/v0.2, Mixtral 8x7B; their updated
 * templates with system support):
 *   <s> [INST] {system}\n\n{user} [/INST] {assistant}</s> [INST] {user} [/INST]
 *   - the system prompt opens the first user message; nothing is trimmed.
 *   [INST] and [/INST] are SOFT markers: control tokens in the v3 vocabulary,
 *   plain text in v1's (a v1 model cannot tell them from typed text).
 *
 * "phi3" (Phi-3 mini updated template, Phi-3.5 mini):
 *   <|system|>\n{system}<|end|>\n<|user|>\n{user}<|end|>\n
 *   <|assistant|>\n{assistant}<|end|>\n ... <|assistant|>\n   (add_generation_prompt)
 *   - without add_generation_prompt the render ends with <|endoftext|>.
 *
 * "granite" (Granite 3.x Instruct):
 *   <|start_of_role|>system<|end_of_role|>{system}<|end_of_text|>\n
 *   <|start_of_role|>user<|end_of_role|>{user}<|end_of_text|>\n
 *   <|start_of_role|>assistant<|end_of_role|>{assistant}<|end_of_text|>\n
 *   ... <|start_of_role|>assistant<|end_of_role|>        (add_generation_prompt)
 *   - 3.1+ templates' default system prompt when there is no system message:
 *     "Knowledge Cutoff Date: April 2024.\nToday's Date: {%B %d, %Y of today}.\n
 *     You are Granite, developed by IBM. You are a helpful AI assistant."
 *     (3.0's template has none).
 *
 * "olmo2" (OLMo 2 Instruct, Tulu 3 format):
 *   <|endoftext|><|system|>\n{system}\n<|user|>\n{user}\n
 *   <|assistant|>\n{assistant}<|endoftext|>\n<|user|>\n{user}\n<|assistant|>\n
 *   - the "\n" after an assistant's <|endoftext|> only where a message follows;
 *   - <|system|>, <|user|>, <|assistant|> are soft markers.
 *
 * A soft marker is a marker segment flagged `soft`: chat_tokenize looks it up
 * like any marker, and tokenizes it as text where the vocabulary lacks it.
 *
 * All: after an optional first system message, roles alternate user, assistant,
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

enum dray_chat_style {
    DRAY_CHAT_NONE,
    DRAY_CHAT_GEMMA,
    DRAY_CHAT_CHATML,
    DRAY_CHAT_LLAMA3,
    DRAY_CHAT_MISTRAL,    /* v0.3 */
    DRAY_CHAT_MISTRAL_V1, /* v0.1, v0.2 */
    DRAY_CHAT_PHI3,
    DRAY_CHAT_GRANITE,
    DRAY_CHAT_OLMO2,
};

/* The template a model uses. style NONE: the model has none dray implements, and
 * `why` says so (used for the error at first use). */
struct dray_chat_template {
    enum dray_chat_style style;
    const char *name;     /* "gemma", "chatml", "llama3", ...; NULL for NONE */
    char *default_system; /* ChatML, Granite: the model template's default system prompt, or NULL */
    char *system_prefix;  /* Llama 3.1+: what opens the system turn, or NULL */
    char why[320];
};

/* Names dray implements, for error messages. */
#define DRAY_CHAT_TEMPLATE_NAMES "gemma, chatml, llama3, llama3.0, mistral, mistral-v1, phi3, granite, olmo2"

/* A template by name: one of DRAY_CHAT_TEMPLATE_NAMES or an alias ("gemma3",
 * "gemma2", "qwen2", "qwen3", "mistral-v3", "phi3.5", "granite3"), without the
 * model's default system prompt ("llama3" gets the 3.1 date lines with the
 * fixed date). DRAY_ENOTSUP naming the supported ones for anything else. Free
 * with dray_chat_template_free. */
int dray_chat_template_named(const char *name, struct dray_chat_template *t, char *err,
                             size_t errlen);

/* The template for model g: the configured name when non-empty (an unknown name
 * is DRAY_ENOTSUP; a choice of the model's own family still takes the default
 * system prompt and date lines from the model's template), else recognised from
 * tokenizer.chat_template ("<start_of_turn>" -> gemma, "<|im_start|>" -> chatml,
 * "<|start_header_id|>" -> llama3 (3.0 without "Cutting Knowledge Date"),
 * "<|start_of_role|>" -> granite, "' [INST] ' + system_message" -> mistral-v1,
 * "\"[INST] \" + system_message" -> mistral, <|user|> <|assistant|> <|end|> ->
 * phi3, "'<|user|>\n' + message['content'] + '\n'" -> olmo2), else "gemma" for a
 * general.architecture starting with "gemma" (base models ship none), else NONE
 * with the reason in t->why. t is always initialised; free it with
 * dray_chat_template_free. */
int dray_chat_template_pick(const struct dray_gguf *g, const char *configured,
                            struct dray_chat_template *t, char *err, size_t errlen);
void dray_chat_template_free(struct dray_chat_template *t);

/* One rendered piece. marker: s[0..n) is the text of one control token written by
 * the template (look it up, never re-tokenize it); soft: a marker that is plain
 * text where the vocabulary lacks that token. Otherwise plain text. */
struct dray_chat_seg {
    const char *s; /* points into the template's strings or a message's content */
    size_t n;
    bool marker;
    bool soft;
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
 * end-of-turn marker END (dray_chat_turn_end: <end_of_turn>, <|im_end|>,
 * <|eot_id|>, </s>, ...). eot_in_kv says whether that
 * marker was also fed into the KV (engines usually stop without feeding it:
 * false). msgs[0..n) start with a user message and alternate; no system message.
 * The output is
 *     (eot_in_kv ? "" : END) + SEP + the turns of msgs + (generation prompt)
 * (SEP: "\n" for gemma, chatml, phi3, granite, olmo2; nothing for llama3, mistral)
 * so that, with A = {"assistant", R},
 *     render(history) + R + [END] + continuation(msgs) == render(history + A + msgs)
 * exactly (for gemma, llama3, when R is already trimmed: the full render trims
 * it; for mistral when R is " " + R trimmed; for mistral (v0.3) with a system
 * prompt the full render moves it to the newest user message, which a KV that
 * continues cannot: a continued chat keeps it in the first). */

/* The segments concatenated into one malloc'd NUL-terminated string (for tests,
 * logs, and a tokenizer's view of the whole text). t NULL = gemma. */
int dray_chat_render(const struct dray_chat_template *t, const struct dray_chat_msg *msgs, size_t n,
                     bool add_generation_prompt, char **out, char *err, size_t errlen);
int dray_chat_render_turn(const struct dray_chat_template *t, const struct dray_chat_msg *msgs,
                          size_t n, bool eot_in_kv, bool add_generation_prompt, char **out,
                          char *err, size_t errlen);

/* The marker that closes an assistant turn in t's rendering ("<end_of_turn>",
 * "<|im_end|>", "<|eot_id|>", "</s>", "<|end|>", "<|end_of_text|>",
 * "<|endoftext|>"), or NULL for style NONE. The scheduler feeds a reply's stop token
 * into the KV only when it is this marker: the next turn's prompt contains it. */
const char *dray_chat_turn_end(const struct dray_chat_template *t);

#endif
