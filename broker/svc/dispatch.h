/*
 * broker/svc: dispatch of granted calls to the handlers a run's target wires.
 *
 * The capability check has already passed when these run. A method whose
 * target wires no handler answers not_implemented, by design: the manifest
 * says what a run may do, the target says what exists.
 */
#ifndef SB_DISPATCH_H
#define SB_DISPATCH_H

#include <h2o.h>
#include <msgpack.h>
#include "sb/method.h"
#include "sb/status.h"
#include "call/call.h"
#include "call/result.h"
#include "store/store.h"

struct st_sb_fetch_ctx_t;
struct st_sb_targets_t;
struct st_sb_tools_ctx_t;
struct st_sb_pg_pool_t;
struct st_sb_files_ctx_t;

/** what a worker offers the handlers */
typedef struct st_sb_svc_env_t {
    h2o_loop_t *loop;
    const struct st_sb_targets_t *targets;
    struct st_sb_fetch_ctx_t *fetch; /* NULL when egress could not be set up */
    struct st_sb_tools_ctx_t *tools;
    struct st_sb_pg_pool_t *pg;      /* NULL without database_url */
    struct st_sb_files_ctx_t *files; /* the worker's end of the server's files pool */
    sb_store_conn_t *store;          /* the worker's token store connection (quotas) */
} sb_svc_env_t;

/**
 * Runs a granted call. What the run's target does not wire answers
 * not_implemented; then a call whose args the decoder refused answers that
 * error (SB_CALL_ERR_ARGS), and only a whole call reaches a handler. The
 * callback runs exactly once, possibly before this returns. `call` must stay
 * valid until it has run.
 */
void sb_dispatch(const sb_svc_env_t *env, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb, void *arg);

#endif
