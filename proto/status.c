/*
 * The status table: one row per sb_status_t, giving the wire code, the HTTP
 * status and its reason phrase, the upstream-compatible default message, and
 * whether the message is redacted on the wire (PROTOCOL.md section 7 for the
 * RPC codes, section 9 for the admin ones).
 */
#include <string.h>
#include "sb/status.h"

static const struct {
    const char *code;
    int http;
    const char *phrase;
    const char *message;
    int redacted;
} table[SB_STATUS_COUNT_] = {
    [SB_OK] = {"ok", 200, "OK", "ok", 0},
    [SB_E_BAD_METHOD] = {"bad_method", 400, "Bad Request", "invalid method", 0},
    [SB_E_BAD_ARGS] = {"bad_args", 400, "Bad Request", "invalid sandbox binding arguments", 0},
    [SB_E_TOO_LARGE] = {"bad_args", 413, "Payload Too Large", "sandbox broker request body is too large", 0},
    [SB_E_UNAUTHORIZED] = {"unauthorized", 401, "Unauthorized", "invalid or expired sandbox token", 0},
    [SB_E_FORBIDDEN] = {"forbidden", 403, "Forbidden", "sandbox binding operation forbidden", 0},
    [SB_E_NOT_IMPLEMENTED] = {"not_implemented", 501, "Not Implemented", "sandbox binding operation unavailable", 0},
    [SB_E_EXECUTION] = {"execution_error", 500, "Internal Server Error", "sandbox binding operation failed", 1},
    [SB_E_RATE_LIMITED] = {"rate_limited", 429, "Too Many Requests", "sandbox run quota exceeded", 0},
    [SB_E_UNAVAILABLE] = {"unavailable", 503, "Service Unavailable", "sandbox broker dependency unavailable", 0},
    [SB_E_AGAIN] = {"execution_error", 500, "Internal Server Error", "sandbox binding operation failed", 1},
    [SB_E_NOMEM] = {"execution_error", 500, "Internal Server Error", "sandbox binding operation failed", 1},
    [SB_E_CONFLICT] = {"conflict", 409, "Conflict", "the record already exists", 0},
    [SB_E_NOT_FOUND] = {"not_found", 404, "Not Found", "no such endpoint", 0},
    [SB_E_METHOD_NOT_ALLOWED] = {"bad_method", 405, "Method Not Allowed", "method not allowed", 0},
    [SB_OK_CREATED] = {"ok", 201, "Created", "created", 0},
    [SB_OK_NO_CONTENT] = {"ok", 204, "No Content", "no content", 0},
};

_Static_assert(sizeof(table) / sizeof(table[0]) == SB_STATUS_COUNT_, "one row per status");

static int valid(sb_status_t st)
{
    return (unsigned)st < SB_STATUS_COUNT_;
}

const char *sb_status_code(sb_status_t st)
{
    return valid(st) ? table[st].code : "execution_error";
}

int sb_status_http(sb_status_t st)
{
    return valid(st) ? table[st].http : 500;
}

const char *sb_status_message(sb_status_t st)
{
    return valid(st) ? table[st].message : "sandbox binding operation failed";
}

const char *sb_status_phrase(sb_status_t st)
{
    return valid(st) ? table[st].phrase : "Internal Server Error";
}

int sb_status_redacted(sb_status_t st)
{
    return valid(st) ? table[st].redacted : 1;
}

sb_status_t sb_status_on_wire(sb_status_t st)
{
    if (!valid(st) || st == SB_E_NOMEM || st == SB_E_AGAIN)
        return SB_E_EXECUTION;
    return st;
}

sb_status_t sb_status_from_code(const char *code, size_t len)
{
    /* the RPC codes only: an admin code (conflict, not_found) from a broker is unknown to the shim */
    static const sb_status_t wire[] = {SB_E_BAD_METHOD,      SB_E_BAD_ARGS,  SB_E_UNAUTHORIZED, SB_E_FORBIDDEN,
                                       SB_E_NOT_IMPLEMENTED, SB_E_EXECUTION, SB_E_RATE_LIMITED, SB_E_UNAVAILABLE};
    for (size_t i = 0; i < sizeof(wire) / sizeof(wire[0]); ++i) {
        const char *c = table[wire[i]].code;
        if (strlen(c) == len && memcmp(c, code, len) == 0)
            return wire[i];
    }
    return SB_E_EXECUTION;
}
