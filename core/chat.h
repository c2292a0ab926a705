/* Chat templates, rendered in C (no Jinja). Supported: "gemma" (Gemma 3 -it;
 * shared/reference/gemma3-gguf.md §6.5), which is what its GGUF
 * tokenizer.chat_template computes:
 *
 *   <bos>                                       (always, as text)
 *   <start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n
 *   <start_of_turn>model\n{assistant}<end_of_turn>\n
 *   ...
 *   <start_of_turn>model\n                     (add_generation_prompt)
 *
 * - a first message with role "system" is folded into the first user turn: its
 *   content (NOT trimmed) + "\n\n" goes right after that turn's header;
 * - every other content is trimmed as Jinja's |trim (Python str.strip()) does;
 * - after the optional system message, roles must alternate user, assistant,
 *   user, ...; "assistant" (or "model") is written "model";
 * - anything else (an empty list, a system message alone or not first, an unknown
 *   role, two user turns in a row) is DRAY_EINVAL with a reason naming the
 *   message index. (The Jinja template would silently drop a lone system prompt;
 *   dray refuses instead of losing it.)
 *
 * Tokenize the rendered text with parse_special = true and add_bos = false: the
 * text already starts with "<bos>". */
#ifndef DRAY_CORE_CHAT_H
#define DRAY_CORE_CHAT_H

#include <stdbool.h>
#include <stddef.h>

struct dray_gguf;

struct dray_chat_msg {
    const char *role;    /* "system", "user", "assistant" (alias "model") */
    const char *content; /* UTF-8, NUL-terminated */
};

/* Template name for a model: "gemma" when tokenizer.chat_template is a Gemma turn
 * template (contains "<start_of_turn>") or, without a template (base models),
 * when general.architecture starts with "gemma"; NULL when unknown. */
const char *dray_chat_template_for(const struct dray_gguf *g);

/* Render a whole conversation. template_name: "gemma"/"gemma3", or NULL for the
 * default ("gemma"); others are DRAY_ENOTSUP. *out is malloc'd, NUL-terminated. */
int dray_chat_render(const char *template_name, const struct dray_chat_msg *msgs, size_t n,
                     bool add_generation_prompt, char **out, char *err, size_t errlen);

/* Incremental render for a conversation that continues in the same KV cache.
 *
 * Contract. The sequence in the KV holds the tokens of
 *     dray_chat_render(history, add_generation_prompt = true)
 * followed by the reply R the model generated, which ended when it sampled
 * <end_of_turn>. eot_in_kv says whether that <end_of_turn> token was also fed
 * into the KV (engines usually stop without feeding the final token: false).
 * msgs[0..n) are the NEW messages only: they start with a user message and
 * alternate. The output is
 *     (eot_in_kv ? "" : "<end_of_turn>") + "\n" + the turns of msgs
 *     + ("<start_of_turn>model\n" if add_generation_prompt)
 * so that, with A = {"assistant", R},
 *     render(history) + R + [<end_of_turn>] + render_turn(msgs)
 *         == render(history + A + msgs)
 * exactly when R is already trimmed (the full render trims it; a reply with
 * leading/trailing whitespace differs only there, in the model's own tokens).
 * Tokenize the output with parse_special = true and add_bos = false; because it
 * starts at a special token (or "\n" right after one), its tokens are the same as
 * the corresponding tokens of the full render. No system message here: a system
 * prompt belongs to the first render. */
int dray_chat_render_turn(const char *template_name, const struct dray_chat_msg *msgs, size_t n,
                          bool eot_in_kv, bool add_generation_prompt, char **out, char *err,
                          size_t errlen);

#endif
