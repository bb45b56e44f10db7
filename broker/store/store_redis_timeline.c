/*
 * Run timelines in Redis: one list per run, <prefix>tl:<runId>, capped at
 * timeline_max_events (the newest kept) and expiring timeline_retention_ms
 * after the run's last token (timeline.c says what an event is). A batch is
 * one transaction of plain commands (MULTI, RPUSH, LTRIM, PEXPIREAT NX and
 * GT, EXEC): a script would copy every event into Lua and back, which cost
 * Redis about twice the CPU per event.
 *
 * Events are written off the call's critical path: sb_store__redis_timeline_add
 * only copies the event into the worker's queue (bounded by
 * SB_TIMELINE_QUEUE_MAX events); TL_BATCH_MS after the first event queued (or
 * at the end of the loop pass once the queue is half full) the queue goes out
 * as one transaction per run and per TL_PER_CMD events, pipelined with
 * whatever else the pass sends, and nobody waits for the answers. Under load one transaction then carries the events of many calls,
 * which is what keeps the timeline's cost per call small (tests/bench/audit.sh). The drain before a worker stops outlasts
 * TL_BATCH_MS, so a clean shutdown sends what is queued. A full queue, a store that is not usable, or an answer that is an error
 * drops the events and counts them (sb_timeline_dropped_total); the calls never notice.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "obs/log.h"
#include "store/store_redis_int.h"
#include "util/util.h"

/* events of one run in one command at most */
#define TL_PER_CMD 128
/* how long the first event of a batch waits for others */
#define TL_BATCH_MS 20

/* the bytes of the events queued, all in one arena: no allocation per event */
#define TL_ARENA (1024u * 1024u)

typedef struct st_tl_event_t {
    char run_id[SB_MAX_RUN_ID + 1];
    int64_t keep_until_ms;
    char *ev; /* into the arena; NULL once sent */
    size_t len;
} tl_event_t;

typedef struct st_sb_tl_queue_t {
    tl_event_t ev[SB_TIMELINE_QUEUE_MAX];
    size_t n;
    char *arena;
    size_t used;
} sb_tl_queue_t;

static void tl_key(const sb_store_t *s, const char *run_id, char *out, size_t outsz, size_t *len)
{
    int n = snprintf(out, outsz, "%stl:%s", s->prefix, run_id);
    *len = (size_t)n < outsz ? (size_t)n : outsz - 1;
}

/* the answers inside the transaction: +OK, +QUEUED, or an error that EXEC reports again */
static void on_queued(cmd_t *cmd, redisReply *reply)
{
    (void)cmd;
    (void)reply;
}

/* EXEC: RPUSH's count, LTRIM's OK, and the two PEXPIREATs' integers */
static void on_added(cmd_t *cmd, redisReply *reply)
{
    int ok = reply != NULL && reply->type == REDIS_REPLY_ARRAY && reply->elements == 4 &&
             reply->element[0]->type == REDIS_REPLY_INTEGER && reply->element[1]->type == REDIS_REPLY_STATUS &&
             reply->element[2]->type == REDIS_REPLY_INTEGER && reply->element[3]->type == REDIS_REPLY_INTEGER;
    if (!ok) {
        sb_logline_t l;
        sb_store__timeline_dropped_add((uint64_t)cmd->limit);
        sb_log_begin(&l, SB_LOG_WARN, "timeline.failed");
        sb_log_cstr(&l, "runId", cmd->run_id);
        sb_log_int(&l, "events", cmd->limit);
        sb_log_cstr(&l, "reason",
                    reply == NULL                      ? "the store did not answer"
                    : reply->type == REDIS_REPLY_ERROR ? reply->str
                    : reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_ERROR
                        ? reply->element[0]->str
                        : "an unexpected answer");
        sb_log_end(&l);
    }
}

static void drop_all(sb_tl_queue_t *q)
{
    sb_store__timeline_dropped_add(q->n);
    q->n = 0;
    q->used = 0;
}

static void flush_queue(redis_conn_t *rc);

static void on_tl_flush(h2o_timeout_entry_t *entry)
{
    flush_queue(H2O_STRUCT_FROM_MEMBER(redis_conn_t, tl_flush, entry));
}

static void on_tl_soon(h2o_timeout_entry_t *entry)
{
    flush_queue(H2O_STRUCT_FROM_MEMBER(redis_conn_t, tl_soon, entry));
}

static void flush_queue(redis_conn_t *rc)
{
    sb_tl_queue_t *q = rc->tl;
    char key[KEY_MAX], cap[24], until[24];
    const char *argv[2 + TL_PER_CMD];
    size_t lens[2 + TL_PER_CMD], klen;

    if (h2o_timeout_is_linked(&rc->tl_flush))
        h2o_timeout_unlink(&rc->tl_flush);
    if (h2o_timeout_is_linked(&rc->tl_soon))
        h2o_timeout_unlink(&rc->tl_soon);
    if (q == NULL || q->n == 0)
        return;
    if (!sb_store__redis_usable_now(rc, mono_ms())) {
        drop_all(q);
        return;
    }
    snprintf(cap, sizeof(cap), "-%zu", rc->store->tl_max_events);
    /* one command per run and per TL_PER_CMD events, each run's events in the order they came */
    for (size_t i = 0; i < q->n;) {
        const char *run = q->ev[i].run_id; /* inline in the event: stays while its text is freed */
        size_t idx[TL_PER_CMD], nev = 0;
        int64_t keep = 0;
        int argc = 2;
        cmd_t *cmd;

        if (q->ev[i].ev == NULL) {
            ++i;
            continue;
        }
        tl_key(rc->store, run, key, sizeof(key), &klen);
        argv[0] = "RPUSH";
        lens[0] = 5;
        argv[1] = key;
        lens[1] = klen;
        for (size_t j = i; j < q->n && nev < TL_PER_CMD; ++j) {
            tl_event_t *e = &q->ev[j];
            if (e->ev == NULL || strcmp(e->run_id, run) != 0)
                continue;
            if (e->keep_until_ms > keep)
                keep = e->keep_until_ms;
            argv[argc] = e->ev;
            lens[argc++] = e->len;
            idx[nev++] = j;
        }
        snprintf(until, sizeof(until), "%lld", (long long)keep);
        /*
         * One transaction, written in one piece with nothing between (this
         * loop runs to its end): the list, kept to its cap, and its expiry
         * set when it has none (NX) or pushed later (GT), never earlier
         */
        {
            const char *mv[1] = {"MULTI"}, *ev[1] = {"EXEC"}, *tv[4] = {"LTRIM", key, cap, "-1"};
            const char *nx[4] = {"PEXPIREAT", key, until, "NX"}, *gt[4] = {"PEXPIREAT", key, until, "GT"};
            size_t ml[1] = {5}, el[1] = {4}, tl[4] = {5, klen, strlen(cap), 2}, xl[4] = {9, klen, strlen(until), 2};
            sb_store__redis_cmd_send(sb_store__redis_cmd_new(rc, "timeline MULTI", on_queued, -1, 1, mv, ml));
            /* the command copies its arguments: the events it carries can go */
            sb_store__redis_cmd_send(sb_store__redis_cmd_new(rc, "timeline RPUSH", on_queued, -1, argc, argv, lens));
            sb_store__redis_cmd_send(sb_store__redis_cmd_new(rc, "timeline LTRIM", on_queued, -1, 4, tv, tl));
            sb_store__redis_cmd_send(sb_store__redis_cmd_new(rc, "timeline PEXPIREAT", on_queued, -1, 4, nx, xl));
            sb_store__redis_cmd_send(sb_store__redis_cmd_new(rc, "timeline PEXPIREAT", on_queued, -1, 4, gt, xl));
            cmd = sb_store__redis_cmd_new(rc, "timeline EXEC", on_added, -1, 1, ev, el);
        }
        cmd->limit = (int64_t)nev;
        snprintf(cmd->run_id, sizeof(cmd->run_id), "%s", run);
        for (size_t k = 0; k < nev; ++k)
            q->ev[idx[k]].ev = NULL;
        sb_store__redis_cmd_send(cmd);
    }
    q->n = 0;
    q->used = 0;
}

void sb_store__redis_timeline_add(void *p, const char *run_id, int64_t keep_until_ms, const char *ev, size_t len)
{
    redis_conn_t *rc = p;
    tl_event_t *e;

    if (rc->tl == NULL) {
        rc->tl = sb_mem_calloc(1, sizeof(*rc->tl));
        rc->tl->arena = sb_mem_alloc(TL_ARENA);
        h2o_timeout_init(rc->loop, &rc->tl_timeout, TL_BATCH_MS);
        rc->tl_flush.cb = on_tl_flush;
        rc->tl_soon.cb = on_tl_soon;
    }
    if (rc->tl->n == SB_TIMELINE_QUEUE_MAX || rc->tl->used + len > TL_ARENA || strlen(run_id) > SB_MAX_RUN_ID) {
        sb_store__timeline_dropped_add(1);
        return;
    }
    e = &rc->tl->ev[rc->tl->n++];
    memcpy(e->run_id, run_id, strlen(run_id) + 1);
    e->keep_until_ms = keep_until_ms;
    e->ev = rc->tl->arena + rc->tl->used;
    memcpy(e->ev, ev, len);
    e->len = len;
    rc->tl->used += len;
    if (!h2o_timeout_is_linked(&rc->tl_flush))
        h2o_timeout_link(rc->loop, &rc->tl_timeout, &rc->tl_flush);
    if ((rc->tl->n >= SB_TIMELINE_QUEUE_MAX / 2 || rc->tl->used >= TL_ARENA / 2) && !h2o_timeout_is_linked(&rc->tl_soon))
        h2o_timeout_link(rc->loop, &rc->flush_timeout, &rc->tl_soon);
}

void sb_store__redis_timeline_dispose(redis_conn_t *rc)
{
    if (rc->tl == NULL)
        return;
    if (h2o_timeout_is_linked(&rc->tl_flush))
        h2o_timeout_unlink(&rc->tl_flush);
    if (h2o_timeout_is_linked(&rc->tl_soon))
        h2o_timeout_unlink(&rc->tl_soon);
    h2o_timeout_dispose(rc->loop, &rc->tl_timeout);
    drop_all(rc->tl);
    sb_mem_free(rc->tl->arena);
    sb_mem_free(rc->tl);
    rc->tl = NULL;
}

/* ---- reading ------------------------------------------------------------------------------------------------------------ */

static void on_range(cmd_t *cmd, redisReply *reply)
{
    sb_view_t *views;
    size_t n = 0;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) {
        cmd->cb.timeline(cmd->arg, SB_E_UNAVAILABLE, NULL, 0);
        return;
    }
    /* at most what was asked for (LRANGE -max -1): a longer answer is not the list we wrote */
    if (reply->elements > cmd->rc->store->tl_max_events) {
        cmd->cb.timeline(cmd->arg, SB_E_UNAVAILABLE, NULL, 0);
        return;
    }
    views = sb_mem_calloc(reply->elements + 1, sizeof(*views));
    for (size_t i = 0; i < reply->elements; ++i) {
        const redisReply *e = reply->element[i];
        /* what the store hands back is bounded as the writer bounds it; anything else is not an event */
        if (e->type != REDIS_REPLY_STRING || e->len == 0 || e->len > SB_LOGLINE_MAX + 64)
            continue;
        views[n].base = (const uint8_t *)e->str;
        views[n++].len = e->len;
    }
    cmd->cb.timeline(cmd->arg, SB_OK, views, n);
    sb_mem_free(views);
}

void sb_store__redis_timeline_get(void *p, const char *run_id, sb_store_timeline_cb cb, void *arg)
{
    redis_conn_t *rc = p;
    char key[KEY_MAX], from[24];
    const char *argv[4];
    size_t lens[4], klen;
    cmd_t *cmd;

    if (!sb_store__redis_usable_now(rc, mono_ms())) {
        cb(arg, SB_E_UNAVAILABLE, NULL, 0);
        return;
    }
    tl_key(rc->store, run_id, key, sizeof(key), &klen);
    snprintf(from, sizeof(from), "-%zu", rc->store->tl_max_events);
    argv[0] = "LRANGE";
    lens[0] = 6;
    argv[1] = key;
    lens[1] = klen;
    argv[2] = from;
    lens[2] = strlen(from);
    argv[3] = "-1";
    lens[3] = 2;
    cmd = sb_store__redis_cmd_new(rc, "LRANGE", on_range, -1, 4, argv, lens);
    cmd->cb.timeline = cb;
    cmd->arg = arg;
    sb_store__redis_cmd_send(cmd);
}
