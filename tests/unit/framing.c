/*
 * Unit tests for broker/http/framing.c, sb_http_framing_check: which request heads frame their body
 * unambiguously (RFC 9112 sections 5.2, 6.1, 6.3; RFC 9110 section 8.6), with the exact reason for each
 * refusal. The route-level behaviour (400, connection closed) is tests/integration/test_framing.py.
 */
#include <stdio.h>
#include <string.h>
#include "tap.h"
#include "http/framing.h"

#define R_PARSE "the request head does not parse"
#define R_FOLD "obs-fold line in the request head"
#define R_TE10 "Transfer-Encoding in an HTTP/1.0 request"
#define R_BOTH "both Transfer-Encoding and Content-Length"
#define R_TE2 "more than one Transfer-Encoding field"
#define R_TECODING "Transfer-Encoding other than chunked"
#define R_CL2 "more than one Content-Length field"
#define R_CLNUM "Content-Length is not a decimal number"

static const struct {
    const char *head, *why;
} cases[] = {
    /* accepted */
    {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", NULL},
    {"GET / HTTP/1.0\r\n\r\n", NULL},
    {"POST /r HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", NULL},
    {"POST /r HTTP/1.1\r\ncontent-length: 0\r\n\r\n", NULL},
    {"POST /r HTTP/1.1\r\nCONTENT-LENGTH: 0005\r\n\r\nhello", NULL},
    {"POST /r HTTP/1.1\r\nContent-Length:  \t5\r\n\r\nhello", NULL}, /* leading OWS is not part of the value */
    {"POST /r HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello", NULL},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", NULL},
    {"POST /r HTTP/1.1\r\ntransfer-encoding: CHUNKED\r\n\r\n0\r\n\r\n", NULL},
    {"POST /r HTTP/1.1\nTransfer-Encoding: chunked\n\n0\r\n\r\n", NULL}, /* bare LF, as picohttpparser reads it */
    {"POST /r HTTP/1.1\r\nContent-Lengthx: 5\r\nX-Content-Length: 7\r\nTransfer-Encodings: gzip\r\n\r\n", NULL},
    {"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", NULL}, /* not this head */
    /* Content-Length */
    {"POST /r HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", R_CL2},
    {"POST /r HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", R_CL2},
    {"POST /r HTTP/1.1\r\nContent-Length: 5\r\nHost: a\r\ncontent-length: 5\r\n\r\nhello", R_CL2},
    {"POST /r HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", R_CLNUM},
    {"POST /r HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", R_CLNUM},
    {"POST /r HTTP/1.1\r\nContent-Length: -1\r\n\r\nhello", R_CLNUM},
    {"POST /r HTTP/1.1\r\nContent-Length: 5 \r\n\r\nhello", R_CLNUM},
    {"POST /r HTTP/1.1\r\nContent-Length: 5 5\r\n\r\nhello", R_CLNUM},
    {"POST /r HTTP/1.1\r\nContent-Length: 0x5\r\n\r\nhello", R_CLNUM},
    {"POST /r HTTP/1.1\r\nContent-Length:\r\n\r\nhello", R_CLNUM},
    /* Transfer-Encoding */
    {"POST /r HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", R_BOTH},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", R_BOTH},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5, 6\r\n\r\n0\r\n\r\n", R_BOTH},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", R_TE2},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", R_TE2},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", R_TECODING},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", R_TECODING},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n", R_TECODING},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked \r\n\r\n0\r\n\r\n", R_TECODING},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding:\r\n\r\n", R_TECODING},
    {"POST /r HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", R_TE10},
    {"POST /r HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", R_TE10},
    /* obs-fold (RFC 9112 section 5.2) */
    {"POST /r HTTP/1.1\r\nX-A: a\r\n b\r\nContent-Length: 1\r\n\r\nx", R_FOLD},
    {"POST /r HTTP/1.1\r\nContent-Length: 5\r\n\t6\r\n\r\nhello", R_FOLD},
    {"POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\n , gzip\r\n\r\n0\r\n\r\n", R_FOLD},
    /* not a head: refused, never waved through */
    {"", R_PARSE},
    {"GET / HTTP/1.1\r\nHost: a\r\n", R_PARSE},
    {"GET / HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello", R_PARSE},
    {"GET / HTTP/1.1\r\n Folded: first\r\n\r\n", R_PARSE},
    {"NOT A REQUEST\r\n\r\n", R_PARSE},
};

static void test_table(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i)
        is_str(sb_http_framing_check(cases[i].head, strlen(cases[i].head)), cases[i].why, "case %zu: %s", i,
               cases[i].why != NULL ? cases[i].why : "accepted");
}

static void test_many_fields(void)
{
    /* h2o reads at most H2O_MAX_HEADERS fields; a head with more never reaches a route, and is refused here too */
    static char head[16384];
    size_t n = 0;
    n += (size_t)snprintf(head + n, sizeof(head) - n, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < H2O_MAX_HEADERS; ++i)
        n += (size_t)snprintf(head + n, sizeof(head) - n, "X-%d: v\r\n", i);
    n += (size_t)snprintf(head + n, sizeof(head) - n, "\r\n");
    is_str(sb_http_framing_check(head, n), NULL, "%d fields are read", H2O_MAX_HEADERS);
    n -= 2;
    n += (size_t)snprintf(head + n, sizeof(head) - n, "Content-Length: 1\r\n\r\nx");
    is_str(sb_http_framing_check(head, n), R_PARSE, "%d fields are refused", H2O_MAX_HEADERS + 1);
}

/* the quick check with the request line's own method and target, as the route passes h2o's */
static int plain(const char *head, size_t len)
{
    const char *sp1 = memchr(head, ' ', len), *sp2;
    if (sp1 == NULL || (sp2 = memchr(sp1 + 1, ' ', len - (size_t)(sp1 + 1 - head))) == NULL)
        return sb_http_framing_plain(head, len, "GET", 3, "/", 1);
    return sb_http_framing_plain(head, len, head, (size_t)(sp1 - head), sp1 + 1, (size_t)(sp2 - sp1 - 1));
}

static int plain_str(const char *head)
{
    return plain(head, strlen(head));
}

static void test_plain(void)
{
    static const char *const quick[] = {
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
        "POST /r HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        "POST /r HTTP/1.1\r\nCONTENT-LENGTH: 0005\r\n\r\nhello",
        "POST /r HTTP/1.1\r\nContent-Length:  \t5\r\n\r\nhello",
        "POST /r HTTP/1.1\r\nX-Content-Length: 7\r\nContent-Type: a\r\nConnection: keep-alive\r\nX-Transfer-Encoding: b\r\n\r\n",
        "POST /api/sandbox/rpc HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nx-questpie-sandbox-token: t\r\n"
        "Content-Length: 2\r\n\r\n{}",
    };
    /* every head the full check refuses, the quick one leaves to it */
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i)
        if (cases[i].why != NULL)
            ok(!plain(cases[i].head, strlen(cases[i].head)), "case %zu (%s) is not waved through", i, cases[i].why);
    for (size_t i = 0; i < sizeof(quick) / sizeof(quick[0]); ++i) {
        size_t n = strlen(quick[i]);
        ok(plain(quick[i], n) && sb_http_framing_check(quick[i], n) == NULL, "quick %zu is accepted by both", i);
        /* a head cut anywhere before its end is never certain */
        {
            size_t head = (size_t)(strstr(quick[i], "\r\n\r\n") - quick[i]) + 4, certain = 0;
            for (size_t cut = 0; cut < head; ++cut)
                certain += (size_t)plain(quick[i], cut);
            is_int((int)certain, 0, "quick %zu cut short is never certain", i);
        }
    }
    /* another request line than the request's, a bare LF, a Transfer-Encoding: the full check decides */
    ok(!sb_http_framing_plain("POST /r HTTP/1.1\r\n\r\n", 19, "POST", 4, "/s", 2), "another target");
    ok(!sb_http_framing_plain("POST /r HTTP/1.1\r\n\r\n", 19, "GET", 3, "/r", 2), "another method");
    ok(!plain_str("POST /r HTTP/1.1\nHost: a\n\n"), "bare LF");
    ok(!plain_str("POST /r HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), "chunked");
    ok(!plain_str("POST /r HTTP/1.2\r\n\r\n"), "HTTP/1.2");
    ok(!plain_str("POST /r HTTP/1.1\r\nContent-Length\r\n\r\n"), "Content-Length without a colon");
    /* names that only begin like a framing field are left to the full check too */
    ok(!plain_str("POST /r HTTP/1.1\r\nContent-Lengthx: 5\r\n\r\n"), "Content-Lengthx");
    ok(!plain_str("POST /r HTTP/1.1\r\nTransfer-Encodings: gzip\r\n\r\n"), "Transfer-Encodings");
}

int main(void)
{
    test_table();
    test_many_fields();
    test_plain();
    return done_testing();
}
