/*
 * sandbox-shim: the broker URL.
 *
 * The token is sent to this URL on every call, so it is parsed strictly and
 * once: http(s) scheme, a host (name, IPv4 or bracketed IPv6) and optional
 * port, and a path. Userinfo, queries, fragments, whitespace, control and
 * non-ASCII bytes and backslashes are refused, so no spelling trick can move
 * the token to another origin (PROTOCOL.md section 2, rule 2; RFC 6454 for
 * what an origin is).
 */
#ifndef SB_SHIM_URL_H
#define SB_SHIM_URL_H

#include <stdint.h>
#include "sb/status.h"

#define SB_SHIM_MAX_HOST 253u
#define SB_SHIM_MAX_URL_PATH 2048u

typedef struct st_sb_shim_url_t {
    int https;                              /* 1 for https */
    char host[SB_SHIM_MAX_HOST + 1];        /* lower-cased; IPv6 without brackets */
    uint16_t port;                          /* explicit or the scheme default */
    char host_header[SB_SHIM_MAX_HOST + 9]; /* host[:port] as sent in Host (brackets kept, default port dropped) */
    char path[SB_SHIM_MAX_URL_PATH + 1];    /* starts with '/' */
} sb_shim_url_t;

/**
 * Parses and validates a broker URL.
 * @param s NUL-terminated URL
 * @param out filled on success
 * @param why on failure, a static reason
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_shim_url_parse(const char *s, sb_shim_url_t *out, const char **why);

#endif
