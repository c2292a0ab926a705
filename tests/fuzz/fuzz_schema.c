/* libFuzzer target: JSON Schema to GBNF (server/json_grammar.c), the input a
 * schema as a client sends it. Invariants beyond "no crash, no leak, no hang": a
 * refusal is a 400 (500 only when an allocation failed) naming a param and
 * saying why; an accepted schema's grammar is at most DRAY_SRV_GRAMMAR_MAX bytes
 * and the grammar engine compiles it (the converter never hands the server a
 * grammar it cannot use), alone and under a rule-name prefix.
 * Build and run: ci/fuzz.sh schema SECONDS. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dray/dray.h"
#include "grammar.h"
#include "json_grammar.h"

static void must_compile(const char *text, size_t len)
{
    struct dray_grammar *g = NULL;
    char err[256];
    int rc = dray_grammar_parse(text, len, &g, err, sizeof(err));
    if (rc == DRAY_ENOMEM)
        return;
    if (rc)
        abort(); /* the converter wrote a grammar the engine refuses */
    dray_grammar_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    if (!s)
        return 0;
    struct dray_srv_error e;
    memset(&e, 0, sizeof(e));
    char *gbnf = NULL;
    if (dray_srv_schema_grammar(s, "schema", &gbnf, &e)) {
        if (gbnf || !e.message[0] || (e.status != 400 && e.status != 500) ||
            (e.status == 400 && !e.param[0]))
            abort();
    } else {
        size_t len = strlen(gbnf);
        if (len > DRAY_SRV_GRAMMAR_MAX)
            abort();
        must_compile(gbnf, len);
        free(gbnf);
        /* the same schema as one tool among others */
        struct dray_srv_buf b = {0};
        const char *root = "root ::= \"a\" t0 | \"b\" t1\nt1 ::= \"x\"\n";
        if (!dray_srv_buf_add(&b, root, strlen(root)) &&
            !dray_srv_schema_rules(s, "t0", "tools[0].function.parameters", &b, &e))
            must_compile(b.data, b.len);
        dray_srv_buf_free(&b);
    }
    json_decref(s);
    return 0;
}
