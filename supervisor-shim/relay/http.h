/*
 * sandbox-shim: the few pieces of HTTP/1.1 (RFC 9112) the relay needs.
 *
 * Requests are always `POST <path>` with a msgpack body and a
 * Content-Length. Responses must carry a Content-Length or end with the
 * connection; transfer codings are refused (the broker never uses them).
 * Socket handling lives in relay.c; this module only builds and parses bytes.
 */
#ifndef SB_SHIM_HTTP_H
#define SB_SHIM_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include "sb/status.h"
#include "sb/buf.h"
#include "relay/url.h"

/* the largest response head (status line and headers) we accept */
#define SB_SHIM_MAX_RESPONSE_HEAD 16384u

typedef struct st_sb_shim_http_head_t {
    int status;             /* 100..999 */
    size_t head_len;        /* bytes of the head including the blank line */
    int64_t content_length; /* -1 when absent (the body ends with the connection) */
    int must_close;         /* the connection cannot be reused after this response */
} sb_shim_http_head_t;

/**
 * Appends a whole request (head and body) to `out`.
 * @param token the 64-hex token (checked by the caller; never logged)
 * @return SB_OK, SB_E_TOO_LARGE or SB_E_NOMEM (as sb_buf_append)
 */
SB_WARN_UNUSED sb_status_t sb_shim_http_build_request(sb_buf_t *out, const sb_shim_url_t *u, const char *token, const uint8_t *body,
                                                      size_t body_len);

/** the same request for the module path's import.fetch, with its `x-sandbox-module-fetch: 1` header */
SB_WARN_UNUSED sb_status_t sb_shim_http_build_module_request(sb_buf_t *out, const sb_shim_url_t *u, const char *token,
                                                             const uint8_t *body, size_t body_len);

/**
 * Parses a response head from the start of `p`.
 * @param body_cap the largest body accepted; a larger Content-Length is SB_E_TOO_LARGE
 * @param why on failure, a static reason
 * @return SB_OK (head complete), SB_E_AGAIN (need more bytes), SB_E_BAD_ARGS (malformed or
 *         unsupported), SB_E_TOO_LARGE (head above SB_SHIM_MAX_RESPONSE_HEAD or body above body_cap)
 */
SB_WARN_UNUSED sb_status_t sb_shim_http_parse_head(const uint8_t *p, size_t len, size_t body_cap, sb_shim_http_head_t *h,
                                                   const char **why);

#endif
