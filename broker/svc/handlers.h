/*
 * broker/svc: the handler families, one folder each (svc/files, svc/pg,
 * svc/tools, svc/fetch), and what a worker calls them through. Each handler
 * runs a call that passed the capability check, on the worker's loop, and
 * answers through `cb` exactly once (possibly before returning). A handler
 * receives the typed call the check granted (call/call.h), never one with an
 * argument error (dispatch answers those), and reads its args only from it.
 * The call stays valid until the handler has answered; a handler that
 * outlives the call takes its own token reference (sb_token_addref).
 *
 * The families include this header and svc/target.h; nothing in broker/svc
 * itself includes a family's own headers, so the folders form no cycle.
 */
#ifndef SB_HANDLERS_H
#define SB_HANDLERS_H

#include <h2o.h>
#include "sb/method.h"
#include "call/call.h"
#include "svc/dispatch.h"
#include "svc/target.h"
#include "fetch/fetch.h"

/*
 * ---- ownership of the per-worker contexts a reload replaces ----
 * An egress context and a database pool are owned by the count of their live
 * users: the worker's current pointer holds one reference and every exchange
 * or job in flight holds one. A reload drops the worker's reference and
 * installs a new context; calls in flight finish on the one they started
 * with. When the last reference goes, the context is handed to its loop's
 * reaper and freed on the loop's next turn, never inside one of its own
 * callbacks (h2o is still walking the timer queues and sockets being freed).
 * Nothing is ever freed by age, and there is no bound on how many retired
 * contexts may wait for their last user.
 */
typedef struct st_sb_reaper_t {
    h2o_loop_t *loop;
    h2o_timeout_t now; /* 0 ms: a context linked here is freed on the next turn */
    size_t live;       /* contexts created on this reaper and not yet freed */
} sb_reaper_t;
void sb_reaper_init(sb_reaper_t *r, h2o_loop_t *loop);
/** 1 once every context created on the reaper has been freed */
int sb_reaper_idle(const sb_reaper_t *r);
/** only when idle: disposes of the reaper's timer queue */
void sb_reaper_dispose(sb_reaper_t *r);
/* for the contexts themselves: counted at creation, and freed by `entry->cb` on the next turn */
void sb_reaper__created(sb_reaper_t *r);
void sb_reaper__schedule(sb_reaper_t *r, h2o_timeout_entry_t *entry);
void sb_reaper__freed(sb_reaper_t *r);

/* ---- files (svc/files/files.c): files.read / write / list beneath the target's root ---- */
/**
 * The threads files operations run on, shared by the workers and owned by
 * the server: created with it, and destroyed (every job it accepted run, its
 * threads joined) after the workers have stopped. Threads that cannot be
 * started make files calls answer unavailable.
 */
typedef struct st_sb_files_pool_t sb_files_pool_t;
sb_files_pool_t *sb_files_pool_create(unsigned nthreads);
void sb_files_pool_destroy(sb_files_pool_t *pool);
/**
 * per-worker: delivers the results of the worker's jobs on its loop, through
 * `queue` (a queue of that loop, which outlives the context); create and
 * destroy on the loop's thread
 */
typedef struct st_sb_files_ctx_t sb_files_ctx_t;
sb_files_ctx_t *sb_files_ctx_create(sb_files_pool_t *pool, h2o_multithread_queue_t *queue);
/** jobs started on this context and not answered yet (the worker drains them before it stops) */
size_t sb_files_ctx_pending(const sb_files_ctx_t *ctx);
/** only once nothing is pending */
void sb_files_ctx_destroy(sb_files_ctx_t *ctx);
void sb_files_handle(const sb_svc_env_t *env, const sb_files_conf_t *fc, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                     void *arg);

/* ---- tools (svc/tools/tools.c): tools.list / tools.call on the target's MCP upstream ---- */
typedef struct st_sb_tools_ctx_t sb_tools_ctx_t;
/** per-worker MCP client state (sessions, in-flight counts) */
sb_tools_ctx_t *sb_tools_ctx_create(h2o_loop_t *loop);
void sb_tools_ctx_destroy(sb_tools_ctx_t *ctx);
void sb_tools_handle(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                     void *arg);
/*
 * the answer of an exhausted tools limit (max_calls, concurrency); max_calls
 * is counted per run in the token store by dispatch (sb_store_quota_tool_call)
 */
#define SB_TOOLS_MSG_LIMIT "sandbox custom tool limit exceeded"

/* ---- PostgreSQL (svc/pg/): collections.<n>.*, store.<ns>.*, collections.document_store.*, table globals ---- */
typedef struct st_sb_pg_pool_t sb_pg_pool_t;
/**
 * Per-worker connection pool; NULL database_url means no pool (data calls
 * answer not_implemented). Owned by references (sb_reaper_t): the caller gets
 * one, every queued or running job holds one.
 */
sb_pg_pool_t *sb_pg_pool_create(h2o_loop_t *loop, sb_reaper_t *reaper, const char *database_url, const sb_targets_t *targets,
                                unsigned pool_size);
/** drops the caller's reference; the pool closes once its last job has ended (NULL is a no-op) */
void sb_pg_pool_release(sb_pg_pool_t *pool);
/**
 * Blocking check of the targets' tables against the database (start-up,
 * --check-config and reload): the tables of collections, the document store
 * and table globals, and their key, allowlisted, value and scope columns
 * must exist, and the role must hold every privilege the manifests' verbs
 * can use on them (deploy/README.md lists the GRANT statements).
 * @param reachable set to 1 when the database answered
 * @return SB_OK, SB_E_BAD_ARGS (err names the path), SB_E_FORBIDDEN (err
 *         names the missing privileges by table) or SB_E_UNAVAILABLE (not reachable)
 */
SB_WARN_UNUSED sb_status_t sb_pg_check_schema(const char *database_url, const sb_targets_t *targets, int *reachable, char *err,
                                              size_t errsz);
/** 1 when a connection is up (readiness) */
int sb_pg_pool_healthy(sb_pg_pool_t *pool);
/**
 * What the pool's introspection found wrong that data calls will meet: the
 * privileges the role lacks, "table: PRIVILEGE[, ...]; ...", or NULL.
 * Owned by the pool; valid on the pool's worker until the pool is destroyed.
 */
const char *sb_pg_pool_problem(const sb_pg_pool_t *pool);
/** a call of a collection the target declares (or of its document store, which it wires): dispatch checked both */
void sb_pg_handle(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                  void *arg);
/**
 * globals.<name>.get of a table global: the configured row, clamped to the
 * token's scope (its value column, or the whole row; null when there is none).
 * No pool, or no connection up, answers unavailable.
 */
void sb_pg_global(const sb_svc_env_t *env, const sb_target_t *t, const sb_global_conf_t *gc, sb_token_t *tok, sb_dispatch_cb cb,
                  void *arg);

/* ---- http.fetch (svc/fetch/fetch.c): the broker's own handler, for every run whose manifest grants net ---- */
/**
 * Per-worker state: the resolver and the timers live on the worker's loop.
 * Owned by references (sb_reaper_t): the caller gets one, every exchange
 * holds one from its start until it has answered and is freed.
 */
typedef struct st_sb_fetch_ctx_t sb_fetch_ctx_t;
sb_fetch_ctx_t *sb_fetch_ctx_create(const sb_fetch_conf_t *conf, h2o_loop_t *loop, sb_reaper_t *reaper, const char **err);
/** drops the caller's reference; the resolver and timers go once the last exchange has ended (NULL is a no-op) */
void sb_fetch_ctx_release(sb_fetch_ctx_t *ctx);
/**
 * Runs http.fetch for a call that passed the capability check. The token is
 * referenced for the whole exchange (its net allowlist is rechecked on every
 * hop). The run's fetched-bytes quota is checked before the first byte is
 * sent and charged with every response body. The callback runs once, possibly
 * before this returns.
 */
void sb_fetch_start(sb_fetch_ctx_t *ctx, sb_store_conn_t *store, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                    void *arg);

#endif
