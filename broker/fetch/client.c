/*
 * The HTTP/1.1 client of http.fetch. The response is parsed with
 * picohttpparser, which libh2o-evloop exports but whose header Debian does not
 * ship, so the three prototypes are declared here. Content-Length is never
 * trusted for allocation: the body grows with the bytes that arrive and stops
 * at max_body.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/x509v3.h>
#include "fetch/client.h"
#include "util/util.h"

struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
struct phr_chunked_decoder {
    size_t bytes_left_in_chunk;
    char consume_trailer;
    char _hex_count;
    char _state;
};
int phr_parse_response(const char *buf, size_t len, int *minor_version, int *status, const char **msg, size_t *msg_len,
                       struct phr_header *headers, size_t *num_headers, size_t last_len);
ssize_t phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);

enum { F_HEAD = 0, F_LENGTH, F_CHUNKED, F_CLOSE, F_NONE };

struct st_sb_http_t {
    sb_http_opts_t o;
    sb_http_cb cb;
    void *arg;
    h2o_socket_t *sock;
    size_t next_addr;
    h2o_timeout_entry_t connect_timer;
    int state;
    size_t content_length, body_cap;
    struct phr_chunked_decoder chunked;
    char *head; /* copy of the response head, backing res.headers */
    sb_http_response_t res;
    const char *last_connect_error;
    int starting;       /* inside sb_http_start */
    int finished_early; /* every connect failed synchronously */
    const char *early_err;
};

static void try_connect(sb_http_t *h);

static void close_sock(sb_http_t *h)
{
    if (h2o_timeout_is_linked(&h->connect_timer))
        h2o_timeout_unlink(&h->connect_timer);
    if (h->sock != NULL) {
        h2o_socket_close(h->sock);
        h->sock = NULL;
    }
}

static void destroy(sb_http_t *h)
{
    close_sock(h);
    free(h->head);
    free(h->res.body);
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
    h->cb(h->arg, err, err == NULL ? &h->res : NULL);
    destroy(h);
}

static int append_body(sb_http_t *h, const char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (n > h->o.max_body - h->res.body_len)
        return -1;
    if (h->res.body_len + n > h->body_cap) {
        size_t cap = h->body_cap != 0 ? h->body_cap : 16384;
        uint8_t *nb;
        while (cap < h->res.body_len + n)
            cap *= 2;
        if (cap > h->o.max_body)
            cap = h->o.max_body;
        if ((nb = realloc(h->res.body, cap)) == NULL)
            return -1;
        h->res.body = nb;
        h->body_cap = cap;
    }
    memcpy(h->res.body + h->res.body_len, p, n);
    h->res.body_len += n;
    return 0;
}

static int parse_length(const char *v, size_t len, size_t *out)
{
    size_t n = 0;
    if (len == 0 || len > 15)
        return -1;
    for (size_t i = 0; i < len; ++i) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        n = n * 10 + (size_t)(v[i] - '0');
    }
    *out = n;
    return 0;
}

static int ieq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; ++i) {
        char c = a[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != b[i])
            return 0;
    }
    return 1;
}

/* returns NULL when more bytes are needed or the head was parsed, an error otherwise */
static const char *parse_head(sb_http_t *h, h2o_buffer_t *in, int *done)
{
    struct phr_header hdrs[SB_MAX_RESPONSE_HEADERS];
    size_t nh = SB_MAX_RESPONSE_HEADERS, cl = 0;
    int minor, status, have_cl = 0, chunked = 0, rlen;
    const char *msg;
    size_t msg_len;

    *done = 0;
    for (;;) {
        nh = SB_MAX_RESPONSE_HEADERS;
        rlen = phr_parse_response(in->bytes, in->size, &minor, &status, &msg, &msg_len, hdrs, &nh, 0);
        if (rlen == -2)
            return in->size > SB_MAX_RESPONSE_HEAD ? "response head exceeds 65536 bytes" : NULL;
        if (rlen < 0)
            return "malformed response head (or more than 100 headers)";
        /* the cap holds however TCP split the bytes: a head that arrived whole is measured too */
        if ((size_t)rlen > SB_MAX_RESPONSE_HEAD)
            return "response head exceeds 65536 bytes";
        if (status >= 100 && status < 200) {
            if (status == 101)
                return "upstream switched protocols";
            h2o_buffer_consume(&h->sock->input, (size_t)rlen); /* an interim response: skip it */
            in = h->sock->input;
            continue;
        }
        break;
    }
    /* copy the head: the socket buffer is consumed as the body arrives */
    if ((h->head = malloc((size_t)rlen)) == NULL)
        return "out of memory";
    memcpy(h->head, in->bytes, (size_t)rlen);
    h->res.status = status;
    h->res.reason = h->head + (msg - in->bytes);
    h->res.reason_len = msg_len;
    for (size_t i = 0; i < nh; ++i) {
        sb_http_header_t *o = &h->res.headers[h->res.nheaders++];
        char *name = h->head + (hdrs[i].name - in->bytes);
        for (size_t k = 0; k < hdrs[i].name_len; ++k)
            if (name[k] >= 'A' && name[k] <= 'Z')
                name[k] = (char)(name[k] - 'A' + 'a');
        o->name = name;
        o->name_len = hdrs[i].name_len;
        o->value = h->head + (hdrs[i].value - in->bytes);
        o->value_len = hdrs[i].value_len;
        if (ieq(name, hdrs[i].name_len, "content-length")) {
            size_t v;
            if (parse_length(hdrs[i].value, hdrs[i].value_len, &v) != 0 || (have_cl && v != cl))
                return "malformed or conflicting Content-Length";
            cl = v;
            have_cl = 1;
        } else if (ieq(name, hdrs[i].name_len, "transfer-encoding")) {
            if (!ieq(hdrs[i].value, hdrs[i].value_len, "chunked"))
                return "unsupported Transfer-Encoding";
            chunked = 1;
        }
    }
    h2o_buffer_consume(&h->sock->input, (size_t)rlen);
    if (h->o.head_request || status == 204 || status == 304) {
        h->state = F_NONE;
    } else if (chunked) {
        /* RFC 9112 section 6.3: Transfer-Encoding overrides Content-Length */
        h->state = F_CHUNKED;
        h->chunked.consume_trailer = 1;
    } else if (have_cl) {
        if (cl > h->o.max_body)
            return "response body exceeds the cap";
        h->state = F_LENGTH;
        h->content_length = cl;
    } else {
        h->state = F_CLOSE;
    }
    *done = 1;
    return NULL;
}

static void on_read(h2o_socket_t *sock, const char *err)
{
    sb_http_t *h = sock->data;
    const char *perr;

    if (h->state == F_HEAD) {
        int done;
        if ((perr = parse_head(h, sock->input, &done)) != NULL) {
            complete(h, perr);
            return;
        }
        if (!done) {
            if (err != NULL)
                complete(h, "connection closed before the response head");
            return;
        }
    }
    switch (h->state) {
    case F_NONE:
        complete(h, NULL);
        return;
    case F_LENGTH: {
        size_t take = sock->input->size;
        if (take > h->content_length - h->res.body_len)
            take = h->content_length - h->res.body_len;
        if (append_body(h, sock->input->bytes, take) != 0) {
            complete(h, "response body exceeds the cap");
            return;
        }
        h2o_buffer_consume(&sock->input, sock->input->size);
        if (h->res.body_len == h->content_length)
            complete(h, NULL);
        else if (err != NULL)
            complete(h, "connection closed before the response body completed");
        return;
    }
    case F_CHUNKED: {
        size_t n = sock->input->size;
        ssize_t r = phr_decode_chunked(&h->chunked, sock->input->bytes, &n);
        if (r == -1) {
            complete(h, "malformed chunked encoding");
            return;
        }
        if (append_body(h, sock->input->bytes, n) != 0) {
            complete(h, "response body exceeds the cap");
            return;
        }
        h2o_buffer_consume(&sock->input, sock->input->size);
        if (r >= 0)
            complete(h, NULL);
        else if (err != NULL)
            complete(h, "connection closed inside chunked body");
        return;
    }
    case F_CLOSE:
        if (append_body(h, sock->input->bytes, sock->input->size) != 0) {
            complete(h, "response body exceeds the cap");
            return;
        }
        h2o_buffer_consume(&sock->input, sock->input->size);
        if (err != NULL)
            complete(h, NULL); /* the body ends with the connection */
        return;
    default:
        complete(h, "internal state error");
    }
}

static void on_written(h2o_socket_t *sock, const char *err)
{
    sb_http_t *h = sock->data;
    if (err != NULL) {
        complete(h, "connection failed while sending the request");
        return;
    }
    h->state = F_HEAD;
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
        h->res.peer = *ip;
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
