/*
 * broker/svc/pg/globals: globals.<name>.get of a table global (handlers.h):
 * the fixed statement built at introspection (schema.c), with the row name
 * and the token's scope values as its parameters, read on every call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>
#include "sb/limits.h"
#include "svc/pg/pg_int.h"
#include "util/util.h"

/* ---- globals ---------------------------------------------------------------------------------------------------- */

/* the value of a table global: the column's value (types mapped as for collections) or the whole row; no row is null */
static int on_global_result(job_t *job, PGresult *res, const char *err)
{
    const sb_global_conf_t *gc = job->global->conf;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char msg[400];

    if (err != NULL) {
        sb_pg__answer(job, SB_E_UNAVAILABLE, err, NULL);
        return 0;
    }
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        /* the guest sent nothing: whatever failed is the host's (a row name or scope value the column type refuses, ...) */
        snprintf(msg, sizeof(msg), "globals.%s: PostgreSQL: %s", gc->name, PQresultErrorMessage(res));
        for (char *q = msg; *q != '\0'; ++q)
            if (*q == '\n')
                *q = ' ';
        sb_pg__answer(job, SB_E_EXECUTION, msg, NULL);
        return 0;
    }
    if (PQntuples(res) > 1) {
        snprintf(msg, sizeof(msg), "globals.%s: more than one row of %s matches: the key and scope must select one row", gc->name,
                 gc->table);
        sb_pg__answer(job, SB_E_EXECUTION, msg, NULL);
        return 0;
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (PQntuples(res) == 0) {
        msgpack_pack_nil(&pk);
    } else if (gc->column == NULL) {
        if (sb_pg_pack_row(res, 0, &pk) != SB_OK)
            goto TooLarge;
    } else {
        /* one column: the row packs as a one-entry map, and the value is that entry's */
        msgpack_sbuffer row;
        msgpack_packer rpk;
        msgpack_unpacked u;
        int ok;
        msgpack_sbuffer_init(&row);
        msgpack_packer_init(&rpk, &row, msgpack_sbuffer_write);
        msgpack_unpacked_init(&u);
        ok = sb_pg_pack_row(res, 0, &rpk) == SB_OK && row.size <= SB_MAX_NATIVE_RESULT &&
             msgpack_unpack_next(&u, row.data, row.size, NULL) == MSGPACK_UNPACK_SUCCESS && u.data.type == MSGPACK_OBJECT_MAP &&
             u.data.via.map.size == 1;
        if (ok)
            msgpack_pack_object(&pk, u.data.via.map.ptr[0].val);
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&row);
        if (!ok)
            goto TooLarge;
    }
    if (sb.size > SB_MAX_NATIVE_RESULT)
        goto TooLarge;
    sb_pg__answer(job, SB_OK, NULL, &sb);
    return 0;
TooLarge:
    msgpack_sbuffer_destroy(&sb);
    snprintf(msg, sizeof(msg), "globals.%s: the value exceeds the %u-byte cap", gc->name, SB_MAX_NATIVE_RESULT);
    sb_pg__answer(job, SB_E_EXECUTION, msg, NULL);
    return 0;
}

void sb_pg_global(const sb_svc_env_t *env, const sb_target_t *t, const sb_global_conf_t *gc, sb_token_t *tok, sb_dispatch_cb cb,
                  void *arg)
{
    sb_pg_pool_t *p = env->pg;
    const target_schema_t *ts;
    const pg_global_t *pg = NULL;
    char err[200];
    job_t *job;

    if (p == NULL || !sb_pg_pool_healthy(p) || (ts = sb_pg__schema_of(p, t)) == NULL) {
        sb_answer_error(cb, arg, SB_E_UNAVAILABLE, "the database is unavailable");
        return;
    }
    for (size_t i = 0; i < ts->nglobals; ++i)
        if (ts->globals[i].conf == gc)
            pg = &ts->globals[i];
    if (pg == NULL) {
        sb_answer_error(cb, arg, SB_E_EXECUTION, "global schema missing");
        return;
    }
    if (p->queued >= SB_PG_MAX_QUEUE) {
        sb_answer_error(cb, arg, SB_E_RATE_LIMITED, "the database queue is full");
        return;
    }
    job = sb_mem_calloc(1, sizeof(*job));
    /* calloc: the statement is empty (sb_sql_init) */
    /* the parameters in the statement's order: the row name, then the scope values */
    if (gc->key != NULL)
        job->q.params[job->q.nparams++] = sb_mem_strdup(gc->row);
    for (size_t k = 0; k < gc->nscope; ++k) {
        const char *v = sb_token_scope_value(tok, gc->scope[k].scope_key);
        if (v == NULL) {
            snprintf(err, sizeof(err), "the token binds no \"%s\" scope value", gc->scope[k].scope_key);
            sb_pg__free_job(job);
            sb_answer_error(cb, arg, SB_E_FORBIDDEN, "%s", err);
            return;
        }
        job->q.params[job->q.nparams++] = sb_mem_strdup(v);
    }
    job->q.sql = sb_mem_strdup(pg->sql);
    job->types = pg->types;
    job->global = pg;
    sb_token_addref(tok);
    job->tok = tok;
    job->dcb = cb;
    job->arg = arg;
    job->cb = on_global_result;
    sb_pg__enqueue(p, job);
}
