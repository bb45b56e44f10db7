/*
 * Unit tests for broker/http/reply.c (sb_reply_error_body): the body of every
 * error reply, RPC and admin, in JSON and msgpack. Checked: the exact bytes
 * for the common cases, redaction by the status table (execution_error and
 * the internal statuses carry the fixed message and the correlation id,
 * never the detail), escaping (the buffer's JSON string writer, jansson's
 * escapes), and that whatever the message holds (control characters,
 * quotes, broken UTF-8, more than the cap) the body is valid UTF-8 and valid
 * JSON (jansson, strict) or valid msgpack (the pre-check); without memory
 * the body is refused whole, and the fallback body is valid too.
 */
#include <string.h>
#include <jansson.h>
#include "tap.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "http/reply.h"

static const char cid[] = "0f0e0d0c-0b0a-4908-8706-050403020100";

/* the body in `buf` (SB_REPLY_ERROR_MAX bytes), built in a buffer capped at SB_REPLY_ERROR_MAX; its length */
static size_t body_of(char *buf, sb_status_t st, const char *message, const char *cid_in, int binary)
{
    sb_buf_t b;
    size_t n = 0;

    sb_buf_init(&b, SB_REPLY_ERROR_MAX);
    if (sb_reply_error_body(&b, st, message, cid_in, binary) == SB_OK) {
        n = b.len;
        memcpy(buf, b.base, n);
    } else {
        ok(0, "sb_reply_error_body failed");
    }
    sb_buf_free(&b);
    return n;
}

static void expect_json(const char *label, sb_status_t st, const char *message, const char *cid_in, const char *want)
{
    char buf[SB_REPLY_ERROR_MAX];
    size_t n = body_of(buf, st, message, cid_in, 0);
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
    n = body_of(buf, st, msg, cid, 0);
    ok(n <= SB_REPLY_ERROR_MAX, "%s: within SB_REPLY_ERROR_MAX", label);
    ok(sb_utf8_valid((const uint8_t *)buf, n), "%s: JSON body is valid UTF-8", label);
    j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
    ok(j != NULL && json_is_false(json_object_get(j, "ok")) &&
           json_is_string(json_object_get(json_object_get(j, "error"), "message")),
       "%s: JSON body parses (%s)", label, j == NULL ? jerr.text : "ok");
    json_decref(j);
    n = body_of(buf, st, msg, cid, 1);
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
    expect_json("control characters and backslashes escaped as jansson did", SB_E_BAD_ARGS, "a\nb\\c\x01\t\x1f\x7f/", NULL,
                "{\"ok\":false,\"error\":{\"code\":\"bad_args\",\"message\":\"a\\nb\\\\c\\u0001\\t\\u001F\x7f/\"}}");
    expect_json("valid UTF-8 copied as is", SB_E_BAD_ARGS, "caf\xc3\xa9 \xf0\x9f\x98\x80", NULL,
                "{\"ok\":false,\"error\":{\"code\":\"bad_args\",\"message\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}}");
    expect_json("broken UTF-8 becomes U+FFFD, byte by byte", SB_E_BAD_ARGS, "a\xc3(\xed\xa0\x80\xc0\xaf\xff", NULL,
                "{\"ok\":false,\"error\":{\"code\":\"bad_args\",\"message\":\"a\xef\xbf\xbd("
                "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"}}");
    {
        char buf[SB_REPLY_ERROR_MAX];
        size_t n = body_of(buf, SB_E_FORBIDDEN, "no", cid, 1);
        static const char want[] = "\x82\xa2ok\xc2\xa5"
                                   "error\x82\xa4"
                                   "code\xa9"
                                   "forbidden\xa7message\xa2no";
        ok(n == sizeof(want) - 1 && memcmp(buf, want, n) == 0, "msgpack: the exact bytes");
        n = body_of(buf, SB_E_EXECUTION, "detail", cid, 1);
        ok(memmem(buf, n, "detail", 6) == NULL && memmem(buf, n, cid, 36) != NULL && (unsigned char)buf[11] == 0x83,
           "msgpack: redacted, three keys, the correlation id");
    }

    {
        /* msgpack text: broken bytes become U+FFFD there too, and a str header that fits the replaced text */
        char buf[SB_REPLY_ERROR_MAX];
        size_t n = body_of(buf, SB_E_BAD_ARGS, "a\xff\n", NULL, 1);
        static const char want[] = "\x82\xa2ok\xc2\xa5"
                                   "error\x82\xa4"
                                   "code\xa8"
                                   "bad_args\xa7message\xa5"
                                   "a\xef\xbf\xbd\n";
        ok(n == sizeof(want) - 1 && memcmp(buf, want, n) == 0, "msgpack: U+FFFD in the text, control characters as they are");
    }
    {
        /* out of memory: each allocation of the body failed in turn leaves the buffer as it was */
        int all = 1, refused = 0;
        for (unsigned long k = 1; k <= 4; ++k) {
            sb_buf_t b;
            sb_status_t st;
            for (int binary = 0; binary <= 1; ++binary) {
                sb_buf_init(&b, SB_REPLY_ERROR_MAX);
                sb_mem_fail_nth(k);
                st = sb_reply_error_body(&b, SB_E_FORBIDDEN, "a message", cid, binary);
                sb_mem_fail_nth(0);
                if (st != SB_OK && (st != SB_E_NOMEM || b.len != 0))
                    all = 0;
                refused += st == SB_E_NOMEM;
                sb_buf_free(&b);
            }
        }
        ok(all && refused >= 2, "out of memory: SB_E_NOMEM with nothing appended, never a partial body (%d refusals)", refused);
    }
    {
        /* the fallback bodies: execution_error, valid JSON and msgpack */
        sb_view_t v = sb_reply_error_fallback(0);
        json_t *j = json_loadb((const char *)v.base, v.len, JSON_REJECT_DUPLICATES, NULL);
        msgpack_zone zone;
        msgpack_object o;
        const char *why = NULL;
        ok(j != NULL && json_is_false(json_object_get(j, "ok")) &&
               strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "execution_error") == 0,
           "fallback: JSON, execution_error");
        json_decref(j);
        v = sb_reply_error_fallback(1);
        msgpack_zone_init(&zone, 1024);
        ok(sb_mp_decode(v.base, v.len, &zone, &o, &why) == SB_OK && o.type == MSGPACK_OBJECT_MAP && o.via.map.size == 2 &&
               sb_mp_str_is(sb_mp_get(sb_mp_get(&o, "error"), "code"), "execution_error") &&
               sb_mp_str_is(sb_mp_get(sb_mp_get(&o, "error"), "message"), "sandbox binding operation failed"),
           "fallback: msgpack that passes the pre-check, execution_error with its message");
        msgpack_zone_destroy(&zone);
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
        n = body_of(buf, SB_E_FORBIDDEN, big, NULL, 0);
        json_t *j = json_loadb(buf, n, 0, NULL);
        const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        ok(m != NULL && strlen(m) == SB_REPLY_MAX_MESSAGE, "the message is cut at %u bytes, on a code point", SB_REPLY_MAX_MESSAGE);
        json_decref(j);
        /* one ASCII byte first: byte 512 is the first half of a character, which is left out whole */
        memmove(big + 1, big, 1201); /* the NUL too */
        big[0] = 'a';
        n = body_of(buf, SB_E_FORBIDDEN, big, NULL, 0);
        j = json_loadb(buf, n, 0, NULL);
        m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        ok(m != NULL && strlen(m) == SB_REPLY_MAX_MESSAGE - 1, "a character across the cut is left out whole");
        json_decref(j);
    }
    return done_testing();
}
