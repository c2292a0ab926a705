/* server/json_grammar.h — JSON Schema to GBNF (core/text/grammar.h's dialect, which
 * is llama.cpp's) for structured output: response_format "json_object" and
 * "json_schema", and the arguments of tool calls. A schema is honoured exactly
 * or refused: a keyword the converter cannot enforce is a 400 naming it
 * ("response_format.json_schema.schema.properties.age.multipleOf"), never
 * ignored. docs/server.md "Structured output: JSON Schema keywords" lists what
 * is supported and the choices made (whitespace, additionalProperties).
 *
 * What "exactly" means: the grammar accepts no document the schema rejects,
 * and every value the schema accepts in at least one spelling (the one a JSON
 * encoder writes: members in the schema's order, no more than
 * DRAY_SRV_JSON_WS_MAX whitespace characters between tokens, numbers under
 * bounds without exponent). */
#ifndef DRAY_SERVER_JSON_GRAMMAR_H
#define DRAY_SERVER_JSON_GRAMMAR_H

#include <jansson.h>

#include "apierr.h"
#include "buf.h"

#define DRAY_SRV_SCHEMA_MAX_DEPTH 32       /* nested schemas deeper than this: 400 */
#define DRAY_SRV_GRAMMAR_MAX (64 * 1024)   /* bytes of GBNF one schema may become */
#define DRAY_SRV_SCHEMA_MAX_KEY 128        /* code points of a property name when other
                                            * keys are refused: the grammar nests a group
                                            * per code point */
#define DRAY_SRV_SCHEMA_MAX_REPEAT 1000    /* largest minLength, maxItems, {m,n}, ... */
#define DRAY_SRV_JSON_WS_MAX 20            /* whitespace between two tokens: [ \t\n]{0,20} */

/* GBNF whose root matches any JSON object (response_format "json_object":
 * OpenAI requires an object at the top). Static; NULL only when out of memory. */
const char *dray_srv_json_object_grammar(void);

/* GBNF text (malloc'd, into *gbnf) whose root matches the JSON documents valid
 * under schema (an object, or true). param names the schema in errors
 * ("response_format.json_schema.schema"). Returns 0, or -1 with e filled: 400
 * naming the keyword at fault, 500 when out of memory. */
int dray_srv_schema_grammar(json_t *schema, const char *param, char **gbnf,
                            struct dray_srv_error *e);

/* The same rules appended to out, for a grammar that holds several schemas (one
 * per tool): every rule is named prefix or "prefix-...", and the one named
 * prefix matches the schema's documents (the caller refers to it from its own
 * rules). prefix: [a-zA-Z0-9_]+, distinct per schema and from the caller's rule
 * names (else 500). The limits hold per schema: the caller's whole grammar still
 * goes through dray_grammar_parse, which has its own. On failure out is as it
 * was. */
int dray_srv_schema_rules(json_t *schema, const char *prefix, const char *param,
                          struct dray_srv_buf *out, struct dray_srv_error *e);

/* A request's response_format object: {"type": "text"} gives *gbnf = NULL;
 * {"type": "json_object"} the object grammar; {"type": "json_schema",
 * "json_schema": {"name", "schema", "description", "strict"}} the schema's. The
 * grammar is malloc'd. Returns 0, or -1 with e filled (400 naming the field). */
int dray_srv_response_format_grammar(json_t *rf, char **gbnf, struct dray_srv_error *e);

#endif
