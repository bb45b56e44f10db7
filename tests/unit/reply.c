/*
 * Unit tests for broker/http/reply.c (sb_reply_error_body): the body of every
 * error reply, RPC and admin, in JSON and msgpack. Checked: the exact bytes
 * for the common cases, redaction by the status table (execution_error and
 * the internal statuses carry the fixed message and the correlation id,
 * never the detail), escaping, and that whatever the message holds (control
 * characters, quotes, broken UTF-8, more than the cap) the body is valid
 * UTF-8 and valid JSON (jansson, strict) or valid msgpack (the pre-check).
 */
#include <string.h>
#include <jansson.h>
#include "tap.h"
#include "sb/value.h"
#include "http/reply.h"

static const char cid[] = "0f0e0d0c-0b0a-4908-8706-050403020100";

static void expect_json(const char *label, sb_status_t st, const char *message, const char *cid_in, const char *want)
{
    char buf[SB_REPLY_ERROR_MAX];
    size_t n = sb_reply_error_body(buf, st, message, cid_in, 0);
    if (!ok(n == strlen(want) && memcmp(buf, want, n) == 0, "%s", label))
        printf("#   want %s\n#   got  %.*s\n", want, (int)n, buf);
}

/* valid JSON whose message (and code, cid) are what we expect; returns the parsed message's length */
static void check_valid(const char *label, sb_status_t st, const char *message, size_t mlen)
{
    char buf[SB_REPLY_ERROR_MAX], msg[2048];
    size_t n;
    json_error_t jerr;
    json_t *j;
    const char *why = NULL;
    msgpack_zone zone;
    msgpack_object o;

    memcpy(msg, message, mlen);
    msg[mlen] = '\0';
    n = sb_reply_error_body(buf, st, msg, cid, 0);
    ok(n <= SB_REPLY_ERROR_MAX, "%s: within SB_REPLY_ERROR_MAX", label);
    ok(sb_utf8_valid((const uint8_t *)buf, n), "%s: JSON body is valid UTF-8", label);
    j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
    ok(j != NULL && json_is_false(json_object_get(j, "ok")) &&
           json_is_string(json_object_get(json_object_get(j, "error"), "message")),
       "%s: JSON body parses (%s)", label, j == NULL ? jerr.text : "ok");
    json_decref(j);
    n = sb_reply_error_body(buf, st, msg, cid, 1);
    msgpack_zone_init(&zone, 1024);
    ok(sb_mp_decode((const uint8_t *)buf, n, &zone, &o, &why) == SB_OK && o.type == MSGPACK_OBJECT_MAP && o.via.map.size == 2,
       "%s: msgpack body passes the pre-check (%s)", label, why != NULL ? why : "ok");
    msgpack_zone_destroy(&zone);
}

int main(void)
{
    char big[4096];

    expect_json("forbidden carries its reason", SB_E_FORBIDDEN, "service \"x\" is not granted", cid,
                "{\"ok\":false,\"error\":{\"code\":\"forbidden\",\"message\":\"service \\\"x\\\" is not granted\"}}");
    expect_json("a NULL message is the status's default", SB_E_UNAUTHORIZED, NULL, cid,
                "{\"ok\":false,\"error\":{\"code\":\"unauthorized\",\"message\":\"invalid or expired sandbox token\"}}");
    expect_json("execution_error is redacted, with the correlation id", SB_E_EXECUTION, "PostgreSQL: secret detail", cid,
                "{\"ok\":false,\"error\":{\"code\":\"execution_error\",\"message\":\"sandbox binding operation failed\","
                "\"correlationId\":\"0f0e0d0c-0b0a-4908-8706-050403020100\"}}");
    expect_json("NOMEM fails as execution_error", SB_E_NOMEM, "out of memory", cid,
                "{\"ok\":false,\"error\":{\"code\":\"execution_error\",\"message\":\"sandbox binding operation failed\","
                "\"correlationId\":\"0f0e0d0c-0b0a-4908-8706-050403020100\"}}");
    expect_json("an admin code, without a correlation id", SB_E_CONFLICT, "that token is already registered", NULL,
                "{\"ok\":false,\"error\":{\"code\":\"conflict\",\"message\":\"that token is already registered\"}}");
    expect_json("413 is bad_args on the wire", SB_E_TOO_LARGE, NULL, NULL,
                "{\"ok\":false,\"error\":{\"code\":\"bad_args\",\"message\":\"sandbox broker request body is too large\"}}");
    expect_json("control characters and backslashes escaped", SB_E_BAD_ARGS, "a\nb\\c\x01\x7f", NULL,
                "{\"ok\":false,\"error\":{\"code\":\"bad_args\",\"message\":\"a\\u000ab\\\\c\\u0001\\u007f\"}}");
    expect_json("valid UTF-8 copied as is", SB_E_BAD_ARGS, "caf\xc3\xa9 \xf0\x9f\x98\x80", NULL,
                "{\"ok\":false,\"error\":{\"code\":\"bad_args\",\"message\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}}");
    expect_json(
        "broken UTF-8 becomes U+FFFD, byte by byte", SB_E_BAD_ARGS, "a\xc3(\xed\xa0\x80\xc0\xaf\xff", NULL,
        "{\"ok\":false,\"error\":{\"code\":\"bad_args\",\"message\":\"a\\ufffd(\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\"}}");
    {
        char buf[SB_REPLY_ERROR_MAX];
        size_t n = sb_reply_error_body(buf, SB_E_FORBIDDEN, "no", cid, 1);
        static const char want[] = "\x82\xa2ok\xc2\xa5"
                                   "error\x82\xa4"
                                   "code\xa9"
                                   "forbidden\xa7message\xa2no";
        ok(n == sizeof(want) - 1 && memcmp(buf, want, n) == 0, "msgpack: the exact bytes");
        n = sb_reply_error_body(buf, SB_E_EXECUTION, "detail", cid, 1);
        ok(memmem(buf, n, "detail", 6) == NULL && memmem(buf, n, cid, 36) != NULL && (unsigned char)buf[11] == 0x83,
           "msgpack: redacted, three keys, the correlation id");
    }

    /* whatever the message, the body is valid */
    check_valid("plain", SB_E_BAD_ARGS, "plain", 5);
    check_valid("quotes and controls", SB_E_BAD_ARGS, "\"\\\x01\x1f\t\r\n", 7);
    check_valid("broken sequences", SB_E_BAD_ARGS, "\xc3\xe2\x82\xf0\x9f\x98\xed\xa0\x80\xf4\x90\x80\x80\xc1\xbf", 15);
    memset(big, '"', sizeof(big));
    check_valid("a message of quotes above the cap", SB_E_FORBIDDEN, big, 2000);
    memset(big, 0xff, sizeof(big));
    check_valid("a message of invalid bytes above the cap", SB_E_FORBIDDEN, big, 2000);
    for (size_t i = 0; i + 2 < sizeof(big); i += 2)
        memcpy(big + i, "\xc3\xa9", 2);
    check_valid("a multibyte message cut at the cap", SB_E_FORBIDDEN, big, 1201);
    {
        char buf[SB_REPLY_ERROR_MAX];
        size_t n;
        big[1200] = '\0'; /* 600 two-byte characters: the 512-byte cut falls on a boundary */
        n = sb_reply_error_body(buf, SB_E_FORBIDDEN, big, NULL, 0);
        json_t *j = json_loadb(buf, n, 0, NULL);
        const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        ok(m != NULL && strlen(m) == SB_REPLY_MAX_MESSAGE, "the message is cut at %u bytes, on a code point", SB_REPLY_MAX_MESSAGE);
        json_decref(j);
        /* one ASCII byte first: byte 512 is the first half of a character, which is left out whole */
        memmove(big + 1, big, 1201); /* the NUL too */
        big[0] = 'a';
        n = sb_reply_error_body(buf, SB_E_FORBIDDEN, big, NULL, 0);
        j = json_loadb(buf, n, 0, NULL);
        m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        ok(m != NULL && strlen(m) == SB_REPLY_MAX_MESSAGE - 1, "a character across the cut is left out whole");
        json_decref(j);
    }
    return done_testing();
}
