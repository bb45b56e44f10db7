/*
 * HTTP/1.1 request building and response-head parsing (see http.h).
 */
#include <stdio.h>
#include <string.h>
#include "http.h"

sb_status_t sb_shim_http_build_request(sb_buf_t *out, const sb_shim_url_t *u, const char *token, const uint8_t *body,
                                       size_t body_len)
{
    char cl[32];
    sb_status_t st;

    snprintf(cl, sizeof(cl), "%zu", body_len);
    if ((st = sb_buf_append_str(out, "POST ")) != SB_OK || (st = sb_buf_append_str(out, u->target)) != SB_OK ||
        (st = sb_buf_append_str(out, " HTTP/1.1\r\nHost: ")) != SB_OK || (st = sb_buf_append_str(out, u->host_header)) != SB_OK ||
        (st = sb_buf_append_str(out, "\r\nContent-Type: application/msgpack\r\nAccept: application/msgpack\r\n"
                                     "x-questpie-sandbox-token: ")) != SB_OK ||
        (st = sb_buf_append_str(out, token)) != SB_OK || (st = sb_buf_append_str(out, "\r\nContent-Length: ")) != SB_OK ||
        (st = sb_buf_append_str(out, cl)) != SB_OK || (st = sb_buf_append_str(out, "\r\n\r\n")) != SB_OK ||
        (st = sb_buf_append(out, body, body_len)) != SB_OK)
        return st;
    return SB_OK;
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

static const uint8_t *find_crlf(const uint8_t *p, const uint8_t *end)
{
    for (; p + 1 < end; ++p)
        if (p[0] == '\r' && p[1] == '\n')
            return p;
    return NULL;
}

sb_status_t sb_shim_http_parse_head(const uint8_t *p, size_t len, size_t body_cap, sb_shim_http_head_t *h, const char **why)
{
    const uint8_t *end = NULL, *line, *eol;
    int http10;

    memset(h, 0, sizeof(*h));
    h->content_length = -1;
    for (size_t i = 0; i + 3 < len && i + 4 <= SB_SHIM_MAX_RESPONSE_HEAD; ++i) {
        if (p[i] == '\r' && p[i + 1] == '\n' && p[i + 2] == '\r' && p[i + 3] == '\n') {
            end = p + i + 2; /* the last header line's CRLF is kept inside [p, end) */
            h->head_len = i + 4;
            break;
        }
    }
    if (end == NULL) {
        if (len >= SB_SHIM_MAX_RESPONSE_HEAD) {
            *why = "broker response head is too large";
            return SB_E_TOO_LARGE;
        }
        return SB_E_AGAIN;
    }

    /* status-line = HTTP-version SP status-code SP [ reason-phrase ] (RFC 9112 section 4) */
    if (end - p < 12 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ' || p[9] < '1' || p[9] > '9' ||
        p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9') {
        *why = "broker response has a malformed status line";
        return SB_E_BAD_ARGS;
    }
    http10 = p[7] == '0';
    h->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    h->must_close = http10;
    eol = find_crlf(p, end);
    for (line = eol + 2; line < end; line = eol + 2) {
        const uint8_t *colon, *v, *ve;
        eol = find_crlf(line, end);
        if (eol == NULL)
            eol = end - 2;
        if (line[0] == ' ' || line[0] == '\t') {
            *why = "broker response uses obsolete header folding";
            return SB_E_BAD_ARGS;
        }
        colon = memchr(line, ':', (size_t)(eol - line));
        if (colon == NULL || colon == line) {
            *why = "broker response has a malformed header";
            return SB_E_BAD_ARGS;
        }
        for (v = colon + 1; v < eol && (*v == ' ' || *v == '\t'); ++v)
            ;
        for (ve = eol; ve > v && (ve[-1] == ' ' || ve[-1] == '\t'); --ve)
            ;
        if (name_is(line, (size_t)(colon - line), "content-length")) {
            int64_t n = 0;
            if (ve == v || ve - v > 12) {
                *why = "broker response has an invalid Content-Length";
                return SB_E_BAD_ARGS;
            }
            for (const uint8_t *q = v; q < ve; ++q) {
                if (*q < '0' || *q > '9') {
                    *why = "broker response has an invalid Content-Length";
                    return SB_E_BAD_ARGS;
                }
                n = n * 10 + (*q - '0');
            }
            if (h->content_length >= 0 && h->content_length != n) {
                *why = "broker response has conflicting Content-Length headers";
                return SB_E_BAD_ARGS;
            }
            h->content_length = n;
        } else if (name_is(line, (size_t)(colon - line), "transfer-encoding")) {
            *why = "broker response uses a transfer coding (unsupported)";
            return SB_E_BAD_ARGS;
        } else if (name_is(line, (size_t)(colon - line), "connection")) {
            if (has_token(v, (size_t)(ve - v), "close"))
                h->must_close = 1;
            else if (http10 && has_token(v, (size_t)(ve - v), "keep-alive"))
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
