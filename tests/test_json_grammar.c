/* JSON Schema to GBNF (server/json_grammar.c), specified by examples: each
 * schema's grammar is compiled by the grammar engine (core/text/grammar.h) and fed
 * documents it must accept and documents it must refuse; each keyword the
 * converter cannot honour exactly is a 400 naming it.
 *
 * Schemas and documents are written with ' for " (the helper swaps them) so the
 * tables stay readable; a real apostrophe is never needed here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "grammar.h"
#include "json_grammar.h"

/* s with every ' turned into " (static buffer, one at a time per slot) */
static const char *dq(const char *s, int slot)
{
    static char buf[4][8192];
    size_t n = strlen(s);
    assert_true(n < sizeof(buf[0]));
    for (size_t i = 0; i <= n; i++)
        buf[slot][i] = s[i] == '\'' ? '"' : s[i];
    return buf[slot];
}

static json_t *load(const char *text)
{
    json_error_t je;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
    if (!v)
        fail_msg("test table: not JSON (%s): %s", je.text, text);
    return v;
}

static char *grammar_of(const char *schema)
{
    json_t *s = load(dq(schema, 0));
    struct dray_srv_error e = {0};
    char *g = NULL;
    if (dray_srv_schema_grammar(s, "schema", &g, &e))
        fail_msg("refused %s: %d [%s] %s", schema, e.status, e.param, e.message);
    json_decref(s);
    return g;
}

static struct dray_grammar *compile(const char *gbnf)
{
    struct dray_grammar *g = NULL;
    char err[256];
    if (dray_grammar_parse(gbnf, strlen(gbnf), &g, err, sizeof(err)))
        fail_msg("the grammar engine refuses the converter's output: %s\n%s", err, gbnf);
    return g;
}

/* the whole document is a sentence of the grammar */
static bool accepts(const struct dray_grammar *g, const char *doc)
{
    struct dray_grammar_matcher *m;
    assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
    bool ok = dray_grammar_accept_bytes(m, doc, strlen(doc)) == 0 && dray_grammar_can_end(m);
    dray_grammar_matcher_free(m);
    return ok;
}

#define MAX_DOCS 16

struct example {
    const char *what;
    const char *schema;
    const char *accept[MAX_DOCS];
    const char *reject[MAX_DOCS];
};

static void run_examples(const struct example *ex, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *gbnf = grammar_of(ex[i].schema);
        struct dray_grammar *g = compile(gbnf);
        for (size_t k = 0; k < MAX_DOCS && ex[i].accept[k]; k++) {
            const char *doc = dq(ex[i].accept[k], 1);
            json_decref(load(doc)); /* the table's own check: accepted documents are JSON */
            if (!accepts(g, doc))
                fail_msg("%s: %s\nshould accept %s\ngrammar:\n%s", ex[i].what, ex[i].schema, doc,
                         gbnf);
        }
        for (size_t k = 0; k < MAX_DOCS && ex[i].reject[k]; k++) {
            const char *doc = dq(ex[i].reject[k], 1);
            if (accepts(g, doc))
                fail_msg("%s: %s\nshould refuse %s\ngrammar:\n%s", ex[i].what, ex[i].schema, doc,
                         gbnf);
        }
        dray_grammar_free(g);
        free(gbnf);
    }
}

/* ------------------------------------------------------------ objects */

static const struct example objects[] = {
    {"nested objects, required and optional members in the schema's order",
     "{'type':'object','properties':{'name':{'type':'string'},"
     "'age':{'type':'integer','minimum':0,'maximum':150},"
     "'address':{'type':'object','properties':{'street':{'type':'string'},"
     "'city':{'type':'string'}},"
     "'required':['city']}},'required':['name','address']}",
     {"{'name':'Ada','age':36,'address':{'street':'1 Main St','city':'London'}}",
      "{'name':'Ada','address':{'city':'London'}}",
      "{ 'name' : 'Ada' , 'address' : { 'city' : 'Paris' } }",
      "{\n  'name': 'Ada',\n  'age': 150,\n  'address': {\n    'city': 'Oslo'\n  }\n}"},
     {"{'name':'Ada'}",                                          /* address required */
      "{'address':{'city':'London'},'name':'Ada'}",              /* out of order */
      "{'name':'Ada','address':{'city':'London'},'zip':1}",      /* no extra keys */
      "{'name':'Ada','age':151,'address':{'city':'London'}}",
      "{'name':'Ada','age':-1,'address':{'city':'London'}}",
      "{'name':'Ada','age':1.5,'address':{'city':'London'}}",
      "{'name':'Ada','address':{'street':'x'}}",
      "{'name':'Ada','name':'Bob','address':{'city':'x'}}",
      "{'name':1,'address':{'city':'London'}}", "[]", "'x'"}},
    {"all optional: any subset, in order",
     "{'type':'object','properties':{'a':{'type':'integer'},'b':{'type':'integer'},"
     "'c':{'type':'integer'}}}",
     {"{}", "{'a':1}", "{'b':2}", "{'c':3}", "{'a':1,'c':3}", "{'b':2,'c':3}",
      "{'a':1,'b':2,'c':3}", "{ }"},
     {"{'b':2,'a':1}", "{'a':1,}", "{,'a':1}", "{'a':1 'b':2}", "{'d':4}", "{'a':1,'a':1}"}},
    {"a required member in the middle",
     "{'type':'object','properties':{'a':{},'b':{'type':'boolean'},'c':{}},'required':['b']}",
     {"{'b':true}", "{'a':null,'b':false}", "{'b':true,'c':[1,{'x':2}]}", "{'a':1,'b':true,'c':2}"},
     {"{}", "{'a':1}", "{'a':1,'c':2}", "{'b':1}"}},
    {"additionalProperties: a schema, keys other than the declared ones",
     "{'type':'object','properties':{'a':{'type':'string'},'ab':{'type':'integer'}},"
     "'additionalProperties':{'type':'boolean'}}",
     {"{}", "{'a':'x'}", "{'ab':1}", "{'a':'x','ab':2}", "{'b':true}", "{'abc':false}",
      "{'':true}", "{'a':'x','z':true,'y':false}", "{'A':true}"},
     {"{'a':true}",          /* a declared key takes its own schema */
      "{'ab':true}", "{'z':1}", "{'z':true,'a':'x'}",
      "{'\\u0061':true}", "{'\\u0061b':true}"}}, /* "a" and "ab" spelled otherwise */
    {"additionalProperties true",
     "{'type':'object','properties':{'id':{'type':'integer'}},'required':['id'],"
     "'additionalProperties':true}",
     {"{'id':1}", "{'id':1,'x':[1,2],'y':{'z':null}}"},
     {"{'x':1}", "{'id':'1'}", "{'id':1,'id':2}"}},
    {"a map: additionalProperties alone",
     "{'type':'object','additionalProperties':{'type':'integer','minimum':0}}",
     {"{}", "{'a':1}", "{'a':1,'b':0,'c':99}"},
     {"{'a':-1}", "{'a':'1'}", "[1]"}},
    {"type object with no properties: any object",
     "{'type':'object'}",
     {"{}", "{'a':1}", "{'a':{'b':[true,null,'x',1.5e3]}}"},
     {"[]", "1", "'{}'"}},
    {"a property whose schema is false may not appear",
     "{'type':'object','properties':{'a':{'type':'integer'},'secret':false},"
     "'additionalProperties':true}",
     {"{'a':1}", "{'a':1,'b':2}", "{'secretive':1}"},
     {"{'secret':1}", "{'a':1,'secret':1}"}},
    {"only a false property: every other key",
     "{'type':'object','properties':{'secret':false},'additionalProperties':true}",
     {"{}", "{'a':1}", "{'secrets':1,'b':[]}"}, {"{'secret':1}", "{'a':1,'secret':null}"}},
    {"OpenAI strict mode: every member required, anyOf with null",
     "{'type':'object','properties':{'city':{'type':'string'},"
     "'unit':{'anyOf':[{'type':'string','enum':['c','f']},{'type':'null'}]}},"
     "'required':['city','unit'],'additionalProperties':false}",
     {"{'city':'Oslo','unit':'c'}", "{'city':'Oslo','unit':null}"},
     {"{'city':'Oslo'}", "{'city':'Oslo','unit':'k'}", "{'city':'Oslo','unit':'C'}"}},
};

static void test_objects(void **state)
{
    (void)state;
    run_examples(objects, sizeof(objects) / sizeof(objects[0]));
}

/* ------------------------------------------------------------ arrays */

static const struct example arrays[] = {
    {"items with minItems and maxItems",
     "{'type':'array','items':{'type':'string'},'minItems':1,'maxItems':3}",
     {"['a']", "['a','b']", "['a','b','c']", "[ 'a' , 'b' ]"},
     {"[]", "['a','b','c','d']", "[1]", "['a',]", "{}"}},
    {"prefixItems, then nothing (items false)",
     "{'type':'array','prefixItems':[{'type':'string'},{'type':'integer'}],'items':false}",
     {"[]", "['a']", "['a',1]"},
     {"['a',1,2]", "[1]", "['a','b']"}},
    {"prefixItems, then items, with bounds",
     "{'type':'array','prefixItems':[{'type':'boolean'}],'items':{'type':'null'},"
     "'minItems':2,'maxItems':3}",
     {"[true,null]", "[false,null,null]"},
     {"[true]", "[true,null,null,null]", "[null,null]", "[true,true]"}},
    {"prefixItems, then anything (items absent)",
     "{'type':'array','prefixItems':[{'const':'op'}]}",
     {"[]", "['op']", "['op',1,{'a':[]}]"},
     {"['x']", "[1,'op']"}},
    {"arrays of arrays of bounded numbers",
     "{'type':'array','items':{'type':'array','items':{'type':'number','minimum':0,'maximum':1}}}",
     {"[]", "[[]]", "[[0,0.5,1],[0.25]]", "[[1.0]]"},
     {"[[1.5]]", "[[-0.1]]", "[0]"}},
    {"maxItems 0", "{'type':'array','maxItems':0}", {"[]", "[ ]"}, {"[1]"}},
};

static void test_arrays(void **state)
{
    (void)state;
    run_examples(arrays, sizeof(arrays) / sizeof(arrays[0]));
}

/* ------------------------------------------------------------ numbers */

static const struct example numbers[] = {
    {"integer 0..150", "{'type':'integer','minimum':0,'maximum':150}",
     {"0", "7", "10", "99", "100", "149", "150"},
     /* -0, 1.0 and 1e2 are integers in range, but spelled as no encoder writes them:
      * under bounds the grammar takes the plain spelling only */
     {"-1", "151", "200", "1000", "007", "01", "-0", "1.0", "1e2", "", "-"}},
    {"integer -40..40", "{'type':'integer','minimum':-40,'maximum':40}",
     {"-40", "-39", "-9", "-1", "0", "1", "9", "10", "39", "40"},
     {"-41", "41", "-50", "50", "400", "-400", "-0", "--1"}},
    {"integer, exclusive bounds", "{'type':'integer','exclusiveMinimum':0,'exclusiveMaximum':10}",
     {"1", "5", "9"}, {"0", "10", "-1", "11"}},
    {"integer, fractional bounds round inwards",
     "{'type':'integer','minimum':-2.5,'exclusiveMaximum':3.5}",
     {"-2", "0", "3"}, {"-3", "4"}},
    {"integer, only a lower bound", "{'type':'integer','minimum':18}",
     {"18", "19", "99", "100", "123456789012345"}, {"17", "0", "-18", "9"}},
    {"integer, non-negative", "{'type':'integer','minimum':0}",
     {"0", "1", "9", "10", "1234567"}, {"-1", "00", "01", "-0"}},
    {"integer, only an upper bound", "{'type':'integer','maximum':-5}",
     {"-5", "-6", "-10", "-99999"}, {"-4", "0", "5"}},
    {"integers as wide as JSON numbers go in practice",
     "{'type':'integer','minimum':-9007199254740991,'maximum':9007199254740991}",
     {"-9007199254740991", "0", "9007199254740991", "9007199254740990", "1000000000000000"},
     {"9007199254740992", "-9007199254740992", "10000000000000000"}},
    {"number 0.5..99.5", "{'type':'number','minimum':0.5,'maximum':99.5}",
     {"0.5", "0.50", "0.75", "1", "1.0", "42.125", "99", "99.5", "99.50"},
     {"0.49", "0.4999", "0", "99.51", "100", "-1", "5e1", ".5", "1."}},
    {"number, exclusive bounds around zero",
     "{'type':'number','exclusiveMinimum':-1.5,'exclusiveMaximum':2.25}",
     {"-1.49", "-1", "-0.5", "0", "0.0", "2", "2.2", "2.249"},
     {"-1.5", "-1.50", "-2", "2.25", "2.250", "3", "-0"}},
    {"number, a positive exclusive minimum", "{'type':'number','exclusiveMinimum':0}",
     {"0.001", "1", "123.5"}, {"0", "0.0", "-0.001", "-1"}},
    {"number without bounds: the whole JSON syntax", "{'type':'number'}",
     {"0", "-0", "1.5", "-2e10", "3E-2", "1e+5"}, {"01", "1.", ".5", "+1", "NaN", "Infinity"}},
};

static void test_numbers(void **state)
{
    (void)state;
    run_examples(numbers, sizeof(numbers) / sizeof(numbers[0]));
}

/* Every integer in -400..400 against bounds drawn from -300..300 (and halves):
 * the grammar accepts exactly those in range, in their plain spelling. */
static void test_integer_ranges_sweep(void **state)
{
    (void)state;
    srand(7);
    static const char *const kws[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int trial = 0; trial < 150; trial++) {
        json_t *s = json_pack("{s:s}", "type", "integer");
        double b[4];
        bool set[4];
        for (int k = 0; k < 4; k++) {
            set[k] = rand() % 3 == 0;
            b[k] = (rand() % 601 - 300) / (rand() % 4 == 0 ? 2.0 : 1.0);
            if (set[k])
                json_object_set_new(s, kws[k], b[k] == (long)b[k] ? json_integer((long)b[k])
                                                                   : json_real(b[k]));
        }
        bool any = false;
        for (int v = -400; v <= 400; v++)
            any = any || ((!set[0] || v >= b[0]) && (!set[1] || v > b[1]) &&
                          (!set[2] || v <= b[2]) && (!set[3] || v < b[3]));
        struct dray_srv_error e = {0};
        char *gbnf = NULL;
        int rc = dray_srv_schema_grammar(s, "schema", &gbnf, &e);
        char *text = json_dumps(s, JSON_COMPACT);
        if (rc) {
            if (any || !strstr(e.message, "no number"))
                fail_msg("%s refused: %s", text, e.message);
        } else {
            struct dray_grammar *g = compile(gbnf);
            for (int v = -400; v <= 400; v++) {
                bool want = (!set[0] || v >= b[0]) && (!set[1] || v > b[1]) &&
                            (!set[2] || v <= b[2]) && (!set[3] || v < b[3]);
                char doc[16];
                snprintf(doc, sizeof(doc), "%d", v);
                if (accepts(g, doc) != want)
                    fail_msg("%s: %s should be %s\n%s", text, doc,
                             want ? "accepted" : "refused", gbnf);
            }
            if (set[0] || set[1] || set[2] || set[3]) /* without bounds: any JSON integer */
                assert_false(accepts(g, "-0"));
            dray_grammar_free(g);
        }
        free(text);
        free(gbnf);
        json_decref(s);
    }
}

/* Decimals with up to three places against bounds with up to two */
static void test_number_ranges_sweep(void **state)
{
    (void)state;
    srand(11);
    static const char *const kws[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int trial = 0; trial < 120; trial++) {
        json_t *s = json_pack("{s:s}", "type", "number");
        long b[4]; /* thousandths */
        bool set[4];
        for (int k = 0; k < 4; k++) {
            set[k] = rand() % 3 == 0;
            int places = rand() % 3;
            long v = rand() % 4001 - 2000; /* hundredths */
            if (places == 0)
                v = v / 100 * 100;
            else if (places == 1)
                v = v / 10 * 10;
            b[k] = v * 10;
            if (set[k])
                json_object_set_new(s, kws[k], places ? json_real(v / 100.0)
                                                      : json_integer(v / 100));
        }
#define IN(x) ((!set[0] || (x) >= b[0]) && (!set[1] || (x) > b[1]) && (!set[2] || (x) <= b[2]) && \
               (!set[3] || (x) < b[3]))
        bool any = false;
        for (long x = -25000; x <= 25000 && !any; x++)
            any = IN(x);
        struct dray_srv_error e = {0};
        char *gbnf = NULL;
        int rc = dray_srv_schema_grammar(s, "schema", &gbnf, &e);
        char *text = json_dumps(s, JSON_COMPACT);
        if (rc) {
            if (any || !strstr(e.message, "no number"))
                fail_msg("%s refused: %s", text, e.message);
        } else {
            struct dray_grammar *g = compile(gbnf);
            for (long x = -25000; x <= 25000; x += 1 + rand() % 7) {
                long a = x < 0 ? -x : x;
                char doc[4][32];
                /* 1.250, 1.25 and (when whole) 1 and 1.0 */
                snprintf(doc[0], 32, "%s%ld.%03ld", x < 0 ? "-" : "", a / 1000, a % 1000);
                snprintf(doc[1], 32, "%s", doc[0]);
                for (size_t n = strlen(doc[1]); doc[1][n - 1] == '0'; n--)
                    doc[1][n - 1] = '\0';
                size_t n = strlen(doc[1]);
                if (doc[1][n - 1] == '.')
                    doc[1][n - 1] = '\0';
                snprintf(doc[2], 32, "%s.0", doc[1]);
                snprintf(doc[3], 32, "%s", doc[1]);
                bool zero = x == 0;
                for (int k = 0; k < 4; k++) {
                    if (k >= 2 && a % 1000)
                        continue;
                    bool bounded = set[0] || set[1] || set[2] || set[3];
                    bool want = IN(x) && !(bounded && zero && doc[k][0] == '-');
                    if (accepts(g, doc[k]) != want)
                        fail_msg("%s: %s should be %s\n%s", text, doc[k],
                                 want ? "accepted" : "refused", gbnf);
                }
            }
            dray_grammar_free(g);
        }
#undef IN
        free(text);
        free(gbnf);
        json_decref(s);
    }
}

/* ------------------------------------------------------------ strings */

static const struct example strings[] = {
    {"any string: escapes, UTF-8, surrogate pairs", "{'type':'string'}",
     {"''", "'abc'", "'caf\xc3\xa9'", "'\\u00e9'", "'\\ud83d\\ude00'", "'\xf0\x9f\x98\x80'",
      "'a\\'b'", "'\\\\'", "'\\n\\t\\/\\b\\f\\r'"},
     {"'\\ud83d'", "'\\ude00'", "'\\x41'", "'\\u00e'", "'a\nb'", "'\\'", "'a'b'"}},
    {"minLength and maxLength count characters, not bytes",
     "{'type':'string','minLength':2,'maxLength':4}",
     {"'ab'", "'abcd'", "'\xc3\xa9\xc3\xa9'", "'\\u00e9\\n'", "'\\ud83d\\ude00x'"},
     {"''", "'a'", "'abcde'", "'\xc3\xa9'", "'\\ud83d\\ude00'"}},
    {"pattern ^[A-Z]{2}-[0-9]{3}$", "{'type':'string','pattern':'^[A-Z]{2}-[0-9]{3}$'}",
     {"'AB-123'", "'ZZ-000'"}, {"'ab-123'", "'AB-12'", "'AB-1234'", "'AB123'", "'xAB-123'"}},
    {"an unanchored pattern matches anywhere", "{'type':'string','pattern':'[0-9]+'}",
     {"'1'", "'abc1'", "'a1b'", "'\xc3\xa9 42 \\n'"}, {"''", "'abc'"}},
    {"pattern alternation with anchors per branch", "{'type':'string','pattern':'^ab|cd$'}",
     {"'ab'", "'abx'", "'cd'", "'xcd'"}, {"'xab'", "'cdx'", "''"}},
    {"pattern: groups, classes, escapes",
     "{'type':'string','pattern':'^(?:[a-z_][\\\\w-]*)(\\\\.[a-z]+){0,2}$'}",
     {"'ab'", "'_x-1.com'", "'a.b.c'"}, {"'1a'", "'a.b.c.d'", "'a.'", "'A'"}},
    {"pattern: characters JSON escapes", "{'type':'string','pattern':'^[\\\"\\\\\\\\\\\\n]+$'}",
     {"'\\''", "'\\\\'", "'\\n'", "'\\u000a'", "'\\'\\\\\\n'"}, {"'x'", "''"}},
    {"format date: days per month, leap years", "{'type':'string','format':'date'}",
     {"'2024-02-29'", "'2000-02-29'", "'2023-01-31'", "'2023-04-30'", "'1999-12-01'"},
     {"'2023-02-29'", "'1900-02-29'", "'2023-04-31'", "'2023-13-01'", "'2023-00-10'",
      "'2023-01-00'", "'23-01-01'", "'2023-1-01'"}},
    {"format time", "{'type':'string','format':'time'}",
     {"'00:00:00Z'", "'23:59:59.123+05:30'", "'12:30:00-08:00'"},
     {"'24:00:00Z'", "'12:60:00Z'", "'12:30:00'", "'12:30Z'"}},
    {"format date-time", "{'type':'string','format':'date-time'}",
     {"'2024-02-29T12:00:00Z'"}, {"'2024-02-29 12:00:00Z'", "'2024-02-29'"}},
    {"format uuid", "{'type':'string','format':'uuid'}",
     {"'123e4567-e89b-12d3-a456-426614174000'", "'123E4567-E89B-12D3-A456-426614174000'"},
     {"'123e4567e89b12d3a456426614174000'", "'123e4567-e89b-12d3-a456-42661417400'"}},
};

static void test_strings(void **state)
{
    (void)state;
    run_examples(strings, sizeof(strings) / sizeof(strings[0]));
}

/* ------------------------------------------------------------ combinators */

static const struct example combinators[] = {
    {"enum of mixed types", "{'enum':['red',1,2.5,null,true,{'a':[1]},[]]}",
     {"'red'", "1", "2.5", "null", "true", "{'a':[1]}", "{ 'a' : [ 1 ] }", "[]"},
     {"'Red'", "2", "false", "{'a':[2]}", "[1]", "'1'"}},
    {"enum filtered by type", "{'type':'string','enum':['a',1,'b']}",
     {"'a'", "'b'"}, {"1", "'c'"}},
    {"const", "{'const':{'kind':'fixed'}}", {"{'kind':'fixed'}"}, {"{'kind':'other'}", "{}"}},
    {"anyOf with null", "{'anyOf':[{'type':'string','maxLength':3},{'type':'null'}]}",
     {"'abc'", "null"}, {"'abcd'", "1"}},
    {"oneOf is taken as anyOf", "{'oneOf':[{'type':'integer'},{'type':'boolean'}]}",
     {"1", "true"}, {"'1'", "null"}},
    {"a tagged union as pydantic writes it (discriminator is a hint)",
     "{'oneOf':[{'$ref':'#/$defs/Cat'},{'$ref':'#/$defs/Dog'}],"
     "'discriminator':{'propertyName':'kind','mapping':{'cat':'#/$defs/Cat','dog':'#/$defs/Dog'}},"
     "'$defs':{'Cat':{'type':'object','properties':{'kind':{'const':'cat'},"
     "'lives':{'type':'integer','minimum':0,'maximum':9}},'required':['kind','lives']},"
     "'Dog':{'type':'object','properties':{'kind':{'const':'dog'},'name':{'type':'string'}},"
     "'required':['kind','name']}}}",
     {"{'kind':'cat','lives':9}", "{'kind':'dog','name':'Rex'}"},
     {"{'kind':'cat','name':'Rex'}", "{'kind':'dog','lives':1}", "{'kind':'cat','lives':10}"}},
    {"a list of types", "{'type':['string','null'],'minLength':1}",
     {"'a'", "null"}, {"''", "1"}},
    {"integer and number together: number", "{'type':['integer','number'],'maximum':1}",
     {"1", "0.5", "-3"}, {"1.5", "2"}},
    {"the empty schema: any JSON value", "{}",
     {"null", "0", "'x'", "[1,{'a':[]}]", "{'a':{'b':null}}", "true"}, {"", "nul", "[1,]"}},
    {"allOf with one member, $ref to definitions (pydantic style)",
     "{'type':'object','properties':{'color':{'allOf':[{'$ref':'#/definitions/Color'}],"
     "'description':'the colour'}},'required':['color'],"
     "'definitions':{'Color':{'title':'Color','enum':['red','green']}}}",
     {"{'color':'red'}", "{'color':'green'}"}, {"{'color':'blue'}", "{}"}},
    {"$ref recursion: a tree",
     "{'$defs':{'node':{'type':'object','properties':{'value':{'type':'integer'},"
     "'children':{'type':'array','items':{'$ref':'#/$defs/node'}}},'required':['value'],"
     "'additionalProperties':false}},'$ref':'#/$defs/node'}",
     {"{'value':1}", "{'value':1,'children':[]}",
      "{'value':1,'children':[{'value':2},{'value':3,'children':[{'value':4}]}]}"},
     {"{'value':1,'children':[{}]}", "{'children':[]}", "{'value':1,'children':[{'value':'x'}]}"}},
    {"$ref to the root: a recursive list", "{'type':'array','items':{'$ref':'#'},'maxItems':2}",
     {"[]", "[[]]", "[[],[[],[]]]"}, {"[[],[],[]]", "[1]"}},
};

static void test_combinators(void **state)
{
    (void)state;
    run_examples(combinators, sizeof(combinators) / sizeof(combinators[0]));
}

/* ------------------------------------------------------------ generating through the mask */

/* A toy vocabulary: every byte alone (so UTF-8 characters arrive split), the
 * end of generation, and a few longer pieces as a BPE vocabulary has them. */
static const char *const pieces_long[] = {
    "{\"", "\":", "\": ", "\", \"", "true", "false", "null", "  ", "\n  ", "12", "-3", "0.5", "e+",
    "\\u00e9", "\\n", "\xc3\xa9", "\xf0\x9f\x98\x80", "name", "\"}", "]}", "[{",
};
#define N_LONG (sizeof(pieces_long) / sizeof(pieces_long[0]))
#define EOG 256
#define N_VOCAB (257 + N_LONG)

static struct dray_grammar_vocab *toy_vocab(void)
{
    static char bytes[256];
    const char *pieces[N_VOCAB];
    uint32_t lens[N_VOCAB];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    pieces[EOG] = "";
    lens[EOG] = 0;
    for (size_t i = 0; i < N_LONG; i++) {
        pieces[257 + i] = pieces_long[i];
        lens[257 + i] = (uint32_t)strlen(pieces_long[i]);
    }
    int32_t eog = EOG;
    struct dray_grammar_vocab *v = NULL;
    char err[128];
    if (dray_grammar_vocab_new(N_VOCAB, pieces, lens, &eog, 1, &v, err, sizeof(err)))
        fail_msg("toy vocabulary: %s", err);
    return v;
}

/* Random walks: at each step a token the mask allows (closing ones favoured, so
 * walks end). The mask never leaves a walk stuck short of a document, and each
 * finished walk is JSON that a fresh matcher accepts whole. */
static int walk(const char *schema, const struct dray_grammar_vocab *v, int walks)
{
    char *gbnf = grammar_of(schema);
    struct dray_grammar *g = compile(gbnf);
    static const int closers[] = {'"', '}', ']', EOG, '0', '1', 't', 'n', '[', '{'};
    uint32_t allow[(N_VOCAB + 31) / 32];
    char out[4096];
    int finished = 0;
    for (int w = 0; w < walks; w++) {
        struct dray_grammar_matcher *m;
        assert_int_equal(dray_grammar_matcher_new(g, &m), 0);
        size_t n = 0;
        bool ended = false;
        for (int step = 0; step < 600 && !ended; step++) {
            long k = dray_grammar_allowed(m, v, allow);
            assert_true(k >= 0);
            if (k == 0)
                fail_msg("%s: a dead end after %.*s\n%s", schema, (int)n, out, gbnf);
#define ALLOWED(id) ((allow[(id) / 32] >> ((id) % 32)) & 1u)
            int pick = -1;
            if (rand() % 3) { /* favour a token that closes something */
                int c = closers[rand() % (sizeof(closers) / sizeof(closers[0]))];
                if (ALLOWED(c))
                    pick = c;
            }
            while (pick < 0) {
                int id = rand() % N_VOCAB;
                if (ALLOWED(id))
                    pick = id;
            }
#undef ALLOWED
            if (pick == EOG) {
                assert_true(dray_grammar_can_end(m));
                ended = true;
                break;
            }
            size_t len = pick < 256 ? 1 : strlen(pieces_long[pick - 257]);
            const char *bytes = pick < 256 ? (const char[]){(char)pick} : pieces_long[pick - 257];
            if (n + len >= sizeof(out))
                break;
            assert_int_equal(dray_grammar_accept_token(m, v, pick), 0);
            memcpy(out + n, bytes, len);
            n += len;
            if (dray_grammar_must_end(m))
                ended = true;
        }
        dray_grammar_matcher_free(m);
        if (!ended)
            continue;
        finished++;
        out[n] = '\0';
        json_error_t je;
        json_t *doc = json_loads(out, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
        /* JSON puts no bound on exponents; jansson refuses what overflows a double */
        if (!doc && !strstr(je.text, "overflow"))
            fail_msg("%s: the mask let through %s, not JSON (%s)\n%s", schema, out, je.text, gbnf);
        json_decref(doc);
        if (!accepts(g, out))
            fail_msg("%s: generated %s, which the matcher then refuses", schema, out);
    }
    dray_grammar_free(g);
    free(gbnf);
    return finished;
}

static void test_generate_through_the_mask(void **state)
{
    (void)state;
    srand(3);
    struct dray_grammar_vocab *v = toy_vocab();
#define N(t) (sizeof(t) / sizeof((t)[0]))
    const struct example *tables[] = {objects, arrays, numbers, strings, combinators};
    const size_t sizes[] = {N(objects), N(arrays), N(numbers), N(strings), N(combinators)};
#undef N
    int walks = 0, finished = 0;
    for (size_t t = 0; t < 5; t++)
        for (size_t i = 0; i < sizes[t]; i++, walks += 24)
            finished += walk(tables[t][i].schema, v, 24);
    /* most end (a pattern's literal part is rarely spelled at random) */
    if (finished < walks * 3 / 4)
        fail_msg("only %d of %d walks reached the end of a document", finished, walks);
    dray_grammar_vocab_free(v);
}

/* ------------------------------------------------------------ whitespace */

static void test_whitespace_is_bounded(void **state)
{
    (void)state;
    char *gbnf = grammar_of("{'type':'object','properties':{'a':{'type':'integer'}}}");
    struct dray_grammar *g = compile(gbnf);
    char doc[128];
    snprintf(doc, sizeof(doc), "{%*s\"a\":1}", DRAY_SRV_JSON_WS_MAX, "");
    assert_true(accepts(g, doc));
    snprintf(doc, sizeof(doc), "{%*s\"a\":1}", DRAY_SRV_JSON_WS_MAX + 1, "");
    assert_false(accepts(g, doc));
    assert_true(accepts(g, "{\n\t\"a\" :\n 1\n}"));
    assert_false(accepts(g, " {\"a\":1}"));  /* none before the document */
    assert_false(accepts(g, "{\"a\":1} "));  /* nor after: it ends at its last token */
    assert_false(accepts(g, "{\r\"a\":1}")); /* space, tab and newline only */
    dray_grammar_free(g);
    free(gbnf);
}

/* ------------------------------------------------------------ json_object, response_format */

static void test_json_object_grammar(void **state)
{
    (void)state;
    const char *gbnf = dray_srv_json_object_grammar();
    assert_non_null(gbnf);
    assert_ptr_equal(gbnf, dray_srv_json_object_grammar());
    struct dray_grammar *g = compile(gbnf);
    static const char *const ok[] = {"{}", "{\"a\":1}", "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}",
                                     "{ \"x\" : { } }"};
    static const char *const no[] = {"[]", "1", "\"x\"", "null", "{\"a\"}", "{\"a\":1,}", "{a:1}"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        assert_true(accepts(g, ok[i]));
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        assert_false(accepts(g, no[i]));
    dray_grammar_free(g);
}

static int response_format(const char *rf, char **gbnf, struct dray_srv_error *e)
{
    json_t *v = load(dq(rf, 2));
    memset(e, 0, sizeof(*e));
    int rc = dray_srv_response_format_grammar(v, gbnf, e);
    json_decref(v);
    return rc;
}

static void test_response_format(void **state)
{
    (void)state;
    struct dray_srv_error e;
    char *gbnf = (char *)1;
    assert_int_equal(response_format("{'type':'text'}", &gbnf, &e), 0);
    assert_null(gbnf);
    assert_int_equal(response_format("{'type':'json_object'}", &gbnf, &e), 0);
    assert_string_equal(gbnf, dray_srv_json_object_grammar());
    free(gbnf);
    assert_int_equal(response_format("{'type':'json_schema','json_schema':{'name':'w',"
                                     "'strict':true,"
                                     "'description':'d','schema':{'type':'object','properties':"
                                     "{'n':{'type':'integer','minimum':1}},'required':['n'],"
                                     "'additionalProperties':false}}}",
                                     &gbnf, &e),
                     0);
    struct dray_grammar *g = compile(gbnf);
    assert_true(accepts(g, "{\"n\":3}"));
    assert_false(accepts(g, "{\"n\":0}"));
    dray_grammar_free(g);
    free(gbnf);

    static const struct {
        const char *rf, *param;
    } refused[] = {
        {"{'type':'xml'}", "response_format.type"},
        {"{'type':'json_schema'}", "response_format.json_schema"},
        {"{'type':'json_schema','json_schema':{'schema':{}}}", "response_format.json_schema.name"},
        {"{'type':'json_schema','json_schema':{'name':'x','strict':'yes'}}",
         "response_format.json_schema.strict"},
        {"{'type':'json_schema','json_schema':{'name':'x','extra':1}}",
         "response_format.json_schema.extra"},
        {"{'type':'json_object','json_schema':{}}", "response_format.json_schema"},
        {"{'type':'json_schema','json_schema':{'name':'x','schema':{'type':'integer',"
         "'multipleOf':2}}}",
         "response_format.json_schema.schema.multipleOf"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        gbnf = NULL;
        if (response_format(refused[i].rf, &gbnf, &e) == 0)
            fail_msg("accepted %s", refused[i].rf);
        assert_null(gbnf);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, refused[i].param);
    }
}

/* ------------------------------------------------------------ several schemas in one grammar */

static void test_rules_under_a_prefix(void **state)
{
    (void)state;
    /* two tools' argument schemas under one root, as the tool-call code builds it */
    json_t *a = load(dq("{'type':'object','properties':{'city':{'type':'string'}},"
                        "'required':['city']}", 0));
    json_t *b = load(dq("{'type':'object','properties':{'n':{'type':'integer','minimum':0,"
                        "'maximum':9}},'required':['n'],'$defs':{'x':{}}}", 0));
    struct dray_srv_buf buf = {0};
    struct dray_srv_error e = {0};
    const char *root = "root ::= \"weather \" tool0 | \"count \" tool1\n";
    assert_int_equal(dray_srv_buf_add(&buf, root, strlen(root)), 0);
    assert_int_equal(dray_srv_schema_rules(a, "tool0", "tools[0].function.parameters", &buf, &e),
                     0);
    assert_int_equal(dray_srv_schema_rules(b, "tool1", "tools[1].function.parameters", &buf, &e),
                     0);
    /* every rule the converter wrote is named by its prefix */
    for (const char *line = buf.data + strlen(root); *line;) {
        if (strncmp(line, "tool0", 5) && strncmp(line, "tool1", 5))
            fail_msg("a rule outside its prefix: %.60s", line);
        line = strchr(line, '\n') + 1;
    }
    struct dray_grammar *g = compile(buf.data);
    assert_true(accepts(g, "weather {\"city\":\"Oslo\"}"));
    assert_true(accepts(g, "count {\"n\":7}"));
    assert_false(accepts(g, "count {\"city\":\"Oslo\"}"));
    assert_false(accepts(g, "weather {\"n\":7}"));
    assert_false(accepts(g, "count {\"n\":10}"));
    dray_grammar_free(g);

    /* a failure leaves the buffer as it was; a bad prefix is the caller's bug (500) */
    size_t len = buf.len;
    json_t *bad = load(dq("{'type':'object','properties':{'x':{'not':{}}}}", 0));
    assert_int_equal(dray_srv_schema_rules(bad, "tool2", "tools[2].function.parameters", &buf, &e),
                     -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "tools[2].function.parameters.properties.x.not");
    assert_int_equal(buf.len, len);
    assert_int_equal(dray_srv_schema_rules(a, "tool-0", "p", &buf, &e), -1);
    assert_int_equal(e.status, 500);
    assert_int_equal(dray_srv_schema_rules(a, "", "p", &buf, &e), -1);
    json_decref(a);
    json_decref(b);
    json_decref(bad);
    dray_srv_buf_free(&buf);
}

/* ------------------------------------------------------------ refusals */

/* schema must be refused with 400, param naming the keyword and the message
 * containing msg */
static void assert_refused(const char *schema, const char *param, const char *msg)
{
    json_t *s = load(dq(schema, 0));
    struct dray_srv_error e = {0};
    char *g = NULL;
    if (dray_srv_schema_grammar(s, "response_format.json_schema.schema", &g, &e) == 0)
        fail_msg("accepted %s:\n%s", schema, g);
    json_decref(s);
    assert_null(g);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    char want[200];
    snprintf(want, sizeof(want), "response_format.json_schema.schema%s%s", *param ? "." : "",
             param);
    if (strcmp(e.param, want))
        fail_msg("%s: param '%s', want '%s' (%s)", schema, e.param, want, e.message);
    if (!strstr(e.message, msg))
        fail_msg("%s: message '%s' does not say '%s'", schema, e.message, msg);
}

static void test_unsupported_keywords(void **state)
{
    (void)state;
    static const char *const kws[][2] = {
        {"{'type':'integer','multipleOf':5}", "multipleOf"},
        {"{'type':'object','patternProperties':{'^x':{}}}", "patternProperties"},
        {"{'type':'object','propertyNames':{'maxLength':3}}", "propertyNames"},
        {"{'type':'object','minProperties':1}", "minProperties"},
        {"{'type':'object','maxProperties':3}", "maxProperties"},
        {"{'not':{'type':'null'}}", "not"},
        {"{'if':{},'then':{}}", "if"},
        {"{'type':'array','contains':{'type':'integer'}}", "contains"},
        {"{'type':'object','dependentRequired':{'a':['b']}}", "dependentRequired"},
        {"{'type':'object','unevaluatedProperties':false}", "unevaluatedProperties"},
        {"{'type':'array','additionalItems':false}", "additionalItems"},
        {"{'type':'string','contentEncoding':'base64'}", "contentEncoding"},
        {"{'type':'string','nullable':true}", "nullable"},
        {"{'$anchor':'x'}", "$anchor"},
    };
    for (size_t i = 0; i < sizeof(kws) / sizeof(kws[0]); i++)
        assert_refused(kws[i][0], kws[i][1], "is not supported");
    /* nested: the path names where */
    assert_refused("{'type':'object','properties':{'age':{'type':'integer','multipleOf':2}}}",
                   "properties.age.multipleOf", "not supported");
    assert_refused("{'type':'array','items':{'anyOf':[{'type':'string'},{'type':'string',"
                   "'format':'email'}]}}",
                   "items.anyOf[1].format", "email");
    assert_refused("{'type':'array','prefixItems':[{},{'type':'integer','not':{}}]}",
                   "prefixItems[1].not", "not supported");
    assert_refused("{'$ref':'#/$defs/a','$defs':{'a':{'type':'object','properties':"
                   "{'b':{'type':'string','minContains':1}}}}}",
                   "$defs.a.properties.b.minContains", "not supported");
}

static void test_unsupported_values(void **state)
{
    (void)state;
    assert_refused("{'type':'array','uniqueItems':true}", "uniqueItems", "not supported");
    assert_refused("{'type':'array','items':[{'type':'string'}]}", "items", "prefixItems");
    assert_refused("{'type':'string','format':'email'}", "format", "email");
    assert_refused("{'type':'string','pattern':'^(?=a)'}", "pattern", "lookahead");
    assert_refused("{'type':'string','pattern':'(a)\\\\1'}", "pattern", "back-references");
    assert_refused("{'type':'string','pattern':'\\\\bword'}", "pattern", "word boundaries");
    assert_refused("{'type':'string','pattern':'a^b'}", "pattern", "'^'");
    assert_refused("{'type':'string','pattern':'a$b'}", "pattern", "'$'");
    assert_refused("{'type':'string','pattern':'\\\\p{L}'}", "pattern", "\\p");
    assert_refused("{'type':'string','pattern':'(a*)*'}", "pattern", "empty string");
    assert_refused("{'type':'string','pattern':'^(?:[a-z]+){7,}$'}", "pattern", "one already");
    assert_refused("{'type':'string','pattern':'((a+))*'}", "pattern", "one already");
    assert_refused("{'type':'string','pattern':'[a'}", "pattern", "not closed");
    assert_refused("{'type':'string','pattern':'a{2'}", "pattern", "quantifier");
    assert_refused("{'type':'string','pattern':'^a{1001}$'}", "pattern", "1000");
    assert_refused("{'type':'string','pattern':'^a','maxLength':3}", "pattern", "together");
    assert_refused("{'type':'string','format':'date','minLength':3}", "format", "together");
    assert_refused("{'$ref':'https://example.com/s.json'}", "$ref", "not supported");
    assert_refused("{'$ref':'#/$defs/missing','$defs':{}}", "$ref", "no definition");
    assert_refused("{'$ref':'#/$defs/a/properties/b','$defs':{'a':{}}}", "$ref", "pointer");
    assert_refused("{'$ref':'#/$defs/a','type':'object','$defs':{'a':{}}}", "type", "$ref");
    assert_refused("{'allOf':[{'type':'string'},{'maxLength':3}]}", "allOf", "more than one");
    assert_refused("{'anyOf':[{'type':'string'}],'type':'string'}", "type", "anyOf");
    assert_refused("{'anyOf':[{}],'oneOf':[{}]}", "oneOf", "together");
    assert_refused("{'enum':['a'],'maxLength':3}", "maxLength", "enum");
    assert_refused("{'enum':[]}", "enum", "non-empty");
    assert_refused("{'type':'string','enum':[1,2]}", "enum", "no value");
    assert_refused("{'type':'integer','minimum':'3'}", "minimum", "a number");
    assert_refused("{'type':'number','exclusiveMinimum':true,'minimum':1}", "exclusiveMinimum",
                   "draft 4");
    assert_refused("{'type':'integer','minimum':5,'maximum':4}", "", "no number");
    assert_refused("{'type':'integer','exclusiveMinimum':4,'exclusiveMaximum':5}", "", "no number");
    assert_refused("{'type':'number','exclusiveMinimum':1,'maximum':1}", "", "no number");
    assert_refused("{'type':'string','minLength':3,'maxLength':2}", "minLength", "maxLength");
    assert_refused("{'type':'string','maxLength':-1}", "maxLength", "non-negative");
    assert_refused("{'type':'string','maxLength':100000}", "maxLength", "more than");
    assert_refused("{'type':'array','minItems':3,'prefixItems':[{},{}],'items':false}",
                   "minItems", "no array");
    assert_refused("{'type':'object','properties':{'a':{}},'required':['b']}", "required[0]",
                   "not in 'properties'");
    assert_refused("{'type':'object','properties':{'a':false},'required':['a']}", "required[0]",
                   "false");
    assert_refused("{'type':'object','properties':{'a':{'type':'uint8'}}}", "properties.a.type",
                   "not a JSON Schema type");
    assert_refused("{'type':'object','properties':{'a':false,'b':{'anyOf':[false]}}}",
                   "properties.b.anyOf[0]", "matches nothing");
    assert_refused("{'type':'object','properties':{'a':{'$id':'x'}}}", "properties.a.$id",
                   "$id");
    assert_refused("[1]", "", "must be an object or a boolean");
    assert_refused("false", "", "matches nothing");
    /* left recursion: nothing is written between a schema and its $ref back */
    assert_refused("{'$ref':'#'}", "$ref", "left recursion");
    assert_refused("{'$defs':{'a':{'anyOf':[{'type':'null'},{'$ref':'#/$defs/a'}]}},"
                   "'$ref':'#/$defs/a'}",
                   "$defs.a.anyOf[1].$ref", "left recursion");
}

static void test_limits(void **state)
{
    (void)state;
    /* nesting */
    char deep[4096] = "";
    for (int i = 0; i < DRAY_SRV_SCHEMA_MAX_DEPTH + 1; i++)
        strcat(deep, "{'type':'array','items':");
    strcat(deep, "{}");
    for (int i = 0; i < DRAY_SRV_SCHEMA_MAX_DEPTH + 1; i++)
        strcat(deep, "}");
    json_t *s = load(dq(deep, 0));
    struct dray_srv_error e = {0};
    char *g = NULL;
    assert_int_equal(dray_srv_schema_grammar(s, "schema", &g, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "nested more than"));
    /* the param keeps its end when the path is too long for the field */
    assert_true(strlen(e.param) < sizeof(e.param));
    assert_non_null(strstr(e.param, ".items"));
    json_decref(s);

    /* a chain of $ref is nesting too: each link one level deeper */
    json_t *defs = json_object();
    for (int i = 0; i < DRAY_SRV_SCHEMA_MAX_DEPTH + 8; i++) {
        char name[16], ref[32];
        snprintf(name, sizeof(name), "d%d", i);
        snprintf(ref, sizeof(ref), "#/$defs/d%d", i + 1);
        json_object_set_new(defs, name, json_pack("{s:s}", "$ref", ref));
    }
    json_object_set_new(defs, "d40", json_pack("{s:s}", "type", "integer"));
    s = json_pack("{s:s,s:o}", "$ref", "#/$defs/d0", "$defs", defs);
    assert_int_equal(dray_srv_schema_grammar(s, "schema", &g, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "nested more than"));
    json_decref(s);

    /* the rule of the other keys nests a group per code point of a declared key */
    char key[DRAY_SRV_SCHEMA_MAX_KEY + 2];
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = 0;
    s = json_pack("{s:s,s:{s:{}},s:{s:s}}", "type", "object", "properties", key,
                  "additionalProperties", "type", "integer");
    assert_int_equal(dray_srv_schema_grammar(s, "schema", &g, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "at most 128 are supported"));
    json_decref(s);
    key[DRAY_SRV_SCHEMA_MAX_KEY] = 0; /* 128: still compiles */
    s = json_pack("{s:s,s:{s:{}},s:{s:s}}", "type", "object", "properties", key,
                  "additionalProperties", "type", "integer");
    assert_int_equal(dray_srv_schema_grammar(s, "schema", &g, &e), 0);
    dray_grammar_free(compile(g));
    free(g);
    json_decref(s);

    /* size: an enum of 8000 strings */
    json_t *en = json_array();
    for (int i = 0; i < 8000; i++) {
        char v[32];
        snprintf(v, sizeof(v), "value-%d", i);
        json_array_append_new(en, json_string(v));
    }
    s = json_pack("{s:o}", "enum", en);
    assert_int_equal(dray_srv_schema_grammar(s, "schema", &g, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "larger than"));
    json_decref(s);

    /* repetitions: each allowed alone, too many together */
    json_t *props = json_object();
    for (int i = 0; i < 20; i++) {
        char k[16];
        snprintf(k, sizeof(k), "p%d", i);
        json_object_set_new(props, k, json_pack("{s:s,s:i}", "type", "string", "maxLength", 1000));
    }
    s = json_pack("{s:s,s:o}", "type", "object", "properties", props);
    assert_int_equal(dray_srv_schema_grammar(s, "schema", &g, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "repetitions"));
    json_decref(s);

    /* the largest grammars allowed still compile */
    static const char *const big[] = {
        "{'type':'string','maxLength':1000}",
        "{'type':'array','items':{'type':'integer'},'maxItems':1000}",
        "{'type':'string','pattern':'^[a-z]{1000}$'}",
        "{'type':'number','minimum':-1.7976931348623157e308,'maximum':1.7976931348623157e308}",
        "{'type':'number','minimum':5e-324,'maximum':1}",
    };
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        g = grammar_of(big[i]);
        dray_grammar_free(compile(g));
        free(g);
    }
}

/* Annotations are accepted wherever they appear and change nothing */
static void test_annotations(void **state)
{
    (void)state;
    char *plain = grammar_of("{'type':'object','properties':{'a':{'type':'integer'}}}");
    char *annotated = grammar_of(
        "{'$schema':'https://json-schema.org/draft/2020-12/schema','$id':'https://x/y',"
        "'title':'T','description':'D','$comment':'c','type':'object','properties':"
        "{'a':{'type':'integer','title':'A','description':'d','default':3,'examples':[1,2],"
        "'deprecated':false,'readOnly':true,'writeOnly':false}},'$defs':{'unused':{'not':{}}}}");
    assert_string_equal(plain, annotated);
    free(plain);
    free(annotated);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_integer_ranges_sweep),
        cmocka_unit_test(test_number_ranges_sweep),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_combinators),
        cmocka_unit_test(test_generate_through_the_mask),
        cmocka_unit_test(test_whitespace_is_bounded),
        cmocka_unit_test(test_json_object_grammar),
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_rules_under_a_prefix),
        cmocka_unit_test(test_unsupported_keywords),
        cmocka_unit_test(test_unsupported_values),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_annotations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
