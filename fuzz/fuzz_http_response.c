/*
 * libFuzzer driver for broker/fetch/http1.c (sb_http1_feed): the HTTP/1.1
 * response reader of http.fetch, which reads whatever an upstream sends.
 *
 * Input: a 4-byte prefix, then the raw bytes of the connection.
 *   byte 0, flags:
 *     bits 0-1  body cap: 0 = 5 MiB (the broker's), 1 = 0, 2 = 64, 3 = 4096
 *     bit 2     the request was HEAD
 *     bit 3     the end of the connection comes with the last bytes (else in a read of its own)
 *     bit 4     the connection stays open (no end at all)
 *     bit 5     insert "x-pad: " + N bytes + CRLF after the first LF, N = bytes 1-2 (big endian)
 *     bit 6     insert byte 3 copies of "x-r: 1" CRLF after the first LF
 *   (bits 5 and 6 reach the 64 KiB and 100-header caps from small inputs.)
 *   An input shorter than 4 bytes is all raw bytes, flags 0.
 *
 * The bytes are delivered as one read, as reads split at points drawn from a
 * PRNG seeded with the input, and one byte per read (short inputs), through a
 * buffer that plays the socket's: it keeps what the reader did not consume.
 * The buffer ends at a PROT_NONE page, so an over-read by picohttpparser
 * (not instrumented: it lives in libh2o-evloop) faults.
 *
 * Properties, for every delivery:
 *  - no crash, leak or undefined behaviour;
 *  - the outcome (complete, refused or still waiting) agrees with an oracle
 *    computed on the whole input: phr_parse_response with room for 1024
 *    headers walks the interim responses, then the framing is decided with
 *    the rules of RFC 9112 section 6.3 as the reader states them;
 *      - a head (interim or final) over 64 KiB, or with more than 100 headers,
 *        or malformed, or an incomplete head when the connection ends, or an
 *        incomplete head already over 64 KiB or already into a 101st header
 *        line: refused;
 *      - interim 1xx responses are skipped; 101 is refused;
 *      - a header continued by obsolete line folding: refused (the parser
 *        hands it over as a header without a name);
 *      - Content-Length that is not 1-15 digits, or two that differ:
 *        refused; a Transfer-Encoding other than "chunked": refused;
 *      - HEAD, 204, 304: complete, empty body, whatever follows;
 *      - chunked (which overrides Content-Length): the whole rest decoded at
 *        once by phr_decode_chunked: complete with that body, refused when it
 *        is malformed or its body exceeds the cap;
 *      - Content-Length: refused above the cap; complete with exactly the
 *        next Content-Length bytes once they are there;
 *      - neither: the body is everything up to the end of the connection,
 *        refused above the cap;
 *    so the verdict and the body are the same whatever the split;
 *  - a complete response has the oracle's status, reason and headers (names
 *    lowercased, non-empty), a status outside 1xx, and a body never above the
 *    cap; a waiting one holds exactly the body bytes received so far;
 *  - a complete response leaves the connection reusable only when it is
 *    HTTP/1.1, no Connection field lists "close" and its end was framed (not
 *    the close); delivered whole, exactly when moreover no byte follows it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>
#include "fetch/http1.h"
#include "fuzz.h"

struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
int phr_parse_response(const char *buf, size_t len, int *minor_version, int *status, const char **msg, size_t *msg_len,
                       struct phr_header *headers, size_t *num_headers, size_t last_len);
ssize_t phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);

#define MAX_RAW 65536                /* raw input bytes considered */
#define MAX_MSG (2 * MAX_RAW + 8192) /* raw + pad + repeated headers */
#define ORACLE_HEADERS 1024

enum { V_WAIT, V_DONE, V_REFUSED };

static const size_t caps[4] = {5242880, 0, 64, 4096};

/* the socket buffer: unconsumed bytes always end at a PROT_NONE page */
static char *sockbuf_end;

static void sockbuf_init(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), size = (MAX_MSG + page - 1) / page * page;
    char *p;

    if (sockbuf_end != NULL)
        return;
    p = mmap(NULL, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SB_FUZZ_ASSERT(p != MAP_FAILED, "mmap");
    SB_FUZZ_ASSERT(mprotect(p + size, page, PROT_NONE) == 0, "mprotect");
    sockbuf_end = p + size;
}

typedef struct {
    int verdict;
    const char *err;
    size_t pend; /* bytes left in the socket buffer (waiting) */
} outcome_t;

/* delivers msg in reads of the sizes `split` picks, then the end of the connection (eof_mode) */
typedef size_t (*split_fn)(void *ctx, size_t left);

static outcome_t deliver(sb_http1_reader_t *r, const uint8_t *msg, size_t len, int eof_mode, split_fn split, void *ctx)
{
    size_t sent = 0, pend = 0;
    outcome_t out = {V_WAIT, NULL, 0};

    for (;;) {
        size_t n = len - sent, consumed;
        int eof, done;
        const char *err;

        if (n != 0)
            n = split(ctx, n);
        else if (eof_mode == 2 || (eof_mode == 1 && len != 0))
            break; /* everything delivered, and no end of the connection to deliver */
        /* the end: with the last bytes (eof_mode 1), in a read of its own (0), or never (2) */
        eof = eof_mode == 1 ? sent + n == len : eof_mode == 0 ? n == 0 : 0;
        memmove(sockbuf_end - pend - n, sockbuf_end - pend, pend);
        memcpy(sockbuf_end - n, msg + sent, n);
        sent += n;
        pend += n;
        err = sb_http1_feed(r, sockbuf_end - pend, pend, eof, &consumed, &done);
        if (err != NULL) {
            SB_FUZZ_ASSERT(!done, "refused and complete at once");
            out.verdict = V_REFUSED;
            out.err = err;
            return out;
        }
        if (done) {
            out.verdict = V_DONE;
            return out;
        }
        SB_FUZZ_ASSERT(!eof, "neither complete nor refused at the end of the connection");
        SB_FUZZ_ASSERT(consumed <= pend, "consumed %zu of %zu bytes", consumed, pend);
        pend -= consumed;
    }
    out.pend = pend;
    return out;
}

/* the end of the connection, after a delivery that left the reader waiting */
static outcome_t close_conn(sb_http1_reader_t *r, size_t pend)
{
    outcome_t out = {V_WAIT, NULL, 0};
    size_t consumed;
    int done;

    out.err = sb_http1_feed(r, sockbuf_end - pend, pend, 1, &consumed, &done);
    SB_FUZZ_ASSERT(out.err == NULL ? done : !done, "at the end of the connection: %s, %s", out.err ? out.err : "no error",
                   done ? "complete" : "not complete");
    out.verdict = out.err != NULL ? V_REFUSED : V_DONE;
    return out;
}

static size_t split_whole(void *ctx, size_t left)
{
    (void)ctx;
    return left;
}

static size_t split_bytes(void *ctx, size_t left)
{
    (void)ctx;
    return left != 0 ? 1 : 0;
}

typedef struct {
    sb_fuzz_rng_t rng;
    size_t min;
} rsplit_t;

static size_t split_random(void *ctx, size_t left)
{
    rsplit_t *s = ctx;
    size_t n = sb_fuzz_rng_chunk(&s->rng, left);
    if (n < s->min)
        n = s->min;
    return n < left ? n : left;
}

/* what the reader must end with, from the whole input at once */
typedef struct {
    int verdict;
    int malformed; /* refused: picohttpparser found the head malformed (or a 101st header line) */
    int stray_cr;  /* waiting: the incomplete head has a CR followed by something else than LF */
    int status;
    const char *reason;
    size_t reason_len;
    struct phr_header hdrs[ORACLE_HEADERS];
    size_t nh;
    const uint8_t *body; /* the expected body (complete) or body so far (waiting) */
    size_t body_len;
    char *decoded; /* owns body when chunked */
    int may_reuse; /* complete: HTTP/1.1, no "close" token, framed end */
    size_t left;   /* complete, delivered whole: bytes after the end of the response */
} oracle_t;

static int ieq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; ++i) {
        char c = a[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c + 32);
        if (c != b[i])
            return 0;
    }
    return 1;
}

/* a Connection value lists "close": comma-separated, spaces and tabs around, any case (RFC 9110 section 7.6.1) */
static int oracle_lists_close(const char *v, size_t len)
{
    size_t i = 0;
    while (i <= len) {
        size_t j = i, b, e;
        while (j < len && v[j] != ',')
            ++j;
        b = i;
        e = j;
        while (b < e && (v[b] == ' ' || v[b] == '\t'))
            ++b;
        while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            --e;
        if (ieq(v + b, e - b, "close"))
            return 1;
        i = j + 1;
    }
    return 0;
}

static void oracle(oracle_t *o, const uint8_t *msg, size_t len, int eof, int head_request, size_t cap)
{
    size_t off = 0, rest, cl = 0;
    int minor, rlen, have_cl = 0, chunked = 0;
    const char *p;
    int conn_close = 0;

    memset(o, 0, sizeof(*o));
    o->verdict = V_REFUSED;
    for (;;) {
        p = (const char *)msg + off;
        o->nh = ORACLE_HEADERS;
        rlen = phr_parse_response(p, len - off, &minor, &o->status, &o->reason, &o->reason_len, o->hdrs, &o->nh, 0);
        if (rlen == -2) {
            /* a 101st header line refuses the head before it is complete (the first byte of it is enough) */
            size_t lf = 0, last = 0;
            for (size_t i = off; i < len; ++i)
                if (msg[i] == '\n') {
                    ++lf;
                    last = i;
                }
            if (lf > SB_MAX_RESPONSE_HEADERS + 1 ||
                (lf == SB_MAX_RESPONSE_HEADERS + 1 && last + 1 < len && msg[last + 1] != '\r' && msg[last + 1] != '\n')) {
                o->malformed = 1;
                return;
            }
            for (size_t i = off; i + 1 < len; ++i)
                if (msg[i] == '\r' && msg[i + 1] != '\n')
                    o->stray_cr = 1;
            if (!eof && len - off <= SB_MAX_RESPONSE_HEAD)
                o->verdict = V_WAIT;
            return;
        }
        o->malformed = rlen == -1;
        if (rlen < 0 || (size_t)rlen > SB_MAX_RESPONSE_HEAD || o->nh > SB_MAX_RESPONSE_HEADERS)
            return;
        if (o->status < 100 || o->status > 599)
            return; /* not an HTTP status */
        if (o->status >= 100 && o->status <= 199) {
            if (o->status == 101)
                return;
            off += (size_t)rlen;
            continue;
        }
        break;
    }
    for (size_t i = 0; i < o->nh; ++i) {
        const struct phr_header *h = &o->hdrs[i];
        if (h->name == NULL)
            return; /* obs-fold */
        if (ieq(h->name, h->name_len, "content-length")) {
            size_t v = 0;
            if (h->value_len == 0 || h->value_len > 15)
                return;
            for (size_t k = 0; k < h->value_len; ++k) {
                if (h->value[k] < '0' || h->value[k] > '9')
                    return;
                v = v * 10 + (size_t)(h->value[k] - '0');
            }
            if (have_cl && v != cl)
                return;
            cl = v;
            have_cl = 1;
        } else if (ieq(h->name, h->name_len, "transfer-encoding")) {
            if (!ieq(h->value, h->value_len, "chunked") || chunked)
                return; /* anything but one chunked is refused */
            chunked = 1;
        } else if (ieq(h->name, h->name_len, "connection") && oracle_lists_close(h->value, h->value_len)) {
            conn_close = 1;
        }
    }
    o->may_reuse = minor == 1 && !conn_close;
    off += (size_t)rlen;
    rest = len - off;
    o->body = msg + off;
    if (head_request || o->status == 204 || o->status == 304) {
        o->body_len = 0;
        o->verdict = V_DONE;
        o->left = rest;
    } else if (chunked) {
        struct phr_chunked_decoder d;
        size_t n = rest;
        ssize_t rv;
        memset(&d, 0, sizeof(d));
        d.consume_trailer = 1;
        o->decoded = malloc(rest + 1);
        memcpy(o->decoded, msg + off, rest);
        rv = phr_decode_chunked(&d, o->decoded, &n);
        SB_FUZZ_ASSERT(n <= rest, "chunked decoding grew %zu bytes into %zu", rest, n);
        o->body = (const uint8_t *)o->decoded;
        o->body_len = n;
        if (rv == -1 || n > cap || (rv == -2 && eof))
            return;
        o->verdict = rv >= 0 ? V_DONE : V_WAIT;
        o->left = rv >= 0 ? (size_t)rv : 0;
    } else if (have_cl) {
        if (cl > cap)
            return;
        if (rest >= cl) {
            o->body_len = cl;
            o->verdict = V_DONE;
            o->left = rest - cl;
        } else {
            o->body_len = rest;
            if (!eof)
                o->verdict = V_WAIT;
        }
    } else {
        o->body_len = rest;
        o->may_reuse = 0; /* the body ends with the connection */
        if (rest > cap)
            return;
        o->verdict = eof ? V_DONE : V_WAIT;
    }
}

static const char *vname(int v)
{
    return v == V_DONE ? "complete" : v == V_WAIT ? "waiting" : "refused";
}

static void check(const char *how, const sb_http1_reader_t *r, outcome_t got, const oracle_t *o, size_t cap)
{
    const sb_http_response_t *res = &r->res;

    /*
     * With the connection open, a head that a read in pieces left incomplete is only parsed again
     * once its end arrives (picohttpparser's last_len), so a malformed one may still be waiting where
     * the whole input is refused at once; the end of the connection then refuses it (checked by the caller).
     */
    if (strncmp(how, "whole", 5) != 0 && strstr(how, "open") != NULL && res->status == 0) {
        if (got.verdict == V_WAIT && o->verdict == V_REFUSED && o->malformed)
            return;
        /* the other way round: that scan refuses a CR not followed by LF at once, where the parser waits for 9 bytes */
        if (got.verdict == V_REFUSED && o->verdict == V_WAIT && o->stray_cr)
            return;
    }
    SB_FUZZ_ASSERT(got.verdict == o->verdict, "%s delivery: %s (%s), the whole input says %s", how, vname(got.verdict),
                   got.err != NULL ? got.err : "no error", vname(o->verdict));
    SB_FUZZ_ASSERT(res->body_len <= cap, "%s delivery: body of %zu bytes above the cap %zu", how, res->body_len, cap);
    if (got.verdict == V_REFUSED)
        return;
    if (got.verdict == V_WAIT && res->status == 0)
        return; /* still in the head */
    SB_FUZZ_ASSERT(res->status == o->status, "%s delivery: status %d, expected %d", how, res->status, o->status);
    SB_FUZZ_ASSERT(res->status < 100 || res->status > 199, "%s delivery: interim status %d returned", how, res->status);
    SB_FUZZ_ASSERT(res->reason_len == o->reason_len && memcmp(res->reason, o->reason, o->reason_len) == 0,
                   "%s delivery: reason differs", how);
    SB_FUZZ_ASSERT(res->nheaders == o->nh, "%s delivery: %zu headers, expected %zu", how, res->nheaders, o->nh);
    SB_FUZZ_ASSERT(res->nheaders <= SB_MAX_RESPONSE_HEADERS, "more than %u headers", SB_MAX_RESPONSE_HEADERS);
    for (size_t i = 0; i < res->nheaders; ++i) {
        const sb_http_header_t *h = &res->headers[i];
        SB_FUZZ_ASSERT(h->name_len != 0, "%s delivery: header %zu has no name", how, i);
        SB_FUZZ_ASSERT(h->name_len == o->hdrs[i].name_len, "%s delivery: header %zu name length", how, i);
        for (size_t k = 0; k < h->name_len; ++k) {
            char c = o->hdrs[i].name[k];
            if (c >= 'A' && c <= 'Z')
                c = (char)(c + 32);
            SB_FUZZ_ASSERT(h->name[k] == c, "%s delivery: header %zu name not the lowercased original", how, i);
        }
        SB_FUZZ_ASSERT(h->value_len == o->hdrs[i].value_len && memcmp(h->value, o->hdrs[i].value, h->value_len) == 0,
                       "%s delivery: header %zu value differs", how, i);
    }
    SB_FUZZ_ASSERT(res->body_len == o->body_len && (o->body_len == 0 || memcmp(res->body, o->body, o->body_len) == 0),
                   "%s delivery (%s): body of %zu bytes, expected %zu", how, vname(got.verdict), res->body_len, o->body_len);
    if (got.verdict == V_DONE) {
        int reusable = sb_http1_reusable(r);
        SB_FUZZ_ASSERT(!reusable || o->may_reuse, "%s delivery: reusable, but HTTP/1.0, Connection: close or close-delimited", how);
        /* split, the bytes after the end may come in a later read, which the client's idle watch refuses */
        if (strncmp(how, "whole", 5) == 0)
            SB_FUZZ_ASSERT(reusable == (o->may_reuse && o->left == 0), "%s delivery: reusable %d, expected %d (%zu bytes after)",
                           how, reusable, o->may_reuse && o->left == 0, o->left);
    }
}

static uint8_t msgbuf[MAX_MSG];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t flags = 0;
    const uint8_t *raw = data;
    size_t rawlen = size, len = 0, at = 0, cap;
    int eof_mode, head_request;
    oracle_t *o, *oc = NULL;

    sockbuf_init();
    if (size >= 4) {
        flags = data[0];
        raw = data + 4;
        rawlen = size - 4;
    }
    if (rawlen > MAX_RAW)
        return 0;
    cap = caps[flags & 3];
    head_request = (flags & 4) != 0;
    eof_mode = (flags & 16) ? 2 : (flags & 8) ? 1 : 0;

    /* the message: raw bytes, with the inserted lines after the first LF */
    while (at < rawlen && raw[at] != '\n')
        ++at;
    at = at < rawlen ? at + 1 : 0;
    memcpy(msgbuf, raw, at);
    len = at;
    if (flags & 32) {
        size_t pad = (size_t)data[1] << 8 | data[2];
        memcpy(msgbuf + len, "x-pad: ", 7);
        memset(msgbuf + len + 7, 'p', pad);
        memcpy(msgbuf + len + 7 + pad, "\r\n", 2);
        len += 9 + pad;
    }
    if (flags & 64) {
        for (unsigned i = 0; i < data[3]; ++i) {
            memcpy(msgbuf + len, "x-r: 1\r\n", 8);
            len += 8;
        }
    }
    memcpy(msgbuf + len, raw + at, rawlen - at);
    len += rawlen - at;

    /* what the whole input says with the connection open (if it stays open) and once it ended */
    o = malloc(sizeof(*o));
    oracle(o, msgbuf, len, eof_mode != 2, head_request, cap);
    if (eof_mode == 2) {
        oc = malloc(sizeof(*oc));
        oracle(oc, msgbuf, len, 1, head_request, cap);
    }

    for (int how = 0; how < 3; ++how) {
        static const char *const names[3][2] = {
            {"whole", "whole, open"}, {"random-split", "random-split, open"}, {"byte-by-byte", "byte-by-byte, open"}};
        sb_http1_reader_t r;
        outcome_t got;
        rsplit_t rs;

        sb_http1_init(&r, head_request, cap);
        if (how == 0) {
            got = deliver(&r, msgbuf, len, eof_mode, split_whole, NULL);
        } else if (how == 1) {
            /* at least len / 256 bytes a read: the socket buffer is moved on every read */
            sb_fuzz_rng_seed(&rs.rng, data, size);
            rs.min = len / 256;
            got = deliver(&r, msgbuf, len, eof_mode, split_random, &rs);
        } else {
            if (len > 1024) {
                sb_http1_dispose(&r);
                break;
            }
            got = deliver(&r, msgbuf, len, eof_mode, split_bytes, NULL);
        }
        check(names[how][eof_mode == 2], &r, got, o, cap);
        if (eof_mode == 2 && got.verdict == V_WAIT) {
            got = close_conn(&r, got.pend);
            check(names[how][0], &r, got, oc, cap);
        }
        sb_http1_dispose(&r);
    }
    free(o->decoded);
    free(o);
    if (oc != NULL) {
        free(oc->decoded);
        free(oc);
    }
    return 0;
}
