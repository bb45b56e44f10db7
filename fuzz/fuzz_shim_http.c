/*
 * libFuzzer driver for supervisor-shim/relay/http.c: sb_shim_http_parse_head, the
 * shim's reader of the broker's response head (RFC 9112 sections 4, 5 and
 * 6.3), built on sb_reader_t. http.c is compiled into this driver (#include
 * below), as fuzz_shim_frames.c does with frames.c.
 *
 * Input: bytes 0-1 are the body cap (big-endian), the rest is what the
 * broker sent, parsed from an exact-size heap copy (so a read past the end
 * faults under ASan). Properties:
 *   1. the verdict, the reason and every field agree with a reference
 *      written independently over indices (the rules of http.h: the head ends
 *      at the first CRLF CRLF within SB_SHIM_MAX_RESPONSE_HEAD bytes, status
 *      line "HTTP/1.0|1 DDD", no folding, a colon and a name on every line,
 *      Content-Length 1 to 12 digits and never two different ones, no
 *      Transfer-Encoding, Connection close / keep-alive);
 *   2. on SB_OK: the head is at most the cap, ends in CRLF CRLF with no
 *      earlier one, content_length is -1 or at most the body cap, and a
 *      response without a length must close;
 *   3. the bytes after the head never change the verdict: parsing the head
 *      alone gives the same result;
 *   4. SB_E_AGAIN only below the cap and without a CRLF CRLF in it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "fuzz.h"
#include "../supervisor-shim/relay/http.c"

typedef struct st_ref_t {
    sb_status_t st;
    const char *why;
    sb_shim_http_head_t h;
} ref_t;

static int ref_lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

static int ref_name(const uint8_t *p, size_t n, const char *name)
{
    size_t k = strlen(name);
    if (n != k)
        return 0;
    for (size_t i = 0; i < n; ++i)
        if (ref_lower(p[i]) != name[i])
            return 0;
    return 1;
}

/* the comma-separated list at p[0..n) holds `tok` (case-insensitive, OWS around elements) */
static int ref_token(const uint8_t *p, size_t n, const char *tok)
{
    size_t i = 0;
    while (i < n) {
        size_t s, e;
        while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == ','))
            ++i;
        for (s = i; i < n && p[i] != ','; ++i)
            ;
        for (e = i; e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'); --e)
            ;
        if (e > s && ref_name(p + s, e - s, tok))
            return 1;
    }
    return 0;
}

static ref_t ref_fail(sb_status_t st, const char *why)
{
    ref_t r;
    memset(&r, 0, sizeof(r));
    r.st = st;
    r.why = why;
    return r;
}

static ref_t reference(const uint8_t *p, size_t len, size_t body_cap)
{
    ref_t r;
    size_t hl = 0, i, end;
    int found = 0, http10;

    memset(&r, 0, sizeof(r));
    for (i = 0; i + 4 <= len && i + 4 <= SB_SHIM_MAX_RESPONSE_HEAD; ++i)
        if (memcmp(p + i, "\r\n\r\n", 4) == 0) {
            found = 1;
            hl = i + 4;
            break;
        }
    if (!found)
        return len >= SB_SHIM_MAX_RESPONSE_HEAD ? ref_fail(SB_E_TOO_LARGE, "broker response head is too large")
                                                : ref_fail(SB_E_AGAIN, NULL);
    end = hl - 2; /* lines are p[..end), each ending in CRLF */
    if (hl < 14 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ' || p[9] < '1' || p[9] > '9' ||
        p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9')
        return ref_fail(SB_E_BAD_ARGS, "broker response has a malformed status line");
    http10 = p[7] == '0';
    r.h.status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    r.h.head_len = hl;
    r.h.content_length = -1;
    r.h.must_close = http10;
    for (i = 12; !(p[i] == '\r' && p[i + 1] == '\n'); ++i)
        ;
    i += 2;
    while (i < end) {
        size_t ls = i, le, c, vs, ve;
        for (le = ls; !(p[le] == '\r' && p[le + 1] == '\n'); ++le)
            ;
        i = le + 2;
        if (p[ls] == ' ' || p[ls] == '\t')
            return ref_fail(SB_E_BAD_ARGS, "broker response uses obsolete header folding");
        for (c = ls; c < le && p[c] != ':'; ++c)
            ;
        if (c == le || c == ls)
            return ref_fail(SB_E_BAD_ARGS, "broker response has a malformed header");
        for (vs = c + 1; vs < le && (p[vs] == ' ' || p[vs] == '\t'); ++vs)
            ;
        for (ve = le; ve > vs && (p[ve - 1] == ' ' || p[ve - 1] == '\t'); --ve)
            ;
        if (ref_name(p + ls, c - ls, "content-length")) {
            int64_t n = 0;
            if (ve == vs || ve - vs > 12)
                return ref_fail(SB_E_BAD_ARGS, "broker response has an invalid Content-Length");
            for (size_t k = vs; k < ve; ++k) {
                if (p[k] < '0' || p[k] > '9')
                    return ref_fail(SB_E_BAD_ARGS, "broker response has an invalid Content-Length");
                n = n * 10 + (p[k] - '0');
            }
            if (r.h.content_length >= 0 && r.h.content_length != n)
                return ref_fail(SB_E_BAD_ARGS, "broker response has conflicting Content-Length headers");
            r.h.content_length = n;
        } else if (ref_name(p + ls, c - ls, "transfer-encoding")) {
            return ref_fail(SB_E_BAD_ARGS, "broker response uses a transfer coding (unsupported)");
        } else if (ref_name(p + ls, c - ls, "connection")) {
            if (ref_token(p + vs, ve - vs, "close"))
                r.h.must_close = 1;
            else if (http10 && ref_token(p + vs, ve - vs, "keep-alive"))
                r.h.must_close = 0;
        }
    }
    if (r.h.status == 204 || r.h.status == 304 || r.h.status < 200)
        r.h.content_length = 0;
    if (r.h.content_length < 0)
        r.h.must_close = 1;
    if (r.h.content_length > 0 && (uint64_t)r.h.content_length > body_cap)
        return ref_fail(SB_E_TOO_LARGE, "broker response body is too large");
    r.st = SB_OK;
    return r;
}

static int same_head(const sb_shim_http_head_t *a, const sb_shim_http_head_t *b)
{
    return a->status == b->status && a->head_len == b->head_len && a->content_length == b->content_length &&
           a->must_close == b->must_close;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t body_cap, len;
    uint8_t *p;
    sb_shim_http_head_t h, h2;
    const char *why = NULL, *why2 = NULL;
    sb_status_t st, st2;
    ref_t ref;

    if (size < 2)
        return 0;
    body_cap = (size_t)data[0] << 8 | data[1];
    len = size - 2;
    if ((p = malloc(len != 0 ? len : 1)) == NULL)
        return 0;
    memcpy(p, data + 2, len);

    st = sb_shim_http_parse_head(p, len, body_cap, &h, &why);
    ref = reference(p, len, body_cap);
    /* 1. */
    SB_FUZZ_ASSERT(st == ref.st, "status %d, reference %d", (int)st, (int)ref.st);
    if (st != SB_OK && st != SB_E_AGAIN)
        SB_FUZZ_ASSERT(why != NULL && ref.why != NULL && strcmp(why, ref.why) == 0, "reason \"%s\", reference \"%s\"",
                       why != NULL ? why : "(null)", ref.why != NULL ? ref.why : "(null)");
    if (st == SB_OK) {
        SB_FUZZ_ASSERT(same_head(&h, &ref.h), "head %d/%zu/%lld/%d, reference %d/%zu/%lld/%d", h.status, h.head_len,
                       (long long)h.content_length, h.must_close, ref.h.status, ref.h.head_len, (long long)ref.h.content_length,
                       ref.h.must_close);
        /* 2. */
        SB_FUZZ_ASSERT(h.head_len >= 4 && h.head_len <= len && h.head_len <= SB_SHIM_MAX_RESPONSE_HEAD &&
                           memcmp(p + h.head_len - 4, "\r\n\r\n", 4) == 0 &&
                           memmem(p, h.head_len, "\r\n\r\n", 4) == p + h.head_len - 4,
                       "head of %zu bytes does not end at the first CRLF CRLF", h.head_len);
        SB_FUZZ_ASSERT(h.content_length >= -1 && (h.content_length <= 0 || (uint64_t)h.content_length <= body_cap),
                       "content length %lld against a cap of %zu", (long long)h.content_length, body_cap);
        SB_FUZZ_ASSERT(h.content_length >= 0 || h.must_close, "no length, yet the connection is kept");
    }
    /* 3. */
    if (st == SB_OK || st == SB_E_BAD_ARGS ||
        (st == SB_E_TOO_LARGE && why != NULL && strcmp(why, "broker response body is too large") == 0)) {
        size_t hl = st == SB_OK ? h.head_len : 0;
        if (hl == 0) {
            const uint8_t *e = memmem(p, len, "\r\n\r\n", 4);
            hl = e != NULL ? (size_t)(e - p) + 4 : 0;
        }
        if (hl != 0 && hl < len) {
            st2 = sb_shim_http_parse_head(p, hl, body_cap, &h2, &why2);
            SB_FUZZ_ASSERT(st2 == st && (st != SB_OK || same_head(&h, &h2)) && (st == SB_OK || why2 == why),
                           "the bytes after the head changed the verdict (%d then %d)", (int)st, (int)st2);
        }
    }
    /* 4. */
    if (st == SB_E_AGAIN)
        SB_FUZZ_ASSERT(len < SB_SHIM_MAX_RESPONSE_HEAD && memmem(p, len, "\r\n\r\n", 4) == NULL, "AGAIN on a complete head");
    free(p);
    return 0;
}
