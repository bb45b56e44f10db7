/*
 * Unit tests for broker/svc/decide/answer.c: the decider's answer parser
 * (every refusal with its exact reason) and the description of a call the
 * broker sends (PROTOCOL.md section 5a), byte for byte, including what it
 * must never carry and the short form when the arguments do not fit.
 */
#include <stdio.h>
#include <string.h>
#include <msgpack.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/value.h"
#include "call/call.h"
#include "svc/decide/decide.h"

static void answer(const char *body, int want_ok, int want_allow, const char *want)
{
    sb_decide_answer_t a;
    const char *why = NULL;
    sb_status_t st = sb_decide_parse_answer(body, strlen(body), &a, &why);

    if (want_ok) {
        is_int(st, SB_OK, "accept %s", body);
        is_int(a.allow, want_allow, "  decision");
        is_str(a.reason, want, "  reason");
    } else {
        is_int(st, SB_E_BAD_ARGS, "refuse %s", body);
        is_str(why != NULL ? why : "(none)", want, "  why");
        ok(a.allow == 0 && a.reason[0] == '\0', "  a refused answer is zeroed");
    }
}

static void test_answers(void)
{
    char big[SB_MAX_DECIDE_ANSWER + 64], reason[SB_MAX_DECIDE_REASON + 64];
    sb_decide_answer_t a;
    const char *why = NULL;

    answer("{\"v\":1,\"decision\":\"allow\"}", 1, 1, "");
    answer("{\"decision\":\"deny\",\"v\":1}", 1, 0, "");
    answer("{\"v\":1,\"decision\":\"deny\",\"reason\":\"needs a reviewer \\u2014 ok\"}", 1, 0, "needs a reviewer \xe2\x80\x94 ok");
    answer(" {\"v\":1,\"decision\":\"allow\",\"reason\":\"\"} \n", 1, 1, "");
    answer("", 0, 0, "the answer is empty");
    answer("allow", 0, 0, "the answer is not valid JSON");
    answer("{\"v\":1,\"decision\":\"allow\"", 0, 0, "the answer is not valid JSON");
    answer("{\"v\":1,\"decision\":\"allow\"}{}", 0, 0, "the answer is not valid JSON");
    answer("{\"v\":1,\"v\":1,\"decision\":\"allow\"}", 0, 0, "the answer is not valid JSON");
    answer("[\"allow\"]", 0, 0, "the answer is not a JSON object");
    answer("\"allow\"", 0, 0, "the answer is not a JSON object");
    answer("{\"v\":1,\"decision\":\"allow\",\"why\":\"x\"}", 0, 0, "the answer has an unknown key");
    answer("{\"decision\":\"allow\"}", 0, 0, "the answer's \"v\" is not 1");
    answer("{\"v\":0,\"decision\":\"allow\"}", 0, 0, "the answer's \"v\" is not 1");
    answer("{\"v\":1.0,\"decision\":\"allow\"}", 0, 0, "the answer's \"v\" is not 1");
    answer("{\"v\":-1,\"decision\":\"allow\"}", 0, 0, "the answer's \"v\" is not 1");
    answer("{\"v\":1}", 0, 0, "the answer's \"decision\" is not \"allow\" or \"deny\"");
    answer("{\"v\":1,\"decision\":\"Allow\"}", 0, 0, "the answer's \"decision\" is not \"allow\" or \"deny\"");
    answer("{\"v\":1,\"decision\":\"allowed\"}", 0, 0, "the answer's \"decision\" is not \"allow\" or \"deny\"");
    answer("{\"v\":1,\"decision\":null}", 0, 0, "the answer's \"decision\" is not \"allow\" or \"deny\"");
    answer("{\"v\":1,\"decision\":\"deny\",\"reason\":null}", 0, 0, "the answer's \"reason\" is not a string");
    answer("{\"v\":1,\"decision\":\"deny\",\"reason\":\"a\\u0000b\"}", 0, 0, "the answer's \"reason\" has a control character");
    answer("{\"v\":1,\"decision\":\"deny\",\"reason\":\"a\\u007fb\"}", 0, 0, "the answer's \"reason\" has a control character");
    answer("{\"v\":1,\"decision\":\"deny\",\"reason\":\"tab\\there\"}", 0, 0, "the answer's \"reason\" has a control character");
    /* the reason cap, exactly */
    memset(reason, 'r', SB_MAX_DECIDE_REASON);
    reason[SB_MAX_DECIDE_REASON] = '\0';
    snprintf(big, sizeof(big), "{\"v\":1,\"decision\":\"deny\",\"reason\":\"%s\"}", reason);
    ok(sb_decide_parse_answer(big, strlen(big), &a, &why) == SB_OK && strlen(a.reason) == SB_MAX_DECIDE_REASON,
       "a reason of exactly 256 bytes");
    snprintf(big, sizeof(big), "{\"v\":1,\"decision\":\"deny\",\"reason\":\"%sr\"}", reason);
    answer(big, 0, 0, "the answer's \"reason\" is longer than 256 bytes");
    /* the body cap comes before any parsing: a valid allow padded past it is refused */
    memset(big, ' ', sizeof(big));
    memcpy(big, "{\"v\":1,\"decision\":\"allow\"}", 26);
    ok(sb_decide_parse_answer(big, SB_MAX_DECIDE_ANSWER, &a, &why) == SB_OK && a.allow, "4096 bytes are read");
    is_int(sb_decide_parse_answer(big, SB_MAX_DECIDE_ANSWER + 1, &a, &why), SB_E_BAD_ARGS, "4097 bytes are not");
    is_str(why, "the answer is larger than 4096 bytes", "  why");
}

/* the description of `method` with `args` (JSON text; NULL for none) */
static void describe(const char *method, const char *args_json, const char *target, sb_buf_t *out, sb_status_t *st)
{
    static msgpack_zone zone;
    static int inited;
    msgpack_object args;
    const char *why = NULL;
    sb_method_t m;
    sb_call_t call;

    if (inited)
        msgpack_zone_destroy(&zone);
    msgpack_zone_init(&zone, 4096);
    inited = 1;
    if (sb_method_parse(method, strlen(method), &m) != SB_OK ||
        (args_json != NULL && sb_json_parse(args_json, strlen(args_json), &zone, &args, &why) != SB_OK)) {
        printf("# bad test input %s %s\n", method, args_json != NULL ? args_json : "");
        *st = SB_E_EXECUTION;
        return;
    }
    if (sb_call_decode(&call, &m, method, strlen(method), args_json != NULL ? &args : NULL, 0, &zone) != SB_OK) {
        printf("# the call does not decode: %s\n", call.err);
        *st = SB_E_EXECUTION;
        return;
    }
    call.cid = "cid-1";
    sb_buf_init(out, SB_MAX_DECIDE_REQUEST);
    *st = sb_decide_describe(out, call.cid, "run-1", target, &call, 1234, NULL);
}

static void expect(const char *method, const char *args_json, const char *want)
{
    sb_buf_t out;
    sb_status_t st;
    char head[256];

    describe(method, args_json, "app", &out, &st);
    is_int(st, SB_OK, "describe %s", method);
    snprintf(head, sizeof(head),
             "{\"v\":1,\"id\":\"cid-1\",\"runId\":\"run-1\",\"target\":\"app\",\"method\":\"%s\",\"deadlineMs\":1234,", method);
    if (st == SB_OK) {
        char got[SB_MAX_DECIDE_REQUEST + 1];
        size_t hl = strlen(head);
        memcpy(got, out.base, out.len);
        got[out.len] = '\0';
        ok(out.len > hl && memcmp(got, head, hl) == 0, "  the head: %s", got);
        is_str(out.len > hl ? got + hl : got, want, "  the rest");
    }
    sb_buf_free(&out);
}

static void test_descriptions(void)
{
    sb_buf_t out;
    sb_status_t st;
    static char bigwhere[40000];
    size_t o;

    expect("collections.posts.delete",
           "{\"where\":{\"id\":7,\"or\":[{\"title\":{\"like\":\"a%\"}},{\"views\":{\"gt\":3,\"lte\":9}}]}}",
           "\"args\":{\"collection\":\"posts\",\"where\":{\"id\":7,\"or\":[{\"title\":{\"like\":\"a%\"}},{\"views\":{\"gt\":3,"
           "\"lte\":9}}]}}}");
    expect("collections.posts.update", "{\"where\":{\"id\":1},\"data\":{\"title\":\"secret title\",\"views\":2}}",
           "\"args\":{\"collection\":\"posts\",\"where\":{\"id\":1},\"fields\":[\"title\",\"views\"]}}");
    expect("collections.posts.find", "{\"limit\":5,\"offset\":10}",
           "\"args\":{\"collection\":\"posts\",\"limit\":5,\"offset\":10}}");
    expect("store.notes.create", "{\"data\":{\"k\":\"v\"}}", "\"args\":{\"namespace\":\"notes\",\"fields\":[\"k\"]}}");
    expect("collections.document_store.delete", "{\"where\":{\"store\":\"notes\",\"key\":\"a\"}}",
           "\"args\":{\"namespace\":\"notes\",\"where\":{\"store\":\"notes\",\"key\":\"a\"}}}");
    expect("files.write", "{\"path\":\"./docs//a.md\",\"content\":\"hello\"}", "\"args\":{\"path\":\"docs/a.md\",\"bytes\":5}}");
    expect("files.read", "{\"path\":\"docs/a.md\"}", "\"args\":{\"path\":\"docs/a.md\"}}");
    expect("tools.call", "{\"name\":\"github.create_issue\",\"arguments\":{\"title\":\"t\",\"n\":[1,2]}}",
           "\"args\":{\"tool\":\"github.create_issue\",\"arguments\":{\"title\":\"t\",\"n\":[1,2]}}}");
    expect("tools.list", NULL, "\"args\":{}}");
    expect("services.billing.charge", "{}", "\"args\":{\"name\":\"billing\",\"function\":\"charge\"}}");
    expect("http.fetch",
           "{\"url\":\"https://Pay.Example/v1/charges?x=1#frag\",\"method\":\"post\",\"headers\":{\"Authorization\":\"Bearer "
           "{{secret:pay}}\",\"X-Trace\":\"abc\"},\"body\":\"amount=5\"}",
           "\"args\":{\"url\":\"https://pay.example:443/v1/"
           "charges?x=1\",\"method\":\"POST\",\"headers\":[\"authorization\",\"x-trace\"],"
           "\"secrets\":[\"pay\"],\"bodyBytes\":8}}");

    /* no target: null */
    describe("tools.list", NULL, "", &out, &st);
    ok(st == SB_OK && strstr(out.base, "\"target\":null,") != NULL, "a run without a target: \"target\":null");
    sb_buf_free(&out);

    /* a where too large for the body cap: left out and named */
    o = (size_t)snprintf(bigwhere, sizeof(bigwhere), "{\"where\":{\"title\":{\"in\":[");
    for (int i = 0; i < 90; ++i)
        o += (size_t)snprintf(bigwhere + o, sizeof(bigwhere) - o, "%s\"%0200d\"", i ? "," : "", i);
    snprintf(bigwhere + o, sizeof(bigwhere) - o, "]}}}");
    expect("collections.posts.delete", bigwhere, "\"args\":{\"collection\":\"posts\"},\"omitted\":[\"where\"]}");

    /* the description never carries a header value, a body, the content written or a secret's value */
    describe(
        "http.fetch",
        "{\"url\":\"https://a.example/\",\"method\":\"POST\",\"headers\":{\"cookie\":\"session=hunter2\"},\"body\":\"hunter3\"}",
        "app", &out, &st);
    ok(st == SB_OK && strstr(out.base, "hunter") == NULL, "no header value or body in the description");
    sb_buf_free(&out);
    describe("files.write", "{\"path\":\"a\",\"content\":\"hunter4\"}", "app", &out, &st);
    ok(st == SB_OK && strstr(out.base, "hunter") == NULL, "no written content");
    sb_buf_free(&out);
    /* every description is JSON a strict parser reads */
    describe("tools.call", "{\"name\":\"t\",\"arguments\":{\"s\":\"\\u0001\\\"\\\\\"}}", "app", &out, &st);
    {
        msgpack_zone z;
        msgpack_object root;
        const char *why = NULL;
        msgpack_zone_init(&z, 1024);
        ok(st == SB_OK && sb_json_parse(out.base, out.len, &z, &root, &why) == SB_OK && root.type == MSGPACK_OBJECT_MAP,
           "escapes keep the description valid JSON");
        msgpack_zone_destroy(&z);
    }
    sb_buf_free(&out);
}

int main(void)
{
    test_answers();
    test_descriptions();
    return done_testing();
}
