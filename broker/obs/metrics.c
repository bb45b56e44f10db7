#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "obs/audit.h"
#include "obs/metrics.h"
#include "sb/buf.h"
#include "util/util.h"
#include "sb_build_info.h"

static const uint64_t bucket_us[] = {100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000};
#define NBUCKETS (sizeof(bucket_us) / sizeof(bucket_us[0]))

static _Atomic uint64_t calls[SB_MK_COUNT_ + 1][SB_STATUS_COUNT_];
static _Atomic uint64_t hist[NBUCKETS + 1];
static _Atomic uint64_t hist_sum_us, hist_count;
static _Atomic uint64_t denials[SB_DENY_COUNT_];
static _Atomic uint64_t admin_ops[7][6]; /* op x status class (1xx..5xx) */
static _Atomic uint64_t timeline_dropped;
static long long (*live_tokens_fn)(void);
static int (*db_up_fn)(void);
static const char *quota_names[] = {"calls per run", "concurrent calls per run", "fetched bytes per run", "modules per run",
                                    "module bytes per run"};
#define NQUOTAS (sizeof(quota_names) / sizeof(quota_names[0]))
static _Atomic uint64_t quota_hits[NQUOTAS];

void sb_metrics_quota_hit(const char *quota)
{
    for (size_t i = 0; i < NQUOTAS; ++i)
        if (quota != NULL && strcmp(quota, quota_names[i]) == 0)
            atomic_fetch_add_explicit(&quota_hits[i], 1, memory_order_relaxed);
}

/* the decider: decisions by outcome (allow, deny, fail, overload), reused answers, latency from 1 ms to 5 min */
static const char *const decide_outcomes[] = {"allow", "deny", "fail", "overload"};
static const uint64_t decide_bucket_us[] = {1000, 5000, 10000, 50000, 100000, 500000, 1000000, 5000000, 30000000, 300000000};
#define DECIDE_NBUCKETS (sizeof(decide_bucket_us) / sizeof(decide_bucket_us[0]))
static _Atomic uint64_t decisions[4], decisions_reused;
static _Atomic uint64_t decide_hist[DECIDE_NBUCKETS + 1], decide_sum_us, decide_count;
static size_t (*decide_pending_fn)(void);

void sb_metrics_decision(int outcome, int reused, uint64_t us)
{
    size_t b = 0;
    if (outcome < 0 || outcome > 3)
        outcome = 2;
    atomic_fetch_add_explicit(&decisions[outcome], 1, memory_order_relaxed);
    if (reused)
        atomic_fetch_add_explicit(&decisions_reused, 1, memory_order_relaxed);
    while (b < DECIDE_NBUCKETS && us > decide_bucket_us[b])
        ++b;
    atomic_fetch_add_explicit(&decide_hist[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&decide_sum_us, us, memory_order_relaxed);
    atomic_fetch_add_explicit(&decide_count, 1, memory_order_relaxed);
}

void sb_metrics_set_decide_pending_fn(size_t (*fn)(void))
{
    decide_pending_fn = fn;
}

/* import.fetch: modules fetched (ok), refused by a run's module caps (quota), failed otherwise (error); bytes of the ok ones */
static const char *const module_outcomes[] = {"ok", "quota", "error"};
static _Atomic uint64_t modules[3], module_bytes;

void sb_metrics_module(int outcome, uint64_t bytes)
{
    if (outcome < 0 || outcome > 2)
        outcome = 2;
    atomic_fetch_add_explicit(&modules[outcome], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&module_bytes, bytes, memory_order_relaxed);
}

static _Atomic uint64_t connections_refused;
static _Atomic uint64_t reloads[2]; /* rejected, applied */
static _Atomic uint64_t store_events[SB_STORE_EV_COUNT_];

void sb_metrics_reload(int applied)
{
    atomic_fetch_add_explicit(&reloads[applied ? 1 : 0], 1, memory_order_relaxed);
}

void sb_metrics_store_event(sb_store_event_t ev)
{
    if ((unsigned)ev < SB_STORE_EV_COUNT_)
        atomic_fetch_add_explicit(&store_events[ev], 1, memory_order_relaxed);
}

void sb_metrics_connection_refused(void)
{
    atomic_fetch_add_explicit(&connections_refused, 1, memory_order_relaxed);
}

void sb_metrics_set_db_up_fn(int (*fn)(void))
{
    db_up_fn = fn;
}

#define MAX_EGRESS_RULES 128
static struct {
    const char *_Atomic rule;
    _Atomic uint64_t allowed, denied;
} egress[MAX_EGRESS_RULES];
static pthread_mutex_t egress_mu = PTHREAD_MUTEX_INITIALIZER;

void sb_metrics_egress(const char *rule, int allowed)
{
    size_t i;
    for (i = 0; i < MAX_EGRESS_RULES; ++i) {
        const char *r = atomic_load(&egress[i].rule);
        if (r == NULL)
            break;
        if (r == rule || strcmp(r, rule) == 0)
            goto Found;
    }
    pthread_mutex_lock(&egress_mu);
    for (i = 0; i < MAX_EGRESS_RULES; ++i) {
        const char *r = atomic_load(&egress[i].rule);
        if (r == NULL) {
            atomic_store(&egress[i].rule, rule);
            break;
        }
        if (r == rule || strcmp(r, rule) == 0)
            break;
    }
    pthread_mutex_unlock(&egress_mu);
    if (i == MAX_EGRESS_RULES)
        return; /* more distinct rules than the table holds: not counted (rules are static, so this does not happen) */
Found:
    atomic_fetch_add_explicit(allowed ? &egress[i].allowed : &egress[i].denied, 1, memory_order_relaxed);
}
static int (*store_up_fn)(void);

static const char *admin_names[] = {"mint", "revoke_token", "revoke_run", "inspect_token", "inspect_run", "run_events", "other"};

void sb_metrics_call(int kind, sb_status_t st, uint64_t latency_us)
{
    size_t b = 0;
    if (kind < 0 || kind > SB_MK_COUNT_)
        kind = SB_MK_COUNT_;
    if ((unsigned)st >= SB_STATUS_COUNT_)
        st = SB_E_EXECUTION;
    atomic_fetch_add_explicit(&calls[kind][st], 1, memory_order_relaxed);
    while (b < NBUCKETS && latency_us > bucket_us[b])
        ++b;
    atomic_fetch_add_explicit(&hist[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&hist_sum_us, latency_us, memory_order_relaxed);
    atomic_fetch_add_explicit(&hist_count, 1, memory_order_relaxed);
}

void sb_metrics_deny(int reason)
{
    if (reason >= 0 && reason < SB_DENY_COUNT_)
        atomic_fetch_add_explicit(&denials[reason], 1, memory_order_relaxed);
}

void sb_metrics_admin(const char *op, int http_status)
{
    int i = 0, cls = http_status / 100;
    while (i < 6 && strcmp(admin_names[i], op) != 0)
        ++i;
    if (cls < 1 || cls > 5)
        cls = 5;
    atomic_fetch_add_explicit(&admin_ops[i][cls], 1, memory_order_relaxed);
}

void sb_metrics_timeline_dropped(uint64_t n)
{
    atomic_fetch_add_explicit(&timeline_dropped, n, memory_order_relaxed);
}

uint64_t sb_metrics_timeline_dropped_total(void)
{
    return atomic_load_explicit(&timeline_dropped, memory_order_relaxed);
}

void sb_metrics_set_live_tokens_fn(long long (*fn)(void))
{
    live_tokens_fn = fn;
}

void sb_metrics_set_store_up_fn(int (*fn)(void))
{
    store_up_fn = fn;
}

static const char *deny_name(int r, char *buf, size_t sz)
{
    if (r == SB_DENY_TOKEN_MISSING)
        return "token_missing";
    if (r == SB_DENY_TOKEN_INVALID)
        return "token_invalid";
    snprintf(buf, sz, "axis_%s", sb_method_kind_name((sb_method_kind_t)(r - SB_DENY_AXIS)));
    return buf;
}

/*
 * The text goes into one capped buffer (sb/buf.h). The first append that
 * fails (the cap, or memory) sticks: later ones do nothing, and the render
 * reports it, so a scrape gets the whole exposition or an error, never a
 * truncated one that Prometheus would read as counters going missing.
 */
typedef struct st_out_t {
    sb_buf_t *b;
    sb_status_t st;
} out_t;

__attribute__((format(printf, 2, 3))) static void emit(out_t *o, const char *fmt, ...)
{
    va_list ap;
    if (o->st != SB_OK)
        return;
    va_start(ap, fmt);
    o->st = sb_buf_vprintf(o->b, fmt, ap);
    va_end(ap);
}

/* a label value, escaped as the text exposition format asks: backslash, double quote and line feed */
static void emit_label(out_t *o, const char *s)
{
    for (; *s != '\0' && o->st == SB_OK; ++s) {
        if (*s == '"' || *s == '\\' || *s == '\n')
            o->st = sb_buf_append_char(o->b, '\\');
        if (o->st == SB_OK)
            o->st = sb_buf_append_char(o->b, *s == '\n' ? 'n' : *s);
    }
}

sb_status_t sb_metrics_render(sb_buf_t *out)
{
    sb_buf_init(out, SB_METRICS_MAX_TEXT);
    return sb_metrics_render_into(out);
}

sb_status_t sb_metrics_render_into(sb_buf_t *out)
{
    out_t o = {out, SB_OK};
    size_t start = out->len;
    char buf[64];
    uint64_t cum = 0;

    emit(&o,
         "# HELP sb_build_info The broker's version and the commit it was built from.\n# TYPE sb_build_info gauge\n"
         "sb_build_info{version=\"%s\",commit=\"%s\"} 1\n",
         SB_VERSION, SB_GIT_COMMIT);
    emit(&o,
         "# HELP sb_reload_total SIGHUP reloads by result.\n# TYPE sb_reload_total counter\n"
         "sb_reload_total{result=\"applied\"} %llu\nsb_reload_total{result=\"rejected\"} %llu\n",
         (unsigned long long)atomic_load_explicit(&reloads[1], memory_order_relaxed),
         (unsigned long long)atomic_load_explicit(&reloads[0], memory_order_relaxed));
    emit(&o, "# HELP sb_calls_total RPC calls by method kind and result code.\n# TYPE sb_calls_total counter\n");
    for (int k = 0; k <= SB_MK_COUNT_; ++k) {
        for (int s = 0; s < SB_STATUS_COUNT_; ++s) {
            uint64_t v = atomic_load_explicit(&calls[k][s], memory_order_relaxed);
            if (v == 0)
                continue;
            emit(&o, "sb_calls_total{kind=\"%s\",code=\"%s\",status=\"%d\"} %llu\n",
                 k == SB_MK_COUNT_ ? "invalid" : sb_method_kind_name((sb_method_kind_t)k), sb_status_code((sb_status_t)s),
                 sb_status_http((sb_status_t)s), (unsigned long long)v);
        }
    }
    emit(&o, "# HELP sb_call_duration_seconds RPC latency inside the broker.\n# TYPE sb_call_duration_seconds histogram\n");
    for (size_t b = 0; b < NBUCKETS; ++b) {
        cum += atomic_load_explicit(&hist[b], memory_order_relaxed);
        emit(&o, "sb_call_duration_seconds_bucket{le=\"%g\"} %llu\n", (double)bucket_us[b] / 1e6, (unsigned long long)cum);
    }
    cum += atomic_load_explicit(&hist[NBUCKETS], memory_order_relaxed);
    emit(&o, "sb_call_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    emit(&o, "sb_call_duration_seconds_sum %.6f\n", (double)atomic_load(&hist_sum_us) / 1e6);
    emit(&o, "sb_call_duration_seconds_count %llu\n", (unsigned long long)atomic_load(&hist_count));
    emit(&o, "# HELP sb_denials_total Refused calls by reason.\n# TYPE sb_denials_total counter\n");
    for (int r = 0; r < SB_DENY_COUNT_; ++r)
        emit(&o, "sb_denials_total{reason=\"%s\"} %llu\n", deny_name(r, buf, sizeof(buf)),
             (unsigned long long)atomic_load_explicit(&denials[r], memory_order_relaxed));
    emit(&o, "# HELP sb_admin_requests_total Admin requests by operation and status class.\n"
             "# TYPE sb_admin_requests_total counter\n");
    for (int i = 0; i < 7; ++i)
        for (int c = 1; c <= 5; ++c) {
            uint64_t v = atomic_load_explicit(&admin_ops[i][c], memory_order_relaxed);
            if (v != 0)
                emit(&o, "sb_admin_requests_total{op=\"%s\",class=\"%dxx\"} %llu\n", admin_names[i], c, (unsigned long long)v);
        }
    emit(&o, "# HELP sb_egress_decisions_total http.fetch decisions by rule.\n# TYPE sb_egress_decisions_total counter\n");
    for (size_t i = 0; i < MAX_EGRESS_RULES; ++i) {
        const char *r = atomic_load(&egress[i].rule);
        if (r == NULL)
            break;
        for (int a = 0; a < 2; ++a) {
            uint64_t v = atomic_load(a ? &egress[i].allowed : &egress[i].denied);
            if (v != 0) {
                emit(&o, "sb_egress_decisions_total{decision=\"%s\",rule=\"", a ? "allow" : "deny");
                emit_label(&o, r);
                emit(&o, "\"} %llu\n", (unsigned long long)v);
            }
        }
    }
    emit(&o, "# HELP sb_module_fetches_total import.fetch module fetches by outcome.\n"
             "# TYPE sb_module_fetches_total counter\n");
    for (size_t i = 0; i < 3; ++i)
        emit(&o, "sb_module_fetches_total{outcome=\"%s\"} %llu\n", module_outcomes[i],
             (unsigned long long)atomic_load_explicit(&modules[i], memory_order_relaxed));
    emit(&o,
         "# HELP sb_module_bytes_total Bytes of the modules import.fetch answered.\n# TYPE sb_module_bytes_total counter\n"
         "sb_module_bytes_total %llu\n",
         (unsigned long long)atomic_load_explicit(&module_bytes, memory_order_relaxed));
    emit(&o, "# HELP sb_decisions_total Decisions on calls a decide rule holds, by outcome.\n"
             "# TYPE sb_decisions_total counter\n");
    for (size_t i = 0; i < 4; ++i)
        emit(&o, "sb_decisions_total{outcome=\"%s\"} %llu\n", decide_outcomes[i],
             (unsigned long long)atomic_load_explicit(&decisions[i], memory_order_relaxed));
    emit(&o,
         "# HELP sb_decisions_reused_total Decisions answered from an earlier answer (decider.reuse_ms).\n"
         "# TYPE sb_decisions_reused_total counter\nsb_decisions_reused_total %llu\n",
         (unsigned long long)atomic_load_explicit(&decisions_reused, memory_order_relaxed));
    emit(&o, "# HELP sb_decision_duration_seconds How long a decision took.\n# TYPE sb_decision_duration_seconds histogram\n");
    cum = 0;
    for (size_t b = 0; b < DECIDE_NBUCKETS; ++b) {
        cum += atomic_load_explicit(&decide_hist[b], memory_order_relaxed);
        emit(&o, "sb_decision_duration_seconds_bucket{le=\"%g\"} %llu\n", (double)decide_bucket_us[b] / 1e6,
             (unsigned long long)cum);
    }
    cum += atomic_load_explicit(&decide_hist[DECIDE_NBUCKETS], memory_order_relaxed);
    emit(&o, "sb_decision_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    emit(&o, "sb_decision_duration_seconds_sum %.6f\n", (double)atomic_load(&decide_sum_us) / 1e6);
    emit(&o, "sb_decision_duration_seconds_count %llu\n", (unsigned long long)atomic_load(&decide_count));
    emit(&o,
         "# HELP sb_decisions_pending Calls waiting for the decider in this instance.\n# TYPE sb_decisions_pending gauge\n"
         "sb_decisions_pending %zu\n",
         decide_pending_fn != NULL ? decide_pending_fn() : (size_t)0);
    if (live_tokens_fn != NULL) {
        long long n = live_tokens_fn();
        if (n >= 0)
            emit(&o, "# HELP sb_tokens_live Live tokens in the token store.\n# TYPE sb_tokens_live gauge\nsb_tokens_live %lld\n",
                 n);
    }
    emit(&o,
         "# HELP sb_audit_dropped_total Audit lines lost: the audit buffer was full, or the sink failed to take them.\n"
         "# TYPE sb_audit_dropped_total counter\nsb_audit_dropped_total %llu\n",
         (unsigned long long)sb_audit_dropped());
    emit(&o,
         "# HELP sb_timeline_dropped_total Run timeline events not kept: a full queue, a store that could not take them, a "
         "run over its cap.\n# TYPE sb_timeline_dropped_total counter\nsb_timeline_dropped_total %llu\n",
         (unsigned long long)atomic_load_explicit(&timeline_dropped, memory_order_relaxed));
    emit(&o,
         "# HELP sb_connections_refused_total Connections closed at accept: max_connections reached.\n"
         "# TYPE sb_connections_refused_total counter\nsb_connections_refused_total %llu\n",
         (unsigned long long)atomic_load_explicit(&connections_refused, memory_order_relaxed));
    emit(&o, "# HELP sb_quota_hits_total Calls refused by a per-run quota.\n# TYPE sb_quota_hits_total counter\n");
    for (size_t i = 0; i < NQUOTAS; ++i)
        emit(&o, "sb_quota_hits_total{quota=\"%s\"} %llu\n", quota_names[i],
             (unsigned long long)atomic_load_explicit(&quota_hits[i], memory_order_relaxed));
#define STORE_EV(e) (unsigned long long)atomic_load_explicit(&store_events[e], memory_order_relaxed)
    emit(&o,
         "# HELP sb_quota_update_failures_total Quota updates sent after a call that failed (the counter waits for expiry).\n"
         "# TYPE sb_quota_update_failures_total counter\nsb_quota_update_failures_total{update=\"release\"} %llu\n"
         "sb_quota_update_failures_total{update=\"fetch_bytes\"} %llu\n"
         "# HELP sb_redis_script_reloads_total Script calls answered NOSCRIPT and resent with the script.\n"
         "# TYPE sb_redis_script_reloads_total counter\nsb_redis_script_reloads_total %llu\n"
         "# HELP sb_redis_primary_switches_total Times a sentinel named another primary (per worker connection).\n"
         "# TYPE sb_redis_primary_switches_total counter\nsb_redis_primary_switches_total %llu\n"
         "# HELP sb_redis_lookups_total Calls whose token and quota were settled without Redis (local) or by asking it.\n"
         "# TYPE sb_redis_lookups_total counter\nsb_redis_lookups_total{path=\"local\"} %llu\n"
         "sb_redis_lookups_total{path=\"redis\"} %llu\n"
         "# HELP sb_redis_tracking_lost_total Invalidation links lost or silent past the store timeout (per worker).\n"
         "# TYPE sb_redis_tracking_lost_total counter\nsb_redis_tracking_lost_total %llu\n",
         STORE_EV(SB_STORE_EV_RELEASE_FAILED), STORE_EV(SB_STORE_EV_FETCH_ADD_FAILED), STORE_EV(SB_STORE_EV_SCRIPT_RELOAD),
         STORE_EV(SB_STORE_EV_PRIMARY_SWITCH), STORE_EV(SB_STORE_EV_LOOKUP_LOCAL), STORE_EV(SB_STORE_EV_LOOKUP_REDIS),
         STORE_EV(SB_STORE_EV_TRACKING_LOST));
#undef STORE_EV
    if (db_up_fn != NULL && db_up_fn() >= 0)
        emit(&o, "# HELP sb_database_up 1 when the database answers.\n# TYPE sb_database_up gauge\nsb_database_up %d\n",
             db_up_fn());
    if (store_up_fn != NULL)
        emit(&o, "# HELP sb_token_store_up 1 when the token store answers.\n# TYPE sb_token_store_up gauge\nsb_token_store_up %d\n",
             store_up_fn());
    if (o.st != SB_OK)
        sb_buf_truncate(out, start);
    return o.st;
}
