/*
 * broker/svc/pg/pg_query: SQL for collections and the document store, from
 * the typed call (call/call.h).
 *
 * Pure functions, no I/O: easy to test and to fuzz. Every value the guest
 * sends becomes a positional parameter ($n) cast to the column's introspected
 * type; identifiers come only from the introspected schema and are quoted.
 * Nothing from the guest is ever spliced into SQL text.
 */
#ifndef SB_PG_QUERY_H
#define SB_PG_QUERY_H

#include <stddef.h>
#include <libpq-fe.h>
#include <msgpack.h>
#include "sb/method.h"
#include "sb/status.h"
#include "call/call.h"
#include "store/store.h"
#include "svc/target.h"

#define SB_PG_MAX_PARAMS 1024u
#define SB_PG_MAX_SQL 65536u

typedef struct st_sb_pg_col_t {
    char *name;
    unsigned oid;
    char *type; /* format_type(), used in casts */
} sb_pg_col_t;

/** a collection as the database knows it: the configured clamp plus introspected columns */
typedef struct st_sb_pg_coll_t {
    char *name; /* collections.<name> ("document_store" for the store) */
    char *table;
    char *key;
    size_t max_limit;
    sb_pg_col_t *cols; /* the columns the guest may read and write (allowlist ∩ table) */
    size_t ncols;
    const sb_scope_bind_t *scope;
    size_t nscope;
    int is_docstore; /* a "store" column is clamped to the call's namespace */
} sb_pg_coll_t;

typedef struct st_sb_sql_t {
    char *sql;                      /* the statement (sb_mem), built in a sb_buf_t capped at SB_PG_MAX_SQL */
    size_t len;                     /* strlen(sql) */
    char *params[SB_PG_MAX_PARAMS]; /* NULL means SQL NULL */
    int nparams;
    size_t limit, offset; /* find: the page the guest asked for (limit + 1 rows are fetched) */
} sb_sql_t;

void sb_sql_init(sb_sql_t *q);
void sb_sql_dispose(sb_sql_t *q);

/**
 * Builds the statement for one operation of a decoded call. The document
 * store's statements are clamped to d->ns, the namespace the check granted.
 * @param d the call's decoded args (whose shapes the decoder checked)
 * @param binary msgpack request: bytea values arrive as bin (JSON: base64 text)
 * @param err on SB_E_BAD_ARGS / SB_E_FORBIDDEN, a message naming the field (unknown to the schema, or bound to the scope)
 */
SB_WARN_UNUSED sb_status_t sb_pg_build(const sb_pg_coll_t *c, sb_method_op_t op, const sb_call_data_t *d, const sb_token_t *tok,
                                       int binary, sb_sql_t *q, char *err, size_t errsz);

/**
 * Packs the rows of a result as an array of maps (column name → value, types
 * mapped as PROTOCOL.md says), at most `max_rows` rows.
 * @return SB_OK, or SB_E_EXECUTION when the packed size would exceed `cap`
 */
SB_WARN_UNUSED sb_status_t sb_pg_pack_rows(const PGresult *res, int max_rows, msgpack_packer *pk, size_t cap, msgpack_sbuffer *sb);
/** packs one row (findOne, create) */
SB_WARN_UNUSED sb_status_t sb_pg_pack_row(const PGresult *res, int row, msgpack_packer *pk);

#endif
