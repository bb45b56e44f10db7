/*
 * broker/fetch/conf: the process-wide egress settings (fetch.h, config key
 * "egress"): the address policy, the DNS servers, the TLS context and the
 * deadlines every http.fetch exchange runs under.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fetch/client.h"
#include "fetch/fetch.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "util/util.h"

static int get_uint(const json_t *o, const char *key, uint64_t min, uint64_t max, uint64_t def, uint64_t *out, char *err,
                    size_t errsz)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < (json_int_t)min || json_integer_value(v) > (json_int_t)max) {
        snprintf(err, errsz, "egress.%s: expected an integer from %llu to %llu", key, (unsigned long long)min,
                 (unsigned long long)max);
        return -1;
    }
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

sb_status_t sb_fetch_conf_create(const json_t *egress, sb_fetch_conf_t **out, char *err, size_t errsz)
{
    static const char *known[] = {"dns_servers",
                                  "dns_timeout_ms",
                                  "dns_tries",
                                  "deny_cidrs",
                                  "allow_cidrs",
                                  "deny_local_interfaces",
                                  "ca_file",
                                  "deadline_ms",
                                  "connect_timeout_ms",
                                  "max_redirects",
                                  "keepalive_pool_size",
                                  "keepalive_idle_ms",
                                  "import_max_modules",
                                  "import_max_module_bytes",
                                  "import_max_total_bytes",
                                  NULL};
    sb_fetch_conf_t *c = sb_mem_calloc(1, sizeof(*c));
    const char *k, *why = NULL;
    json_t *v, *servers, *dli;
    uint64_t u;

    json_object_foreach((json_t *)egress, k, v)
    {
        size_t i = 0;
        while (known[i] != NULL && strcmp(known[i], k) != 0)
            ++i;
        if (known[i] == NULL) {
            snprintf(err, errsz, "egress.%s: unknown key", k);
            goto Error;
        }
    }
    if ((servers = json_object_get(egress, "dns_servers")) != NULL) {
        char csv[1024];
        size_t len = 0, i;
        json_t *s;
        if (!json_is_array(servers) || json_array_size(servers) == 0 || json_array_size(servers) > 8) {
            snprintf(err, errsz, "egress.dns_servers: expected 1-8 \"ip:port\" strings");
            goto Error;
        }
        json_array_foreach(servers, i, s)
        {
            if (!json_is_string(s) || json_string_length(s) > 64) {
                snprintf(err, errsz, "egress.dns_servers[%zu]: expected an \"ip:port\" string", i);
                goto Error;
            }
            len += (size_t)snprintf(csv + len, sizeof(csv) - len, "%s%s", i != 0 ? "," : "", json_string_value(s));
        }
        c->dns_servers = sb_mem_strdup(csv);
    }
    if (get_uint(egress, "dns_timeout_ms", 50, 30000, 1500, &u, err, errsz) != 0)
        goto Error;
    c->dns_timeout_ms = (unsigned)u;
    if (get_uint(egress, "dns_tries", 1, 5, 2, &u, err, errsz) != 0)
        goto Error;
    c->dns_tries = (unsigned)u;
    if (get_uint(egress, "deadline_ms", 100, 120000, 9000, &c->deadline_ms, err, errsz) != 0)
        goto Error;
    if (get_uint(egress, "connect_timeout_ms", 50, 60000, 3000, &c->connect_timeout_ms, err, errsz) != 0)
        goto Error;
    if (get_uint(egress, "max_redirects", 0, 5, 5, &u, err, errsz) != 0)
        goto Error;
    c->max_redirects = (unsigned)u;
    /* on by default: 64 parked connections per worker (docs/config.md says why); 0 turns reuse off */
    if (get_uint(egress, "keepalive_pool_size", 0, 1024, 64, &u, err, errsz) != 0)
        goto Error;
    c->keepalive_pool_size = (size_t)u;
    if (get_uint(egress, "keepalive_idle_ms", 100, 300000, 5000, &c->keepalive_idle_ms, err, errsz) != 0)
        goto Error;
    c->max_body = SB_MAX_HTTP_BODY;
    /* import.fetch caps: a module answers in one response, so at most the fetch body cap */
    if (get_uint(egress, "import_max_modules", 1, 4096, 256, &c->import_max_modules, err, errsz) != 0)
        goto Error;
    if (get_uint(egress, "import_max_module_bytes", 1024, SB_MAX_HTTP_BODY, SB_MAX_HTTP_BODY, &u, err, errsz) != 0)
        goto Error;
    c->import_max_module_bytes = (size_t)u;
    if (get_uint(egress, "import_max_total_bytes", 1024, (uint64_t)1 << 30, (uint64_t)64 << 20, &c->import_max_total_bytes, err,
                 errsz) != 0)
        goto Error;
    if ((v = json_object_get(egress, "ca_file")) != NULL) {
        if (!json_is_string(v)) {
            snprintf(err, errsz, "egress.ca_file: expected a path");
            goto Error;
        }
        c->ca_file = sb_mem_strdup(json_string_value(v));
    }
    dli = json_object_get(egress, "deny_local_interfaces");
    if (dli != NULL && !json_is_boolean(dli)) {
        snprintf(err, errsz, "egress.deny_local_interfaces: expected true or false");
        goto Error;
    }
    if (sb_egress_policy_create(json_object_get(egress, "deny_cidrs"), json_object_get(egress, "allow_cidrs"),
                                dli == NULL || json_is_true(dli), &c->policy, err, errsz) != SB_OK)
        goto Error;
    if ((c->ssl_ctx = sb_http_ssl_ctx_create(c->ca_file, &why)) == NULL) {
        snprintf(err, errsz, "%s", why);
        goto Error;
    }
    *out = c;
    return SB_OK;
Error:
    sb_fetch_conf_free(c);
    return SB_E_BAD_ARGS;
}

void sb_fetch_conf_free(sb_fetch_conf_t *c)
{
    if (c == NULL)
        return;
    if (c->policy != NULL)
        sb_egress_policy_free(c->policy);
    if (c->ssl_ctx != NULL)
        SSL_CTX_free(c->ssl_ctx);
    sb_mem_free(c->dns_servers);
    sb_mem_free(c->ca_file);
    sb_mem_free(c);
}
