/*
 * Unit tests for broker/svc/tools/mcp_wire.c: the event-stream parser (WHATWG
 * "Interpreting an event stream") and the JSON-RPC response picker that the
 * MCP client reads upstream answers with.
 */
#include <stdlib.h>
#include <string.h>
#include "sb/mem.h"
#include "sb/value.h"
#include "svc/tools/mcp_wire.h"
#include "tap.h"

/* ---- raw events ------------------------------------------------------------------------------------------------------ */

typedef struct st_events_t {
    char log[4096]; /* "type=data|type=data|" */
    size_t len;
    int n;
    int stop_after; /* stop once this many events arrived (0: never) */
} events_t;

static int collect(void *arg, const char *type, size_t type_len, const char *data, size_t data_len)
{
    events_t *e = arg;
    int w = snprintf(e->log + e->len, sizeof(e->log) - e->len, "%.*s=%.*s|", (int)type_len, type, (int)data_len, data);
    if (w > 0 && (size_t)w < sizeof(e->log) - e->len)
        e->len += (size_t)w;
    ++e->n;
    return e->stop_after != 0 && e->n >= e->stop_after;
}

/* feeds `s` in pieces of `chunk` bytes (0: all at once); returns the last status */
static sb_status_t feed(const char *s, size_t len, size_t chunk, size_t max, events_t *e, int *stopped)
{
    sb_sse_t p;
    sb_status_t st = SB_OK;
    size_t off = 0;
    int stop = 0;

    memset(e, 0, sizeof(*e) - sizeof(e->stop_after));
    sb_sse_init(&p, max);
    if (chunk == 0)
        chunk = len != 0 ? len : 1;
    while (off < len && st == SB_OK && !stop) {
        size_t n = len - off < chunk ? len - off : chunk;
        st = sb_sse_feed(&p, s + off, n, collect, e, &stop);
        off += n;
    }
    sb_sse_dispose(&p);
    if (stopped != NULL)
        *stopped = stop;
    return st;
}

static void check_events(const char *name, const char *stream, const char *want)
{
    static const size_t chunks[] = {0, 1, 2, 3, 7};
    events_t e;
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); ++i) {
        e.stop_after = 0;
        sb_status_t st = feed(stream, strlen(stream), chunks[i], 1024, &e, NULL);
        ok(st == SB_OK, "%s: feeds (chunk %zu)", name, chunks[i]);
        e.log[e.len] = '\0';
        is_str(e.log, want, "%s: events (chunk %zu)", name, chunks[i]);
    }
}

static void test_events(void)
{
    check_events("one event", "event: message\ndata: hello\n\n", "message=hello|");
    check_events("default type", "data: x\n\n", "message=x|");
    check_events("no space after colon", "data:x\n\n", "message=x|");
    check_events("only one space removed", "data:  x\n\n", "message= x|");
    check_events("multi-line data", "data: a\ndata: b\n\n", "message=a\nb|");
    check_events("CRLF", "event: message\r\ndata: a\r\ndata: b\r\n\r\n", "message=a\nb|");
    check_events("CR only", "data: a\rdata: b\r\r", "message=a\nb|");
    check_events("mixed line ends", "data: a\r\ndata: b\rdata: c\n\r\n", "message=a\nb\nc|");
    check_events("comments and unknown fields", ": keep-alive\nid: 7\nretry: 10\nfoo: bar\ndata: z\n\n", "message=z|");
    check_events("field without colon", "data\n\n", "message=|");
    check_events("empty data field", "data:\n\n", "message=|");
    check_events("no data, no event", "event: message\n\nid: 1\n\n", "");
    check_events("blank lines only", "\n\n\r\n\r\r", "");
    check_events("event type", "event: ping\ndata: 1\n\ndata: 2\n\n", "ping=1|message=2|");
    check_events("empty event field means message", "event:\ndata: 1\n\n", "message=1|");
    check_events("last event field wins", "event: a\nevent: b\ndata: 1\n\n", "b=1|");
    check_events("type reset after dispatch", "event: a\ndata: 1\n\ndata: 2\n\n", "a=1|message=2|");
    check_events("three events", "data: 1\n\ndata: 2\n\ndata: 3\n\n", "message=1|message=2|message=3|");
    check_events("BOM",
                 "\xef\xbb\xbf"
                 "data: 1\n\n",
                 "message=1|");
    check_events("one BOM only",
                 "\xef\xbb\xbf\xef\xbb\xbf"
                 "data: 1\n\n",
                 "");
    check_events("BOM-like prefix",
                 "\xef"
                 "data: 1\n\ndata: 2\n\n",
                 "message=2|");
    check_events("colon inside the value", "data: a:b: c\n\n", "message=a:b: c|");
    check_events("field name case matters", "Data: 1\n\nDATA: 2\n\n", "");
    check_events("long field names are unknown", "datadatadatadata: 1\n\n", "");
    check_events("unterminated event is discarded", "data: 1\n\ndata: 2\n", "message=1|");
    check_events("unterminated line is discarded", "data: 1\n\ndata: 2", "message=1|");
    check_events("long comment",
                 ":aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\ndata: 1\n\n",
                 "message=1|");
}

static void test_event_limits(void)
{
    char big[4096];
    events_t e;
    sb_status_t st;
    int stopped;

    /* exactly max bytes of data is fine; one more is not */
    memcpy(big, "data: ", 6);
    memset(big + 6, 'x', 100);
    memcpy(big + 106, "\n\n", 3);
    e.stop_after = 0;
    st = feed(big, strlen(big), 0, 100, &e, NULL);
    is_int(st, SB_OK, "100 data bytes under a 100-byte cap");
    is_int(e.n, 1, "one event");
    e.stop_after = 0;
    st = feed(big, strlen(big), 0, 99, &e, NULL);
    is_int(st, SB_E_TOO_LARGE, "100 data bytes over a 99-byte cap");
    e.stop_after = 0;
    st = feed(big, strlen(big), 1, 99, &e, NULL);
    is_int(st, SB_E_TOO_LARGE, "the same, byte by byte");
    /* the cap counts the LFs that join data lines */
    e.stop_after = 0;
    st = feed("data: 12345\ndata: 12345\n\n", 25, 0, 11, &e, NULL);
    is_int(st, SB_OK, "two 5-byte lines joined: 11 bytes under an 11-byte cap");
    e.stop_after = 0;
    st = feed("data: 12345\ndata: 12345\n\n", 25, 0, 10, &e, NULL);
    is_int(st, SB_E_TOO_LARGE, "... and over a 10-byte cap");
    /* a callback can stop the parser */
    e.stop_after = 1;
    st = feed("data: 1\n\ndata: 2\n\n", 18, 0, 100, &e, &stopped);
    ok(st == SB_OK && stopped && e.n == 1, "a callback's stop is honoured");
    /* a data buffer reused across events does not keep the old bytes */
    e.stop_after = 0;
    st = feed("data: long-long\n\ndata: s\n\n", 26, 0, 100, &e, NULL);
    e.log[e.len] = '\0';
    is_str(e.log, "message=long-long|message=s|", "the buffer resets between events");
}

/* ---- the picker ------------------------------------------------------------------------------------------------------ */

typedef struct st_picked_t {
    sb_status_t st;
    char err[512];
    char json[1024]; /* the result, as JSON */
} picked_t;

static picked_t pick(sb_mcp_body_t kind, const char *body, int64_t id, size_t max)
{
    picked_t r;
    msgpack_sbuffer out;
    msgpack_zone zone;
    msgpack_object obj;
    const char *why = NULL;

    memset(&r, 0, sizeof(r));
    msgpack_sbuffer_init(&out);
    r.st = sb_mcp_pick_response(kind, body, strlen(body), id, max, &out, r.err, sizeof(r.err));
    if (r.st == SB_OK) {
        json_t *j = NULL;
        char *text;
        msgpack_zone_init(&zone, 1024);
        if (sb_mp_decode((const uint8_t *)out.data, out.size, &zone, &obj, &why) == SB_OK && sb_json_from_mp(&obj, &j) == SB_OK &&
            (text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS)) != NULL) {
            snprintf(r.json, sizeof(r.json), "%s", text);
            free(text);
        }
        json_decref(j);
        msgpack_zone_destroy(&zone);
    }
    msgpack_sbuffer_destroy(&out);
    return r;
}

static void test_pick_json(void)
{
    picked_t r;

    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"a\":1}}", 3, 4096);
    ok(r.st == SB_OK, "JSON body: the response");
    is_str(r.json, "{\"a\":1}", "JSON body: the result object");
    r = pick(SB_MCP_BODY_JSON,
             "[{\"jsonrpc\":\"2.0\",\"method\":\"x\"},{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}},"
             "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"b\":[true]}}]",
             3, 4096);
    ok(r.st == SB_OK, "batch: the element with our id");
    is_str(r.json, "{\"b\":[true]}", "batch: its result");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "another id: no response");
    is_str(r.err, "upstream answered no JSON-RPC response to request 3", "no response: message");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":\"3\",\"result\":{}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "a string id never matches an integer id");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":-5,\"result\":{}}", -5, 4096);
    is_int(r.st, SB_OK, "negative ids compare too");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32603,\"message\":\"Unknown tool: nope\"}}", 3,
             4096);
    is_int(r.st, SB_E_EXECUTION, "a JSON-RPC error");
    is_str(r.err, "JSON-RPC error -32603: Unknown tool: nope", "the error, described");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":1,\"message\":\"a\\nb\\u0000c\"}}", 3, 4096);
    is_str(r.err, "JSON-RPC error 1: a?b?c", "control characters of upstream text are replaced");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":\"x\",\"message\":\"m\"}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "an error with a non-integer code is malformed");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":1.5,\"message\":\"m\"}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "an error with a fractional code is malformed");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{},\"error\":{\"code\":1,\"message\":\"m\"}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "both result and error");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "neither result nor error");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"1.0\",\"id\":3,\"result\":{}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "not JSON-RPC 2.0");
    is_str(r.err, "upstream response is not JSON-RPC 2.0", "not 2.0: message");
    r = pick(SB_MCP_BODY_JSON, "{\"id\":3,\"result\":{}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "no jsonrpc member");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":[1]}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "a result that is not an object");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "truncated JSON");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "duplicate keys are refused");
    r = pick(SB_MCP_BODY_JSON, "\"just a string\"", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "not an object");
    r = pick(SB_MCP_BODY_JSON, "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}", 3,
             40);
    is_int(r.st, SB_E_TOO_LARGE, "a message over the cap");
    is_str(r.err, "upstream message exceeds 40 bytes", "oversize: message");
    r = pick(SB_MCP_BODY_OTHER, "{}", 3, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "neither JSON nor SSE");
}

static void test_pick_sse(void)
{
    picked_t r;
    const char *stream;

    stream = "event: message\nid: a_1\ndata: {\"result\":{\"content\":[]},\"jsonrpc\":\"2.0\",\"id\":2}\n\n";
    r = pick(SB_MCP_BODY_SSE, stream, 2, 4096);
    ok(r.st == SB_OK, "SSE: the response event");
    is_str(r.json, "{\"content\":[]}", "SSE: its result");

    /* a priming event (empty data), a notification, a server request, a response to another id, then ours */
    stream =
        "id: prime\ndata:\n\n"
        "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\r\n\r\n"
        "data: {\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"sampling/createMessage\",\"params\":{}}\n\n"
        "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"x\":0}}\n\n"
        "event: other\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"wrong\":true}}\n\n"
        "data: {\"jsonrpc\":\"2.0\",\n"
        "data:  \"id\":2,\"result\":{\"ok\":1}}\n\n"
        "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"second\":1}}\n\n";
    r = pick(SB_MCP_BODY_SSE, stream, 2, 4096);
    ok(r.st == SB_OK, "SSE: ours among other messages");
    is_str(r.json, "{\"ok\":1}", "SSE: the first message-typed response with our id, data lines joined");

    r = pick(SB_MCP_BODY_SSE, "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n", 2, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "SSE: an event cut off by the end of the stream is discarded");
    r = pick(SB_MCP_BODY_SSE, "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"error\":{\"code\":-32602,\"message\":\"bad\"}}\n\n", 2, 4096);
    is_int(r.st, SB_E_EXECUTION, "SSE: a JSON-RPC error");
    is_str(r.err, "JSON-RPC error -32602: bad", "SSE: the error, described");
    r = pick(SB_MCP_BODY_SSE, "data: not json\n\n", 2, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "SSE: data that is not JSON");
    r = pick(SB_MCP_BODY_SSE, "data: [{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}]\n\n", 2, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "SSE: one message per event, no batches");
    r = pick(SB_MCP_BODY_SSE, "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}\n\n", 2,
             40);
    is_int(r.st, SB_E_TOO_LARGE, "SSE: an event over the cap");
    is_str(r.err, "upstream message exceeds 40 bytes", "SSE oversize: message");
    r = pick(SB_MCP_BODY_SSE, "", 2, 4096);
    is_int(r.st, SB_E_BAD_ARGS, "SSE: an empty stream");
    /* the response stops the parse: what follows it is never looked at */
    r = pick(SB_MCP_BODY_SSE, "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\ndata: garbage\n\n", 2, 4096);
    is_int(r.st, SB_OK, "SSE: bytes after the response are not parsed");
}

static void test_helpers(void)
{
    char buf[64];

    is_int(sb_mcp_body_kind("application/json", 16), SB_MCP_BODY_JSON, "application/json");
    is_int(sb_mcp_body_kind("Application/JSON; charset=utf-8", 31), SB_MCP_BODY_JSON, "case and parameters");
    is_int(sb_mcp_body_kind(" text/event-stream ;x=y", 23), SB_MCP_BODY_SSE, "text/event-stream with whitespace");
    is_int(sb_mcp_body_kind("text/event-streamx", 18), SB_MCP_BODY_OTHER, "a longer type");
    is_int(sb_mcp_body_kind("text/html", 9), SB_MCP_BODY_OTHER, "text/html");
    is_int(sb_mcp_body_kind(NULL, 0), SB_MCP_BODY_OTHER, "no Content-Type");

    sb_mcp_sanitize("ab\x01\x7f"
                    "c",
                    5, 100, buf, sizeof(buf));
    is_str(buf, "ab??c", "sanitize: control bytes");
    sb_mcp_sanitize("abcdefghij", 10, 8, buf, sizeof(buf));
    is_str(buf, "abcde...", "sanitize: cut with an ellipsis");
    sb_mcp_sanitize("abcd\xc3\xa9xyz", 10, 8, buf, sizeof(buf));
    is_str(buf, "abcd...", "sanitize: never inside a UTF-8 sequence");
    sb_mcp_sanitize("abcdefghij", 10, 100, buf, 6);
    is_str(buf, "ab...", "sanitize: bounded by the buffer");

    {
        const char *body =
            "{\"jsonrpc\":\"2.0\",\"error\":{\"code\":-32000,\"message\":\"Bad Request: No valid session ID provided\"}}";
        char hint[128];
        ok(sb_mcp_error_hint(body, strlen(body), hint, sizeof(hint)) != 0, "error hint from an HTTP error body");
        is_str(hint, "JSON-RPC error -32000: Bad Request: No valid session ID provided", "error hint text");
    }
    is_int(sb_mcp_error_hint("Not Found", 9, buf, sizeof(buf)), 0, "no hint from text");
    is_str(buf, "", "no hint: empty");
}

/* the POST to an MCP server: exact bytes, the cap, and every allocation failed in turn */
static void test_request(void)
{
    static const char plain[] = "POST /mcp HTTP/1.1\r\nHost: tools.test:8000\r\nContent-Type: application/json\r\n"
                                "Accept: application/json, text/event-stream\r\nUser-Agent: ua/1\r\n"
                                "Content-Length: 2\r\nConnection: close\r\n\r\n{}";
    static const char session[] = "POST /mcp HTTP/1.1\r\nHost: tools.test:8000\r\nContent-Type: application/json\r\n"
                                  "Accept: application/json, text/event-stream\r\nUser-Agent: ua/1\r\n"
                                  "Content-Length: 5\r\nConnection: close\r\nMcp-Session-Id: s-1\r\n"
                                  "MCP-Protocol-Version: 2025-06-18\r\n\r\n[1,2]";
    size_t n = sizeof(session) - 1;
    unsigned long k, points = 0, bad = 0;
    sb_status_t st = SB_E_NOMEM;
    sb_buf_t b;
    char *big;

    sb_buf_init(&b, SB_MCP_MAX_REQUEST);
    is_int(sb_mcp_build_request(&b, "/mcp", "tools.test:8000", "ua/1", NULL, NULL, "{}", 2), SB_OK, "request without a session");
    ok(b.len == sizeof(plain) - 1 && memcmp(b.base, plain, b.len) == 0, "request without a session: the bytes");
    sb_buf_reset(&b);
    is_int(sb_mcp_build_request(&b, "/mcp", "tools.test:8000", "ua/1", "s-1", "2025-06-18", "[1,2]", 5), SB_OK,
           "request in a session");
    ok(b.len == n && memcmp(b.base, session, n) == 0, "request in a session: session id and version headers");
    sb_buf_free(&b);

    sb_buf_init(&b, n + 1);
    ok(sb_buf_append(&b, "x", 1) == SB_OK, "prefix");
    is_int(sb_mcp_build_request(&b, "/mcp", "tools.test:8000", "ua/1", "s-1", "2025-06-18", "[1,2]", 5), SB_OK,
           "a cap of exactly prefix + request fits");
    sb_buf_free(&b);
    sb_buf_init(&b, n);
    ok(sb_buf_append(&b, "x", 1) == SB_OK, "prefix");
    is_int(sb_mcp_build_request(&b, "/mcp", "tools.test:8000", "ua/1", "s-1", "2025-06-18", "[1,2]", 5), SB_E_TOO_LARGE,
           "one byte below: SB_E_TOO_LARGE");
    ok(b.len == 1 && b.base[0] == 'x' && b.base[1] == '\0', "over the cap, the buffer holds only the prefix");
    sb_buf_free(&b);

    /* a body as large as the cap itself cannot fit with its head */
    big = malloc(SB_MCP_MAX_REQUEST);
    if (big != NULL) {
        memset(big, 'a', SB_MCP_MAX_REQUEST);
        sb_buf_init(&b, SB_MCP_MAX_REQUEST);
        is_int(sb_mcp_build_request(&b, "/mcp", "h", "ua/1", NULL, NULL, big, SB_MCP_MAX_REQUEST), SB_E_TOO_LARGE,
               "a body of SB_MCP_MAX_REQUEST bytes: SB_E_TOO_LARGE");
        is_int(b.len, 0, "nothing kept");
        sb_buf_free(&b);
        free(big);
    }

    for (k = 1; k < 1000; ++k) {
        sb_buf_init(&b, SB_MCP_MAX_REQUEST);
        sb_mem_fail_nth(k);
        st = sb_mcp_build_request(&b, "/mcp", "tools.test:8000", "ua/1", "s-1", "2025-06-18", "[1,2]", 5);
        sb_mem_fail_nth(0);
        if (st == SB_OK) {
            if (b.len != n || memcmp(b.base, session, n) != 0)
                ++bad;
            sb_buf_free(&b);
            break;
        }
        ++points;
        if (st != SB_E_NOMEM || b.len != 0)
            ++bad;
        sb_buf_free(&b);
    }
    is_int(st, SB_OK, "request: built once no allocation fails");
    ok(points >= 1, "request: %lu allocation failure points walked", points);
    is_int(bad, 0, "request: every failure point is SB_E_NOMEM with nothing kept");
}

/* an event stream whose data buffer grows several times: each allocation failed in turn is SB_E_NOMEM */
static void test_sse_alloc_failures(void)
{
    static const char head[] = ": priming\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"t\":[\n";
    static const char line[] = "data: \"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz\",\n";
    static const char tail[] = "data: 0]}}\n\n";
    size_t lines = 300, len = sizeof(head) - 1 + lines * (sizeof(line) - 1) + sizeof(tail) - 1, o;
    char *body = malloc(len + 1);
    unsigned long k, points = 0, stream = 0, decode = 0, bad = 0;
    picked_t r;

    if (body == NULL) {
        ok(0, "memory for the stream");
        return;
    }
    memcpy(body, head, sizeof(head) - 1);
    o = sizeof(head) - 1;
    for (size_t i = 0; i < lines; ++i, o += sizeof(line) - 1)
        memcpy(body + o, line, sizeof(line) - 1);
    memcpy(body + o, tail, sizeof(tail));
    memset(&r, 0, sizeof(r));
    r.st = SB_E_NOMEM;
    for (k = 1; k < 10000; ++k) {
        sb_mem_fail_nth(k);
        r = pick(SB_MCP_BODY_SSE, body, 9, 65536);
        sb_mem_fail_nth(0);
        if (r.st == SB_OK)
            break;
        ++points;
        if (r.st == SB_E_NOMEM && strcmp(r.err, "out of memory reading the event stream") == 0)
            ++stream;
        else if (r.st == SB_E_NOMEM && strcmp(r.err, "out of memory decoding an upstream message") == 0)
            ++decode;
        else
            ++bad;
    }
    is_int(r.st, SB_OK, "SSE: picked once no allocation fails");
    ok(strncmp(r.json, "{\"t\":[\"zzz", 9) == 0, "SSE: the result");
    ok(stream >= 3, "SSE: the data buffer grew through %lu allocation failure points", stream);
    ok(decode >= 1, "SSE: the message's decoding has %lu allocation failure points", decode);
    is_int(bad, 0, "SSE: every one of the %lu failure points is SB_E_NOMEM with its message", points);
    free(body);
}

int main(void)
{
    test_events();
    test_event_limits();
    test_pick_json();
    test_pick_sse();
    test_helpers();
    test_request();
    test_sse_alloc_failures();
    return done_testing();
}
