/* server/tools.h — function calling: OpenAI's tools, tool_choice and
 * parallel_tool_calls; assistant tool_calls and tool messages in the history;
 * and the calls in a reply.
 *
 * One format for every chat family (the Hermes one that SmolLM2 and Qwen were
 * trained on): the system message lists the functions inside <tools></tools>,
 * and the model calls one as
 *   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 * (several separated by "\n" when parallel calls are allowed). The reply is
 * constrained by a grammar built from the functions' parameter schemas, so the
 * calls always parse and their arguments validate:
 *   required / a named function: the reply is calls only;
 *   auto: calls, or text that does not start with '<' (so that a reply which
 *         starts a call is one), or nothing;
 *   none: the reply is free text and the functions are not shown.
 * A tool message is rendered as a user turn holding <tool_response>...
 * </tool_response> (consecutive ones, and a user message after them, merged),
 * and an assistant message's tool_calls as the calls' text, so the
 * conversation keeps the user/assistant alternation both templates need. */
#ifndef DRAY_SERVER_TOOLS_H
#define DRAY_SERVER_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "apierr.h"
#include "request.h"

#define DRAY_SRV_MAX_TOOLS 64

enum dray_srv_tool_choice {
    DRAY_SRV_TOOLS_OFF,      /* no tools, or tool_choice "none" */
    DRAY_SRV_TOOLS_AUTO,
    DRAY_SRV_TOOLS_REQUIRED,
    DRAY_SRV_TOOLS_NAMED,    /* {"type": "function", "function": {"name": ...}} */
};

/* Read tools, tool_choice and parallel_tool_calls into req (req->tool_choice,
 * req->grammar for the calls). 0, or -1 with e filled (400 naming the field). */
int dray_srv_parse_tools(struct dray_srv_request *req, struct dray_srv_error *e);

/* Rewrite req->msgs for the template: the tools' list into the system message
 * (unless tool_choice is off), assistant tool_calls into their text, tool
 * messages into user turns. 0, or -1 with e filled. */
int dray_srv_render_tools(struct dray_srv_request *req, struct dray_srv_error *e);

/* The tool calls in a reply's text, as OpenAI's message.tool_calls (ids
 * "call_<salt>_<i>"), or NULL when the text does not hold complete calls (a
 * text answer, or a reply cut by max_tokens). */
json_t *dray_srv_tool_calls_json(const char *text, size_t len, const char *salt);

/* Where the next complete call of a streamed reply ends: the offset after its
 * "</tool_call>", looked for from text[from..len); 0 when none is complete yet. */
size_t dray_srv_tool_call_end(const char *text, size_t len, size_t from);

/* The start of a reply that is a tool call (under auto, text never begins with it). */
#define DRAY_SRV_TOOL_CALL_OPEN "<tool_call>"

#endif
