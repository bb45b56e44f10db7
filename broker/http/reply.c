/*
 * broker/http: answering a request (reply.h).
 *
 * The error body is written by hand rather than through jansson or a
 * msgpack packer: it is three short strings, and building a tree for them
 * cost more than the whole capability check. Writing it here also lets one
 * function guarantee what every error reply is: valid UTF-8 (each byte of a
 * broken sequence becomes U+FFFD, RFC 3629 section 3 for what is valid) and,
 * in JSON, a valid document (RFC 8259 section 7 escaping).
 */
#include <stdatomic.h>
#include <string.h>
#include "http/reply.h"
#include "http/worker.h"
#include "util/util.h"

void sb_reply_send(h2o_req_t *req, sb_status_t st, const char *ctype, const char *body, size_t len)
{
    static h2o_generator_t generator = {NULL, NULL};
    h2o_iovec_t buf = len != 0 ? h2o_strdup(&req->pool, body, len) : h2o_iovec_init(NULL, 0);

    req->res.status = sb_status_http(st);
    req->res.reason = sb_status_phrase(st);
    req->res.content_length = len;
    if (ctype != NULL)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, ctype, strlen(ctype));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    if (sb_current_worker != NULL && atomic_load_explicit(&sb_current_worker->server->stopping, memory_order_relaxed))
        req->http1_is_persistent = 0;
    h2o_start_response(req, &generator);
    h2o_send(req, &buf, len != 0 ? 1 : 0, H2O_SEND_STATE_FINAL);
}

/* ---- the error body --------------------------------------------------------------------------------------------- */

/* the length of the valid UTF-8 sequence at s (strict: no overlongs, surrogates or code points above U+10FFFF), or 0 */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        unsigned char lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        return n >= 3 && s[1] >= lo && s[1] <= hi && (s[2] & 0xc0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        unsigned char lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        return n >= 4 && s[1] >= lo && s[1] <= hi && (s[2] & 0xc0) == 0x80 && (s[3] & 0xc0) == 0x80 ? 4 : 0;
    }
    return 0;
}

/*
 * Copies `s` as text: valid sequences as they are, every other byte as
 * U+FFFD; in JSON with quote, backslash and control characters escaped.
 * Writes at most 6 bytes per input byte.
 */
static size_t put_text(char *out, const char *s, size_t n, int json)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, i = 0;

    while (i < n) {
        size_t k = utf8_seq(p + i, n - i);
        unsigned char c = p[i];
        if (k == 0) {
            if (json) {
                memcpy(out + o, "\\ufffd", 6);
                o += 6;
            } else {
                memcpy(out + o, "\xef\xbf\xbd", 3);
                o += 3;
            }
            ++i;
            continue;
        }
        if (json && k == 1 && (c == '"' || c == '\\')) {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (json && k == 1 && (c < 0x20 || c == 0x7f)) {
            memcpy(out + o, "\\u00", 4);
            out[o + 4] = hex[c >> 4];
            out[o + 5] = hex[c & 15];
            o += 6;
        } else {
            memcpy(out + o, p + i, k);
            o += k;
        }
        i += k;
    }
    return o;
}

static size_t put_raw(char *out, const char *s)
{
    size_t n = strlen(s);
    memcpy(out, s, n);
    return n;
}

/* a msgpack str header for n bytes (n < 65536 here) */
static size_t put_mp_str_header(char *out, size_t n)
{
    if (n < 32) {
        out[0] = (char)(0xa0 | n);
        return 1;
    }
    if (n < 256) {
        out[0] = (char)0xd9;
        out[1] = (char)n;
        return 2;
    }
    out[0] = (char)0xda;
    out[1] = (char)(n >> 8);
    out[2] = (char)(n & 0xff);
    return 3;
}

/* a msgpack str of text `s`: the text goes after a 3-byte gap, then the header is written in front of it */
static size_t put_mp_text(char *out, const char *s, size_t n)
{
    char *body = out + 3;
    size_t len = put_text(body, s, n, 0), h = put_mp_str_header(out, len);
    memmove(out + h, body, len);
    return h + len;
}

size_t sb_reply_error_body(char *buf, sb_status_t st, const char *message, const char *cid, int binary)
{
    int redact = sb_status_redacted(st);
    const char *code = sb_status_code(st), *msg = redact || message == NULL ? sb_status_message(st) : message;
    size_t mlen = sb_utf8_cut(msg, strlen(msg), SB_REPLY_MAX_MESSAGE), o = 0;
    int with_cid = redact && cid != NULL;

    if (binary) {
        /* {"ok": false, "error": {"code", "message"[, "correlationId"]}} */
        o += put_raw(buf + o, "\x82\xa2ok\xc2\xa5"
                              "error");
        buf[o++] = (char)(with_cid ? 0x83 : 0x82);
        o += put_raw(buf + o, "\xa4"
                              "code");
        o += put_mp_text(buf + o, code, strlen(code));
        o += put_raw(buf + o, "\xa7message");
        o += put_mp_text(buf + o, msg, mlen);
        if (with_cid) {
            o += put_raw(buf + o, "\xad"
                                  "correlationId");
            o += put_mp_text(buf + o, cid, strlen(cid));
        }
        return o;
    }
    o += put_raw(buf + o, "{\"ok\":false,\"error\":{\"code\":\"");
    o += put_text(buf + o, code, strlen(code), 1);
    o += put_raw(buf + o, "\",\"message\":\"");
    o += put_text(buf + o, msg, mlen, 1);
    if (with_cid) {
        o += put_raw(buf + o, "\",\"correlationId\":\"");
        o += put_text(buf + o, cid, strlen(cid), 1);
    }
    o += put_raw(buf + o, "\"}}");
    return o;
}

void sb_reply_send_error(h2o_req_t *req, sb_status_t st, const char *message, const char *cid, int binary)
{
    char body[SB_REPLY_ERROR_MAX];
    size_t len = sb_reply_error_body(body, st, message, cid, binary);

    sb_reply_send(req, st, binary ? "application/msgpack" : "application/json", body, len);
}
