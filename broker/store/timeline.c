/*
 * The run timeline: every decision made for a run, kept with the token store
 * so that GET /admin/v1/runs/<runId>/events answers from any instance
 * (docs/audit.md, "The run timeline").
 *
 * Events are JSON objects built by the caller with the log's line writer
 * (escaped, at most SB_LOGLINE_MAX bytes), opened by sb_store_timeline_begin
 * with the time, the instance and a per-instance sequence number, so a
 * reader can put the events of several instances in order.
 *
 * Nothing here is on a call's critical path: the memory backend appends
 * under a lock held for a copy; the Redis backend queues the event on the
 * worker and sends the queue once the loop pass is over
 * (store_redis_timeline.c). A full queue, an unusable store or a failed
 * write drops events, counted in sb_timeline_dropped_total, never a call.
 *
 * The memory backend keeps, per instance, at most timeline_max_events
 * events per run (the newest), SB_TIMELINE_MAX_RUNS runs and SB_TIMELINE_MAX_BYTES
 * bytes (the run whose events expire first goes); a run's events are
 * forgotten timeline_retention_ms after its last token expires.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "obs/audit.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "store/store_int.h"
#include "util/util.h"

#define TL_BUCKETS 1024

typedef struct st_tl_run_t {
    struct st_tl_run_t *next;
    int64_t keep_until_ms;
    char **ev; /* a ring of max_events copies */
    size_t *evlen;
    size_t first, count;
    char run_id[];
} tl_run_t;

static _Atomic uint64_t seq;
static char inst[17];
static pthread_once_t inst_once = PTHREAD_ONCE_INIT;

static void inst_init(void)
{
    uint8_t id[8];
    const char *a = sb_audit_instance();
    if (a != NULL) {
        /* the audit stream's id: an event and its audit record name the same instance */
        memcpy(inst, a, 16);
        return;
    }
    if (sb_random(id, sizeof(id)) != SB_OK)
        memset(id, 0, sizeof(id));
    sb_hex(id, sizeof(id), inst);
}

void sb_store__timeline_dropped_add(uint64_t n)
{
    sb_metrics_timeline_dropped(n);
}

uint64_t sb_store_timeline_dropped(void)
{
    return sb_metrics_timeline_dropped_total();
}

int sb_store_timeline_enabled(const sb_store_conn_t *c)
{
    return c != NULL && c->store->tl_max_events != 0;
}

static void timeline_begin_as(sb_logline_t *l, const char *type, const sb_logline_t *as)
{
    pthread_once(&inst_once, inst_init);
    sb_log_begin_always_as(l, type, as);
    sb_log_cstr(l, "inst", inst);
    sb_log_int(l, "n", (long long)atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed));
}

void sb_store_timeline_begin(sb_logline_t *l, const char *type)
{
    timeline_begin_as(l, type, NULL);
}

void sb_store_timeline_from(const sb_logline_t *src, const char *type, sb_store_conn_t *c, const char *run_id,
                            int64_t expires_at_ms)
{
    /* src is {"ts":"<24 characters>","event":"<name>" and fields, still open (sb_log_begin_always) */
    static const size_t ts_end = 7 + 24, ev_at = 7 + 24 + 11;
    const char *q;
    sb_logline_t l;
    size_t rest;

    if (!src->enabled || src->len <= ev_at || memcmp(src->buf + ts_end, "\",\"event\":\"", 11) != 0 ||
        (q = memchr(src->buf + ev_at, '"', src->len - ev_at)) == NULL)
        return;
    /* the same time as the line it comes from */
    timeline_begin_as(&l, type, src);
    rest = src->len - (size_t)(q + 1 - src->buf);
    if (l.len + rest + 32 <= SB_LOGLINE_MAX && !src->truncated) {
        memcpy(l.buf + l.len, q + 1, rest);
        l.len += rest;
    } else {
        l.truncated = 1; /* the fields do not fit after the longer head: the event keeps only its head */
    }
    sb_store_timeline_end(&l, c, run_id, expires_at_ms);
}

static size_t tl_bucket(const char *run_id)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = run_id; *p != '\0'; ++p)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return (size_t)(h % TL_BUCKETS);
}

/* what a run's ring costs besides its events */
static size_t run_overhead(size_t max)
{
    return sizeof(tl_run_t) + max * (sizeof(char *) + sizeof(size_t));
}

static void free_run(sb_store_t *s, tl_run_t *r)
{
    size_t max = s->tl_max_events;
    for (size_t i = 0; i < max; ++i) {
        if (r->ev[i] != NULL)
            s->tl_bytes -= r->evlen[i];
        sb_mem_free(r->ev[i]);
    }
    s->tl_bytes -= run_overhead(max);
    sb_mem_free(r->ev);
    sb_mem_free(r->evlen);
    sb_mem_free(r);
}

/*
 * Drops expired runs; then, while the runs (`need_run`: one more run) or the bytes (`need_bytes`
 * more) are over their caps, the run whose events expire first, never `keep`. 0 when there is room.
 */
static int make_room_locked(sb_store_t *s, int64_t now, int need_run, size_t need_bytes, const tl_run_t *keep)
{
    for (;;) {
        tl_run_t **victim = NULL;
        for (size_t b = 0; b < TL_BUCKETS; ++b) {
            for (tl_run_t **pp = &s->tl_buckets[b]; *pp != NULL;) {
                if ((*pp)->keep_until_ms <= now && *pp != keep) {
                    tl_run_t *r = *pp;
                    *pp = r->next;
                    free_run(s, r);
                    --s->tl_nruns;
                    continue;
                }
                if (*pp != keep && (victim == NULL || (*pp)->keep_until_ms < (*victim)->keep_until_ms))
                    victim = pp;
                pp = &(*pp)->next;
            }
        }
        if (!(need_run && s->tl_nruns >= SB_TIMELINE_MAX_RUNS) && s->tl_bytes + need_bytes <= s->tl_max_bytes)
            return 0;
        if (victim == NULL)
            return -1;
        {
            tl_run_t *r = *victim;
            *victim = r->next;
            sb_store__timeline_dropped_add(r->count);
            free_run(s, r);
            --s->tl_nruns;
        }
    }
}

static void memory_add(sb_store_t *s, const char *run_id, int64_t now, int64_t keep_until_ms, const char *ev, size_t len)
{
    size_t b = tl_bucket(run_id), slot;
    tl_run_t *r;

    pthread_mutex_lock(&s->tl_mu);
    if (s->tl_buckets == NULL)
        s->tl_buckets = sb_mem_calloc(TL_BUCKETS, sizeof(*s->tl_buckets));
    for (r = s->tl_buckets[b]; r != NULL && strcmp(r->run_id, run_id) != 0; r = r->next)
        ;
    if (r == NULL) {
        size_t rl = strlen(run_id);
        if ((s->tl_nruns >= SB_TIMELINE_MAX_RUNS || s->tl_bytes + run_overhead(s->tl_max_events) + len > s->tl_max_bytes) &&
            make_room_locked(s, now, 1, run_overhead(s->tl_max_events) + len, NULL) != 0) {
            sb_store__timeline_dropped_add(1);
            pthread_mutex_unlock(&s->tl_mu);
            return;
        }
        r = sb_mem_calloc(1, sizeof(*r) + rl + 1);
        memcpy(r->run_id, run_id, rl + 1);
        r->ev = sb_mem_calloc(s->tl_max_events, sizeof(*r->ev));
        r->evlen = sb_mem_calloc(s->tl_max_events, sizeof(*r->evlen));
        r->next = s->tl_buckets[b];
        s->tl_buckets[b] = r;
        ++s->tl_nruns;
        s->tl_bytes += run_overhead(s->tl_max_events);
    } else if (s->tl_bytes + len > s->tl_max_bytes && make_room_locked(s, now, 0, len, r) != 0) {
        /* over the byte budget with nothing else to give way: the event is not kept */
        sb_store__timeline_dropped_add(1);
        pthread_mutex_unlock(&s->tl_mu);
        return;
    }
    if (keep_until_ms > r->keep_until_ms)
        r->keep_until_ms = keep_until_ms;
    if (r->count == s->tl_max_events) {
        /* capped: the oldest goes, its memory taken for the new one (a line's length barely changes: mostly in place) */
        slot = r->first;
        r->first = (r->first + 1) % s->tl_max_events;
        s->tl_bytes -= r->evlen[slot];
        r->ev[slot] = sb_mem_realloc(r->ev[slot], len);
        sb_store__timeline_dropped_add(1);
    } else {
        slot = (r->first + r->count++) % s->tl_max_events;
        r->ev[slot] = sb_mem_alloc(len);
    }
    memcpy(r->ev[slot], ev, len);
    r->evlen[slot] = len;
    s->tl_bytes += len;
    pthread_mutex_unlock(&s->tl_mu);
}

void sb_store_timeline_end(sb_logline_t *l, sb_store_conn_t *c, const char *run_id, int64_t expires_at_ms)
{
    sb_store_t *s = c->store;
    int64_t keep, now;

    if (!l->enabled || run_id == NULL || run_id[0] == '\0' || s->tl_max_events == 0)
        return;
    if (l->truncated) {
        static const char mark[] = ",\"truncated\":true";
        memcpy(l->buf + l->len, mark, sizeof(mark) - 1);
        l->len += sizeof(mark) - 1;
    }
    l->buf[l->len++] = '}';
    now = sb_now_ms();
    keep = (expires_at_ms > now ? expires_at_ms : now) + (int64_t)s->tl_retention_ms;
    if (s->is_redis)
        sb_store__redis_timeline_add(c->redis, run_id, keep, l->buf, l->len);
    else
        memory_add(s, run_id, now, keep, l->buf, l->len);
}

void sb_store_timeline_get(sb_store_conn_t *c, const char *run_id, sb_store_timeline_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    sb_view_t *views;
    char **copies;
    size_t n = 0;
    tl_run_t *r = NULL;

    if (s->tl_max_events == 0) {
        cb(arg, SB_OK, NULL, 0);
        return;
    }
    if (s->is_redis) {
        sb_store__redis_timeline_get(c->redis, run_id, cb, arg);
        return;
    }
    pthread_mutex_lock(&s->tl_mu);
    if (s->tl_buckets != NULL)
        for (r = s->tl_buckets[tl_bucket(run_id)]; r != NULL && strcmp(r->run_id, run_id) != 0; r = r->next)
            ;
    if (r != NULL && r->keep_until_ms <= sb_now_ms())
        r = NULL;
    n = r != NULL ? r->count : 0;
    views = sb_mem_calloc(n + 1, sizeof(*views));
    copies = sb_mem_calloc(n + 1, sizeof(*copies));
    for (size_t i = 0; i < n; ++i) {
        size_t slot = (r->first + i) % s->tl_max_events;
        copies[i] = sb_mem_alloc(r->evlen[slot]);
        memcpy(copies[i], r->ev[slot], r->evlen[slot]);
        views[i].base = (const uint8_t *)copies[i];
        views[i].len = r->evlen[slot];
    }
    pthread_mutex_unlock(&s->tl_mu);
    cb(arg, SB_OK, views, n);
    for (size_t i = 0; i < n; ++i)
        sb_mem_free(copies[i]);
    sb_mem_free(copies);
    sb_mem_free(views);
}

void sb_store__timeline_free(sb_store_t *s)
{
    if (s->tl_buckets != NULL) {
        for (size_t b = 0; b < TL_BUCKETS; ++b) {
            tl_run_t *r = s->tl_buckets[b];
            while (r != NULL) {
                tl_run_t *next = r->next;
                free_run(s, r);
                r = next;
            }
        }
        sb_mem_free(s->tl_buckets);
    }
    pthread_mutex_destroy(&s->tl_mu);
}
