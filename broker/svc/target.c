/*
 * Parsing of "targets": strict, like the rest of the configuration. Unknown
 * keys, wrong types and unsafe identifiers are errors naming their path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/value.h"
#include "svc/target.h"
#include "authz/secrets.h"
#include "util/util.h"

/* the parsers' error exit (util.h) */
#define bad(...) sb_fail_bad_args(__VA_ARGS__)

/* SQL identifiers we accept: [a-z_][a-z0-9_]* (63 bytes), optionally "schema.table" for tables */
static int is_sql_ident(const char *s, int allow_schema)
{
    size_t n = strlen(s), seg = 0;
    int dots = 0;
    if (n == 0 || n > 127)
        return 0;
    for (size_t i = 0; i < n; ++i) {
        char c = s[i];
        if (c == '.') {
            if (!allow_schema || ++dots > 1 || seg == 0)
                return 0;
            seg = 0;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || c == '_' || (seg != 0 && c >= '0' && c <= '9')) || ++seg > 63)
            return 0;
    }
    return seg != 0;
}

static sb_status_t check_keys(const json_t *o, const char *path, const char *const *known, char *err, size_t errsz)
{
    const char *k;
    json_t *v;
    if (!json_is_object(o))
        return bad(err, errsz, "%s: expected an object", path);
    json_object_foreach((json_t *)o, k, v)
    {
        size_t i = 0;
        while (known[i] != NULL && strcmp(known[i], k) != 0)
            ++i;
        if (known[i] == NULL)
            return bad(err, errsz, "%s.%s: unknown key", path, k);
    }
    return SB_OK;
}

static sb_status_t get_uint(const json_t *o, const char *key, const char *path, uint64_t min, uint64_t max, uint64_t def,
                            uint64_t *out, char *err, size_t errsz)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL) {
        *out = def;
        return SB_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < (json_int_t)min || json_integer_value(v) > (json_int_t)max)
        return bad(err, errsz, "%s.%s: expected an integer from %llu to %llu", path, key, (unsigned long long)min,
                   (unsigned long long)max);
    *out = (uint64_t)json_integer_value(v);
    return SB_OK;
}

static sb_status_t parse_scope(const json_t *o, const char *path, sb_scope_bind_t **out, size_t *n, char *err, size_t errsz)
{
    const char *col;
    json_t *key;
    size_t i = 0;

    *out = NULL;
    *n = 0;
    if (o == NULL)
        return SB_OK;
    if (!json_is_object(o) || json_object_size(o) > SB_MAX_SCOPE_ENTRIES)
        return bad(err, errsz, "%s.scope: expected an object of at most %u column: scopeKey entries", path, SB_MAX_SCOPE_ENTRIES);
    *out = sb_mem_calloc(json_object_size(o), sizeof(**out));
    json_object_foreach((json_t *)o, col, key)
    {
        if (!is_sql_ident(col, 0))
            return bad(err, errsz, "%s.scope.%s: not a plain lowercase SQL column name", path, col);
        if (!json_is_string(key) || !sb_is_name(json_string_value(key), 64))
            return bad(err, errsz, "%s.scope.%s: expected a scope key of [A-Za-z0-9_-]{1,64}", path, col);
        (*out)[i].column = sb_mem_strdup(col);
        (*out)[i].scope_key = sb_mem_strdup(json_string_value(key));
        *n = ++i;
    }
    return SB_OK;
}

static sb_status_t parse_collection(const char *name, const json_t *o, const char *tpath, sb_collection_conf_t *c, char *err,
                                    size_t errsz)
{
    static const char *const known[] = {"table", "key", "max_limit", "columns", "scope", NULL};
    char path[256];
    json_t *table, *key, *cols;
    uint64_t u;
    sb_status_t st;

    snprintf(path, sizeof(path), "%s.collections.%s", tpath, name);
    if (!sb_is_name(name, 128) || strcmp(name, "document_store") == 0)
        return bad(err, errsz, "%s: collection names are [A-Za-z0-9_-]{1,128} and not document_store", path);
    if ((st = check_keys(o, path, known, err, errsz)) != SB_OK)
        return st;
    c->name = sb_mem_strdup(name);
    table = json_object_get(o, "table");
    key = json_object_get(o, "key");
    if (!json_is_string(table) || !is_sql_ident(json_string_value(table), 1))
        return bad(err, errsz, "%s.table: expected a lowercase SQL table name (schema.table allowed)", path);
    if (!json_is_string(key) || !is_sql_ident(json_string_value(key), 0))
        return bad(err, errsz, "%s.key: expected a lowercase SQL column name", path);
    c->table = sb_mem_strdup(json_string_value(table));
    c->key = sb_mem_strdup(json_string_value(key));
    if ((st = get_uint(o, "max_limit", path, 1, 1000, 100, &u, err, errsz)) != SB_OK)
        return st;
    c->max_limit = (size_t)u;
    if ((cols = json_object_get(o, "columns")) != NULL) {
        size_t i;
        json_t *v;
        if (!json_is_array(cols) || json_array_size(cols) == 0 || json_array_size(cols) > 256)
            return bad(err, errsz, "%s.columns: expected 1-256 column names", path);
        c->columns = sb_mem_calloc(json_array_size(cols), sizeof(char *));
        json_array_foreach(cols, i, v)
        {
            if (!json_is_string(v) || !is_sql_ident(json_string_value(v), 0))
                return bad(err, errsz, "%s.columns[%zu]: expected a lowercase SQL column name", path, i);
            c->columns[c->ncolumns++] = sb_mem_strdup(json_string_value(v));
        }
    }
    return parse_scope(json_object_get(o, "scope"), path, &c->scope, &c->nscope, err, errsz);
}

/*
 * A global is a static "value" or a table row ("table", "key" + "row",
 * "column", "scope"), never both: "value" is the static value itself, so the
 * column a table global answers is named by "column".
 */
static sb_status_t parse_global(const char *name, const json_t *o, const char *tpath, sb_global_conf_t *gc, char *err, size_t errsz)
{
    static const char *const known[] = {"value", "table", "key", "row", "column", "scope", NULL};
    char path[400];
    json_t *value, *table, *key, *row, *column;
    sb_status_t st;

    snprintf(path, sizeof(path), "%s.globals.%s", tpath, name);
    msgpack_sbuffer_init(&gc->value);
    if (!sb_is_name(name, 128))
        return bad(err, errsz, "%s: global names are [A-Za-z0-9_-]{1,128}", path);
    if ((st = check_keys(o, path, known, err, errsz)) != SB_OK)
        return st;
    gc->name = sb_mem_strdup(name);
    value = json_object_get(o, "value");
    table = json_object_get(o, "table");
    key = json_object_get(o, "key");
    row = json_object_get(o, "row");
    column = json_object_get(o, "column");
    if (value != NULL && table != NULL)
        return bad(err, errsz, "%s: a static value or a table, not both (a table global's value column is \"column\")", path);
    if (value != NULL) {
        msgpack_packer pk;
        const char *why = NULL;
        static const char *const table_only[] = {"key", "row", "column", "scope", NULL};
        for (size_t i = 0; table_only[i] != NULL; ++i)
            if (json_object_get(o, table_only[i]) != NULL)
                return bad(err, errsz, "%s.%s: only a table global takes it", path, table_only[i]);
        msgpack_packer_init(&pk, &gc->value, msgpack_sbuffer_write);
        if (sb_mp_pack_json(&pk, value, &why) != SB_OK || gc->value.size > SB_MAX_NATIVE_RESULT)
            return bad(err, errsz, "%s.value: too large or too deep", path);
        return SB_OK;
    }
    if (table == NULL)
        return bad(err, errsz, "%s: expected a static \"value\" or a \"table\"", path);
    if (!json_is_string(table) || !is_sql_ident(json_string_value(table), 1))
        return bad(err, errsz, "%s.table: expected a lowercase SQL table name (schema.table allowed)", path);
    gc->table = sb_mem_strdup(json_string_value(table));
    if ((key == NULL) != (row == NULL))
        return bad(err, errsz, "%s.%s: key and row go together (the row whose key column equals row)", path,
                   key == NULL ? "key" : "row");
    if (key != NULL) {
        if (!json_is_string(key) || !is_sql_ident(json_string_value(key), 0))
            return bad(err, errsz, "%s.key: expected a lowercase SQL column name", path);
        if (!json_is_string(row) || json_string_length(row) == 0 || json_string_length(row) > 1024 ||
            strlen(json_string_value(row)) != json_string_length(row))
            return bad(err, errsz, "%s.row: expected the key column's value as a string of 1-1024 bytes without NUL", path);
        gc->key = sb_mem_strdup(json_string_value(key));
        gc->row = sb_mem_strdup(json_string_value(row));
    }
    if (column != NULL) {
        if (!json_is_string(column) || !is_sql_ident(json_string_value(column), 0))
            return bad(err, errsz, "%s.column: expected a lowercase SQL column name", path);
        gc->column = sb_mem_strdup(json_string_value(column));
    }
    if ((st = parse_scope(json_object_get(o, "scope"), path, &gc->scope, &gc->nscope, err, errsz)) != SB_OK)
        return st;
    if (gc->key == NULL && gc->nscope == 0)
        return bad(err, errsz, "%s: a table global needs key and row, or a scope, to select its row", path);
    return SB_OK;
}

static sb_status_t parse_target(const char *name, const json_t *o, sb_target_t *t, char *err, size_t errsz)
{
    static const char *const known[] = {"collections", "document_store", "files", "tools", "globals", "secrets", NULL};
    char path[200];
    json_t *v;
    sb_status_t st;

    snprintf(path, sizeof(path), "targets.%s", name);
    if (!sb_is_name(name, 128))
        return bad(err, errsz, "%s: target names are [A-Za-z0-9_-]{1,128}", path);
    if ((st = check_keys(o, path, known, err, errsz)) != SB_OK)
        return st;
    t->name = sb_mem_strdup(name);
    if ((v = json_object_get(o, "collections")) != NULL) {
        const char *cname;
        json_t *c;
        if (!json_is_object(v) || json_object_size(v) > 256)
            return bad(err, errsz, "%s.collections: expected an object of at most 256 collections", path);
        t->collections = sb_mem_calloc(json_object_size(v), sizeof(*t->collections));
        json_object_foreach(v, cname, c)
        {
            if ((st = parse_collection(cname, c, path, &t->collections[t->ncollections++], err, errsz)) != SB_OK)
                return st;
        }
    }
    if ((v = json_object_get(o, "document_store")) != NULL) {
        static const char *const dknown[] = {"table", "scope", NULL};
        char dpath[256];
        json_t *table;
        snprintf(dpath, sizeof(dpath), "%s.document_store", path);
        if ((st = check_keys(v, dpath, dknown, err, errsz)) != SB_OK)
            return st;
        t->document_store = sb_mem_calloc(1, sizeof(*t->document_store));
        table = json_object_get(v, "table");
        if (!json_is_string(table) || !is_sql_ident(json_string_value(table), 1))
            return bad(err, errsz, "%s.table: expected a lowercase SQL table name", dpath);
        t->document_store->table = sb_mem_strdup(json_string_value(table));
        if ((st = parse_scope(json_object_get(v, "scope"), dpath, &t->document_store->scope, &t->document_store->nscope, err,
                              errsz)) != SB_OK)
            return st;
    }
    if ((v = json_object_get(o, "files")) != NULL) {
        static const char *const fknown[] = {"root", "max_read_bytes", "max_write_bytes", "max_entries", NULL};
        char fpath[256];
        json_t *root;
        uint64_t u;
        snprintf(fpath, sizeof(fpath), "%s.files", path);
        if ((st = check_keys(v, fpath, fknown, err, errsz)) != SB_OK)
            return st;
        t->files = sb_mem_calloc(1, sizeof(*t->files));
        root = json_object_get(v, "root");
        if (!json_is_string(root) || json_string_value(root)[0] != '/' || json_string_length(root) > 1024 ||
            strstr(json_string_value(root), "/../") != NULL)
            return bad(err, errsz, "%s.root: expected an absolute directory path", fpath);
        t->files->root = sb_mem_strdup(json_string_value(root));
        if ((st = get_uint(v, "max_read_bytes", fpath, 1, 700000, 512 * 1024, &u, err, errsz)) != SB_OK)
            return st;
        t->files->max_read = (size_t)u;
        /* a write travels in one request, and every request but http.fetch is capped at 65,536 bytes (PROTOCOL.md) */
        if ((st = get_uint(v, "max_write_bytes", fpath, 1, 60 * 1024, 48 * 1024, &u, err, errsz)) != SB_OK)
            return st;
        t->files->max_write = (size_t)u;
        if ((st = get_uint(v, "max_entries", fpath, 1, 10000, 1000, &u, err, errsz)) != SB_OK)
            return st;
        t->files->max_entries = (size_t)u;
    }
    if ((v = json_object_get(o, "tools")) != NULL) {
        static const char *const tknown[] = {"upstream", "release", "timeout_ms", "max_calls", "concurrency", NULL};
        char tpath[256];
        json_t *up, *rel, *e;
        size_t i;
        uint64_t u;
        snprintf(tpath, sizeof(tpath), "%s.tools", path);
        if ((st = check_keys(v, tpath, tknown, err, errsz)) != SB_OK)
            return st;
        t->tools = sb_mem_calloc(1, sizeof(*t->tools));
        up = json_object_get(v, "upstream");
        if (!json_is_string(up) || strncmp(json_string_value(up), "http://", 7) != 0 || json_string_length(up) > 1024)
            return bad(err, errsz, "%s.upstream: expected an http:// MCP endpoint URL", tpath);
        t->tools->upstream = sb_mem_strdup(json_string_value(up));
        rel = json_object_get(v, "release");
        if (!json_is_array(rel) || json_array_size(rel) > 256)
            return bad(err, errsz, "%s.release: expected an array of at most 256 tool names", tpath);
        t->tools->release = sb_mem_calloc(json_array_size(rel) + 1, sizeof(char *));
        json_array_foreach(rel, i, e)
        {
            if (!json_is_string(e) || json_string_length(e) == 0 || json_string_length(e) > 256)
                return bad(err, errsz, "%s.release[%zu]: expected a tool name", tpath, i);
            t->tools->release[t->tools->nrelease++] = sb_mem_strdup(json_string_value(e));
        }
        if ((st = get_uint(v, "timeout_ms", tpath, 100, 30000, 5000, &t->tools->timeout_ms, err, errsz)) != SB_OK)
            return st;
        if ((st = get_uint(v, "max_calls", tpath, 1, 256, 64, &u, err, errsz)) != SB_OK)
            return st;
        t->tools->max_calls = (unsigned)u;
        if ((st = get_uint(v, "concurrency", tpath, 1, 16, 4, &u, err, errsz)) != SB_OK)
            return st;
        t->tools->concurrency = (unsigned)u;
    }
    if ((v = json_object_get(o, "globals")) != NULL) {
        const char *gname;
        json_t *g;
        if (!json_is_object(v) || json_object_size(v) > 256)
            return bad(err, errsz, "%s.globals: expected an object of at most 256 globals", path);
        t->globals = sb_mem_calloc(json_object_size(v), sizeof(*t->globals));
        json_object_foreach(v, gname, g)
        {
            if ((st = parse_global(gname, g, path, &t->globals[t->nglobals++], err, errsz)) != SB_OK)
                return st;
        }
    }
    if ((v = json_object_get(o, "secrets")) != NULL) {
        /* values are read now, from their files or variables: one that cannot be read fails the load (closed) */
        char spath[256];
        snprintf(spath, sizeof(spath), "%s.secrets", path);
        if ((st = sb_secrets_parse_config(v, spath, &t->secrets, err, errsz)) != SB_OK)
            return st == SB_E_NOMEM ? bad(err, errsz, "%s: out of memory", spath) : st;
    }
    return SB_OK;
}

sb_status_t sb_targets_parse(const json_t *targets, sb_targets_t **out, char *err, size_t errsz)
{
    sb_targets_t *t = sb_mem_calloc(1, sizeof(*t));
    const char *name;
    json_t *o;
    sb_status_t st;

    if (targets != NULL && json_is_object(targets)) {
        t->v = sb_mem_calloc(json_object_size(targets) + 1, sizeof(*t->v));
        json_object_foreach((json_t *)targets, name, o)
        {
            if ((st = parse_target(name, o, &t->v[t->n++], err, errsz)) != SB_OK) {
                sb_targets_free(t);
                return st;
            }
        }
    }
    *out = t;
    return SB_OK;
}

static void free_scope(sb_scope_bind_t *s, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        sb_mem_free(s[i].column);
        sb_mem_free(s[i].scope_key);
    }
    sb_mem_free(s);
}

void sb_targets_free(sb_targets_t *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n; ++i) {
        sb_target_t *g = &t->v[i];
        for (size_t c = 0; c < g->ncollections; ++c) {
            sb_collection_conf_t *cc = &g->collections[c];
            sb_mem_free(cc->name);
            sb_mem_free(cc->table);
            sb_mem_free(cc->key);
            for (size_t k = 0; k < cc->ncolumns; ++k)
                sb_mem_free(cc->columns[k]);
            sb_mem_free(cc->columns);
            free_scope(cc->scope, cc->nscope);
        }
        sb_mem_free(g->collections);
        if (g->document_store != NULL) {
            sb_mem_free(g->document_store->table);
            free_scope(g->document_store->scope, g->document_store->nscope);
            sb_mem_free(g->document_store);
        }
        if (g->files != NULL) {
            sb_mem_free(g->files->root);
            sb_mem_free(g->files);
        }
        if (g->tools != NULL) {
            sb_mem_free(g->tools->upstream);
            for (size_t k = 0; k < g->tools->nrelease; ++k)
                sb_mem_free(g->tools->release[k]);
            sb_mem_free(g->tools->release);
            sb_mem_free(g->tools);
        }
        for (size_t k = 0; k < g->nglobals; ++k) {
            sb_global_conf_t *gc = &g->globals[k];
            sb_mem_free(gc->name);
            msgpack_sbuffer_destroy(&gc->value);
            sb_mem_free(gc->table);
            sb_mem_free(gc->key);
            sb_mem_free(gc->row);
            sb_mem_free(gc->column);
            free_scope(gc->scope, gc->nscope);
        }
        sb_mem_free(g->globals);
        sb_secrets_free(g->secrets);
        sb_mem_free(g->name);
    }
    sb_mem_free(t->v);
    sb_mem_free(t);
}

const sb_target_t *sb_targets_find(const sb_targets_t *t, const char *name)
{
    if (t == NULL || name == NULL || name[0] == '\0')
        return NULL;
    for (size_t i = 0; i < t->n; ++i)
        if (strcmp(t->v[i].name, name) == 0)
            return &t->v[i];
    return NULL;
}

const char *sb_token_scope_value(const sb_token_t *tok, const char *key)
{
    for (size_t i = 0; i < tok->scope_len; ++i)
        if (strcmp(tok->scope[i].key, key) == 0)
            return tok->scope[i].value;
    return NULL;
}
