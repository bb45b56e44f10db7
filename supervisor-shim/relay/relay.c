/*
 * The relay loop (see relay.h and proto/PROTOCOL.md section 2).
 *
 * Invariants worth keeping in mind when changing this file:
 * - A call holds a slot from the moment its frame is accepted until its reply
 *   has been written to the guest in full. At most max_inflight slots exist,
 *   and the guest's stdout is not read while they are all taken, so the
 *   shim's memory is bounded by max_inflight replies plus one frame.
 * - A call holds a connection only while its HTTP exchange runs; there are as
 *   many connection slots as call slots, so a free one always exists.
 * - The first error of a run wins (run_fail); after it nothing more is read
 *   from the guest or sent to the broker, and the guest is killed.
 */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <msgpack.h>
#include <openssl/err.h>
#include "sb/mem.h"
#include "sb/frame.h"
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/value.h"
#include "sb/buf.h"
#include "relay/frames.h"
#include "relay/http.h"
#include "relay/modules.h"
#include "relay/relay.h"
#include "relay/relay_int.h"
#include "relay/tls.h"

#define GUEST_READ_CHUNK 65536u
#define STDERR_TAIL 800u

/* the response cap of a method string that may not parse (the broker then answers bad_method) */
static size_t response_cap(const char *method)
{
    sb_method_t m;

    if (sb_method_parse(method, strlen(method), &m) != SB_OK)
        return SB_MAX_NATIVE_RESPONSE;
    return sb_method_response_cap(&m);
}

/* ---- lifecycle ---- */

static void schedule_kill(relay_t *r, int64_t delay_ms)
{
    int64_t t = sb_shim_relay__now_ms() + delay_ms;
    if (r->kill_at == 0 || t < r->kill_at)
        r->kill_at = t;
}

static void conn_close(conn_t *c)
{
    if (c->ssl != NULL) {
        /* a polite close_notify on a healthy idle connection; never after a TLS error (SSL_shutdown(3)) */
        if (c->tls_clean && c->state == CONN_IDLE) {
            ERR_clear_error();
            (void)SSL_shutdown(c->ssl);
        }
        SSL_free(c->ssl);
        ERR_clear_error();
        c->ssl = NULL;
    }
    c->ssl_want = 0;
    c->tls_clean = 0;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->state = CONN_CLOSED;
    c->reused = 0;
    c->head_done = 0;
    c->out_off = 0;
    c->call = NULL;
    sb_buf_free(&c->out);
    sb_buf_free(&c->in);
}

void sb_shim_relay__call_free(relay_t *r, call_t *c)
{
    if (c->state == CALL_FREE)
        return;
    if (c->conn != NULL)
        conn_close(c->conn);
    c->conn = NULL;
    if (c->module != NULL)
        sb_shim_relay__mconn_close(c->module); /* the run ended while its module was fetched: Deno sees the connection close */
    c->module = NULL;
    msgpack_sbuffer_destroy(&c->reply);
    memset(&c->reply, 0, sizeof(c->reply));
    c->reply_off = 0;
    c->next_out = NULL;
    c->state = CALL_FREE;
    --r->active;
}

/* Latches the run's error (the first one wins) and stops the guest. */
static void run_fail(relay_t *r, int timed_out, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void run_fail(relay_t *r, int timed_out, const char *fmt, ...)
{
    va_list ap;

    if (!r->failed) {
        r->failed = 1;
        r->timed_out = timed_out;
        va_start(ap, fmt);
        vsnprintf(r->error, sizeof(r->error), fmt, ap);
        va_end(ap);
    }
    r->stop_reading = 1;
    for (unsigned i = 0; i < r->cfg->max_inflight; ++i)
        sb_shim_relay__call_free(r, &r->calls[i]);
    r->outq_head = r->outq_tail = NULL;
    if (!r->reaped && !r->sent_term) {
        r->sent_term = 1;
        sb_shim_child_signal(r->child, SIGTERM);
        schedule_kill(r, SB_SHIM_KILL_GRACE_MS);
    }
}

static void violation(relay_t *r, const char *why)
{
    run_fail(r, 0, "guest protocol violation: %s", why);
}

/*
 * The client that asked for the run went away. Nobody will read the outcome,
 * so nothing is worth waiting for: every broker exchange in flight is dropped
 * (run_fail closes their connections, so the broker sees exactly the calls
 * made so far) and the guest's group is killed at once, without the grace a
 * SIGTERM gets.
 */
static void run_cancel(relay_t *r)
{
    r->cancelled = 1;
    run_fail(r, 0, "sandbox request cancelled");
    if (!r->reaped) {
        sb_shim_child_signal(r->child, SIGKILL);
        r->kill_at = 0;
    }
}

/* ---- frames to the guest ---- */

static void frame_begin(msgpack_sbuffer *sb)
{
    msgpack_sbuffer_init(sb);
    (void)msgpack_sbuffer_write(sb, "\0\0\0\0", 4);
}

static int frame_end(msgpack_sbuffer *sb)
{
    if (sb->data == NULL || sb->size < 5 || sb->size - 4 > SB_MAX_FRAME)
        return -1;
    sb_frame_header((uint32_t)(sb->size - 4), (uint8_t *)sb->data);
    return 0;
}

static void queue_reply(relay_t *r, call_t *c)
{
    c->state = CALL_REPLYING;
    c->reply_off = 0;
    c->next_out = NULL;
    if (r->outq_tail != NULL)
        r->outq_tail->next_out = c;
    else
        r->outq_head = c;
    r->outq_tail = c;
}

static void reply_ok(relay_t *r, call_t *c, const msgpack_object *value)
{
    msgpack_packer pk;

    if (c->module != NULL) {
        sb_shim_relay__module_value(r, c, value);
        return;
    }
    frame_begin(&c->reply);
    msgpack_packer_init(&pk, &c->reply, msgpack_sbuffer_write);
    (void)msgpack_pack_map(&pk, 4);
    sb_shim_relay__pack_cstr(&pk, "t");
    sb_shim_relay__pack_cstr(&pk, "reply");
    sb_shim_relay__pack_cstr(&pk, "id");
    (void)msgpack_pack_uint64(&pk, c->id);
    sb_shim_relay__pack_cstr(&pk, "ok");
    (void)msgpack_pack_true(&pk);
    sb_shim_relay__pack_cstr(&pk, "value");
    sb_mp_pack_object(&pk, value);
    if (frame_end(&c->reply) != 0) {
        run_fail(r, 0, "cannot build the reply frame for call %llu", (unsigned long long)c->id);
        return;
    }
    queue_reply(r, c);
}

/*
 * The run's error for a failed call, as upstream's supervisor words it (PROTOCOL.md section 2, rule
 * 9): a fixed text per code, whatever the broker said; its transport failures keep their own two
 * texts. Hosts match on these strings; the broker's reason goes to the outcome's `detail`.
 */
static const char *upstream_message(const char *code, const char *message, int transport)
{
    static const struct {
        const char *code, *text;
    } T[] = {
        {"bad_method", "invalid sandbox binding method"},
        {"bad_args", "invalid sandbox binding arguments"},
        {"unauthorized", "sandbox binding authorization failed"},
        {"forbidden", "sandbox binding operation forbidden"},
        {"not_implemented", "sandbox binding operation unavailable"},
    };

    if (transport)
        return message;
    for (size_t i = 0; i < sizeof(T) / sizeof(T[0]); ++i)
        if (strcmp(code, T[i].code) == 0)
            return T[i].text;
    return "sandbox binding operation failed"; /* execution_error, and our own codes upstream maps to it */
}

/*
 * A call failed. `code` and `message` are what the guest sees under
 * --on-denial reply; `detail` is what the operator sees when the run ends.
 */
static void call_error(relay_t *r, call_t *c, const char *code, const char *message, const char *corr, const char *detail,
                       int transport)
{
    msgpack_packer pk;

    if (c->conn != NULL)
        conn_close(c->conn);
    c->conn = NULL;
    if (c->module != NULL) {
        sb_shim_relay__module_failed(r, c, code, detail);
        return;
    }
    if (!r->cfg->denial_reply) {
        if (!r->failed) {
            if (strcmp(code, "forbidden") == 0 || strcmp(code, "unauthorized") == 0)
                r->denied = 1; /* this failure is the run's error: the first one wins */
            snprintf(r->detail, sizeof(r->detail), "binding call %s failed: %s", c->method, detail);
        }
        run_fail(r, 0, "%s", upstream_message(code, message, transport));
        return;
    }
    frame_begin(&c->reply);
    msgpack_packer_init(&pk, &c->reply, msgpack_sbuffer_write);
    (void)msgpack_pack_map(&pk, 4);
    sb_shim_relay__pack_cstr(&pk, "t");
    sb_shim_relay__pack_cstr(&pk, "reply");
    sb_shim_relay__pack_cstr(&pk, "id");
    (void)msgpack_pack_uint64(&pk, c->id);
    sb_shim_relay__pack_cstr(&pk, "ok");
    (void)msgpack_pack_false(&pk);
    sb_shim_relay__pack_cstr(&pk, "error");
    (void)msgpack_pack_map(&pk, corr != NULL ? 3 : 2);
    sb_shim_relay__pack_cstr(&pk, "code");
    sb_shim_relay__pack_cstr(&pk, code);
    sb_shim_relay__pack_cstr(&pk, "message");
    sb_shim_relay__pack_cstr(&pk, message);
    if (corr != NULL) {
        sb_shim_relay__pack_cstr(&pk, "correlationId");
        sb_shim_relay__pack_cstr(&pk, corr);
    }
    if (frame_end(&c->reply) != 0) {
        run_fail(r, 0, "cannot build the reply frame for call %llu", (unsigned long long)c->id);
        return;
    }
    queue_reply(r, c);
}

static void call_transport_error(relay_t *r, call_t *c, const char *detail)
{
    char d[512];
    snprintf(d, sizeof(d), "sandbox broker request failed (%s)", detail);
    call_error(r, c, "execution_error", "sandbox broker request failed", NULL, d, 1);
}

static void call_invalid_response(relay_t *r, call_t *c, const char *detail)
{
    char d[512];
    snprintf(d, sizeof(d), "sandbox broker returned an invalid response (%s)", detail);
    call_error(r, c, "execution_error", "sandbox broker returned an invalid response", NULL, d, 1);
}

/* ---- broker responses ---- */

/* correlation ids are ^[\w-]{1,128}$ (PROTOCOL.md section 3) */
static int valid_corr(const msgpack_object *o)
{
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size > SB_MAX_CORRELATION_ID)
        return 0;
    for (uint32_t i = 0; i < o->via.str.size; ++i) {
        char ch = o->via.str.ptr[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

static char *dup_str(const msgpack_object *o, size_t max)
{
    size_t n = o->via.str.size < max ? o->via.str.size : max;
    char *s = sb_mem_try_alloc(n + 1);
    if (s == NULL)
        return NULL;
    if (n != 0)
        memcpy(s, o->via.str.ptr, n);
    s[n] = '\0';
    /* the guest and the operator see this text; embedded NULs would truncate it anyway */
    for (size_t i = 0; i < n; ++i)
        if (s[i] == '\0')
            s[i] = '?';
    return s;
}

static void on_response(relay_t *r, call_t *c, int status, const uint8_t *body, size_t len)
{
    msgpack_zone zone;
    msgpack_object o;
    const msgpack_object *ok, *value, *err, *code, *msg, *corr;
    const char *why = NULL;
    char d[512];

    if (status >= 300 && status <= 399) {
        /* the token must never follow a redirect to another origin (PROTOCOL.md section 2, rule 2) */
        snprintf(d, sizeof(d), "broker answered HTTP %d; redirects are never followed", status);
        call_transport_error(r, c, d);
        return;
    }
    msgpack_zone_init(&zone, 4096);
    if (len == 0 || sb_mp_decode(body, len, &zone, &o, &why) != SB_OK || o.type != MSGPACK_OBJECT_MAP) {
        snprintf(d, sizeof(d), "HTTP %d with a body that is not a msgpack map", status);
        call_invalid_response(r, c, d);
        goto Exit;
    }
    ok = sb_mp_get(&o, "ok");
    if (ok == NULL || ok->type != MSGPACK_OBJECT_BOOLEAN) {
        snprintf(d, sizeof(d), "HTTP %d without a boolean \"ok\"", status);
        call_invalid_response(r, c, d);
        goto Exit;
    }
    if (ok->via.boolean) {
        value = sb_mp_get(&o, "value");
        if (status < 200 || status > 299 || value == NULL || o.via.map.size != 2) {
            snprintf(d, sizeof(d), "HTTP %d success reply must be exactly {ok, value}", status);
            call_invalid_response(r, c, d);
            goto Exit;
        }
        reply_ok(r, c, value);
        goto Exit;
    }
    err = sb_mp_get(&o, "error");
    code = sb_mp_get(err, "code");
    msg = sb_mp_get(err, "message");
    corr = sb_mp_get(err, "correlationId");
    if (o.via.map.size != 2 || err == NULL || err->type != MSGPACK_OBJECT_MAP || code == NULL || code->type != MSGPACK_OBJECT_STR ||
        msg == NULL || msg->type != MSGPACK_OBJECT_STR || err->via.map.size != (corr != NULL ? 3u : 2u) ||
        (corr != NULL && !valid_corr(corr)) || status < 400) {
        snprintf(d, sizeof(d), "HTTP %d error reply must be {ok:false, error:{code, message, correlationId?}}", status);
        call_invalid_response(r, c, d);
        goto Exit;
    }
    {
        /* unknown codes become execution_error, as upstream's supervisor does */
        const char *wire = sb_status_code(sb_status_from_code(code->via.str.ptr, code->via.str.size));
        char *m = dup_str(msg, 1024), *cid = corr != NULL ? dup_str(corr, SB_MAX_CORRELATION_ID) : NULL;
        if (m == NULL || (corr != NULL && cid == NULL)) {
            sb_mem_free(m);
            sb_mem_free(cid);
            run_fail(r, 0, "out of memory");
            goto Exit;
        }
        snprintf(d, sizeof(d), "%s: %s%s%s", wire, m, cid != NULL ? " (correlationId " : "", cid != NULL ? ")" : "");
        if (cid != NULL) {
            size_t dl = strlen(d);
            if (dl > 0)
                snprintf(d + dl - 1, sizeof(d) - dl + 1, "%s)", cid);
        }
        call_error(r, c, wire, m, cid, d, 0);
        sb_mem_free(m);
        sb_mem_free(cid);
    }
Exit:
    msgpack_zone_destroy(&zone);
}

/* ---- connections ---- */

/* The connection failed before a response arrived. A kept-alive connection
 * that the broker closed while idle fails on first use; that request is sent
 * again, once, on a fresh connection (RFC 9112 section 9.3.1). */
static void conn_failed(relay_t *r, conn_t *cn, const char *what, int err)
{
    call_t *c = cn->call;
    char d[256];

    if (c == NULL) {
        conn_close(cn);
        return;
    }
    if (cn->reused && cn->in.len == 0 && !c->retried) {
        sb_buf_t req = cn->out;
        memset(&cn->out, 0, sizeof(cn->out));
        conn_close(cn);
        c->retried = 1;
        cn->out = req;
        sb_shim_relay__conn_start(r, cn, c);
        return;
    }
    if (err != 0)
        snprintf(d, sizeof(d), "%s: %s", what, strerror(err));
    else
        snprintf(d, sizeof(d), "%s", what);
    call_transport_error(r, c, d);
}

/* the connection's TLS failed; the message names the operation and OpenSSL's reason */
static void conn_tls_failed(relay_t *r, conn_t *cn, const char *what, int ssl_ret, int sys_errno)
{
    char d[200];

    sb_shim_tls_describe(cn->ssl, what, SSL_get_error(cn->ssl, ssl_ret), sys_errno, d, sizeof(d));
    cn->tls_clean = 0;
    conn_failed(r, cn, d, 0);
}

/* 1 if the SSL operation that returned `ret` only waits for the socket (and arms the wait) */
static int tls_would_block(conn_t *cn, int ret)
{
    switch (SSL_get_error(cn->ssl, ret)) {
    case SSL_ERROR_WANT_READ:
        cn->ssl_want = POLLIN;
        return 1;
    case SSL_ERROR_WANT_WRITE:
        cn->ssl_want = POLLOUT;
        return 1;
    default:
        return 0;
    }
}

static void conn_write(relay_t *r, conn_t *cn)
{
    cn->ssl_want = 0;
    while (cn->out_off < cn->out.len) {
        size_t left = cn->out.len - cn->out_off;
        ssize_t n;
        if (cn->ssl != NULL) {
            int k, e;
            ERR_clear_error();
            errno = 0;
            k = SSL_write(cn->ssl, cn->out.base + cn->out_off, left > INT_MAX ? INT_MAX : (int)left);
            e = errno;
            if (k <= 0) {
                if (!tls_would_block(cn, k))
                    conn_tls_failed(r, cn, "TLS write", k, e);
                return;
            }
            cn->out_off += (size_t)k;
            continue;
        }
        n = send(cn->fd, cn->out.base + cn->out_off, left, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            conn_failed(r, cn, "send", errno);
            return;
        }
        cn->out_off += (size_t)n;
    }
}

/*
 * The TLS handshake, driven by poll readiness. Nothing is written to the
 * broker until it has completed with a verified certificate: OpenSSL aborts
 * the handshake on a chain or name failure (SSL_VERIFY_PEER), and the checks
 * below fail closed should that ever not hold.
 */
static void conn_handshake(relay_t *r, conn_t *cn)
{
    int k, e;
    long v;

    cn->ssl_want = 0;
    ERR_clear_error();
    errno = 0;
    k = SSL_do_handshake(cn->ssl);
    e = errno;
    if (k != 1) {
        if (!tls_would_block(cn, k))
            conn_tls_failed(r, cn, "TLS handshake", k, e);
        return;
    }
    if ((v = SSL_get_verify_result(cn->ssl)) != X509_V_OK || SSL_get0_peer_certificate(cn->ssl) == NULL) {
        char d[160];
        snprintf(d, sizeof(d), "TLS certificate verification failed: %s",
                 v != X509_V_OK ? X509_verify_cert_error_string(v) : "no peer certificate");
        cn->tls_clean = 0;
        conn_failed(r, cn, d, 0);
        return;
    }
    cn->tls_clean = 1;
    cn->state = CONN_ACTIVE;
    conn_write(r, cn);
}

/* TCP is up: start TLS for an https broker, else send the request */
static void conn_connected(relay_t *r, conn_t *cn)
{
    if (r->cfg->tls == NULL) {
        cn->state = CONN_ACTIVE;
        conn_write(r, cn);
        return;
    }
    if (sb_shim_tls_conn_new(r->cfg->tls, cn->fd, r->cfg->url.host, &cn->ssl) != SB_OK) {
        conn_failed(r, cn, "cannot set up TLS (out of memory)", 0);
        return;
    }
    cn->state = CONN_HANDSHAKE;
    conn_handshake(r, cn);
}

/* opens a connection for `c` (cn->out already holds the request) */
void sb_shim_relay__conn_start(relay_t *r, conn_t *cn, call_t *c)
{
    int one = 1;

    cn->call = c;
    c->conn = cn;
    cn->out_off = 0;
    if (cn->state == CONN_IDLE) {
        cn->state = CONN_ACTIVE;
        conn_write(r, cn);
        return;
    }
    cn->fd = socket(r->cfg->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (cn->fd < 0) {
        conn_failed(r, cn, "socket", errno);
        return;
    }
    (void)setsockopt(cn->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(cn->fd, (const struct sockaddr *)&r->cfg->addr, r->cfg->addr_len) == 0) {
        conn_connected(r, cn);
    } else if (errno == EINPROGRESS) {
        cn->state = CONN_CONNECTING;
    } else {
        conn_failed(r, cn, "connect", errno);
    }
}

/*
 * Reads response bytes, over TLS or not.
 * @return the byte count, 0 at a clean end of stream (TCP FIN, or TLS
 *         close_notify: an EOF without it is a truncation and an error), -1
 *         when the read would block, -2 when the connection failed (handled)
 */
static ssize_t conn_recv(relay_t *r, conn_t *cn, uint8_t *buf, size_t len)
{
    for (;;) {
        ssize_t n;
        if (cn->ssl != NULL) {
            int k, e;
            cn->ssl_want = 0;
            ERR_clear_error();
            errno = 0;
            k = SSL_read(cn->ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
            e = errno;
            if (k > 0)
                return k;
            if (SSL_get_error(cn->ssl, k) == SSL_ERROR_ZERO_RETURN)
                return 0;
            if (tls_would_block(cn, k))
                return -1;
            conn_tls_failed(r, cn, "TLS read", k, e);
            return -2;
        }
        n = recv(cn->fd, buf, len, 0);
        if (n >= 0)
            return n;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return -1;
        conn_failed(r, cn, "recv", errno);
        return -2;
    }
}

/*
 * An idle kept-alive connection became readable. Plain HTTP: it has nothing
 * to say, so EOF or stray bytes retire it. TLS: the broker may still send
 * handshake records (TLS 1.3 session tickets, key updates); those are
 * consumed and the connection stays, anything else retires it.
 */
static void conn_idle_readable(conn_t *cn)
{
    uint8_t b;
    int k, e;

    if (cn->ssl != NULL) {
        cn->ssl_want = 0; /* idle connections always wait for POLLIN */
        ERR_clear_error();
        k = SSL_read(cn->ssl, &b, 1);
        e = k > 0 ? SSL_ERROR_NONE : SSL_get_error(cn->ssl, k);
        if (e == SSL_ERROR_WANT_READ)
            return;
        /* answer the broker's close_notify; after stray data or an error, just drop it */
        cn->tls_clean = e == SSL_ERROR_ZERO_RETURN;
    }
    conn_close(cn);
}

static void conn_readable(relay_t *r, conn_t *cn)
{
    uint8_t tmp[65536];
    call_t *c = cn->call;
    const char *why = NULL;
    sb_status_t st;

    if (cn->state == CONN_IDLE) {
        conn_idle_readable(cn);
        return;
    }
    if (c == NULL) {
        conn_close(cn);
        return;
    }
    for (;;) {
        ssize_t n = conn_recv(r, cn, tmp, sizeof(tmp));
        if (n < 0)
            return;
        if (n == 0) {
            if (cn->head_done && cn->head.content_length < 0) {
                /* close-delimited body (RFC 9112 section 6.3, rule 8) */
                cn->head.content_length = (int64_t)(cn->in.len - cn->head.head_len);
                break;
            }
            conn_failed(r, cn, "broker closed the connection before the response was complete", 0);
            return;
        }
        if ((st = sb_buf_append(&cn->in, tmp, (size_t)n)) != SB_OK) {
            call_invalid_response(r, c, st == SB_E_TOO_LARGE ? "response above the method's cap" : "out of memory");
            return;
        }
        if (!cn->head_done) {
            st = sb_shim_http_parse_head((const uint8_t *)cn->in.base, cn->in.len, response_cap(c->method), &cn->head, &why);
            if (st == SB_E_AGAIN)
                continue;
            if (st != SB_OK) {
                call_invalid_response(r, c, why);
                return;
            }
            if (cn->head.status < 200) {
                call_invalid_response(r, c, "unexpected informational response");
                return;
            }
            cn->head_done = 1;
        }
        if (cn->head.content_length >= 0 && cn->in.len - cn->head.head_len >= (uint64_t)cn->head.content_length)
            break;
    }
    if (cn->in.len - cn->head.head_len > (uint64_t)cn->head.content_length) {
        call_invalid_response(r, c, "bytes after the response body");
        return;
    }
    {
        /* detach the exchange from the connection, keep the connection if allowed */
        sb_buf_t in = cn->in;
        sb_shim_http_head_t head = cn->head;
        memset(&cn->in, 0, sizeof(cn->in));
        c->conn = NULL;
        if (head.must_close) {
            conn_close(cn);
        } else {
            sb_buf_free(&cn->out);
            cn->ssl_want = 0;
            cn->state = CONN_IDLE;
            cn->reused = 1;
            cn->call = NULL;
            cn->head_done = 0;
        }
        on_response(r, c, head.status, (const uint8_t *)in.base + head.head_len, (size_t)head.content_length);
        sb_buf_free(&in);
    }
}

static void conn_event(relay_t *r, conn_t *cn, short revents)
{
    if (cn->state == CONN_CONNECTING) {
        int e = 0;
        socklen_t el = sizeof(e);
        if (getsockopt(cn->fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
            e = errno;
        if (e != 0) {
            conn_failed(r, cn, "connect", e);
            return;
        }
        conn_connected(r, cn);
        return;
    }
    /* only the one event the state waits for was asked for, so any event means "try it" */
    (void)revents;
    if (cn->state == CONN_HANDSHAKE)
        conn_handshake(r, cn);
    else if (cn->state == CONN_ACTIVE && cn->out_off < cn->out.len)
        conn_write(r, cn);
    else
        conn_readable(r, cn);
}

/* ---- frames from the guest (decoded and validated by frames.c) ---- */

/* the guest's calls still holding a slot (the module path's fetches hold slots too: a result may outrun those) */
static unsigned guest_calls(const relay_t *r)
{
    unsigned n = 0;
    for (unsigned i = 0; i < r->cfg->max_inflight; ++i)
        n += r->calls[i].state != CALL_FREE && r->calls[i].module == NULL;
    return n;
}

int sb_shim_relay__free_slot(relay_t *r, call_t **c, conn_t **cn)
{
    *c = NULL;
    *cn = NULL;
    for (unsigned i = 0; i < r->cfg->max_inflight && *c == NULL; ++i)
        if (r->calls[i].state == CALL_FREE)
            *c = &r->calls[i];
    /* prefer a kept-alive connection */
    for (unsigned i = 0; i < r->cfg->max_inflight && *cn == NULL; ++i)
        if (r->conns[i].state == CONN_IDLE)
            *cn = &r->conns[i];
    for (unsigned i = 0; i < r->cfg->max_inflight && *cn == NULL; ++i)
        if (r->conns[i].state == CONN_CLOSED)
            *cn = &r->conns[i];
    return *c != NULL && *cn != NULL;
}

static void on_call(relay_t *r, const sb_shim_msg_t *m)
{
    call_t *c = NULL;
    conn_t *cn = NULL;
    msgpack_sbuffer body;
    sb_status_t st;

    for (unsigned i = 0; i < r->cfg->max_inflight; ++i) {
        if (r->calls[i].state != CALL_FREE && r->calls[i].id == m->id) {
            violation(r, "duplicate in-flight call id");
            return;
        }
    }
    if (r->cfg->calls_refused != NULL) {
        run_fail(r, 0, "%s", r->cfg->calls_refused);
        return;
    }
    if (r->ncalls >= r->cfg->max_calls) {
        if (r->cfg->upstream_call_limit) {
            /* upstream's supervisor counts the calls as output: its text, ours in the detail */
            if (!r->failed)
                snprintf(r->detail, sizeof(r->detail), "binding call limit exceeded (%u calls)", r->cfg->max_calls);
            run_fail(r, 0, "sandbox output limit exceeded");
        } else {
            run_fail(r, 0, "binding call limit exceeded (--max-calls %u)", r->cfg->max_calls);
        }
        return;
    }
    if (!sb_shim_relay__free_slot(r, &c, &cn)) {
        /* unreachable: the reader stops at max_inflight; fail closed all the same */
        run_fail(r, 0, "internal error: no free call slot");
        return;
    }
    memset(c, 0, sizeof(*c));
    c->state = CALL_HTTP;
    ++r->active;
    ++r->ncalls;
    c->id = m->id;
    memcpy(c->method, m->method, m->method_len);
    c->method[m->method_len] = '\0';
    c->deadline = sb_shim_relay__now_ms() + r->cfg->call_timeout_ms;

    /* body: {method, args?} (PROTOCOL.md section 3) */
    msgpack_sbuffer_init(&body);
    st = sb_shim_call_body(m, &body);
    /* the request carries the run's token: the buffer zeroes what it held on growth and on release */
    sb_buf_init_secret(&cn->out, SB_MAX_RPC_WIRE + 4096);
    sb_buf_init(&cn->in, SB_SHIM_MAX_RESPONSE_HEAD + response_cap(c->method));
    if (st != SB_OK) {
        msgpack_sbuffer_destroy(&body);
        run_fail(r, 0, "out of memory");
        return;
    }
    st = sb_shim_http_build_request(&cn->out, &r->cfg->url, r->cfg->token, (const uint8_t *)body.data, body.size);
    msgpack_sbuffer_destroy(&body);
    if (st != SB_OK) {
        sb_buf_free(&cn->out);
        run_fail(r, 0, "cannot build the broker request: %s", st == SB_E_TOO_LARGE ? "too large" : "out of memory");
        return;
    }
    sb_shim_relay__conn_start(r, cn, c);
}

/* a validated result frame: the message's JSON values move into the run */
static void on_result(relay_t *r, sb_shim_msg_t *m)
{
    r->output = m->output;
    r->logs = m->logs;
    r->result_error = m->error;
    m->output = m->logs = m->error = NULL;
    r->have_result = 1;
    r->result_ok = m->ok;
    /* the guest is done: close its stdin, let it exit, and kill what lingers */
    if (r->child->in_fd >= 0) {
        close(r->child->in_fd);
        r->child->in_fd = -1;
    }
    schedule_kill(r, SB_SHIM_EXIT_GRACE_MS);
}

/*
 * One decoded frame (or the reason it was refused). The run's state rules
 * come first, as they name the real problem: a call or a second result after
 * the result, a result while calls are in flight.
 */
static void on_message(relay_t *r, sb_shim_msg_t *m, sb_status_t st, const char *why, const char *detail)
{
    char d[160];

    if (m->kind == SB_SHIM_MSG_CALL && r->have_result) {
        violation(r, "call after result");
        return;
    }
    if (m->kind == SB_SHIM_MSG_RESULT) {
        if (r->have_result) {
            violation(r, "second result frame");
            return;
        }
        if (guest_calls(r) != 0) {
            run_fail(r, 0, "sandbox result raced binding calls");
            return;
        }
        if (st != SB_OK) {
            run_fail(r, 0, "sandbox guest returned an invalid result: %s", why);
            return;
        }
        on_result(r, m);
        return;
    }
    if (st != SB_OK) {
        if (detail != NULL) {
            snprintf(d, sizeof(d), "%s (%s)", why, detail);
            violation(r, d);
        } else {
            violation(r, why);
        }
        return;
    }
    on_call(r, m);
}

/* feeds buffered guest bytes to the frame reader, honouring backpressure */
static void process_guest_bytes(relay_t *r)
{
    while (r->roff < r->rlen && !r->stop_reading && r->active < r->cfg->max_inflight) {
        size_t used = 0;
        sb_shim_msg_t m;
        const char *why = NULL, *detail = NULL;
        sb_status_t st = sb_shim_frames_next(&r->reader, r->rbuf + r->roff, r->rlen - r->roff, &used, &m, &why, &detail);
        r->roff += used;
        if (st != SB_E_AGAIN)
            on_message(r, &m, st, why != NULL ? why : "invalid frame", detail);
        sb_shim_msg_dispose(&m);
    }
    if (r->roff == r->rlen)
        r->roff = r->rlen = 0;
}

static void guest_readable(relay_t *r)
{
    ssize_t n;

    if (r->rlen != 0)
        return;
    do
        n = read(r->child->out_fd, r->rbuf, GUEST_READ_CHUNK);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return;
        n = 0;
    }
    if (n == 0) {
        r->out_eof = 1;
        /* a guest that closed stdout can no longer report a result; it gets a moment to exit */
        if (!r->have_result)
            schedule_kill(r, SB_SHIM_KILL_GRACE_MS);
        if (r->reader.hdr_have != 0 && !r->reader.ready && !r->failed)
            violation(r, "stdout closed in the middle of a frame");
        return;
    }
    r->roff = 0;
    r->rlen = (size_t)n;
    process_guest_bytes(r);
}

static void guest_writable(relay_t *r)
{
    for (;;) {
        const uint8_t *p;
        size_t left;
        ssize_t n;
        if (r->init_off < r->init_len) {
            p = r->init + r->init_off;
            left = r->init_len - r->init_off;
        } else if (r->outq_head != NULL) {
            p = (const uint8_t *)r->outq_head->reply.data + r->outq_head->reply_off;
            left = r->outq_head->reply.size - r->outq_head->reply_off;
        } else {
            return;
        }
        n = write(r->child->in_fd, p, left);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* the guest closed its stdin: it can no longer receive replies */
            close(r->child->in_fd);
            r->child->in_fd = -1;
            while (r->outq_head != NULL) {
                call_t *c = r->outq_head;
                r->outq_head = c->next_out;
                sb_shim_relay__call_free(r, c);
            }
            r->outq_tail = NULL;
            return;
        }
        if (r->init_off < r->init_len) {
            r->init_off += (size_t)n;
        } else {
            call_t *c = r->outq_head;
            c->reply_off += (size_t)n;
            if (c->reply_off == c->reply.size) {
                r->outq_head = c->next_out;
                if (r->outq_head == NULL)
                    r->outq_tail = NULL;
                sb_shim_relay__call_free(r, c);
                /* a slot opened: frames held back by backpressure may proceed */
                process_guest_bytes(r);
            }
        }
    }
}

static void stderr_readable(relay_t *r)
{
    uint8_t tmp[16384];

    for (;;) {
        ssize_t n = read(r->child->err_fd, tmp, sizeof(tmp));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            r->err_eof = 1;
            close(r->child->err_fd);
            r->child->err_fd = -1;
            return;
        }
        /* past the cap the bytes are read and dropped, so the guest never blocks on stderr */
        size_t room = sb_buf_room(&r->err);
        if ((size_t)n > room && r->cfg->stderr_cap_fails) {
            run_fail(r, 0, "sandbox output limit exceeded");
            room = 0;
        }
        if (room != 0 && sb_buf_append(&r->err, tmp, (size_t)n < room ? (size_t)n : room) != SB_OK)
            sb_buf_set_cap(&r->err, r->err.len); /* out of memory: keep what we have */
    }
}

static void reap(relay_t *r)
{
    siginfo_t si;
    pid_t p;
    int w;

    if (r->reaped)
        return;
    memset(&si, 0, sizeof(si));
    do
        w = waitid(P_PID, (id_t)r->child->pid, &si, WEXITED | WNOHANG | WNOWAIT);
    while (w < 0 && errno == EINTR);
    if (w == 0 && si.si_pid == 0)
        return; /* still running */
    /*
     * Anything the guest left behind in its group goes too, killed while the guest is a zombie
     * not reaped yet: until it is reaped its pid, and so its group id, cannot name another
     * process group. (A jailed guest was pid 1 of its namespace: the kernel has already killed
     * the rest, and the group is empty.)
     */
    if (w == 0)
        sb_shim_child_signal(r->child, SIGKILL);
    do
        p = waitpid(r->child->pid, &r->wstatus, 0);
    while (p < 0 && errno == EINTR);
    if (p == r->child->pid || (p < 0 && errno == ECHILD)) {
        r->reaped = 1;
        r->drain_until = sb_shim_relay__now_ms() + 100;
    }
}

/* ---- outcome ---- */

/* the last STDERR_TAIL bytes of stderr as valid UTF-8 (invalid bytes become '?') */
static void stderr_tail(relay_t *r, char *out, size_t outsz)
{
    const uint8_t *e = (const uint8_t *)r->err.base;
    size_t start = r->err.len > STDERR_TAIL ? r->err.len - STDERR_TAIL : 0, o = 0;

    while (start < r->err.len && (e[start] & 0xC0) == 0x80)
        ++start;
    for (size_t i = start; i < r->err.len && o + 5 < outsz;) {
        size_t n = 1;
        uint8_t b = e[i];
        if (b >= 0xF0)
            n = 4;
        else if (b >= 0xE0)
            n = 3;
        else if (b >= 0xC0)
            n = 2;
        if (i + n <= r->err.len && sb_utf8_valid(e + i, n) && b != 0) {
            memcpy(out + o, e + i, n);
            o += n;
            i += n;
        } else {
            out[o++] = '?';
            i += 1;
        }
    }
    while (o > 0 && (out[o - 1] == '\n' || out[o - 1] == '\r' || out[o - 1] == ' '))
        --o;
    out[o] = '\0';
}

static json_t *build_outcome(relay_t *r)
{
    json_t *o = json_object();
    int ok = !r->failed && r->have_result && r->result_ok;

    if (o == NULL)
        return NULL;
    json_object_set_new(o, "ok", json_boolean(ok));
    if (!r->failed && r->have_result) {
        if (r->result_ok && r->output != NULL)
            json_object_set(o, "output", r->output);
        if (!r->result_ok && r->result_error != NULL)
            json_object_set(o, "error", r->result_error);
    } else {
        json_t *e = json_stringn(r->error, strlen(r->error));
        json_object_set_new(o, "error", e != NULL ? e : json_string("run failed"));
    }
    json_object_set_new(o, "logs", r->logs != NULL ? json_incref(r->logs) : json_array());
    if (r->timed_out)
        json_object_set_new(o, "timedOut", json_true());
    json_object_set_new(o, "ms", json_integer(sb_shim_relay__now_ms() - r->start));
    json_object_set_new(o, "calls", json_integer(r->ncalls));
    if (r->cfg->imports != NULL)
        json_object_set_new(o, "modules", json_integer(r->modules)); /* import.fetch calls (module_server.c) */
    if (r->cfg->mark_denial && r->denied && r->failed)
        json_object_set_new(o, "denied", json_true());
    if (r->failed && r->detail[0] != '\0')
        json_object_set_new(o, "detail", json_string(r->detail));
    else if (!r->failed && r->have_result && !r->result_ok && r->module_detail[0] != '\0')
        json_object_set_new(o, "detail", json_string(r->module_detail)); /* the guest failed: perhaps for that module */
    return o;
}

static void on_exit_without_result(relay_t *r)
{
    char tail[STDERR_TAIL * 4 + 8], how[64];

    if (r->failed || r->have_result)
        return;
    stderr_tail(r, tail, sizeof(tail));
    if (WIFEXITED(r->wstatus))
        snprintf(how, sizeof(how), "exit code %d", WEXITSTATUS(r->wstatus));
    else if (WIFSIGNALED(r->wstatus))
        snprintf(how, sizeof(how), "signal %d", WTERMSIG(r->wstatus));
    else
        snprintf(how, sizeof(how), "unknown status");
    if (tail[0] != '\0')
        run_fail(r, 0, "subprocess exited without result (%s): %s", how, tail);
    else
        run_fail(r, 0, "subprocess exited without result (%s)", how);
}

/* ---- the loop ---- */

enum { PFD_OUT, PFD_ERR, PFD_IN, PFD_PID, PFD_CANCEL, PFD_STOP, PFD_FIXED };

sb_status_t sb_shim_relay_run(const sb_shim_config_t *cfg, sb_shim_child_t *child, const uint8_t *init, size_t init_len,
                              json_t **out)
{
    relay_t r;
    struct pollfd *pfds = NULL;
    conn_t **pconn = NULL;
    sb_status_t st = SB_E_NOMEM;
    unsigned n = cfg->max_inflight, nlisten = cfg->imports != NULL && child->nlisten == cfg->imports->n ? child->nlisten : 0;
    size_t npfds = PFD_FIXED + n + SB_SHIM_MAX_LISTEN + MODULE_CONNS;

    memset(&r, 0, sizeof(r));
    r.cfg = cfg;
    r.child = child;
    r.init = init;
    r.init_len = init_len;
    r.start = sb_shim_relay__now_ms();
    r.deadline = r.start + cfg->timeout_ms;
    sb_frame_reader_init(&r.reader, SB_MAX_FRAME);
    sb_buf_init(&r.err, SB_SHIM_MAX_STDERR);
    /* the descriptors of each array are -1 before anything can fail: the clean-up closes only real ones */
    if ((r.conns = sb_mem_try_calloc(n, sizeof(*r.conns))) != NULL)
        for (unsigned i = 0; i < n; ++i)
            r.conns[i].fd = -1;
    if ((r.mconns = sb_mem_try_calloc(MODULE_CONNS, sizeof(*r.mconns))) != NULL)
        for (unsigned i = 0; i < MODULE_CONNS; ++i)
            r.mconns[i].fd = -1;
    if (r.conns == NULL || r.mconns == NULL || (r.rbuf = sb_mem_try_alloc(GUEST_READ_CHUNK)) == NULL ||
        (r.calls = sb_mem_try_calloc(n, sizeof(*r.calls))) == NULL || (pfds = sb_mem_try_calloc(npfds, sizeof(*pfds))) == NULL ||
        (pconn = sb_mem_try_calloc(n, sizeof(*pconn))) == NULL)
        goto Exit;

    for (;;) {
        int64_t now = sb_shim_relay__now_ms(), wake;
        unsigned np = PFD_FIXED, nc = 0, first_listen, first_module, free_mconns = 0;
        int timeout;

        /* timers */
        if (!r.reaped && now >= r.deadline && !r.have_result)
            run_fail(&r, 1, "wall-time exceeded (%lldms)", (long long)cfg->timeout_ms);
        for (unsigned i = 0; i < n; ++i) {
            call_t *c = &r.calls[i];
            if (c->state == CALL_HTTP && now >= c->deadline) {
                char d[96];
                snprintf(d, sizeof(d), "timed out after %lldms", (long long)cfg->call_timeout_ms);
                call_transport_error(&r, c, d);
            }
        }
        for (unsigned i = 0; i < MODULE_CONNS; ++i) {
            mconn_t *mc = &r.mconns[i];
            if ((mc->state == MC_READING || mc->state == MC_WRITING) && now >= mc->deadline)
                sb_shim_relay__mconn_close(mc);
        }
        sb_shim_relay__module_pump(&r);
        if (!r.reaped && r.kill_at != 0 && now >= r.kill_at) {
            sb_shim_child_signal(child, SIGKILL);
            r.kill_at = 0;
        }
        if (child->pidfd < 0 || r.out_eof)
            reap(&r);
        if (r.reaped) {
            if (r.out_eof || r.stop_reading || now >= r.drain_until)
                break;
        }

        /* once the run has an outcome, the wall clock no longer matters (kill_at and drain_until do) */
        wake = r.failed || r.have_result ? now + 60000 : r.deadline;

        /* descriptors */
        memset(pfds, 0, sizeof(*pfds) * npfds);
        pfds[PFD_OUT].fd = pfds[PFD_ERR].fd = pfds[PFD_IN].fd = pfds[PFD_PID].fd = -1;
        pfds[PFD_CANCEL].fd = pfds[PFD_STOP].fd = -1;
        if (cfg->cancel_fd >= 0 && !r.cancelled) {
            /* only the hang-up matters: bytes the client sends after its request are not ours to read */
            pfds[PFD_CANCEL].fd = cfg->cancel_fd;
            pfds[PFD_CANCEL].events = POLLRDHUP;
        }
        if (cfg->stop_fd >= 0 && !r.cancelled) {
            pfds[PFD_STOP].fd = cfg->stop_fd; /* POLLHUP is always reported */
            pfds[PFD_STOP].events = 0;
        }
        if (!r.out_eof && !r.stop_reading && r.rlen == 0 && r.active < n) {
            pfds[PFD_OUT].fd = child->out_fd;
            pfds[PFD_OUT].events = POLLIN;
        }
        if (child->err_fd >= 0) {
            pfds[PFD_ERR].fd = child->err_fd;
            pfds[PFD_ERR].events = POLLIN;
        }
        if (child->in_fd >= 0 && (r.init_off < r.init_len || r.outq_head != NULL)) {
            pfds[PFD_IN].fd = child->in_fd;
            pfds[PFD_IN].events = POLLOUT;
        }
        if (!r.reaped && child->pidfd >= 0) {
            pfds[PFD_PID].fd = child->pidfd;
            pfds[PFD_PID].events = POLLIN;
        }
        for (unsigned i = 0; i < n; ++i) {
            conn_t *cn = &r.conns[i];
            if (cn->state == CONN_CLOSED)
                continue;
            pfds[np].fd = cn->fd;
            if (cn->ssl_want != 0)
                pfds[np].events = cn->ssl_want;
            else if (cn->state == CONN_CONNECTING || (cn->state == CONN_ACTIVE && cn->out_off < cn->out.len))
                pfds[np].events = POLLOUT;
            else
                pfds[np].events = POLLIN;
            pconn[nc++] = cn;
            ++np;
        }
        /* the module path: Deno's new connections while a slot is free, and the requests on them */
        for (unsigned i = 0; i < MODULE_CONNS; ++i)
            free_mconns += r.mconns[i].state == MC_FREE;
        first_listen = np;
        for (unsigned i = 0; i < nlisten; ++i) {
            pfds[np].fd = free_mconns != 0 && !r.failed && !r.reaped && now >= r.listen_rest_until ? child->listen_fds[i] : -1;
            pfds[np++].events = POLLIN;
        }
        if (nlisten != 0 && now < r.listen_rest_until && r.listen_rest_until < wake)
            wake = r.listen_rest_until;
        first_module = np;
        for (unsigned i = 0; i < MODULE_CONNS; ++i) {
            mconn_t *mc = &r.mconns[i];
            /* a request waiting for a call slot is watched for Deno's hang-up only: its fetch is not made then */
            pfds[np].fd = mc->state == MC_READING || mc->state == MC_WRITING || mc->state == MC_WAITING ? mc->fd : -1;
            pfds[np++].events = mc->state == MC_WRITING ? POLLOUT : mc->state == MC_WAITING ? POLLRDHUP : POLLIN;
            if ((mc->state == MC_READING || mc->state == MC_WRITING) && mc->deadline < wake)
                wake = mc->deadline;
        }
        for (unsigned i = 0; i < n; ++i)
            if (r.calls[i].state == CALL_HTTP && r.calls[i].deadline < wake)
                wake = r.calls[i].deadline;
        if (r.kill_at != 0 && r.kill_at < wake)
            wake = r.kill_at;
        if (r.reaped && r.drain_until < wake)
            wake = r.drain_until;
        timeout = wake <= now ? 0 : (wake - now > 60000 ? 60000 : (int)(wake - now));
        if (child->pidfd < 0 && !r.reaped && timeout > 20)
            timeout = 20; /* no pidfd: poll for the exit */
        if (r.reaped && !r.out_eof && !r.stop_reading && pfds[PFD_OUT].fd < 0 && r.rlen == 0)
            r.stop_reading = 1; /* nothing more will be read */

        if (poll(pfds, np, timeout) < 0) {
            if (errno == EINTR)
                continue;
            run_fail(&r, 0, "poll: %s", strerror(errno));
            sb_shim_child_signal(child, SIGKILL);
            continue;
        }
        if ((pfds[PFD_CANCEL].revents | pfds[PFD_STOP].revents) & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
            run_cancel(&r);
        if (pfds[PFD_PID].revents)
            reap(&r);
        if (pfds[PFD_ERR].revents)
            stderr_readable(&r);
        if (pfds[PFD_IN].revents && child->in_fd >= 0)
            guest_writable(&r);
        for (unsigned i = 0; i < nc; ++i)
            if (pfds[PFD_FIXED + i].revents && pconn[i]->state != CONN_CLOSED && pconn[i]->fd == pfds[PFD_FIXED + i].fd)
                conn_event(&r, pconn[i], pfds[PFD_FIXED + i].revents);
        for (unsigned i = 0; i < nlisten; ++i)
            if (pfds[first_listen + i].fd >= 0 && pfds[first_listen + i].revents)
                sb_shim_relay__module_accept(&r, i, child->listen_fds[i]);
        for (unsigned i = 0; i < MODULE_CONNS; ++i) {
            mconn_t *mc = &r.mconns[i];
            if (pfds[first_module + i].fd < 0 || pfds[first_module + i].fd != mc->fd || !pfds[first_module + i].revents)
                continue;
            if (mc->state == MC_READING)
                sb_shim_relay__module_readable(&r, mc);
            else if (mc->state == MC_WRITING)
                sb_shim_relay__module_write(mc);
            else if (mc->state == MC_WAITING && (pfds[first_module + i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
                sb_shim_relay__mconn_close(mc);
        }
        if (pfds[PFD_OUT].revents && !r.stop_reading)
            guest_readable(&r);
        if (r.rlen != 0)
            process_guest_bytes(&r);
        /* replies may have been queued by the events above */
        if (child->in_fd >= 0 && (r.init_off < r.init_len || r.outq_head != NULL))
            guest_writable(&r);
    }
    if (r.reaped && child->err_fd >= 0)
        stderr_readable(&r);
    on_exit_without_result(&r);
    *out = build_outcome(&r);
    st = *out != NULL ? SB_OK : SB_E_NOMEM;
Exit:
    if (r.calls != NULL)
        for (unsigned i = 0; i < n; ++i)
            sb_shim_relay__call_free(&r, &r.calls[i]);
    if (r.conns != NULL)
        for (unsigned i = 0; i < n; ++i)
            conn_close(&r.conns[i]);
    if (r.mconns != NULL)
        for (unsigned i = 0; i < MODULE_CONNS; ++i)
            sb_shim_relay__mconn_close(&r.mconns[i]);
    for (unsigned i = 0; i < MODULE_CACHE; ++i)
        sb_shim_relay__ahead_free(&r.ahead[i]);
    if (!r.reaped && child->pid > 0) {
        sb_shim_child_signal(child, SIGKILL);
        (void)waitpid(child->pid, NULL, 0);
    }
    json_decref(r.output);
    json_decref(r.logs);
    json_decref(r.result_error);
    sb_frame_reader_dispose(&r.reader);
    sb_buf_free(&r.err);
    sb_mem_free(pconn);
    sb_mem_free(pfds);
    sb_mem_free(r.conns);
    sb_mem_free(r.mconns);
    sb_mem_free(r.calls);
    sb_mem_free(r.rbuf);
    return st;
}
