/*
 * broker/svc/pg: what the parts of the PostgreSQL family share (pool.c,
 * schema.c, pg.c, globals.c). Nothing outside broker/svc/pg includes this.
 *
 * A job is one call's statement (or, for a write, its transaction) queued on
 * the worker's pool; the pool runs it on an idle connection and calls the
 * job's callback with the result.
 */
#ifndef SB_PG_INT_H
#define SB_PG_INT_H

#include <h2o.h>
#include <libpq-fe.h>
#include "svc/handlers.h"
#include "svc/pg/pg_query.h"

/* jobs queued per pool; one more answers rate_limited */
#define SB_PG_MAX_QUEUE 256
/* prepared statements kept per connection (least recently used deallocated first), and the longest text kept */
#define SB_PG_STMT_CACHE 64
#define SB_PG_STMT_TEXT 8192

typedef enum { C_DOWN = 0, C_CONNECTING, C_IDLE, C_BUSY } conn_state_t;

typedef struct st_job_t job_t;
typedef struct st_pg_global_t pg_global_t;
/* called when a statement completes (res) or the connection failed (err); returns 1 when the job sent another statement */
typedef int (*job_cb)(job_t *job, PGresult *res, const char *err);
/* called for each row of a statement run in single-row mode (row 0 of a PGRES_SINGLE_TUPLE result) */
typedef void (*job_row_cb)(job_t *job, const PGresult *res, int row);

struct st_job_t {
    h2o_linklist_t link;
    sb_sql_t q;
    job_cb cb;
    /* rows one at a time (single-row mode), so a result is bounded while it arrives; NULL: the whole result at once */
    job_row_cb on_row;
    /* the call */
    sb_token_t *tok;
    const sb_pg_coll_t *coll;
    sb_method_op_t op;
    int binary;
    sb_dispatch_cb dcb;
    void *arg;
    /*
     * writes run in a transaction: BEGIN and the statement are sent together
     * (phase 1), then COMMIT or ROLLBACK (phase 2) once the answer is decided
     */
    int tx, phase;
    int unnamed; /* run without a prepared statement (the introspection: once per pool) */
    struct st_pconn_t *conn;
    struct st_sb_pg_pool_t *pool; /* the reference the job holds, once queued */
    const Oid *types;             /* the parameters' types (NULL: inferred from the casts in the statement) */
    const pg_global_t *global;
    sb_result_t prepared; /* the answer, decided after the statement, delivered after the transaction */
    int have_prepared;
    /* the rows packed so far (single-row mode): count seen, count packed, the running bytes against the cap */
    msgpack_sbuffer rows;
    size_t nrows, npacked;
    int rows_over;
};

/* a statement prepared on one connection, known by its text (pool.c) */
typedef struct st_pstmt_t {
    uint64_t hash;
    char *sql;     /* NULL: a free slot */
    uint64_t used; /* the connection's clock at the last use (least recently used is evicted) */
    unsigned id;   /* its name is "sb<id>" */
    int stale;     /* the table changed under it (SQLSTATE 0A000): prepared again before its next use */
} pstmt_t;

/* what a result in a flight answers, in the order the statements were sent */
typedef enum { X_BEGIN, X_DEALLOC, X_PREPARE, X_MAIN, X_TXEND } expect_t;
#define SB_PG_FLIGHT_MAX 6

struct st_pconn_t {
    struct st_sb_pg_pool_t *pool;
    PGconn *pg;
    h2o_socket_t *sock;
    conn_state_t state;
    int want_write;
    job_t *job;
    PGresult *result; /* the result handed to the job: the main statement's, or the flight's first error */
    int64_t started, next_attempt;
    unsigned failures;
    /* the flight in progress (pipeline mode): what each result answers, and which one is being read */
    expect_t expect[SB_PG_FLIGHT_MAX];
    int nexpect, iexpect;
    int preparing; /* the cache slot this flight prepares, or -1 */
    int executing; /* the cache slot of the statement this flight runs, or -1 (unnamed) */
    /* prepared statements of this session (reset with it) */
    pstmt_t *stmts;
    uint64_t clock;
    unsigned next_id;
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

/*
 * Owned by references (handlers.h): the creator's, then one per job from
 * sb_pg__enqueue until sb_pg__free_job (a job points into the pool's schemas
 * and runs on its connections). The introspection job holds none: the pool
 * cancels it when it closes.
 */
struct st_sb_pg_pool_t {
    h2o_loop_t *loop;
    size_t refs;
    sb_reaper_t *reaper;
    h2o_timeout_entry_t reap;
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
    int up;               /* 1: some connection is up, 0: none, -1: not known yet (transitions are logged: pool.c) */
    int64_t last_probe;   /* while every connection is down: when the last probe started */
    int64_t last_recheck; /* while privileges are missing: when they were last looked at */
    char addr[128];       /* host:port of database_url, for the log (never the password) */
    char *missing;        /* the privileges the role lacks ("table: PRIVILEGE, ..."), or NULL */
    uint64_t look;        /* the number of this pool's introspection in flight (sb_pg__next_look) */
};

/* ---- pool.c ---- */

/** answers the job's call (inside a transaction: decides now, delivers once COMMIT or ROLLBACK ran) */
void sb_pg__answer(job_t *job, sb_status_t st, const char *msg, msgpack_sbuffer *value);
/** delivers the answer decided inside a transaction */
void sb_pg__deliver(job_t *job);
void sb_pg__free_job(job_t *job);
/** sends a transaction command (COMMIT, ROLLBACK) on the job's connection */
void sb_pg__send_statement(job_t *job, const char *sql);
/** queues a job (which takes a reference to the pool) and runs what an idle connection can take */
void sb_pg__enqueue(sb_pg_pool_t *p, job_t *job);

/* ---- schema.c ---- */

extern const char sb_pg__introspect_sql[];
/** the text[] literal of every table the targets name (the introspection's parameter; release with sb_mem_free) */
char *sb_pg__table_list(const sb_targets_t *targets);
/** 1 when some target reads or writes the database */
int sb_pg__uses_database(const sb_targets_t *targets);
/** builds the pool's schemas from the introspection result; err names the first mismatch */
int sb_pg__build_schemas(sb_pg_pool_t *p, PGresult *res, char *err, size_t errsz);
void sb_pg__free_schemas(sb_pg_pool_t *p);
/**
 * Numbers an introspection as it is sent, across every worker's pool: the
 * privilege log follows the looks in the order they were sent, so a look that
 * answers late (sent before a GRANT, read after a later look that saw it)
 * never logs a state the database has left.
 */
uint64_t sb_pg__next_look(void);
/** the job callback of the introspection statement */
int sb_pg__on_introspected(job_t *job, PGresult *res, const char *err);
/**
 * The privileges the role lacks for what the targets' manifests can ask
 * (collections and the document store: SELECT, INSERT, UPDATE, DELETE, and
 * USAGE on a serial column's sequence; table globals: SELECT), from the
 * introspection result, as "table: PRIVILEGE[, PRIVILEGE...]; ...".
 * @return NULL when nothing is missing, else a string to release with sb_mem_free
 */
char *sb_pg__missing_privileges(const sb_targets_t *targets, PGresult *res);
/** the schema of a target, or NULL before the introspection */
const target_schema_t *sb_pg__schema_of(const sb_pg_pool_t *p, const sb_target_t *t);

#endif
