/*
 * libFuzzer driver for the chunked decoding of http.fetch responses:
 * picohttpparser's phr_decode_chunked (libh2o-evloop, not instrumented) as
 * broker/fetch/http1.c uses it: trailers consumed, fed whatever each read
 * brought, the decoded bytes appended to a body capped at max_body.
 *
 * Input: a flags byte, then the bytes after the response head.
 *   bits 0-1  body cap: 0 = 5 MiB (the broker's), 1 = 0, 2 = 16, 3 = 256
 *   bit 2     generate: the rest (up to 4 KiB) is a payload; the driver encodes it in
 *             well-formed chunks of sizes, hex case, leading zeros,
 *             extensions and trailers drawn from a PRNG seeded with the
 *             input, then appends the first rest byte % 8 bytes of it as
 *             bytes after the end of the body
 *   bit 3     the connection stays open (no end)
 *
 * Properties:
 *  - phr_decode_chunked fed in one piece, in pieces split at points drawn
 *    from the PRNG, and a byte a piece (short inputs) gives the same decoded
 *    bytes, the same verdict (complete, malformed, incomplete) and, when
 *    complete, ends at the same input offset; a call never returns more
 *    bytes than it was given, never reports more bytes left over than it was
 *    given, never touches a byte outside them (each piece ends at a
 *    PROT_NONE page); the decoded bytes never outnumber the input bytes;
 *  - for inputs of at most 4 KiB (and every generated one) that a strict
 *    reference decoder written here (RFC 9112 section 7.1: 1-16 hex digits,
 *    an extension of printable bytes after ';', CRLF exactly, trailer field
 *    lines "token: value") finds well-formed, complete or a valid prefix,
 *    picohttpparser agrees: same bytes, same end, or incomplete with the
 *    same bytes so far; a generated encoding is always complete and decodes
 *    to its payload;
 *  - the reader (sb_http1_feed after a "Transfer-Encoding: chunked" head)
 *    completes with exactly the decoded bytes when they fit in the cap and
 *    the encoding completed, refuses when they do not fit, when the encoding
 *    is malformed or when the connection ends before the encoding does, and
 *    is otherwise still waiting, holding the bytes decoded so far; its body
 *    is never above the cap.
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

ssize_t phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);

#define MAX_IN 65536
#define MAX_GEN (4 * MAX_IN) /* input bytes, or a generated encoding (payload <= REF_MAX, <= 32 bytes of framing a byte) */
#define REF_MAX 4096

static const size_t caps[4] = {5242880, 0, 16, 256};
static const char HEAD[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

enum { C_INCOMPLETE, C_COMPLETE, C_MALFORMED };

static const char *cname(int v)
{
    return v == C_COMPLETE ? "complete" : v == C_INCOMPLETE ? "incomplete" : "malformed";
}

/* a buffer whose end is a PROT_NONE page */
static char *guard_end;

static void guard_init(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), size = (MAX_GEN + sizeof(HEAD) + page - 1) / page * page;
    char *p;

    if (guard_end != NULL)
        return;
    p = mmap(NULL, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SB_FUZZ_ASSERT(p != MAP_FAILED, "mmap");
    SB_FUZZ_ASSERT(mprotect(p + size, page, PROT_NONE) == 0, "mprotect");
    guard_end = p + size;
}

typedef struct {
    sb_fuzz_rng_t rng;
    size_t min;
    int mode; /* 0 whole, 1 random, 2 bytes */
} splitter_t;

static size_t next_piece(splitter_t *s, size_t left)
{
    size_t n;
    if (s->mode == 0)
        return left;
    if (s->mode == 2)
        return 1;
    n = sb_fuzz_rng_chunk(&s->rng, left);
    if (n < s->min)
        n = s->min;
    return n < left ? n : left;
}

typedef struct {
    int verdict;
    uint8_t *out;
    size_t out_len;
    size_t end; /* complete: the input offset just past the encoding */
} decoded_t;

/* phr_decode_chunked as the reader runs it: every piece decoded in place, in a buffer of its own */
static void decode(decoded_t *d, const uint8_t *in, size_t len, splitter_t *s)
{
    struct phr_chunked_decoder dec;
    size_t off = 0;

    memset(&dec, 0, sizeof(dec));
    dec.consume_trailer = 1;
    d->verdict = C_INCOMPLETE;
    d->out = malloc(len + 1);
    d->out_len = 0;
    d->end = 0;
    while (off < len) {
        size_t piece = next_piece(s, len - off), n = piece;
        char *buf = guard_end - piece;
        ssize_t rv;

        memcpy(buf, in + off, piece);
        rv = phr_decode_chunked(&dec, buf, &n);
        SB_FUZZ_ASSERT(n <= piece, "decoded %zu bytes out of a %zu-byte piece", n, piece);
        SB_FUZZ_ASSERT(rv >= -2 && (rv < 0 || (size_t)rv <= piece), "returned %zd for a %zu-byte piece", rv, piece);
        memcpy(d->out + d->out_len, buf, n);
        d->out_len += n;
        SB_FUZZ_ASSERT(d->out_len <= off + piece, "%zu bytes decoded out of %zu", d->out_len, off + piece);
        if (rv == -1) {
            d->verdict = C_MALFORMED;
            return;
        }
        if (rv >= 0) {
            d->verdict = C_COMPLETE;
            d->end = off + piece - (size_t)rv;
            return;
        }
        off += piece;
    }
}

/*
 * The strict reference: returns C_COMPLETE (out, *end), C_INCOMPLETE (out so far: a valid prefix) or
 * C_MALFORMED (anything it does not call well-formed, including what picohttpparser tolerates).
 */
static int is_hex(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int is_tchar(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* expects CRLF at in[*i]: 1 when there, 0 when the input ends first, -1 otherwise */
static int crlf(const uint8_t *in, size_t len, size_t *i)
{
    if (*i == len)
        return 0;
    if (in[*i] != '\r')
        return -1;
    if (*i + 1 == len)
        return 0;
    if (in[*i + 1] != '\n')
        return -1;
    *i += 2;
    return 1;
}

static int reference(const uint8_t *in, size_t len, uint8_t *out, size_t *out_len, size_t *end)
{
    size_t i = 0;
    int r;

    *out_len = 0;
    for (;;) {
        uint64_t size = 0;
        size_t digits = 0;
        /* chunk-size */
        while (i < len && is_hex(in[i])) {
            uint8_t c = in[i++];
            size = size * 16 + (uint64_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
            if (++digits > 16)
                return C_MALFORMED;
        }
        if (i == len)
            return C_INCOMPLETE;
        if (digits == 0)
            return C_MALFORMED;
        /* chunk-ext: ';' and printable bytes */
        if (in[i] == ';') {
            for (++i; i < len && in[i] != '\r'; ++i)
                if (!((in[i] >= 0x20 && in[i] < 0x7f) || in[i] == '\t'))
                    return C_MALFORMED;
        }
        if ((r = crlf(in, len, &i)) <= 0)
            return r == 0 ? C_INCOMPLETE : C_MALFORMED;
        if (size == 0)
            break;
        /* chunk-data CRLF */
        if (len - i < size) {
            memcpy(out + *out_len, in + i, len - i);
            *out_len += len - i;
            return C_INCOMPLETE;
        }
        memcpy(out + *out_len, in + i, (size_t)size);
        *out_len += (size_t)size;
        i += (size_t)size;
        if ((r = crlf(in, len, &i)) <= 0)
            return r == 0 ? C_INCOMPLETE : C_MALFORMED;
    }
    /* trailer-section CRLF */
    for (;;) {
        size_t name = 0;
        if (i == len)
            return C_INCOMPLETE;
        if (in[i] == '\r') {
            if ((r = crlf(in, len, &i)) <= 0)
                return r == 0 ? C_INCOMPLETE : C_MALFORMED;
            *end = i;
            return C_COMPLETE;
        }
        while (i < len && is_tchar(in[i])) {
            ++i;
            ++name;
        }
        if (i == len)
            return C_INCOMPLETE;
        if (name == 0 || in[i] != ':')
            return C_MALFORMED;
        for (++i; i < len && in[i] != '\r'; ++i)
            if (in[i] < 0x20 ? in[i] != '\t' : in[i] == 0x7f)
                return C_MALFORMED;
        if ((r = crlf(in, len, &i)) <= 0)
            return r == 0 ? C_INCOMPLETE : C_MALFORMED;
    }
}

/* a well-formed encoding of payload, shaped by the PRNG; returns its length, *end past the last CRLF */
static size_t generate(uint8_t *o, const uint8_t *payload, size_t plen, size_t extra, sb_fuzz_rng_t *rng, size_t *end)
{
    size_t n = 0, off = 0;
    static const char hex_lower[] = "0123456789abcdef", hex_upper[] = "0123456789ABCDEF";

    for (;;) {
        size_t chunk = 0, digits = 0;
        uint32_t v = sb_fuzz_rng_next(rng);
        const char *hex = (v & 1) ? hex_upper : hex_lower;
        char tmp[16];

        if (off < plen) {
            chunk = (v >> 8) % 4 == 0 ? plen - off : 1 + (v >> 12) % 300;
            if (chunk > plen - off)
                chunk = plen - off;
        }
        for (size_t c = chunk; c != 0 || digits == 0; c >>= 4)
            tmp[digits++] = hex[c & 15];
        for (unsigned z = (v >> 2) & 3; z != 0 && digits < 16; --z)
            tmp[digits++] = '0';
        while (digits != 0)
            o[n++] = (uint8_t)tmp[--digits];
        if (v & 16) {
            memcpy(o + n, ";name=\"v a\"", 11);
            n += 11;
        }
        memcpy(o + n, "\r\n", 2);
        n += 2;
        if (chunk == 0)
            break;
        memcpy(o + n, payload + off, chunk);
        n += chunk;
        off += chunk;
        memcpy(o + n, "\r\n", 2);
        n += 2;
    }
    for (unsigned t = sb_fuzz_rng_next(rng) % 4; t != 0; --t) {
        memcpy(o + n, "X-Trailer: value\t1\r\n", 20);
        n += 20;
    }
    memcpy(o + n, "\r\n", 2);
    n += 2;
    *end = n;
    /* bytes after the end of the body (a pipelined response would look like this): never decoded */
    for (size_t k = 0; k < extra; ++k)
        o[n++] = (uint8_t) "HTTP/1.1"[k];
    return n;
}

/* the reader after a chunked head; returns 0 waiting, 1 complete, 2 refused */
static int read_response(sb_http1_reader_t *r, const uint8_t *body, size_t len, int eof, splitter_t *s)
{
    size_t pend = 0, sent = 0;
    const size_t hlen = sizeof(HEAD) - 1;

    for (int first = 1;; first = 0) {
        size_t n = len - sent, consumed;
        int done, end;
        const char *err;

        if (n != 0)
            n = next_piece(s, n);
        else if (!first)
            break; /* everything delivered, the connection open */
        /* the end of the connection comes with the last bytes */
        end = eof && sent + n == len;
        if (first) {
            /* the head, then the first piece of the body */
            memcpy(guard_end - hlen - n, HEAD, hlen);
            pend = hlen;
        } else {
            memmove(guard_end - pend - n, guard_end - pend, pend);
        }
        memcpy(guard_end - n, body + sent, n);
        sent += n;
        pend += n;
        err = sb_http1_feed(r, guard_end - pend, pend, end, &consumed, &done);
        if (err != NULL)
            return 2;
        if (done)
            return 1;
        SB_FUZZ_ASSERT(!end, "neither complete nor refused at the end of the connection");
        SB_FUZZ_ASSERT(consumed == pend, "a chunked body left %zu of %zu bytes unconsumed", pend - consumed, pend);
        pend = 0;
    }
    return 0;
}

static uint8_t genbuf[MAX_GEN];
static uint8_t refout[MAX_GEN];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t flags = size != 0 ? data[0] : 0;
    const uint8_t *in = data + (size != 0);
    size_t len = size != 0 ? size - 1 : 0, cap = caps[flags & 3], gen_end = 0, payload_len = 0;
    int open = (flags & 8) != 0, generated = (flags & 4) != 0;
    decoded_t first;
    splitter_t s;

    if (len > MAX_IN)
        return 0;
    guard_init();
    sb_fuzz_rng_seed(&s.rng, data, size);
    if (generated) {
        size_t extra = len != 0 ? in[0] % 8 : 0;
        if (len > REF_MAX)
            len = REF_MAX;
        payload_len = len;
        len = generate(genbuf, in, len, extra, &s.rng, &gen_end);
        in = genbuf;
    }

    /* the same result whatever the split */
    for (int mode = 0; mode < 3; ++mode) {
        decoded_t d;
        if (mode == 2 && len > 2048)
            break;
        s.mode = mode;
        s.min = len / 512;
        decode(mode == 0 ? &first : &d, in, len, &s);
        if (mode == 0)
            continue;
        SB_FUZZ_ASSERT(d.verdict == first.verdict, "%s in pieces (mode %d), %s whole", cname(d.verdict), mode,
                       cname(first.verdict));
        SB_FUZZ_ASSERT(d.out_len == first.out_len && memcmp(d.out, first.out, d.out_len) == 0,
                       "%zu bytes decoded in pieces (mode %d), %zu whole", d.out_len, mode, first.out_len);
        SB_FUZZ_ASSERT(d.end == first.end, "ends at %zu in pieces (mode %d), %zu whole", d.end, mode, first.end);
        free(d.out);
    }
    SB_FUZZ_ASSERT(first.out_len <= len, "%zu bytes decoded from %zu", first.out_len, len);

    /* the strict reference, where it calls the input well-formed */
    if (len <= REF_MAX || generated) {
        size_t ref_len = 0, ref_end = 0;
        int rv = reference(in, len, refout, &ref_len, &ref_end);
        if (generated) {
            SB_FUZZ_ASSERT(rv == C_COMPLETE && ref_end == gen_end, "the reference refuses a generated encoding (%s)", cname(rv));
            SB_FUZZ_ASSERT(ref_len == payload_len && memcmp(refout, data + 1, ref_len) == 0,
                           "the reference decodes a generated encoding wrong");
        }
        if (rv != C_MALFORMED) {
            SB_FUZZ_ASSERT(first.verdict == rv, "picohttpparser says %s, the reference %s", cname(first.verdict), cname(rv));
            SB_FUZZ_ASSERT(first.out_len == ref_len && memcmp(first.out, refout, ref_len) == 0,
                           "picohttpparser decoded %zu bytes, the reference %zu", first.out_len, ref_len);
            SB_FUZZ_ASSERT(rv != C_COMPLETE || first.end == ref_end, "picohttpparser ends at %zu, the reference at %zu", first.end,
                           ref_end);
        }
    }

    /* the reader: the decoded bytes, capped */
    for (int mode = 0; mode < 2; ++mode) {
        sb_http1_reader_t r;
        int got, want;

        s.mode = mode;
        sb_http1_init(&r, 0, cap);
        got = read_response(&r, in, len, !open, &s);
        SB_FUZZ_ASSERT(r.res.body_len <= cap, "a body of %zu bytes above the cap %zu", r.res.body_len, cap);
        if (first.verdict == C_MALFORMED || first.out_len > cap || (first.verdict == C_INCOMPLETE && !open))
            want = 2;
        else
            want = first.verdict == C_COMPLETE ? 1 : 0;
        SB_FUZZ_ASSERT(got == want, "the reader says %d, expected %d (%s, %zu bytes, cap %zu)", got, want, cname(first.verdict),
                       first.out_len, cap);
        if (got != 2)
            SB_FUZZ_ASSERT(r.res.status == 200 && r.res.body_len == first.out_len &&
                               (first.out_len == 0 || memcmp(r.res.body, first.out, first.out_len) == 0),
                           "the reader's body (%zu bytes) differs from the decoded bytes (%zu)", r.res.body_len, first.out_len);
        sb_http1_dispose(&r);
    }
    free(first.out);
    return 0;
}
