/*
 * broker/obs/metrics: process-wide counters, rendered as Prometheus text.
 * Every label set is bounded: method kinds and status codes come from fixed
 * enums, never from guest strings. Counters are relaxed atomics, safe from any
 * thread.
 */
#ifndef SB_METRICS_H
#define SB_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "sb/buf.h"
#include "sb/method.h"
#include "sb/status.h"

typedef enum en_sb_deny_reason_t {
    SB_DENY_TOKEN_MISSING = 0,
    SB_DENY_TOKEN_INVALID,
    SB_DENY_AXIS, /* + sb_method_kind_t: the axis that refused */
    SB_DENY_COUNT_ = SB_DENY_AXIS + SB_MK_COUNT_
} sb_deny_reason_t;

/** counts one finished RPC; kind is SB_MK_COUNT_ for calls whose method did not parse */
void sb_metrics_call(int kind, sb_status_t st, uint64_t latency_us);
void sb_metrics_deny(int reason);
void sb_metrics_admin(const char *op, int http_status);
/**
 * counts one egress decision; `rule` must be a static string (the address
 * policy's rule names and a few fixed failure names), so the label set stays
 * bounded (at most 128 distinct rules are counted)
 */
void sb_metrics_egress(const char *rule, int allowed);
/** counts a call refused by a per-run quota: "calls per run", "concurrent calls per run" or "fetched bytes per run" */
void sb_metrics_quota_hit(const char *quota);
/** token-store events worth an alert: quota updates that failed (the counter then waits for expiry), script reloads, failovers */
typedef enum en_sb_store_event_t {
    SB_STORE_EV_RELEASE_FAILED = 0, /* sb_quota_update_failures_total{update="release"} */
    SB_STORE_EV_FETCH_ADD_FAILED,   /* sb_quota_update_failures_total{update="fetch_bytes"} */
    SB_STORE_EV_SCRIPT_RELOAD,      /* sb_redis_script_reloads_total: a NOSCRIPT answer resent as EVAL */
    SB_STORE_EV_PRIMARY_SWITCH,     /* sb_redis_primary_switches_total: Sentinel named another primary */
    SB_STORE_EV_LOOKUP_LOCAL,       /* sb_redis_lookups_total{path="local"}: a call answered from a tracked record and a lease */
    SB_STORE_EV_LOOKUP_REDIS,       /* sb_redis_lookups_total{path="redis"}: a call that asked Redis */
    SB_STORE_EV_TRACKING_LOST,      /* sb_redis_tracking_lost_total: an invalidation link lost or silent */
    SB_STORE_EV_COUNT_
} sb_store_event_t;
void sb_metrics_store_event(sb_store_event_t ev);
/**
 * counts one decision of the decider (svc/decide/decide.h): outcome 0 allow, 1 deny, 2 fail, 3 overload;
 * reused when an earlier answer was reused; us how long it took (the histogram)
 */
void sb_metrics_decision(int outcome, int reused, uint64_t us);
/** sets the function that reports the decisions waiting in the process (the pending gauge) */
void sb_metrics_set_decide_pending_fn(size_t (*fn)(void));
/** counts one import.fetch (PROTOCOL.md section 6c): outcome 0 ok (bytes answered), 1 refused by a module cap, 2 failed */
void sb_metrics_module(int outcome, uint64_t bytes);
/** counts a connection closed at accept because max_connections was reached */
void sb_metrics_connection_refused(void);
/** counts one SIGHUP reload: applied (1) or rejected (0), as sb_reload_total{result} */
void sb_metrics_reload(int applied);
/** sets the function that reports database health (1 up, 0 down, -1 no database configured) */
void sb_metrics_set_db_up_fn(int (*fn)(void));
/** sets the function that reports live tokens (-1 when unknown) */
/** counts run timeline events that were not kept (store.h, sb_store_timeline_end) */
void sb_metrics_timeline_dropped(uint64_t n);
/** the count so far */
uint64_t sb_metrics_timeline_dropped_total(void);
void sb_metrics_set_live_tokens_fn(long long (*fn)(void));
/** sets the function that reports token-store health (1 up, 0 down) */
void sb_metrics_set_store_up_fn(int (*fn)(void));
/* the most text one scrape renders (about 30 kB today: bounded label sets, at most 128 egress rules) */
#define SB_METRICS_MAX_TEXT (1024u * 1024u)

/**
 * Renders every metric as Prometheus text (exposition format 0.0.4).
 * @param out an uninitialised buffer: it is initialised with the cap
 *        SB_METRICS_MAX_TEXT and receives the text; the caller releases it
 *        (sb_buf_free) whatever the status
 * @return as sb_metrics_render_into
 */
SB_WARN_UNUSED sb_status_t sb_metrics_render(sb_buf_t *out);
/**
 * Appends every metric's text to `out`, within its cap: the whole exposition
 * or nothing.
 * @return SB_OK; SB_E_TOO_LARGE (the text would pass the buffer's cap) or
 *         SB_E_NOMEM, and `out` then holds exactly what it held before
 */
SB_WARN_UNUSED sb_status_t sb_metrics_render_into(sb_buf_t *out);

#endif
