/*
 * Private to broker/store's Redis backend: what its files share. The backend
 * is split along its seams: store_redis_scripts.c (the Lua scripts),
 * store_redis_conf.c (the URL, the secrets and --check-config),
 * store_redis_conn.c (the h2o adapter for hiredis, a worker's connection, its
 * commands and Sentinel), store_redis.c (token records, quotas, the call path
 * and the admin requests) and store_redis_timeline.c (run timelines).
 * Everything here runs on one worker's loop unless it says otherwise.
 */
#ifndef SB_STORE_REDIS_INT_H
#define SB_STORE_REDIS_INT_H

#include <stdatomic.h>
#include <stdint.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include "store/store_int.h"
#include "util/util.h"

#define TICK_MS 50
#define HEARTBEAT_MS 1000
#define INV_HEARTBEAT_MS 250 /* the invalidation link's heartbeat (store_redis_conn.c) */
#define SENTINEL_QUERY_MS 1000
#define RECONNECT_FIRST_MS 100
#define RECONNECT_CAP_MS 250       /* refused or silent: probe often */
#define RECONNECT_SLOW_CAP_MS 3200 /* answered with an error that needs an operator */
#define REL_MAX 16                 /* distinct counters waiting to be given back, and the most one command carries */
#define CMD_MAX_ARGS (11 + 2 * REL_MAX)
#define RCACHE_SLOTS 1024
/* quota leases (store_redis.c): the most calls one lease asks for, and how long an idle lease is kept */
#define LEASE_MAX_CALLS 256
#define LEASE_IDLE_MS 100
/* blocks at least this big are refilled before they run out; smaller ones (a run near its limit) as calls need them */
#define LEASE_REFILL_MIN 16
/* prefix (at most 256) + "q:inflight:" + run id (at most SB_MAX_RUN_ID): never truncated, or the C and Lua keys would differ */
#define KEY_MAX (256 + 16 + SB_MAX_RUN_ID + 1)
#define RCACHE_MAX_RECORD 8192

/* ---- scripts (store_redis_scripts.c) ------------------------------------------------------------------------------------ */

enum { SC_LOOKUP = 0, SC_RELEASE, SC_FETCH_ADD, SC_MINT, SC_REVOKE_RUN, SC_INSPECT_RUN, SC_TOOL_CALL, SC_MODULES };

typedef struct st_sb_store_redis_script_t {
    const char *body;
    size_t len;
} sb_store_redis_script_t;

/** the scripts' text, indexed by SC_*; their digests are in sb_store_t.sha */
extern const sb_store_redis_script_t sb_store__redis_scripts[SB_STORE_NSCRIPTS];

/* ---- the h2o adapter for hiredis (store_redis_conn.c) ------------------------------------------------------------------ */

enum { L_DOWN = 0, L_CONNECTING, L_SETUP, L_UP };

typedef struct st_redis_conn_t redis_conn_t;

/* one hiredis connection: the data link, or one of the two sentinel links */
typedef struct st_link_t {
    redis_conn_t *rc;
    redisAsyncContext *ac; /* NULL once hiredis has let go of it */
    h2o_socket_t *sock;
    int reading, want_write, write_armed, freeing, in_flush;
    int state; /* L_DOWN means we are done with it: hiredis (or a deferred free) cleans up */
    h2o_loop_t *loop;
    h2o_timeout_t *flush_timeout; /* 0 ms, the worker's */
    h2o_timeout_entry_t wflush;   /* writes what the loop pass queued, once its I/O is handled */
    int64_t since;
    char addr[80]; /* "host:port" or the socket path, for the log */
} link_t;

/* ---- one worker's connection ------------------------------------------------------------------------------------------- */

/*
 * One token this worker knows, by its hash (a direct-mapped table): the
 * record it parsed, and the quota it leased for the token's run.
 */
typedef struct st_rcache_t {
    uint8_t hash[32];
    /* the parsed record (NULL: none), known by its mint id and length */
    sb_token_t *tok;
    char mint[32];
    size_t len;
    /*
     * 1 while Redis tracks the record for us: read while the invalidation
     * link was subscribed and no invalidation arrived between the read and
     * its answer. Only a tracked record answers a call without Redis.
     */
    int tracked;
    /* what the call-path script is told about it, formatted once: length, expiresAt, calls, concurrent */
    char num[4][21];
    size_t numlen[4];
    /*
     * The lease (NULL ltok: none): calls and concurrency slots counted in
     * the run's Redis counters and not used yet, and the slots in use by
     * calls this worker is answering. ltok names the run and its quotas.
     */
    sb_token_t *ltok;
    uint32_t calls_left, slots_free, slots_used;
    uint32_t next_block; /* the calls the next lease asks for: 1, doubling up to LEASE_MAX_CALLS */
    int asking;          /* a lookup asking for next_block is out: the others ask for one call */
    int64_t last_use;
} rcache_t;

struct st_redis_conn_t {
    sb_store_t *store;
    h2o_loop_t *loop;
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick;
    /* the data link, and the invalidation link its CLIENT TRACKING redirects to */
    link_t data, inv;
    long long inv_id;     /* the invalidation link's CLIENT ID */
    uint64_t inv_seq;     /* token invalidations received (and link losses): a read that saw it move is not kept */
    uint64_t seen_gen;    /* sb_store__redis_revoke_gen when this worker last looked */
    int64_t hb_sent;      /* when the heartbeat key was written and its invalidation not back yet (0: none) */
    int64_t hb_last;      /* when the heartbeat key was last written */
    char hb_key[KEY_MAX]; /* "<prefix>hb:<inv id>.<random>", tracked on its own */
    size_t hb_key_len;
    h2o_linklist_t pending; /* its commands, oldest first */
    int setup_left;
    int64_t next_attempt, last_heartbeat;
    unsigned failures;
    /* what the log last said, so one event is one line */
    int logged_up;
    char last_down[192];
    _Atomic int usable;
    /* Sentinel: the query and subscription links to sentinels[sidx] */
    link_t sq, ss;
    size_t sidx;
    unsigned s_failures;
    int64_t s_next_attempt, query_sent, last_query, ss_sent;
    int ss_subscribed, s_logged_down;
    char s_last_down[192];
    sb_store_addr_t primary;
    int have_primary;
    int64_t confirmed_at; /* when a sentinel last named the primary in use */
    rcache_t cache[RCACHE_SLOTS];
    /* slots to give back: carried by the next call's script, or sent on their own at the end of the loop pass */
    struct {
        char run_id[SB_MAX_RUN_ID + 1];
        int calls; /* 0: the in-flight counter, 1: the calls counter */
        unsigned n;
    } rel[REL_MAX];
    size_t nrel;
    h2o_timeout_t flush_timeout; /* 0 ms: runs once the loop pass's I/O is handled */
    h2o_timeout_entry_t flush;
    /* timeline events queued in this loop pass (store_redis_timeline.c), sent at its end */
    struct st_sb_tl_queue_t *tl;
    h2o_timeout_t tl_timeout; /* SB_TIMELINE_BATCH_MS, initialised with the queue */
    h2o_timeout_entry_t tl_flush, tl_soon;
};

/* ---- commands on the data link ---------------------------------------------------------------------------------------- */

typedef struct st_cmd_t cmd_t;
typedef void (*cmd_done_fn)(cmd_t *cmd, redisReply *reply);

struct st_cmd_t {
    h2o_linklist_t link;
    redis_conn_t *rc;
    int64_t deadline;
    const char *what; /* for the log */
    cmd_done_fn done;
    int script;       /* SC_*: sent as EVALSHA (EVAL once resent); -1 for a plain command */
    int setup_script; /* SCRIPT LOAD of this script: the digest its answer must be */
    int resent;
    int nrel; /* releases carried: their keys are the arguments at rel_first.. */
    /* the call path: quota this worker took from its lease (given back if the call does not go ahead), what the read saw */
    uint32_t res_call, res_slot;
    int asked;           /* this lookup asked for a block (rcache_t.asking) */
    uint32_t want_calls; /* the calls it asked for */
    uint64_t inv_seq, gen;
    uint32_t rel_key_off[REL_MAX], rel_key_len[REL_MAX];
    sb_token_t *known; /* the parsed record the lookup told the script about, or NULL */
    union {
        sb_store_get_cb get;
        sb_store_lookup_cb lookup;
        sb_store_done_cb done;
        sb_store_revoked_cb revoked;
        sb_quota_cb quota;
        sb_store_inspect_cb inspect;
        sb_store_timeline_cb timeline;
    } cb;
    void *arg;
    uint8_t hash[32];
    int64_t limit;
    int64_t limit2;       /* import.fetch: the module bytes cap (limit: the module count cap) */
    unsigned add_modules; /* import.fetch: what this call adds */
    uint64_t add_bytes;
    char run_id[SB_MAX_RUN_ID + 1];
    /*
     * The command as RESP, written once (hiredis copies it into its output
     * buffer): "*N", then EVALSHA and the digest for a script, then the
     * arguments, which start at `args` so NOSCRIPT can resend them after EVAL
     * and the script's text.
     */
    size_t len, args;
    char resp[];
};

static inline int64_t mono_ms(void)
{
    return (int64_t)(sb_mono_us() / 1000);
}

/* store_redis_conf.c */
void sb_store__redis_format_addr(const sb_store_addr_t *a, char *out, size_t outsz);
/** "<ip> <port>" pieces of a sentinel answer into an address; 0, or -1 when either is not numeric */
int sb_store__redis_addr_from(const char *host, size_t hlen, const char *port, size_t plen, sb_store_addr_t *out);

/* store_redis_conn.c */
/** decimal digits of v at p; returns the end */
char *sb_store__redis_put_u64(char *p, uint64_t v);
/** 1 when calls may use the data link at `now` */
int sb_store__redis_usable_now(const redis_conn_t *rc, int64_t now);
/**
 * A command with its arguments written as RESP; queued in the pending list,
 * not sent yet. `rel_first` and `nrel` name the arguments that are release
 * keys (for the log, should they fail). `script` is SC_* (sent as EVALSHA) or
 * -1 for a plain command. The command is owned by the connection until `done`
 * has run.
 */
cmd_t *sb_store__redis_cmd_new_rel(redis_conn_t *rc, const char *what, cmd_done_fn done, int script, int argc, const char **argv,
                                   const size_t *lens, int rel_first, int nrel);
/** sb_store__redis_cmd_new_rel without releases */
cmd_t *sb_store__redis_cmd_new(redis_conn_t *rc, const char *what, cmd_done_fn done, int script, int argc, const char **argv,
                               const size_t *lens);
/** sends a queued command; when it cannot be sent, its `done` runs now with a NULL reply */
void sb_store__redis_cmd_send(cmd_t *cmd);

/* store_redis.c */
/** the end of a loop pass: sends the slot releases no call carried */
void sb_store__redis_on_flush(h2o_timeout_entry_t *entry);
/** every tick: gives back the leases idle for LEASE_IDLE_MS (all of them when `all`) */
void sb_store__redis_leases_tick(redis_conn_t *rc, int64_t now, int all);
/** the invalidation link's message: the token keys Redis says changed (a NULL or non-array payload: every key) */
void sb_store__redis_invalidate(redis_conn_t *rc, const redisReply *keys);
/** no record is tracked any more (the invalidation link is lost, or its subscription not confirmed) */
void sb_store__redis_untrack_all(redis_conn_t *rc);
/** bumped by every revocation this process answers: its workers stop trusting their caches before the answer goes out */
extern _Atomic uint64_t sb_store__redis_revoke_gen;
/** logs and counts a quota update nobody waits for that failed */
void sb_store__redis_update_failed(const char *update, const char *run_id, const char *why);

/* store_redis_timeline.c */
/** frees the events still queued on a connection being destroyed (counted as dropped) */
void sb_store__redis_timeline_dispose(redis_conn_t *rc);

#endif
