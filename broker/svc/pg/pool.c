/*
 * PostgreSQL for collections, the document store and table globals: a small
 * pool of non-blocking libpq connections per worker, on the worker's h2o loop
 * (pool.c; the schema introspection is schema.c, the collections and
 * document-store handler pg.c, table globals globals.c).
 *
 * deps.md: libpq may close and reopen its socket during PQconnectPoll (with
 * the same fd number), so while connecting the h2o wrapper is re-created
 * after every poll. The schema is introspected on the first connection of
 * each pool; until then, and whenever no connection is up, data calls answer
 * unavailable (fail closed); other methods are unaffected. A statement that
 * outlives the statement_timeout (set once per session, in the startup
 * options) fails on the server; one that outlives the client watchdog resets
 * its connection.
 *
 * Each connection runs one call at a time, as one flight in pipeline mode
 * (libpq 15): [BEGIN] [DEALLOCATE] [PREPARE] the statement, then a sync, sent
 * in one write; a write's COMMIT or ROLLBACK is a second flight, once the
 * answer is decided. A connection keeps SB_PG_STMT_CACHE prepared statements,
 * found by their text, so a statement seen before costs the server neither a
 * parse nor a plan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <libpq-fe.h>
#include "obs/log.h"
#include "sb/mem.h"
#include "svc/pg/pg_int.h"
#include "util/util.h"

#define STATEMENT_TIMEOUT_MS 5000
#define WATCHDOG_MS 8000
/* while the database is down: a connection attempt at least this often (the pool ticks every 100 ms) */
#define PROBE_MS 200
/* while the role lacks privileges: how often they are looked at again (a GRANT then turns /readyz green by itself) */
#define RECHECK_MS 5000

static void conn_start(pconn_t *c);
static void pump(sb_pg_pool_t *p);
static void start_introspection(sb_pg_pool_t *p, pconn_t *c);

/* ---- results back to the route -------------------------------------------------------------------------------------- */

void sb_pg__deliver(job_t *job)
{
    job->dcb(job->arg, &job->prepared);
    sb_result_dispose(&job->prepared);
    job->have_prepared = 0;
}

void sb_pg__answer(job_t *job, sb_status_t st, const char *msg, msgpack_sbuffer *value)
{
    sb_result_t res, *r = job->tx && job->phase == 1 ? &job->prepared : &res;

    sb_result_init(r);
    if (st != SB_OK)
        sb_result_fail(r, st, "%s", msg != NULL ? msg : "");
    else if (value != NULL)
        r->value = *value; /* moved: the caller no longer owns it */
    if (r == &job->prepared) {
        /* inside the transaction: decide now, answer once COMMIT or ROLLBACK has run */
        job->have_prepared = 1;
        return;
    }
    job->dcb(job->arg, &res);
    sb_result_dispose(&res);
}

void sb_pg__free_job(job_t *job)
{
    sb_pg_pool_t *pool = job->pool;

    if (job->have_prepared)
        sb_result_dispose(&job->prepared);
    sb_sql_dispose(&job->q);
    if (job->tok != NULL)
        sb_token_release(job->tok);
    msgpack_sbuffer_destroy(&job->rows);
    sb_mem_free(job);
    sb_pg_pool_release(pool);
}

/* ---- connections ------------------------------------------------------------------------------------------------- */

/*
 * Transitions are logged, not connections: the database going away is one
 * pg.down line for the process (the first pool to lose every connection, or
 * not to get one, says why), and its return one pg.up line (once no pool is
 * down), whatever the number of workers and connections. Closing a pool (a
 * reload replaced it, or the shutdown) is not an event. pools_down counts the
 * pools without a connection, a new pool that has not connected yet
 * included (so pg.up waits for every worker's pool, at start-up too); outage
 * is 2 until the first pg.up or pg.down line, 1 while a pg.down line stands
 * unanswered, 0 otherwise. Workers are threads: __atomic builtins.
 */
static int pools_down, outage = 2;

static void note_state(sb_pg_pool_t *p, const char *why)
{
    int up = 0, prev = p->up;
    sb_logline_t l;

    for (size_t i = 0; i < p->nconns; ++i)
        if (p->conns[i].state == C_IDLE || p->conns[i].state == C_BUSY)
            up = 1;
    if (up == prev)
        return;
    p->up = up;
    if (!up) {
        if (prev == 1)
            __atomic_add_fetch(&pools_down, 1, __ATOMIC_SEQ_CST);
        if (__atomic_exchange_n(&outage, 1, __ATOMIC_SEQ_CST) == 1)
            return;
        sb_log_begin(&l, SB_LOG_WARN, "pg.down");
        sb_log_cstr(&l, "addr", p->addr);
        sb_log_cstr(&l, "reason", why != NULL ? why : "unknown");
        sb_log_end(&l);
        return;
    }
    if (__atomic_sub_fetch(&pools_down, 1, __ATOMIC_SEQ_CST) != 0 || __atomic_exchange_n(&outage, 0, __ATOMIC_SEQ_CST) == 0)
        return;
    sb_log_begin(&l, SB_LOG_INFO, "pg.up");
    sb_log_cstr(&l, "addr", p->addr);
    sb_log_cstr(&l, "msg", "the database answers");
    sb_log_end(&l);
}

/* a prepared statement that is gone (or never was): its slot is free; a statement still on the server is replaced by name later */
static void stmt_forget(pconn_t *c, int slot)
{
    sb_mem_free(c->stmts[slot].sql);
    c->stmts[slot].sql = NULL;
    c->stmts[slot].stale = 0;
}

static void stmts_reset(pconn_t *c)
{
    if (c->stmts == NULL)
        return;
    for (size_t i = 0; i < SB_PG_STMT_CACHE; ++i)
        stmt_forget(c, (int)i);
}

static void conn_close(pconn_t *c)
{
    if (c->sock != NULL) {
        h2o_socket_close(c->sock);
        c->sock = NULL;
    }
    if (c->pg != NULL) {
        PQfinish(c->pg);
        c->pg = NULL;
    }
    if (c->result != NULL) {
        PQclear(c->result);
        c->result = NULL;
    }
    c->want_write = 0;
    c->nexpect = c->iexpect = 0;
    c->preparing = c->executing = -1;
    /* prepared statements live as long as the session */
    stmts_reset(c);
}

/* the retry delay after `failures` failed attempts in a row: 100 ms doubling to 3.2 s (a probe notices a return sooner) */
static int64_t backoff_ms(unsigned failures)
{
    return (int64_t)(100u << (failures < 5 ? failures : 5));
}

static void conn_drop(pconn_t *c, const char *reason, int quiet)
{
    job_t *job = c->job;
    char why[256];

    /* the reason is often PQerrorMessage(), which PQfinish frees: copy it first */
    snprintf(why, sizeof(why), "%s", reason != NULL ? reason : "unknown");
    for (char *q = why; *q != '\0'; ++q)
        if (*q == '\n')
            *q = ' ';
    c->job = NULL;
    conn_close(c);
    c->state = C_DOWN;
    c->next_attempt = sb_now_ms() + backoff_ms(c->failures);
    ++c->failures;
    if (!quiet)
        note_state(c->pool, why);
    if (job != NULL) {
        (void)job->cb(job, NULL, "the database connection failed");
        sb_pg__free_job(job);
    }
}

static void conn_fail(pconn_t *c, const char *reason)
{
    conn_drop(c, reason, 0);
}

static void on_io(h2o_socket_t *sock, const char *err);

static void watch(pconn_t *c, int want_write)
{
    int fd;
    if (c->sock == NULL) {
        if ((fd = dup(PQsocket(c->pg))) < 0) {
            conn_fail(c, "dup failed");
            return;
        }
        c->sock = h2o_evloop_socket_create(c->pool->loop, fd, H2O_SOCKET_FLAG_DONT_READ);
        c->sock->data = c;
        h2o_socket_read_start(c->sock, on_io);
    }
    if (want_write && !c->want_write) {
        c->want_write = 1;
        h2o_socket_notify_write(c->sock, on_io);
    }
}

static void connect_poll(pconn_t *c)
{
    PostgresPollingStatusType ps = PQconnectPoll(c->pg);
    /* libpq may have replaced its socket, even under the same number: wrap it anew */
    if (c->sock != NULL) {
        h2o_socket_close(c->sock);
        c->sock = NULL;
        c->want_write = 0;
    }
    switch (ps) {
    case PGRES_POLLING_OK:
        /* pipeline mode: a statement and what it needs (BEGIN, a PREPARE) go out together, one round trip */
        if (PQsetnonblocking(c->pg, 1) != 0 || PQenterPipelineMode(c->pg) != 1) {
            conn_fail(c, "PQsetnonblocking or PQenterPipelineMode failed");
            return;
        }
        if (c->stmts == NULL)
            c->stmts = sb_mem_calloc(SB_PG_STMT_CACHE, sizeof(*c->stmts));
        c->state = C_IDLE;
        c->failures = 0;
        watch(c, 0);
        note_state(c->pool, NULL);
        /* the database is back: the other connections need not wait out their backoff */
        for (size_t i = 0; i < c->pool->nconns; ++i)
            if (c->pool->conns[i].state == C_DOWN)
                c->pool->conns[i].next_attempt = 0;
        /* a new pool (start-up, a reload) learns the schema on its first connection, not at the next tick */
        if (!c->pool->introspected && !c->pool->introspecting)
            start_introspection(c->pool, c);
        else
            pump(c->pool);
        return;
    case PGRES_POLLING_READING:
        watch(c, 0);
        return;
    case PGRES_POLLING_WRITING:
        watch(c, 1);
        return;
    default:
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
}

static void finish_job(pconn_t *c)
{
    job_t *job = c->job;
    PGresult *res = c->result;
    int more;
    c->result = NULL;
    c->nexpect = c->iexpect = 0;
    c->preparing = c->executing = -1;
    more = job->cb(job, res, res == NULL ? "no result" : NULL);
    if (res != NULL)
        PQclear(res);
    if (more && c->job == job)
        return; /* the job's next statement is running on this connection */
    if (c->job == job) {
        c->job = NULL;
        c->state = C_IDLE;
    }
    if (!more)
        sb_pg__free_job(job);
}

static int is_error(ExecStatusType st)
{
    return st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR;
}

/* the next statement of the flight is the job's own: its rows come one at a time (libpq: set before its first result) */
static void enter_item(pconn_t *c)
{
    if (c->iexpect < c->nexpect && c->expect[c->iexpect] == X_MAIN && c->job->on_row != NULL)
        (void)PQsetSingleRowMode(c->pg);
}

/*
 * One flight's results, in the order its statements were sent: each
 * statement's results end with a NULL, the flight with PIPELINE_SYNC. After
 * an error the rest of the flight reports PIPELINE_ABORTED; the first error
 * is what the job sees. Rows of the job's statement go to its row callback as
 * they arrive (single-row mode), so nothing buffers a whole result.
 */
static void read_results(pconn_t *c)
{
    if (PQconsumeInput(c->pg) == 0) {
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    while (c->state == C_BUSY && !PQisBusy(c->pg)) {
        PGresult *r = PQgetResult(c->pg);
        ExecStatusType st;
        expect_t what;
        if (r == NULL) {
            ++c->iexpect;
            enter_item(c);
            continue;
        }
        st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            finish_job(c);
            if (c->state == C_IDLE)
                pump(c->pool);
            return;
        }
        what = c->iexpect < c->nexpect ? c->expect[c->iexpect] : X_MAIN;
        if (st == PGRES_PIPELINE_ABORTED && what == X_PREPARE && c->preparing >= 0) {
            /* an earlier statement of the flight failed, so this PREPARE never ran */
            stmt_forget(c, c->preparing);
            PQclear(r);
            continue;
        }
        if (st == PGRES_SINGLE_TUPLE && what == X_MAIN && c->job->on_row != NULL) {
            c->job->on_row(c->job, r, 0);
            PQclear(r);
            continue;
        }
        if (is_error(st)) {
            const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            if (what == X_PREPARE && c->preparing >= 0) {
                /* not prepared after all: the slot is free again */
                stmt_forget(c, c->preparing);
            } else if (what == X_MAIN && c->executing >= 0 && state != NULL && strcmp(state, "0A000") == 0) {
                /*
                 * "cached plan must not change result type": the table changed
                 * under the prepared statement, which then fails on every use;
                 * the next call deallocates it and prepares it afresh
                 */
                c->stmts[c->executing].stale = 1;
            } else if (what == X_MAIN && c->executing >= 0 && state != NULL && strcmp(state, "26000") == 0) {
                /* "prepared statement does not exist" (the session lost it): prepared anew by the next call */
                stmt_forget(c, c->executing);
            }
            if (c->result == NULL || !is_error(PQresultStatus(c->result))) {
                if (c->result != NULL)
                    PQclear(c->result);
                c->result = r;
                continue;
            }
        } else if ((what == X_MAIN || what == X_TXEND) && st != PGRES_PIPELINE_ABORTED && c->result == NULL) {
            c->result = r;
            continue;
        }
        PQclear(r);
    }
}

static void on_io(h2o_socket_t *sock, const char *err)
{
    pconn_t *c = sock->data;

    if (c->state == C_CONNECTING) {
        connect_poll(c);
        return;
    }
    if (c->want_write) {
        c->want_write = 0;
        if (c->state == C_BUSY) {
            int r = PQflush(c->pg);
            if (r < 0) {
                conn_fail(c, PQerrorMessage(c->pg));
                return;
            }
            if (r == 1)
                watch(c, 1);
        }
    }
    if (c->state == C_BUSY) {
        read_results(c);
    } else if (c->state == C_IDLE) {
        /* an idle connection that becomes readable is closing (or sent a notice) */
        if (PQconsumeInput(c->pg) == 0 || PQstatus(c->pg) != CONNECTION_OK)
            conn_fail(c, "connection closed by the server");
    }
}

static void conn_start(pconn_t *c)
{
    static const char *const keys[] = {"dbname", "options", "connect_timeout", "application_name", NULL};
    char options[128];
    const char *values[5];

    /* the session's settings, once per connection (never a SET per call) */
    snprintf(options, sizeof(options), "-c DateStyle=ISO -c TimeZone=UTC -c statement_timeout=%d", STATEMENT_TIMEOUT_MS);
    values[0] = c->pool->url;
    values[1] = options;
    values[2] = "5";
    values[3] = "sandbox-broker";
    values[4] = NULL;
    /* expand_dbname: database_url may be a URI or a conninfo string */
    c->pg = PQconnectStartParams(keys, values, 1);
    if (c->pg == NULL || PQstatus(c->pg) == CONNECTION_BAD) {
        conn_fail(c, c->pg != NULL ? PQerrorMessage(c->pg) : "out of memory");
        return;
    }
    c->state = C_CONNECTING;
    c->started = sb_now_ms();
    watch(c, 1);
}

static uint64_t text_hash(const char *s)
{
    /* FNV-1a: a lookup key only, the text itself is compared on a hit */
    uint64_t h = 1469598103934665603ull;
    for (; *s != '\0'; ++s)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int flight_push(pconn_t *c, expect_t what)
{
    if (c->nexpect >= SB_PG_FLIGHT_MAX)
        return 0;
    c->expect[c->nexpect++] = what;
    return 1;
}

/* sends what is queued and ends the flight with a sync point */
static void flight_send(pconn_t *c)
{
    int r;
    if (PQpipelineSync(c->pg) != 1) {
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    if ((r = PQflush(c->pg)) < 0) {
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    if (r == 1)
        watch(c, 1);
}

/*
 * Queues the job's statement: through the connection's prepared statement for
 * the same text (prepared in this very flight when it is new, after
 * deallocating the least recently used one when the cache is full), or
 * unnamed. Returns 0 when libpq refused to queue.
 */
static int queue_statement(pconn_t *c, job_t *job)
{
    const char *const *params = (const char *const *)job->q.params;
    pstmt_t *hit = NULL, *slot = NULL;
    char name[32]; /* "DEALLOCATE sb" and a 32-bit id */
    uint64_t h;

    if (job->unnamed || c->stmts == NULL || job->q.len > SB_PG_STMT_TEXT) {
        if (!PQsendQueryParams(c->pg, job->q.sql, job->q.nparams, job->types, params, NULL, NULL, 0))
            return 0;
        return flight_push(c, X_MAIN);
    }
    h = text_hash(job->q.sql);
    for (size_t i = 0; i < SB_PG_STMT_CACHE && hit == NULL; ++i) {
        pstmt_t *s = &c->stmts[i];
        if (s->sql == NULL) {
            if (slot == NULL)
                slot = s;
        } else if (s->hash == h && strcmp(s->sql, job->q.sql) == 0) {
            hit = s;
        }
    }
    if (hit != NULL && hit->stale) {
        /* the table changed under it: the same name, prepared again */
        snprintf(name, sizeof(name), "DEALLOCATE sb%u", hit->id);
        if (!PQsendQueryParams(c->pg, name, 0, NULL, NULL, NULL, NULL, 0) || !flight_push(c, X_DEALLOC))
            return 0;
        snprintf(name, sizeof(name), "sb%u", hit->id);
        if (!PQsendPrepare(c->pg, name, job->q.sql, job->q.nparams, job->types) || !flight_push(c, X_PREPARE))
            return 0;
        hit->stale = 0;
        c->preparing = (int)(hit - c->stmts);
    }
    if (hit == NULL) {
        if (slot == NULL) {
            /* full: the least recently used goes, on the server too */
            slot = &c->stmts[0];
            for (size_t i = 1; i < SB_PG_STMT_CACHE; ++i)
                if (c->stmts[i].used < slot->used)
                    slot = &c->stmts[i];
            snprintf(name, sizeof(name), "DEALLOCATE sb%u", slot->id);
            if (!PQsendQueryParams(c->pg, name, 0, NULL, NULL, NULL, NULL, 0) || !flight_push(c, X_DEALLOC))
                return 0;
            stmt_forget(c, (int)(slot - c->stmts));
        }
        slot->id = ++c->next_id;
        snprintf(name, sizeof(name), "sb%u", slot->id);
        if (!PQsendPrepare(c->pg, name, job->q.sql, job->q.nparams, job->types) || !flight_push(c, X_PREPARE))
            return 0;
        slot->hash = h;
        slot->sql = sb_mem_strdup(job->q.sql);
        c->preparing = (int)(slot - c->stmts);
        hit = slot;
    }
    hit->used = ++c->clock;
    c->executing = (int)(hit - c->stmts);
    snprintf(name, sizeof(name), "sb%u", hit->id);
    if (!PQsendQueryPrepared(c->pg, name, job->q.nparams, params, NULL, NULL, 0))
        return 0;
    return flight_push(c, X_MAIN);
}

/* sends a transaction command (COMMIT, ROLLBACK) on the job's connection, its own flight */
void sb_pg__send_statement(job_t *job, const char *sql)
{
    pconn_t *c = job->conn;
    c->started = sb_now_ms();
    c->nexpect = c->iexpect = 0;
    c->preparing = c->executing = -1;
    if (!PQsendQueryParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0) || !flight_push(c, X_TXEND)) {
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    flight_send(c);
}

/* one flight: [BEGIN] [DEALLOCATE] [PREPARE] the statement, sync */
static void run(pconn_t *c, job_t *job)
{
    c->job = job;
    job->conn = c;
    c->state = C_BUSY;
    c->started = sb_now_ms();
    c->nexpect = c->iexpect = 0;
    c->preparing = c->executing = -1;
    job->phase = 1;
    if (job->tx && (!PQsendQueryParams(c->pg, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) || !flight_push(c, X_BEGIN))) {
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    if (!queue_statement(c, job)) {
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    enter_item(c);
    flight_send(c);
}

/* learns the targets' tables and columns on an idle connection */
static void start_introspection(sb_pg_pool_t *p, pconn_t *c)
{
    job_t *job = sb_mem_calloc(1, sizeof(*job));
    /* calloc: the statement is empty (sb_sql_init) */
    job->q.sql = sb_mem_strdup(sb_pg__introspect_sql);
    job->q.params[0] = sb_pg__table_list(p->targets);
    job->q.nparams = 1;
    job->cb = sb_pg__on_introspected;
    job->arg = p;
    job->unnamed = 1; /* once per pool: not worth a prepared statement */
    p->introspecting = 1;
    p->look = sb_pg__next_look();
    run(c, job);
}

static void pump(sb_pg_pool_t *p)
{
    for (size_t i = 0; i < p->nconns && !h2o_linklist_is_empty(&p->queue); ++i) {
        pconn_t *c = &p->conns[i];
        if (c->state != C_IDLE)
            continue;
        if (!p->introspected && !p->introspecting) {
            /* the first statement on a new pool learns the schema */
            start_introspection(p, c);
            continue;
        }
        if (!p->introspected)
            break;
        {
            job_t *job = H2O_STRUCT_FROM_MEMBER(job_t, link, p->queue.next);
            h2o_linklist_unlink(&job->link);
            --p->queued;
            run(c, job);
        }
    }
}

static void on_tick(h2o_timeout_entry_t *entry)
{
    sb_pg_pool_t *p = H2O_STRUCT_FROM_MEMBER(sb_pg_pool_t, tick, entry);
    int64_t now = sb_now_ms();

    h2o_timeout_link(p->loop, &p->tick_timeout, &p->tick);
    if (p->up != 1) {
        /*
         * Every connection is down and backing off (up to 3.2 s): one probe
         * (a connection attempt) every PROBE_MS notices the database's return
         * within that, however long it was away; its success lets the others
         * reconnect at once.
         */
        int connecting = 0;
        pconn_t *first = NULL;
        for (size_t i = 0; i < p->nconns; ++i) {
            pconn_t *c = &p->conns[i];
            connecting |= c->state == C_CONNECTING;
            if (c->state == C_DOWN && (first == NULL || c->next_attempt < first->next_attempt))
                first = c;
        }
        if (!connecting && first != NULL && now - p->last_probe >= PROBE_MS && now < first->next_attempt) {
            p->last_probe = now;
            first->next_attempt = now;
        }
    }
    for (size_t i = 0; i < p->nconns; ++i) {
        pconn_t *c = &p->conns[i];
        if (c->state == C_DOWN && now >= c->next_attempt)
            conn_start(c);
        else if (c->state == C_CONNECTING && now - c->started > 5000)
            conn_fail(c, "connect timed out");
        else if (c->state == C_BUSY && now - c->started > WATCHDOG_MS) {
            sb_logline_t l;
            sb_log_begin(&l, SB_LOG_WARN, "pg.watchdog");
            sb_log_cstr(&l, "addr", p->addr);
            sb_log_cstr(&l, "msg", "a statement outlived the client watchdog: its connection is reset");
            sb_log_end(&l);
            conn_fail(c, "statement outlived the watchdog");
        }
    }
    /* when the introspection connection is ready, make sure the schema gets learned; missing privileges are looked at again */
    if (!p->introspecting && (!p->introspected || (p->missing != NULL && now - p->last_recheck >= RECHECK_MS))) {
        p->last_recheck = now;
        for (size_t i = 0; i < p->nconns; ++i) {
            if (p->conns[i].state == C_IDLE) {
                start_introspection(p, &p->conns[i]);
                break;
            }
        }
    }
    /* a queue nobody can serve fails closed rather than waiting forever */
    if (!h2o_linklist_is_empty(&p->queue) && !sb_pg_pool_healthy(p)) {
        while (!h2o_linklist_is_empty(&p->queue)) {
            job_t *job = H2O_STRUCT_FROM_MEMBER(job_t, link, p->queue.next);
            h2o_linklist_unlink(&job->link);
            --p->queued;
            (void)job->cb(job, NULL, "the database is unavailable");
            sb_pg__free_job(job);
        }
    }
}

/* host:port of a database URL or conninfo string, without the user or the password */
static void describe_addr(const char *url, char *out, size_t outsz)
{
    PQconninfoOption *opts = PQconninfoParse(url, NULL);
    const char *host = NULL, *hostaddr = NULL, *port = NULL;
    for (PQconninfoOption *o = opts; o != NULL && o->keyword != NULL; ++o) {
        if (o->val == NULL || o->val[0] == '\0')
            continue;
        if (strcmp(o->keyword, "host") == 0)
            host = o->val;
        else if (strcmp(o->keyword, "hostaddr") == 0)
            hostaddr = o->val;
        else if (strcmp(o->keyword, "port") == 0)
            port = o->val;
    }
    snprintf(out, outsz, "%s:%s",
             hostaddr != NULL ? hostaddr
             : host != NULL   ? host
                              : "(local socket)",
             port != NULL ? port : "5432");
    PQconninfoFree(opts);
}

static void on_reap(h2o_timeout_entry_t *entry);

sb_pg_pool_t *sb_pg_pool_create(h2o_loop_t *loop, sb_reaper_t *reaper, const char *database_url, const sb_targets_t *targets,
                                unsigned pool_size)
{
    sb_pg_pool_t *p;

    if (database_url == NULL || !sb_pg__uses_database(targets))
        return NULL;
    p = sb_mem_calloc(1, sizeof(*p));
    p->loop = loop;
    p->refs = 1;
    p->reaper = reaper;
    p->reap.cb = on_reap;
    sb_reaper__created(reaper);
    p->url = sb_mem_strdup(database_url);
    p->targets = targets;
    p->up = -1; /* not known yet, and counted as down */
    __atomic_add_fetch(&pools_down, 1, __ATOMIC_SEQ_CST);
    describe_addr(database_url, p->addr, sizeof(p->addr));
    p->nconns = pool_size != 0 ? pool_size : 4;
    p->conns = sb_mem_calloc(p->nconns, sizeof(*p->conns));
    h2o_linklist_init_anchor(&p->queue);
    for (size_t i = 0; i < p->nconns; ++i) {
        p->conns[i].pool = p;
        p->conns[i].preparing = -1;
        conn_start(&p->conns[i]);
    }
    h2o_timeout_init(loop, &p->tick_timeout, 100);
    p->tick.cb = on_tick;
    h2o_timeout_link(loop, &p->tick_timeout, &p->tick);
    return p;
}

/*
 * The last reference is gone, so no job is queued or running but the
 * introspection, which closing the connections cancels: it runs on the
 * reaper's turn, never inside a callback of the pool's own sockets or tick.
 */
static void on_reap(h2o_timeout_entry_t *entry)
{
    sb_pg_pool_t *p = H2O_STRUCT_FROM_MEMBER(sb_pg_pool_t, reap, entry);
    sb_reaper_t *reaper = p->reaper;

    /* closing a pool (a reload replaced it, or the shutdown) is not the database going down: no log line */
    for (size_t i = 0; i < p->nconns; ++i) {
        conn_drop(&p->conns[i], "shutting down", 1);
        sb_mem_free(p->conns[i].stmts);
    }
    if (p->up != 1)
        __atomic_sub_fetch(&pools_down, 1, __ATOMIC_SEQ_CST); /* no longer a pool that is down */
    if (h2o_timeout_is_linked(&p->tick))
        h2o_timeout_unlink(&p->tick);
    h2o_timeout_dispose(p->loop, &p->tick_timeout);
    sb_pg__free_schemas(p);
    sb_mem_free(p->missing);
    sb_mem_free(p->conns);
    sb_mem_free(p->url);
    sb_mem_free(p);
    sb_reaper__freed(reaper);
}

void sb_pg_pool_release(sb_pg_pool_t *p)
{
    if (p == NULL || --p->refs != 0)
        return;
    sb_reaper__schedule(p->reaper, &p->reap);
}

int sb_pg_pool_healthy(sb_pg_pool_t *p)
{
    if (p == NULL || !p->introspected)
        return 0;
    for (size_t i = 0; i < p->nconns; ++i)
        if (p->conns[i].state == C_IDLE || p->conns[i].state == C_BUSY)
            return 1;
    return 0;
}

const char *sb_pg_pool_problem(const sb_pg_pool_t *p)
{
    return p != NULL ? p->missing : NULL;
}

void sb_pg__enqueue(sb_pg_pool_t *p, job_t *job)
{
    ++p->refs;
    job->pool = p;
    h2o_linklist_insert(&p->queue, &job->link);
    ++p->queued;
    pump(p);
}
