/*
 * broker/svc/fetch: the egress-check decision (sandbox-broker egress-check):
 * the same hop code the http.fetch handler runs, stopping before the connect.
 * Private to broker/svc/fetch.
 */
#ifndef SB_EGRESS_CHECK_H
#define SB_EGRESS_CHECK_H

#include <stddef.h>
#include "authz/authz.h"
#include "call/url.h"
#include "fetch/ipclass.h"
#include "fetch/resolver.h"
#include "svc/handlers.h"

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
    char rule[512]; /* the net rule decision ("allowed" or why not); empty without an allowlist */
    sb_url_t url;
    sb_egress_answer_t answers[2 * SB_MAX_DNS_ANSWERS];
    size_t nanswers;
} sb_egress_decision_t;

typedef void (*sb_egress_check_cb)(void *arg, const sb_egress_decision_t *d);

/**
 * Parse, allowlist with its method and path rules (when `m` is not NULL;
 * `method` NULL means GET), name policy, resolve, validate:
 * the same code the fetch path runs, stopping before the connect.
 */
void sb_egress_check(sb_fetch_ctx_t *ctx, const sb_manifest_t *m, const char *url, size_t len, const char *method,
                     sb_egress_check_cb cb, void *arg);

#endif
