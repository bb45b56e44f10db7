/*
 * Unit tests for proto/status.c: the one status table, status -> wire code,
 * HTTP status and default message, and wire code -> status
 * (PROTOCOL.md, "Errors"; questpie-wire.md section 2.3 for the upstream codes).
 */
#include <string.h>
#include "tap.h"
#include "sb/status.h"

static const struct {
    sb_status_t st;
    const char *code;
    int http;
} rows[] = {
    {SB_E_BAD_METHOD, "bad_method", 400},
    {SB_E_BAD_ARGS, "bad_args", 400},
    {SB_E_TOO_LARGE, "bad_args", 413},
    {SB_E_UNAUTHORIZED, "unauthorized", 401},
    {SB_E_FORBIDDEN, "forbidden", 403},
    {SB_E_NOT_IMPLEMENTED, "not_implemented", 501},
    {SB_E_EXECUTION, "execution_error", 500},
    {SB_E_RATE_LIMITED, "rate_limited", 429},
    {SB_E_UNAVAILABLE, "unavailable", 503},
    /* internal statuses never reach the wire as themselves; they fail as execution errors */
    {SB_E_NOMEM, "execution_error", 500},
    {SB_E_AGAIN, "execution_error", 500},
};

static void test_table(void)
{
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i) {
        is_str(sb_status_code(rows[i].st), rows[i].code, "status %d -> code %s", (int)rows[i].st, rows[i].code);
        is_int(sb_status_http(rows[i].st), rows[i].http, "status %d (%s) -> HTTP %d", (int)rows[i].st, rows[i].code, rows[i].http);
    }
    is_int(sb_status_http(SB_OK), 200, "SB_OK -> HTTP 200");

    /* the upstream messages (questpie-wire.md section 2.3) for the codes it has */
    is_str(sb_status_message(SB_E_BAD_ARGS), "invalid sandbox binding arguments", "bad_args message");
    is_str(sb_status_message(SB_E_TOO_LARGE), "sandbox broker request body is too large", "too large message");
    is_str(sb_status_message(SB_E_NOMEM), sb_status_message(SB_E_EXECUTION), "NOMEM has the execution_error message");

    /* every status has a non-empty code and message, and an HTTP status in 200..599 */
    {
        int good = 1;
        for (int s = 0; s < SB_STATUS_COUNT_; ++s) {
            const char *c = sb_status_code((sb_status_t)s), *m = sb_status_message((sb_status_t)s);
            int h = sb_status_http((sb_status_t)s);
            if (c == NULL || *c == '\0' || m == NULL || *m == '\0' || h < 200 || h > 599)
                good = 0;
            /* only SB_OK is a success */
            if ((s == SB_OK) != (h == 200))
                good = 0;
        }
        ok(good, "every status has a code, a message and an HTTP status; only SB_OK is 200");
    }

    /* out-of-range values fail closed */
    is_str(sb_status_code(SB_STATUS_COUNT_), "execution_error", "out-of-range status -> execution_error");
    is_int(sb_status_http(SB_STATUS_COUNT_), 500, "out-of-range status -> 500");
    is_str(sb_status_code((sb_status_t)-1), "execution_error", "negative status -> execution_error");
    is_int(sb_status_http((sb_status_t)-1), 500, "negative status -> 500");
    ok(sb_status_message((sb_status_t)1000) != NULL, "out-of-range status has a message");
}

static void test_from_code(void)
{
    static const struct {
        const char *code;
        sb_status_t st;
    } wire[] = {
        {"bad_method", SB_E_BAD_METHOD},
        {"bad_args", SB_E_BAD_ARGS},
        {"unauthorized", SB_E_UNAUTHORIZED},
        {"forbidden", SB_E_FORBIDDEN},
        {"not_implemented", SB_E_NOT_IMPLEMENTED},
        {"execution_error", SB_E_EXECUTION},
        {"rate_limited", SB_E_RATE_LIMITED},
        {"unavailable", SB_E_UNAVAILABLE},
    };
    static const char *const unknown[] = {
        "", "ok", "bad", "bad_args ", "BAD_ARGS", "bad_arg", "bad_argss", "forbidden\n", "too_large", "nomem", "again",
    };

    for (size_t i = 0; i < sizeof(wire) / sizeof(wire[0]); ++i) {
        sb_status_t st = sb_status_from_code(wire[i].code, strlen(wire[i].code));
        is_int(st, wire[i].st, "from_code(\"%s\")", wire[i].code);
        is_str(sb_status_code(st), wire[i].code, "from_code(\"%s\") round trips", wire[i].code);
    }
    /* status -> code -> status keeps the code (TOO_LARGE is bad_args on the wire) */
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i) {
        const char *c = sb_status_code(rows[i].st);
        is_str(sb_status_code(sb_status_from_code(c, strlen(c))), c, "code of status %d survives the round trip", (int)rows[i].st);
    }
    is_int(sb_status_from_code("bad_args", 8), SB_E_BAD_ARGS, "bad_args -> SB_E_BAD_ARGS, not TOO_LARGE");
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); ++i)
        is_int(sb_status_from_code(unknown[i], strlen(unknown[i])), SB_E_EXECUTION, "unknown code #%zu -> execution_error", i);
    /* length-delimited: no NUL needed, prefixes and embedded NULs do not match */
    is_int(sb_status_from_code("forbiddenXYZ", 9), SB_E_FORBIDDEN, "code need not be NUL-terminated");
    is_int(sb_status_from_code("forbidden\0", 10), SB_E_EXECUTION, "trailing NUL is part of the code");
    is_int(sb_status_from_code("forbidden", 8), SB_E_EXECUTION, "a prefix is not the code");
}

int main(void)
{
    test_table();
    test_from_code();
    return done_testing();
}
