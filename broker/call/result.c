/*
 * broker/call/result: filling and answering results (result.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "call/result.h"
#include "util/util.h"

void sb_result_init(sb_result_t *res)
{
    res->status = SB_OK;
    res->message[0] = '\0';
    msgpack_sbuffer_init(&res->value);
}

void sb_result_dispose(sb_result_t *res)
{
    msgpack_sbuffer_destroy(&res->value);
    msgpack_sbuffer_init(&res->value);
}

void sb_result_vfail(sb_result_t *res, sb_status_t st, const char *fmt, va_list ap)
{
    int n;

    res->status = st;
    n = vsnprintf(res->message, sizeof(res->message), fmt, ap);
    if (n < 0) {
        res->message[0] = '\0';
    } else if ((size_t)n >= sizeof(res->message)) {
        /* cut: never end the message inside a code point */
        size_t len = sb_utf8_trim_tail(res->message, sizeof(res->message) - 1);
        res->message[len] = '\0';
    }
    msgpack_sbuffer_clear(&res->value);
}

void sb_result_fail(sb_result_t *res, sb_status_t st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    sb_result_vfail(res, st, fmt, ap);
    va_end(ap);
}

void sb_answer_error_str(sb_dispatch_cb cb, void *arg, sb_status_t st, const char *msg)
{
    sb_result_t res;
    size_t len = strlen(msg);

    sb_result_init(&res);
    res.status = st;
    if (len >= sizeof(res.message))
        len = sb_utf8_trim_tail(msg, sizeof(res.message) - 1);
    memcpy(res.message, msg, len);
    res.message[len] = '\0';
    cb(arg, &res);
    sb_result_dispose(&res);
}

void sb_answer_error(sb_dispatch_cb cb, void *arg, sb_status_t st, const char *fmt, ...)
{
    sb_result_t res;
    va_list ap;

    sb_result_init(&res);
    va_start(ap, fmt);
    sb_result_vfail(&res, st, fmt, ap);
    va_end(ap);
    cb(arg, &res);
    sb_result_dispose(&res);
}
