/*
 * TLS set-up and error wording for https brokers (see tls.h).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include "relay/tls.h"

/* ALPN: the relay speaks HTTP/1.1 only (RFC 7301 section 3.1 wire format) */
static const unsigned char alpn_http11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

static void last_error(char *buf, size_t bufsz, const char *prefix)
{
    unsigned long e = ERR_peek_last_error();
    const char *reason = e != 0 ? ERR_reason_error_string(e) : NULL;

    snprintf(buf, bufsz, "%s%s", prefix, reason != NULL ? reason : "unknown error");
    ERR_clear_error();
}

SSL_CTX *sb_shim_tls_ctx_new(const char *ca_file, char *err, size_t errsz)
{
    SSL_CTX *ctx;

    ERR_clear_error();
    if ((ctx = SSL_CTX_new(TLS_client_method())) == NULL) {
        last_error(err, errsz, "cannot create the TLS context: ");
        return NULL;
    }
    /*
     * VERIFY_PEER with no callback: any chain or name problem aborts the
     * handshake inside OpenSSL, before a single request byte (and so the
     * token) is written.
     */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
        last_error(err, errsz, "cannot set the TLS version floor: ");
        goto Error;
    }
    /* no renegotiation (a TLS 1.2 peer could otherwise stall a write on a read); no compression (CRIME) */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    /* relay.c resumes a write after WANT_* with the same buffer and a possibly moved pointer */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_set_alpn_protos(ctx, alpn_http11, sizeof(alpn_http11)) != 0) {
        last_error(err, errsz, "cannot set ALPN: ");
        goto Error;
    }
    if (ca_file != NULL) {
        if (SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
            char why[200];
            last_error(why, sizeof(why), "");
            snprintf(err, errsz, "cannot load CA certificates from %s: %s", ca_file, why);
            goto Error;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        last_error(err, errsz, "cannot load the system CA store: ");
        goto Error;
    }
    return ctx;
Error:
    SSL_CTX_free(ctx);
    return NULL;
}

sb_status_t sb_shim_tls_conn_new(SSL_CTX *ctx, int fd, const char *host, SSL **out)
{
    struct in6_addr a6;
    struct in_addr a4;
    int is_ip = inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1;
    SSL *ssl;

    *out = NULL;
    ERR_clear_error();
    if ((ssl = SSL_new(ctx)) == NULL)
        goto Error;
    if (SSL_set_fd(ssl, fd) != 1)
        goto Error;
    SSL_set_connect_state(ssl);
    if (is_ip) {
        /* an IP-literal URL: the certificate must name that address (iPAddress SAN) */
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) != 1)
            goto Error;
    } else {
        SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (SSL_set1_host(ssl, host) != 1 || SSL_set_tlsext_host_name(ssl, host) != 1)
            goto Error;
    }
    *out = ssl;
    return SB_OK;
Error:
    ERR_clear_error();
    SSL_free(ssl);
    return SB_E_NOMEM;
}

void sb_shim_tls_describe(SSL *ssl, const char *what, int ssl_err, int sys_errno, char *buf, size_t bufsz)
{
    long v = SSL_get_verify_result(ssl);
    unsigned long e;

    if (v != X509_V_OK) {
        snprintf(buf, bufsz, "TLS certificate verification failed: %s", X509_verify_cert_error_string(v));
        ERR_clear_error();
        return;
    }
    switch (ssl_err) {
    case SSL_ERROR_ZERO_RETURN:
        snprintf(buf, bufsz, "%s: the broker closed the TLS connection", what);
        break;
    case SSL_ERROR_SYSCALL:
        if ((e = ERR_peek_last_error()) != 0)
            snprintf(buf, bufsz, "%s failed: %s", what, ERR_reason_error_string(e) != NULL ? ERR_reason_error_string(e) : "error");
        else if (sys_errno != 0)
            snprintf(buf, bufsz, "%s failed: %s", what, strerror(sys_errno));
        else
            snprintf(buf, bufsz, "%s failed: the broker closed the connection", what);
        break;
    default:
        e = ERR_peek_last_error();
        snprintf(buf, bufsz, "%s failed: %s", what,
                 e != 0 && ERR_reason_error_string(e) != NULL ? ERR_reason_error_string(e) : "protocol error");
        break;
    }
    ERR_clear_error();
}
