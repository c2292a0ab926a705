#include "utf8.h"

size_t dray_utf8_lead_len(uint8_t c)
{
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

/* Allowed range of the byte after lead c (Unicode Table 3-7); the bytes after
 * that are always 0x80..0xBF. Returns the sequence length, 0 for a bad lead. */
static int lead_info(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;
    if (c < 0xE0)
        return 2;
    if (c < 0xF0) {
        if (c == 0xE0)
            *lo = 0xA0; /* no overlongs */
        else if (c == 0xED)
            *hi = 0x9F; /* no surrogates */
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0)
            *lo = 0x90;
        else if (c == 0xF4)
            *hi = 0x8F; /* <= U+10FFFF */
        return 4;
    }
    return 0;
}

int dray_utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t lo, hi;
    if (n == 0)
        return 0;
    int len = lead_info(s[0], &lo, &hi);
    if (len == 0)
        return -1;
    uint32_t v = len == 1 ? s[0] : (uint32_t)(s[0] & (0xFF >> (len + 1)));
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return 0; /* valid so far, cut short */
        uint8_t b = s[i];
        if (b < lo || b > hi)
            return -i; /* the maximal subpart is everything before b */
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    if (cp)
        *cp = v;
    return len;
}

size_t dray_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

bool dray_utf8_valid(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        int r = dray_utf8_next(p + i, n - i, NULL);
        if (r <= 0)
            return false;
        i += (size_t)r;
    }
    return true;
}

bool dray_utf8_is_space(uint32_t cp)
{
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F))
        return true;
    if (cp < 0x85)
        return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Length of the well-formed space character at s[0..n), 0 if there is none. */
static size_t space_at(const uint8_t *s, size_t n)
{
    uint32_t cp;
    int r = dray_utf8_next(s, n, &cp);
    return r > 0 && dray_utf8_is_space(cp) ? (size_t)r : 0;
}

size_t dray_utf8_trim(const char *s, size_t n, size_t *start)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t b = 0, e = n, k;
    while (b < e && (k = space_at(p + b, e - b)) > 0)
        b += k;
    /* From the end: step back over continuation bytes to a lead byte, then
     * check that the character there is a space that ends exactly at e. */
    while (e > b) {
        size_t c = e - 1;
        while (c > b && e - c < 4 && (p[c] & 0xC0) == 0x80)
            c--;
        k = space_at(p + c, e - c);
        if (k == 0 || c + k != e)
            break;
        e = c;
    }
    *start = b;
    return e - b;
}
