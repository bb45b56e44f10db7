/*
 * broker/fetch/resolver: DNS for http.fetch, c-ares on a worker's h2o loop.
 *
 * A and AAAA are asked as two separate queries (ares_getaddrinfo reports
 * success when one family failed, which would let a failing family hide an
 * answer). NODATA for one family is fine; NXDOMAIN, SERVFAIL, REFUSED, a
 * timeout or any other failure of either family rejects the name, and so do
 * zero addresses or more answers than SB_MAX_DNS_ANSWERS. Only DNS is asked:
 * no /etc/hosts, no search domains.
 */
#ifndef SB_FETCH_RESOLVER_H
#define SB_FETCH_RESOLVER_H

#include <h2o.h>
#include "sb/limits.h"
#include "sb/status.h"
#include "fetch/ipclass.h"

typedef struct st_sb_resolver_t sb_resolver_t;
typedef struct st_sb_resolve_t sb_resolve_t;

typedef struct st_sb_dns_result_t {
    sb_ip_t addrs[2 * SB_MAX_DNS_ANSWERS]; /* A answers first, then AAAA, in server order */
    size_t naddrs;
    const char *error; /* why the name was rejected (static) */
} sb_dns_result_t;

/** called once with SB_OK (res->naddrs > 0) or SB_E_EXECUTION (res->error says why) */
typedef void (*sb_resolve_cb)(void *arg, sb_status_t st, const sb_dns_result_t *res);

/**
 * Creates a resolver on `loop`.
 * @param servers "ip:port,ip:port" (c-ares CSV form), or NULL for the system's /etc/resolv.conf servers
 * @param err receives a static message on failure
 * @return the resolver, or NULL
 */
sb_resolver_t *sb_resolver_create(h2o_loop_t *loop, const char *servers, unsigned timeout_ms, unsigned tries, const char **err);
/** destroys the resolver; pending lookups are completed with SB_E_EXECUTION first */
void sb_resolver_destroy(sb_resolver_t *r);
/**
 * Looks `name` up (a canonical lowercase host name, never an IP literal).
 * @return a handle for sb_resolve_cancel, or NULL when the callback already ran (synchronously)
 */
sb_resolve_t *sb_resolve(sb_resolver_t *r, const char *name, sb_resolve_cb cb, void *arg);
/** the callback will not be called */
void sb_resolve_cancel(sb_resolve_t *q);

#endif
