/*
 * broker/fetch/http1: the HTTP/1.1 response reader of http.fetch, without
 * sockets.
 *
 * The client (fetch/client.c) hands over the bytes its connection has
 * buffered; the reader parses the head with picohttpparser (interim 1xx
 * responses skipped, 101 refused, at most SB_MAX_RESPONSE_HEAD bytes and
 * SB_MAX_RESPONSE_HEADERS headers), picks the framing (none for HEAD, 204 and
 * 304; chunked, which overrides Content-Length; Content-Length; else up to
 * the close) and collects the body, never above max_body. Content-Length is
 * never trusted for allocation: the body grows with the bytes that arrive.
 * Kept apart from the socket code so that fuzz/fuzz_http_response.c and
 * fuzz/fuzz_chunked.c can feed it bytes split at any point.
 */
#ifndef SB_FETCH_HTTP1_H
#define SB_FETCH_HTTP1_H

#include <stddef.h>
#include "fetch/client.h"
#include "sb/buf.h"

/* picohttpparser's chunked decoder state (libh2o-evloop 2.2.5 layout; Debian ships no header) */
struct phr_chunked_decoder {
    size_t bytes_left_in_chunk;
    char consume_trailer;
    char _hex_count;
    char _state;
};

typedef struct st_sb_http1_reader_t {
    int state;
    int head_request; /* a HEAD request: the response has no body */
    int wipe;         /* sb_http1_set_wipe: the head copy and the body are wiped before they are freed (a run's secrets) */
    size_t max_body;
    size_t content_length;
    size_t head_seen; /* bytes of the current head already seen incomplete (picohttpparser's last_len) */
    struct phr_chunked_decoder chunked;
    int minor_version; /* of the final response */
    int conn_close;    /* the final response says "Connection: close" */
    int reusable;      /* set when complete: the connection may carry another exchange */
    char *head;        /* copy of the response head, backing res.headers (sb_mem) */
    size_t head_len;
    sb_buf_t body;          /* the body, capped at max_body; res.body and res.body_len view it */
    sb_http_response_t res; /* the response; res.body grows as it arrives */
} sb_http1_reader_t;

/** zeroes the reader, ready for the response head */
void sb_http1_init(sb_http1_reader_t *r, int head_request, size_t max_body);
/**
 * Before the first feed, for a run that holds secrets (PROTOCOL.md section 5):
 * the head copy and the body (a secret sb_buf_t) are zeroed before their
 * memory is released or reused.
 */
void sb_http1_set_wipe(sb_http1_reader_t *r);
/** frees the head copy and the body */
void sb_http1_dispose(sb_http1_reader_t *r);
/**
 * After a complete response (*done set by sb_http1_feed): 1 when the
 * connection may carry another exchange (RFC 9112 section 9.3): an HTTP/1.1
 * response without "Connection: close", whose end was framed (Content-Length
 * reached, the last chunk and trailers read, or no body by rule) and followed
 * by no byte at all. A body delimited by the close, HTTP/1.0, or anything
 * buffered past the end is 0.
 */
int sb_http1_reusable(const sb_http1_reader_t *r);

/**
 * Feeds the bytes the connection has buffered and not consumed yet.
 * @param buf      those bytes; a chunked body is decoded in place
 * @param eof      the connection ended (closed or failed) after these bytes
 * @param consumed set to how many bytes at the front of buf the caller drops before the next call
 *                 (meaningful when NULL is returned and *done is 0)
 * @param done     set to 1 when the response is complete (r->res is then valid)
 * @return NULL, or a static description of why the response is refused
 */
const char *sb_http1_feed(sb_http1_reader_t *r, char *buf, size_t len, int eof, size_t *consumed, int *done);

#endif
