/*
 * broker/fetch/client: one HTTP/1.1 exchange over a pinned connection, fresh or kept alive.
 *
 * The caller hands over validated IP addresses; the client connects to them
 * in order (the next one only when a connect fails) and never resolves a
 * name: there is no name to resolve, only sockaddrs. TLS uses the SNI name
 * given and verifies the certificate chain and the name in OpenSSL itself
 * (h2o 2.2.5 skips its own name check under TLS 1.3).
 *
 * Kept-alive connections (sb_http_pool_t, one per worker loop): a connection
 * whose request carried no body and whose response ended cleanly
 * (sb_http1_reusable) is parked under its key: the owner (one run's token),
 * the scheme, the host name (which was the SNI name and the name its
 * certificate was verified for, on a full handshake: no TLS session is ever
 * resumed) and the port. An exchange takes it only for the same key, only
 * when the connected address is among the addresses the caller has just
 * resolved and validated for this exchange, and only when nothing is waiting
 * to be read on it; anything else connects afresh. A parked connection is
 * closed when its peer sends anything (any TLS record) or closes, after the
 * idle timeout, when the pool is full (the oldest first) and with the pool.
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
    int reused;   /* the exchange ran on a parked connection */
} sb_http_response_t;

typedef struct st_sb_http_t sb_http_t;
typedef struct st_sb_http_pool_t sb_http_pool_t;

/** who may use a parked connection: everything must be equal */
typedef struct st_sb_http_key_t {
    uint8_t owner[32]; /* the run's token (its hash): connections never cross runs */
    int tls;
    uint16_t port;
    char host[SB_MAX_HOST + 1]; /* the URL's canonical host: the SNI name and the verified name */
} sb_http_key_t;

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
    sb_http_pool_t *pool;           /* NULL: a fresh connection, closed after the exchange */
    const sb_http_key_t *key;       /* with pool: the exchange's key (copied) */
    int may_reuse;                  /* with pool: may take a parked connection (idempotent methods only) */
    int may_park;                   /* with pool: may park the connection afterwards (a request without a body) */
    int wipe; /* the run holds secrets: every buffer that held response bytes is wiped before it is freed or parked */
} sb_http_opts_t;

/**
 * Starts the exchange.
 * @return the exchange, or NULL when it already failed (the callback has then run, before this returned)
 */
sb_http_t *sb_http_start(const sb_http_opts_t *opts, sb_http_cb cb, void *arg);
/** aborts the exchange (closing its connection); the callback will not run */
void sb_http_cancel(sb_http_t *h);

/**
 * Creates a pool of at most `max_idle` parked connections (0: the pool keeps
 * none), each closed after `idle_ms` unused. Lives on `loop`.
 */
sb_http_pool_t *sb_http_pool_create(h2o_loop_t *loop, size_t max_idle, uint64_t idle_ms);
/**
 * Closes every parked connection and frees the pool. No exchange started
 * with the pool may still be running (its owner, the worker's egress
 * context, is destroyed only once idle).
 */
void sb_http_pool_destroy(sb_http_pool_t *p);

/**
 * The TLS client context: peer verification on, TLS 1.2 or later, CAs from
 * `ca_file` or the system store, the certificate name checked against the SNI
 * name by OpenSSL (X509_check_host, no partial wildcards).
 * @return the context, or NULL with *err set
 */
SSL_CTX *sb_http_ssl_ctx_create(const char *ca_file, const char **err);

#endif
