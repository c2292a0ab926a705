/* UTF-8 helpers for the tokenizer, the streaming detokenizer and the chat
 * template. Validation follows Unicode 15 §3.9 (Table 3-7, well-formed byte
 * sequences: no overlongs, no surrogates, nothing above U+10FFFF) and replaces
 * ill-formed input per "U+FFFD substitution of maximal subparts" (§3.9.6): each
 * maximal subpart of an ill-formed sequence becomes exactly one U+FFFD. */
#ifndef DRAY_CORE_UTF8_H
#define DRAY_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DRAY_UTF8_REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD, 3 bytes */

/* Byte length of the character that lead byte c starts, from its top 4 bits
 * (0x0-0xB -> 1, 0xC-0xD -> 2, 0xE -> 3, 0xF -> 4). This is the lenient split
 * SentencePiece-style tokenizers use: it does not validate, a stray continuation
 * byte counts as a 1-byte character. */
size_t dray_utf8_lead_len(uint8_t c);

/* Decode the character at s[0..n).
 *   > 0: a well-formed character of that many bytes; *cp is its code point.
 *   = 0: s[0..n) is a proper prefix of a well-formed character (needs more bytes);
 *        n == 0 also returns 0.
 *   < 0: ill-formed; -r is the length of the maximal subpart (1..3) to replace
 *        with one U+FFFD before decoding again at s + r.
 * cp may be NULL. */
int dray_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* Encode cp (<= 0x10FFFF, not a surrogate) into out; returns 1..4, or 0 if cp is
 * not a Unicode scalar value. */
size_t dray_utf8_encode(uint32_t cp, char out[4]);

/* True if s[0..n) is entirely well-formed UTF-8. */
bool dray_utf8_valid(const char *s, size_t n);

/* Python's str.isspace() for one code point (what Jinja's |trim strips):
 * \t \n \v \f \r, U+001C..U+001F, space, U+0085, U+00A0, U+1680, U+2000..U+200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000. */
bool dray_utf8_is_space(uint32_t cp);

/* Trim leading and trailing dray_utf8_is_space characters of s[0..n) as
 * Python's str.strip() does: *start is the offset of the first kept byte, the
 * return value the kept length. Ill-formed bytes are never stripped. */
size_t dray_utf8_trim(const char *s, size_t n, size_t *start);

#endif
