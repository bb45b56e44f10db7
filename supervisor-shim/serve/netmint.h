/*
 * sandbox-shim serve: network tokens for runs without bindings.
 *
 * A run that asks for `net` without bindings gets its guest's fetch relayed
 * as http.fetch under a token of its own: serve mints it on the broker's
 * admin listener with the net-mint credential (a second admin secret that can
 * mint only tokens whose manifest is {net, timeoutMs}, and revoke only those;
 * PROTOCOL.md section 9), and revokes it when the run ends. Blocking calls,
 * made from the run's own process (serve.c forks one per run), with a hard
 * deadline each; plain HTTP only, as the admin listener is private.
 */
#ifndef SB_SHIM_NETMINT_H
#define SB_SHIM_NETMINT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <jansson.h>
#include "sb/status.h"
#include "relay/url.h"

/* the run id prefix the broker reserves for the net-mint credential */
#define SB_SHIM_NETMINT_RUN_PREFIX "net-mint:"
#define SB_SHIM_NETMINT_MAX_SECRET 1024u
/* each admin exchange, connect to last byte */
#define SB_SHIM_NETMINT_TIMEOUT_MS 5000

typedef struct st_sb_shim_netmint_t {
    sb_shim_url_t url; /* the admin listener's origin */
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char secret[SB_SHIM_NETMINT_MAX_SECRET + 1];
} sb_shim_netmint_t;

/**
 * Mints a token whose manifest is {net, timeoutMs} for one run.
 * @param net the run's capabilities.net (a non-empty array of strings)
 * @param token receives the 64-hex token (65 bytes)
 * @param err on failure, why (never holds the secret or a token)
 * @return SB_OK, SB_E_FORBIDDEN (the broker refused: err has its status and message) or
 *         SB_E_UNAVAILABLE (no answer in time, or not one we understand)
 */
SB_WARN_UNUSED sb_status_t sb_shim_netmint_mint(const sb_shim_netmint_t *nm, const json_t *net, const json_t *imports,
                                                int64_t timeout_ms, char token[65], char *err, size_t errsz);

/**
 * Revokes a token minted by sb_shim_netmint_mint.
 * @return SB_OK (the broker answered 204) or SB_E_UNAVAILABLE (err says why)
 */
SB_WARN_UNUSED sb_status_t sb_shim_netmint_revoke(const sb_shim_netmint_t *nm, const char *token, char *err, size_t errsz);

#endif
