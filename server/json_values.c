/* server/json_values.c — the JSON Schema converter's strings, objects and
 * arrays (json_grammar.h; the walk and the API are json_grammar.c's): lengths,
 * properties in order with the required ones, additional properties whose keys
 * none of the declared names, items and their bounds. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jfield.h"
#include "json_grammar.h"
#include "json_grammar_gen.h"

/* ------------------------------------------------------------ strings */

/* a non-negative integer keyword (absent: def) up to DRAY_SRV_SCHEMA_MAX_REPEAT */
static int read_count(struct gen *g, json_t *s, const char *kw, long def, long *out)
{
    json_t *v = json_object_get(s, kw);
    *out = def;
    if (!v)
        return 0;
    double x = json_is_integer(v) ? (double)json_integer_value(v)
             : json_is_real(v)    ? json_real_value(v)
                                  : -1;
    if (!json_is_number(v) || x < 0 || x != floor(x))
        return jg_bad(g, kw, "must be a non-negative integer");
    if (x > DRAY_SRV_SCHEMA_MAX_REPEAT)
        return jg_bad(g, kw, "%.0f is more than this server supports (%d)", x,
                   DRAY_SRV_SCHEMA_MAX_REPEAT);
    *out = (long)x;
    return 0;
}

int jg_string(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    json_t *pattern = json_object_get(s, "pattern"), *format = json_object_get(s, "format");
    bool lens = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    long min, max;
    if (read_count(g, s, "minLength", 0, &min) || read_count(g, s, "maxLength", -1, &max))
        return -1;
    if (max >= 0 && min > max)
        return jg_bad(g, "minLength", "is more than maxLength: no string satisfies both");
    if (pattern && !json_is_string(pattern))
        return jg_bad(g, "pattern", "must be a string, got %s", dray_srv_kind_of(pattern));
    if (format && !json_is_string(format))
        return jg_bad(g, "format", "must be a string, got %s", dray_srv_kind_of(format));
    if (pattern && (lens || format))
        return jg_bad(g, "pattern", "together with %s is not supported: express the "
                   "constraint in the pattern alone", format ? "format" : "minLength/maxLength");
    if (format && lens)
        return jg_bad(g, "format", "together with minLength/maxLength is not supported");
    if (pattern)
        return jg_pattern(g, json_string_value(pattern), json_string_length(pattern), out);
    struct dray_srv_buf body = {0};
    int rc;
    if (format) {
        static const struct {
            const char *name;
            int prim;
        } formats[] = {{"date", P_DATE}, {"time", P_TIME}, {"date-time", P_DATETIME},
                       {"uuid", P_UUID}};
        const char *f = json_string_value(format);
        size_t i = 0;
        while (i < 4 && strcmp(f, formats[i].name))
            i++;
        if (i == 4)
            return jg_bad(g, "format", "\"%.40s\" is not supported (only \"date\", \"time\", "
                       "\"date-time\" and \"uuid\" are)", f);
        jg_put(g, &body, "\"\\\"\" ");
        jg_prim(g, &body, formats[i].prim);
        jg_put(g, &body, " \"\\\"\"");
        rc = jg_rule_of(g, "fmt", &body, out);
    } else if (!lens || (min == 0 && max < 0)) {
        jg_prim(g, out, P_STRING);
        rc = 0;
    } else if (max == 0) {
        jg_put(g, out, "\"\\\"\\\"\"");
        rc = 0;
    } else {
        jg_put(g, &body, "\"\\\"\" ");
        jg_prim(g, &body, P_CHAR);
        jg_charge(g, min, max, 1);
        if (max < 0)
            jg_putf(g, &body, "{%ld,}", min);
        else if (min == max)
            jg_putf(g, &body, "{%ld}", min);
        else
            jg_putf(g, &body, "{%ld,%ld}", min, max);
        jg_put(g, &body, " \"\\\"\"");
        rc = jg_rule_of(g, "str", &body, out);
    }
    dray_srv_buf_free(&body);
    return rc;
}

/* ------------------------------------------------------------ schemas */

/* Keys as code point strings, for the trie of declared property names */
struct key {
    uint32_t *cp;
    size_t n;
};

static int key_cmp(const void *a, const void *b)
{
    const struct key *x = a, *y = b;
    for (size_t i = 0; i < x->n && i < y->n; i++)
        if (x->cp[i] != y->cp[i])
            return x->cp[i] < y->cp[i] ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* The characters of a key that is none of keys[0..n) (sorted, sharing their
 * first depth code points): a rule per trie node. */
static int gen_not_keys(struct gen *g, const struct key *keys, size_t n, size_t depth,
                        struct dray_srv_buf *out)
{
    struct dray_srv_buf body = {0}, t = {0};
    struct cset kids = {0};
    bool terminal = false;
    int rc = -1, alts = 0;
    size_t i = 0;
    if (keys[0].n == depth) { /* sorted: the key ending here comes first */
        terminal = true;
        i = 1;
    }
    while (i < n) {
        uint32_t c = keys[i].cp[depth];
        size_t j = i;
        while (j < n && keys[j].cp[depth] == c)
            j++;
        if (!jg_cs_add(&kids, c, c)) {
            rc = jg_oom(g);
            goto done;
        }
        struct cset one = {0};
        if (!jg_cs_add(&one, c, c)) {
            rc = jg_oom(g);
            goto done;
        }
        int k = jg_emit_set(g, &t, &one);
        free(one.r);
        if (k) { /* a character a key can hold (always, for a key jansson parsed) */
            jg_put(g, &t, " ");
            if (gen_not_keys(g, keys + i, j - i, depth + 1, &t))
                goto done;
            if (alts++)
                jg_put(g, &body, " | ");
            jg_put_buf(g, &body, &t);
        }
        i = j;
    }
    /* a character no declared key has here, then anything */
    jg_cs_norm(&kids);
    if (!jg_cs_invert(&kids)) {
        rc = jg_oom(g);
        goto done;
    }
    if (jg_emit_set(g, &t, &kids)) {
        jg_put(g, &t, " ");
        jg_prim(g, &t, P_CHAR);
        jg_put(g, &t, "*");
        if (alts++)
            jg_put(g, &body, " | ");
        jg_put_buf(g, &body, &t);
    }
    if (!terminal) { /* the key may end here */
        struct dray_srv_buf w = {0};
        jg_put(g, &w, "( ");
        jg_putn(g, &w, body.data, body.len);
        jg_put(g, &w, " )?");
        rc = jg_rule_of(g, "key", &w, out);
        dray_srv_buf_free(&w);
    } else {
        rc = jg_rule_of(g, "key", &body, out);
    }
done:
    free(kids.r);
    dray_srv_buf_free(&body);
    dray_srv_buf_free(&t);
    return rc;
}

/* UTF-8 s into code points */
static bool key_of(const char *s, struct key *k)
{
    size_t n = strlen(s);
    k->cp = malloc((n + 1) * sizeof(*k->cp));
    k->n = 0;
    if (!k->cp)
        return false;
    size_t i = 0;
    while (i < n)
        k->cp[k->n++] = jg_utf8_next(s, n, &i);
    return true;
}

/* the key of an additional property: a string that is none of props' keys */
static int gen_extra_key(struct gen *g, json_t *props, struct dray_srv_buf *out)
{
    size_t n = props ? json_object_size(props) : 0, i = 0;
    if (!n) {
        jg_prim(g, out, P_STRING);
        return 0;
    }
    struct key *keys = calloc(n, sizeof(*keys));
    const char *name;
    json_t *v;
    int rc = -1;
    if (!keys)
        return jg_oom(g);
    json_object_foreach(props, name, v) {
        if (!key_of(name, &keys[i++])) {
            rc = jg_oom(g);
            goto done;
        }
        if (keys[i - 1].n > DRAY_SRV_SCHEMA_MAX_KEY) { /* gen_not_keys recurses per code point */
            rc = jg_bad(g, "properties", "a property name of %zu characters: at most %d are "
                        "supported when other properties are allowed too", keys[i - 1].n,
                        DRAY_SRV_SCHEMA_MAX_KEY);
            goto done;
        }
    }
    qsort(keys, n, sizeof(*keys), key_cmp);
    jg_put(g, out, "\"\\\"\" ");
    rc = gen_not_keys(g, keys, n, 0, out);
    jg_put(g, out, " \"\\\"\"");
done:
    for (size_t k = 0; k < n; k++)
        free(keys[k].cp);
    free(keys);
    return rc;
}

static bool in_array(json_t *arr, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
        if (json_is_string(v) && !strcmp(json_string_value(v), s))
            return true;
    return false;
}

int jg_object(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *ap = json_object_get(s, "additionalProperties"), *v;
    const char *key;
    size_t i;
    if (props && !json_is_object(props))
        return jg_bad(g, "properties", "must be an object, got %s", dray_srv_kind_of(props));
    if (req && !json_is_array(req))
        return jg_bad(g, "required", "must be an array of property names, got %s",
                   dray_srv_kind_of(req));
    json_array_foreach(req, i, v) {
        char kw[40];
        snprintf(kw, sizeof(kw), "required[%zu]", i);
        if (!json_is_string(v))
            return jg_bad(g, kw, "must be a string, got %s", dray_srv_kind_of(v));
        json_t *ps = props ? json_object_get(props, json_string_value(v)) : NULL;
        if (!ps)
            return jg_bad(g, kw, "\"%.60s\" is not in 'properties' (a required property must be "
                       "declared there)", json_string_value(v));
        if (json_is_false(ps))
            return jg_bad(g, kw, "\"%.60s\" is required but its schema is false: no object "
                       "satisfies the schema", json_string_value(v));
    }
    if (ap && !json_is_boolean(ap) && !json_is_object(ap))
        return jg_bad(g, "additionalProperties", "must be a boolean or a schema, got %s",
                   dray_srv_kind_of(ap));
    /* absent: none when 'properties' lists them (as OpenAI's strict mode requires),
     * else any */
    bool extra = ap ? !json_is_false(ap) : !props;
    bool extra_any = extra && (!ap || json_is_true(ap) || json_object_size(ap) == 0);

    size_t np = 0;
    json_object_foreach(props, key, v)
        if (!json_is_false(v))
            np++;
    if (!json_object_size(props) && extra_any) { /* no declared name to keep out */
        jg_prim(g, out, P_OBJECT);
        return 0;
    }
    g->level++;
    struct dray_srv_buf body = {0}, t = {0}, extra_kv = {0};
    int rc = -1;
    char (*kv)[96] = np ? calloc(np, sizeof(*kv)) : NULL;
    bool *required = np ? calloc(np, sizeof(*required)) : NULL;
    if (np && (!kv || !required)) {
        rc = jg_oom(g);
        goto done;
    }
    /* key ws ":" ws value, a rule per declared property */
    size_t k = 0;
    json_object_foreach(props, key, v) {
        if (json_is_false(v)) /* may not appear: it is left out (and not an extra key) */
            continue;
        required[k] = req && in_array(req, key);
        struct dray_srv_buf keylit = {0};
        jg_json_spell(g, &keylit, key, strlen(key));
        jg_lit(g, &t, keylit.data, keylit.len);
        dray_srv_buf_free(&keylit);
        jg_put(g, &t, " ");
        jg_prim(g, &t, P_WS);
        jg_put(g, &t, " \":\" ");
        jg_prim(g, &t, P_WS);
        jg_put(g, &t, " ");
        if (jg_at(g, v, &t, ".properties.%s", key))
            goto done;
        jg_new_name(g, "kv", kv[k], sizeof(kv[k]));
        if (jg_emit_rule(g, kv[k], &t))
            goto done;
        dray_srv_buf_reset(&t);
        k++;
    }
    if (extra) {
        if (gen_extra_key(g, props, &extra_kv))
            goto done;
        jg_put(g, &extra_kv, " ");
        jg_prim(g, &extra_kv, P_WS);
        jg_put(g, &extra_kv, " \":\" ");
        jg_prim(g, &extra_kv, P_WS);
        jg_put(g, &extra_kv, " ");
        if (extra_any)
            jg_prim(g, &extra_kv, P_VALUE);
        else if (jg_at(g, ap, &extra_kv, ".additionalProperties"))
            goto done;
        char name[96];
        jg_new_name(g, "extra", name, sizeof(name));
        if (jg_emit_rule(g, name, &extra_kv))
            goto done;
        dray_srv_buf_reset(&extra_kv);
        jg_put(g, &extra_kv, name);
    }
    /* tails: tail[j] is what may follow property j (0-based: properties j+1..),
     * each required one present, each optional one maybe, in order */
    char (*tail)[96] = np ? calloc(np, sizeof(*tail)) : NULL;
    if (np && !tail) {
        rc = jg_oom(g);
        goto done;
    }
    for (size_t j = np; j-- > 1;) {
        /* tail[j-1] = ("," kv[j])? tail[j] */
        jg_put(g, &t, required[j] ? "" : "( ");
        jg_prim(g, &t, P_WS);
        jg_put(g, &t, " \",\" ");
        jg_prim(g, &t, P_WS);
        jg_put(g, &t, " ");
        jg_put(g, &t, kv[j]);
        jg_put(g, &t, required[j] ? "" : " )?");
        if (tail[j][0]) {
            jg_put(g, &t, " ");
            jg_put(g, &t, tail[j]);
        }
        jg_new_name(g, "tail", tail[j - 1], sizeof(tail[j - 1]));
        if (jg_emit_rule(g, tail[j - 1], &t)) {
            free(tail);
            goto done;
        }
        dray_srv_buf_reset(&t);
    }
    /* the members: the first one present is property j (up to the first required
     * one), or an extra key when none is required */
    size_t first_req = np;
    for (size_t j = 0; j < np; j++)
        if (required[j]) {
            first_req = j;
            break;
        }
    int alts = 0;
    for (size_t j = 0; j < np && j <= first_req; j++) {
        if (alts++)
            jg_put(g, &t, " | ");
        jg_put(g, &t, kv[j]);
        if (tail[j][0]) {
            jg_put(g, &t, " ");
            jg_put(g, &t, tail[j]);
        }
    }
    free(tail);
    if (extra && first_req == np) {
        if (alts++)
            jg_put(g, &t, " | ");
        jg_put(g, &t, extra_kv.data);
    }
    bool nullable = first_req == np;
    jg_put(g, &body, "\"{\" ");
    jg_prim(g, &body, P_WS);
    jg_put(g, &body, " ");
    if (alts) {
        jg_put(g, &body, "( ");
        if (alts > 1)
            jg_put(g, &body, "( ");
        jg_put_buf(g, &body, &t);
        if (alts > 1)
            jg_put(g, &body, " )");
        if (extra) {
            jg_put(g, &body, " ( ");
            jg_prim(g, &body, P_WS);
            jg_put(g, &body, " \",\" ");
            jg_prim(g, &body, P_WS);
            jg_put(g, &body, " ");
            jg_put(g, &body, extra_kv.data);
            jg_put(g, &body, " )*");
        }
        jg_put(g, &body, " ");
        jg_prim(g, &body, P_WS);
        jg_put(g, &body, nullable ? " )? " : " ) ");
    }
    jg_put(g, &body, "\"}\"");
    rc = jg_rule_of(g, "obj", &body, out);
done:
    g->level--;
    free(kv);
    free(required);
    dray_srv_buf_free(&body);
    dray_srv_buf_free(&t);
    dray_srv_buf_free(&extra_kv);
    return rc;
}

int jg_array(struct gen *g, json_t *s, struct dray_srv_buf *out)
{
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    long min, max;
    if (read_count(g, s, "minItems", 0, &min) || read_count(g, s, "maxItems", -1, &max))
        return -1;
    if (json_is_array(items))
        return jg_bad(g, "items", "an array of schemas (the tuple form before 2020-12) is not "
                   "supported: use prefixItems");
    if (items && !json_is_boolean(items) && !json_is_object(items))
        return jg_bad(g, "items", "must be a schema, got %s", dray_srv_kind_of(items));
    if (prefix && !json_is_array(prefix))
        return jg_bad(g, "prefixItems", "must be an array of schemas, got %s",
                   dray_srv_kind_of(prefix));
    size_t k = prefix ? json_array_size(prefix) : 0;
    bool rest = !json_is_false(items);
    if (!rest && (max < 0 || (size_t)max > k))
        max = (long)k;
    if (max >= 0 && min > max)
        return jg_bad(g, "minItems", "is more than the array may hold (maxItems, or items false "
                   "after prefixItems): no array satisfies the schema");
    if (!k && (!items || json_is_true(items) || json_object_size(items) == 0) && !min &&
        max < 0) {
        jg_prim(g, out, P_ARRAY);
        return 0;
    }
    g->level++;
    struct dray_srv_buf tail = {0}, t = {0}, body = {0}, sep = {0};
    int rc = -1;
    jg_prim(g, &sep, P_WS);
    jg_put(g, &sep, " \",\" ");
    jg_prim(g, &sep, P_WS);
    jg_put(g, &sep, " ");
    /* the elements after the prefix, when at least one is there */
    if (rest && (max < 0 || (size_t)max > k)) {
        struct dray_srv_buf r = {0};
        int e = items && !json_is_true(items) ? jg_at(g, items, &r, ".items")
                                              : (jg_prim(g, &r, P_VALUE), 0);
        if (e) {
            dray_srv_buf_free(&r);
            goto done;
        }
        long a = min - (long)k - 1 > 0 ? min - (long)k - 1 : 0;
        long b = max < 0 ? -1 : max - (long)k - 1;
        jg_putn(g, &tail, r.data, r.len);
        if (b != 0) {
            jg_charge(g, a, b, jg_tokens(r.data, r.len) + 3);
            jg_put(g, &tail, " ( ");
            jg_putn(g, &tail, sep.data, sep.len);
            jg_putn(g, &tail, r.data, r.len);
            jg_put(g, &tail, " )");
            if (b < 0 && a == 0)
                jg_put(g, &tail, "*");
            else if (b < 0 && a == 1)
                jg_put(g, &tail, "+");
            else if (b < 0)
                jg_putf(g, &tail, "{%ld,}", a);
            else if (a == b)
                jg_putf(g, &tail, "{%ld}", a);
            else
                jg_putf(g, &tail, "{%ld,%ld}", a, b);
        }
        dray_srv_buf_free(&r);
    }
    /* the prefix, from its end: element j, then optionally (from j >= min) the rest */
    for (size_t j = k; j-- > 0;) {
        if (jg_at(g, json_array_get(prefix, j), &t, ".prefixItems[%zu]", j))
            goto done;
        if (tail.len && (max < 0 || (long)j + 1 < max)) {
            jg_put(g, &t, " ( ");
            jg_putn(g, &t, sep.data, sep.len);
            jg_put_buf(g, &t, &tail);
            jg_put(g, &t, (long)j + 1 >= min ? " )?" : " )");
        }
        dray_srv_buf_reset(&tail);
        jg_put_buf(g, &tail, &t);
    }
    jg_put(g, &body, "\"[\" ");
    jg_prim(g, &body, P_WS);
    if (tail.len) {
        jg_put(g, &body, " ( ");
        jg_put_buf(g, &body, &tail);
        jg_put(g, &body, " ");
        jg_prim(g, &body, P_WS);
        jg_put(g, &body, min == 0 ? " )?" : " )");
    }
    jg_put(g, &body, " \"]\"");
    rc = jg_rule_of(g, "arr", &body, out);
done:
    g->level--;
    dray_srv_buf_free(&tail);
    dray_srv_buf_free(&t);
    dray_srv_buf_free(&body);
    dray_srv_buf_free(&sep);
    return rc;
}

