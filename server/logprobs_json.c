/* Log-probabilities as JSON. See logprobs_json.h. */
#include "logprobs_json.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#define PIECE_MAX 1024 /* longer pieces are cut (no vocabulary has them) */

/* Length of the well-formed UTF-8 character at s[0..n), 0 if ill-formed. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || len > n || (len == 2 && c < 0xC2) || (len == 4 && c > 0xF4))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if (len == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0)))
        return 0; /* overlong, surrogate */
    if (len == 4 && ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90)))
        return 0;
    return len;
}

/* One token: its raw bytes in raw[*n_raw], and its text (valid UTF-8, U+FFFD for
 * each byte that is not part of a character) in text[*n_text], *chars characters. */
struct tok {
    char raw[PIECE_MAX], text[PIECE_MAX * 3];
    size_t n_raw, n_text, chars;
};

static void tok_of(int32_t id, dray_srv_piece_fn piece, const void *user, struct tok *t)
{
    size_t n = piece(user, id, t->raw, sizeof(t->raw));
    t->n_raw = n < sizeof(t->raw) ? n : sizeof(t->raw);
    t->n_text = t->chars = 0;
    const unsigned char *s = (const unsigned char *)t->raw;
    for (size_t i = 0; i < t->n_raw; t->chars++) {
        size_t len = utf8_len(s + i, t->n_raw - i);
        if (len) {
            memcpy(t->text + t->n_text, s + i, len);
            t->n_text += len;
            i += len;
        } else {
            memcpy(t->text + t->n_text, "\xEF\xBF\xBD", 3);
            t->n_text += 3;
            i++;
        }
    }
}

static json_t *lp_value(float lp)
{
    if (isnan(lp))
        return json_null();
    return json_real(isinf(lp) ? -9999.0 : (double)lp);
}

static json_t *bytes_json(const struct tok *t)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < t->n_raw; i++)
        if (json_array_append_new(a, json_integer((unsigned char)t->raw[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* {"token", "logprob", "bytes"}: the chat shape's entry without its alternatives */
static json_t *chat_entry(int32_t id, float lp, dray_srv_piece_fn piece, const void *user)
{
    struct tok t;
    tok_of(id, piece, user, &t);
    json_t *b = bytes_json(&t);
    return b ? json_pack("{s:s%, s:o, s:o}", "token", t.text, t.n_text, "logprob", lp_value(lp),
                         "bytes", b)
             : NULL;
}

json_t *dray_srv_chat_logprobs_json(const struct dray_token_logprob *lp, size_t n,
                                    dray_srv_piece_fn piece, const void *user)
{
    json_t *content = json_array();
    for (size_t i = 0; content && i < n; i++) {
        json_t *e = chat_entry(lp[i].id, lp[i].logprob, piece, user), *top = json_array();
        bool ok = e && top && !json_object_set(e, "top_logprobs", top);
        for (uint32_t j = 0; ok && j < lp[i].n_top; j++)
            ok = !json_array_append_new(top, chat_entry(lp[i].top[j].id, lp[i].top[j].logprob,
                                                        piece, user));
        json_decref(top);
        if (!ok || json_array_append_new(content, e)) {
            if (!ok)
                json_decref(e);
            json_decref(content);
            return NULL;
        }
    }
    return content ? json_pack("{s:o}", "content", content) : NULL;
}

/* {token: logprob} of the top alternatives and the chosen token; null for an
 * entry without a logprob */
static json_t *top_dict(const struct dray_token_logprob *lp, const struct tok *chosen,
                        dray_srv_piece_fn piece, const void *user)
{
    if (isnan(lp->logprob))
        return json_null();
    json_t *d = json_object();
    struct tok t;
    for (uint32_t j = 0; d && j < lp->n_top; j++) {
        tok_of(lp->top[j].id, piece, user, &t);
        if (json_object_setn_new(d, t.text, t.n_text, lp_value(lp->top[j].logprob))) {
            json_decref(d);
            return NULL;
        }
    }
    if (d && json_object_setn_new(d, chosen->text, chosen->n_text, lp_value(lp->logprob))) {
        json_decref(d);
        return NULL;
    }
    return d;
}

json_t *dray_srv_text_logprobs_json(const struct dray_token_logprob *lp, size_t n, size_t offset,
                                    size_t *end, dray_srv_piece_fn piece, const void *user)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    bool ok = tokens && lps && tops && offs;
    struct tok t;
    for (size_t i = 0; ok && i < n; i++) {
        tok_of(lp[i].id, piece, user, &t);
        ok = !json_array_append_new(tokens, json_stringn(t.text, t.n_text)) &&
             !json_array_append_new(lps, lp_value(lp[i].logprob)) &&
             !json_array_append_new(tops, top_dict(&lp[i], &t, piece, user)) &&
             !json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += t.chars;
    }
    if (end)
        *end = offset;
    if (!ok) {
        json_decref(tokens);
        json_decref(lps);
        json_decref(tops);
        json_decref(offs);
        return NULL;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}
