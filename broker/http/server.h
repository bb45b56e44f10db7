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

#include <stdatomic.h>
#include <pthread.h>
#include <h2o.h>
#include "conf/config.h"
#include "store/store.h"
#include "svc/dispatch.h"
#include "fetch/fetch.h"
#include "svc/target.h"
#include "svc/handlers.h"

typedef struct st_sb_server_t sb_server_t;

typedef struct st_sb_worker_t {
    sb_server_t *server;
    unsigned index;
    pthread_t tid;
    h2o_loop_t *loop;
    h2o_context_t ctx;
    h2o_context_t admin_ctx; /* worker 0 only */
    h2o_accept_ctx_t accept_ctx, admin_accept_ctx;
    h2o_socket_t *listener, *admin_listener;
    sb_store_conn_t *store;
    sb_svc_env_t svc;
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t shutdown_receiver;
    size_t inflight;    /* requests not yet disposed, loop-local */
    size_t connections; /* accepted connections not yet closed, loop-local */
    int stopping;
    /* contexts replaced by a reload, destroyed once they are idle (loop-local) */
    sb_fetch_ctx_t *retired_fetch[8];
    sb_pg_pool_t *retired_pg[8];
    h2o_timeout_t housekeeping_timeout;
    h2o_timeout_entry_t housekeeping;
    /* worker 0: the admin secret replaced by the last reload stays valid until this time */
    uint8_t previous_secret_hash[32];
    int64_t previous_secret_until;
} sb_worker_t;

struct st_sb_server_t {
    /*
     * The reloadable part. A reload publishes new objects and never frees the
     * ones it replaces (they are a few KiB, and handlers in flight may still
     * hold pointers into them); their per-worker contexts are retired.
     */
    sb_config_t *_Atomic conf;
    sb_store_t *store;
    sb_fetch_conf_t *_Atomic fetch_conf;
    sb_targets_t *_Atomic targets;
    struct st_sb_retired_t *retired; /* what reloads replaced: freed by sb_server_free_retired after the workers stop */
    h2o_globalconf_t pub_conf, admin_conf;
    int listen_fd, admin_fd;
    uint8_t admin_secret_hash[32];
    sb_worker_t *workers;
    unsigned nworkers;
    _Atomic int stopping;
};

/**
 * Binds both listeners (so address errors surface before any thread starts),
 * connects the token store and prepares the workers.
 * @return SB_OK, or SB_E_UNAVAILABLE with a log line naming the problem
 */
SB_WARN_UNUSED sb_status_t sb_server_init(sb_server_t *s, sb_config_t *conf, sb_store_t *store, sb_fetch_conf_t *fetch_conf,
                                          sb_targets_t *targets);
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
void sb_server_reload(sb_server_t *s, sb_config_t *conf, sb_fetch_conf_t *fetch_conf, sb_targets_t *targets);
/** frees the objects reloads replaced; only once every worker has stopped */
void sb_server_free_retired(sb_server_t *s);
void sb_server_dispose(sb_server_t *s);

/* handlers (rpc.c, admin.c) */
int sb_rpc_on_req(h2o_handler_t *self, h2o_req_t *req);
int sb_admin_on_req(h2o_handler_t *self, h2o_req_t *req);
int sb_health_on_req(h2o_handler_t *self, h2o_req_t *req);

/* helpers shared by the handlers */

/** the worker running on this thread */
extern __thread sb_worker_t *sb_current_worker;

/**
 * State of a request that may outlive it (a pending token-store call).
 * Allocated with sb_async_attach; one reference belongs to the request and is
 * dropped when h2o disposes of the request, at which point `req` turns NULL.
 * Asynchronous operations take a reference of their own and must check `req`
 * before answering.
 */
typedef struct st_sb_async_t {
    int _refcnt;
    h2o_req_t *req;
    sb_worker_t *worker;
    void (*_dispose)(struct st_sb_async_t *);
} sb_async_t;

sb_async_t *sb_async_attach(h2o_req_t *req, size_t size, void (*dispose)(sb_async_t *));
void sb_async_retain(sb_async_t *a);
void sb_async_release(sb_async_t *a);

void sb_send_bytes(h2o_req_t *req, int status, const char *reason, const char *ctype, const char *body, size_t len);

#endif
