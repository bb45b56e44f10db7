/*
 * broker/fetch: http.fetch for the guest (PROTOCOL.md, "http.fetch").
 *
 * Every hop is a new request: the URL is parsed by the one parser, checked
 * against the run's net allowlist, its name checked against the name policy,
 * resolved (A and AAAA separately), every answer validated against the
 * address policy, and the connection pinned to the validated addresses. No
 * redirect is followed automatically: a 3xx with Location starts the next hop
 * from the top, at most max_redirects times.
 */
#ifndef SB_FETCH_H
#define SB_FETCH_H

#include <h2o.h>
#include <jansson.h>
#include <msgpack.h>
#include "authz/authz.h"
#include "fetch/ipclass.h"
#include "fetch/resolver.h"
#include "call/url.h"
#include "store/store.h"
#include "svc/dispatch.h"

/** process-wide egress settings (config key "egress"); immutable, shared by workers */
typedef struct st_sb_fetch_conf_t {
    sb_egress_policy_t *policy;
    char *dns_servers; /* "ip:port,..." or NULL for /etc/resolv.conf */
    unsigned dns_timeout_ms, dns_tries;
    char *ca_file;
    SSL_CTX *ssl_ctx;
    uint64_t deadline_ms, connect_timeout_ms;
    unsigned max_redirects;
    size_t max_body;
} sb_fetch_conf_t;

/**
 * Validates the "egress" object and builds the settings.
 * @param err receives every problem, naming the key
 */
SB_WARN_UNUSED sb_status_t sb_fetch_conf_create(const json_t *egress, sb_fetch_conf_t **out, char *err, size_t errsz);
void sb_fetch_conf_free(sb_fetch_conf_t *c);

/** per-worker state: the resolver and the timers live on the worker's loop */
typedef struct st_sb_fetch_ctx_t sb_fetch_ctx_t;
sb_fetch_ctx_t *sb_fetch_ctx_create(const sb_fetch_conf_t *conf, h2o_loop_t *loop, const char **err);
void sb_fetch_ctx_destroy(sb_fetch_ctx_t *ctx);
/** 1 when no exchange is running on the context (it can be destroyed) */
int sb_fetch_ctx_idle(const sb_fetch_ctx_t *ctx);

/**
 * Runs http.fetch for a call that passed the capability check. The token is
 * referenced for the whole exchange (its net allowlist is rechecked on every
 * hop). The run's fetched-bytes quota is checked before the first byte is
 * sent and charged with every response body. The callback runs once, possibly
 * before this returns.
 */
void sb_fetch_start(sb_fetch_ctx_t *ctx, sb_store_conn_t *store, sb_token_t *tok, const msgpack_object *args, int binary,
                    sb_dispatch_cb cb, void *arg);

/** one answer of an egress-check decision */
typedef struct st_sb_egress_answer_t {
    sb_ip_t ip;
    int allowed;
    const char *rule;
} sb_egress_answer_t;

/** the decision the fetch path makes for a URL, without connecting (egress-check) */
typedef struct st_sb_egress_decision_t {
    int allowed;
    char reason[512];
    sb_url_t url;
    sb_egress_answer_t answers[2 * SB_MAX_DNS_ANSWERS];
    size_t nanswers;
} sb_egress_decision_t;

typedef void (*sb_egress_check_cb)(void *arg, const sb_egress_decision_t *d);

/**
 * Parse, allowlist (when `m` is not NULL), name policy, resolve, validate:
 * the same code the fetch path runs, stopping before the connect.
 */
void sb_egress_check(sb_fetch_ctx_t *ctx, const sb_manifest_t *m, const char *url, size_t len, sb_egress_check_cb cb, void *arg);

/** 1 when the manifest's net allowlist admits the URL (authz, check.c) */
int sb_manifest__net_allows(const sb_manifest_t *m, const sb_url_t *u);

#endif
