/*
 * libFuzzer driver for broker/http/framing.c, sb_http_framing_check: the framing decision on a request
 * head as received from the network (RFC 9112 sections 5.2, 6.1, 6.3).
 *
 * Input: the bytes of a request head (and whatever follows it).
 *
 * Properties:
 *  - the answer is NULL or one of the documented reasons, and deterministic;
 *  - whenever the head parses (the answer is not "does not parse"), it agrees with a reference written
 *    here from the RFC on raw lines, not with picohttpparser: lines end at LF (an optional CR before it
 *    dropped), the head ends at the first empty line, a field line starting with SP or HTAB is obs-fold,
 *    the name is what precedes ':' (ASCII case-insensitive), the value what follows it without leading
 *    SP/HTAB; the reference derives the same verdict and the same reason;
 *  - the bytes after the head never matter: the head followed by other bytes gets the same answer;
 *  - an accepted head has at most one framing field, on HTTP/1.0 never Transfer-Encoding;
 *  - the quick check (sb_http_framing_plain, given the request line's own method and target) never
 *    accepts a head the full check refuses for its framing, or one the reference refuses.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "http/framing.h"
#include "fuzz.h"

static const char *const reasons[] = {
    "the request head does not parse",          "obs-fold line in the request head",
    "Transfer-Encoding in an HTTP/1.0 request", "both Transfer-Encoding and Content-Length",
    "more than one Transfer-Encoding field",    "Transfer-Encoding other than chunked",
    "more than one Content-Length field",       "Content-Length is not a decimal number",
};

static int lc_eq(const uint8_t *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    if (n != m)
        return 0;
    for (size_t i = 0; i < n; ++i) {
        uint8_t c = p[i];
        if (c >= 'A' && c <= 'Z')
            c = (uint8_t)(c + 32);
        if (c != (uint8_t)lit[i])
            return 0;
    }
    return 1;
}

/* the reference verdict, or "?" when the raw lines do not give one; *head_end: bytes of the head */
static const char *reference(const uint8_t *d, size_t n, size_t *head_end)
{
    size_t pos = 0, line = 0, ncl = 0, nte = 0;
    const uint8_t *te = NULL, *cl = NULL;
    size_t te_len = 0, cl_len = 0;
    int minor = -1, fold = 0;

    for (;;) {
        const uint8_t *nl = memchr(d + pos, '\n', n - pos);
        size_t end, len;
        if (nl == NULL)
            return "?";
        end = (size_t)(nl - d);
        len = end - pos;
        if (len != 0 && d[pos + len - 1] == '\r')
            --len;
        if (line == 0) {
            /* the request line ends with HTTP/1.<digit> */
            if (len < 8 || memcmp(d + pos + len - 8, "HTTP/1.", 7) != 0)
                return "?";
            minor = d[pos + len - 1] - '0';
        } else if (len == 0) {
            *head_end = end + 1;
            break;
        } else if (d[pos] == ' ' || d[pos] == '\t') {
            fold = 1;
        } else {
            const uint8_t *colon = memchr(d + pos, ':', len), *v;
            size_t vlen;
            if (colon == NULL)
                return "?";
            v = colon + 1;
            vlen = (size_t)(d + pos + len - v);
            while (vlen != 0 && (*v == ' ' || *v == '\t'))
                ++v, --vlen;
            if (lc_eq(d + pos, (size_t)(colon - (d + pos)), "content-length"))
                ++ncl, cl = v, cl_len = vlen;
            else if (lc_eq(d + pos, (size_t)(colon - (d + pos)), "transfer-encoding"))
                ++nte, te = v, te_len = vlen;
        }
        pos = end + 1;
        ++line;
    }
    if (fold)
        return reasons[1];
    if (nte != 0) {
        if (minor == 0)
            return reasons[2];
        if (ncl != 0)
            return reasons[3];
        if (nte != 1)
            return reasons[4];
        return lc_eq(te, te_len, "chunked") ? NULL : reasons[5];
    }
    if (ncl > 1)
        return reasons[6];
    if (ncl == 1) {
        if (cl_len == 0)
            return reasons[7];
        for (size_t i = 0; i < cl_len; ++i)
            if (cl[i] < '0' || cl[i] > '9')
                return reasons[7];
    }
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *why = sb_http_framing_check((const char *)data, size), *ref;
    size_t head_end = 0, i;
    static uint8_t buf[1 << 17];
    static const char tail[] = "Content-Length: 1\r\nTransfer-Encoding: x\r\n \r\n\r\n\xff\x00 bytes of the next request";

    for (i = 0; i < sizeof(reasons) / sizeof(reasons[0]); ++i)
        if (why == reasons[i] || (why != NULL && strcmp(why, reasons[i]) == 0))
            break;
    SB_FUZZ_ASSERT(why == NULL || i < sizeof(reasons) / sizeof(reasons[0]), "undocumented reason \"%s\"", why);
    SB_FUZZ_ASSERT(why == sb_http_framing_check((const char *)data, size), "not deterministic");
    {
        /* the first line's method and target (up to its first two spaces), as the route gets them from h2o */
        const uint8_t *nl = memchr(data, '\n', size);
        size_t first = nl != NULL ? (size_t)(nl - data) : size;
        const uint8_t *sp1 = memchr(data, ' ', first), *sp2 = NULL;
        if (sp1 != NULL)
            sp2 = memchr(sp1 + 1, ' ', first - (size_t)(sp1 + 1 - data));
        if (sp2 != NULL && sb_http_framing_plain((const char *)data, size, (const char *)data, (size_t)(sp1 - data),
                                                 (const char *)sp1 + 1, (size_t)(sp2 - sp1 - 1))) {
            /* a head it passes is accepted, or one h2o would not have parsed (other fields' syntax is not its job) */
            SB_FUZZ_ASSERT(why == NULL || strcmp(why, reasons[0]) == 0, "the quick check passed a head refused for \"%s\"", why);
            ref = reference(data, size, &head_end);
            SB_FUZZ_ASSERT(ref == NULL || strcmp(ref, "?") == 0, "the quick check passed a head the reference refuses: \"%s\"",
                           ref);
            head_end = 0;
        }
    }
    if (why != NULL && strcmp(why, reasons[0]) == 0)
        return 0; /* h2o would not have parsed it either: it never reaches a route */

    ref = reference(data, size, &head_end);
    if (ref != NULL && strcmp(ref, "?") == 0)
        return 0; /* lines the reference cannot read alone */
    SB_FUZZ_ASSERT(ref == NULL ? why == NULL : (why != NULL && strcmp(ref, why) == 0), "verdict \"%s\", the reference says \"%s\"",
                   why ? why : "accepted", ref ? ref : "accepted");

    /* what follows the head does not matter */
    if (head_end + sizeof(tail) <= sizeof(buf)) {
        const char *again;
        memcpy(buf, data, head_end);
        memcpy(buf + head_end, tail, sizeof(tail));
        again = sb_http_framing_check((const char *)buf, head_end + sizeof(tail));
        SB_FUZZ_ASSERT((again == NULL) == (why == NULL) && (why == NULL || strcmp(again, why) == 0),
                       "the bytes after the head changed the verdict");
    }
    return 0;
}
