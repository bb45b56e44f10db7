/*
 * The status table: one row per sb_status_t, giving the wire code, the HTTP
 * status and the upstream-compatible default message (PROTOCOL.md, "Errors").
 */
#include <string.h>
#include "sb/status.h"

static const struct {
    const char *code;
    int http;
    const char *message;
} table[SB_STATUS_COUNT_] = {
    [SB_OK] = {"ok", 200, "ok"},
    [SB_E_BAD_METHOD] = {"bad_method", 400, "invalid method"},
    [SB_E_BAD_ARGS] = {"bad_args", 400, "invalid sandbox binding arguments"},
    [SB_E_TOO_LARGE] = {"bad_args", 413, "sandbox broker request body is too large"},
    [SB_E_UNAUTHORIZED] = {"unauthorized", 401, "invalid or expired sandbox token"},
    [SB_E_FORBIDDEN] = {"forbidden", 403, "sandbox binding operation forbidden"},
    [SB_E_NOT_IMPLEMENTED] = {"not_implemented", 501, "sandbox binding operation unavailable"},
    [SB_E_EXECUTION] = {"execution_error", 500, "sandbox binding operation failed"},
    [SB_E_RATE_LIMITED] = {"rate_limited", 429, "sandbox run quota exceeded"},
    [SB_E_UNAVAILABLE] = {"unavailable", 503, "sandbox broker dependency unavailable"},
    [SB_E_AGAIN] = {"execution_error", 500, "sandbox binding operation failed"},
    [SB_E_NOMEM] = {"execution_error", 500, "sandbox binding operation failed"},
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

sb_status_t sb_status_from_code(const char *code, size_t len)
{
    static const sb_status_t wire[] = {SB_E_BAD_METHOD,      SB_E_BAD_ARGS,  SB_E_UNAUTHORIZED, SB_E_FORBIDDEN,
                                       SB_E_NOT_IMPLEMENTED, SB_E_EXECUTION, SB_E_RATE_LIMITED, SB_E_UNAVAILABLE};
    for (size_t i = 0; i < sizeof(wire) / sizeof(wire[0]); ++i) {
        const char *c = table[wire[i]].code;
        if (strlen(c) == len && memcmp(c, code, len) == 0)
            return wire[i];
    }
    return SB_E_EXECUTION;
}
