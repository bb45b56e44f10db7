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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>
#include "obs/log.h"
#include "sb/limits.h"
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
char *sb_pg__table_list(const sb_targets_t *targets)
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
    if (sb_pg__build_schemas(p, res, msg, sizeof(msg)) != 0) {
        sb_logline_t l;
        sb_pg__free_schemas(p);
        sb_log_begin(&l, SB_LOG_ERROR, "pg.schema_mismatch");
        sb_log_cstr(&l, "reason", msg);
        sb_log_end(&l);
        return 0;
    }
    p->introspected = 1;
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
    }
    sb_pg__free_schemas(&tmp);
    PQclear(res);
    free((char *)params[0]);
    PQfinish(pg);
    return st;
}
