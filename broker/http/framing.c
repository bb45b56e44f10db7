/*
 * Ambiguous request framing (see framing.h), decided on the head h2o parsed.
 *
 * h2o 2.2.5 keeps Content-Length and Transfer-Encoding out of req->headers (they are "special" to its
 * HTTP/1 reader, lib/http1.c init_headers): the route cannot count them. The head itself is still at
 * the start of the connection's input buffer when the route runs (h2o consumes a request's bytes
 * only after its response is sent, and decodes a chunked body in place after the head), so it is read
 * again there with the parser h2o used, picohttpparser's phr_parse_request, which libh2o-evloop exports
 * (Debian ships no header for it: the prototype is below). The same parser sees the same fields,
 * obs-fold lines included, so the decision is about exactly the head h2o acted on. As a check that the
 * bytes are that head, its method and target must equal the request's.
 *
 * The rules (RFC 9112):
 *  - section 5.2: an obs-fold line (a line that starts with SP or HTAB) is refused with 400;
 *  - section 6.1: Transfer-Encoding in HTTP/1.0 means the framing is faulty; with Content-Length it
 *    "ought to be handled as an error"; chunked must be the final coding and is applied once. h2o
 *    decodes only a lone "chunked", so exactly one field of exactly that value is accepted;
 *  - section 6.3 item 5 and RFC 9110 section 8.6: Content-Length is 1*DIGIT. Several fields or a list
 *    are refused even when the values agree: the RFC allows either, and one value in one field is the
 *    only form every parser reads alike.
 * A refused request gets 400 and the connection is closed after it (section 6.3: the framing of what
 * follows cannot be trusted), so a request pipelined behind it is never answered.
 */
#include <string.h>
#include <sys/types.h>
#include "http/framing.h"
#include "http/reply.h"
#include "obs/log.h"

struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len, const char **path, size_t *path_len,
                      int *minor_version, struct phr_header *headers, size_t *num_headers, size_t last_len);

/* 1 if the field name is `lit` (lowercase), ASCII case-insensitively */
static int name_is(const struct phr_header *h, const char *lit, size_t lit_len)
{
    if (h->name == NULL || h->name_len != lit_len)
        return 0;
    for (size_t i = 0; i != lit_len; ++i) {
        char c = h->name[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return 0;
    }
    return 1;
}

static int value_is_chunked(const struct phr_header *h)
{
    static const char lit[] = "chunked";
    if (h->value_len != sizeof(lit) - 1)
        return 0;
    for (size_t i = 0; i != sizeof(lit) - 1; ++i) {
        char c = h->value[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return 0;
    }
    return 1;
}

static int value_is_digits(const struct phr_header *h)
{
    if (h->value_len == 0)
        return 0;
    for (size_t i = 0; i != h->value_len; ++i)
        if (h->value[i] < '0' || h->value[i] > '9')
            return 0;
    return 1;
}

static const char *check_head(const char *buf, size_t len, h2o_iovec_t *method, h2o_iovec_t *path)
{
    struct phr_header headers[H2O_MAX_HEADERS];
    size_t nheaders = H2O_MAX_HEADERS, ncl = 0, nte = 0;
    const struct phr_header *cl = NULL, *te = NULL;
    int minor;

    /* the same window and header count h2o parses with (lib/http1.c handle_incoming_request) */
    if (len > H2O_MAX_REQLEN)
        len = H2O_MAX_REQLEN;
    if (phr_parse_request(buf, len, (const char **)&method->base, &method->len, (const char **)&path->base, &path->len, &minor,
                          headers, &nheaders, 0) <= 0)
        return "the request head does not parse";
    for (size_t i = 0; i != nheaders; ++i) {
        const struct phr_header *h = headers + i;
        if (h->name == NULL)
            return "obs-fold line in the request head";
        if (name_is(h, H2O_STRLIT("content-length")))
            ++ncl, cl = h;
        else if (name_is(h, H2O_STRLIT("transfer-encoding")))
            ++nte, te = h;
    }
    if (te != NULL) {
        if (minor == 0)
            return "Transfer-Encoding in an HTTP/1.0 request";
        if (cl != NULL)
            return "both Transfer-Encoding and Content-Length";
        if (nte != 1)
            return "more than one Transfer-Encoding field";
        if (!value_is_chunked(te))
            return "Transfer-Encoding other than chunked";
        return NULL;
    }
    if (cl != NULL) {
        if (ncl != 1)
            return "more than one Content-Length field";
        if (!value_is_digits(cl))
            return "Content-Length is not a decimal number";
    }
    return NULL;
}

/* 1 if the n >= lit_len bytes at p begin with `lit` (lowercase), ASCII case-insensitively */
static int lc_prefix(const char *p, const char *lit, size_t lit_len)
{
    for (size_t i = 0; i != lit_len; ++i)
        if ((p[i] >= 'A' && p[i] <= 'Z' ? p[i] + ('a' - 'A') : p[i]) != lit[i])
            return 0;
    return 1;
}

int sb_http_framing_plain(const char *buf, size_t len, const char *method, size_t method_len, const char *path, size_t path_len)
{
    const char *p = buf, *end;
    size_t ncl = 0, nfields = 0;

    /* the window check_head reads */
    if (len > H2O_MAX_REQLEN)
        len = H2O_MAX_REQLEN;
    end = buf + len;
    /* the request line, exactly: method SP target SP HTTP/1.0 or HTTP/1.1, CRLF */
    if (method_len + path_len + 12 > len || memcmp(p, method, method_len) != 0 || p[method_len] != ' ')
        return 0;
    p += method_len + 1;
    if (memcmp(p, path, path_len) != 0 || p[path_len] != ' ')
        return 0;
    p += path_len + 1;
    if (memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != '\r' || p[9] != '\n')
        return 0;
    p += 10;
    /* field lines, each ending in CRLF, up to the empty one */
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n;
        if (nl == NULL || nl == p || nl[-1] != '\r')
            return 0; /* cut short, or a bare LF */
        n = (size_t)(nl - 1 - p);
        if (n == 0)
            return 1;
        if (++nfields > H2O_MAX_HEADERS || p[0] == ' ' || p[0] == '\t')
            return 0; /* more than h2o reads, or obs-fold */
        if (n >= 14 && lc_prefix(p, "content-length", 14)) {
            /* the one Content-Length: the name, ':', optional SP/HTAB, then 1*DIGIT to the CR */
            size_t i = 15;
            if (n == 14 || p[14] != ':' || ++ncl > 1)
                return 0;
            while (i < n && (p[i] == ' ' || p[i] == '\t'))
                ++i;
            if (i == n)
                return 0;
            for (; i < n; ++i)
                if (p[i] < '0' || p[i] > '9')
                    return 0;
        } else if (n >= 17 && lc_prefix(p, "transfer-encoding", 17)) {
            return 0; /* chunked bodies are rare: check_head decides */
        }
        p = nl + 1;
    }
}

const char *sb_http_framing_check(const char *buf, size_t len)
{
    h2o_iovec_t method, path;
    return check_head(buf, len, &method, &path);
}

int sb_http_framing_refuse(h2o_req_t *req)
{
    static const char body[] = "ambiguous request framing\n";
    h2o_socket_t *sock = req->conn->callbacks->get_socket != NULL ? req->conn->callbacks->get_socket(req->conn) : NULL;
    h2o_iovec_t method = {NULL, 0}, path = {NULL, 0};
    const char *why;
    sb_logline_t l;

    /* HTTP/2 frames its messages itself; neither listener speaks it (server.c), this is for completeness */
    if (req->version >= 0x200)
        return 0;
    if (sock == NULL || sock->input == NULL)
        why = "the request head is not available";
    else if (sb_http_framing_plain(sock->input->bytes, sock->input->size, req->input.method.base, req->input.method.len,
                                   req->input.path.base, req->input.path.len))
        return 0;
    else if ((why = check_head(sock->input->bytes, sock->input->size, &method, &path)) == NULL &&
             (!h2o_memis(method.base, method.len, req->input.method.base, req->input.method.len) ||
              !h2o_memis(path.base, path.len, req->input.path.base, req->input.path.len)))
        why = "the buffered head is not this request's"; /* fail closed: what was decided is unknown */
    if (why == NULL)
        return 0;

    sb_log_begin(&l, SB_LOG_WARN, "http.framing_refused");
    sb_log_str(&l, "reason", why, strlen(why));
    sb_log_end(&l);
    req->http1_is_persistent = 0;
    /* 400 Bad Request (the table's row for a request the broker will not read) */
    sb_reply_send(req, SB_E_BAD_ARGS, "text/plain; charset=utf-8", body, sizeof(body) - 1);
    return 1;
}
