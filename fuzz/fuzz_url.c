/*
 * libFuzzer driver for broker/call/url.c (sb_url_parse, sb_url_resolve,
 * sb_url_hostport, sb_url_host_header): the parser that decides where
 * http.fetch connects.
 *
 * Input: a URL, optionally followed by a NUL byte and a redirect Location.
 *
 * Properties of every parsed URL (and of every resolved redirect):
 *  - the canonical host is non-empty, at most 253 bytes, lowercase, with no
 *    trailing dot, no '%', '@', '[', ']', '\' or byte outside printable ASCII;
 *    a name is LDH labels of 1..63 bytes; an IPv4 host is the inet_ntop form
 *    of addr.v4, an IPv6 host the inet_ntop form of addr.v6;
 *  - the port is 1..65535, and 80/443 by scheme when not explicit;
 *  - the target starts with '/', holds only printable ASCII, and no '#',
 *    '\', '"', '<', '>', '`', '{', '}';
 *  - re-serialising (scheme://host[:port]target) and parsing again gives the
 *    same struct: the canonical form is a fixed point;
 *  - hostport and Host header writers terminate and truncate for any buffer
 *    size, and agree with the struct.
 * A refusal is SB_E_BAD_ARGS with a static `why`.
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "call/url.h"
#include "fuzz.h"

static void check_host(const sb_url_t *u)
{
    char buf[INET6_ADDRSTRLEN];

    SB_FUZZ_ASSERT(u->host_len == strlen(u->host), "host_len %zu, strlen %zu", u->host_len, strlen(u->host));
    SB_FUZZ_ASSERT(u->host_len >= 1 && u->host_len <= SB_URL_MAX_HOST, "host length %zu", u->host_len);
    SB_FUZZ_ASSERT(u->host[u->host_len - 1] != '.', "trailing dot in \"%s\"", u->host);
    for (size_t i = 0; i < u->host_len; ++i) {
        unsigned char c = (unsigned char)u->host[i];
        SB_FUZZ_ASSERT(c > 0x20 && c < 0x7f, "non-printable byte in host");
        SB_FUZZ_ASSERT(!(c >= 'A' && c <= 'Z'), "uppercase in host \"%s\"", u->host);
        SB_FUZZ_ASSERT(c != '%' && c != '@' && c != '[' && c != ']' && c != '\\' && c != '/', "'%c' in host \"%s\"", c, u->host);
    }
    switch (u->host_kind) {
    case SB_URL_HOST_NAME: {
        size_t start = 0;
        for (size_t i = 0; i <= u->host_len; ++i) {
            if (i == u->host_len || u->host[i] == '.') {
                SB_FUZZ_ASSERT(i - start >= 1 && i - start <= 63, "label of %zu bytes in \"%s\"", i - start, u->host);
                SB_FUZZ_ASSERT(u->host[start] != '-' && u->host[i - 1] != '-', "label with an edge hyphen in \"%s\"", u->host);
                start = i + 1;
            } else {
                char c = u->host[i];
                SB_FUZZ_ASSERT((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-', "non-LDH name \"%s\"", u->host);
            }
        }
        break;
    }
    case SB_URL_HOST_IPV4:
        SB_FUZZ_ASSERT(inet_ntop(AF_INET, &u->addr.v4, buf, sizeof(buf)) != NULL && strcmp(buf, u->host) == 0,
                       "IPv4 host \"%s\" is not the canonical form of its address", u->host);
        break;
    case SB_URL_HOST_IPV6:
        SB_FUZZ_ASSERT(inet_ntop(AF_INET6, &u->addr.v6, buf, sizeof(buf)) != NULL && strcmp(buf, u->host) == 0,
                       "IPv6 host \"%s\" is not the canonical form of its address", u->host);
        break;
    default:
        SB_FUZZ_ASSERT(0, "host kind %d", (int)u->host_kind);
    }
}

static size_t serialise(const sb_url_t *u, char *buf, size_t bufsz)
{
    int n = snprintf(buf, bufsz, "%s://%s%s%s", u->scheme == SB_URL_HTTPS ? "https" : "http",
                     u->host_kind == SB_URL_HOST_IPV6 ? "[" : "", u->host, u->host_kind == SB_URL_HOST_IPV6 ? "]" : "");
    size_t len = (size_t)n;

    if (u->port_explicit)
        len += (size_t)snprintf(buf + len, bufsz - len, ":%u", (unsigned)u->port);
    SB_FUZZ_ASSERT(len + u->target_len < bufsz, "serialised URL too long");
    memcpy(buf + len, u->target, u->target_len);
    return len + u->target_len;
}

static void check_writers(const sb_url_t *u, size_t bufsz)
{
    char full[512], hp[512], *small;
    size_t n, m;

    /* hostport: always with the port */
    n = sb_url_hostport(u, full, sizeof(full));
    snprintf(hp, sizeof(hp), u->host_kind == SB_URL_HOST_IPV6 ? "[%s]:%u" : "%s:%u", u->host, (unsigned)u->port);
    SB_FUZZ_ASSERT(n == strlen(full) && strcmp(full, hp) == 0, "hostport \"%s\", want \"%s\"", full, hp);
    /* Host header: no port when it is the scheme's default */
    m = sb_url_host_header(u, hp, sizeof(hp));
    SB_FUZZ_ASSERT(m == strlen(hp), "host header length");
    if (u->port == (u->scheme == SB_URL_HTTPS ? 443 : 80))
        SB_FUZZ_ASSERT(strchr(u->host_kind == SB_URL_HOST_IPV6 ? strchr(hp, ']') : hp, ':') == NULL, "default port in Host header");
    /* truncation at any buffer size, into an exact-size heap buffer */
    if (bufsz != 0 && (small = malloc(bufsz)) != NULL) {
        m = sb_url_hostport(u, small, bufsz);
        SB_FUZZ_ASSERT(m < bufsz && m == strlen(small) && strncmp(small, full, m) == 0, "truncated hostport");
        m = sb_url_host_header(u, small, bufsz);
        SB_FUZZ_ASSERT(m < bufsz && m == strlen(small) && strncmp(small, hp, m) == 0, "truncated host header");
        free(small);
    }
}

static void check_url(const sb_url_t *u, size_t bufsz)
{
    static char buf[SB_MAX_URL + 512];
    sb_url_t v;
    const char *why = NULL;
    size_t len;
    sb_status_t st;

    SB_FUZZ_ASSERT(u->scheme == SB_URL_HTTP || u->scheme == SB_URL_HTTPS, "scheme %d", (int)u->scheme);
    check_host(u);
    SB_FUZZ_ASSERT(u->port >= 1, "port 0");
    if (!u->port_explicit)
        SB_FUZZ_ASSERT(u->port == (u->scheme == SB_URL_HTTPS ? 443 : 80), "implicit port %u", (unsigned)u->port);
    SB_FUZZ_ASSERT(u->target_len == strlen(u->target) && u->target_len >= 1 && u->target_len <= SB_MAX_URL, "target length");
    SB_FUZZ_ASSERT(u->target[0] == '/', "target \"%s\" does not start with '/'", u->target);
    for (size_t i = 0; i < u->target_len; ++i) {
        unsigned char c = (unsigned char)u->target[i];
        SB_FUZZ_ASSERT(c > 0x20 && c < 0x7f, "byte %02x in target", c);
        SB_FUZZ_ASSERT(strchr("#\\\"<>`{}", c) == NULL, "'%c' in target \"%s\"", c, u->target);
    }
    check_writers(u, bufsz);

    /* the canonical form is a fixed point */
    len = serialise(u, buf, sizeof(buf));
    if (len > SB_MAX_URL)
        return; /* a long IDN host can make the canonical form longer than the cap */
    st = sb_url_parse(buf, len, &v, &why);
    SB_FUZZ_ASSERT(st == SB_OK, "canonical form \"%.*s\" refused: %s", (int)len, buf, why);
    SB_FUZZ_ASSERT(v.scheme == u->scheme && v.host_kind == u->host_kind && v.port == u->port && v.port_explicit == u->port_explicit,
                   "canonical form \"%.*s\" parses differently", (int)len, buf);
    SB_FUZZ_ASSERT(v.host_len == u->host_len && strcmp(v.host, u->host) == 0, "host \"%s\" became \"%s\"", u->host, v.host);
    SB_FUZZ_ASSERT(v.target_len == u->target_len && strcmp(v.target, u->target) == 0, "target \"%s\" became \"%s\"", u->target,
                   v.target);
    if (u->host_kind == SB_URL_HOST_IPV4)
        SB_FUZZ_ASSERT(memcmp(&v.addr.v4, &u->addr.v4, sizeof(v.addr.v4)) == 0, "IPv4 address changed");
    if (u->host_kind == SB_URL_HOST_IPV6)
        SB_FUZZ_ASSERT(memcmp(&v.addr.v6, &u->addr.v6, sizeof(v.addr.v6)) == 0, "IPv6 address changed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t ulen = nul != NULL ? (size_t)(nul - data) : size;
    static sb_url_t u, r;
    const char *why = NULL;
    char *s;
    sb_status_t st;

    if (size > SB_MAX_URL + 1024)
        return 0;
    if ((s = calloc(1, ulen != 0 ? ulen : 1)) == NULL)
        abort();
    if (ulen != 0)
        memcpy(s, data, ulen);
    st = sb_url_parse(s, ulen, &u, &why);
    free(s);
    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS, "status %d", (int)st);
        SB_FUZZ_ASSERT(why != NULL && *why != '\0', "refusal without a reason");
        return 0;
    }
    check_url(&u, size % 300);

    if (nul != NULL) {
        size_t rlen = size - ulen - 1;
        char *ref = calloc(1, rlen != 0 ? rlen : 1);
        if (ref == NULL)
            abort();
        if (rlen != 0)
            memcpy(ref, nul + 1, rlen);
        why = NULL;
        st = sb_url_resolve(&u, ref, rlen, &r, &why);
        free(ref);
        if (st == SB_OK)
            check_url(&r, rlen % 300);
        else
            SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS && why != NULL, "resolve status %d", (int)st);
    }
    return 0;
}
