/*
 * broker/http: answering a request. Every answer of the broker's own routes,
 * RPC, admin, health and metrics, goes out through sb_reply_send with a
 * status from the table in proto/status.c, which gives the HTTP status and
 * its reason phrase; error answers build their body with
 * sb_reply_error_body, which also decides from the table whether the message
 * is redacted. No route picks a status, a phrase or a code by hand, and no
 * route escapes text itself.
 */
#ifndef SB_REPLY_H
#define SB_REPLY_H

#include <stddef.h>
#include <h2o.h>
#include "sb/buf.h"
#include "sb/status.h"

/* a message is cut at this many bytes (on a code point boundary) before it is written */
#define SB_REPLY_MAX_MESSAGE 512u
/* room that always holds an error body: every message byte written as a 6-byte escape, plus the frame */
#define SB_REPLY_ERROR_MAX (6u * SB_REPLY_MAX_MESSAGE + 256u)

/**
 * Sends a whole response with the HTTP status and phrase of `st`.
 * @param ctype the Content-Type, or NULL for none (204)
 * @param body copied into the request's pool; may be NULL when len is 0
 */
void sb_reply_send(h2o_req_t *req, sb_status_t st, const char *ctype, const char *body, size_t len);

/**
 * Sends a whole response whose body is `body`'s bytes, handing their storage
 * to the request (freed with its pool): no copy. `body` is left empty, with
 * no storage, and may be freed or reused.
 */
void sb_reply_send_buf(h2o_req_t *req, sb_status_t st, const char *ctype, sb_buf_t *body);

/**
 * Appends the body of an error reply in the call's encoding,
 * {"ok":false,"error":{"code":C,"message":M,"correlationId"?:ID}} as JSON or
 * msgpack (PROTOCOL.md section 3). C is the status's wire code. A redacted
 * status (sb_status_redacted) carries its fixed default message and the
 * correlation id instead of `message`; any other carries `message`, or the
 * default message when it is NULL. The message is cut at
 * SB_REPLY_MAX_MESSAGE bytes on a code point boundary, and written as the
 * buffer writes every JSON string (sb_buf_append_json_str_lossy: jansson's
 * escapes, each byte of a broken sequence as U+FFFD) or, in msgpack, as
 * sb_buf_append_utf8_lossy writes text. So the body is always valid UTF-8
 * and valid JSON, or msgpack that passes the pre-check.
 * @param out the body is appended here; SB_REPLY_ERROR_MAX bytes of room always suffice
 * @param cid the correlation id (36 characters), or NULL for none (admin)
 * @return SB_OK, SB_E_TOO_LARGE (out's cap) or SB_E_NOMEM; on failure out is as it was
 */
SB_WARN_UNUSED sb_status_t sb_reply_error_body(sb_buf_t *out, sb_status_t st, const char *message, const char *cid, int binary);

/**
 * The body sent when sb_reply_error_body cannot build one (out of memory): the
 * execution_error reply with its fixed message and no correlation id, in the
 * call's encoding. Static bytes.
 */
sb_view_t sb_reply_error_fallback(int binary);

#endif
