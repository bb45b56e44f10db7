/*
 * sandbox-shim: the broker URL.
 *
 * The token is sent to this URL on every call, so it is parsed strictly and
 * once: http(s) scheme, a host (name, IPv4 or bracketed IPv6) and optional
 * port, a path and an optional query. Userinfo, fragments, whitespace,
 * control and non-ASCII bytes and backslashes are refused, so no spelling
 * trick can move the token to another origin (PROTOCOL.md section 2, rule 2;
 * RFC 6454 for what an origin is).
 *
 * The parsed URL is the normalised one of proto/PROTOCOL.md section 3
 * ("The broker URL"): scheme and host lower-cased, the scheme's default port
 * dropped, one trailing '/' of the path dropped (the path "/" stays), the
 * query kept byte for byte. Two URLs name the same broker exactly when their
 * normalised forms are equal (sb_shim_url_equal), and the shim always calls
 * the normalised form.
 */
#ifndef SB_SHIM_URL_H
#define SB_SHIM_URL_H

#include <stdint.h>
#include <sys/socket.h>
#include "sb/status.h"

#define SB_SHIM_MAX_HOST 253u
#define SB_SHIM_MAX_URL_PATH 2048u
#define SB_SHIM_MAX_URL_QUERY 2048u

typedef struct st_sb_shim_url_t {
    int https;                              /* 1 for https */
    char host[SB_SHIM_MAX_HOST + 1];        /* lower-cased; IPv6 without brackets */
    uint16_t port;                          /* explicit or the scheme default */
    char host_header[SB_SHIM_MAX_HOST + 9]; /* host[:port] as sent in Host (brackets kept, default port dropped) */
    char path[SB_SHIM_MAX_URL_PATH + 1];    /* starts with '/'; one trailing '/' dropped unless it is all */
    char query[SB_SHIM_MAX_URL_QUERY + 1];  /* after the '?', verbatim; "" when absent or empty */
    char target[SB_SHIM_MAX_URL_PATH + SB_SHIM_MAX_URL_QUERY + 2]; /* the request-target: path, then '?' query if any */
} sb_shim_url_t;

/**
 * Parses, validates and normalises a broker URL.
 * @param s NUL-terminated URL
 * @param out filled on success
 * @param why on failure, a static reason
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_shim_url_parse(const char *s, sb_shim_url_t *out, const char **why);

/**
 * Resolves the URL's host to one address (the first the system resolver gives).
 * This is the shim's one blocking name lookup (the house rule prefers c-ares,
 * which the shim does not link): the name is operator configuration, not
 * guest input, and it is looked up once, before any guest runs.
 * @param why on failure, a static reason
 * @return SB_OK or SB_E_UNAVAILABLE
 */
SB_WARN_UNUSED sb_status_t sb_shim_url_resolve(const sb_shim_url_t *u, struct sockaddr_storage *addr, socklen_t *len,
                                               const char **why);

/** 1 when both parsed URLs name the same broker endpoint (equal normalised forms), else 0 */
int sb_shim_url_equal(const sb_shim_url_t *a, const sb_shim_url_t *b);

#endif
