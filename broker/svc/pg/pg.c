/*
 * broker/svc/pg/pg: collections.<name>.*, store.<ns>.* and
 * collections.document_store.* on PostgreSQL (handlers.h): the statement is
 * built from the typed call (pg_query.c), queued on the worker's pool
 * (pool.c), and its rows packed as the reply. A write runs in a transaction
 * and answers only once it has ended.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>
#include "sb/limits.h"
#include "sb/value.h"
#include "svc/pg/pg_int.h"
#include "util/util.h"

static void answer_pg_error(job_t *job, PGresult *res)
{
    const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    char msg[400];
    snprintf(msg, sizeof(msg), "PostgreSQL: %s", res != NULL ? PQresultErrorMessage(res) : "no result");
    for (char *p = msg; *p != '\0'; ++p)
        if (*p == '\n')
            *p = ' ';
    if (state != NULL && (strncmp(state, "23", 2) == 0 || strncmp(state, "22", 2) == 0)) {
        /* class 23 integrity constraint, class 22 data exception: the guest sent a bad value */
        char guest[160];
        snprintf(guest, sizeof(guest), "%s violates a constraint or has an invalid value (SQLSTATE %s)",
                 strncmp(state, "23", 2) == 0 ? "the write" : "a value", state);
        sb_pg__answer(job, SB_E_BAD_ARGS, guest, NULL);
        return;
    }
    sb_pg__answer(job, SB_E_EXECUTION, msg, NULL);
}

/*
 * One row of the statement, as it arrives (single-row mode): packed unless the
 * page is full, counted either way (find fetches one row more than the page to
 * tell whether there is a next one). The packed bytes are checked against the
 * reply cap after every row, so a large result is refused when it crosses the
 * cap, not after all of it was buffered; the rest is read and dropped.
 */
static void on_row(job_t *job, const PGresult *res, int row)
{
    size_t keep = job->op == SB_OP_FIND ? job->q.limit : job->op == SB_OP_FIND_ONE || job->op == SB_OP_CREATE ? 1 : SIZE_MAX;
    msgpack_packer pk;

    ++job->nrows;
    if (job->rows_over || job->npacked >= keep)
        return;
    msgpack_packer_init(&pk, &job->rows, msgpack_sbuffer_write);
    if (sb_pg_pack_row(res, row, &pk) != SB_OK || job->rows.size > SB_MAX_NATIVE_RESULT) {
        job->rows_over = 1;
        msgpack_sbuffer_destroy(&job->rows);
        msgpack_sbuffer_init(&job->rows);
        return;
    }
    ++job->npacked;
}

static void on_data_result(job_t *job, PGresult *res, const char *err)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;

    if (err != NULL) {
        sb_pg__answer(job, SB_E_UNAVAILABLE, err, NULL);
        return;
    }
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        answer_pg_error(job, res);
        return;
    }
    /* rows that came in the final result (not streamed) go the same way */
    for (int r = 0; r < PQntuples(res); ++r)
        on_row(job, res, r);
    if (job->rows_over) {
        sb_pg__answer(job, SB_E_EXECUTION, "result exceeds the 786432-byte cap", NULL);
        return;
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    switch (job->op) {
    case SB_OP_FIND:
        msgpack_pack_map(&pk, 4);
        msgpack_pack_str_with_body(&pk, "docs", 4);
        msgpack_pack_array(&pk, job->npacked);
        msgpack_sbuffer_write(&sb, job->rows.data, job->rows.size);
        msgpack_pack_str_with_body(&pk, "limit", 5);
        msgpack_pack_uint64(&pk, job->q.limit);
        msgpack_pack_str_with_body(&pk, "offset", 6);
        msgpack_pack_uint64(&pk, job->q.offset);
        msgpack_pack_str_with_body(&pk, "hasMore", 7);
        if (job->nrows > job->q.limit)
            msgpack_pack_true(&pk);
        else
            msgpack_pack_false(&pk);
        break;
    case SB_OP_FIND_ONE:
    case SB_OP_CREATE:
        if (job->npacked == 0)
            msgpack_pack_nil(&pk);
        else
            msgpack_sbuffer_write(&sb, job->rows.data, job->rows.size);
        break;
    default: /* update, delete: the rows touched */
        msgpack_pack_map(&pk, 1);
        msgpack_pack_str_with_body(&pk, "docs", 4);
        msgpack_pack_array(&pk, job->npacked);
        msgpack_sbuffer_write(&sb, job->rows.data, job->rows.size);
        break;
    }
    if (sb.size > SB_MAX_NATIVE_RESULT) {
        msgpack_sbuffer_destroy(&sb);
        sb_pg__answer(job, SB_E_EXECUTION, "result exceeds the 786432-byte cap", NULL);
        return;
    }
    sb_pg__answer(job, SB_OK, NULL, &sb);
}

/*
 * A write is answered only after its transaction ends, so a write reported as
 * failed (a constraint, a result above the cap) has not happened: BEGIN and
 * the statement go out together, the reply is decided on the statement's
 * result, then COMMIT or ROLLBACK runs, then it is delivered. If the
 * connection fails after COMMIT was sent, the outcome is unknown and the
 * guest is told so.
 */
static int on_data_step(job_t *job, PGresult *res, const char *err)
{
    if (!job->tx) {
        on_data_result(job, res, err);
        return 0;
    }
    if (err != NULL) {
        int committing = job->phase == 2 && job->have_prepared && job->prepared.status == SB_OK;
        job->phase = 3; /* not inside the statement phase: answer at once */
        sb_pg__answer(job, committing ? SB_E_EXECUTION : SB_E_UNAVAILABLE,
                      committing ? "the connection failed during COMMIT: the outcome is unknown" : err, NULL);
        return 0;
    }
    if (job->phase == 1) {
        /* the first error of the flight (BEGIN's or the statement's), or the statement's rows */
        on_data_result(job, res, NULL); /* prepares the answer */
        job->phase = 2;
        sb_pg__send_statement(job, job->prepared.status == SB_OK ? "COMMIT" : "ROLLBACK");
        return 1;
    }
    if (job->prepared.status == SB_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
        sb_result_fail(&job->prepared, SB_E_EXECUTION, "COMMIT failed: %s", PQresultErrorMessage(res));
    sb_pg__deliver(job);
    return 0;
}

/* ---- the handler ------------------------------------------------------------------------------------------------- */

/*
 * collections.<name>.*, store.<ns>.*, collections.document_store.*: dispatch
 * found the collection declared (or the document store wired) and the args
 * whole. The namespace of a document-store call is the one the check
 * granted (call->data->ns); the builder clamps every statement to it.
 */
void sb_pg_handle(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                  void *arg)
{
    sb_pg_pool_t *p = env->pg;
    const sb_method_t *m = &call->m;
    const sb_call_data_t *d = call->data;
    const target_schema_t *ts;
    const sb_pg_coll_t *coll = NULL;
    char err[400];
    job_t *job;
    sb_status_t st;

    if (!sb_pg_pool_healthy(p) || (ts = sb_pg__schema_of(p, t)) == NULL) {
        sb_answer_error(cb, arg, SB_E_UNAVAILABLE, "the database is unavailable");
        return;
    }
    if (d->docstore) {
        coll = ts->docstore;
    } else {
        for (size_t i = 0; i < ts->ncolls; ++i)
            if (strlen(ts->colls[i].name) == m->name_len && memcmp(ts->colls[i].name, m->name, m->name_len) == 0)
                coll = &ts->colls[i];
    }
    if (coll == NULL) {
        sb_answer_error(cb, arg, SB_E_EXECUTION, "collection schema missing");
        return;
    }
    if (p->queued >= SB_PG_MAX_QUEUE) {
        sb_answer_error(cb, arg, SB_E_RATE_LIMITED, "the database queue is full");
        return;
    }
    job = sb_mem_calloc(1, sizeof(*job));
    /* calloc: the statement is empty (sb_sql_init) */
    if ((st = sb_pg_build(coll, m->op, d, tok, call->binary, &job->q, err, sizeof(err))) != SB_OK) {
        sb_pg__free_job(job);
        sb_answer_error(cb, arg, st, "%s", err);
        return;
    }
    sb_token_addref(tok);
    job->tok = tok;
    job->coll = coll;
    job->op = m->op;
    job->binary = call->binary;
    job->dcb = cb;
    job->arg = arg;
    job->cb = on_data_step;
    job->on_row = on_row;
    /* writes answer only after their transaction ends (on_data_step) */
    job->tx = m->op == SB_OP_CREATE || m->op == SB_OP_UPDATE || m->op == SB_OP_DELETE;
    sb_pg__enqueue(p, job);
}
