/*
 * broker/svc/target: what a run's target wires (docs/config.md, "targets").
 *
 * A token binds a run to a target (the capability-scoped surface the host
 * built) and a scope (values such as a tenant id). The manifest says what the
 * run may do; the target says what exists and clamps it: an operation the
 * manifest allows but the target never wired stays not_implemented.
 *
 * Parsed once at start-up from the "targets" configuration object,
 * immutable afterwards and shared by every worker.
 */
#ifndef SB_TARGET_H
#define SB_TARGET_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/status.h"
#include "store/store.h"

/** a column bound to a token scope value: every query has column = the value */
typedef struct st_sb_scope_bind_t {
    char *column;
    char *scope_key;
} sb_scope_bind_t;

typedef struct st_sb_collection_conf_t {
    char *name;       /* the name in the method (collections.<name>.op) */
    char *table;      /* the SQL table, possibly schema-qualified "schema.table" */
    char *key;        /* the key column */
    size_t max_limit; /* page size cap (default 100) */
    char **columns;   /* allowlisted columns; NULL means every column the table has */
    size_t ncolumns;
    sb_scope_bind_t *scope;
    size_t nscope;
} sb_collection_conf_t;

typedef struct st_sb_docstore_conf_t {
    char *table;
    sb_scope_bind_t *scope;
    size_t nscope;
} sb_docstore_conf_t;

typedef struct st_sb_files_conf_t {
    char *root;         /* may contain {scopeKey} placeholders */
    size_t max_read;    /* bytes, default 786,432 minus envelope room */
    size_t max_write;   /* bytes, default 1 MiB */
    size_t max_entries; /* files.list entries, default 1000 */
} sb_files_conf_t;

typedef struct st_sb_tools_conf_t {
    char *upstream; /* MCP Streamable HTTP endpoint, http://host:port/path (numeric host or localhost) */
    char **release; /* tool names the target releases */
    size_t nrelease;
    uint64_t timeout_ms;  /* per operation, default 5000, at most 30000 */
    unsigned max_calls;   /* tools.call per run, default 64, at most 256 */
    unsigned concurrency; /* in flight per worker, default 4, at most 16 */
} sb_tools_conf_t;

/**
 * A readable global: a static value, or one row of a table. A table global
 * reads the single row whose key column equals `row` (no key: the single row
 * the scope selects) and whose scope columns equal the token's values, and
 * answers its `column`, or the whole row when no column is named.
 */
typedef struct st_sb_global_conf_t {
    char *name;
    msgpack_sbuffer value; /* the static value, packed (static globals only) */
    char *table;           /* NULL for a static value; possibly "schema.table" */
    char *key;             /* the key column, or NULL (then row is NULL too) */
    char *row;             /* the key column's value */
    char *column;          /* the value column, or NULL for the whole row */
    sb_scope_bind_t *scope;
    size_t nscope;
} sb_global_conf_t;

typedef struct st_sb_target_t {
    char *name;
    sb_collection_conf_t *collections;
    size_t ncollections;
    sb_docstore_conf_t *document_store; /* NULL when not wired */
    sb_files_conf_t *files;             /* NULL when not wired */
    sb_tools_conf_t *tools;             /* NULL when not wired */
    sb_global_conf_t *globals;
    size_t nglobals;
    /* targets.<t>.secrets (authz/secrets.h), values read at parse time; NULL when none */
    struct st_sb_secrets_t *secrets;
} sb_target_t;

typedef struct st_sb_targets_t {
    sb_target_t *v;
    size_t n;
} sb_targets_t;

/**
 * Parses and validates the "targets" object (structure only; tables and
 * columns are checked against the database by the PostgreSQL module).
 * @param err receives the first problem, naming its path ("targets.app.files.root: ...")
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_targets_parse(const json_t *targets, sb_targets_t **out, char *err, size_t errsz);
void sb_targets_free(sb_targets_t *t);
/** the target a token is bound to, or NULL (no target, or an unknown one) */
const sb_target_t *sb_targets_find(const sb_targets_t *t, const char *name);
/** the token's value for a scope key, or NULL when the token does not bind it */
const char *sb_token_scope_value(const sb_token_t *tok, const char *key);

#endif
