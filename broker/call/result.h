/*
 * broker/call/result: what a call answers.
 *
 * Every handler answers a call exactly once through an sb_dispatch_cb with
 * an sb_result_t: a packed msgpack value on SB_OK, or a status from the table
 * in proto/status.c with a message. The RPC route turns it into the wire
 * reply (redacting the message of a status the table marks redacted), so a
 * handler never picks a wire code, an HTTP status or a phrase.
 */
#ifndef SB_CALL_RESULT_H
#define SB_CALL_RESULT_H

#include <stdarg.h>
#include <stddef.h>
#include <msgpack.h>
#include "sb/limits.h"
#include "sb/status.h"

#define SB_RESULT_MAX_MESSAGE SB_MAX_RESULT_MESSAGE

/** what a handler produced: a packed msgpack value, or an error */
typedef struct st_sb_result_t {
    sb_status_t status;
    /* NUL-terminated, valid UTF-8; for a redacted status (execution_error) it reaches the log, never the wire */
    char message[SB_RESULT_MAX_MESSAGE];
    msgpack_sbuffer value; /* packed value on SB_OK (owned; sb_result_dispose) */
} sb_result_t;

/** the answer of a call; runs exactly once, on the loop that dispatched the call */
typedef void (*sb_dispatch_cb)(void *arg, sb_result_t *res);

/** an empty success (status SB_OK, no message, an empty value buffer) */
void sb_result_init(sb_result_t *res);
void sb_result_dispose(sb_result_t *res);

/**
 * Turns `res` into an error: the status, and the message formatted into the
 * fixed buffer (cut on a UTF-8 code point boundary when it does not fit).
 * Whatever value was packed so far is dropped: a half-built value never
 * reaches the guest.
 */
__attribute__((format(printf, 3, 4))) void sb_result_fail(sb_result_t *res, sb_status_t st, const char *fmt, ...);
/** sb_result_fail with a va_list */
void sb_result_vfail(sb_result_t *res, sb_status_t st, const char *fmt, va_list ap);

/**
 * Answers an error at once: the one "reply with an error" every handler
 * uses. The callback runs before this returns.
 */
__attribute__((format(printf, 4, 5))) void sb_answer_error(sb_dispatch_cb cb, void *arg, sb_status_t st, const char *fmt, ...);
/** sb_answer_error with a message that needs no formatting (cut as sb_result_fail cuts) */
void sb_answer_error_str(sb_dispatch_cb cb, void *arg, sb_status_t st, const char *msg);

#endif
