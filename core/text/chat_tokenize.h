/* A rendered chat (chat.h segments) to token ids. Markers are looked up as one
 * control token each; each run of plain-text segments between markers is
 * tokenized as ONE piece of text with special-token parsing off, so message
 * content can never become a control token, and text that spans template
 * formatting and content (e.g. "user\n" + "Hello") tokenizes exactly as it would
 * inside the whole rendered string. */
#ifndef DRAY_CORE_CHAT_TOKENIZE_H
#define DRAY_CORE_CHAT_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"

struct dray_tokenizer;

/* *ids is malloc'd (non-NULL on success). DRAY_ENOTFOUND names a marker that is
 * not in the vocabulary (a template that does not fit the model). */
int dray_chat_tokenize_segs(const struct dray_tokenizer *tok, const struct dray_chat_segs *s,
                            int32_t **ids, size_t *n_ids, char *err, size_t errlen);

/* Render (dray_chat_render_segs) and tokenize in one call. */
int dray_chat_tokenize(const struct dray_tokenizer *tok, const struct dray_chat_template *t,
                       const struct dray_chat_msg *msgs, size_t n, bool continuation,
                       bool eot_in_kv, bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                       char *err, size_t errlen);

/* The tokens that follow an assistant turn's end marker in the next request's
 * prompt, up to where the next user message's text starts: the template's
 * closing text and the next user turn's header (gemma: "\n" <start_of_turn>
 * "user\n"; chatml: "\n" <|im_start|> "user\n"), tokenized as
 * dray_chat_tokenize tokenizes the whole next prompt. The header's last text run
 * is tokenized together with the message that follows it, so only the tokens
 * that come out the same whatever message follows (tried with several) are
 * given. *ids is malloc'd (non-NULL on success); DRAY_ENOTSUP for style NONE. */
int dray_chat_next_user_head(const struct dray_tokenizer *tok, const struct dray_chat_template *t,
                             int32_t **ids, size_t *n_ids, char *err, size_t errlen);

#endif
