/*
 * broker/fetch: the egress machinery http.fetch runs on (PROTOCOL.md section
 * 6a): the address policy (ipclass.h), the resolver (resolver.h), the pinned
 * client (client.h, http1.h), and here the process-wide settings they run
 * under. The http.fetch handler itself, which drives them hop by hop, lives
 * with the other handlers (broker/svc/fetch).
 */
#ifndef SB_FETCH_H
#define SB_FETCH_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <openssl/ssl.h>
#include "fetch/ipclass.h"
#include "sb/status.h"

/** process-wide egress settings (config key "egress"); immutable, shared by workers */
typedef struct st_sb_fetch_conf_t {
    sb_egress_policy_t *policy;
    char *dns_servers; /* "ip:port,..." or NULL for /etc/resolv.conf */
    unsigned dns_timeout_ms, dns_tries;
    char *ca_file;
    SSL_CTX *ssl_ctx;
    uint64_t deadline_ms, connect_timeout_ms;
    unsigned max_redirects;
    size_t max_body;
    size_t keepalive_pool_size; /* parked connections per worker (default 64); 0: never reused */
    uint64_t keepalive_idle_ms;
    /* import.fetch (PROTOCOL.md section 6c): modules and module bytes per run, bytes per module */
    uint64_t import_max_modules, import_max_total_bytes;
    size_t import_max_module_bytes;
} sb_fetch_conf_t;

/**
 * Validates the "egress" object and builds the settings.
 * @param err receives every problem, naming the key
 */
SB_WARN_UNUSED sb_status_t sb_fetch_conf_create(const json_t *egress, sb_fetch_conf_t **out, char *err, size_t errsz);
void sb_fetch_conf_free(sb_fetch_conf_t *c);

#endif
