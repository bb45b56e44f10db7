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
 * outlives the statement_timeout (set per session) fails on the server; one
 * that outlives the client watchdog resets its connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <libpq-fe.h>
#include "obs/log.h"
#include "svc/pg/pg_int.h"
#include "util/util.h"

#define STATEMENT_TIMEOUT_MS 5000
#define WATCHDOG_MS 8000

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
    free(job);
    sb_pg_pool_release(pool);
}

/* maps a failed statement to the guest's view: constraint violations are the guest's, the rest the host's */
/* ---- connections ------------------------------------------------------------------------------------------------- */

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
}

static void conn_fail(pconn_t *c, const char *reason)
{
    job_t *job = c->job;
    int was_up = c->state == C_IDLE || c->state == C_BUSY;
    int64_t now = sb_now_ms();
    char why[256];

    /* the reason is often PQerrorMessage(), which PQfinish frees: copy it first */
    snprintf(why, sizeof(why), "%s", reason != NULL ? reason : "unknown");
    for (char *q = why; *q != '\0'; ++q)
        if (*q == '\n')
            *q = ' ';
    c->job = NULL;
    conn_close(c);
    c->state = C_DOWN;
    c->next_attempt = now + (int64_t)(100u << (c->failures < 5 ? c->failures : 5));
    ++c->failures;
    if (was_up || c->failures == 1) {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_WARN, "pg.down");
        sb_log_cstr(&l, "reason", why);
        sb_log_end(&l);
    }
    if (job != NULL) {
        (void)job->cb(job, NULL, "the database connection failed");
        sb_pg__free_job(job);
    }
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
        if (PQsetnonblocking(c->pg, 1) != 0) {
            conn_fail(c, "PQsetnonblocking failed");
            return;
        }
        c->state = C_IDLE;
        c->failures = 0;
        watch(c, 0);
        sb_log_msg(SB_LOG_INFO, "pg.up", "database connection ready");
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

static void read_results(pconn_t *c)
{
    if (PQconsumeInput(c->pg) == 0) {
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    while (c->state == C_BUSY && !PQisBusy(c->pg)) {
        PGresult *r = PQgetResult(c->pg);
        if (r == NULL) {
            finish_job(c);
            if (c->state == C_IDLE)
                pump(c->pool);
            return;
        }
        if (c->result == NULL)
            c->result = r;
        else
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

/* sends the job's statement (sql == NULL) or a transaction command on the job's connection */
void sb_pg__send_statement(job_t *job, const char *sql)
{
    pconn_t *c = job->conn;
    int r, ok;
    c->started = sb_now_ms();
    if (sql != NULL)
        ok = PQsendQuery(c->pg, sql);
    else
        ok = PQsendQueryParams(c->pg, job->q.sql, job->q.nparams, job->types, (const char *const *)job->q.params, NULL, NULL, 0);
    if (!ok) {
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

static void run(pconn_t *c, job_t *job)
{
    int r;
    c->job = job;
    job->conn = c;
    c->state = C_BUSY;
    c->started = sb_now_ms();
    if (job->tx) {
        job->phase = 0;
        sb_pg__send_statement(job, "BEGIN");
        return;
    }
    job->phase = 1;
    if (!PQsendQueryParams(c->pg, job->q.sql, job->q.nparams, job->types, (const char *const *)job->q.params, NULL, NULL, 0)) {
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

/* learns the targets' tables and columns on an idle connection */
static void start_introspection(sb_pg_pool_t *p, pconn_t *c)
{
    job_t *job = sb_mem_calloc(1, sizeof(*job));
    sb_sql_init(&job->q);
    job->q.sql = sb_mem_strdup(sb_pg__introspect_sql);
    job->q.params[0] = sb_pg__table_list(p->targets);
    job->q.nparams = 1;
    job->cb = sb_pg__on_introspected;
    job->arg = p;
    p->introspecting = 1;
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
    for (size_t i = 0; i < p->nconns; ++i) {
        pconn_t *c = &p->conns[i];
        if (c->state == C_DOWN && now >= c->next_attempt)
            conn_start(c);
        else if (c->state == C_CONNECTING && now - c->started > 5000)
            conn_fail(c, "connect timed out");
        else if (c->state == C_BUSY && now - c->started > WATCHDOG_MS)
            conn_fail(c, "statement outlived the watchdog");
    }
    /* when the introspection connection is ready, make sure the schema gets learned */
    if (!p->introspected && !p->introspecting) {
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
    p->nconns = pool_size != 0 ? pool_size : 4;
    p->conns = sb_mem_calloc(p->nconns, sizeof(*p->conns));
    h2o_linklist_init_anchor(&p->queue);
    for (size_t i = 0; i < p->nconns; ++i) {
        p->conns[i].pool = p;
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

    for (size_t i = 0; i < p->nconns; ++i)
        conn_fail(&p->conns[i], "shutting down");
    if (h2o_timeout_is_linked(&p->tick))
        h2o_timeout_unlink(&p->tick);
    h2o_timeout_dispose(p->loop, &p->tick_timeout);
    sb_pg__free_schemas(p);
    free(p->conns);
    free(p->url);
    free(p);
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

void sb_pg__enqueue(sb_pg_pool_t *p, job_t *job)
{
    ++p->refs;
    job->pool = p;
    h2o_linklist_insert(&p->queue, &job->link);
    ++p->queued;
    pump(p);
}
