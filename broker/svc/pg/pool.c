/*
 * PostgreSQL for collections, the document store and table globals: a small
 * pool of non-blocking libpq connections per worker, on the worker's h2o loop.
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
#include "sb/limits.h"
#include "sb/value.h"
#include "svc/handlers.h"
#include "svc/pg/pg_query.h"
#include "util/util.h"

#define MAX_QUEUE 256
#define STATEMENT_TIMEOUT_MS 5000
#define WATCHDOG_MS 8000

typedef enum { C_DOWN = 0, C_CONNECTING, C_IDLE, C_BUSY } conn_state_t;

typedef struct st_job_t job_t;
typedef struct st_pg_global_t pg_global_t;
/* called when a statement completes (res) or the connection failed (err); returns 1 when the job sent another statement */
typedef int (*job_cb)(job_t *job, PGresult *res, const char *err);

struct st_job_t {
    h2o_linklist_t link;
    sb_sql_t q;
    job_cb cb;
    /* the call */
    sb_token_t *tok;
    const sb_pg_coll_t *coll;
    sb_method_op_t op;
    int binary;
    sb_dispatch_cb dcb;
    void *arg;
    /* writes run in a transaction: BEGIN, the statement, then COMMIT or ROLLBACK */
    int tx, phase; /* phase 0: BEGIN sent, 1: the statement, 2: COMMIT/ROLLBACK */
    struct st_pconn_t *conn;
    const Oid *types; /* the parameters' types (NULL: inferred from the casts in the statement) */
    const pg_global_t *global;
    sb_result_t prepared; /* the answer, decided after the statement, delivered after the transaction */
    int have_prepared;
};

struct st_pconn_t {
    struct st_sb_pg_pool_t *pool;
    PGconn *pg;
    h2o_socket_t *sock;
    conn_state_t state;
    int want_write;
    job_t *job;
    PGresult *result; /* the first result of the running statement */
    int64_t started, next_attempt;
    unsigned failures;
};
typedef struct st_pconn_t pconn_t;

/*
 * A table global as the database knows it. The statement is fixed once the
 * schema is known (identifiers from the introspected columns, quoted); a call
 * only supplies the parameters: the row name, then the token's scope values.
 * They are typed with the columns' own types (no cast in the text, so no
 * typmod can truncate a value into a match, as "::varchar(2)" would).
 */
struct st_pg_global_t {
    const sb_global_conf_t *conf;
    sb_pg_coll_t cols; /* every column of the table */
    char *sql;
    Oid types[1 + SB_MAX_SCOPE_ENTRIES];
    int nparams;
};

typedef struct st_target_schema_t {
    const sb_target_t *target;
    sb_pg_coll_t *colls;
    size_t ncolls;
    sb_pg_coll_t *docstore;
    pg_global_t *globals; /* the target's table globals */
    size_t nglobals;
} target_schema_t;

struct st_sb_pg_pool_t {
    h2o_loop_t *loop;
    char *url;
    const sb_targets_t *targets;
    pconn_t *conns; /* database_pool_size connections */
    size_t nconns;
    h2o_linklist_t queue;
    size_t queued;
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick;
    int introspected, introspecting;
    target_schema_t *schemas;
    size_t nschemas;
};

static void conn_start(pconn_t *c);
static void pump(sb_pg_pool_t *p);

/* ---- results back to the route -------------------------------------------------------------------------------------- */

static void deliver(job_t *job)
{
    job->dcb(job->arg, &job->prepared);
    msgpack_sbuffer_destroy(&job->prepared.value);
    job->have_prepared = 0;
}

static void answer(job_t *job, sb_status_t st, const char *msg, msgpack_sbuffer *value)
{
    sb_result_t res;
    if (job->tx && job->phase == 1) {
        /* inside the transaction: decide now, answer once COMMIT or ROLLBACK has run */
        memset(&job->prepared, 0, sizeof(job->prepared));
        job->prepared.status = st;
        if (msg != NULL)
            snprintf(job->prepared.message, sizeof(job->prepared.message), "%s", msg);
        if (value != NULL)
            job->prepared.value = *value;
        else
            msgpack_sbuffer_init(&job->prepared.value);
        job->have_prepared = 1;
        return;
    }
    memset(&res, 0, sizeof(res));
    res.status = st;
    if (msg != NULL)
        snprintf(res.message, sizeof(res.message), "%s", msg);
    if (value != NULL)
        res.value = *value;
    else
        msgpack_sbuffer_init(&res.value);
    job->dcb(job->arg, &res);
    msgpack_sbuffer_destroy(&res.value);
}

static void free_job(job_t *job)
{
    if (job->have_prepared)
        msgpack_sbuffer_destroy(&job->prepared.value);
    sb_sql_dispose(&job->q);
    if (job->tok != NULL)
        sb_token_release(job->tok);
    free(job);
}

/* maps a failed statement to the guest's view: constraint violations are the guest's, the rest the host's */
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
        answer(job, SB_E_BAD_ARGS, guest, NULL);
        return;
    }
    answer(job, SB_E_EXECUTION, msg, NULL);
}

static void send_statement(job_t *job, const char *sql);

static void on_data_result(job_t *job, PGresult *res, const char *err)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    sb_status_t st = SB_OK;

    if (err != NULL) {
        answer(job, SB_E_UNAVAILABLE, err, NULL);
        return;
    }
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        answer_pg_error(job, res);
        return;
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    switch (job->op) {
    case SB_OP_FIND: {
        int more = (size_t)PQntuples(res) > job->q.limit;
        msgpack_pack_map(&pk, 4);
        msgpack_pack_str_with_body(&pk, "docs", 4);
        st = sb_pg_pack_rows(res, (int)job->q.limit, &pk, SB_MAX_NATIVE_RESULT, &sb);
        msgpack_pack_str_with_body(&pk, "limit", 5);
        msgpack_pack_uint64(&pk, job->q.limit);
        msgpack_pack_str_with_body(&pk, "offset", 6);
        msgpack_pack_uint64(&pk, job->q.offset);
        msgpack_pack_str_with_body(&pk, "hasMore", 7);
        if (more)
            msgpack_pack_true(&pk);
        else
            msgpack_pack_false(&pk);
        break;
    }
    case SB_OP_FIND_ONE:
    case SB_OP_CREATE:
        if (PQntuples(res) == 0)
            msgpack_pack_nil(&pk);
        else
            st = sb_pg_pack_row(res, 0, &pk);
        break;
    default: /* update, delete: the rows touched */
        msgpack_pack_map(&pk, 1);
        msgpack_pack_str_with_body(&pk, "docs", 4);
        st = sb_pg_pack_rows(res, PQntuples(res), &pk, SB_MAX_NATIVE_RESULT, &sb);
        break;
    }
    if (st != SB_OK || sb.size > SB_MAX_NATIVE_RESULT) {
        msgpack_sbuffer_destroy(&sb);
        answer(job, SB_E_EXECUTION, "result exceeds the 786432-byte cap", NULL);
        return;
    }
    answer(job, SB_OK, NULL, &sb);
}

/*
 * A write is answered only after its transaction ends, so a write reported as
 * failed (a constraint, a result above the cap) has not happened: the reply
 * is decided after the statement, then COMMIT or ROLLBACK runs, then it is
 * delivered. If the connection fails after COMMIT was sent, the outcome is
 * unknown and the guest is told so.
 */
static int on_data_step(job_t *job, PGresult *res, const char *err)
{
    if (!job->tx) {
        on_data_result(job, res, err);
        return 0;
    }
    if (err != NULL) {
        job->phase = 3; /* not inside the statement phase: answer at once */
        answer(job, job->have_prepared && job->prepared.status == SB_OK ? SB_E_EXECUTION : SB_E_UNAVAILABLE,
               job->have_prepared && job->prepared.status == SB_OK ? "the connection failed during COMMIT: the outcome is unknown"
                                                                   : err,
               NULL);
        return 0;
    }
    switch (job->phase) {
    case 0:
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
            job->phase = 3;
            answer_pg_error(job, res);
            return 0;
        }
        job->phase = 1;
        send_statement(job, NULL);
        return 1;
    case 1:
        on_data_result(job, res, NULL); /* prepares the answer */
        job->phase = 2;
        send_statement(job, job->prepared.status == SB_OK ? "COMMIT" : "ROLLBACK");
        return 1;
    default:
        if (job->prepared.status == SB_OK && PQresultStatus(res) != PGRES_COMMAND_OK) {
            msgpack_sbuffer_destroy(&job->prepared.value);
            msgpack_sbuffer_init(&job->prepared.value);
            job->prepared.status = SB_E_EXECUTION;
            snprintf(job->prepared.message, sizeof(job->prepared.message), "COMMIT failed: %s", PQresultErrorMessage(res));
        }
        deliver(job);
        return 0;
    }
}

/* ---- introspection ----------------------------------------------------------------------------------------------- */

static const char introspect_sql[] =
    /*
     * The type without its modifier: values are cast to it ($n::character
     * varying), so an over-long value is an error on assignment instead of a
     * silent cut (a cast to varchar(3) truncates, and "abcd" would then match
     * "abc")
     */
    "SELECT t.name, a.attname, a.atttypid::int, format_type(a.atttypid, NULL) "
    "FROM unnest($1::text[]) AS t(name) "
    "LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(t.name) AND a.attnum > 0 AND NOT a.attisdropped "
    "ORDER BY t.name, a.attnum";

static int col_allowed(const sb_collection_conf_t *cc, const char *name)
{
    if (cc == NULL || cc->columns == NULL)
        return 1;
    for (size_t i = 0; i < cc->ncolumns; ++i)
        if (strcmp(cc->columns[i], name) == 0)
            return 1;
    /* the key and scope columns are always readable */
    if (strcmp(cc->key, name) == 0)
        return 1;
    for (size_t i = 0; i < cc->nscope; ++i)
        if (strcmp(cc->scope[i].column, name) == 0)
            return 1;
    return 0;
}

static int fill_coll(sb_pg_coll_t *pc, const char *table, const sb_collection_conf_t *cc, PGresult *res, char *err, size_t errsz,
                     const char *path)
{
    int rows = PQntuples(res), found = 0;
    pc->cols = sb_mem_calloc((size_t)rows + 1, sizeof(*pc->cols));
    for (int r = 0; r < rows; ++r) {
        if (strcmp(PQgetvalue(res, r, 0), table) != 0)
            continue;
        found = 1;
        if (PQgetisnull(res, r, 1)) {
            snprintf(err, errsz, "%s.table: no table \"%s\" in the database", path, table);
            return -1;
        }
        if (!col_allowed(cc, PQgetvalue(res, r, 1)))
            continue;
        pc->cols[pc->ncols].name = sb_mem_strdup(PQgetvalue(res, r, 1));
        pc->cols[pc->ncols].oid = (unsigned)strtoul(PQgetvalue(res, r, 2), NULL, 10);
        pc->cols[pc->ncols].type = sb_mem_strdup(PQgetvalue(res, r, 3));
        ++pc->ncols;
    }
    if (!found) {
        snprintf(err, errsz, "%s.table: no table \"%s\" in the database", path, table);
        return -1;
    }
    return 0;
}

static const sb_pg_col_t *find_col_name(const sb_pg_coll_t *pc, const char *n)
{
    for (size_t i = 0; i < pc->ncols; ++i)
        if (strcmp(pc->cols[i].name, n) == 0)
            return &pc->cols[i];
    return NULL;
}

/* appends "name" with embedded quotes doubled (introspected names are the table's own, not only [a-z0-9_]) */
static size_t put_ident(char *dst, const char *name)
{
    size_t n = 0;
    dst[n++] = '"';
    for (const char *p = name; *p != '\0'; ++p) {
        if (*p == '"')
            dst[n++] = '"';
        dst[n++] = *p;
    }
    dst[n++] = '"';
    dst[n] = '\0';
    return n;
}

/* the statement of a table global, from its introspected columns; err names the first mismatch */
static int build_global(pg_global_t *pg, const sb_global_conf_t *gc, PGresult *res, const char *path, char *err, size_t errsz)
{
    sb_pg_coll_t *pc = &pg->cols;
    const sb_pg_col_t *where[1 + SB_MAX_SCOPE_ENTRIES];
    size_t cap = 64 + strlen(gc->table), len = 0, nwhere = 0;
    char *sql;

    pg->conf = gc;
    pc->table = sb_mem_strdup(gc->table);
    if (fill_coll(pc, gc->table, NULL, res, err, errsz, path) != 0)
        return -1;
    if (gc->key != NULL && (where[nwhere++] = find_col_name(pc, gc->key)) == NULL) {
        snprintf(err, errsz, "%s.key: no column \"%s\" in %s", path, gc->key, gc->table);
        return -1;
    }
    if (gc->column != NULL && find_col_name(pc, gc->column) == NULL) {
        snprintf(err, errsz, "%s.column: no column \"%s\" in %s", path, gc->column, gc->table);
        return -1;
    }
    for (size_t k = 0; k < gc->nscope; ++k)
        if ((where[nwhere++] = find_col_name(pc, gc->scope[k].column)) == NULL) {
            snprintf(err, errsz, "%s.scope: no column \"%s\" in %s", path, gc->scope[k].column, gc->table);
            return -1;
        }
    for (size_t i = 0; i < pc->ncols; ++i)
        cap += 2 * strlen(pc->cols[i].name) + 4;
    for (size_t i = 0; i < nwhere; ++i)
        cap += 2 * strlen(where[i]->name) + 24;
    sql = sb_mem_alloc(cap);
    len += (size_t)snprintf(sql + len, cap - len, "SELECT ");
    for (size_t i = 0, first = 1; i < pc->ncols; ++i) {
        if (gc->column != NULL && strcmp(pc->cols[i].name, gc->column) != 0)
            continue;
        len += (size_t)snprintf(sql + len, cap - len, "%s", first ? "" : ", ");
        len += put_ident(sql + len, pc->cols[i].name);
        first = 0;
    }
    len += (size_t)snprintf(sql + len, cap - len, " FROM %s WHERE TRUE", gc->table);
    for (size_t i = 0; i < nwhere; ++i) {
        pg->types[pg->nparams++] = (Oid)where[i]->oid;
        len += (size_t)snprintf(sql + len, cap - len, " AND ");
        len += put_ident(sql + len, where[i]->name);
        len += (size_t)snprintf(sql + len, cap - len, " = $%d", pg->nparams);
    }
    /* two rows tell an ambiguous configuration from a single row */
    snprintf(sql + len, cap - len, " LIMIT 2");
    pg->sql = sql;
    return 0;
}

/* builds every target's schema from the introspection result; err names the first mismatch */
static int build_schemas(sb_pg_pool_t *p, PGresult *res, char *err, size_t errsz)
{
    p->schemas = sb_mem_calloc(p->targets->n + 1, sizeof(*p->schemas));
    for (size_t i = 0; i < p->targets->n; ++i) {
        const sb_target_t *t = &p->targets->v[i];
        target_schema_t *ts = &p->schemas[p->nschemas++];
        char path[300];
        ts->target = t;
        ts->colls = sb_mem_calloc(t->ncollections + 1, sizeof(*ts->colls));
        for (size_t c = 0; c < t->ncollections; ++c) {
            const sb_collection_conf_t *cc = &t->collections[c];
            sb_pg_coll_t *pc = &ts->colls[ts->ncolls++];
            snprintf(path, sizeof(path), "targets.%s.collections.%s", t->name, cc->name);
            pc->name = sb_mem_strdup(cc->name);
            pc->table = sb_mem_strdup(cc->table);
            pc->key = sb_mem_strdup(cc->key);
            pc->max_limit = cc->max_limit;
            pc->scope = cc->scope;
            pc->nscope = cc->nscope;
            if (fill_coll(pc, cc->table, cc, res, err, errsz, path) != 0)
                return -1;
            if (find_col_name(pc, cc->key) == NULL) {
                snprintf(err, errsz, "%s.key: no column \"%s\" in %s", path, cc->key, cc->table);
                return -1;
            }
            for (size_t k = 0; k < cc->ncolumns; ++k)
                if (find_col_name(pc, cc->columns[k]) == NULL) {
                    snprintf(err, errsz, "%s.columns: no column \"%s\" in %s", path, cc->columns[k], cc->table);
                    return -1;
                }
            for (size_t k = 0; k < cc->nscope; ++k)
                if (find_col_name(pc, cc->scope[k].column) == NULL) {
                    snprintf(err, errsz, "%s.scope: no column \"%s\" in %s", path, cc->scope[k].column, cc->table);
                    return -1;
                }
        }
        if (t->document_store != NULL) {
            sb_pg_coll_t *pc = ts->docstore = sb_mem_calloc(1, sizeof(*pc));
            snprintf(path, sizeof(path), "targets.%s.document_store", t->name);
            pc->name = sb_mem_strdup("document_store");
            pc->table = sb_mem_strdup(t->document_store->table);
            pc->key = sb_mem_strdup("id");
            pc->max_limit = 100;
            pc->scope = t->document_store->scope;
            pc->nscope = t->document_store->nscope;
            pc->is_docstore = 1;
            if (fill_coll(pc, pc->table, NULL, res, err, errsz, path) != 0)
                return -1;
            if (find_col_name(pc, "id") == NULL || find_col_name(pc, "store") == NULL) {
                snprintf(err, errsz, "%s.table: %s needs the columns id and store (deploy/sql/document_store.sql)", path,
                         pc->table);
                return -1;
            }
            for (size_t k = 0; k < pc->nscope; ++k)
                if (find_col_name(pc, pc->scope[k].column) == NULL) {
                    snprintf(err, errsz, "%s.scope: no column \"%s\" in %s", path, pc->scope[k].column, pc->table);
                    return -1;
                }
        }
        ts->globals = sb_mem_calloc(t->nglobals + 1, sizeof(*ts->globals));
        for (size_t k = 0; k < t->nglobals; ++k) {
            if (t->globals[k].table == NULL)
                continue;
            snprintf(path, sizeof(path), "targets.%s.globals.%s", t->name, t->globals[k].name);
            if (build_global(&ts->globals[ts->nglobals++], &t->globals[k], res, path, err, errsz) != 0)
                return -1;
        }
    }
    return 0;
}

static void free_schemas(sb_pg_pool_t *p)
{
    for (size_t i = 0; i < p->nschemas; ++i) {
        target_schema_t *ts = &p->schemas[i];
        for (size_t c = 0; c <= ts->ncolls; ++c) {
            sb_pg_coll_t *pc = c < ts->ncolls ? &ts->colls[c] : ts->docstore;
            if (pc == NULL)
                continue;
            for (size_t k = 0; k < pc->ncols; ++k) {
                free(pc->cols[k].name);
                free(pc->cols[k].type);
            }
            free(pc->cols);
            free(pc->name);
            free(pc->table);
            free(pc->key);
        }
        free(ts->colls);
        free(ts->docstore);
        for (size_t k = 0; k < ts->nglobals; ++k) {
            pg_global_t *pg = &ts->globals[k];
            for (size_t c = 0; c < pg->cols.ncols; ++c) {
                free(pg->cols.cols[c].name);
                free(pg->cols.cols[c].type);
            }
            free(pg->cols.cols);
            free(pg->cols.table);
            free(pg->sql);
        }
        free(ts->globals);
    }
    free(p->schemas);
    p->schemas = NULL;
    p->nschemas = 0;
}

/* appends a table to the text[] literal unless it is there (introspection answers a row per column per mention) */
static void list_add(char *s, size_t *len, size_t cap, const char *t)
{
    size_t n = strlen(t);
    for (const char *p = s + 1; p < s + *len; ++p) {
        const char *e = strchr(p, ',');
        size_t seg = e != NULL ? (size_t)(e - p) : (size_t)(s + *len - p);
        if (seg == n && memcmp(p, t, n) == 0)
            return;
        p += seg;
    }
    *len += (size_t)snprintf(s + *len, cap - *len, "%s%s", *len > 1 ? "," : "", t);
}

/* the text[] literal of every table the targets name (identifiers were validated as [a-z0-9_.]) */
static char *table_list(const sb_targets_t *targets)
{
    size_t cap = 16, len = 0;
    char *s;
    for (size_t i = 0; i < targets->n; ++i) {
        const sb_target_t *t = &targets->v[i];
        for (size_t c = 0; c < t->ncollections; ++c)
            cap += strlen(t->collections[c].table) + 1;
        if (t->document_store != NULL)
            cap += strlen(t->document_store->table) + 1;
        for (size_t g = 0; g < t->nglobals; ++g)
            if (t->globals[g].table != NULL)
                cap += strlen(t->globals[g].table) + 1;
    }
    s = sb_mem_alloc(cap);
    s[len++] = '{';
    s[len] = '\0';
    for (size_t i = 0; i < targets->n; ++i) {
        const sb_target_t *t = &targets->v[i];
        for (size_t c = 0; c < t->ncollections; ++c)
            list_add(s, &len, cap, t->collections[c].table);
        if (t->document_store != NULL)
            list_add(s, &len, cap, t->document_store->table);
        for (size_t g = 0; g < t->nglobals; ++g)
            if (t->globals[g].table != NULL)
                list_add(s, &len, cap, t->globals[g].table);
    }
    s[len++] = '}';
    s[len] = '\0';
    return s;
}

/* 1 when some target reads or writes the database */
static int uses_database(const sb_targets_t *targets)
{
    for (size_t i = 0; targets != NULL && i < targets->n; ++i) {
        const sb_target_t *t = &targets->v[i];
        if (t->ncollections != 0 || t->document_store != NULL)
            return 1;
        for (size_t g = 0; g < t->nglobals; ++g)
            if (t->globals[g].table != NULL)
                return 1;
    }
    return 0;
}

static int on_introspected(job_t *job, PGresult *res, const char *err)
{
    sb_pg_pool_t *p = (sb_pg_pool_t *)job->arg;
    char msg[512];

    p->introspecting = 0;
    if (err != NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_WARN, "pg.introspection_failed");
        sb_log_cstr(&l, "reason", err != NULL ? err : PQresultErrorMessage(res));
        sb_log_end(&l);
        return 0; /* retried on the next connection */
    }
    if (build_schemas(p, res, msg, sizeof(msg)) != 0) {
        sb_logline_t l;
        free_schemas(p);
        sb_log_begin(&l, SB_LOG_ERROR, "pg.schema_mismatch");
        sb_log_cstr(&l, "reason", msg);
        sb_log_end(&l);
        return 0;
    }
    p->introspected = 1;
    sb_log_msg(SB_LOG_INFO, "pg.ready", "tables introspected");
    return 0;
}

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
        free_job(job);
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
        free_job(job);
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
static void send_statement(job_t *job, const char *sql)
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
        send_statement(job, "BEGIN");
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
    job->q.sql = sb_mem_strdup(introspect_sql);
    job->q.params[0] = table_list(p->targets);
    job->q.nparams = 1;
    job->cb = on_introspected;
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
            free_job(job);
        }
    }
}

sb_pg_pool_t *sb_pg_pool_create(h2o_loop_t *loop, const char *database_url, const sb_targets_t *targets, unsigned pool_size)
{
    sb_pg_pool_t *p;

    if (database_url == NULL || !uses_database(targets))
        return NULL;
    p = sb_mem_calloc(1, sizeof(*p));
    p->loop = loop;
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

void sb_pg_pool_destroy(sb_pg_pool_t *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->nconns; ++i)
        conn_fail(&p->conns[i], "shutting down");
    while (!h2o_linklist_is_empty(&p->queue)) {
        job_t *job = H2O_STRUCT_FROM_MEMBER(job_t, link, p->queue.next);
        h2o_linklist_unlink(&job->link);
        (void)job->cb(job, NULL, "shutting down");
        free_job(job);
    }
    if (h2o_timeout_is_linked(&p->tick))
        h2o_timeout_unlink(&p->tick);
    h2o_timeout_dispose(p->loop, &p->tick_timeout);
    free_schemas(p);
    free(p->conns);
    free(p->url);
    free(p);
}

int sb_pg_pool_idle(const sb_pg_pool_t *p)
{
    if (p == NULL)
        return 1;
    if (p->queued != 0 || p->introspecting)
        return 0;
    for (size_t i = 0; i < p->nconns; ++i)
        if (p->conns[i].state == C_BUSY)
            return 0;
    return 1;
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

/* ---- the handler ------------------------------------------------------------------------------------------------- */

static const target_schema_t *schema_of(const sb_pg_pool_t *p, const sb_target_t *t)
{
    for (size_t i = 0; i < p->nschemas; ++i)
        if (p->schemas[i].target == t)
            return &p->schemas[i];
    return NULL;
}

static void reply_now(sb_dispatch_cb cb, void *arg, sb_status_t st, const char *msg)
{
    sb_result_t res;
    memset(&res, 0, sizeof(res));
    res.status = st;
    snprintf(res.message, sizeof(res.message), "%s", msg);
    msgpack_sbuffer_init(&res.value);
    cb(arg, &res);
    msgpack_sbuffer_destroy(&res.value);
}

/* the namespace a document-store call names: store.<ns>.op, or args.where.store / args.data.store */
static int store_namespace(const sb_method_t *m, const msgpack_object *args, char *out, size_t outsz)
{
    const msgpack_object *v = NULL;
    if (m->kind == SB_MK_STORE) {
        if (m->name_len >= outsz)
            return -1;
        memcpy(out, m->name, m->name_len);
        out[m->name_len] = '\0';
        return 0;
    }
    if (m->op == SB_OP_CREATE)
        v = sb_mp_get(sb_mp_get(args, "data"), "store");
    else if ((v = sb_mp_get(sb_mp_get(args, "where"), "store")) != NULL && v->type == MSGPACK_OBJECT_MAP)
        v = sb_mp_get(v, "equals");
    if (v == NULL || v->type != MSGPACK_OBJECT_STR || v->via.str.size == 0 || v->via.str.size >= outsz)
        return -1;
    memcpy(out, v->via.str.ptr, v->via.str.size);
    out[v->via.str.size] = '\0';
    return 0;
}

void sb_pg_handle(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_method_t *m, const msgpack_object *args,
                  int binary, sb_dispatch_cb cb, void *arg)
{
    sb_pg_pool_t *p = env->pg;
    const target_schema_t *ts;
    const sb_pg_coll_t *coll = NULL;
    char ns[SB_MAX_METHOD_LEN + 1], err[400];
    const char *store_ns = NULL;
    job_t *job;
    sb_status_t st;
    int docstore = m->kind == SB_MK_STORE || (m->name_len == 14 && memcmp(m->name, "document_store", 14) == 0);

    if (docstore && t->document_store == NULL) {
        if (m->kind == SB_MK_STORE)
            snprintf(err, sizeof(err), "store.%.*s.%s has no host handler", (int)m->name_len, m->name, sb_method_op_name(m->op));
        else
            snprintf(err, sizeof(err), "collections.document_store.%s has no host handler", sb_method_op_name(m->op));
        reply_now(cb, arg, SB_E_NOT_IMPLEMENTED, err);
        return;
    }
    if (!docstore) {
        size_t i = 0;
        while (i < t->ncollections &&
               !(strlen(t->collections[i].name) == m->name_len && memcmp(t->collections[i].name, m->name, m->name_len) == 0))
            ++i;
        if (i == t->ncollections) {
            snprintf(err, sizeof(err), "collections.%.*s.%s has no host handler", (int)m->name_len, m->name,
                     sb_method_op_name(m->op));
            reply_now(cb, arg, SB_E_NOT_IMPLEMENTED, err);
            return;
        }
    }
    if (!sb_pg_pool_healthy(p) || (ts = schema_of(p, t)) == NULL) {
        reply_now(cb, arg, SB_E_UNAVAILABLE, "the database is unavailable");
        return;
    }
    if (docstore) {
        if (store_namespace(m, args, ns, sizeof(ns)) != 0) {
            reply_now(cb, arg, SB_E_FORBIDDEN, "document_store namespace is missing or invalid");
            return;
        }
        store_ns = ns;
        coll = ts->docstore;
    } else {
        for (size_t i = 0; i < ts->ncolls; ++i)
            if (strlen(ts->colls[i].name) == m->name_len && memcmp(ts->colls[i].name, m->name, m->name_len) == 0)
                coll = &ts->colls[i];
    }
    if (coll == NULL) {
        reply_now(cb, arg, SB_E_EXECUTION, "collection schema missing");
        return;
    }
    if (p->queued >= MAX_QUEUE) {
        reply_now(cb, arg, SB_E_RATE_LIMITED, "the database queue is full");
        return;
    }
    job = sb_mem_calloc(1, sizeof(*job));
    sb_sql_init(&job->q);
    if ((st = sb_pg_build(coll, m->op, args, tok, store_ns, binary, &job->q, err, sizeof(err))) != SB_OK) {
        free_job(job);
        reply_now(cb, arg, st, err);
        return;
    }
    sb_token_addref(tok);
    job->tok = tok;
    job->coll = coll;
    job->op = m->op;
    job->binary = binary;
    job->dcb = cb;
    job->arg = arg;
    job->cb = on_data_step;
    /* writes answer only after their transaction ends (on_data_step) */
    job->tx = m->op == SB_OP_CREATE || m->op == SB_OP_UPDATE || m->op == SB_OP_DELETE;
    h2o_linklist_insert(&p->queue, &job->link);
    ++p->queued;
    pump(p);
}

/* ---- globals ---------------------------------------------------------------------------------------------------- */

/* the value of a table global: the column's value (types mapped as for collections) or the whole row; no row is null */
static int on_global_result(job_t *job, PGresult *res, const char *err)
{
    const sb_global_conf_t *gc = job->global->conf;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char msg[400];

    if (err != NULL) {
        answer(job, SB_E_UNAVAILABLE, err, NULL);
        return 0;
    }
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        /* the guest sent nothing: whatever failed is the host's (a row name or scope value the column type refuses, ...) */
        snprintf(msg, sizeof(msg), "globals.%s: PostgreSQL: %s", gc->name, PQresultErrorMessage(res));
        for (char *q = msg; *q != '\0'; ++q)
            if (*q == '\n')
                *q = ' ';
        answer(job, SB_E_EXECUTION, msg, NULL);
        return 0;
    }
    if (PQntuples(res) > 1) {
        snprintf(msg, sizeof(msg), "globals.%s: more than one row of %s matches: the key and scope must select one row", gc->name,
                 gc->table);
        answer(job, SB_E_EXECUTION, msg, NULL);
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
    answer(job, SB_OK, NULL, &sb);
    return 0;
TooLarge:
    msgpack_sbuffer_destroy(&sb);
    snprintf(msg, sizeof(msg), "globals.%s: the value exceeds the %u-byte cap", gc->name, SB_MAX_NATIVE_RESULT);
    answer(job, SB_E_EXECUTION, msg, NULL);
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

    if (p == NULL || !sb_pg_pool_healthy(p) || (ts = schema_of(p, t)) == NULL) {
        reply_now(cb, arg, SB_E_UNAVAILABLE, "the database is unavailable");
        return;
    }
    for (size_t i = 0; i < ts->nglobals; ++i)
        if (ts->globals[i].conf == gc)
            pg = &ts->globals[i];
    if (pg == NULL) {
        reply_now(cb, arg, SB_E_EXECUTION, "global schema missing");
        return;
    }
    if (p->queued >= MAX_QUEUE) {
        reply_now(cb, arg, SB_E_RATE_LIMITED, "the database queue is full");
        return;
    }
    job = sb_mem_calloc(1, sizeof(*job));
    sb_sql_init(&job->q);
    /* the parameters in the statement's order: the row name, then the scope values */
    if (gc->key != NULL)
        job->q.params[job->q.nparams++] = sb_mem_strdup(gc->row);
    for (size_t k = 0; k < gc->nscope; ++k) {
        const char *v = sb_token_scope_value(tok, gc->scope[k].scope_key);
        if (v == NULL) {
            snprintf(err, sizeof(err), "the token binds no \"%s\" scope value", gc->scope[k].scope_key);
            free_job(job);
            reply_now(cb, arg, SB_E_FORBIDDEN, err);
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
    h2o_linklist_insert(&p->queue, &job->link);
    ++p->queued;
    pump(p);
}

/* ---- start-up and --check-config --------------------------------------------------------------------------------- */

sb_status_t sb_pg_check_schema(const char *database_url, const sb_targets_t *targets, int *reachable, char *err, size_t errsz)
{
    static const char *const keys[] = {"dbname", "connect_timeout", "application_name", NULL};
    const char *values[] = {database_url, "3", "sandbox-broker-check", NULL};
    sb_pg_pool_t tmp;
    PGconn *pg;
    PGresult *res;
    const char *params[1];
    sb_status_t st = SB_OK;

    *reachable = 0;
    if (!uses_database(targets))
        return SB_OK;
    if (database_url == NULL) {
        snprintf(err, errsz,
                 "database_url: targets declare collections, a document store or table globals, but no database is configured");
        return SB_E_BAD_ARGS;
    }
    pg = PQconnectdbParams(keys, values, 1);
    if (pg == NULL || PQstatus(pg) != CONNECTION_OK) {
        snprintf(err, errsz, "database_url: cannot connect: %s", pg != NULL ? PQerrorMessage(pg) : "out of memory");
        for (char *p = err; *p != '\0'; ++p)
            if (*p == '\n')
                *p = ' ';
        PQfinish(pg);
        return SB_E_UNAVAILABLE;
    }
    *reachable = 1;
    memset(&tmp, 0, sizeof(tmp));
    tmp.targets = targets;
    params[0] = table_list(targets);
    res = PQexecParams(pg, introspect_sql, 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        snprintf(err, errsz, "database_url: introspection failed: %s", PQresultErrorMessage(res));
        st = SB_E_UNAVAILABLE;
    } else if (build_schemas(&tmp, res, err, errsz) != 0) {
        st = SB_E_BAD_ARGS;
    }
    free_schemas(&tmp);
    PQclear(res);
    free((char *)params[0]);
    PQfinish(pg);
    return st;
}
