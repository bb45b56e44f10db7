/*
 * Unit tests for proto/status.c: the one status table, status -> wire code,
 * HTTP status, reason phrase, default message and redaction, and wire code ->
 * status (PROTOCOL.md section 7 for the RPC codes, section 9 for the admin ones).
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

/* statuses only the admin API and the routes answer with: never a code the shim maps back */
static const struct {
    sb_status_t st;
    const char *code;
    int http;
    const char *phrase;
} reply_rows[] = {
    {SB_E_CONFLICT, "conflict", 409, "Conflict"},
    {SB_E_NOT_FOUND, "not_found", 404, "Not Found"},
    {SB_E_METHOD_NOT_ALLOWED, "bad_method", 405, "Method Not Allowed"},
    {SB_OK_CREATED, "ok", 201, "Created"},
    {SB_OK_NO_CONTENT, "ok", 204, "No Content"},
};

static void test_replies(void)
{
    static const struct {
        sb_status_t st;
        const char *phrase;
        int redacted;
    } phrases[] = {
        {SB_OK, "OK", 0},
        {SB_E_BAD_METHOD, "Bad Request", 0},
        {SB_E_BAD_ARGS, "Bad Request", 0},
        {SB_E_TOO_LARGE, "Payload Too Large", 0},
        {SB_E_UNAUTHORIZED, "Unauthorized", 0},
        {SB_E_FORBIDDEN, "Forbidden", 0},
        {SB_E_NOT_IMPLEMENTED, "Not Implemented", 0},
        {SB_E_EXECUTION, "Internal Server Error", 1},
        {SB_E_RATE_LIMITED, "Too Many Requests", 0},
        {SB_E_UNAVAILABLE, "Service Unavailable", 0},
        {SB_E_AGAIN, "Internal Server Error", 1},
        {SB_E_NOMEM, "Internal Server Error", 1},
    };

    for (size_t i = 0; i < sizeof(phrases) / sizeof(phrases[0]); ++i) {
        is_str(sb_status_phrase(phrases[i].st), phrases[i].phrase, "status %d -> phrase %s", (int)phrases[i].st, phrases[i].phrase);
        is_int(sb_status_redacted(phrases[i].st), phrases[i].redacted, "status %d redacted: %d", (int)phrases[i].st,
               phrases[i].redacted);
    }
    for (size_t i = 0; i < sizeof(reply_rows) / sizeof(reply_rows[0]); ++i) {
        is_str(sb_status_code(reply_rows[i].st), reply_rows[i].code, "status %d -> code %s", (int)reply_rows[i].st,
               reply_rows[i].code);
        is_int(sb_status_http(reply_rows[i].st), reply_rows[i].http, "status %d -> HTTP %d", (int)reply_rows[i].st,
               reply_rows[i].http);
        is_str(sb_status_phrase(reply_rows[i].st), reply_rows[i].phrase, "status %d -> phrase %s", (int)reply_rows[i].st,
               reply_rows[i].phrase);
        ok(!sb_status_redacted(reply_rows[i].st), "status %d keeps its message", (int)reply_rows[i].st);
    }
    /* the shim maps only the RPC codes back; an admin code is unknown there */
    is_int(sb_status_from_code("conflict", 8), SB_E_EXECUTION, "conflict is not an RPC code");
    is_int(sb_status_from_code("not_found", 9), SB_E_EXECUTION, "not_found is not an RPC code");
    /* what a reply reports */
    is_int(sb_status_on_wire(SB_E_NOMEM), SB_E_EXECUTION, "NOMEM goes out as execution_error");
    is_int(sb_status_on_wire(SB_E_AGAIN), SB_E_EXECUTION, "AGAIN goes out as execution_error");
    is_int(sb_status_on_wire(SB_E_FORBIDDEN), SB_E_FORBIDDEN, "FORBIDDEN goes out as itself");
    is_int(sb_status_on_wire(SB_STATUS_COUNT_), SB_E_EXECUTION, "out of range goes out as execution_error");
    ok(sb_status_redacted(SB_STATUS_COUNT_), "out-of-range status is redacted (fail closed)");
    is_str(sb_status_phrase(SB_STATUS_COUNT_), "Internal Server Error", "out-of-range phrase");
}

static void test_table(void)
{
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i) {
        is_str(sb_status_code(rows[i].st), rows[i].code, "status %d -> code %s", (int)rows[i].st, rows[i].code);
        is_int(sb_status_http(rows[i].st), rows[i].http, "status %d (%s) -> HTTP %d", (int)rows[i].st, rows[i].code, rows[i].http);
    }
    is_int(sb_status_http(SB_OK), 200, "SB_OK -> HTTP 200");

    /* the upstream messages (PROTOCOL.md section 3) for the codes it has */
    is_str(sb_status_message(SB_E_BAD_ARGS), "invalid sandbox binding arguments", "bad_args message");
    is_str(sb_status_message(SB_E_TOO_LARGE), "sandbox broker request body is too large", "too large message");
    is_str(sb_status_message(SB_E_NOMEM), sb_status_message(SB_E_EXECUTION), "NOMEM has the execution_error message");

    /* every status has a non-empty code and message, and an HTTP status in 200..599 */
    {
        int good = 1;
        for (int s = 0; s < SB_STATUS_COUNT_; ++s) {
            const char *c = sb_status_code((sb_status_t)s), *m = sb_status_message((sb_status_t)s);
            const char *p = sb_status_phrase((sb_status_t)s);
            int h = sb_status_http((sb_status_t)s);
            if (c == NULL || *c == '\0' || m == NULL || *m == '\0' || p == NULL || *p == '\0' || h < 200 || h > 599)
                good = 0;
            /* only SB_OK is a success */
            if ((s == SB_OK) != (h == 200))
                good = 0;
        }
        ok(good, "every status has a code, a message, a phrase and an HTTP status; only SB_OK is 200");
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
        {"bad_method", SB_E_BAD_METHOD},           {"bad_args", SB_E_BAD_ARGS},
        {"unauthorized", SB_E_UNAUTHORIZED},       {"forbidden", SB_E_FORBIDDEN},
        {"not_implemented", SB_E_NOT_IMPLEMENTED}, {"execution_error", SB_E_EXECUTION},
        {"rate_limited", SB_E_RATE_LIMITED},       {"unavailable", SB_E_UNAVAILABLE},
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
    test_replies();
    test_from_code();
    return done_testing();
}
