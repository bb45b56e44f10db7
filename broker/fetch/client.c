/*
 * The HTTP/1.1 client of http.fetch: connects to the validated addresses in
 * order (or takes a parked connection to one of them, see client.h), sends
 * the request and hands what arrives to the response reader (fetch/http1.c),
 * which parses the head with picohttpparser and collects the body, never
 * above max_body.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <openssl/x509v3.h>
#include "fetch/client.h"
#include "fetch/http1.h"
#include "sb/mem.h"
#include "util/util.h"

typedef struct st_parked_t {
    sb_http_pool_t *pool;
    h2o_linklist_t link; /* in pool->idle, oldest first */
    h2o_timeout_entry_t idle;
    h2o_socket_t *sock;
    sb_http_key_t key;
    sb_ip_t peer;
} parked_t;

struct st_sb_http_pool_t {
    h2o_loop_t *loop;
    size_t max_idle, nidle;
    h2o_linklist_t idle;
    h2o_timeout_t idle_timeout;
};

struct st_sb_http_t {
    sb_http_opts_t o;
    sb_http_key_t key;
    int reused;    /* the current connection came from the pool */
    int got_bytes; /* the current connection brought at least one response byte */
    int tls_ok;    /* the current connection's certificate was verified for key.host */
    int peer_done; /* the current connection ended (or failed) with the response */
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

/*
 * The response may echo a run's secret (PROTOCOL.md section 5): the read
 * buffer goes back to h2o, or into the pool with a parked connection, wiped
 */
static void wipe_input(sb_http_t *h)
{
    h2o_buffer_t *in = h->sock->input;

    if (h->o.wipe && in != NULL && in->bytes != NULL && in->_fd == -1)
        explicit_bzero(in->_buf, h->input_used < in->capacity ? h->input_used : in->capacity);
    h->input_used = 0;
}

static void close_sock(sb_http_t *h)
{
    if (h2o_timeout_is_linked(&h->connect_timer))
        h2o_timeout_unlink(&h->connect_timer);
    if (h->sock != NULL) {
        wipe_input(h);
        h2o_socket_close(h->sock);
        h->sock = NULL;
    }
}

static void destroy(sb_http_t *h)
{
    close_sock(h);
    sb_http1_dispose(&h->rd);
    sb_mem_free(h);
}

static void park(sb_http_t *h);

static void complete(sb_http_t *h, const char *err)
{
    if (h->starting) {
        /* reported by sb_http_start once it returns, never from inside it */
        h->finished_early = 1;
        h->early_err = err;
        return;
    }
    if (err == NULL && h->o.pool != NULL && sb_http1_reusable(&h->rd))
        park(h);
    close_sock(h);
    h->rd.res.reused = h->reused;
    h->cb(h->arg, err, err == NULL ? &h->rd.res : NULL);
    destroy(h);
}

/*
 * A parked connection that the peer closed (or wrote to) while it was idle
 * may still be taken by an exchange that races the close. For an idempotent
 * request (the only kind that takes parked connections) RFC 9112 section
 * 9.3.1 allows one automatic retry: on a fresh connection, to the validated
 * addresses in order, when the parked one brought no byte at all.
 */
static int retry_fresh(sb_http_t *h)
{
    if (!h->reused || h->got_bytes)
        return 0;
    close_sock(h);
    h->reused = 0;
    h->next_addr = 0;
    try_connect(h);
    return 1;
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

    if (sock->input->size != 0)
        h->got_bytes = 1;
    else if (err != NULL && retry_fresh(h))
        return;
    h->peer_done = err != NULL;
    perr = sb_http1_feed(&h->rd, sock->input->bytes, sock->input->size, err != NULL, &consumed, &done);
    if (perr != NULL) {
        complete(h, perr);
        return;
    }
    /* the reader keeps its own copies (wiped at dispose); h2o frees a wholly consumed buffer at once */
    if (h->o.wipe && consumed != 0)
        explicit_bzero(sock->input->bytes, consumed);
    h2o_buffer_consume(&sock->input, consumed);
    if (done)
        complete(h, NULL);
}

static void on_written(h2o_socket_t *sock, const char *err)
{
    sb_http_t *h = sock->data;
    if (err != NULL) {
        if (!retry_fresh(h))
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
    /*
     * A resumed session skips the certificate check (verify_cb does not run), and a session cached
     * under one name could be offered for another. The context caches none (sb_http_ssl_ctx_create):
     * should one ever be resumed all the same, the connection is refused, never trusted.
     */
    if (h2o_socket_get_ssl_session_reused(sock) != 0) {
        complete(h, "TLS: unexpected session resumption");
        return;
    }
    h->tls_ok = 1;
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
        h->tls_ok = 0;
        h->got_bytes = 0;
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

/* ---- the pool of parked connections ----------------------------------------------------------------------------- */

static int same_key(const sb_http_key_t *a, const sb_http_key_t *b)
{
    return memcmp(a->owner, b->owner, sizeof(a->owner)) == 0 && a->tls == b->tls && a->port == b->port &&
           strcmp(a->host, b->host) == 0;
}

static int same_ip(const sb_ip_t *a, const sb_ip_t *b)
{
    return a->family == b->family && memcmp(a->addr, b->addr, a->family == AF_INET ? 4 : 16) == 0;
}

static void unpark(parked_t *c)
{
    h2o_linklist_unlink(&c->link);
    if (h2o_timeout_is_linked(&c->idle))
        h2o_timeout_unlink(&c->idle);
    --c->pool->nidle;
}

static void drop_parked(parked_t *c)
{
    unpark(c);
    h2o_socket_close(c->sock);
    sb_mem_free(c);
}

/*
 * A parked connection is idle: anything from the peer ends it, a byte, the
 * end, an error, and under TLS any record at all. A record without
 * application data (a late session ticket, a key update) could as well be
 * the first part of a record h2o holds back until the rest arrives, which
 * the next exchange would then read as the start of its response.
 */
static void on_parked_read(h2o_socket_t *sock, const char *err)
{
    (void)err;
    drop_parked(sock->data);
}

static void on_parked_timeout(h2o_timeout_entry_t *entry)
{
    drop_parked(H2O_STRUCT_FROM_MEMBER(parked_t, idle, entry));
}

static void park(sb_http_t *h)
{
    sb_http_pool_t *p = h->o.pool;
    parked_t *c;

    /*
     * TLS connections only once their certificate was verified for the key's host (the SNI name), and
     * never after a request with a body (opts.may_park): an upstream that answered without reading all
     * of it would take the rest, bytes the guest chose, for the next request on the connection.
     */
    if (p->max_idle == 0 || !h->o.may_park || h->sock == NULL || h->peer_done || h->sock->input->size != 0 ||
        (h->key.tls && !h->tls_ok))
        return;
    if (p->nidle == p->max_idle)
        drop_parked(H2O_STRUCT_FROM_MEMBER(parked_t, link, p->idle.next));
    wipe_input(h);
    c = sb_mem_calloc(1, sizeof(*c));
    c->pool = p;
    c->sock = h->sock;
    c->key = h->key;
    c->peer = h->rd.res.peer;
    c->idle.cb = on_parked_timeout;
    h->sock = NULL;
    c->sock->data = c;
    h2o_linklist_insert(&p->idle, &c->link);
    h2o_timeout_link(p->loop, &p->idle_timeout, &c->idle);
    ++p->nidle;
    h2o_socket_read_start(c->sock, on_parked_read);
}

/*
 * 1 when nothing waits to be read on a parked connection: not in h2o's
 * buffer, not in the kernel's (bytes, or the end, that arrived after the
 * loop last looked). Whatever is there would be read as the start of the
 * next response: a connection with anything pending is not reused.
 */
static int parked_is_quiet(parked_t *c)
{
    char b;
    ssize_t n;

    if (c->sock->input->size != 0)
        return 0;
    do
        n = recv(h2o_socket_get_fd(c->sock), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* a parked connection with this exchange's key to one of the addresses just validated, in their order */
static int take_parked(sb_http_t *h)
{
    sb_http_pool_t *p = h->o.pool;

    for (size_t i = 0; i < h->o.naddrs; ++i) {
        for (h2o_linklist_t *l = p->idle.prev; l != &p->idle;) {
            parked_t *c = H2O_STRUCT_FROM_MEMBER(parked_t, link, l);
            l = l->prev;
            if (!same_key(&c->key, &h->key) || !same_ip(&c->peer, &h->o.addrs[i]))
                continue;
            if (!parked_is_quiet(c)) {
                drop_parked(c);
                continue;
            }
            unpark(c);
            h2o_socket_read_stop(c->sock);
            h->sock = c->sock;
            h->sock->data = h;
            h->rd.res.peer = c->peer;
            h->reused = 1;
            h->tls_ok = h->key.tls;
            h->got_bytes = 0;
            h->next_addr = 0;
            sb_mem_free(c);
            send_request(h);
            return 1;
        }
    }
    return 0;
}

sb_http_pool_t *sb_http_pool_create(h2o_loop_t *loop, size_t max_idle, uint64_t idle_ms)
{
    sb_http_pool_t *p = sb_mem_calloc(1, sizeof(*p));
    p->loop = loop;
    p->max_idle = max_idle;
    h2o_linklist_init_anchor(&p->idle);
    h2o_timeout_init(loop, &p->idle_timeout, idle_ms);
    return p;
}

void sb_http_pool_destroy(sb_http_pool_t *p)
{
    if (p == NULL)
        return;
    while (!h2o_linklist_is_empty(&p->idle))
        drop_parked(H2O_STRUCT_FROM_MEMBER(parked_t, link, p->idle.next));
    h2o_timeout_dispose(p->loop, &p->idle_timeout);
    sb_mem_free(p);
}

sb_http_t *sb_http_start(const sb_http_opts_t *opts, sb_http_cb cb, void *arg)
{
    sb_http_t *h = sb_mem_calloc(1, sizeof(*h));
    h->o = *opts;
    h->cb = cb;
    h->arg = arg;
    sb_http1_init(&h->rd, opts->head_request, opts->max_body);
    if (opts->wipe)
        sb_http1_set_wipe(&h->rd);
    h->connect_timer.cb = on_connect_timeout;
    if (opts->pool != NULL)
        h->key = *opts->key;
    h->starting = 1;
    if (!(opts->pool != NULL && opts->may_reuse && take_parked(h)))
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
    /* every connection verifies a full handshake: no session is kept to be resumed (on_handshake) */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    /* decrypted records (which may echo a secret's value) are zeroed once read, not left in OpenSSL's buffers */
    SSL_CTX_set_options(ctx, SSL_OP_CLEANSE_PLAINTEXT);
    if ((ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
        *err = ca_file != NULL ? "egress.ca_file: cannot load CA certificates" : "cannot load the system CA store";
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}
