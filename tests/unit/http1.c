/*
 * Unit tests for broker/fetch/http1.c, the response reader: when a complete
 * response leaves its connection reusable (sb_http1_reusable, the condition
 * for parking a kept-alive connection), the body's cap and the reader's
 * out-of-memory answers. Every case is fed whole and one byte per read; the
 * framing rules themselves are fuzzed (fuzz/fuzz_http_response.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "fetch/http1.h"
#include "sb/mem.h"

typedef struct {
    const char *name;
    const char *bytes;
    int head_request;
    int eof; /* the connection ends after the bytes */
    const char *err;
    int done, reusable;
    const char *body;
} case_t;

static const case_t cases[] = {
    {"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 0, 0, NULL, 1, 1, "ok"},
    {"chunked with trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n", 0, 0, NULL, 1,
     1, "ok"},
    {"204", "HTTP/1.1 204 No Content\r\n\r\n", 0, 0, NULL, 1, 1, ""},
    {"304", "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", 0, 0, NULL, 1, 1, ""},
    {"HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", 1, 0, NULL, 1, 1, ""},
    {"after an interim 100", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", 0, 0, NULL, 1, 1, "x"},
    {"connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 0, 0, NULL, 1, 0, "ok"},
    {"close in a list, any case", "HTTP/1.1 200 OK\r\nConnection: keep-alive ,\tCLOSE \r\nContent-Length: 2\r\n\r\nok", 0, 0, NULL,
     1, 0, "ok"},
    {"close as a second field", "HTTP/1.1 200 OK\r\nConnection: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 0, 0, NULL,
     1, 0, "ok"},
    {"a token that only contains close", "HTTP/1.1 200 OK\r\nConnection: closed, x-close\r\nContent-Length: 2\r\n\r\nok", 0, 0,
     NULL, 1, 1, "ok"},
    {"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 0, 0, NULL, 1, 0, "ok"},
    {"bytes after the body", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokX", 0, 0, NULL, 1, 0, "ok"},
    {"bytes after the last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX", 0, 0, NULL, 1, 0, ""},
    {"bytes after a 204", "HTTP/1.1 204 No Content\r\n\r\nX", 0, 0, NULL, 1, 0, ""},
    {"delimited by the close", "HTTP/1.1 200 OK\r\n\r\nto end", 0, 1, NULL, 1, 0, "to end"},
    {"cut inside the body", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", 0, 1,
     "connection closed before the response body completed", 0, 0, NULL},
    {"cut inside the chunks", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", 0, 1,
     "connection closed inside chunked body", 0, 0, NULL},
    {"length above the cap", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", 0, 0, "response body exceeds the cap", 0, 0, NULL},
    {"chunks above the cap", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n0\r\n\r\n", 0, 0,
     "response body exceeds the cap", 0, 0, NULL},
};

#define CAP 8

/* feeds the bytes in reads of `step` bytes through a buffer that keeps what the reader did not consume */
static const char *feed(sb_http1_reader_t *r, const case_t *c, size_t step, int *done)
{
    size_t len = strlen(c->bytes), sent = 0, pend = 0;
    char *buf = malloc(len + 1);
    const char *err = NULL;

    *done = 0;
    for (;;) {
        size_t n = len - sent < step ? len - sent : step, consumed;
        int eof = c->eof && sent + n == len;
        memcpy(buf + pend, c->bytes + sent, n);
        sent += n;
        pend += n;
        if ((err = sb_http1_feed(r, buf, pend, eof, &consumed, done)) != NULL || *done || sent == len)
            break;
        memmove(buf, buf + consumed, pend - consumed);
        pend -= consumed;
    }
    free(buf);
    return err;
}

int main(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        const case_t *c = &cases[i];
        for (size_t step = 0; step < 2; ++step) {
            sb_http1_reader_t r;
            int done;
            const char *err;

            sb_http1_init(&r, c->head_request, CAP);
            err = feed(&r, c, step == 0 ? strlen(c->bytes) : 1, &done);
            is_str(err != NULL ? err : "(none)", c->err != NULL ? c->err : "(none)", "%s, %s: error", c->name,
                   step ? "byte by byte" : "whole");
            is_int(done, c->done, "%s, %s: complete", c->name, step ? "byte by byte" : "whole");
            if (c->done) {
                /*
                 * byte by byte, the response is complete before the stray bytes arrive: then the
                 * client has parked the connection, and its idle watch closes it on the first byte
                 */
                int trailing = strncmp(c->name, "bytes after", 11) == 0;
                is_int(sb_http1_reusable(&r), trailing && step ? 1 : c->reusable, "%s, %s: reusable", c->name,
                       step ? "byte by byte" : "whole");
                ok(r.res.body_len == strlen(c->body) &&
                       memcmp(r.res.body != NULL ? (const char *)r.res.body : "", c->body, r.res.body_len) == 0,
                   "%s, %s: body", c->name, step ? "byte by byte" : "whole");
            }
            sb_http1_dispose(&r);
        }
    }

    /* out of memory: the head's copy (the first try-allocation), then the body's first growth */
    for (unsigned long nth = 1; nth <= 2; ++nth) {
        static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        char buf[sizeof(resp)];
        sb_http1_reader_t r;
        size_t consumed;
        int done;
        const char *err;

        memcpy(buf, resp, sizeof(resp));
        sb_http1_init(&r, 0, CAP);
        sb_mem_fail_nth(nth);
        err = sb_http1_feed(&r, buf, sizeof(resp) - 1, 0, &consumed, &done);
        sb_mem_fail_nth(0);
        is_str(err != NULL ? err : "(none)", "out of memory", "allocation %lu failing: out of memory", nth);
        ok(!done, "allocation %lu failing: not complete", nth);
        sb_http1_dispose(&r);
    }
    return done_testing();
}
