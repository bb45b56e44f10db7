/*
 * broker/store: the token store (PROTOCOL.md, "Tokens").
 *
 * Tokens are kept by SHA-256 hash only. A record binds a token to its run id,
 * manifest, target, scope and expiry. Two backends sit behind one interface:
 *   memory  one process, a locked hash table (the embedded default);
 *   redis   shared by every broker instance, hiredis async on each worker's
 *           h2o loop. Each worker keeps the records it read while Redis
 *           tracks them for it (CLIENT TRACKING: every change to a token key
 *           is pushed to every instance as it happens) and leases per-run
 *           quota in blocks, so a granted call in steady state asks Redis
 *           nothing; losing the push fails every call closed until it is
 *           back. The primary is a fixed address (redis://, unix://) or the
 *           one Redis Sentinel names (redis-sentinel://).
 * Any doubt (backend down, record unreadable, clock past expiry) is answered
 * SB_E_UNAVAILABLE or SB_E_UNAUTHORIZED, never a grant.
 */
#ifndef SB_STORE_H
#define SB_STORE_H

#include <stdint.h>
#include <stddef.h>
#include <h2o.h>
#include <jansson.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/status.h"
#include "authz/authz.h"

/** one scope binding, e.g. tenantId = "t1" */
typedef struct st_sb_scope_kv_t {
    const char *key;
    const char *value;
} sb_scope_kv_t;

/** per-run limits, resolved at mint (the config's defaults unless the mint overrides them) */
typedef struct st_sb_quota_t {
    int64_t calls;       /* RPCs per run, denied ones included */
    int64_t concurrent;  /* RPCs of the run in flight at once */
    int64_t fetch_bytes; /* http.fetch response bytes per run */
} sb_quota_t;

/**
 * A token record. Immutable once built and reference-counted, so worker
 * threads share it without locks; release with sb_token_release.
 *
 * One allocation: the strings and the scope array live right after the
 * struct (sb_token_build sizes it), and the manifest is shared with every
 * token that names the same one (authz.h: manifests are interned). A field
 * added here that points at per-token data should point into that same
 * allocation (sb_token_build lays it out) or own its memory and be released
 * in sb_token_release.
 */
typedef struct st_sb_token_t {
    _Atomic int _refcnt;
    uint8_t hash[32];
    int64_t expires_at_ms;
    sb_quota_t quota;
    sb_manifest_t *manifest;
    const char *run_id;   /* 1 to SB_MAX_RUN_ID bytes, NUL-terminated */
    const char *target;   /* "" when the run has no target */
    sb_scope_kv_t *scope; /* scope_len bindings, at most SB_MAX_SCOPE_ENTRIES */
    size_t scope_len;
    struct st_sb_secrets_t *secrets; /* authz/secrets.h; NULL when the run has none (owned, zeroed when freed) */
    /* the memory store's hash chain: written only by that store, under its lock */
    struct st_sb_token_t *_next;
} sb_token_t;

void sb_token_addref(sb_token_t *t);
void sb_token_release(sb_token_t *t);

/**
 * Builds a token record from the admin mint body fields (already type-checked
 * by the caller) or from a stored record.
 * @param out receives a record with one reference (sb_token_release)
 * @param err receives a message naming the offending path on SB_E_BAD_ARGS
 * @return SB_OK, SB_E_BAD_ARGS, or SB_E_NOMEM (err says "out of memory")
 */
SB_WARN_UNUSED sb_status_t sb_token_build(const uint8_t hash[32], const char *run_id, const json_t *capabilities,
                                          const char *target, const json_t *scope, int64_t expires_at_ms, sb_token_t **out,
                                          char *err, size_t errsz);
/**
 * serialises a record to JSON for the redis backend (capabilities kept
 * verbatim, a random mint id added, secrets sealed: authz/secrets.h),
 * released with sb_mem_free_foreign (json_dumps text); NULL when no
 * randomness is available, or the record has secrets and no key is set
 */
char *sb_token_serialize(const sb_token_t *t, const json_t *capabilities);
/** parses a serialised record; SB_E_UNAVAILABLE when it is unreadable (fail closed) */
SB_WARN_UNUSED sb_status_t sb_token_deserialize(const uint8_t hash[32], const char *s, size_t len, sb_token_t **out);

typedef struct st_sb_store_t sb_store_t;           /* process-wide */
typedef struct st_sb_store_conn_t sb_store_conn_t; /* one per worker loop */

/** called with the record (a reference the callee must release) or an error */
typedef void (*sb_store_get_cb)(void *arg, sb_status_t st, sb_token_t *tok);
typedef void (*sb_store_done_cb)(void *arg, sb_status_t st);

typedef struct st_sb_store_config_t {
    /*
     * "memory", "redis://[:password@]host:port[/db]", "unix:///path[?db=N]" or
     * "redis-sentinel://host:port[,host:port...]/<master-name>[/db]"
     */
    const char *url;
    const char *prefix;  /* redis key prefix, e.g. "sb:" */
    size_t max_tokens;   /* memory backend: live tokens at most */
    uint64_t timeout_ms; /* redis: connect and command timeout */
    /* redis: the data password (AUTH), inline or in a file; at most one of the two, and not with one in the URL */
    const char *password;
    const char *password_file;
    /* redis-sentinel: the sentinels' own password, inline or in a file */
    const char *sentinel_password;
    const char *sentinel_password_file;
    /* the run timeline: events kept per run (0: no timeline), and how long after the run's last token they are kept */
    size_t timeline_max_events;
    uint64_t timeline_retention_ms;
} sb_store_config_t;

/**
 * Creates the store. The URL is validated here (hostnames other than
 * localhost are refused: hiredis would resolve them with a blocking call) and
 * password files are read (once: they change on restart only).
 * @param err receives a message on failure (static storage, valid until the
 *            next sb_store_create); it never contains a password
 */
SB_WARN_UNUSED sb_status_t sb_store_create(const sb_store_config_t *conf, sb_store_t **out, const char **err);
void sb_store_destroy(sb_store_t *s);
/**
 * --check-config with network checks: connects as a worker would (asks the
 * sentinels for the primary first), authenticates, selects the database,
 * loads the scripts and checks with ROLE that the node is a primary. Blocking,
 * bounded by the store timeout per step; never call it from a worker loop.
 * @param err receives what failed and where (host:port, never a password)
 * @return SB_OK (always for the memory store); SB_E_UNAVAILABLE (a node did not answer),
 *         SB_E_UNAUTHORIZED (a node refused the password) or SB_E_BAD_ARGS (any other refusal:
 *         a database index, a replica where the primary should be, an unknown master name)
 */
SB_WARN_UNUSED sb_status_t sb_store_check(sb_store_t *s, char *err, size_t errsz);
/** "memory", "redis" or "redis-sentinel" */
const char *sb_store_kind(const sb_store_t *s);
/** live tokens (memory backend), or -1 */
long long sb_store_live_tokens(sb_store_t *s);

/** attaches a connection to a worker loop; call from that loop's thread */
sb_store_conn_t *sb_store_conn_create(sb_store_t *s, h2o_loop_t *loop);
/** closes the connection; pending callbacks are called with SB_E_UNAVAILABLE */
void sb_store_conn_destroy(sb_store_conn_t *c);
/** 1 when the backend can answer now */
int sb_store_conn_healthy(sb_store_conn_t *c);
/**
 * The drain, once the worker's calls have ended: gives back the quota the
 * connection leased (Redis), and says whether commands still wait for an
 * answer (1: turn the loop and ask again, until the drain deadline)
 */
int sb_store_conn_settle(sb_store_conn_t *c);

/*
 * The operations. Callbacks run on the connection's loop, possibly before the
 * function returns (memory backend, or a Redis that is down): callers must be
 * ready for both.
 */
/** reads a record without counting a call (no quota is taken) */
void sb_store_get(sb_store_conn_t *c, const uint8_t hash[32], sb_store_get_cb cb, void *arg);
/** stores a new record; SB_E_BAD_ARGS when the token already exists, SB_E_RATE_LIMITED when the store is full */
void sb_store_put(sb_store_conn_t *c, sb_token_t *tok, const json_t *capabilities, sb_store_done_cb cb, void *arg);
/**
 * called when a token revocation is done: SB_OK with the run the token
 * belonged to (NULL when there was no such token, or its record could not be
 * read; valid until the callback returns), or SB_E_UNAVAILABLE
 */
typedef void (*sb_store_revoked_cb)(void *arg, sb_status_t st, const char *run_id);
void sb_store_revoke_token(sb_store_conn_t *c, const uint8_t hash[32], sb_store_revoked_cb cb, void *arg);
void sb_store_revoke_run(sb_store_conn_t *c, const char *run_id, sb_store_done_cb cb, void *arg);

/** what a run has used of its quotas (PROTOCOL.md section 9, quotas) */
typedef struct st_sb_store_usage_t {
    int64_t calls;         /* calls counted, denied ones included */
    int64_t inflight;      /* calls holding a concurrency slot now */
    int64_t fetched_bytes; /* http.fetch response bytes */
} sb_store_usage_t;

/**
 * called with a run's live tokens and its usage (sb_store_inspect_run):
 *   SB_OK             toks holds ntoks records (at most the max asked for), nlive
 *                     is how many live tokens the run has in all (0: none)
 *   SB_E_UNAVAILABLE  the store cannot answer (or holds a record it cannot read); nothing else is set
 * The records are borrowed for the call: take a reference to keep one.
 */
typedef void (*sb_store_inspect_cb)(void *arg, sb_status_t st, sb_token_t *const *toks, size_t ntoks, size_t nlive,
                                    const sb_store_usage_t *usage);
/**
 * The admin inspection of a run (GET /admin/v1/runs/<runId>, and the usage
 * of GET /admin/v1/tokens/<token>): reads, counts nothing. The memory store
 * scans its table (bounded by max_tokens), Redis runs one read-only script.
 * @param max the most records to hand back, at most SB_MAX_INSPECT_TOKENS; 0
 *        asks for the usage alone (then nlive is 0)
 */
void sb_store_inspect_run(sb_store_conn_t *c, const char *run_id, size_t max, sb_store_inspect_cb cb, void *arg);

/*
 * Per-run quotas (PROTOCOL.md, "Quotas"), kept where the tokens are: in the
 * memory store's table, or in Redis counters shared by every instance, which
 * expire with the run's tokens. Counting is keyed by run id.
 */
typedef void (*sb_quota_cb)(void *arg, sb_status_t st, const char *why);
/**
 * called with the outcome of sb_store_lookup_acquire:
 *   SB_OK              tok is the record, and a concurrency slot is held: give it back with sb_store_quota_release
 *   SB_E_RATE_LIMITED  tok is the record (for the log), no slot is held; why names the quota
 *   SB_E_UNAUTHORIZED  no such token, or it has expired; tok is NULL
 *   SB_E_UNAVAILABLE   the store cannot answer; tok is NULL
 * A non-NULL tok is a reference the callee must release.
 */
typedef void (*sb_store_lookup_cb)(void *arg, sb_status_t st, sb_token_t *tok, const char *why);
/**
 * The call path in one step (one Redis round trip): finds the token, counts
 * the call against its run (denied calls count too) and takes a concurrency
 * slot.
 */
void sb_store_lookup_acquire(sb_store_conn_t *c, const uint8_t hash[32], sb_store_lookup_cb cb, void *arg);
/**
 * Gives the slot back (after the reply). Fire and forget: the caller never
 * waits for it; the store still checks the answer, and a release that fails
 * is logged (redis.quota_update_failed) and counted in
 * sb_quota_update_failures_total{update="release"}. The slot then expires
 * with the run's tokens.
 */
void sb_store_quota_release(sb_store_conn_t *c, const sb_token_t *tok);
/** SB_OK while the run's fetched bytes are below its quota */
void sb_store_quota_fetch_check(sb_store_conn_t *c, const sb_token_t *tok, sb_quota_cb cb, void *arg);
/** adds fetched bytes; fire and forget, checked and counted like a release (update="fetch_bytes") */
void sb_store_quota_fetch_add(sb_store_conn_t *c, const sb_token_t *tok, uint64_t bytes);
/**
 * Counts one tools.call of the token's run against `max_calls` (the target's
 * limit, PROTOCOL.md section 6b), in one step: one counter per run next to the
 * run's other counters (on Redis one script, one round trip, shared by every
 * instance), living as long as the run's tokens.
 * cb: SB_OK while the run has calls left, SB_E_RATE_LIMITED once it has none
 * (why "tools.call per run"), SB_E_UNAVAILABLE when the store cannot answer
 */
void sb_store_quota_tool_call(sb_store_conn_t *c, const sb_token_t *tok, unsigned max_calls, sb_quota_cb cb, void *arg);
/**
 * The run's import.fetch counters (PROTOCOL.md section 6c): adds
 * `add_modules` modules and `add_bytes` module bytes, in one step (on Redis
 * one script, shared by every instance), and compares the totals with the
 * caps. Before a module is fetched it is counted (1, 0); its bytes once it
 * arrived (0, n).
 * cb: SB_OK, or SB_E_RATE_LIMITED with why "modules per run" (more modules
 * than max_modules) or "module bytes per run" (more bytes than max_bytes, or,
 * when no bytes are added, none left), SB_E_UNAVAILABLE when the store cannot answer
 */
void sb_store_quota_modules(sb_store_conn_t *c, const sb_token_t *tok, unsigned add_modules, uint64_t add_bytes,
                            int64_t max_modules, int64_t max_bytes, sb_quota_cb cb, void *arg);
/** the verdict on module totals (shared by both stores): NULL, or the quota's name */
const char *sb_store__modules_verdict(int64_t modules, int64_t bytes, unsigned add_modules, uint64_t add_bytes, int64_t max_modules,
                                      int64_t max_bytes);

/* ---- the run timeline (timeline.c) ------------------------------------------------------------------------------------- */

/** the most runs the memory backend keeps a timeline for (per instance) */
#define SB_TIMELINE_MAX_RUNS 10000
/* the memory backend's timeline holds at most this many bytes, events and their rings together */
#define SB_TIMELINE_MAX_BYTES (256u * 1024u * 1024u)
/** the most events one Redis worker queues between two loop passes; more are dropped and counted */
#define SB_TIMELINE_QUEUE_MAX 4096

struct st_sb_logline_t;

/** 1 when the store keeps run timelines (timeline_max_events is not 0) */
int sb_store_timeline_enabled(const sb_store_conn_t *c);
/**
 * Starts a timeline event of `type` ("call", "fetch", "secret", "revoke"):
 * {"ts":..., "event":type, "inst":..., "n":... ; the caller adds its fields
 * with sb_log_str/sb_log_int, never a secret's value, then calls
 * sb_store_timeline_end.
 */
void sb_store_timeline_begin(struct st_sb_logline_t *l, const char *type);
/**
 * Closes the event and hands it to the store for `run_id`, to be kept until
 * `expires_at_ms` (the run's token expiry) plus timeline_retention_ms. Never
 * blocks and never fails a call: an event that cannot be kept is counted in
 * sb_store_timeline_dropped. Loop thread of `c`.
 */
void sb_store_timeline_end(struct st_sb_logline_t *l, sb_store_conn_t *c, const char *run_id, int64_t expires_at_ms);
/**
 * A timeline event of `type` made from a line built for another stream
 * (sb_log_begin_always, still open): its time and fields, with the
 * timeline's head. What the audit line and the call event share is built
 * once.
 */
void sb_store_timeline_from(const struct st_sb_logline_t *src, const char *type, sb_store_conn_t *c, const char *run_id,
                            int64_t expires_at_ms);
/**
 * The run's events, as stored (JSON objects, oldest first as they arrived;
 * instances' events interleave in arrival order). The views live until `cb`
 * returns.
 */
typedef void (*sb_store_timeline_cb)(void *arg, sb_status_t st, const sb_view_t *events, size_t n);
void sb_store_timeline_get(sb_store_conn_t *c, const char *run_id, sb_store_timeline_cb cb, void *arg);
/** events dropped: a full queue, a store that could not take them, a run over its cap */
uint64_t sb_store_timeline_dropped(void);

#endif
