/* private to broker/store: the store object and the backend entry points */
#ifndef SB_STORE_INT_H
#define SB_STORE_INT_H

#include <pthread.h>
#include "store/store.h"

typedef struct st_quota_entry_t quota_entry_t;

#define SB_STORE_MAX_SENTINELS 16
#define SB_STORE_MAX_MASTER_NAME 64
#define SB_STORE_NSCRIPTS 8

/** a numeric address hiredis can connect to without resolving anything */
typedef struct st_sb_store_addr_t {
    char host[64]; /* an IPv4 or IPv6 literal */
    int port;
} sb_store_addr_t;

struct st_sb_store_t {
    int is_redis;
    /* memory backend: two chained hash tables that grow with their contents (load factor at most 1) */
    pthread_mutex_t mu;
    sb_token_t **buckets; /* chained through sb_token_t._next */
    size_t nbuckets;      /* a power of two */
    size_t count;
    size_t max_tokens;
    quota_entry_t **qbuckets; /* per-run counters */
    size_t nqbuckets;         /* a power of two */
    size_t qcount;
    /* redis backend */
    char *prefix;
    sb_store_addr_t addr; /* redis:// */
    char *unix_path;      /* unix:// */
    char *password;       /* the data password, or NULL */
    int db;
    uint64_t timeout_ms;
    /* redis-sentinel:// */
    sb_store_addr_t sentinels[SB_STORE_MAX_SENTINELS];
    size_t nsentinels; /* 0 unless Sentinel names the primary */
    char master[SB_STORE_MAX_MASTER_NAME + 1];
    char *sentinel_password;
    /* the run timeline (timeline.c): settings, and the memory backend's runs under tl_mu */
    size_t tl_max_events;
    uint64_t tl_retention_ms;
    pthread_mutex_t tl_mu;
    struct st_tl_run_t **tl_buckets;
    size_t tl_nruns;
    size_t tl_bytes;     /* held by the memory backend's runs */
    size_t tl_max_bytes; /* SB_TIMELINE_MAX_BYTES (a test may lower it) */
    /* the scripts' SHA-1 digests (hex), computed once */
    char sha[SB_STORE_NSCRIPTS][41];
};

struct st_sb_store_conn_t {
    sb_store_t *store;
    h2o_loop_t *loop;
    void *redis; /* struct st_redis_conn_t * */
};

SB_WARN_UNUSED sb_status_t sb_store__redis_parse_url(sb_store_t *s, const char *url, const char **err);
SB_WARN_UNUSED sb_status_t sb_store__redis_init(sb_store_t *s, const sb_store_config_t *conf, const char **err);
void sb_store__redis_free(sb_store_t *s);
SB_WARN_UNUSED sb_status_t sb_store__redis_check(sb_store_t *s, char *err, size_t errsz);
void *sb_store__redis_conn_create(sb_store_t *s, h2o_loop_t *loop);
void sb_store__redis_conn_destroy(void *rc);
int sb_store__redis_healthy(void *rc);
int sb_store__redis_settle(void *rc);
void sb_store__redis_get(void *rc, const uint8_t hash[32], sb_store_get_cb cb, void *arg);
void sb_store__redis_lookup_acquire(void *rc, const uint8_t hash[32], sb_store_lookup_cb cb, void *arg);
void sb_store__redis_put(void *rc, sb_token_t *tok, const json_t *caps, sb_store_done_cb cb, void *arg);
void sb_store__redis_revoke_token(void *rc, const uint8_t hash[32], sb_store_revoked_cb cb, void *arg);
void sb_store__redis_revoke_run(void *rc, const char *run_id, sb_store_done_cb cb, void *arg);
void sb_store__redis_inspect_run(void *rc, const char *run_id, size_t max, sb_store_inspect_cb cb, void *arg);
void sb_store__redis_quota_release(void *rc, const sb_token_t *tok);
void sb_store__redis_quota_fetch_check(void *rc, const sb_token_t *tok, sb_quota_cb cb, void *arg);
void sb_store__redis_quota_fetch_add(void *rc, const sb_token_t *tok, uint64_t bytes);
void sb_store__redis_quota_tool_call(void *rc, const sb_token_t *tok, unsigned max_calls, sb_quota_cb cb, void *arg);
void sb_store__redis_quota_modules(void *rc, const sb_token_t *tok, unsigned add_modules, uint64_t add_bytes, int64_t max_modules,
                                   int64_t max_bytes, sb_quota_cb cb, void *arg);
/* store_redis_timeline.c */
void sb_store__redis_timeline_add(void *rc, const char *run_id, int64_t keep_until_ms, const char *ev, size_t len);
void sb_store__redis_timeline_get(void *rc, const char *run_id, sb_store_timeline_cb cb, void *arg);
/* timeline.c */
void sb_store__timeline_dropped_add(uint64_t n);
void sb_store__timeline_free(sb_store_t *s);

/**
 * Parses a Sentinel "+switch-master" message: "<name> <old-ip> <old-port>
 * <new-ip> <new-port>". Returns 1 and fills `to` when the message is about
 * `master` and names a numeric address, 0 when it is about another master, -1
 * when it is malformed (or names the primary by a hostname).
 */
int sb_store__parse_switch_master(const char *msg, size_t len, const char *master, sb_store_addr_t *to);

#endif
