/*
 * broker/http: the net-mint credential (PROTOCOL.md section 9, "The net-mint
 * credential").
 *
 * A second admin secret (admin_net_mint_secret_file, or the environment's
 * SANDBOX_BROKER_ADMIN_NET_MINT_SECRET) for the one job the supervisor's
 * service needs the admin listener for: a token for a run that has `net` and
 * no bindings of its host. It can mint only tokens whose manifest holds
 * nothing but `net` and `timeoutMs`, under a reserved run id prefix, with no
 * target, no scope and a short life, and revoke only such tokens. Everything
 * else it asks for is refused with 403.
 */
#ifndef SB_ADMIN_NETMINT_H
#define SB_ADMIN_NETMINT_H

#include <h2o.h>

/* run ids of net-mint tokens start with this; the admin secret cannot mint under it */
#define SB_NETMINT_RUN_PREFIX "net-mint:"
/* the longest timeoutMs (so the longest life, + 30 s) a net-mint token may have */
#define SB_NETMINT_MAX_TIMEOUT_MS 30000

/**
 * Serves an /admin/ request whose bearer is not the admin secret, when it is
 * the net-mint credential. Runs on the admin listener's loop.
 * @param path the request path without its query
 * @return 1 when the request carried the net-mint credential and has been answered, else 0
 */
int sb_admin_netmint_on_req(h2o_req_t *req, h2o_iovec_t path);

/** 1 when `run_id` lies in the net-mint credential's reserved namespace */
int sb_admin_netmint_reserved(const char *run_id);

#endif
