/*
 * broker/http: answering a request. Every answer of the broker's own routes,
 * RPC, admin, health and metrics, goes out through sb_reply_send with a
 * status from the table in proto/status.c, which gives the HTTP status and
 * its reason phrase; error answers build their body with
 * sb_reply_error_body, which also decides from the table whether the message
 * is redacted. No route picks a status, a phrase or a code by hand.
 */
#ifndef SB_REPLY_H
#define SB_REPLY_H

#include <stddef.h>
#include <h2o.h>
#include "sb/status.h"

/* a message is cut at this many bytes (on a code point boundary) before it is written */
#define SB_REPLY_MAX_MESSAGE 512u
/* the largest error body sb_reply_error_body writes: every message byte escaped as \ufffd, plus the frame */
#define SB_REPLY_ERROR_MAX (6u * SB_REPLY_MAX_MESSAGE + 256u)

/**
 * Sends a whole response with the HTTP status and phrase of `st`.
 * @param ctype the Content-Type, or NULL for none (204)
 * @param body copied into the request's pool; may be NULL when len is 0
 */
void sb_reply_send(h2o_req_t *req, sb_status_t st, const char *ctype, const char *body, size_t len);

/**
 * Writes the body of an error reply in the call's encoding,
 * {"ok":false,"error":{"code":C,"message":M,"correlationId"?:ID}} as JSON or
 * msgpack (PROTOCOL.md section 3). C is the status's wire code. A redacted
 * status (sb_status_redacted) carries its fixed default message and the
 * correlation id instead of `message`; any other carries `message`, or the
 * default message when it is NULL. The result is always valid UTF-8 and, in
 * JSON, valid JSON: a byte that is not part of a valid UTF-8 sequence is
 * written as U+FFFD, and the message is cut at SB_REPLY_MAX_MESSAGE bytes.
 * Pure: no allocation, no h2o.
 * @param buf at least SB_REPLY_ERROR_MAX bytes
 * @param cid the correlation id (36 characters), or NULL for none (admin)
 * @return the body length
 */
size_t sb_reply_error_body(char *buf, sb_status_t st, const char *message, const char *cid, int binary);

/** sb_reply_error_body sent with the status (Content-Type application/json or application/msgpack) */
void sb_reply_send_error(h2o_req_t *req, sb_status_t st, const char *message, const char *cid, int binary);

#endif
