/*
 * Unit tests for supervisor-shim/relay/http.c: the request the relay sends (into a
 * capped sb_buf_t) and the response-head parser (RFC 9112 sections 4, 5 and
 * 6.3), each refusal with its exact reason, and the head cap's edge.
 */
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/mem.h"
#include "../../supervisor-shim/relay/http.c"

typedef struct st_head_case_t {
    const char *in;
    sb_status_t st;
    const char *why; /* on failure */
    int status;
    int64_t content_length;
    int must_close;
} head_case_t;

static const head_case_t cases[] = {
    {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", SB_OK, NULL, 200, 5, 0},
    {"HTTP/1.1 200 OK\r\n\r\n", SB_OK, NULL, 200, -1, 1},
    {"HTTP/1.1 204\r\n\r\n", SB_OK, NULL, 204, 0, 0},
    {"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n", SB_OK, NULL, 304, 0, 0},
    {"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", SB_OK, NULL, 200, 1, 1},
    {"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx", SB_OK, NULL, 200, 1, 0},
    {"HTTP/1.1 200 OK\r\nConnection: foo, CLOSE \r\nContent-Length: 0\r\n\r\n", SB_OK, NULL, 200, 0, 1},
    {"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nContent-Length: 0\r\n\r\n", SB_OK, NULL, 200, 0, 0},
    {"HTTP/1.1 413 Payload Too Large\r\ncontent-length:\t 3 \t\r\nX-A: b\r\n\r\n", SB_OK, NULL, 413, 3, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\n", SB_OK, NULL, 200, 4, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 000000000012\r\n\r\n", SB_OK, NULL, 200, 12, 0},
    {"HTTP/1.1 200 OK\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n", SB_OK, NULL, 200, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", SB_E_AGAIN, NULL, 0, 0, 0},
    {"HTTP/1.1 200 OK\r\n\r", SB_E_AGAIN, NULL, 0, 0, 0},
    {"", SB_E_AGAIN, NULL, 0, 0, 0},
    {"HTTP/2 200 OK\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed status line", 0, 0, 0},
    {"HTTP/1.2 200 OK\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed status line", 0, 0, 0},
    {"HTTP/1.1 099 OK\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed status line", 0, 0, 0},
    {"HTTP/1.1 20x OK\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed status line", 0, 0, 0},
    {"HTTP/1.1 200\r\n\r\n", SB_OK, NULL, 200, -1, 1},
    {"HTTP/1.1 20\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed status line", 0, 0, 0},
    {"HTTP/1.1  200 OK\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed status line", 0, 0, 0},
    {"http/1.1 200 OK\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed status line", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n", SB_E_BAD_ARGS, "broker response uses obsolete header folding", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nX-A: b\r\n\tmore\r\n\r\n", SB_E_BAD_ARGS, "broker response uses obsolete header folding", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed header", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\n: empty name\r\n\r\n", SB_E_BAD_ARGS, "broker response has a malformed header", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n", SB_E_BAD_ARGS, "broker response has an invalid Content-Length", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", SB_E_BAD_ARGS, "broker response has an invalid Content-Length", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", SB_E_BAD_ARGS, "broker response has an invalid Content-Length", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n", SB_E_BAD_ARGS, "broker response has an invalid Content-Length", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 0000000000012\r\n\r\n", SB_E_BAD_ARGS, "broker response has an invalid Content-Length", 0,
     0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", SB_E_BAD_ARGS,
     "broker response has conflicting Content-Length headers", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", SB_E_BAD_ARGS, "broker response uses a transfer coding (unsupported)",
     0, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n", SB_E_TOO_LARGE, "broker response body is too large", 0, 0, 0},
    {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", SB_OK, NULL, 200, 100, 0},
};

static void test_heads(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        const head_case_t *c = &cases[i];
        sb_shim_http_head_t h;
        const char *why = NULL;
        const char *end = strstr(c->in, "\r\n\r\n");
        sb_status_t st = sb_shim_http_parse_head((const uint8_t *)c->in, strlen(c->in), 100, &h, &why);
        is_int(st, c->st, "case %zu: status", i);
        if (c->st == SB_OK) {
            ok(h.status == c->status && h.content_length == c->content_length && h.must_close == c->must_close && end != NULL &&
                   h.head_len == (size_t)(end + 4 - c->in),
               "case %zu: status %d, length %lld, close %d, head %zu", i, h.status, (long long)h.content_length, h.must_close,
               h.head_len);
        } else if (c->why != NULL) {
            is_str(why, c->why, "case %zu: reason", i);
        }
    }
}

/* the head cap: a terminator ending at SB_SHIM_MAX_RESPONSE_HEAD bytes is accepted, one byte later is not */
static void test_head_cap(void)
{
    size_t cap = SB_SHIM_MAX_RESPONSE_HEAD;
    char *p = malloc(cap + 64);
    static const char start[] = "HTTP/1.1 200 OK\r\nX-Pad: ";
    static const char tail[] = "\r\nContent-Length: 0\r\n\r\n";
    sb_shim_http_head_t h;
    const char *why = NULL;
    size_t pad;

    if (p == NULL) {
        ok(0, "memory");
        return;
    }
    /* the head is exactly cap bytes */
    pad = cap - (sizeof(start) - 1) - (sizeof(tail) - 1);
    memcpy(p, start, sizeof(start) - 1);
    memset(p + sizeof(start) - 1, 'a', pad);
    memcpy(p + sizeof(start) - 1 + pad, tail, sizeof(tail) - 1);
    is_int(sb_shim_http_parse_head((const uint8_t *)p, cap, 100, &h, &why), SB_OK, "a head of exactly the cap is parsed");
    is_int(h.head_len, cap, "its length");
    /* one byte more */
    memcpy(p, start, sizeof(start) - 1);
    memset(p + sizeof(start) - 1, 'a', pad + 1);
    memcpy(p + sizeof(start) - 1 + pad + 1, tail, sizeof(tail) - 1);
    why = NULL;
    is_int(sb_shim_http_parse_head((const uint8_t *)p, cap + 1, 100, &h, &why), SB_E_TOO_LARGE, "one byte over the cap");
    is_str(why, "broker response head is too large", "the reason");
    why = NULL;
    is_int(sb_shim_http_parse_head((const uint8_t *)p, cap - 1, 100, &h, &why), SB_E_AGAIN,
           "below the cap and no terminator yet: more bytes");
    free(p);
}

static void test_request(void)
{
    static const char want[] = "POST /api/sandbox/rpc HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/msgpack\r\n"
                               "Accept: application/msgpack\r\nx-questpie-sandbox-token: tok\r\nContent-Length: 3\r\n\r\nabc";
    size_t n = sizeof(want) - 1;
    sb_shim_url_t u;
    sb_buf_t b;
    unsigned long k, points = 0, bad = 0;
    sb_status_t st = SB_E_NOMEM;

    memset(&u, 0, sizeof(u));
    snprintf(u.target, sizeof(u.target), "/api/sandbox/rpc");
    snprintf(u.host_header, sizeof(u.host_header), "127.0.0.1:8080");
    sb_buf_init(&b, n);
    is_int(sb_shim_http_build_request(&b, &u, "tok", (const uint8_t *)"abc", 3), SB_OK, "request at exactly the cap");
    ok(b.len == n && memcmp(b.base, want, n) == 0, "request bytes");
    sb_buf_free(&b);
    sb_buf_init(&b, n - 1);
    is_int(sb_shim_http_build_request(&b, &u, "tok", (const uint8_t *)"abc", 3), SB_E_TOO_LARGE, "one byte below: SB_E_TOO_LARGE");
    sb_buf_free(&b);
    for (k = 1; k < 100; ++k) {
        sb_buf_init(&b, n);
        sb_mem_fail_nth(k);
        st = sb_shim_http_build_request(&b, &u, "tok", (const uint8_t *)"abc", 3);
        sb_mem_fail_nth(0);
        sb_buf_free(&b);
        if (st == SB_OK)
            break;
        ++points;
        if (st != SB_E_NOMEM)
            ++bad;
    }
    is_int(st, SB_OK, "request: built once no allocation fails");
    ok(points >= 1 && bad == 0, "request: %lu allocation failure points, each SB_E_NOMEM", points);
}

int main(void)
{
    test_heads();
    test_head_cap();
    test_request();
    return done_testing();
}
