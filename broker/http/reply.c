/*
 * broker/http: answering a request (reply.h).
 *
 * The error body is written straight into an sb_buf_t rather than through
 * jansson or a msgpack packer: it is three short strings, and building a
 * tree for them cost more than the whole capability check. Its text goes
 * through the buffer's one text writer (sb_buf_append_json_str_lossy, and
 * sb_buf_append_utf8_lossy for msgpack), which every JSON string of a reply
 * shares, so every error reply is valid UTF-8 (each byte of a broken
 * sequence becomes U+FFFD, RFC 3629 section 3 for what is valid) and, in
 * JSON, a valid document (RFC 8259 section 7 escaping).
 */
#include <stdatomic.h>
#include <string.h>
#include "sb/mem.h"
#include "http/reply.h"
#include "http/reqid.h"
#include "http/worker.h"
#include "util/util.h"

/* status, phrase, the headers every answer carries, and the body, whose bytes live as long as the request */
static void send_final(h2o_req_t *req, sb_status_t st, const char *ctype, h2o_iovec_t body)
{
    static h2o_generator_t generator = {NULL, NULL};

    req->res.status = sb_status_http(st);
    req->res.reason = sb_status_phrase(st);
    req->res.content_length = body.len;
    if (ctype != NULL)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, ctype, strlen(ctype));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    sb_http_echo_request_id(req);
    if (sb_current_worker != NULL && atomic_load_explicit(&sb_current_worker->server->stopping, memory_order_relaxed))
        req->http1_is_persistent = 0;
    h2o_start_response(req, &generator);
    h2o_send(req, &body, body.len != 0 ? 1 : 0, H2O_SEND_STATE_FINAL);
}

void sb_reply_send(h2o_req_t *req, sb_status_t st, const char *ctype, const char *body, size_t len)
{
    send_final(req, st, ctype, len != 0 ? h2o_strdup(&req->pool, body, len) : h2o_iovec_init(NULL, 0));
}

static void free_owned(void *slot)
{
    sb_mem_free(*(char **)slot);
}

void sb_reply_send_buf(h2o_req_t *req, sb_status_t st, const char *ctype, sb_buf_t *body)
{
    h2o_iovec_t buf = h2o_iovec_init(NULL, 0);

    if (body->base != NULL && body->len != 0) {
        char **slot = h2o_mem_alloc_shared(&req->pool, sizeof(*slot), free_owned);
        size_t len;
        /* cannot fail: the buffer holds storage, so nothing is allocated */
        if (sb_buf_take(body, slot, &len) != SB_OK)
            sb_fatal(__FILE__, __LINE__, "sb_buf_take failed on a buffer that holds storage");
        buf = h2o_iovec_init(*slot, len);
    }
    sb_buf_free(body);
    send_final(req, st, ctype, buf);
}

/* ---- the error body --------------------------------------------------------------------------------------------- */

/* a msgpack str header for n bytes, minimal as msgpack-c packs it; returns its length (at most 5) */
static size_t mp_str_header(uint8_t *out, size_t n)
{
    if (n < 32) {
        out[0] = (uint8_t)(0xa0 | n);
        return 1;
    }
    if (n < 256) {
        out[0] = 0xd9;
        out[1] = (uint8_t)n;
        return 2;
    }
    if (n < 65536) {
        out[0] = 0xda;
        out[1] = (uint8_t)(n >> 8);
        out[2] = (uint8_t)n;
        return 3;
    }
    out[0] = 0xdb;
    out[1] = (uint8_t)(n >> 24);
    out[2] = (uint8_t)(n >> 16);
    out[3] = (uint8_t)(n >> 8);
    out[4] = (uint8_t)n;
    return 5;
}

/*
 * A msgpack str of text `s`: the text goes in after a 5-byte gap (its length
 * is known only once it is written), then its header is put in front of it.
 */
static sb_status_t put_mp_text(sb_buf_t *b, const char *s, size_t n)
{
    size_t mark = b->len, len, h;
    uint8_t hdr[5];
    sb_status_t st;

    if ((st = sb_buf_append(b, "\0\0\0\0\0", 5)) != SB_OK)
        return st;
    if ((st = sb_buf_append_utf8_lossy(b, s, n)) != SB_OK) {
        sb_buf_truncate(b, mark);
        return st;
    }
    len = b->len - mark - 5;
    h = mp_str_header(hdr, len);
    memmove(b->base + mark + h, b->base + mark + 5, len);
    memcpy(b->base + mark, hdr, h);
    sb_buf_truncate(b, mark + h + len);
    return SB_OK;
}

static sb_status_t put_raw(sb_buf_t *b, const char *s)
{
    return sb_buf_append_str(b, s);
}

static sb_status_t error_body(sb_buf_t *b, sb_status_t st, const char *message, const char *cid, int binary)
{
    int redact = sb_status_redacted(st);
    const char *code = sb_status_code(st), *msg = redact || message == NULL ? sb_status_message(st) : message;
    size_t mlen = sb_utf8_cut(msg, strlen(msg), SB_REPLY_MAX_MESSAGE);
    int with_cid = redact && cid != NULL;
    sb_status_t r;

    if (binary) {
        /* {"ok": false, "error": {"code", "message"[, "correlationId"]}} */
        if ((r = sb_buf_append(b,
                               "\x82\xa2ok\xc2\xa5"
                               "error",
                               11)) != SB_OK ||
            (r = sb_buf_append_char(b, (char)(with_cid ? 0x83 : 0x82))) != SB_OK ||
            (r = put_raw(b, "\xa4"
                            "code")) != SB_OK ||
            (r = put_mp_text(b, code, strlen(code))) != SB_OK || (r = put_raw(b, "\xa7message")) != SB_OK ||
            (r = put_mp_text(b, msg, mlen)) != SB_OK)
            return r;
        if (with_cid && ((r = put_raw(b, "\xad"
                                         "correlationId")) != SB_OK ||
                         (r = put_mp_text(b, cid, strlen(cid))) != SB_OK))
            return r;
        return SB_OK;
    }
    if ((r = put_raw(b, "{\"ok\":false,\"error\":{\"code\":")) != SB_OK ||
        (r = sb_buf_append_json_str_lossy(b, code, strlen(code))) != SB_OK || (r = put_raw(b, ",\"message\":")) != SB_OK ||
        (r = sb_buf_append_json_str_lossy(b, msg, mlen)) != SB_OK)
        return r;
    if (with_cid &&
        ((r = put_raw(b, ",\"correlationId\":")) != SB_OK || (r = sb_buf_append_json_str_lossy(b, cid, strlen(cid))) != SB_OK))
        return r;
    return put_raw(b, "}}");
}

sb_status_t sb_reply_error_body(sb_buf_t *out, sb_status_t st, const char *message, const char *cid, int binary)
{
    size_t mark = out->len;
    sb_status_t r = error_body(out, st, message, cid, binary);

    if (r != SB_OK)
        sb_buf_truncate(out, mark);
    return r;
}

sb_view_t sb_reply_error_fallback(int binary)
{
    static const char json[] =
        "{\"ok\":false,\"error\":{\"code\":\"execution_error\",\"message\":\"sandbox binding operation failed\"}}";
    static const char mp[] = "\x82\xa2ok\xc2\xa5"
                             "error\x82\xa4"
                             "code\xaf"
                             "execution_error\xa7message\xd9\x20"
                             "sandbox binding operation failed";
    sb_view_t v;

    v.base = (const uint8_t *)(binary ? mp : json);
    v.len = binary ? sizeof(mp) - 1 : sizeof(json) - 1;
    return v;
}
