/*
 * broker/svc/pg/schema: what the database knows about the targets' tables.
 *
 * One statement learns every column of every table the targets name (the
 * first statement on a new pool, and --check-config / start-up / reload
 * through sb_pg_check_schema). The collections, the document store and the
 * table globals are built from it: the allowlisted columns with their types,
 * and for a table global its fixed statement. Identifiers reach SQL only from
 * here, quoted.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>
#include "obs/log.h"
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "svc/pg/pg_int.h"
#include "util/util.h"

/* ---- introspection ----------------------------------------------------------------------------------------------- */

const char sb_pg__introspect_sql[] =
    /*
     * The type without its modifier: values are cast to it ($n::character
     * varying), so an over-long value is an error on assignment instead of a
     * silent cut (a cast to varchar(3) truncates, and "abcd" would then match
     * "abc")
     */
    "SELECT t.name, a.attname, a.atttypid::int, format_type(a.atttypid, NULL), "
    /*
     * What the role may do with the table (the same on every row of it), and
     * for a serial column the USAGE an INSERT needs on its sequence (an
     * identity column's sequence needs none). Functions of NULL are NULL, so
     * a table that does not exist yields NULLs here and is reported missing
     * by the schema check instead.
     */
    "has_table_privilege(t.rel, 'SELECT'), has_table_privilege(t.rel, 'INSERT'), "
    "has_table_privilege(t.rel, 'UPDATE'), has_table_privilege(t.rel, 'DELETE'), "
    "CASE WHEN a.attidentity = '' THEN has_sequence_privilege(pg_get_serial_sequence(t.name, a.attname), 'USAGE') END, "
    "CASE WHEN a.attidentity = '' THEN pg_get_serial_sequence(t.name, a.attname) END "
    "FROM (SELECT n, to_regclass(n) FROM unnest($1::text[]) AS n) AS t(name, rel) "
    "LEFT JOIN pg_attribute a ON a.attrelid = t.rel AND a.attnum > 0 AND NOT a.attisdropped "
    "ORDER BY t.name, a.attnum";

/* the introspection's columns */
enum { I_TABLE, I_COLUMN, I_OID, I_TYPE, I_SELECT, I_INSERT, I_UPDATE, I_DELETE, I_SEQ_USAGE, I_SEQ, I_NCOLS };

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

/* 1 when the name can go between double quotes unescaped: no quote, no control byte */
static int plain_ident(const char *name)
{
    for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; ++p)
        if (*p == '"' || *p < 0x20 || *p == 0x7f)
            return 0;
    return name[0] != '\0';
}

static int fill_coll(sb_pg_coll_t *pc, const char *table, const sb_collection_conf_t *cc, PGresult *res, char *err, size_t errsz,
                     const char *path)
{
    int rows = PQntuples(res), found = 0;
    pc->cols = sb_mem_calloc((size_t)rows + 1, sizeof(*pc->cols));
    for (int r = 0; r < rows; ++r) {
        if (strcmp(PQgetvalue(res, r, I_TABLE), table) != 0)
            continue;
        found = 1;
        if (PQgetisnull(res, r, I_COLUMN)) {
            snprintf(err, errsz, "%s.table: no table \"%s\" in the database", path, table);
            return -1;
        }
        /*
         * The SQL builder writes a field name between double quotes as it is:
         * a column whose name holds a quote or a control byte (only someone
         * with DDL rights can make one) is never offered, so no field name
         * can end the identifier early.
         */
        if (!col_allowed(cc, PQgetvalue(res, r, I_COLUMN)) || !plain_ident(PQgetvalue(res, r, I_COLUMN)))
            continue;
        pc->cols[pc->ncols].name = sb_mem_strdup(PQgetvalue(res, r, I_COLUMN));
        pc->cols[pc->ncols].oid = (unsigned)strtoul(PQgetvalue(res, r, I_OID), NULL, 10);
        pc->cols[pc->ncols].type = sb_mem_strdup(PQgetvalue(res, r, I_TYPE));
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
static sb_status_t put_ident(sb_buf_t *b, const char *name)
{
    sb_status_t st = sb_buf_append_char(b, '"');
    for (const char *p = name; *p != '\0' && st == SB_OK; ++p)
        if (*p != '"' || (st = sb_buf_append_char(b, '"')) == SB_OK)
            st = sb_buf_append_char(b, *p);
    return st != SB_OK ? st : sb_buf_append_char(b, '"');
}

/* the statement of a table global, from its introspected columns; err names the first mismatch */
static int build_global(pg_global_t *pg, const sb_global_conf_t *gc, PGresult *res, const char *path, char *err, size_t errsz)
{
    sb_pg_coll_t *pc = &pg->cols;
    const sb_pg_col_t *where[1 + SB_MAX_SCOPE_ENTRIES];
    size_t nwhere = 0;
    sb_buf_t sql;
    sb_status_t st;

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
    sb_buf_init(&sql, SB_PG_MAX_SQL);
    st = sb_buf_append_str(&sql, "SELECT ");
    for (size_t i = 0, first = 1; i < pc->ncols && st == SB_OK; ++i) {
        if (gc->column != NULL && strcmp(pc->cols[i].name, gc->column) != 0)
            continue;
        if (!first)
            st = sb_buf_append_str(&sql, ", ");
        if (st == SB_OK)
            st = put_ident(&sql, pc->cols[i].name);
        first = 0;
    }
    if (st == SB_OK)
        st = sb_buf_printf(&sql, " FROM %s WHERE TRUE", gc->table);
    for (size_t i = 0; i < nwhere && st == SB_OK; ++i) {
        pg->types[pg->nparams++] = (Oid)where[i]->oid;
        if ((st = sb_buf_append_str(&sql, " AND ")) == SB_OK && (st = put_ident(&sql, where[i]->name)) == SB_OK)
            st = sb_buf_printf(&sql, " = $%d", pg->nparams);
    }
    /* two rows tell an ambiguous configuration from a single row */
    if (st == SB_OK)
        st = sb_buf_append_str(&sql, " LIMIT 2");
    if (st == SB_OK)
        st = sb_buf_take(&sql, &pg->sql, NULL);
    sb_buf_free(&sql);
    if (st != SB_OK) {
        snprintf(err, errsz, "%s: the statement exceeds %u bytes", path, SB_PG_MAX_SQL);
        return -1;
    }
    return 0;
}

/* builds every target's schema from the introspection result; err names the first mismatch */
int sb_pg__build_schemas(sb_pg_pool_t *p, PGresult *res, char *err, size_t errsz)
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

void sb_pg__free_schemas(sb_pg_pool_t *p)
{
    for (size_t i = 0; i < p->nschemas; ++i) {
        target_schema_t *ts = &p->schemas[i];
        for (size_t c = 0; c <= ts->ncolls; ++c) {
            sb_pg_coll_t *pc = c < ts->ncolls ? &ts->colls[c] : ts->docstore;
            if (pc == NULL)
                continue;
            for (size_t k = 0; k < pc->ncols; ++k) {
                sb_mem_free(pc->cols[k].name);
                sb_mem_free(pc->cols[k].type);
            }
            sb_mem_free(pc->cols);
            sb_mem_free(pc->name);
            sb_mem_free(pc->table);
            sb_mem_free(pc->key);
        }
        sb_mem_free(ts->colls);
        sb_mem_free(ts->docstore);
        for (size_t k = 0; k < ts->nglobals; ++k) {
            pg_global_t *pg = &ts->globals[k];
            for (size_t c = 0; c < pg->cols.ncols; ++c) {
                sb_mem_free(pg->cols.cols[c].name);
                sb_mem_free(pg->cols.cols[c].type);
            }
            sb_mem_free(pg->cols.cols);
            sb_mem_free(pg->cols.table);
            sb_mem_free(pg->sql);
        }
        sb_mem_free(ts->globals);
    }
    sb_mem_free(p->schemas);
    p->schemas = NULL;
    p->nschemas = 0;
}

/* 1 when the text[] literal being built already names `t` */
static int list_has(const sb_buf_t *s, const char *t)
{
    size_t n = strlen(t);
    for (const char *p = s->base + 1; p < s->base + s->len;) {
        const char *e = memchr(p, ',', (size_t)(s->base + s->len - p));
        size_t seg = e != NULL ? (size_t)(e - p) : (size_t)(s->base + s->len - p);
        if (seg == n && memcmp(p, t, n) == 0)
            return 1;
        p += seg + 1;
    }
    return 0;
}

/* appends a table to the text[] literal unless it is there (introspection answers a row per column per mention) */
static void list_add(sb_buf_t *s, const char *t)
{
    if (list_has(s, t))
        return;
    /* the table names of a validated configuration: a few KiB at most, under SB_BUF_MAX_CAP */
    if ((s->len > 1 && sb_buf_append_char(s, ',') != SB_OK) || sb_buf_append_str(s, t) != SB_OK)
        sb_fatal(__FILE__, __LINE__, "out of memory");
}

/* the text[] literal of every table the targets name (identifiers were validated as [a-z0-9_.]) */
char *sb_pg__table_list(const sb_targets_t *targets)
{
    sb_buf_t s;
    char *out;
    sb_buf_init(&s, SB_BUF_MAX_CAP);
    if (sb_buf_append_char(&s, '{') != SB_OK)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    for (size_t i = 0; i < targets->n; ++i) {
        const sb_target_t *t = &targets->v[i];
        for (size_t c = 0; c < t->ncollections; ++c)
            list_add(&s, t->collections[c].table);
        if (t->document_store != NULL)
            list_add(&s, t->document_store->table);
        for (size_t g = 0; g < t->nglobals; ++g)
            if (t->globals[g].table != NULL)
                list_add(&s, t->globals[g].table);
    }
    if (sb_buf_append_char(&s, '}') != SB_OK || sb_buf_take(&s, &out, NULL) != SB_OK)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    return out;
}

/* ---- privileges --------------------------------------------------------------------------------------------------- */

enum { P_SELECT = 1, P_INSERT = 2, P_UPDATE = 4, P_DELETE = 8, P_ALL = 15 };

/* the privileges some target's manifests can use on `table`: a collection or document store every verb, a global reads */
static unsigned needed(const sb_targets_t *targets, const char *table)
{
    unsigned want = 0;
    for (size_t i = 0; i < targets->n; ++i) {
        const sb_target_t *t = &targets->v[i];
        for (size_t c = 0; c < t->ncollections; ++c)
            if (strcmp(t->collections[c].table, table) == 0)
                want |= P_ALL; /* read, create, update, delete: SELECT, INSERT, UPDATE, DELETE */
        if (t->document_store != NULL && strcmp(t->document_store->table, table) == 0)
            want |= P_ALL; /* read and write: every statement kind */
        for (size_t g = 0; g < t->nglobals; ++g)
            if (t->globals[g].table != NULL && strcmp(t->globals[g].table, table) == 0)
                want |= P_SELECT;
    }
    return want;
}

static void put_missing(sb_buf_t *b, int *first_of_table, const char *table, const char *what)
{
    sb_status_t st = SB_OK;
    if (*first_of_table) {
        st = b->len != 0 ? sb_buf_append_str(b, "; ") : SB_OK;
        if (st == SB_OK)
            st = sb_buf_printf(b, "%s: %s", table, what);
        *first_of_table = 0;
    } else {
        st = sb_buf_printf(b, ", %s", what);
    }
    /* bounded by the configuration's tables and columns; a message cut short would hide a missing grant */
    if (st != SB_OK)
        sb_fatal(__FILE__, __LINE__, "out of memory");
}

char *sb_pg__missing_privileges(const sb_targets_t *targets, PGresult *res)
{
    static const struct {
        unsigned bit;
        int col;
        const char *name;
    } privs[] = {{P_SELECT, I_SELECT, "SELECT"},
                 {P_INSERT, I_INSERT, "INSERT"},
                 {P_UPDATE, I_UPDATE, "UPDATE"},
                 {P_DELETE, I_DELETE, "DELETE"}};
    int rows = PQntuples(res);
    sb_buf_t b;
    char *out = NULL;

    if (PQnfields(res) < I_NCOLS)
        return NULL;
    sb_buf_init(&b, SB_BUF_MAX_CAP);
    for (int r = 0; r < rows; ++r) {
        const char *table = PQgetvalue(res, r, I_TABLE);
        unsigned want;
        int first = 1;
        /* the table's first row carries its privileges; a table that does not exist is the schema check's */
        if ((r > 0 && strcmp(PQgetvalue(res, r - 1, I_TABLE), table) == 0) || PQgetisnull(res, r, I_SELECT))
            continue;
        want = needed(targets, table);
        for (size_t k = 0; k < sizeof(privs) / sizeof(privs[0]); ++k)
            if ((want & privs[k].bit) && strcmp(PQgetvalue(res, r, privs[k].col), "t") != 0)
                put_missing(&b, &first, table, privs[k].name);
        /* an INSERT draws from the sequence of every serial column */
        for (int q = r; (want & P_INSERT) && q < rows && strcmp(PQgetvalue(res, q, I_TABLE), table) == 0; ++q)
            if (!PQgetisnull(res, q, I_SEQ_USAGE) && strcmp(PQgetvalue(res, q, I_SEQ_USAGE), "t") != 0) {
                char what[300];
                snprintf(what, sizeof(what), "USAGE on sequence %s", PQgetvalue(res, q, I_SEQ));
                put_missing(&b, &first, table, what);
            }
    }
    if (b.len != 0 && sb_buf_take(&b, &out, NULL) != SB_OK)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    sb_buf_free(&b);
    return out;
}

/* 1 when some target reads or writes the database */
int sb_pg__uses_database(const sb_targets_t *targets)
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

/* the privilege state the log last told, and the number of the look that told it: every worker's pool looks, the
 * log says it once per change, in the order the looks were sent */
static pthread_mutex_t privileges_lock = PTHREAD_MUTEX_INITIALIZER;
static int privileges_logged;
static uint64_t privileges_look, looks_sent;

uint64_t sb_pg__next_look(void)
{
    return __atomic_add_fetch(&looks_sent, 1, __ATOMIC_SEQ_CST);
}

/* keeps what the introspection found about the privileges; logs a change (missing ones, or all present again) */
static void note_privileges(sb_pg_pool_t *p, PGresult *res)
{
    char *missing = sb_pg__missing_privileges(p->targets, res);
    int changed = 0;

    pthread_mutex_lock(&privileges_lock);
    if (p->look > privileges_look) { /* an older look than the one the log told last is stale for the log */
        privileges_look = p->look;
        changed = privileges_logged != (missing != NULL);
        privileges_logged = missing != NULL;
    }
    pthread_mutex_unlock(&privileges_lock);
    sb_mem_free(p->missing);
    p->missing = missing;
    if (changed && missing != NULL) {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_ERROR, "pg.privileges_missing");
        sb_log_cstr(&l, "addr", p->addr);
        sb_log_cstr(&l, "missing", missing);
        sb_log_cstr(&l, "msg", "data calls that need them fail; deploy/README.md lists the GRANT statements");
        sb_log_end(&l);
    } else if (changed) {
        sb_log_msg(SB_LOG_INFO, "pg.privileges_ok", "the role now holds every privilege the targets need");
    }
}

int sb_pg__on_introspected(job_t *job, PGresult *res, const char *err)
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
    if (p->introspected) {
        /* a recheck while privileges were missing: the schema stays as it is (jobs point into it) */
        note_privileges(p, res);
        return 0;
    }
    if (sb_pg__build_schemas(p, res, msg, sizeof(msg)) != 0) {
        sb_logline_t l;
        sb_pg__free_schemas(p);
        sb_log_begin(&l, SB_LOG_ERROR, "pg.schema_mismatch");
        sb_log_cstr(&l, "reason", msg);
        sb_log_end(&l);
        return 0;
    }
    p->introspected = 1;
    note_privileges(p, res);
    sb_log_msg(SB_LOG_INFO, "pg.ready", "tables introspected");
    return 0;
}

const target_schema_t *sb_pg__schema_of(const sb_pg_pool_t *p, const sb_target_t *t)
{
    for (size_t i = 0; i < p->nschemas; ++i)
        if (p->schemas[i].target == t)
            return &p->schemas[i];
    return NULL;
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
    char *missing;
    sb_status_t st = SB_OK;

    *reachable = 0;
    if (!sb_pg__uses_database(targets))
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
    params[0] = sb_pg__table_list(targets);
    res = PQexecParams(pg, sb_pg__introspect_sql, 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        snprintf(err, errsz, "database_url: introspection failed: %s", PQresultErrorMessage(res));
        st = SB_E_UNAVAILABLE;
    } else if (sb_pg__build_schemas(&tmp, res, err, errsz) != 0) {
        st = SB_E_BAD_ARGS;
    } else if ((missing = sb_pg__missing_privileges(targets, res)) != NULL) {
        /* every data call that needs one would fail: the check must say so (deploy/README.md has the GRANTs) */
        snprintf(err, errsz, "database_url: the role \"%s\" lacks privileges the targets need: %s", PQuser(pg), missing);
        sb_mem_free(missing);
        st = SB_E_FORBIDDEN;
    }
    sb_pg__free_schemas(&tmp);
    PQclear(res);
    sb_mem_free((char *)params[0]);
    PQfinish(pg);
    return st;
}
