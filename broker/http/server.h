/*
 * broker/http: the listeners, the worker threads and their h2o loops.
 *
 * Public listener: POST <rpc_path> (HTTP/1.1 only; the broker lives behind a
 * reverse proxy, and h2o 2.2.5's HTTP/2 has no rapid-reset mitigation), plus
 * GET /healthz and /readyz. Admin listener (its own address, loopback by
 * default, served by worker 0): /admin/v1/..., /healthz, /readyz, /metrics.
 */
#ifndef SB_SERVER_H
#define SB_SERVER_H

#include "http/worker.h"

/**
 * Binds both listeners (so address errors surface before any thread starts),
 * connects the token store and prepares the workers.
 * @return SB_OK, or SB_E_UNAVAILABLE with a log line naming the problem
 */
SB_WARN_UNUSED sb_status_t sb_server_init(sb_server_t *s, sb_config_t *conf, sb_store_t *store, sb_fetch_conf_t *fetch_conf,
                                          sb_decide_conf_t *decide_conf, sb_targets_t *targets);
/** runs the workers until sb_server_stop; returns when every worker has drained */
void sb_server_run(sb_server_t *s);
/** asks every worker to stop accepting and drain (async-signal-unsafe: call from a normal thread) */
void sb_server_stop(sb_server_t *s);
/**
 * Publishes a new configuration (already validated): every worker swaps its
 * egress context, targets and database pool at its next turn; calls in flight
 * finish on what they started with. Listeners, threads and the token store
 * are not reloadable.
 */
void sb_server_reload(sb_server_t *s, sb_config_t *conf, sb_fetch_conf_t *fetch_conf, sb_decide_conf_t *decide_conf,
                      sb_targets_t *targets);
/** frees the objects reloads replaced; only once every worker has stopped */
void sb_server_free_retired(sb_server_t *s);
void sb_server_dispose(sb_server_t *s);

#endif
