/*
 * The HTTP/1.1 client of http.fetch: connects to the validated addresses in
 * order, sends the request and hands what arrives to the response reader
 * (fetch/http1.c), which parses the head with picohttpparser and collects the
 * body, never above max_body.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/x509v3.h>
#include "fetch/client.h"
#include "fetch/http1.h"
#include "util/util.h"

struct st_sb_http_t {
    sb_http_opts_t o;
    sb_http_cb cb;
    void *arg;
    h2o_socket_t *sock;
    size_t next_addr;
    h2o_timeout_entry_t connect_timer;
    sb_http1_reader_t rd; /* the response reader, holding the response */
    const char *last_connect_error;
    int starting;       /* inside sb_http_start */
    int finished_early; /* every connect failed synchronously */
    const char *early_err;
    size_t input_used; /* o.wipe: how far into the read buffer response bytes have been written */
};

static void try_connect(sb_http_t *h);

static void close_sock(sb_http_t *h)
{
    if (h2o_timeout_is_linked(&h->connect_timer))
        h2o_timeout_unlink(&h->connect_timer);
    if (h->sock != NULL) {
        /* the response may echo a run's secret (PROTOCOL.md section 5): the read buffer goes back to h2o wiped */
        h2o_buffer_t *in = h->sock->input;
        if (h->o.wipe && in != NULL && in->bytes != NULL && in->_fd == -1)
            explicit_bzero(in->_buf, h->input_used < in->capacity ? h->input_used : in->capacity);
        h2o_socket_close(h->sock);
        h->sock = NULL;
    }
}

static void destroy(sb_http_t *h)
{
    close_sock(h);
    sb_http1_dispose(&h->rd);
    free(h);
}

static void complete(sb_http_t *h, const char *err)
{
    if (h->starting) {
        /* reported by sb_http_start once it returns, never from inside it */
        h->finished_early = 1;
        h->early_err = err;
        return;
    }
    close_sock(h);
    h->cb(h->arg, err, err == NULL ? &h->rd.res : NULL);
    destroy(h);
}

static void on_read(h2o_socket_t *sock, const char *err)
{
    sb_http_t *h = sock->data;
    size_t consumed;
    int done;
    const char *perr;

    if (h->o.wipe && sock->input->bytes != NULL) {
        size_t used = (size_t)(sock->input->bytes - sock->input->_buf) + sock->input->size;
        if (used > h->input_used)
            h->input_used = used;
    }
    perr = sb_http1_feed(&h->rd, sock->input->bytes, sock->input->size, err != NULL, &consumed, &done);

    if (perr != NULL) {
        complete(h, perr);
        return;
    }
    if (done) {
        complete(h, NULL);
        return;
    }
    /* the reader keeps its own copies (wiped at dispose); h2o may free a wholly consumed buffer at once */
    if (h->o.wipe && consumed != 0)
        explicit_bzero(sock->input->bytes, consumed);
    h2o_buffer_consume(&sock->input, consumed);
}

static void on_written(h2o_socket_t *sock, const char *err)
{
    sb_http_t *h = sock->data;
    if (err != NULL) {
        complete(h, "connection failed while sending the request");
        return;
    }
    h2o_socket_read_start(sock, on_read);
}

static void send_request(sb_http_t *h)
{
    h2o_iovec_t buf = h2o_iovec_init(h->o.request, h->o.request_len);
    h2o_socket_write(h->sock, &buf, 1, on_written);
}

/*
 * The verdict of the last certificate check on this thread. OpenSSL calls
 * verify_cb inside the handshake step that h2o runs from this thread's loop,
 * and h2o reports the failure right after with only "ssl handshake failure",
 * so the reason is kept here for the operator's log.
 */
static __thread long last_verify_error;

static void on_handshake(h2o_socket_t *sock, const char *err)
{
    sb_http_t *h = sock->data;
    long verr = last_verify_error;
    last_verify_error = 0;
    if (err != NULL) {
        /* a certificate problem is the same on every address of the name: no retry */
        if (err == h2o_socket_error_ssl_cert_name_mismatch || verr == X509_V_ERR_HOSTNAME_MISMATCH)
            complete(h, "TLS: certificate name mismatch");
        else if (err == h2o_socket_error_ssl_cert_invalid || err == h2o_socket_error_ssl_no_cert || verr != 0)
            complete(h, "TLS: certificate verification failed");
        else
            complete(h, "TLS handshake failed");
        return;
    }
    send_request(h);
}

static void on_connect(h2o_socket_t *sock, const char *err)
{
    sb_http_t *h = sock->data;
    if (h2o_timeout_is_linked(&h->connect_timer))
        h2o_timeout_unlink(&h->connect_timer);
    if (err != NULL) {
        h->last_connect_error = err;
        h2o_socket_close(h->sock);
        h->sock = NULL;
        try_connect(h);
        return;
    }
    if (h->o.ssl_ctx != NULL) {
        last_verify_error = 0;
        h2o_socket_ssl_handshake(sock, h->o.ssl_ctx, h->o.sni, on_handshake);
    } else
        send_request(h);
}

static void on_connect_timeout(h2o_timeout_entry_t *entry)
{
    sb_http_t *h = H2O_STRUCT_FROM_MEMBER(sb_http_t, connect_timer, entry);
    h->last_connect_error = "connect timed out";
    if (h->sock != NULL) {
        h2o_socket_close(h->sock);
        h->sock = NULL;
    }
    try_connect(h);
}

static void try_connect(sb_http_t *h)
{
    while (h->next_addr < h->o.naddrs) {
        struct sockaddr_storage ss;
        socklen_t len;
        const sb_ip_t *ip = &h->o.addrs[h->next_addr++];
        sb_ip_to_sockaddr(ip, h->o.port, &ss, &len);
        h->rd.res.peer = *ip;
        /* a sockaddr, never a name: nothing can be resolved at connect time */
        if ((h->sock = h2o_socket_connect(h->o.loop, (struct sockaddr *)&ss, len, on_connect)) == NULL) {
            h->last_connect_error = "connect failed";
            continue;
        }
        h->sock->data = h;
        h2o_timeout_link(h->o.loop, h->o.connect_timeout, &h->connect_timer);
        return;
    }
    complete(h, h->last_connect_error == h2o_socket_error_conn_fail || h->last_connect_error == NULL
                    ? "connect failed to every validated address"
                : h->last_connect_error == h2o_socket_error_closed ? "connection refused"
                                                                   : h->last_connect_error);
}

sb_http_t *sb_http_start(const sb_http_opts_t *opts, sb_http_cb cb, void *arg)
{
    sb_http_t *h = sb_mem_calloc(1, sizeof(*h));
    h->o = *opts;
    h->cb = cb;
    h->arg = arg;
    sb_http1_init(&h->rd, opts->head_request, opts->max_body);
    h->rd.wipe = opts->wipe;
    h->connect_timer.cb = on_connect_timeout;
    h->starting = 1;
    try_connect(h);
    h->starting = 0;
    if (h->finished_early) {
        cb(arg, h->early_err, NULL);
        destroy(h);
        return NULL;
    }
    return h;
}

void sb_http_cancel(sb_http_t *h)
{
    if (h != NULL)
        destroy(h);
}

static int verify_cb(int preverify_ok, X509_STORE_CTX *x)
{
    SSL *ssl;
    const char *name;

    if (!preverify_ok) {
        last_verify_error = X509_STORE_CTX_get_error(x);
        return 0;
    }
    if (X509_STORE_CTX_get_error_depth(x) != 0)
        return preverify_ok;
    ssl = X509_STORE_CTX_get_ex_data(x, SSL_get_ex_data_X509_STORE_CTX_idx());
    name = ssl != NULL ? SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name) : NULL;
    /* h2o 2.2.5 skips its own hostname check under TLS 1.3: check it here, always */
    if (name == NULL ||
        X509_check_host(X509_STORE_CTX_get_current_cert(x), name, 0, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS, NULL) != 1) {
        X509_STORE_CTX_set_error(x, X509_V_ERR_HOSTNAME_MISMATCH);
        last_verify_error = X509_V_ERR_HOSTNAME_MISMATCH;
        return 0;
    }
    return 1;
}

SSL_CTX *sb_http_ssl_ctx_create(const char *ca_file, const char **err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        *err = "SSL_CTX_new failed";
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, verify_cb);
    if ((ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
        *err = ca_file != NULL ? "egress.ca_file: cannot load CA certificates" : "cannot load the system CA store";
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}
