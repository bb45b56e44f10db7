/*
 * broker/http: the state of the server and of each worker thread, as the
 * routes (rpc.c, admin.c, health.c) and the request helpers (async.c,
 * reply.c) read it. The life cycle that creates and runs it is server.h.
 */
#ifndef SB_WORKER_H
#define SB_WORKER_H

#include <stdatomic.h>
#include <pthread.h>
#include <h2o.h>
#include "conf/config.h"
#include "store/store.h"
#include "svc/dispatch.h"
#include "fetch/fetch.h"
#include "svc/target.h"
#include "svc/handlers.h"
#include "svc/decide/decide.h"

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
    sb_decide_ctx_t *decide; /* the decider's exchanges on this loop (svc/decide/decide.h) */
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t shutdown_receiver;
    size_t inflight;    /* requests not yet disposed, loop-local */
    size_t connections; /* accepted connections not yet closed, loop-local */
    int stopping;
    /* frees the egress contexts and pools (svc) once their last user is gone, those a reload replaced included */
    sb_reaper_t reaper;
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
    sb_decide_conf_t *_Atomic decide_conf; /* NULL: no decider (calls a decide rule holds are refused) */
    sb_targets_t *_Atomic targets;
    struct st_sb_retired_t *retired;  /* what reloads replaced: freed by sb_server_free_retired after the workers stop */
    _Atomic unsigned long generation; /* counts reloads, so a worker that was starting during one notices it */
    h2o_globalconf_t pub_conf, admin_conf;
    int listen_fd, admin_fd;
    uint8_t admin_secret_hash[32];
    sb_files_pool_t *files; /* the files threads, created with the server and joined when it is disposed of */
    sb_worker_t *workers;
    unsigned nworkers;
    _Atomic int stopping;
};

/** the worker running on this thread (worker.c) */
extern __thread sb_worker_t *sb_current_worker;

#endif
