/*
 * sandbox-shim: TLS to an https broker (OpenSSL 3).
 *
 * The token travels in every request header, so a connection is used only
 * once OpenSSL itself has verified the broker: the chain against the CA file
 * given with --ca-file (or the system store), and the URL's host against the
 * certificate (X509_VERIFY_PARAM host or IP checks inside the handshake, never
 * a hand-written match after it: h2o 2.2.5's post-handshake name check, for
 * one, is silently skipped under TLS 1.3). TLS 1.2 is the floor.
 * Socket I/O stays in relay.c: this module only sets objects up and words
 * their failures.
 */
#ifndef SB_SHIM_TLS_H
#define SB_SHIM_TLS_H

#include <stddef.h>
#include <openssl/ssl.h>
#include "sb/status.h"

/**
 * Creates the client context for one broker.
 * @param ca_file PEM file of trusted CAs, or NULL for the system store
 * @param err receives a message on failure
 * @return the context (owned by the caller, SSL_CTX_free), or NULL
 */
SSL_CTX *sb_shim_tls_ctx_new(const char *ca_file, char *err, size_t errsz);

/**
 * Creates the TLS side of one connection: `fd` attached (not owned), the
 * client state set, SNI set to `host` unless it is an IP literal (RFC 6066
 * section 3 forbids literal addresses in SNI), and the certificate check
 * bound to `host` (a DNS name, no partial wildcards) or to the IP literal.
 * @param host the broker URL's host, lower-cased, IPv6 without brackets
 * @param out receives the SSL (owned by the caller, SSL_free; does not close fd)
 * @return SB_OK or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_shim_tls_conn_new(SSL_CTX *ctx, int fd, const char *host, SSL **out);

/**
 * Words a failed TLS operation for the run error.
 * @param what the operation ("TLS handshake", "TLS read", "TLS write")
 * @param ssl_err SSL_get_error's answer
 * @param sys_errno errno right after the failed call
 * @param buf receives a NUL-terminated message; certificate problems read
 *        "TLS certificate verification failed: <reason>"
 */
void sb_shim_tls_describe(SSL *ssl, const char *what, int ssl_err, int sys_errno, char *buf, size_t bufsz);

#endif
