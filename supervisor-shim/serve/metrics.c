/*
 * sandbox-shim serve: the /metrics text (metrics.h).
 */
#include <string.h>
#include "serve/metrics.h"

#define SB_SERVE_REFUSAL_NAME(e, n) n,
static const char *const REFUSAL_NAMES[] = {SB_SERVE_REFUSALS(SB_SERVE_REFUSAL_NAME)};
#undef SB_SERVE_REFUSAL_NAME

/* run wall time: from tens of milliseconds to the longest timeoutMs and its grace */
static const double RUN_BUCKETS[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60};
/* from the request to the guest's first instruction (its init frame): milliseconds warm, more cold */
static const double HANDOVER_BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

_Static_assert(sizeof(RUN_BUCKETS) / sizeof(RUN_BUCKETS[0]) <= SB_SERVE_HIST_MAX_BUCKETS, "run buckets fit");
_Static_assert(sizeof(HANDOVER_BUCKETS) / sizeof(HANDOVER_BUCKETS[0]) <= SB_SERVE_HIST_MAX_BUCKETS, "handover buckets fit");

const char *sb_serve_refusal_name(sb_serve_refusal_t r)
{
    return (unsigned)r < SB_SERVE_REFUSE_COUNT ? REFUSAL_NAMES[r] : "unknown";
}

void sb_serve_metrics_init(sb_serve_metrics_t *m)
{
    memset(m, 0, sizeof(*m));
    m->runs.le = RUN_BUCKETS;
    m->runs.n = sizeof(RUN_BUCKETS) / sizeof(RUN_BUCKETS[0]);
    m->handover.le = HANDOVER_BUCKETS;
    m->handover.n = sizeof(HANDOVER_BUCKETS) / sizeof(HANDOVER_BUCKETS[0]);
}

void sb_serve_hist_observe(sb_serve_hist_t *h, int64_t ms)
{
    double s = (double)ms / 1000.0;
    for (size_t i = 0; i < h->n; ++i)
        if (s <= h->le[i])
            ++h->buckets[i];
    ++h->count;
    h->sum += s;
}

/* the buckets are cumulative already (sb_serve_hist_observe counts each observation in every bucket it fits) */
static sb_status_t hist_text(sb_buf_t *t, const char *name, const char *help, const sb_serve_hist_t *h)
{
    sb_status_t st = sb_buf_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i < h->n && st == SB_OK; ++i)
        st = sb_buf_printf(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], h->buckets[i]);
    if (st == SB_OK)
        st = sb_buf_printf(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, h->count, name, h->sum, name,
                           h->count);
    return st;
}

sb_status_t sb_serve_metrics_text(const sb_serve_metrics_t *m, const sb_serve_gauges_t *g, sb_buf_t *t)
{
    /* the first append that fails sticks */
    sb_status_t st =
        sb_buf_append_str(t, "# HELP sb_serve_runs_total POST /run requests by outcome.\n# TYPE sb_serve_runs_total counter\n");
    for (unsigned i = 0; i < SB_SERVE_OUT_COUNT && st == SB_OK; ++i)
        st = sb_buf_printf(t, "sb_serve_runs_total{outcome=\"%s\"} %llu\n", sb_serve_outcome_name((sb_serve_outcome_t)i),
                           m->outcomes[i]);
    if (st == SB_OK)
        st = sb_buf_append_str(t, "# HELP sb_serve_refused_total Connections and requests refused before admission, by why.\n"
                                  "# TYPE sb_serve_refused_total counter\n");
    for (unsigned i = 0; i < SB_SERVE_REFUSE_COUNT && st == SB_OK; ++i)
        st = sb_buf_printf(t, "sb_serve_refused_total{refusal=\"%s\"} %llu\n", REFUSAL_NAMES[i], m->refusals[i]);
    if (st == SB_OK)
        st = sb_buf_printf(t,
                           "# HELP sb_serve_refusal_log_suppressed_total Refusals not logged (over the log budget).\n"
                           "# TYPE sb_serve_refusal_log_suppressed_total counter\nsb_serve_refusal_log_suppressed_total %llu\n"
                           "# HELP sb_serve_connections Open client connections, by state.\n# TYPE sb_serve_connections gauge\n"
                           "sb_serve_connections{state=\"gated\"} %zu\nsb_serve_connections{state=\"open\"} %zu\n",
                           m->log_suppressed, g->gated, g->open);
    if (st == SB_OK)
        st = hist_text(t, "sb_serve_run_duration_seconds", "Wall time of runs that got a process.", &m->runs);
    if (st == SB_OK)
        st = sb_buf_printf(t,
                           "# HELP sb_serve_runs_in_flight Runs with a process.\n# TYPE sb_serve_runs_in_flight gauge\n"
                           "sb_serve_runs_in_flight %u\n"
                           "# HELP sb_serve_guests_alive Guest processes running.\n# TYPE sb_serve_guests_alive gauge\n"
                           "sb_serve_guests_alive %u\n"
                           "# HELP sb_serve_jail_setup_failures_total Guests not started because their jail could not be set up.\n"
                           "# TYPE sb_serve_jail_setup_failures_total counter\nsb_serve_jail_setup_failures_total %llu\n"
                           "# HELP sb_serve_max_runs The --max-runs cap.\n# TYPE sb_serve_max_runs gauge\nsb_serve_max_runs %u\n",
                           g->runs, g->guests, m->jail_failures, g->max_runs);
    if (st == SB_OK)
        st = hist_text(t, "sb_serve_handover_seconds", "From the request to the guest's first instruction (its init frame).",
                       &m->handover);
    if (st == SB_OK)
        st = sb_buf_printf(
            t,
            "# HELP sb_serve_pool_runs_total Runs by how their guest started: pooled (a hit) or cold.\n"
            "# TYPE sb_serve_pool_runs_total counter\n"
            "sb_serve_pool_runs_total{start=\"pooled\"} %llu\nsb_serve_pool_runs_total{start=\"cold\"} %llu\n"
            "# HELP sb_serve_pool_misses_total Runs of a pooled memory class that found no guest ready (started cold).\n"
            "# TYPE sb_serve_pool_misses_total counter\nsb_serve_pool_misses_total %llu\n"
            "# HELP sb_serve_pool_started_total Pooled guests started and ready.\n"
            "# TYPE sb_serve_pool_started_total counter\nsb_serve_pool_started_total %llu\n"
            "# HELP sb_serve_pool_start_failures_total Pooled guests that could not be started.\n"
            "# TYPE sb_serve_pool_start_failures_total counter\nsb_serve_pool_start_failures_total %llu\n"
            "# HELP sb_serve_pool_died_total Pooled guests that died while waiting for a run (replaced).\n"
            "# TYPE sb_serve_pool_died_total counter\nsb_serve_pool_died_total %llu\n"
            "# HELP sb_serve_pool_guests Pooled guests now, by state.\n# TYPE sb_serve_pool_guests gauge\n"
            "sb_serve_pool_guests{state=\"ready\"} %llu\nsb_serve_pool_guests{state=\"starting\"} %llu\n",
            /* a guest found dead at the hand-over: its run started cold, and the guest died waiting */
            (unsigned long long)g->pool.hits - (m->handover_deaths < g->pool.hits ? m->handover_deaths : g->pool.hits),
            (unsigned long long)g->pool.cold + m->handover_deaths, (unsigned long long)g->pool.misses,
            (unsigned long long)g->pool.refills, (unsigned long long)g->pool.refill_failures,
            (unsigned long long)g->pool.died + m->handover_deaths, (unsigned long long)g->pool.idle,
            (unsigned long long)g->pool.starting);
    return st;
}
