/*
 * broker/fetch: the one strict URL parser of http.fetch.
 *
 * Everything that decides where the broker connects (the capability check,
 * the address policy, the resolver, the redirect follower) works on an
 * sb_url_t produced here, never on the guest's spelling. The parser accepts
 * a deliberately narrow subset of WHATWG/RFC 3986 absolute http(s) URLs and
 * rejects every notation that parsers and resolvers disagree about (numeric
 * host forms other than the canonical dotted quad, percent-encoded hosts,
 * userinfo, zone ids, backslashes, whitespace and control bytes).
 */
#ifndef SB_FETCH_URL_H
#define SB_FETCH_URL_H

#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include "sb/limits.h"
#include "sb/status.h"

/* a DNS name is at most 253 bytes without the trailing dot (RFC 1035 section 2.3.4) */
#define SB_URL_MAX_HOST SB_MAX_HOST

typedef enum en_sb_url_scheme_t { SB_URL_HTTP = 0, SB_URL_HTTPS } sb_url_scheme_t;

typedef enum en_sb_url_host_kind_t {
    SB_URL_HOST_NAME = 0, /* an LDH name in A-label form, lowercase, no trailing dot */
    SB_URL_HOST_IPV4,     /* a canonical dotted quad; addr.v4 holds it */
    SB_URL_HOST_IPV6      /* a bracketed literal; host holds the inet_ntop form without brackets, addr.v6 the address */
} sb_url_host_kind_t;

/**
 * A parsed http(s) URL. Plain value type with fixed buffers: copy it freely,
 * nothing to free.
 */
typedef struct st_sb_url_t {
    sb_url_scheme_t scheme;
    sb_url_host_kind_t host_kind;
    /* canonical host, NUL-terminated: lowercase A-label name, dotted quad, or IPv6 text without brackets */
    char host[SB_URL_MAX_HOST + 1];
    size_t host_len;
    union {
        struct in_addr v4;
        struct in6_addr v6;
    } addr;
    /* the effective port: the explicit one, else 80 (http) or 443 (https) */
    uint16_t port;
    /* 1 when the URL spelled a port (even the default one) */
    int port_explicit;
    /*
     * origin-form request target, NUL-terminated: path (dot segments removed,
     * "/" when empty) plus "?query" when present; the fragment is dropped.
     * Bytes outside printable ASCII and a few unsafe ASCII characters are
     * percent-encoded (WHATWG path percent-encode set).
     */
    char target[SB_MAX_URL + 1];
    size_t target_len;
} sb_url_t;

/**
 * Parses an absolute http or https URL.
 * @param s the URL bytes (need not be NUL-terminated; an embedded NUL is refused)
 * @param len their length; more than SB_MAX_URL is refused
 * @param out filled on success (unspecified on failure)
 * @param why on failure receives a short static reason, e.g. "userinfo is not allowed"; may be NULL
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_url_parse(const char *s, size_t len, sb_url_t *out, const char **why);

/**
 * Resolves a redirect Location against the URL that produced it (RFC 3986
 * section 5.2): absolute, scheme-relative ("//host/p"), absolute-path ("/p"),
 * query-only ("?q"), fragment-only or empty (the base itself) and relative-path
 * references (merged with the base directory, dot segments removed). The
 * composed string goes through sb_url_parse, so every rule above applies to
 * the result; a non-http(s) scheme is refused.
 * @param base the current URL
 * @param ref the Location value (need not be NUL-terminated)
 * @param len its length
 * @param out filled on success; may not alias base
 * @param why on failure receives a short static reason; may be NULL
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_url_resolve(const sb_url_t *base, const char *ref, size_t len, sb_url_t *out, const char **why);

/**
 * Writes "host:port" with the IPv6 host bracketed and the effective port always
 * present (the form the allowlist and the audit log use).
 * @return the length written (the output is NUL-terminated and truncated to bufsz)
 */
size_t sb_url_hostport(const sb_url_t *u, char *buf, size_t bufsz);

/**
 * Writes the Host header value: host (IPv6 bracketed), plus ":port" unless the
 * port is the scheme's default (as WHATWG URL.host does).
 * @return the length written (the output is NUL-terminated and truncated to bufsz)
 */
size_t sb_url_host_header(const sb_url_t *u, char *buf, size_t bufsz);

#endif
