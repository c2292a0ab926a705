/* server/fields.h — the one table of the request fields each endpoint with a
 * JSON body accepts. A field outside an endpoint's list is refused with 400
 * "Unrecognized request argument supplied: <name>" (OpenAI's words) naming it,
 * never silently ignored; a field dray knows but never honours is refused with
 * the reason. Fields the table lists are read by request.c and sampling.c,
 * which refuse the values they cannot honour (n > 1, logprobs, ...). */
#ifndef DRAY_SERVER_FIELDS_H
#define DRAY_SERVER_FIELDS_H

#include <jansson.h>

#include "apierr.h"

/* kind: an enum dray_srv_kind (request.h). body: the request's JSON object. A
 * key set to null counts as absent, as everywhere in the server. */
int dray_srv_check_fields(int kind, json_t *body, struct dray_srv_error *e);
/* The endpoint of a kind: "POST /v1/chat/completions", ... */
const char *dray_srv_kind_endpoint(int kind);

#endif
