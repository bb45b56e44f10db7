/*
 * sandbox-broker: one capped growable buffer (sb_buf_t) and one bounded
 * reader (sb_reader_t), the lowest layer (STYLE rules 7 and 10).
 *
 * sb_buf_t follows curl's dynbuf: every buffer has a hard cap set when it is
 * made, there is one growth rule (double, at least what is asked, never past
 * the cap), and going past the cap is SB_E_TOO_LARGE before anything is
 * allocated for it. The bytes are always followed by a NUL (once anything was
 * allocated), so text built here can be handed to APIs that want C strings;
 * the buffer itself is binary-safe. Every append either happens whole or not
 * at all: on any failure the buffer holds exactly what it held before.
 *
 * sb_reader_t follows c-ares' ares_buf: a cursor over bytes that someone else
 * owns, whose every fetch checks the bytes left and either succeeds whole or
 * fails without moving. A reader is a plain value: copy it to remember a
 * position, assign the copy back to return there.
 *
 * Neither type locks: one thread uses a given buffer or reader at a time.
 * Allocation goes through sb/mem.h (so sb_mem_fail_nth reaches it).
 */
#ifndef SB_BUF_H
#define SB_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "sb/limits.h"
#include "sb/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- views ------------------------------------------------------------------------------------------------------------ */

/** bytes owned by someone else (not NUL-terminated): lives as long as what it points into */
typedef struct st_sb_view_t {
    const uint8_t *base;
    size_t len;
} sb_view_t;

/* ---- sb_buf_t --------------------------------------------------------------------------------------------------------- */

/**
 * A capped growable buffer. `base` and `len` may be read directly and are
 * changed only through the functions below; `_`-members are private.
 */
typedef struct st_sb_buf_t {
    /** the bytes (owned by the buffer); NULL until something was allocated, then base[len] == '\0' */
    char *base;
    /** bytes in use, never above the cap */
    size_t len;
    size_t _alloc; /* bytes allocated at base (room for len + the NUL) */
    size_t _cap;   /* len never exceeds this */
    unsigned _flags;
} sb_buf_t;

/**
 * Initialises an empty buffer that will hold at most `cap` bytes. Allocates
 * nothing. A cap above SB_BUF_MAX_CAP is lowered to it.
 */
void sb_buf_init(sb_buf_t *b, size_t cap);
/**
 * As sb_buf_init, for a buffer that will hold a secret (a token, a key, a
 * password): every byte it ever held is zeroed before its memory is released
 * or reused (growth copies and zeroes instead of realloc; reset, truncate,
 * consume and free zero what they drop). sb_buf_take hands the duty over to
 * the caller (sb_mem_free_secret).
 */
void sb_buf_init_secret(sb_buf_t *b, size_t cap);
/**
 * Changes the cap for later appends. A cap below the current length is raised
 * to the length (nothing is dropped); storage is not shrunk.
 */
void sb_buf_set_cap(sb_buf_t *b, size_t cap);
/** the buffer's cap */
static inline size_t sb_buf_cap(const sb_buf_t *b);
/** how many more bytes may be appended before the cap */
static inline size_t sb_buf_room(const sb_buf_t *b);
/** releases the storage; the buffer is empty, keeps its cap and flags, and may be used again */
void sb_buf_free(sb_buf_t *b);
/** empties the buffer and keeps its storage for reuse */
void sb_buf_reset(sb_buf_t *b);
/** shortens the buffer to `len` bytes (a length at or above the current one changes nothing) */
void sb_buf_truncate(sb_buf_t *b, size_t len);
/** drops the first `n` bytes, moving the rest to the front (n >= len empties it) */
void sb_buf_consume(sb_buf_t *b, size_t n);

/**
 * Makes room for `n` more bytes without adding them: on SB_OK, *room points
 * at base + len with at least n writable bytes. Write into it, then
 * sb_buf_commit what was written. *room is valid until the next call that
 * changes the buffer.
 * @return SB_OK, SB_E_TOO_LARGE (len + n above the cap; nothing allocated) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_buf_reserve(sb_buf_t *b, size_t n, char **room);
/** after sb_buf_reserve(b, m, ..): adds the first `n` (<= m) reserved bytes to the buffer */
static inline void sb_buf_commit(sb_buf_t *b, size_t n);

/**
 * Appends `n` bytes (`p` may be NULL when n is 0).
 * @return SB_OK, SB_E_TOO_LARGE (nothing appended) or SB_E_NOMEM (nothing appended)
 */
SB_WARN_UNUSED static inline sb_status_t sb_buf_append(sb_buf_t *b, const void *p, size_t n);
/** appends one byte; statuses as sb_buf_append */
SB_WARN_UNUSED static inline sb_status_t sb_buf_append_char(sb_buf_t *b, char c);
/** appends a NUL-terminated string (without its NUL); statuses as sb_buf_append */
SB_WARN_UNUSED sb_status_t sb_buf_append_str(sb_buf_t *b, const char *s);
/**
 * Appends printf-formatted text, whole or not at all: output that would pass
 * the cap is SB_E_TOO_LARGE, never a truncated line.
 * @return SB_OK, SB_E_TOO_LARGE, SB_E_NOMEM, or SB_E_BAD_ARGS (the format failed, e.g. a bad wide character)
 */
SB_WARN_UNUSED __attribute__((format(printf, 2, 3))) sb_status_t sb_buf_printf(sb_buf_t *b, const char *fmt, ...);
/** sb_buf_printf with a va_list (which it does not consume: the caller still owns and ends it) */
SB_WARN_UNUSED __attribute__((format(printf, 2, 0))) sb_status_t sb_buf_vprintf(sb_buf_t *b, const char *fmt, va_list ap);
/**
 * Appends `n` bytes of UTF-8 as a JSON string, quotes included (RFC 8259
 * section 7): '"' and '\\' escaped, \b \f \n \r \t as short escapes, every
 * other byte below 0x20 (NUL included) as \u00XX, everything else as it is.
 * The output is always valid JSON and valid UTF-8 (the byte-for-byte choices
 * are jansson's, so replies do not change).
 * @return SB_OK, SB_E_BAD_ARGS (`s` is not valid UTF-8: no overlongs,
 *         surrogates or code points above U+10FFFF), SB_E_TOO_LARGE, SB_E_NOMEM;
 *         nothing is appended on failure
 */
SB_WARN_UNUSED sb_status_t sb_buf_append_json_str(sb_buf_t *b, const void *s, size_t n);
/**
 * As sb_buf_append_json_str, for text that may not be UTF-8 (guest strings
 * echoed into messages and log lines): each byte that is not part of a valid
 * sequence becomes U+FFFD, so the output is valid UTF-8 whatever the input.
 * @return SB_OK, SB_E_TOO_LARGE or SB_E_NOMEM; nothing is appended on failure
 */
SB_WARN_UNUSED sb_status_t sb_buf_append_json_str_lossy(sb_buf_t *b, const void *s, size_t n);
/**
 * Hands the bytes over: *out receives a NUL-terminated block of *len + 1
 * bytes that the caller releases with sb_mem_free (sb_mem_free_secret for a
 * secret buffer); the buffer is left empty, with no storage. An empty buffer
 * that never allocated yields a fresh "" (which is why this can fail).
 * @param len may be NULL
 * @return SB_OK or SB_E_NOMEM (the buffer is then unchanged)
 */
SB_WARN_UNUSED sb_status_t sb_buf_take(sb_buf_t *b, char **out, size_t *len);
/** the bytes as a view (valid until the buffer changes) */
static inline sb_view_t sb_buf_view(const sb_buf_t *b);

/** the slow path of sb_buf_append (internal) */
SB_WARN_UNUSED sb_status_t sb_buf__append_slow(sb_buf_t *b, const void *p, size_t n);

/* ---- sb_reader_t ------------------------------------------------------------------------------------------------------ */

/** a bounded cursor over bytes it does not own; all members are private */
typedef struct st_sb_reader_t {
    const uint8_t *_base; /* where the reader started */
    const uint8_t *_p;    /* the next byte */
    const uint8_t *_end;  /* one past the last byte */
} sb_reader_t;

/*
 * Every fetch below either succeeds whole, or fails and leaves the reader
 * where it was. Running out of bytes is SB_E_AGAIN ("the input ends first"):
 * an incremental parser waits for more, a parser of a whole message maps it to
 * its own "truncated" error. Views point into the reader's bytes.
 */

/** starts a reader over `len` bytes at `p` (which must outlive the reader and every view it returns); NULL reads as no bytes */
static inline void sb_reader_init(sb_reader_t *r, const void *p, size_t len);
/** bytes left */
static inline size_t sb_reader_remaining(const sb_reader_t *r);
/** bytes consumed since sb_reader_init */
static inline size_t sb_reader_offset(const sb_reader_t *r);
/** the bytes left, as a view, without consuming them */
static inline sb_view_t sb_reader_rest(const sb_reader_t *r);

/** the next byte, consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_u8(sb_reader_t *r, uint8_t *out);
/** the next byte, not consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_peek(const sb_reader_t *r, uint8_t *out);
/** the byte `off` bytes ahead (0: the next), not consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_peek_at(const sb_reader_t *r, size_t off, uint8_t *out);
/** a big-endian 16-bit integer, consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_be16(sb_reader_t *r, uint16_t *out);
/** a big-endian 32-bit integer, consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_be32(sb_reader_t *r, uint32_t *out);
/** a big-endian 64-bit integer, consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_be64(sb_reader_t *r, uint64_t *out);
/** the next `n` bytes as a view, consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_bytes(sb_reader_t *r, size_t n, sb_view_t *out);
/** the next `n` bytes as a view, not consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_peek_bytes(const sb_reader_t *r, size_t n, sb_view_t *out);
/** copies the next `n` bytes to `dst`, consumed. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_copy(sb_reader_t *r, void *dst, size_t n);
/** consumes `n` bytes. @return SB_OK or SB_E_AGAIN */
SB_WARN_UNUSED static inline sb_status_t sb_reader_skip(sb_reader_t *r, size_t n);
/** 1 (and consumes them) when the next `n` bytes equal `lit`; else 0, nothing consumed */
static inline int sb_reader_expect(sb_reader_t *r, const void *lit, size_t n);

/**
 * The bytes before the first `delim`: *out is a view of them, they are
 * consumed, the delimiter is not (sb_reader_skip(r, 1) takes it).
 * @return SB_OK, or SB_E_AGAIN when no `delim` is left (nothing consumed)
 */
SB_WARN_UNUSED sb_status_t sb_reader_until(sb_reader_t *r, uint8_t delim, sb_view_t *out);
/**
 * The bytes before the first occurrence of the `n`-byte sequence `seq` (n >= 1),
 * as sb_reader_until: consumed without the sequence.
 * @return SB_OK, SB_E_AGAIN (no occurrence; nothing consumed), SB_E_BAD_ARGS (n == 0)
 */
SB_WARN_UNUSED sb_status_t sb_reader_until_seq(sb_reader_t *r, const void *seq, size_t n, sb_view_t *out);
/**
 * Consumes the longest run of bytes that occur in the `set_len` bytes of
 * `set`; *out (may be NULL) receives a view of them.
 * @return how many bytes were consumed (0 is not an error)
 */
size_t sb_reader_take_charset(sb_reader_t *r, const char *set, size_t set_len, sb_view_t *out);
/**
 * An unsigned decimal number: one or more ASCII digits, as many as there are,
 * consumed. Leading zeros are accepted (callers that forbid them check the view).
 * @return SB_OK, SB_E_BAD_ARGS (no digit next), SB_E_TOO_LARGE (above `max`);
 *         nothing is consumed on failure
 */
SB_WARN_UNUSED sb_status_t sb_reader_dec(sb_reader_t *r, uint64_t max, uint64_t *out);
/** as sb_reader_dec, for hexadecimal digits (either case) */
SB_WARN_UNUSED sb_status_t sb_reader_hex(sb_reader_t *r, uint64_t max, uint64_t *out);

/** the big-endian integers at `p` (which must hold 2, 4 or 8 bytes) */
static inline uint16_t sb_load_be16(const uint8_t *p);
static inline uint32_t sb_load_be32(const uint8_t *p);
static inline uint64_t sb_load_be64(const uint8_t *p);

/* inline definitions */

static inline size_t sb_buf_cap(const sb_buf_t *b)
{
    return b->_cap;
}

static inline size_t sb_buf_room(const sb_buf_t *b)
{
    return b->_cap - b->len;
}

static inline void sb_buf_commit(sb_buf_t *b, size_t n)
{
    b->len += n;
    b->base[b->len] = '\0';
}

static inline sb_status_t sb_buf_append(sb_buf_t *b, const void *p, size_t n)
{
    /* fast path: fits the cap and the storage, with room left for the NUL */
    if (n <= b->_cap - b->len && n < b->_alloc - b->len) {
        if (n != 0)
            memcpy(b->base + b->len, p, n);
        b->len += n;
        b->base[b->len] = '\0';
        return SB_OK;
    }
    return sb_buf__append_slow(b, p, n);
}

static inline sb_status_t sb_buf_append_char(sb_buf_t *b, char c)
{
    if (b->len < b->_cap && b->len + 1 < b->_alloc) {
        b->base[b->len++] = c;
        b->base[b->len] = '\0';
        return SB_OK;
    }
    return sb_buf__append_slow(b, &c, 1);
}

static inline sb_view_t sb_buf_view(const sb_buf_t *b)
{
    sb_view_t v = {(const uint8_t *)b->base, b->len};
    return v;
}

static inline uint16_t sb_load_be16(const uint8_t *p)
{
    return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline uint32_t sb_load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t sb_load_be64(const uint8_t *p)
{
    return (uint64_t)sb_load_be32(p) << 32 | sb_load_be32(p + 4);
}

static inline void sb_reader_init(sb_reader_t *r, const void *p, size_t len)
{
    /* a reader over nothing still points somewhere, so no fetch does arithmetic on NULL */
    if (p == NULL)
        p = "", len = 0;
    r->_base = r->_p = (const uint8_t *)p;
    r->_end = r->_p + len;
}

static inline size_t sb_reader_remaining(const sb_reader_t *r)
{
    return (size_t)(r->_end - r->_p);
}

static inline size_t sb_reader_offset(const sb_reader_t *r)
{
    return (size_t)(r->_p - r->_base);
}

static inline sb_view_t sb_reader_rest(const sb_reader_t *r)
{
    sb_view_t v = {r->_p, sb_reader_remaining(r)};
    return v;
}

static inline sb_status_t sb_reader_u8(sb_reader_t *r, uint8_t *out)
{
    if (r->_p == r->_end)
        return SB_E_AGAIN;
    *out = *r->_p++;
    return SB_OK;
}

static inline sb_status_t sb_reader_peek(const sb_reader_t *r, uint8_t *out)
{
    if (r->_p == r->_end)
        return SB_E_AGAIN;
    *out = *r->_p;
    return SB_OK;
}

static inline sb_status_t sb_reader_peek_at(const sb_reader_t *r, size_t off, uint8_t *out)
{
    if (off >= sb_reader_remaining(r))
        return SB_E_AGAIN;
    *out = r->_p[off];
    return SB_OK;
}

static inline sb_status_t sb_reader_be16(sb_reader_t *r, uint16_t *out)
{
    if (sb_reader_remaining(r) < 2)
        return SB_E_AGAIN;
    *out = sb_load_be16(r->_p);
    r->_p += 2;
    return SB_OK;
}

static inline sb_status_t sb_reader_be32(sb_reader_t *r, uint32_t *out)
{
    if (sb_reader_remaining(r) < 4)
        return SB_E_AGAIN;
    *out = sb_load_be32(r->_p);
    r->_p += 4;
    return SB_OK;
}

static inline sb_status_t sb_reader_be64(sb_reader_t *r, uint64_t *out)
{
    if (sb_reader_remaining(r) < 8)
        return SB_E_AGAIN;
    *out = sb_load_be64(r->_p);
    r->_p += 8;
    return SB_OK;
}

static inline sb_status_t sb_reader_peek_bytes(const sb_reader_t *r, size_t n, sb_view_t *out)
{
    if (n > sb_reader_remaining(r))
        return SB_E_AGAIN;
    out->base = r->_p;
    out->len = n;
    return SB_OK;
}

static inline sb_status_t sb_reader_bytes(sb_reader_t *r, size_t n, sb_view_t *out)
{
    if (n > sb_reader_remaining(r))
        return SB_E_AGAIN;
    out->base = r->_p;
    out->len = n;
    r->_p += n;
    return SB_OK;
}

static inline sb_status_t sb_reader_copy(sb_reader_t *r, void *dst, size_t n)
{
    if (n > sb_reader_remaining(r))
        return SB_E_AGAIN;
    if (n != 0)
        memcpy(dst, r->_p, n);
    r->_p += n;
    return SB_OK;
}

static inline sb_status_t sb_reader_skip(sb_reader_t *r, size_t n)
{
    if (n > sb_reader_remaining(r))
        return SB_E_AGAIN;
    r->_p += n;
    return SB_OK;
}

static inline int sb_reader_expect(sb_reader_t *r, const void *lit, size_t n)
{
    if (n > sb_reader_remaining(r) || (n != 0 && memcmp(r->_p, lit, n) != 0))
        return 0;
    r->_p += n;
    return 1;
}

#ifdef __cplusplus
}
#endif
#endif
