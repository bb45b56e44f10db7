/*
 * broker/conf: the configuration (docs/config.md lists every key).
 *
 * Sources, later ones winning: embedded defaults, the JSON file given with
 * --config, then one environment variable per key, SANDBOX_BROKER_<KEY> in
 * upper case (objects such as targets take JSON text). Unknown keys, unknown
 * SANDBOX_BROKER_* variables and wrong types are errors naming the key;
 * nothing is silently ignored. The environment is read once per load, but a
 * process's environment never changes, so a key set there keeps its value
 * over every reload.
 */
#ifndef SB_CONFIG_H
#define SB_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <jansson.h>
#include "sb/status.h"

typedef struct st_sb_config_t {
    char *listen;            /* public RPC listener, "host:port" */
    char *admin_listen;      /* admin listener, "host:port" (default loopback) */
    char *admin_secret_file; /* file holding the admin bearer secret */
    char *admin_secret;      /* resolved secret (env SANDBOX_BROKER_ADMIN_SECRET or the file) */
    char *rpc_path;          /* "/api/sandbox/rpc" */
    char *token_store;       /* "memory" or a redis URL */
    char *redis_prefix;      /* key prefix in Redis */
    char *redis_password;    /* Redis AUTH password (or redis_password_file, or in a redis:// URL) */
    char *redis_password_file;
    char *redis_sentinel_password; /* the sentinels' password (redis-sentinel://) */
    char *redis_sentinel_password_file;
    unsigned threads;          /* worker threads */
    size_t max_connections;    /* open connections at most, spread over the workers */
    int64_t max_ttl_ms;        /* upper bound of any token's lifetime */
    int64_t default_ttl_ms;    /* lifetime when neither ttlMs nor timeoutMs is given */
    size_t max_tokens;         /* memory store capacity */
    uint64_t store_timeout_ms; /* redis connect and command timeout */
    uint64_t drain_timeout_ms; /* how long SIGTERM waits for in-flight calls */
    int64_t quota_calls;       /* default per-run quotas (a mint may override them) */
    int64_t quota_concurrent;
    int64_t quota_fetch_bytes;
    char *log_level;                   /* debug | info | warn | error */
    int log_calls;                     /* one log line per RPC */
    char *log_file;                    /* "stderr" or a file path the log is appended to (reopened on SIGUSR1 and SIGHUP) */
    char *audit;                       /* "off", "stderr" or a file path */
    char *audit_key_file;              /* Ed25519 private key (PEM) signing the audit chain's checkpoints, or NULL */
    uint64_t audit_checkpoint_records; /* audit records between two checkpoints */
    uint64_t timeline_max_events;      /* run timeline: events kept per run (0: no timeline) */
    uint64_t timeline_retention_ms;    /* run timeline: kept this long after the run's last token expires */
    json_t *targets;                   /* targets.<name> (owned) */
    char *database_url;                /* PostgreSQL, for targets that use it */
    unsigned database_pool_size;       /* connections per worker */
    json_t *egress;                    /* egress policy (owned) */
    json_t *decider;                   /* the decider (svc/decide/decide.h; owned); an empty object: none */
    /* the net-mint credential (http/admin_netmint.h): its file, and the secret resolved from
     * SANDBOX_BROKER_ADMIN_NET_MINT_SECRET or the file (NULL when none is configured) */
    char *admin_net_mint_secret_file;
    char *admin_net_mint_secret;
    /* secrets_key_file: the key that seals run secrets in the Redis store (authz/secrets.h), read at load */
    char *secrets_key_file;
    uint8_t secrets_key[32];
    int has_secrets_key;
    /* resolved listener addresses */
    struct sockaddr_storage listen_addr, admin_addr;
    socklen_t listen_addrlen, admin_addrlen;
    /* where each key came from: bit i is the i-th key of sb_config_print_keys */
    uint64_t _from_env, _from_file;
    int _secret_from_env;
    int _net_mint_secret_from_env;
} sb_config_t;

/**
 * Loads and validates the configuration.
 * @param path the JSON file, or NULL for embedded defaults plus environment
 * @param require_secret refuse a configuration without an admin secret
 * @param err receives every problem found, one per line
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_config_load(const char *path, int require_secret, sb_config_t **out, char *err, size_t errsz);
void sb_config_free(sb_config_t *c);
/**
 * Prints every configuration key, one a line: "<key> SANDBOX_BROKER_<KEY>",
 * then "- SANDBOX_BROKER_ADMIN_SECRET" (a variable with no key). This is the
 * table the loader uses; sandbox-broker --print-config-keys shows it.
 */
void sb_config_print_keys(FILE *fp);
/** the environment variable of a key, e.g. "SANDBOX_BROKER_TOKEN_STORE" for "token_store" */
void sb_config_env_name(const char *key, char *buf, size_t bufsz);
/**
 * Describes where c's settings came from, names only (never values).
 * @param env receives the environment variables that set something, space separated
 * @param overridden receives the keys the file set that the environment then replaced
 */
void sb_config_sources(const sb_config_t *c, char *env, size_t envsz, char *overridden, size_t osz);
/** parses "host:port" / "[v6]:port" with a numeric host; 0 on success */
int sb_config_parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len);

#endif
