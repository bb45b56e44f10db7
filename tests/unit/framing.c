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

int main(void)
{
    test_table();
    test_many_fields();
    return done_testing();
}
