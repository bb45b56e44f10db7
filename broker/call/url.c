/*
 * broker/call: the one strict URL parser of http.fetch (call/url.h).
 *
 * Why so strict: an SSRF filter is only as good as its agreement with the
 * code that finally connects. Every URL notation on which two parsers (or a
 * parser and a resolver) disagree is a bypass waiting to happen, so instead of
 * interpreting those notations we refuse them:
 *  - backslashes (WHATWG treats them as '/' in special URLs, RFC 3986 does not);
 *  - whitespace and control bytes (WHATWG strips tabs and newlines anywhere);
 *  - userinfo ("http://allowed.example@evil.example/");
 *  - percent-encoded host bytes ("127.0.0.%31");
 *  - zone ids in IPv6 literals ("[fe80::1%25eth0]");
 *  - numeric hosts other than the canonical dotted quad: inet_aton, WHATWG and
 *    getaddrinfo all accept "2130706433", "0x7f.1", "0177.0.0.1" or "127.1" as
 *    127.0.0.1 while a name-based check sees an opaque string. WHATWG's rule
 *    "the last label is numeric, so it is an IPv4 address" decides what is an
 *    address; we then accept only the one spelling everybody agrees on.
 * Internationalised names go through UTS#46 (libidn2, non-transitional, NFC)
 * and the mapped result is validated again as ASCII, so "１２７.０.０.１" ends up
 * as the IPv4 address it maps to and "a／b" (fullwidth solidus) is refused.
 * Trailing dots are removed before any check ("localhost." is "localhost").
 */
#include <arpa/inet.h>
#include <idn2.h>
#include <stdio.h>
#include <string.h>
#include "call/url.h"

/* a raw (pre-UTS#46) host longer than this cannot map to a valid name we would accept */
#define MAX_RAW_HOST 1024u
#define MAX_LABEL 63u

static const char why_empty[] = "empty URL";
static const char why_too_long[] = "URL is too long";
static const char why_ctl[] = "control character or whitespace";
static const char why_backslash[] = "backslash is not allowed";
static const char why_not_absolute[] = "not an absolute URL";
static const char why_scheme[] = "unsupported scheme";
static const char why_slashes[] = "missing \"//\" after the scheme";
static const char why_userinfo[] = "userinfo is not allowed";
static const char why_empty_host[] = "empty host";
static const char why_pct_host[] = "percent-encoded host is not allowed";
static const char why_zone[] = "zone id is not allowed";
static const char why_ipv6[] = "invalid IPv6 literal";
static const char why_port[] = "invalid port";
static const char why_ipv4[] = "non-canonical IPv4 address";
static const char why_host[] = "invalid host name";
static const char why_host_long[] = "host name is too long";
static const char why_idn[] = "invalid internationalised host name";

/* a bounded output cursor: every write checks the room left */
typedef struct st_outbuf_t {
    char *p;
    size_t len, cap; /* cap excludes the NUL */
    int overflow;
} outbuf_t;

static void ob_putc(outbuf_t *ob, char c)
{
    if (ob->len == ob->cap) {
        ob->overflow = 1;
        return;
    }
    ob->p[ob->len++] = c;
}

static void ob_put(outbuf_t *ob, const char *s, size_t n)
{
    if (n > ob->cap - ob->len) {
        ob->overflow = 1;
        return;
    }
    memcpy(ob->p + ob->len, s, n);
    ob->len += n;
}

static int is_alpha(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static char to_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static int ieq(const char *a, size_t alen, const char *lit)
{
    size_t i, n = strlen(lit);

    if (alen != n)
        return 0;
    for (i = 0; i != n; ++i)
        if (to_lower(a[i]) != lit[i])
            return 0;
    return 1;
}

/* bytes we re-encode in the request target (the WHATWG path percent-encode set, minus what we already refuse) */
static int needs_pct(unsigned char c)
{
    return c >= 0x80 || c == '"' || c == '<' || c == '>' || c == '`' || c == '{' || c == '}';
}

/* 1..65535, decimal digits only, at most 5 of them */
static int parse_port(const char *p, size_t n, uint16_t *port)
{
    unsigned v = 0;
    size_t i;

    if (n == 0 || n > 5)
        return 0;
    for (i = 0; i != n; ++i) {
        if (!is_digit((unsigned char)p[i]))
            return 0;
        v = v * 10 + (unsigned)(p[i] - '0');
    }
    if (v == 0 || v > 65535)
        return 0;
    *port = (uint16_t)v;
    return 1;
}

/*
 * WHATWG "ends in a number": the last label is all decimal digits, or "0x"/"0X"
 * followed by hex digits (possibly none). Such a host is an IPv4 address.
 */
static int last_label_is_numeric(const char *h, size_t n)
{
    size_t start = n, i;

    while (start != 0 && h[start - 1] != '.')
        --start;
    if (start == n)
        return 0;
    if (n - start >= 2 && h[start] == '0' && (h[start + 1] == 'x' || h[start + 1] == 'X')) {
        for (i = start + 2; i != n; ++i)
            if (!is_hex((unsigned char)h[i]))
                return 0;
        return 1;
    }
    for (i = start; i != n; ++i)
        if (!is_digit((unsigned char)h[i]))
            return 0;
    return 1;
}

/* exactly four decimal parts 0..255, no leading zeros, no empty parts */
static int is_canonical_quad(const char *h, size_t n)
{
    size_t i = 0, parts = 0;

    while (parts != 4) {
        size_t start = i;
        unsigned v = 0;
        while (i != n && is_digit((unsigned char)h[i]) && i - start < 3)
            v = v * 10 + (unsigned)(h[i++] - '0');
        if (i == start || v > 255 || (i - start > 1 && h[start] == '0'))
            return 0;
        if (++parts != 4) {
            if (i == n || h[i] != '.')
                return 0;
            ++i;
        }
    }
    return i == n;
}

/* LDH labels of 1..63 bytes, no leading or trailing hyphen (RFC 1123 section 2.1), total <= 253 */
static int is_ldh_name(const char *h, size_t n)
{
    size_t start = 0, i;

    if (n == 0 || n > SB_URL_MAX_HOST)
        return 0;
    for (i = 0; i <= n; ++i) {
        if (i == n || h[i] == '.') {
            size_t ll = i - start;
            if (ll == 0 || ll > MAX_LABEL || h[start] == '-' || h[i - 1] == '-')
                return 0;
            start = i + 1;
        } else {
            unsigned char c = (unsigned char)h[i];
            if (!((c >= 'a' && c <= 'z') || is_digit(c) || c == '-'))
                return 0;
        }
    }
    return 1;
}

static int needs_idna(const char *h, size_t n)
{
    size_t i;

    for (i = 0; i != n; ++i) {
        if ((unsigned char)h[i] >= 0x80)
            return 1;
        /* an A-label: let libidn2 check that it decodes to a valid U-label */
        if ((i == 0 || h[i - 1] == '.') && n - i >= 4 && ieq(h + i, 4, "xn--"))
            return 1;
    }
    return 0;
}

/* the host of a non-bracketed authority: UTS#46, trailing dot, then IPv4-or-LDH */
static sb_status_t parse_host(const char *raw, size_t n, sb_url_t *out, const char **why)
{
    char *h = out->host;
    size_t hl, i;
    int stripped = 0;

    if (n == 0) {
        *why = why_empty_host;
        return SB_E_BAD_ARGS;
    }
    if (memchr(raw, '%', n) != NULL) {
        *why = why_pct_host;
        return SB_E_BAD_ARGS;
    }
    if (n > MAX_RAW_HOST) {
        *why = why_host_long;
        return SB_E_BAD_ARGS;
    }
    if (n > 1 && raw[n - 1] == '.') {
        --n;
        stripped = 1;
    }

    if (needs_idna(raw, n)) {
        char in[MAX_RAW_HOST + 1];
        char *mapped = NULL;
        memcpy(in, raw, n);
        in[n] = '\0';
        if (idn2_to_ascii_8z(in, &mapped, IDN2_NONTRANSITIONAL | IDN2_NFC_INPUT) != IDN2_OK) {
            idn2_free(mapped);
            *why = why_idn;
            return SB_E_BAD_ARGS;
        }
        hl = strlen(mapped);
        /* a non-ASCII full stop ("。") maps to '.', and is a trailing dot like any other */
        if (!stripped && hl > 1 && mapped[hl - 1] == '.')
            --hl;
        if (hl > SB_URL_MAX_HOST) {
            idn2_free(mapped);
            *why = why_host_long;
            return SB_E_BAD_ARGS;
        }
        memcpy(h, mapped, hl);
        idn2_free(mapped);
    } else {
        if (n > SB_URL_MAX_HOST) {
            *why = why_host_long;
            return SB_E_BAD_ARGS;
        }
        hl = n;
        for (i = 0; i != hl; ++i)
            h[i] = to_lower(raw[i]);
    }
    h[hl] = '\0';
    out->host_len = hl;

    if (hl == 0 || (hl == 1 && h[0] == '.')) {
        *why = why_empty_host;
        return SB_E_BAD_ARGS;
    }
    if (last_label_is_numeric(h, hl)) {
        if (!is_canonical_quad(h, hl) || inet_pton(AF_INET, h, &out->addr.v4) != 1) {
            *why = why_ipv4;
            return SB_E_BAD_ARGS;
        }
        out->host_kind = SB_URL_HOST_IPV4;
        return SB_OK;
    }
    if (!is_ldh_name(h, hl)) {
        *why = why_host;
        return SB_E_BAD_ARGS;
    }
    out->host_kind = SB_URL_HOST_NAME;
    return SB_OK;
}

static sb_status_t parse_ipv6(const char *p, size_t n, sb_url_t *out, const char **why)
{
    char buf[INET6_ADDRSTRLEN];

    if (memchr(p, '%', n) != NULL) {
        *why = why_zone;
        return SB_E_BAD_ARGS;
    }
    if (n == 0 || n >= sizeof(buf)) {
        *why = why_ipv6;
        return SB_E_BAD_ARGS;
    }
    memcpy(buf, p, n);
    buf[n] = '\0';
    if (inet_pton(AF_INET6, buf, &out->addr.v6) != 1 || inet_ntop(AF_INET6, &out->addr.v6, out->host, sizeof(out->host)) == NULL) {
        *why = why_ipv6;
        return SB_E_BAD_ARGS;
    }
    out->host_len = strlen(out->host);
    out->host_kind = SB_URL_HOST_IPV6;
    return SB_OK;
}

static sb_status_t parse_authority(const char *a, size_t n, sb_url_t *out, const char **why)
{
    const char *port = NULL;
    size_t port_len = 0;
    sb_status_t st;

    if (memchr(a, '@', n) != NULL) {
        *why = why_userinfo;
        return SB_E_BAD_ARGS;
    }
    if (n != 0 && a[0] == '[') {
        const char *rb = memchr(a, ']', n);
        if (rb == NULL) {
            *why = memchr(a, '%', n) != NULL ? why_zone : why_ipv6;
            return SB_E_BAD_ARGS;
        }
        if ((st = parse_ipv6(a + 1, (size_t)(rb - a) - 1, out, why)) != SB_OK)
            return st;
        if (rb + 1 != a + n) {
            if (rb[1] != ':') {
                *why = why_ipv6;
                return SB_E_BAD_ARGS;
            }
            port = rb + 2;
            port_len = (size_t)(a + n - port);
        }
    } else {
        const char *colon = memchr(a, ':', n);
        size_t hn = colon != NULL ? (size_t)(colon - a) : n;
        if (memchr(a, '[', hn) != NULL || memchr(a, ']', hn) != NULL) {
            *why = why_host;
            return SB_E_BAD_ARGS;
        }
        if ((st = parse_host(a, hn, out, why)) != SB_OK)
            return st;
        if (colon != NULL) {
            port = colon + 1;
            port_len = (size_t)(a + n - port);
        }
    }

    out->port = out->scheme == SB_URL_HTTPS ? 443 : 80;
    out->port_explicit = 0;
    if (port != NULL) {
        if (!parse_port(port, port_len, &out->port)) {
            *why = why_port;
            return SB_E_BAD_ARGS;
        }
        out->port_explicit = 1;
    }
    return SB_OK;
}

/*
 * RFC 3986 section 5.2.4 on an absolute path, in place (the output never
 * grows). The path is a sequence of "/segment" units; "." drops its unit,
 * ".." drops its unit and the previous one, and a trailing "." or ".." leaves
 * the directory's trailing '/'.
 */
static size_t remove_dot_segments(char *p, size_t len)
{
    size_t r = 0, w = 0;

    while (r < len) {
        size_t end = r + 1, seglen;
        while (end < len && p[end] != '/')
            ++end;
        seglen = end - r - 1;
        if (seglen == 1 && p[r + 1] == '.') {
            if (end == len)
                p[w++] = '/';
        } else if (seglen == 2 && p[r + 1] == '.' && p[r + 2] == '.') {
            while (w != 0 && p[w - 1] != '/')
                --w;
            if (w != 0)
                --w;
            if (end == len)
                p[w++] = '/';
        } else {
            memmove(p + w, p + r, end - r);
            w += end - r;
        }
        r = end;
    }
    return w;
}

static void put_encoded(outbuf_t *ob, const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t i;

    for (i = 0; i != n; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (needs_pct(c)) {
            ob_putc(ob, '%');
            ob_putc(ob, hex[c >> 4]);
            ob_putc(ob, hex[c & 15]);
        } else {
            ob_putc(ob, (char)c);
        }
    }
}

/* rest = everything after the authority: path, "?query", "#fragment", each optional */
static sb_status_t parse_target(const char *rest, size_t n, sb_url_t *out, const char **why)
{
    outbuf_t ob = {out->target, 0, SB_MAX_URL, 0};
    const char *hash = memchr(rest, '#', n), *q;
    size_t path_len;

    if (hash != NULL)
        n = (size_t)(hash - rest);
    q = memchr(rest, '?', n);
    path_len = q != NULL ? (size_t)(q - rest) : n;

    if (path_len == 0) {
        ob_putc(&ob, '/');
    } else {
        put_encoded(&ob, rest, path_len);
        if (!ob.overflow)
            ob.len = remove_dot_segments(ob.p, ob.len);
    }
    if (q != NULL)
        put_encoded(&ob, q, n - path_len);
    if (ob.overflow) {
        *why = why_too_long;
        return SB_E_BAD_ARGS;
    }
    out->target[ob.len] = '\0';
    out->target_len = ob.len;
    return SB_OK;
}

sb_status_t sb_url_parse(const char *s, size_t len, sb_url_t *out, const char **why)
{
    const char *dummy, *auth, *end;
    size_t i, scheme_len;
    sb_status_t st;

    if (why == NULL)
        why = &dummy;
    if (s == NULL || len == 0) {
        *why = why_empty;
        return SB_E_BAD_ARGS;
    }
    if (len > SB_MAX_URL) {
        *why = why_too_long;
        return SB_E_BAD_ARGS;
    }
    for (i = 0; i != len; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f) {
            *why = why_ctl;
            return SB_E_BAD_ARGS;
        }
        if (c == '\\') {
            *why = why_backslash;
            return SB_E_BAD_ARGS;
        }
    }

    /* scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":" (RFC 3986 section 3.1) */
    for (scheme_len = 0; scheme_len != len && s[scheme_len] != ':'; ++scheme_len) {
        unsigned char c = (unsigned char)s[scheme_len];
        if (!(is_alpha(c) || (scheme_len != 0 && (is_digit(c) || c == '+' || c == '-' || c == '.')))) {
            *why = why_not_absolute;
            return SB_E_BAD_ARGS;
        }
    }
    if (scheme_len == 0 || scheme_len == len) {
        *why = why_not_absolute;
        return SB_E_BAD_ARGS;
    }
    if (ieq(s, scheme_len, "http")) {
        out->scheme = SB_URL_HTTP;
    } else if (ieq(s, scheme_len, "https")) {
        out->scheme = SB_URL_HTTPS;
    } else {
        *why = why_scheme;
        return SB_E_BAD_ARGS;
    }
    if (len - scheme_len < 3 || s[scheme_len + 1] != '/' || s[scheme_len + 2] != '/') {
        *why = why_slashes;
        return SB_E_BAD_ARGS;
    }

    auth = s + scheme_len + 3;
    for (end = auth; end != s + len && *end != '/' && *end != '?' && *end != '#'; ++end)
        ;
    if ((st = parse_authority(auth, (size_t)(end - auth), out, why)) != SB_OK)
        return st;
    return parse_target(end, (size_t)(s + len - end), out, why);
}

/* RFC 3986 section 3.1: does the reference start with "scheme:"? */
static int has_scheme(const char *r, size_t n)
{
    size_t i;

    if (n == 0 || !is_alpha((unsigned char)r[0]))
        return 0;
    for (i = 1; i != n; ++i) {
        unsigned char c = (unsigned char)r[i];
        if (c == ':')
            return 1;
        if (!(is_alpha(c) || is_digit(c) || c == '+' || c == '-' || c == '.'))
            return 0;
    }
    return 0;
}

static void put_origin(outbuf_t *ob, const sb_url_t *base)
{
    char port[8];
    int n;

    ob_put(ob, base->scheme == SB_URL_HTTPS ? "https://" : "http://", base->scheme == SB_URL_HTTPS ? 8 : 7);
    if (base->host_kind == SB_URL_HOST_IPV6)
        ob_putc(ob, '[');
    ob_put(ob, base->host, base->host_len);
    if (base->host_kind == SB_URL_HOST_IPV6)
        ob_putc(ob, ']');
    if (base->port_explicit) {
        n = snprintf(port, sizeof(port), ":%u", (unsigned)base->port);
        ob_put(ob, port, (size_t)n);
    }
}

sb_status_t sb_url_resolve(const sb_url_t *base, const char *ref, size_t len, sb_url_t *out, const char **why)
{
    char buf[SB_MAX_URL + 1];
    outbuf_t ob = {buf, 0, SB_MAX_URL, 0};
    const char *dummy;
    size_t base_path_len;

    if (why == NULL)
        why = &dummy;
    if (len > SB_MAX_URL) {
        *why = why_too_long;
        return SB_E_BAD_ARGS;
    }
    if (ref == NULL)
        len = 0;
    if (has_scheme(ref, len))
        return sb_url_parse(ref, len, out, why);

    {
        const char *q = memchr(base->target, '?', base->target_len);
        base_path_len = q != NULL ? (size_t)(q - base->target) : base->target_len;
    }
    if (len >= 2 && ref[0] == '/' && ref[1] == '/') {
        /* scheme-relative: everything but the scheme comes from the reference */
        ob_put(&ob, base->scheme == SB_URL_HTTPS ? "https:" : "http:", base->scheme == SB_URL_HTTPS ? 6 : 5);
        ob_put(&ob, ref, len);
    } else {
        put_origin(&ob, base);
        if (len == 0 || ref[0] == '#') {
            /* same document: the base without its fragment (which it never has) */
            ob_put(&ob, base->target, base->target_len);
        } else if (ref[0] == '/') {
            ob_put(&ob, ref, len);
        } else if (ref[0] == '?') {
            ob_put(&ob, base->target, base_path_len);
            ob_put(&ob, ref, len);
        } else {
            /* merge (RFC 3986 section 5.2.3): the base path up to its last '/', then the reference */
            size_t dir = base_path_len;
            while (dir != 0 && base->target[dir - 1] != '/')
                --dir;
            if (dir == 0)
                ob_putc(&ob, '/');
            ob_put(&ob, base->target, dir);
            ob_put(&ob, ref, len);
        }
    }
    if (ob.overflow) {
        *why = why_too_long;
        return SB_E_BAD_ARGS;
    }
    return sb_url_parse(buf, ob.len, out, why);
}

size_t sb_url_hostport(const sb_url_t *u, char *buf, size_t bufsz)
{
    int n = u->host_kind == SB_URL_HOST_IPV6 ? snprintf(buf, bufsz, "[%s]:%u", u->host, (unsigned)u->port)
                                             : snprintf(buf, bufsz, "%s:%u", u->host, (unsigned)u->port);
    if (n < 0)
        return 0;
    return bufsz == 0 ? 0 : (size_t)n < bufsz ? (size_t)n : bufsz - 1;
}

size_t sb_url_host_header(const sb_url_t *u, char *buf, size_t bufsz)
{
    unsigned dflt = u->scheme == SB_URL_HTTPS ? 443 : 80;
    int n;

    if (u->port == dflt)
        n = u->host_kind == SB_URL_HOST_IPV6 ? snprintf(buf, bufsz, "[%s]", u->host) : snprintf(buf, bufsz, "%s", u->host);
    else
        n = u->host_kind == SB_URL_HOST_IPV6 ? snprintf(buf, bufsz, "[%s]:%u", u->host, (unsigned)u->port)
                                             : snprintf(buf, bufsz, "%s:%u", u->host, (unsigned)u->port);
    if (n < 0)
        return 0;
    return bufsz == 0 ? 0 : (size_t)n < bufsz ? (size_t)n : bufsz - 1;
}
