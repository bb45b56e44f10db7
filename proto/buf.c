/*
 * The capped buffer and the bounded reader (see sb/buf.h).
 *
 * One growth rule, in grow(): the allocation doubles from SB_BUF_MIN_ALLOC
 * until it holds the bytes asked for plus the NUL, and is clamped to the cap
 * plus the NUL, so a buffer never holds more than cap + 1 bytes of storage
 * and never grows past twice what it was asked to hold. The cap is checked
 * before anything is allocated.
 */
#include <stdio.h>
#include <string.h>
#include "sb/buf.h"
#include "sb/mem.h"
#include "scan.h"

#define SB_BUF_MIN_ALLOC 256u
#define SB_BUF_SECRET 1u

static void init(sb_buf_t *b, size_t cap, unsigned flags)
{
    b->base = NULL;
    b->len = 0;
    b->_alloc = 0;
    b->_cap = cap < SB_BUF_MAX_CAP ? cap : SB_BUF_MAX_CAP;
    b->_flags = flags;
}

void sb_buf_init(sb_buf_t *b, size_t cap)
{
    init(b, cap, 0);
}

void sb_buf_init_secret(sb_buf_t *b, size_t cap)
{
    init(b, cap, SB_BUF_SECRET);
}

void sb_buf_set_cap(sb_buf_t *b, size_t cap)
{
    if (cap > SB_BUF_MAX_CAP)
        cap = SB_BUF_MAX_CAP;
    b->_cap = cap < b->len ? b->len : cap;
}

void sb_buf_free(sb_buf_t *b)
{
    if (b->base != NULL) {
        if (b->_flags & SB_BUF_SECRET)
            sb_mem_free_secret(b->base, b->_alloc);
        else
            sb_mem_free(b->base);
    }
    b->base = NULL;
    b->len = b->_alloc = 0;
}

void sb_buf_truncate(sb_buf_t *b, size_t len)
{
    if (len >= b->len)
        return;
    if (b->_flags & SB_BUF_SECRET)
        explicit_bzero(b->base + len, b->len - len);
    b->len = len;
    b->base[len] = '\0';
}

void sb_buf_reset(sb_buf_t *b)
{
    sb_buf_truncate(b, 0);
}

void sb_buf_consume(sb_buf_t *b, size_t n)
{
    size_t left;

    if (n >= b->len) {
        sb_buf_reset(b);
        return;
    }
    if (n == 0)
        return;
    left = b->len - n;
    memmove(b->base, b->base + n, left);
    if (b->_flags & SB_BUF_SECRET)
        explicit_bzero(b->base + left, n);
    b->len = left;
    b->base[left] = '\0';
}

/* makes room for n more bytes and the NUL: the one growth rule */
static sb_status_t grow(sb_buf_t *b, size_t n)
{
    size_t need, na;
    char *np;

    if (n > b->_cap - b->len)
        return SB_E_TOO_LARGE;
    /* len + n <= cap <= SB_BUF_MAX_CAP: none of the sums or doublings below can overflow */
    need = b->len + n + 1;
    if (need <= b->_alloc)
        return SB_OK;
    na = b->_alloc != 0 ? b->_alloc : SB_BUF_MIN_ALLOC;
    while (na < need)
        na *= 2;
    if (na > b->_cap + 1)
        na = b->_cap + 1;
    if (b->_flags & SB_BUF_SECRET) {
        /* realloc could leave a copy of the secret in freed memory: copy, then zero the old block */
        if ((np = sb_mem_try_alloc(na)) == NULL)
            return SB_E_NOMEM;
        if (b->base != NULL) {
            memcpy(np, b->base, b->len + 1);
            sb_mem_free_secret(b->base, b->_alloc);
        }
    } else if ((np = sb_mem_try_realloc(b->base, na)) == NULL) {
        return SB_E_NOMEM;
    }
    if (b->base == NULL)
        np[0] = '\0';
    b->base = np;
    b->_alloc = na;
    return SB_OK;
}

sb_status_t sb_buf_reserve(sb_buf_t *b, size_t n, char **room)
{
    sb_status_t st = grow(b, n);
    if (st == SB_OK)
        *room = b->base + b->len;
    return st;
}

sb_status_t sb_buf__append_slow(sb_buf_t *b, const void *p, size_t n)
{
    sb_status_t st = grow(b, n);
    if (st != SB_OK)
        return st;
    if (n != 0)
        memcpy(b->base + b->len, p, n);
    b->len += n;
    b->base[b->len] = '\0';
    return SB_OK;
}

sb_status_t sb_buf_append_str(sb_buf_t *b, const char *s)
{
    return sb_buf_append(b, s, strlen(s));
}

sb_status_t sb_buf_vprintf(sb_buf_t *b, const char *fmt, va_list ap)
{
    size_t room = b->_alloc - b->len; /* includes the NUL's byte; 0 before the first allocation */
    va_list cp;
    int r;

    va_copy(cp, ap);
    r = vsnprintf(room != 0 ? b->base + b->len : NULL, room, fmt, cp);
    va_end(cp);
    if (r >= 0 && (size_t)r < room) {
        b->len += (size_t)r;
        return SB_OK;
    }
    /* a failed or cut-off attempt may have written past len: the buffer ends at len again */
    if (room != 0)
        b->base[b->len] = '\0';
    if (r < 0)
        return SB_E_BAD_ARGS;
    {
        sb_status_t st = grow(b, (size_t)r);
        int r2;
        if (st != SB_OK)
            return st;
        va_copy(cp, ap);
        r2 = vsnprintf(b->base + b->len, b->_alloc - b->len, fmt, cp);
        va_end(cp);
        if (r2 != r) {
            b->base[b->len] = '\0';
            return SB_E_BAD_ARGS;
        }
    }
    b->len += (size_t)r;
    return SB_OK;
}

sb_status_t sb_buf_printf(sb_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    sb_status_t st;

    va_start(ap, fmt);
    st = sb_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
}

/*
 * The escapes are jansson's (json_dumps without JSON_ENSURE_ASCII), byte for
 * byte, so a reply does not change with the writer: the short forms of RFC
 * 8259 section 7 where they exist, \u00XX with upper-case hex for the other
 * control characters, '/' and DEL as they are.
 */
static sb_status_t json_escape(sb_buf_t *b, uint8_t c)
{
    static const char hex[] = "0123456789ABCDEF";
    char e[6] = {'\\', 0, 0, 0, 0, 0};
    size_t n = 2;

    switch (c) {
    case '"':
    case '\\':
        e[1] = (char)c;
        break;
    case '\b':
        e[1] = 'b';
        break;
    case '\f':
        e[1] = 'f';
        break;
    case '\n':
        e[1] = 'n';
        break;
    case '\r':
        e[1] = 'r';
        break;
    case '\t':
        e[1] = 't';
        break;
    default:
        e[1] = 'u', e[2] = '0', e[3] = '0', e[4] = hex[c >> 4], e[5] = hex[c & 15];
        n = 6;
        break;
    }
    return sb_buf_append(b, e, n);
}

/* how text_append writes: as a JSON string (quotes and escapes) or as bare text; lossy or strict about UTF-8 */
#define TEXT_JSON 1u
#define TEXT_LOSSY 2u

/*
 * The one place text is checked and copied: valid UTF-8 goes out as it is
 * (in runs), a byte that is not part of a valid sequence is refused or, when
 * lossy, becomes U+FFFD; in JSON mode the text is quoted and the ASCII bytes
 * RFC 8259 section 7 requires are escaped. Whole or nothing.
 */
static sb_status_t text_append(sb_buf_t *b, const uint8_t *s, size_t n, unsigned mode)
{
    int json = (mode & TEXT_JSON) != 0;
    size_t mark = b->len, i = 0;
    sb_status_t st;

    if (json && (st = sb_buf_append_char(b, '"')) != SB_OK)
        return st;
    while (i < n) {
        size_t start = i;
        /* the longest run that goes out as it is */
        while (i < n) {
            uint8_t c;
            size_t k;
            if (n - i >= 8 && (json ? sb__json_plain8(sb__load8(s + i)) : sb__ascii8(sb__load8(s + i)))) {
                i += 8;
                continue;
            }
            c = s[i];
            if (c < 0x80) {
                if (json && (c < 0x20 || c == '"' || c == '\\'))
                    break;
                ++i;
            } else if ((k = sb__utf8_seq(s + i, n - i)) != 0) {
                i += k;
            } else {
                break;
            }
        }
        if (i != start && (st = sb_buf_append(b, s + start, i - start)) != SB_OK)
            goto Fail;
        if (i == n)
            break;
        if (s[i] < 0x80) {
            st = json_escape(b, s[i]); /* JSON mode only: bare text stops at invalid sequences alone */
        } else if (mode & TEXT_LOSSY) {
            st = sb_buf_append(b, "\xef\xbf\xbd", 3); /* U+FFFD REPLACEMENT CHARACTER */
        } else {
            st = SB_E_BAD_ARGS;
        }
        if (st != SB_OK)
            goto Fail;
        ++i;
    }
    if (!json || (st = sb_buf_append_char(b, '"')) == SB_OK)
        return SB_OK;
Fail:
    sb_buf_truncate(b, mark);
    return st;
}

sb_status_t sb_buf_append_json_str(sb_buf_t *b, const void *s, size_t n)
{
    return text_append(b, s, n, TEXT_JSON);
}

sb_status_t sb_buf_append_json_str_lossy(sb_buf_t *b, const void *s, size_t n)
{
    return text_append(b, s, n, TEXT_JSON | TEXT_LOSSY);
}

sb_status_t sb_buf_append_utf8_lossy(sb_buf_t *b, const void *s, size_t n)
{
    return text_append(b, s, n, TEXT_LOSSY);
}

sb_status_t sb_buf_take(sb_buf_t *b, char **out, size_t *len)
{
    if (b->base == NULL) {
        char *p = sb_mem_try_alloc(1);
        if (p == NULL)
            return SB_E_NOMEM;
        p[0] = '\0';
        *out = p;
    } else {
        *out = b->base;
    }
    if (len != NULL)
        *len = b->len;
    b->base = NULL;
    b->len = b->_alloc = 0;
    return SB_OK;
}

/* ---- the reader ------------------------------------------------------------------------------------------------------- */

sb_status_t sb_reader_until(sb_reader_t *r, uint8_t delim, sb_view_t *out)
{
    sb_view_t rest = sb_reader_rest(r);
    const uint8_t *hit = rest.len != 0 ? memchr(rest.base, delim, rest.len) : NULL;

    if (hit == NULL)
        return SB_E_AGAIN;
    return sb_reader_bytes(r, (size_t)(hit - rest.base), out);
}

sb_status_t sb_reader_until_seq(sb_reader_t *r, const void *seq, size_t n, sb_view_t *out)
{
    sb_view_t rest = sb_reader_rest(r);
    const uint8_t *hit;

    if (n == 0)
        return SB_E_BAD_ARGS;
    if (rest.len < n || (hit = memmem(rest.base, rest.len, seq, n)) == NULL)
        return SB_E_AGAIN;
    return sb_reader_bytes(r, (size_t)(hit - rest.base), out);
}

size_t sb_reader_take_charset(sb_reader_t *r, const char *set, size_t set_len, sb_view_t *out)
{
    sb_view_t rest = sb_reader_rest(r), v;
    size_t n = 0;

    while (n < rest.len && set_len != 0 && memchr(set, rest.base[n], set_len) != NULL)
        ++n;
    if (sb_reader_bytes(r, n, &v) != SB_OK) /* cannot fail: n <= rest.len */
        return 0;
    if (out != NULL)
        *out = v;
    return n;
}

static int digit_value(uint8_t c, unsigned base)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (base == 16 && c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (base == 16 && c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static sb_status_t number(sb_reader_t *r, unsigned base, uint64_t max, uint64_t *out)
{
    sb_view_t rest = sb_reader_rest(r);
    uint64_t v = 0;
    size_t n = 0;
    int d;

    for (; n < rest.len && (d = digit_value(rest.base[n], base)) >= 0; ++n) {
        if ((uint64_t)d > max || v > (max - (uint64_t)d) / base)
            return SB_E_TOO_LARGE;
        v = v * base + (uint64_t)d;
    }
    if (n == 0)
        return SB_E_BAD_ARGS;
    *out = v;
    return sb_reader_skip(r, n);
}

sb_status_t sb_reader_dec(sb_reader_t *r, uint64_t max, uint64_t *out)
{
    return number(r, 10, max, out);
}

sb_status_t sb_reader_hex(sb_reader_t *r, uint64_t max, uint64_t *out)
{
    return number(r, 16, max, out);
}
