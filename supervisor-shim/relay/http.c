/*
 * HTTP/1.1 request building and response-head parsing (see http.h). The
 * request goes into the caller's capped sb_buf_t; the head is read with
 * sb_reader_t, whose every fetch checks the bytes left.
 */
#include <stdio.h>
#include <string.h>
#include "sb/buf.h"
#include "relay/http.h"

static sb_status_t build_request(sb_buf_t *out, const sb_shim_url_t *u, const char *token, const char *extra, const uint8_t *body,
                                 size_t body_len)
{
    char cl[32];
    sb_status_t st;

    snprintf(cl, sizeof(cl), "%zu", body_len);
    if ((st = sb_buf_append_str(out, "POST ")) != SB_OK || (st = sb_buf_append_str(out, u->target)) != SB_OK ||
        (st = sb_buf_append_str(out, " HTTP/1.1\r\nHost: ")) != SB_OK || (st = sb_buf_append_str(out, u->host_header)) != SB_OK ||
        (st = sb_buf_append_str(out, "\r\nContent-Type: application/msgpack\r\nAccept: application/msgpack\r\n"
                                     "x-questpie-sandbox-token: ")) != SB_OK ||
        (st = sb_buf_append_str(out, token)) != SB_OK || (st = sb_buf_append_str(out, extra)) != SB_OK ||
        (st = sb_buf_append_str(out, "\r\nContent-Length: ")) != SB_OK || (st = sb_buf_append_str(out, cl)) != SB_OK ||
        (st = sb_buf_append_str(out, "\r\n\r\n")) != SB_OK || (st = sb_buf_append(out, body, body_len)) != SB_OK)
        return st;
    return SB_OK;
}

sb_status_t sb_shim_http_build_request(sb_buf_t *out, const sb_shim_url_t *u, const char *token, const uint8_t *body,
                                       size_t body_len)
{
    return build_request(out, u, token, "", body, body_len);
}

sb_status_t sb_shim_http_build_module_request(sb_buf_t *out, const sb_shim_url_t *u, const char *token, const uint8_t *body,
                                              size_t body_len)
{
    /* the supervisor's own call (PROTOCOL.md section 6c): never sent for a guest's */
    return build_request(out, u, token, "\r\nx-sandbox-module-fetch: 1", body, body_len);
}

static int lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static int name_is(const uint8_t *p, size_t len, const char *name)
{
    size_t n = strlen(name);

    if (len != n)
        return 0;
    for (size_t i = 0; i < n; ++i)
        if (lower(p[i]) != name[i])
            return 0;
    return 1;
}

/* 1 if the comma-separated list `v` holds the token `tok` (case-insensitive) */
static int has_token(const uint8_t *v, size_t len, const char *tok)
{
    size_t i = 0;

    while (i < len) {
        size_t s, e;
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            ++i;
        s = i;
        while (i < len && v[i] != ',')
            ++i;
        e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            --e;
        if (e > s && name_is(v + s, e - s, tok))
            return 1;
    }
    return 0;
}

/* a view without the spaces and tabs at its end (RFC 9110 section 5.5: OWS around a field value) */
static sb_view_t trim_ows_end(sb_view_t v)
{
    while (v.len != 0 && (v.base[v.len - 1] == ' ' || v.base[v.len - 1] == '\t'))
        --v.len;
    return v;
}

/* Content-Length = 1*DIGIT (RFC 9110 section 8.6), at most 12 digits here */
static int parse_content_length(sb_view_t v, int64_t *out)
{
    sb_reader_t r;
    uint64_t n;

    if (v.len == 0 || v.len > 12)
        return 0;
    sb_reader_init(&r, v.base, v.len);
    if (sb_reader_dec(&r, UINT64_MAX, &n) != SB_OK || sb_reader_remaining(&r) != 0)
        return 0;
    *out = (int64_t)n;
    return 1;
}

/* status-line = HTTP-version SP status-code SP [ reason-phrase ] (RFC 9112 section 4); the reason is not read */
static int parse_status_line(sb_reader_t *r, int *http10, int *status)
{
    uint8_t minor, sp, d[3];

    if (!sb_reader_expect(r, "HTTP/1.", 7) || sb_reader_u8(r, &minor) != SB_OK || (minor != '0' && minor != '1') ||
        sb_reader_u8(r, &sp) != SB_OK || sp != ' ' || sb_reader_copy(r, d, 3) != SB_OK || d[0] < '1' || d[0] > '9' || d[1] < '0' ||
        d[1] > '9' || d[2] < '0' || d[2] > '9')
        return 0;
    *http10 = minor == '0';
    *status = (d[0] - '0') * 100 + (d[1] - '0') * 10 + (d[2] - '0');
    return 1;
}

sb_status_t sb_shim_http_parse_head(const uint8_t *p, size_t len, size_t body_cap, sb_shim_http_head_t *h, const char **why)
{
    sb_reader_t r, hr;
    sb_view_t head, line;
    int http10;

    memset(h, 0, sizeof(*h));
    h->content_length = -1;
    /* the head ends at the first empty line, which must end within SB_SHIM_MAX_RESPONSE_HEAD bytes */
    sb_reader_init(&r, p, len < SB_SHIM_MAX_RESPONSE_HEAD ? len : SB_SHIM_MAX_RESPONSE_HEAD);
    if (sb_reader_until_seq(&r, "\r\n\r\n", 4, &head) != SB_OK) {
        if (len >= SB_SHIM_MAX_RESPONSE_HEAD) {
            *why = "broker response head is too large";
            return SB_E_TOO_LARGE;
        }
        return SB_E_AGAIN;
    }
    h->head_len = head.len + 4;
    /* every line of the head, the last one's CRLF included, so each line ends in CRLF */
    sb_reader_init(&hr, p, head.len + 2);
    if (!parse_status_line(&hr, &http10, &h->status)) {
        *why = "broker response has a malformed status line";
        return SB_E_BAD_ARGS;
    }
    h->must_close = http10;
    /* the rest of the status line (the reason phrase) is not needed; the head holds its CRLF */
    if (sb_reader_until_seq(&hr, "\r\n", 2, &line) != SB_OK || sb_reader_skip(&hr, 2) != SB_OK) {
        *why = "broker response has a malformed status line";
        return SB_E_BAD_ARGS;
    }
    while (sb_reader_remaining(&hr) != 0) {
        sb_reader_t lr;
        sb_view_t name, value;
        uint8_t c0;

        if (sb_reader_until_seq(&hr, "\r\n", 2, &line) != SB_OK || sb_reader_skip(&hr, 2) != SB_OK) {
            *why = "broker response has a malformed header";
            return SB_E_BAD_ARGS;
        }
        sb_reader_init(&lr, line.base, line.len);
        /* RFC 9112 section 5.2: a recipient that is not a proxy may refuse obs-fold */
        if (sb_reader_peek(&lr, &c0) == SB_OK && (c0 == ' ' || c0 == '\t')) {
            *why = "broker response uses obsolete header folding";
            return SB_E_BAD_ARGS;
        }
        if (sb_reader_until(&lr, ':', &name) != SB_OK || name.len == 0 || sb_reader_skip(&lr, 1) != SB_OK) {
            *why = "broker response has a malformed header";
            return SB_E_BAD_ARGS;
        }
        sb_reader_take_charset(&lr, " \t", 2, NULL);
        value = trim_ows_end(sb_reader_rest(&lr));
        if (name_is(name.base, name.len, "content-length")) {
            int64_t n;
            if (!parse_content_length(value, &n)) {
                *why = "broker response has an invalid Content-Length";
                return SB_E_BAD_ARGS;
            }
            if (h->content_length >= 0 && h->content_length != n) {
                *why = "broker response has conflicting Content-Length headers";
                return SB_E_BAD_ARGS;
            }
            h->content_length = n;
        } else if (name_is(name.base, name.len, "transfer-encoding")) {
            *why = "broker response uses a transfer coding (unsupported)";
            return SB_E_BAD_ARGS;
        } else if (name_is(name.base, name.len, "connection")) {
            if (has_token(value.base, value.len, "close"))
                h->must_close = 1;
            else if (http10 && has_token(value.base, value.len, "keep-alive"))
                h->must_close = 0;
        }
    }
    if (h->status == 204 || h->status == 304 || h->status < 200)
        h->content_length = 0;
    if (h->content_length < 0)
        h->must_close = 1;
    if (h->content_length > 0 && (uint64_t)h->content_length > body_cap) {
        *why = "broker response body is too large";
        return SB_E_TOO_LARGE;
    }
    return SB_OK;
}
