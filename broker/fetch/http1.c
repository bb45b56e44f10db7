/*
 * The HTTP/1.1 response reader of http.fetch (see http1.h). The response is
 * parsed with picohttpparser, which libh2o-evloop exports but whose header
 * Debian does not ship, so its prototypes are declared here (and the chunked
 * decoder's state in http1.h). Content-Length is never trusted for
 * allocation: the body grows with the bytes that arrive and stops at
 * max_body.
 */
#include <string.h>
#include <sys/types.h>
#include "fetch/http1.h"
#include "sb/mem.h"

struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
int phr_parse_response(const char *buf, size_t len, int *minor_version, int *status, const char **msg, size_t *msg_len,
                       struct phr_header *headers, size_t *num_headers, size_t last_len);
ssize_t phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);

enum { F_HEAD = 0, F_LENGTH, F_CHUNKED, F_CLOSE, F_NONE };

void sb_http1_init(sb_http1_reader_t *r, int head_request, size_t max_body)
{
    memset(r, 0, sizeof(*r));
    r->state = F_HEAD;
    r->head_request = head_request;
    r->max_body = max_body;
    sb_buf_init(&r->body, max_body);
}

void sb_http1_set_wipe(sb_http1_reader_t *r)
{
    r->wipe = 1;
    sb_buf_init_secret(&r->body, r->max_body);
}

void sb_http1_dispose(sb_http1_reader_t *r)
{
    /* wiped: a response may echo a run's secret (PROTOCOL.md section 5); a wiping reader's body is a secret buffer */
    if (r->wipe && r->head != NULL)
        sb_mem_free_secret(r->head, r->head_len);
    else
        sb_mem_free(r->head);
    r->head = NULL;
    sb_buf_free(&r->body);
    r->res.body = NULL;
    r->res.body_len = 0;
}

int sb_http1_reusable(const sb_http1_reader_t *r)
{
    return r->reusable;
}

/* the body grows with the bytes that arrive (sb_buf's one growth rule), never past max_body */
static const char *append_body(sb_http1_reader_t *r, sb_view_t v)
{
    switch (sb_buf_append(&r->body, v.base, v.len)) {
    case SB_OK:
        break;
    case SB_E_TOO_LARGE:
        return "response body exceeds the cap";
    default:
        return "out of memory";
    }
    r->res.body = (uint8_t *)r->body.base;
    r->res.body_len = r->body.len;
    return NULL;
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

/* a Connection field value lists "close" (RFC 9110 section 7.6.1: comma-separated tokens, any case) */
static int lists_close(const char *v, size_t len)
{
    sb_reader_t rd;
    sb_view_t tok;

    sb_reader_init(&rd, v, len);
    for (;;) {
        int last = sb_reader_until(&rd, ',', &tok) != SB_OK;
        size_t b = 0, e;
        if (last)
            tok = sb_reader_rest(&rd);
        e = tok.len;
        while (b < e && (tok.base[b] == ' ' || tok.base[b] == '\t'))
            ++b;
        while (e > b && (tok.base[e - 1] == ' ' || tok.base[e - 1] == '\t'))
            --e;
        if (ieq((const char *)tok.base + b, e - b, "close"))
            return 1;
        if (last || sb_reader_skip(&rd, 1) != SB_OK)
            return 0;
    }
}

/*
 * Parses the head at buf + *off (interim responses are skipped: *off moves past them).
 * Returns NULL when more bytes are needed (*done 0) or the head was parsed (*done 1,
 * *off past the head), an error otherwise.
 */
static const char *parse_head(sb_http1_reader_t *r, const char *buf, size_t len, size_t *off, int *done)
{
    struct phr_header hdrs[SB_MAX_RESPONSE_HEADERS];
    size_t nh = SB_MAX_RESPONSE_HEADERS, cl = 0;
    int minor, status, have_cl = 0, chunked = 0, rlen;
    const char *msg, *in;
    size_t msg_len;

    *done = 0;
    for (;;) {
        in = buf + *off;
        nh = SB_MAX_RESPONSE_HEADERS;
        /*
         * last_len: the bytes of this head an earlier read already showed incomplete. picohttpparser then
         * looks for the end of the head in the new bytes only, and parses the head once that has arrived,
         * so a head dripped a byte per read costs linear time, not quadratic (65536 one-byte reads took
         * 0.4 s of this thread). A malformed head is then refused when its end arrives, at the head cap, at
         * the end of the connection or at the deadline, rather than at the first read that shows it.
         */
        rlen = phr_parse_response(in, len - *off, &minor, &status, &msg, &msg_len, hdrs, &nh, r->head_seen);
        if (rlen == -2) {
            r->head_seen = len - *off;
            return len - *off > SB_MAX_RESPONSE_HEAD ? "response head exceeds 65536 bytes" : NULL;
        }
        if (rlen < 0)
            return "malformed response head (or more than 100 headers)";
        /* the cap holds however TCP split the bytes: a head that arrived whole is measured too */
        if ((size_t)rlen > SB_MAX_RESPONSE_HEAD)
            return "response head exceeds 65536 bytes";
        /* RFC 9110 section 15: a status is three digits from 100 to 599; anything else is not HTTP */
        if (status < 100 || status > 599)
            return "malformed response status";
        if (status >= 100 && status < 200) {
            if (status == 101)
                return "upstream switched protocols";
            *off += (size_t)rlen; /* an interim response: skip it */
            r->head_seen = 0;
            continue;
        }
        break;
    }
    /* copy the head: the connection's buffer is consumed as the body arrives */
    if ((r->head = sb_mem_try_alloc((size_t)rlen)) == NULL)
        return "out of memory";
    r->head_len = (size_t)rlen;
    r->minor_version = minor;
    memcpy(r->head, in, (size_t)rlen);
    r->res.status = status;
    r->res.reason = r->head + (msg - in);
    r->res.reason_len = msg_len;
    for (size_t i = 0; i < nh; ++i) {
        sb_http_header_t *o;
        char *name;
        /*
         * obsolete line folding (RFC 9112 section 5.2): picohttpparser hands a continuation line over
         * as a header with a NULL name; a proxy may refuse the message, and this one does
         */
        if (hdrs[i].name == NULL)
            return "malformed response head (obsolete line folding)";
        o = &r->res.headers[r->res.nheaders++];
        name = r->head + (hdrs[i].name - in);
        for (size_t k = 0; k < hdrs[i].name_len; ++k)
            if (name[k] >= 'A' && name[k] <= 'Z')
                name[k] = (char)(name[k] - 'A' + 'a');
        o->name = name;
        o->name_len = hdrs[i].name_len;
        o->value = r->head + (hdrs[i].value - in);
        o->value_len = hdrs[i].value_len;
        if (ieq(name, hdrs[i].name_len, "content-length")) {
            size_t v;
            if (parse_length(hdrs[i].value, hdrs[i].value_len, &v) != 0 || (have_cl && v != cl))
                return "malformed or conflicting Content-Length";
            cl = v;
            have_cl = 1;
        } else if (ieq(name, hdrs[i].name_len, "transfer-encoding")) {
            /* chunked applied twice is no framing we can read (RFC 9112 section 6.1): refuse it */
            if (!ieq(hdrs[i].value, hdrs[i].value_len, "chunked") || chunked)
                return "unsupported Transfer-Encoding";
            chunked = 1;
        } else if (ieq(name, hdrs[i].name_len, "connection") && lists_close(hdrs[i].value, hdrs[i].value_len)) {
            r->conn_close = 1;
        }
    }
    *off += (size_t)rlen;
    if (r->head_request || status == 204 || status == 304) {
        r->state = F_NONE;
    } else if (chunked) {
        /* RFC 9112 section 6.3: Transfer-Encoding overrides Content-Length */
        r->state = F_CHUNKED;
        r->chunked.consume_trailer = 1;
    } else if (have_cl) {
        if (cl > r->max_body)
            return "response body exceeds the cap";
        r->state = F_LENGTH;
        r->content_length = cl;
    } else {
        r->state = F_CLOSE;
    }
    *done = 1;
    return NULL;
}

/* a complete response leaves the connection reusable only when nothing follows it and both sides keep it open */
static void complete(sb_http1_reader_t *r, size_t left, int *done)
{
    r->reusable = left == 0 && r->minor_version == 1 && !r->conn_close;
    *done = 1;
}

const char *sb_http1_feed(sb_http1_reader_t *r, char *buf, size_t len, int eof, size_t *consumed, int *done)
{
    const char *err = NULL;
    size_t off = 0;
    sb_reader_t rd;
    sb_view_t v;

    *consumed = 0;
    *done = 0;
    if (r->state == F_HEAD) {
        int parsed;
        if ((err = parse_head(r, buf, len, &off, &parsed)) != NULL)
            return err;
        if (!parsed) {
            if (eof)
                return "connection closed before the response head";
            *consumed = off;
            return NULL;
        }
    }
    /* what follows the head: the caller drops all of it, whatever the framing takes */
    *consumed = len;
    sb_reader_init(&rd, buf + off, len - off);
    switch (r->state) {
    case F_NONE:
        complete(r, sb_reader_remaining(&rd), done);
        return NULL;
    case F_LENGTH: {
        size_t take = sb_reader_remaining(&rd);
        if (take > r->content_length - r->res.body_len)
            take = r->content_length - r->res.body_len;
        if (sb_reader_bytes(&rd, take, &v) != SB_OK || (err = append_body(r, v)) != NULL)
            return err != NULL ? err : "internal state error";
        if (r->res.body_len == r->content_length)
            complete(r, sb_reader_remaining(&rd), done);
        else if (eof)
            return "connection closed before the response body completed";
        return NULL;
    }
    case F_CHUNKED: {
        /* decoded in place: the decoder only ever shrinks the bytes it is given */
        size_t n = len - off;
        ssize_t rv = phr_decode_chunked(&r->chunked, buf + off, &n);
        if (rv == -1)
            return "malformed chunked encoding";
        v.base = (const uint8_t *)buf + off;
        v.len = n;
        if ((err = append_body(r, v)) != NULL)
            return err;
        if (rv >= 0)
            complete(r, (size_t)rv, done); /* rv: bytes left after the last chunk and the trailers */
        else if (eof)
            return "connection closed inside chunked body";
        return NULL;
    }
    case F_CLOSE:
        if ((err = append_body(r, sb_reader_rest(&rd))) != NULL)
            return err;
        if (eof) {
            *done = 1; /* the body ends with the connection, which ends with it */
            r->reusable = 0;
        }
        return NULL;
    default:
        return "internal state error";
    }
}
