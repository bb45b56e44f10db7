/*
 * broker/fetch/client: one HTTP/1.1 exchange over a fresh, pinned connection.
 *
 * The caller hands over validated IP addresses; the client connects to them
 * in order (the next one only when a connect fails) and never resolves a
 * name: there is no name to resolve, only sockaddrs. TLS uses the SNI name
 * given and verifies the certificate chain and the name in OpenSSL itself
 * (h2o 2.2.5 skips its own name check under TLS 1.3). Connections are never
 * reused: a fresh connection per exchange, closed after it.
 */
#ifndef SB_FETCH_CLIENT_H
#define SB_FETCH_CLIENT_H

#include <h2o.h>
#include <openssl/ssl.h>
#include "sb/limits.h"
#include "fetch/ipclass.h"

#define SB_MAX_RESPONSE_HEAD 65536u

typedef struct st_sb_http_header_t {
    const char *name; /* lowercased; points into the response's head copy */
    size_t name_len;
    const char *value;
    size_t value_len;
} sb_http_header_t;

typedef struct st_sb_http_response_t {
    int status;
    const char *reason;
    size_t reason_len;
    sb_http_header_t headers[SB_MAX_RESPONSE_HEADERS];
    size_t nheaders;
    uint8_t *body; /* owned by the exchange */
    size_t body_len;
    sb_ip_t peer; /* the address actually connected to */
} sb_http_response_t;

typedef struct st_sb_http_t sb_http_t;

/** err is NULL on success (res valid until the callback returns), else a static description */
typedef void (*sb_http_cb)(void *arg, const char *err, sb_http_response_t *res);

typedef struct st_sb_http_opts_t {
    h2o_loop_t *loop;
    const sb_ip_t *addrs; /* validated addresses, tried in order */
    size_t naddrs;
    uint16_t port;
    SSL_CTX *ssl_ctx;    /* NULL for plain http */
    const char *sni;     /* TLS server name (the URL's host name) */
    const char *request; /* the whole request: head and body */
    size_t request_len;
    int head_request; /* a HEAD request: the response has no body */
    size_t max_body;
    h2o_timeout_t *connect_timeout; /* per connect attempt */
    int wipe;                       /* the run holds secrets: every buffer that held response bytes is wiped before it is freed */
} sb_http_opts_t;

/**
 * Starts the exchange.
 * @return the exchange, or NULL when it already failed (the callback has then run, before this returned)
 */
sb_http_t *sb_http_start(const sb_http_opts_t *opts, sb_http_cb cb, void *arg);
/** aborts the exchange (closing its connection); the callback will not run */
void sb_http_cancel(sb_http_t *h);

/**
 * The TLS client context: peer verification on, TLS 1.2 or later, CAs from
 * `ca_file` or the system store, the certificate name checked against the SNI
 * name by OpenSSL (X509_check_host, no partial wildcards).
 * @return the context, or NULL with *err set
 */
SSL_CTX *sb_http_ssl_ctx_create(const char *ca_file, const char **err);

#endif
