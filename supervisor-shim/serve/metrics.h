/*
 * sandbox-shim serve: what it counts, and the /metrics text made of it. serve.c counts (one
 * thread, the event loop); this file names the refusals and the histograms' buckets and writes
 * the Prometheus text, the whole of it or nothing.
 */
#ifndef SB_SERVE_METRICS_H
#define SB_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "sb/buf.h"
#include "serve/serve_int.h"
#include "serve/launcher.h"

/* why a connection or a request was refused before admission (sb_serve_refused_total{refusal}) */
#define SB_SERVE_REFUSALS(X)                                                                                                       \
    X(SB_SERVE_REFUSE_HEAD, "bad_head")                                                                                            \
    X(SB_SERVE_REFUSE_FRAMING, "framing")                                                                                          \
    X(SB_SERVE_REFUSE_DENIED, "admission")                                                                                         \
    X(SB_SERVE_REFUSE_TOO_LARGE, "too_large")                                                                                      \
    X(SB_SERVE_REFUSE_HEAD_TIMEOUT, "head_timeout")                                                                                \
    X(SB_SERVE_REFUSE_EVICTED, "evicted")                                                                                          \
    X(SB_SERVE_REFUSE_CONN_LIMIT, "connection_limit")
#define SB_SERVE_REFUSAL_ENUM(e, n) e,
typedef enum en_sb_serve_refusal_t { SB_SERVE_REFUSALS(SB_SERVE_REFUSAL_ENUM) SB_SERVE_REFUSE_COUNT } sb_serve_refusal_t;
#undef SB_SERVE_REFUSAL_ENUM

/** the refusal's label value ("bad_head", ...) */
const char *sb_serve_refusal_name(sb_serve_refusal_t r);

#define SB_SERVE_HIST_MAX_BUCKETS 12

/* a histogram with fixed upper bounds in seconds; each observation counts in every bucket it fits */
typedef struct st_sb_serve_hist_t {
    const double *le;
    size_t n;
    unsigned long long buckets[SB_SERVE_HIST_MAX_BUCKETS], count;
    double sum;
} sb_serve_hist_t;

typedef struct st_sb_serve_metrics_t {
    unsigned long long outcomes[SB_SERVE_OUT_COUNT];
    unsigned long long refusals[SB_SERVE_REFUSE_COUNT];
    unsigned long long log_suppressed; /* refusals the log's budget left out */
    unsigned long long jail_failures;
    /* runs whose pooled guest had died by the time the run reached it: the launcher counted a hit, the run started cold */
    unsigned long long handover_deaths;
    sb_serve_hist_t runs;     /* wall time of runs that got a process */
    sb_serve_hist_t handover; /* from the request to the guest's init frame */
} sb_serve_metrics_t;

/* what is true now, read when the text is made */
typedef struct st_sb_serve_gauges_t {
    size_t gated, open; /* connections */
    unsigned runs, guests, max_runs;
    sb_serve_pool_stats_t pool;
} sb_serve_gauges_t;

/** zeroes the counters and gives both histograms their buckets */
void sb_serve_metrics_init(sb_serve_metrics_t *m);
/** counts one observation of `ms` milliseconds */
void sb_serve_hist_observe(sb_serve_hist_t *h, int64_t ms);
/**
 * The Prometheus text of the counters and the gauges, appended to `out`.
 * @return SB_OK, or the first append's failure (the caller answers 500, never a cut text)
 */
sb_status_t sb_serve_metrics_text(const sb_serve_metrics_t *m, const sb_serve_gauges_t *g, sb_buf_t *out);

#endif
