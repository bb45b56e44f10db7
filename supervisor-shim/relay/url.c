/*
 * Broker URL validation and normalisation (see url.h). RFC 3986 section 3
 * gives the grammar; we accept a strict subset of it.
 */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include "relay/url.h"

static int lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int is_host_char(int c)
{
    return (c >= 'a' && c <= 'z') || is_digit(c) || c == '-' || c == '.';
}

static int is_v6_char(int c)
{
    return (c >= 'a' && c <= 'f') || is_digit(c) || c == ':' || c == '.';
}

/* RFC 3986 pchar plus '/': unreserved, pct-encoded, sub-delims, ':' and '@' */
static int is_path_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) ||
           (c != '\0' && strchr("-._~!$&'()*+,;=:@/%", c) != NULL);
}

/* RFC 3986 section 3.4: query = *( pchar / "/" / "?" ) */
static int is_query_char(int c)
{
    return is_path_char(c) || c == '?';
}

static int prefix_ci(const char *s, const char *pre)
{
    for (; *pre != '\0'; ++s, ++pre)
        if (lower((unsigned char)*s) != *pre)
            return 0;
    return 1;
}

sb_status_t sb_shim_url_parse(const char *s, sb_shim_url_t *out, const char **why)
{
    const char *p, *auth, *auth_end, *host, *host_end, *port_at = NULL, *query = NULL;
    size_t hlen, plen, qlen = 0;
    unsigned long port = 0;
    int bracketed = 0;

    memset(out, 0, sizeof(*out));
    for (p = s; *p != '\0'; ++p) {
        unsigned char c = (unsigned char)*p;
        if (c <= 0x20 || c >= 0x7f || c == '\\') {
            *why = "broker URL contains whitespace, control, non-ASCII or backslash characters";
            return SB_E_BAD_ARGS;
        }
        if (c == '#') {
            *why = "broker URL must not have a fragment";
            return SB_E_BAD_ARGS;
        }
        if (c == '?' && query == NULL)
            query = p;
    }
    if (prefix_ci(s, "http://")) {
        auth = s + 7;
    } else if (prefix_ci(s, "https://")) {
        auth = s + 8;
        out->https = 1;
    } else {
        *why = "broker URL must start with http:// or https://";
        return SB_E_BAD_ARGS;
    }
    /* the authority ends at the path or at the query */
    for (auth_end = auth; *auth_end != '\0' && *auth_end != '/' && auth_end != query; ++auth_end)
        ;
    if (memchr(auth, '@', (size_t)(auth_end - auth)) != NULL) {
        *why = "broker URL must not carry userinfo";
        return SB_E_BAD_ARGS;
    }

    /* host: [v6] or reg-name / IPv4 */
    if (auth < auth_end && *auth == '[') {
        bracketed = 1;
        host = auth + 1;
        host_end = memchr(host, ']', (size_t)(auth_end - host));
        if (host_end == NULL) {
            *why = "broker URL has an unterminated IPv6 literal";
            return SB_E_BAD_ARGS;
        }
        if (host_end + 1 < auth_end) {
            if (host_end[1] != ':') {
                *why = "broker URL has junk after the IPv6 literal";
                return SB_E_BAD_ARGS;
            }
            port_at = host_end + 2;
        }
    } else {
        host = auth;
        host_end = memchr(auth, ':', (size_t)(auth_end - auth));
        if (host_end != NULL)
            port_at = host_end + 1;
        else
            host_end = auth_end;
    }
    hlen = (size_t)(host_end - host);
    if (hlen == 0 || hlen > SB_SHIM_MAX_HOST) {
        *why = "broker URL has an empty or overlong host";
        return SB_E_BAD_ARGS;
    }
    for (size_t i = 0; i < hlen; ++i) {
        int c = lower((unsigned char)host[i]);
        if (bracketed ? !is_v6_char(c) : !is_host_char(c)) {
            *why = "broker URL host has invalid characters";
            return SB_E_BAD_ARGS;
        }
        out->host[i] = (char)c;
    }
    if (bracketed && strchr(out->host, ':') == NULL) {
        *why = "broker URL has an invalid IPv6 literal";
        return SB_E_BAD_ARGS;
    }
    if (!bracketed && (out->host[0] == '.' || out->host[0] == '-')) {
        *why = "broker URL host has invalid characters";
        return SB_E_BAD_ARGS;
    }

    /* port: 1..65535, digits only, at most 5 of them */
    if (port_at != NULL) {
        size_t n = (size_t)(auth_end - port_at);
        if (n == 0 || n > 5) {
            *why = "broker URL has an invalid port";
            return SB_E_BAD_ARGS;
        }
        for (size_t i = 0; i < n; ++i) {
            if (!is_digit((unsigned char)port_at[i])) {
                *why = "broker URL has an invalid port";
                return SB_E_BAD_ARGS;
            }
            port = port * 10 + (unsigned long)(port_at[i] - '0');
        }
        if (port == 0 || port > 65535) {
            *why = "broker URL has an invalid port";
            return SB_E_BAD_ARGS;
        }
    } else {
        port = out->https ? 443 : 80;
    }
    out->port = (uint16_t)port;
    if (port == (out->https ? 443u : 80u))
        snprintf(out->host_header, sizeof(out->host_header), bracketed ? "[%s]" : "%s", out->host);
    else
        snprintf(out->host_header, sizeof(out->host_header), bracketed ? "[%s]:%lu" : "%s:%lu", out->host, port);

    /* path: "/" when absent; only RFC 3986 path characters; one trailing '/' dropped */
    plen = (size_t)((query != NULL ? query : auth_end + strlen(auth_end)) - auth_end);
    if (plen == 0) {
        out->path[0] = '/';
    } else {
        if (plen > SB_SHIM_MAX_URL_PATH) {
            *why = "broker URL path is too long";
            return SB_E_BAD_ARGS;
        }
        for (size_t i = 0; i < plen; ++i) {
            if (!is_path_char((unsigned char)auth_end[i])) {
                *why = "broker URL path has invalid characters";
                return SB_E_BAD_ARGS;
            }
        }
        memcpy(out->path, auth_end, plen);
        out->path[plen] = '\0';
        if (plen > 1 && out->path[plen - 1] == '/')
            out->path[plen - 1] = '\0';
    }

    /* query: compared and sent byte for byte; an empty one ("?" alone) is no query */
    if (query != NULL) {
        qlen = strlen(query + 1);
        if (qlen > SB_SHIM_MAX_URL_QUERY) {
            *why = "broker URL query is too long";
            return SB_E_BAD_ARGS;
        }
        for (size_t i = 0; i < qlen; ++i) {
            if (!is_query_char((unsigned char)query[1 + i])) {
                *why = "broker URL query has invalid characters";
                return SB_E_BAD_ARGS;
            }
        }
        memcpy(out->query, query + 1, qlen + 1);
    }
    snprintf(out->target, sizeof(out->target), qlen != 0 ? "%s?%s" : "%s", out->path, out->query);
    return SB_OK;
}

int sb_shim_url_equal(const sb_shim_url_t *a, const sb_shim_url_t *b)
{
    return a->https == b->https && a->port == b->port && strcmp(a->host, b->host) == 0 && strcmp(a->path, b->path) == 0 &&
           strcmp(a->query, b->query) == 0;
}

sb_status_t sb_shim_url_resolve(const sb_shim_url_t *u, struct sockaddr_storage *addr, socklen_t *len, const char **why)
{
    struct addrinfo hints, *res = NULL;
    char port[8];
    int e;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof(port), "%u", (unsigned)u->port);
    if ((e = getaddrinfo(u->host, port, &hints, &res)) != 0 || res == NULL) { /* checksrc:allow (see url.h) */
        *why = e != 0 ? gai_strerror(e) : "no address";
        return SB_E_UNAVAILABLE;
    }
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return SB_OK;
}
