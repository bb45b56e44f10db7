/*
 * broker/http/framing: refuses HTTP/1 requests whose body framing is ambiguous (RFC 9112 section 6.3).
 *
 * A request that two HTTP/1 parsers could split differently is how requests are smuggled past the
 * proxy in front of the broker. h2o 2.2.5 resolves such requests silently (the first of several
 * Content-Length fields wins, Transfer-Encoding wins over Content-Length, chunked is decoded on
 * HTTP/1.0, obs-fold lines are kept as a nameless field) and never shows the route the framing fields,
 * so every route handler calls sb_http_framing_refuse first: it reads the head h2o parsed, with h2o's
 * own parser, and answers 400 with the connection closed when the framing is not the one
 * unambiguous form.
 */
#ifndef SB_HTTP_FRAMING_H
#define SB_HTTP_FRAMING_H

#include <stddef.h>
#include <h2o.h>

/**
 * Decides the framing of the request head at the start of `buf` (what follows the head is ignored).
 * Accepted: no framing field; exactly one Content-Length field of 1*DIGIT; on HTTP/1.1, exactly one
 * Transfer-Encoding field whose value is "chunked" (any case) and no Content-Length. Refused: anything
 * else, among it several Content-Length fields even when equal or a list ("5, 5"), a sign, inner or
 * trailing whitespace, Transfer-Encoding with Content-Length, on HTTP/1.0, more than once or with another
 * coding, any obs-fold line (RFC 9112 section 5.2), and a head that does not parse.
 * @param buf  bytes that begin with a request head, as received
 * @param len  their length
 * @return NULL when the framing is unambiguous, else why not (a static string)
 */
const char *sb_http_framing_check(const char *buf, size_t len);

/**
 * The common head, decided without parsing it a second time: 1 when the head at the start of `buf` is
 * certainly one sb_http_framing_check accepts and its request line is exactly `method SP path SP
 * HTTP/1.0` or `HTTP/1.1`; 0 when that is not certain, and sb_http_framing_check decides. It reads lines
 * ending in CRLF only and looks at the framing fields only: a head that has any obs-fold line, a
 * Transfer-Encoding field, more than one Content-Length field, one whose value is not optional SP/HTAB
 * then 1*DIGIT, a bare LF, more fields than h2o reads or no end within H2O_MAX_REQLEN bytes gets 0. It
 * does not check the other fields' syntax: it is for heads h2o has parsed (the route's), whose bytes
 * picohttpparser accepted already.
 * @return 1 or 0, as above
 */
int sb_http_framing_plain(const char *buf, size_t len, const char *method, size_t method_len, const char *path, size_t path_len);

/**
 * The route handlers' first call. On an HTTP/1 request whose head sb_http_framing_check refuses, answers
 * 400 (text/plain), marks the connection to be closed after it, logs "http.framing_refused" and returns 1:
 * the handler returns 0 and does nothing else; a request pipelined behind it is never read. Otherwise
 * returns 0. Loop thread of the request's worker.
 */
int sb_http_framing_refuse(h2o_req_t *req);

#endif
