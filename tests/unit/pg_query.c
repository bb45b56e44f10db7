/*
 * Unit tests for broker/svc/pg/pg_query.c: the SQL that collections and the
 * document store send to PostgreSQL (PROTOCOL.md section 6b), without a
 * database. Collections are built by hand as the introspection would build
 * them (posts: the integration test's table; document_store: deploy/sql).
 *
 * Checked: the exact statement text and parameters for every operator,
 * and/or nesting, empty in/not_in lists, like/contains (with the escaping of
 * % _ \), exists, null comparisons, sort/select/limit/offset, the shapes of
 * create/update/delete with the scope clamp outside the guest's where, the
 * document-store namespace clamp, every refusal with its status and message,
 * and a property over many generated where documents: the statement never
 * contains a guest string, every $n is a parameter, parentheses balance.
 *
 * Arguments are written as JSON and go through sb_json_parse (packed, then
 * sb_mp_decode), as the RPC route decodes them; bin values are packed by hand.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>
#include "tap.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "call/call.h"
#include "svc/pg/pg_query.h"

/* ---- the collections, as introspection would build them ------------------------------------------------------------ */

static sb_pg_col_t posts_cols[] = {
    {"id", 20, "bigint"},
    {"tenant_id", 25, "text"},
    {"title", 25, "text"},
    {"views", 23, "integer"},
    {"score", 701, "double precision"},
    {"price", 1700, "numeric"},
    {"published", 16, "boolean"},
    {"meta", 3802, "jsonb"},
    {"blob", 17, "bytea"},
    {"created", 1184, "timestamp with time zone"},
    {"uid", 2950, "uuid"},
};
#define POSTS_COLS                                                                                                                 \
    "\"id\", \"tenant_id\", \"title\", \"views\", \"score\", \"price\", \"published\", \"meta\", \"blob\", \"created\", \"uid\""

static sb_pg_col_t ds_cols[] = {
    {"id", 20, "bigint"},
    {"tenant_id", 25, "text"},
    {"store", 25, "text"},
    {"key", 25, "text"},
    {"data", 3802, "jsonb"},
    {"created_at", 1184, "timestamp with time zone"},
    {"updated_at", 1184, "timestamp with time zone"},
};
#define DS_COLS "\"id\", \"tenant_id\", \"store\", \"key\", \"data\", \"created_at\", \"updated_at\""

static sb_scope_bind_t tenant_scope[] = {{"tenant_id", "tenantId"}};

static sb_pg_coll_t posts = {"posts",      "posts", "id", 50, posts_cols, sizeof(posts_cols) / sizeof(posts_cols[0]),
                             tenant_scope, 1,       0};
static sb_pg_coll_t docs = {
    "document_store", "document_store", "id", 100, ds_cols, sizeof(ds_cols) / sizeof(ds_cols[0]), tenant_scope, 1, 1};

static sb_token_t tok_t1;      /* tenantId = t1 */
static sb_token_t tok_noscope; /* binds nothing */
static sb_scope_kv_t t1_scope[] = {{"tenantId", "t1"}};

static void init_tokens(void)
{
    memset(&tok_t1, 0, sizeof(tok_t1));
    tok_t1.scope = t1_scope;
    tok_t1.scope_len = 1;
    memset(&tok_noscope, 0, sizeof(tok_noscope));
}

/* ---- arguments ------------------------------------------------------------------------------------------------------- */

#define MAX_KEEP 4096
static msgpack_sbuffer *kept_sb[MAX_KEEP];
static msgpack_zone *kept_zone[MAX_KEEP];
static size_t nkept;

/* decodes packed msgpack into an object that lives until the end of the run */
static msgpack_object from_packed(msgpack_sbuffer *sb)
{
    msgpack_zone *z = malloc(sizeof(*z));
    msgpack_object o;
    const char *why = NULL;
    msgpack_zone_init(z, 1024);
    if (sb_mp_decode((const uint8_t *)sb->data, sb->size, z, &o, &why) != SB_OK) {
        printf("# bad test input: %s\n", why);
        abort();
    }
    if (nkept == MAX_KEEP)
        abort();
    kept_sb[nkept] = sb;
    kept_zone[nkept++] = z;
    return o;
}

/* JSON text -> msgpack object, through the project's JSON edge */
static msgpack_object J(const char *json)
{
    msgpack_sbuffer *sb = malloc(sizeof(*sb));
    const char *why = NULL;
    msgpack_zone z;
    msgpack_object o;
    msgpack_packer pk;
    sb_status_t st;

    msgpack_sbuffer_init(sb);
    msgpack_zone_init(&z, 1024);
    /* through the RPC route's decoder, then packed: the tests keep the packed bytes */
    if ((st = sb_json_parse(json, strlen(json), &z, &o, &why)) == SB_OK) {
        msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
        sb_mp_pack_object(&pk, &o);
    }
    msgpack_zone_destroy(&z);
    if (st != SB_OK) {
        printf("# bad test JSON: %s: %s\n", why, json);
        abort();
    }
    return from_packed(sb);
}

static void free_kept(void)
{
    for (size_t i = 0; i < nkept; ++i) {
        msgpack_sbuffer_free(kept_sb[i]);
        msgpack_zone_destroy(kept_zone[i]);
        free(kept_zone[i]);
    }
    nkept = 0;
}

/* ---- running a build ------------------------------------------------------------------------------------------------- */

typedef struct {
    sb_status_t st;
    sb_sql_t q;
    char err[SB_CALL_MAX_REASON];
} built_t;

static built_t last;

/*
 * As the route runs it: the args decoded once into the typed call (whose
 * argument errors count as the build's), then the statement built from it.
 * The document store is decoded as store.<ns>.<op> and its namespace then
 * replaced by `ns` (NULL for none), so the builder's own clamp is what is
 * tested; upstream's collections.document_store shapes are tested apart.
 */
static sb_status_t build_method(const sb_pg_coll_t *c, const char *method, sb_method_op_t op, const msgpack_object *args,
                                const sb_token_t *tok, int override_ns, const char *ns, int binary)
{
    sb_method_t m;
    sb_call_t call;
    msgpack_zone zone;

    sb_sql_dispose(&last.q);
    sb_sql_init(&last.q);
    memset(last.err, 0, sizeof(last.err));
    if (sb_method_parse(method, strlen(method), &m) != SB_OK || m.op != op) {
        printf("# bad test method %s\n", method);
        abort();
    }
    msgpack_zone_init(&zone, 1024);
    if (sb_call_decode(&call, &m, method, strlen(method), args, binary, &zone) != SB_OK) {
        last.st = call.err_status;
        snprintf(last.err, sizeof(last.err), "%s", call.err);
    } else {
        if (override_ns) {
            call.data->ns = ns;
            call.data->ns_len = ns != NULL ? strlen(ns) : 0;
        }
        last.st = sb_pg_build(c, op, call.data, tok, binary, &last.q, last.err, sizeof(last.err));
    }
    msgpack_zone_destroy(&zone);
    return last.st;
}

static sb_status_t build_obj(const sb_pg_coll_t *c, sb_method_op_t op, const msgpack_object *args, const sb_token_t *tok,
                             const char *ns, int binary)
{
    char method[128];

    snprintf(method, sizeof(method), "%s.%s.%s", c->is_docstore ? "store" : "collections", c->is_docstore ? "ns" : c->name,
             sb_method_op_name(op));
    return build_method(c, method, op, args, tok, c->is_docstore, ns, binary);
}

static sb_status_t build(const sb_pg_coll_t *c, sb_method_op_t op, const char *json, const char *ns, int binary)
{
    msgpack_object o = J(json);
    return build_obj(c, op, &o, &tok_t1, ns, binary);
}

static const char *param(int i)
{
    return i < last.q.nparams ? last.q.params[i] : "(missing)";
}

/* the statement text with its parameters, for diagnostics */
static void show(void)
{
    printf("#   sql: %s\n", last.q.sql ? last.q.sql : "(null)");
    for (int i = 0; i < last.q.nparams; ++i)
        printf("#   $%d = %s\n", i + 1, last.q.params[i] ? last.q.params[i] : "NULL");
    if (last.err[0])
        printf("#   err: %s\n", last.err);
}

/* the build succeeded with exactly this SQL and these parameters (NULL-terminated list) */
static void expect_sql(const char *name, const char *sql, ...)
{
    va_list ap;
    int i = 0, good = last.st == SB_OK && last.q.sql != NULL && strcmp(last.q.sql, sql) == 0;
    const char *p;

    va_start(ap, sql);
    while ((p = va_arg(ap, const char *)) != NULL) {
        if (i >= last.q.nparams || last.q.params[i] == NULL || strcmp(last.q.params[i], p) != 0)
            good = 0;
        ++i;
    }
    va_end(ap);
    if (i != last.q.nparams)
        good = 0;
    if (!ok(good, "%s", name)) {
        printf("#   want: %s (%d params)\n", sql, i);
        printf("#   status %d\n", (int)last.st);
        show();
    }
}

/* the build failed with this status and exactly this message */
static void expect_err(const char *name, sb_status_t st, const char *msg)
{
    if (!ok(last.st == st && strcmp(last.err, msg) == 0, "%s", name)) {
        printf("#   want status %d \"%s\"\n#   got status %d \"%s\"\n", (int)st, msg, (int)last.st, last.err);
        show();
    }
}

#define FIND_PREFIX "SELECT " POSTS_COLS " FROM posts WHERE "

/* ---- find: the where language ------------------------------------------------------------------------------------ */

static void test_find_basics(void)
{
    build(&posts, SB_OP_FIND, "{}", NULL, 0);
    expect_sql("find {}: everything of the tenant, key order, default page 10 (+1 to tell hasMore)",
               FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0", "t1", NULL);
    is_int(last.q.limit, 10, "find {}: limit 10");
    is_int(last.q.offset, 0, "find {}: offset 0");

    {
        msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
        build_obj(&posts, SB_OP_FIND, &nil, &tok_t1, NULL, 0);
        expect_sql("find with nil args is find {}",
                   FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0", "t1", NULL);
    }
    build(&posts, SB_OP_FIND, "{\"where\":null}", NULL, 0);
    expect_sql("where null is no where", FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0", "t1",
               NULL);
    build(&posts, SB_OP_FIND, "{\"where\":{}}", NULL, 0);
    expect_sql("where {} is TRUE", FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0", "t1", NULL);
}

static void test_operators(void)
{
    static const struct {
        const char *where, *cond, *p1;
    } cases[] = {
        {"{\"title\":\"a\"}", "(\"title\" = $1::text)", "a"},
        {"{\"title\":{\"equals\":\"a\"}}", "((\"title\" = $1::text))", "a"},
        {"{\"title\":{\"not_equals\":\"a\"}}", "((\"title\" IS DISTINCT FROM $1::text))", "a"},
        {"{\"views\":{\"gt\":5}}", "((\"views\" > $1::integer))", "5"},
        {"{\"views\":{\"gte\":-5}}", "((\"views\" >= $1::integer))", "-5"},
        {"{\"score\":{\"lt\":1.5}}", "((\"score\" < $1::double precision))", "1.5"},
        {"{\"price\":{\"lte\":\"9.99\"}}", "((\"price\" <= $1::numeric))", "9.99"},
        {"{\"published\":true}", "(\"published\" = $1::boolean)", "true"},
        {"{\"published\":{\"equals\":false}}", "((\"published\" = $1::boolean))", "false"},
        {"{\"uid\":\"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\"}", "(\"uid\" = $1::uuid)", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
        {"{\"created\":{\"gt\":\"2024-01-02T03:04:05Z\"}}", "((\"created\" > $1::timestamp with time zone))",
         "2024-01-02T03:04:05Z"},
        {"{\"meta\":{\"equals\":{\"a\":[1,true,null]}}}", "((\"meta\" = $1::jsonb))", "{\"a\":[1,true,null]}"},
        {"{\"meta\":{\"equals\":\"x\"}}", "((\"meta\" = $1::jsonb))", "\"x\""},
        {"{\"blob\":\"AAEC/w==\"}", "(\"blob\" = $1::bytea)", "\\x000102ff"},
        {"{\"title\":{\"like\":\"a%b_c\"}}", "((\"title\"::text LIKE $1::text))", "a%b_c"},
        {"{\"title\":{\"contains\":\"50%_off\\\\now\"}}", "((\"title\"::text ILIKE $1::text))", "%50\\%\\_off\\\\now%"},
        {"{\"title\":{\"contains\":\"\"}}", "((\"title\"::text ILIKE $1::text))", "%%"},
        {"{\"views\":{\"contains\":\"4\"}}", "((\"views\"::text ILIKE $1::text))", "%4%"},
    };
    char want[1024];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        char args[512], name[600];
        snprintf(args, sizeof(args), "{\"where\":%s}", cases[i].where);
        snprintf(want, sizeof(want), FIND_PREFIX "%s AND \"tenant_id\" = $2::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
                 cases[i].cond);
        snprintf(name, sizeof(name), "where %s", cases[i].where);
        build(&posts, SB_OP_FIND, args, NULL, 0);
        expect_sql(name, want, cases[i].p1, "t1", NULL);
    }

    /* parameterless conditions */
    {
        static const struct {
            const char *where, *cond;
        } nop[] = {
            {"{\"title\":null}", "(\"title\" IS NULL)"},
            {"{\"title\":{\"equals\":null}}", "((\"title\" IS NULL))"},
            {"{\"title\":{\"not_equals\":null}}", "((\"title\" IS NOT NULL))"},
            {"{\"title\":{\"exists\":true}}", "((\"title\" IS NOT NULL))"},
            {"{\"title\":{\"exists\":false}}", "((\"title\" IS NULL))"},
            {"{\"views\":{\"in\":[]}}", "((FALSE))"},
            {"{\"views\":{\"not_in\":[]}}", "((TRUE))"},
        };
        for (size_t i = 0; i < sizeof(nop) / sizeof(nop[0]); ++i) {
            char args[512], name[600];
            snprintf(args, sizeof(args), "{\"where\":%s}", nop[i].where);
            snprintf(want, sizeof(want), FIND_PREFIX "%s AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
                     nop[i].cond);
            snprintf(name, sizeof(name), "where %s", nop[i].where);
            build(&posts, SB_OP_FIND, args, NULL, 0);
            expect_sql(name, want, "t1", NULL);
        }
    }

    build(&posts, SB_OP_FIND, "{\"where\":{\"views\":{\"in\":[1,2,3]}}}", NULL, 0);
    expect_sql("in [1,2,3]",
               FIND_PREFIX "((\"views\" IN ($1::integer, $2::integer, $3::integer))) AND \"tenant_id\" = $4::text ORDER BY \"id\" "
                           "LIMIT 11 OFFSET 0",
               "1", "2", "3", "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"where\":{\"title\":{\"not_in\":[\"a\",\"b\"]}}}", NULL, 0);
    expect_sql("not_in [a,b]",
               FIND_PREFIX
               "((\"title\" NOT IN ($1::text, $2::text))) AND \"tenant_id\" = $3::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
               "a", "b", "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"where\":{\"views\":{\"gt\":1,\"lt\":9}}}", NULL, 0);
    expect_sql("two operators on one field are ANDed",
               FIND_PREFIX "((\"views\" > $1::integer AND \"views\" < $2::integer)) AND \"tenant_id\" = $3::text ORDER BY \"id\" "
                           "LIMIT 11 OFFSET 0",
               "1", "9", "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"where\":{\"title\":\"a\",\"views\":2}}", NULL, 0);
    expect_sql("two fields are ANDed",
               FIND_PREFIX
               "(\"title\" = $1::text AND \"views\" = $2::integer) AND \"tenant_id\" = $3::text ORDER BY \"id\" LIMIT 11 "
               "OFFSET 0",
               "a", "2", "t1", NULL);
}

static void test_and_or(void)
{
    build(&posts, SB_OP_FIND, "{\"where\":{\"or\":[{\"title\":\"a\"},{\"views\":{\"gt\":3}}]}}", NULL, 0);
    expect_sql("or: the clamp stays outside the guest's parentheses",
               FIND_PREFIX "(((\"title\" = $1::text) OR ((\"views\" > $2::integer)))) AND \"tenant_id\" = $3::text ORDER BY \"id\" "
                           "LIMIT 11 OFFSET 0",
               "a", "3", "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"where\":{\"and\":[{\"title\":\"a\"},{\"or\":[{\"views\":1},{\"views\":2}]}],\"published\":true}}",
          NULL, 0);
    expect_sql("and/or nesting with a sibling field",
               FIND_PREFIX "(((\"title\" = $1::text) AND (((\"views\" = $2::integer) OR (\"views\" = $3::integer)))) AND "
                           "\"published\" = $4::boolean) AND \"tenant_id\" = $5::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
               "a", "1", "2", "true", "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"where\":{\"or\":[{\"tenant_id\":\"t2\"},{\"tenant_id\":{\"not_equals\":\"t1\"}}]}}", NULL, 0);
    expect_sql("an or over the scope column is still clamped",
               FIND_PREFIX "(((\"tenant_id\" = $1::text) OR ((\"tenant_id\" IS DISTINCT FROM $2::text)))) AND \"tenant_id\" = "
                           "$3::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
               "t2", "t1", "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"where\":{\"or\":[{}]}}", NULL, 0);
    expect_sql("or [{}]", FIND_PREFIX "((TRUE)) AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0", "t1", NULL);
}

/* {"and":[{"and":[ ... {"views":1} ... ]}]} with `levels` ands */
static void nested_where(char *out, size_t outsz, int levels)
{
    size_t o = 0;
    o += (size_t)snprintf(out + o, outsz - o, "{\"where\":");
    for (int i = 0; i < levels; ++i)
        o += (size_t)snprintf(out + o, outsz - o, "{\"and\":[");
    o += (size_t)snprintf(out + o, outsz - o, "{\"views\":1}");
    for (int i = 0; i < levels; ++i)
        o += (size_t)snprintf(out + o, outsz - o, "]}");
    snprintf(out + o, outsz - o, "}");
}

/* {"where":{"and":[{"views":{"gt":0,"lt":9}} x pairs, plus one {"title":"x"} when odd]}} : `n` conditions */
static void many_conditions(char *out, size_t outsz, int n)
{
    size_t o = 0;
    o += (size_t)snprintf(out + o, outsz - o, "{\"where\":{\"and\":[");
    for (int i = 0; i < n / 2; ++i)
        o += (size_t)snprintf(out + o, outsz - o, "%s{\"views\":{\"gt\":0,\"lt\":9}}", i ? "," : "");
    if (n % 2)
        o += (size_t)snprintf(out + o, outsz - o, "%s{\"title\":\"x\"}", n / 2 ? "," : "");
    snprintf(out + o, outsz - o, "]}}");
}

static void test_limits(void)
{
    char buf[16384];

    nested_where(buf, sizeof(buf), 8);
    build(&posts, SB_OP_FIND, buf, NULL, 0);
    ok(last.st == SB_OK, "where nested 8 deep is accepted");
    nested_where(buf, sizeof(buf), 9);
    build(&posts, SB_OP_FIND, buf, NULL, 0);
    expect_err("where nested 9 deep", SB_E_BAD_ARGS, "where is nested deeper than 8");

    many_conditions(buf, sizeof(buf), 64);
    build(&posts, SB_OP_FIND, buf, NULL, 0);
    ok(last.st == SB_OK, "64 conditions are accepted");
    is_int(last.q.nparams, 65, "64 conditions: 64 parameters + the clamp");
    many_conditions(buf, sizeof(buf), 65);
    build(&posts, SB_OP_FIND, buf, NULL, 0);
    expect_err("65 conditions", SB_E_BAD_ARGS, "where has more than 64 conditions");

    {
        size_t o = (size_t)snprintf(buf, sizeof(buf), "{\"where\":{\"views\":{\"in\":[");
        for (int i = 0; i < 100; ++i)
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%d", i ? "," : "", i);
        snprintf(buf + o, sizeof(buf) - o, "]}}}");
        build(&posts, SB_OP_FIND, buf, NULL, 0);
        ok(last.st == SB_OK && last.q.nparams == 101, "in with 100 values is accepted");
        o = (size_t)snprintf(buf, sizeof(buf), "{\"where\":{\"views\":{\"not_in\":[");
        for (int i = 0; i < 101; ++i)
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%d", i ? "," : "", i);
        snprintf(buf + o, sizeof(buf) - o, "]}}}");
        build(&posts, SB_OP_FIND, buf, NULL, 0);
        expect_err("not_in with 101 values", SB_E_BAD_ARGS,
                   "operator \"not_in\" on \"views\" needs an array of at most 100 values");

        /* 11 full in-lists: 1,100 parameters, above the 1,024 a statement may carry */
        o = (size_t)snprintf(buf, sizeof(buf), "{\"where\":{\"and\":[");
        for (int k = 0; k < 11; ++k) {
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s{\"views\":{\"in\":[", k ? "," : "");
            for (int i = 0; i < 100; ++i)
                o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%d", i ? "," : "", i);
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, "]}}");
        }
        snprintf(buf + o, sizeof(buf) - o, "]}}");
        build(&posts, SB_OP_FIND, buf, NULL, 0);
        expect_err("1,100 parameters", SB_E_BAD_ARGS, "too many parameters");
    }
}

static void test_where_refusals(void)
{
    static const struct {
        const char *args, *msg;
    } cases[] = {
        {"{\"where\":{\"nope\":1}}", "unknown field \"nope\""},
        {"{\"where\":{\"title'; drop table posts; --\":1}}", "unknown field \"title'; drop table posts; --\""},
        {"{\"where\":{\"\\\"title\\\"\":1}}", "unknown field \"\"title\"\""},
        {"{\"where\":{\"Title\":1}}", "unknown field \"Title\""},
        {"{\"where\":{\"title \":1}}", "unknown field \"title \""},
        {"{\"where\":{\"title\":{\"regex\":\".*\"}}}", "unknown operator \"regex\" on \"title\""},
        {"{\"where\":{\"title\":{\"equals\":\"a\",\"1=1) or (1=1\":1}}}", "unknown operator \"1=1) or (1=1\" on \"title\""},
        {"{\"where\":{\"title\":{}}}", "where.title has no operator"},
        {"{\"where\":[]}", "where must be an object"},
        {"{\"where\":\"1=1\"}", "where must be an object"},
        {"{\"where\":{\"or\":[]}}", "where.or needs a non-empty array of conditions"},
        {"{\"where\":{\"and\":{}}}", "where.and needs a non-empty array of conditions"},
        {"{\"where\":{\"or\":[1]}}", "where must be an object"},
        {"{\"where\":{\"views\":{\"gt\":null}}}", "operator \"gt\" on \"views\" needs a scalar"},
        {"{\"where\":{\"views\":{\"lte\":[1]}}}", "operator \"lte\" on \"views\" needs a scalar"},
        {"{\"where\":{\"views\":{\"in\":5}}}", "operator \"in\" on \"views\" needs an array of at most 100 values"},
        {"{\"where\":{\"views\":{\"in\":[1,null]}}}", "operator \"in\" on \"views\" cannot hold null"},
        {"{\"where\":{\"title\":{\"like\":5}}}", "operator \"like\" on \"title\" needs a string"},
        {"{\"where\":{\"title\":{\"contains\":null}}}", "operator \"contains\" on \"title\" needs a string"},
        {"{\"where\":{\"title\":{\"exists\":1}}}", "operator \"exists\" on \"title\" needs true or false"},
        {"{\"where\":{\"title\":[\"a\"]}}", "value for \"title\" has the wrong type"},
        {"{\"where\":{\"title\":\"a\\u0000b\"}}", "value for \"title\" contains NUL"},
        {"{\"where\":{\"title\":{\"like\":\"a\\u0000\"}}}", "operator \"like\" on \"title\" needs a string"},
        {"{\"where\":{\"blob\":\"not base64!\"}}", "value for \"blob\" must be base64 text"},
        {"{\"where\":{\"blob\":\"AAE\"}}", "value for \"blob\" must be base64 text"},
        {"{\"nope\":1}", "find takes no argument \"nope\""},
        {"{\"data\":{}}", "find takes no argument \"data\""},
        {"{\"limit\":-1}", "limit must be a non-negative integer"},
        {"{\"limit\":\"5\"}", "limit must be a non-negative integer"},
        {"{\"limit\":1.5}", "limit must be a non-negative integer"},
        {"{\"offset\":100001}", "offset must be an integer from 0 to 100000"},
        {"{\"offset\":-1}", "offset must be an integer from 0 to 100000"},
        {"{\"sort\":[]}", "sort takes 1-8 fields"},
        {"{\"sort\":[\"id\",\"id\",\"id\",\"id\",\"id\",\"id\",\"id\",\"id\",\"id\"]}", "sort takes 1-8 fields"},
        {"{\"sort\":5}", "sort entries are field names, \"-\" for descending"},
        {"{\"sort\":\"\"}", "sort entries are field names, \"-\" for descending"},
        {"{\"select\":\"title\"}", "select must be an array of field names or an object"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        char name[600];
        snprintf(name, sizeof(name), "find %s -> bad_args", cases[i].args);
        build(&posts, SB_OP_FIND, cases[i].args, NULL, 0);
        expect_err(name, SB_E_BAD_ARGS, cases[i].msg);
    }
    build(&posts, SB_OP_FIND, "[]", NULL, 0);
    expect_err("find args must be an object", SB_E_BAD_ARGS, "find args must be an object");

    /* an unknown field is named, cut at 64 bytes on a code point boundary (the message is JSON, msgpack str, log text) */
    {
        char field[80], json[256], want[160];
        memset(field, 'u', 63);
        memcpy(field + 63, "\xc3\xa9\xc3\xa9", 4);
        field[67] = '\0';
        snprintf(json, sizeof(json), "{\"where\":{\"%s\":1}}", field);
        build(&posts, SB_OP_FIND, json, NULL, 0);
        snprintf(want, sizeof(want), "unknown field \"%.63s\"", field);
        expect_err("unknown where field: a 2-byte character across the cut is left out", SB_E_BAD_ARGS, want);
        snprintf(json, sizeof(json), "{\"sort\":\"-%s\"}", field);
        build(&posts, SB_OP_FIND, json, NULL, 0);
        snprintf(want, sizeof(want), "sort names an unknown field \"%.63s\"", field);
        expect_err("unknown sort field: cut on a code point", SB_E_BAD_ARGS, want);
        snprintf(json, sizeof(json), "{\"data\":{\"%s\":1}}", field);
        build(&posts, SB_OP_CREATE, json, NULL, 0);
        snprintf(want, sizeof(want), "unknown field \"%.63s\"", field);
        expect_err("unknown data field: cut on a code point", SB_E_BAD_ARGS, want);
        memset(field, 'v', 62);
        memcpy(field + 62, "\xf0\x9f\x98\x80", 4);
        field[66] = '\0';
        snprintf(json, sizeof(json), "{\"select\":[\"%s\"]}", field);
        build(&posts, SB_OP_FIND, json, NULL, 0);
        snprintf(want, sizeof(want), "select names an unknown field \"%.62s\"", field);
        expect_err("unknown select field: a 4-byte character across the cut", SB_E_BAD_ARGS, want);
    }
    build(&posts, SB_OP_FIND_ONE, "{\"limit\":1}", NULL, 0);
    expect_err("findOne takes no limit", SB_E_BAD_ARGS, "findOne takes no argument \"limit\"");

    /* sort and select name fields only from the schema; PROTOCOL.md 6b: unknown fields are bad_args naming them */
    {
        static const char *const unknown[][2] = {
            {"{\"sort\":\"nope\"}", "nope"},
            {"{\"sort\":\"title desc\"}", "title desc"},
            {"{\"sort\":[\"-title; drop table posts\"]}", "title; drop table posts"},
            {"{\"sort\":\"-\"}", NULL},
            {"{\"select\":[\"title\",\"1=1) or (1=1\"]}", "1=1) or (1=1"},
            {"{\"select\":{\"\\\"title\\\"\":true}}", "\"title\""},
            {"{\"select\":[5]}", NULL},
        };
        for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); ++i) {
            char name[600];
            build(&posts, SB_OP_FIND, unknown[i][0], NULL, 0);
            snprintf(name, sizeof(name), "find %s -> bad_args%s", unknown[i][0], unknown[i][1] ? " naming the field" : "");
            if (!ok(last.st == SB_E_BAD_ARGS && (unknown[i][1] == NULL || strstr(last.err, unknown[i][1]) != NULL), "%s", name))
                printf("#   got status %d \"%s\"\n", (int)last.st, last.err);
        }
    }
}

static void test_sort_select_page(void)
{
    build(&posts, SB_OP_FIND, "{\"sort\":\"-views\"}", NULL, 0);
    expect_sql("sort -views (the key breaks ties)",
               FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"views\" DESC, \"id\" LIMIT 11 OFFSET 0", "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"sort\":[\"title\",\"-score\"]}", NULL, 0);
    expect_sql("sort [title, -score]",
               FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"title\", \"score\" DESC, \"id\" LIMIT 11 OFFSET 0", "t1",
               NULL);
    build(&posts, SB_OP_FIND, "{\"select\":[\"title\",\"views\"]}", NULL, 0);
    expect_sql(
        "select [title, views] (the key always comes along)",
        "SELECT \"id\", \"title\", \"views\" FROM posts WHERE TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
        "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"select\":{\"title\":true,\"views\":false}}", NULL, 0);
    expect_sql("select {title: true, views: false}",
               "SELECT \"id\", \"title\" FROM posts WHERE TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
               "t1", NULL);
    build(&posts, SB_OP_FIND, "{\"limit\":5,\"offset\":20}", NULL, 0);
    expect_sql("limit 5 offset 20", FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 6 OFFSET 20", "t1", NULL);
    is_int(last.q.limit, 5, "limit 5");
    is_int(last.q.offset, 20, "offset 20");
    build(&posts, SB_OP_FIND, "{\"limit\":1000000}", NULL, 0);
    expect_sql("limit above max_limit is clamped to 50",
               FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 51 OFFSET 0", "t1", NULL);
    is_int(last.q.limit, 50, "clamped limit is 50");
    build(&posts, SB_OP_FIND, "{\"limit\":0}", NULL, 0);
    ok(last.st == SB_OK && last.q.limit == 0, "limit 0 is a valid (empty) page");
    build(&posts, SB_OP_FIND, "{\"offset\":100000}", NULL, 0);
    ok(last.st == SB_OK && last.q.offset == 100000, "offset 100000 is the largest");
    {
        sb_pg_coll_t small = posts;
        msgpack_object o = J("{}");
        small.max_limit = 3;
        build_obj(&small, SB_OP_FIND, &o, &tok_t1, NULL, 0);
        expect_sql("default limit is min(10, max_limit)",
                   FIND_PREFIX "TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" LIMIT 4 OFFSET 0", "t1", NULL);
    }
    build(&posts, SB_OP_FIND_ONE, "{\"where\":{\"id\":7},\"sort\":\"-id\",\"select\":[\"title\"]}", NULL, 0);
    expect_sql("findOne: one row (+1)",
               "SELECT \"id\", \"title\" FROM posts WHERE (\"id\" = $1::bigint) AND \"tenant_id\" = $2::text ORDER BY \"id\" DESC, "
               "\"id\" LIMIT 2 OFFSET 0",
               "7", "t1", NULL);
    is_int(last.q.limit, 1, "findOne limit 1");
}

/* ---- writes ------------------------------------------------------------------------------------------------------------- */

static void test_create(void)
{
    build(&posts, SB_OP_CREATE,
          "{\"data\":{\"title\":\"hi\",\"views\":3,\"score\":2.5,\"price\":\"12.340\",\"published\":true,\"meta\":{\"a\":[1,{\"b\":"
          "null}]},\"blob\":\"AAEC/w==\",\"uid\":null}}",
          NULL, 0);
    expect_sql(
        "create: every type as a typed parameter, scope column set by the clamp",
        "INSERT INTO posts (\"title\", \"views\", \"score\", \"price\", \"published\", \"meta\", \"blob\", \"uid\", \"tenant_id\") "
        "VALUES ($1::text, $2::integer, $3::double precision, $4::numeric, $5::boolean, $6::jsonb, $7::bytea, NULL, $8::text) "
        "RETURNING " POSTS_COLS,
        "hi", "3", "2.5", "12.340", "true", "{\"a\":[1,{\"b\":null}]}", "\\x000102ff", "t1", NULL);
    build(&posts, SB_OP_CREATE, "{\"data\":{\"title\":\"hi\",\"tenant_id\":\"t1\"}}", NULL, 0);
    expect_sql("create restating the bound scope value",
               "INSERT INTO posts (\"title\", \"tenant_id\") VALUES ($1::text, $2::text) RETURNING " POSTS_COLS, "hi", "t1", NULL);
    build(&posts, SB_OP_CREATE, "{\"data\":{}}", NULL, 0);
    expect_sql("create {} sets only the scope", "INSERT INTO posts (\"tenant_id\") VALUES ($1::text) RETURNING " POSTS_COLS, "t1",
               NULL);

    build(&posts, SB_OP_CREATE, "{\"data\":{\"title\":\"hi\",\"tenant_id\":\"t2\"}}", NULL, 0);
    expect_err("create with another tenant", SB_E_FORBIDDEN,
               "field \"tenant_id\" is bound to the run's scope and cannot be set to another value");
    build(&posts, SB_OP_CREATE, "{\"data\":{\"tenant_id\":null}}", NULL, 0);
    expect_err("create with a null tenant", SB_E_FORBIDDEN,
               "field \"tenant_id\" is bound to the run's scope and cannot be set to another value");
    build(&posts, SB_OP_CREATE, "{\"data\":{\"tenant_id\":\"t1\\u0000\"}}", NULL, 0);
    ok(last.st == SB_E_FORBIDDEN || last.st == SB_E_BAD_ARGS, "create with tenant \"t1\\0\" is refused");
    {
        msgpack_object o = J("{\"data\":{\"title\":\"x\"}}");
        build_obj(&posts, SB_OP_CREATE, &o, &tok_noscope, NULL, 0);
        expect_err("a token binding no tenant cannot create", SB_E_FORBIDDEN, "the token binds no \"tenantId\" scope value");
        o = J("{}");
        build_obj(&posts, SB_OP_FIND, &o, &tok_noscope, NULL, 0);
        expect_err("a token binding no tenant cannot find", SB_E_FORBIDDEN, "the token binds no \"tenantId\" scope value");
    }
    build(&posts, SB_OP_CREATE, "{\"data\":{\"nope\":1}}", NULL, 0);
    expect_err("create with an unknown field", SB_E_BAD_ARGS, "unknown field \"nope\"");
    build(&posts, SB_OP_CREATE, "{}", NULL, 0);
    expect_err("create without data", SB_E_BAD_ARGS, "data must be a non-empty object");
    build(&posts, SB_OP_CREATE, "{\"data\":[1]}", NULL, 0);
    expect_err("create with array data", SB_E_BAD_ARGS, "data must be a non-empty object");
    build(&posts, SB_OP_CREATE, "{\"data\":{},\"where\":{}}", NULL, 0);
    expect_err("create takes no where", SB_E_BAD_ARGS, "create takes no argument \"where\"");
    build(&posts, SB_OP_CREATE, "{\"data\":{\"title\":\"a\\u0000\"}}", NULL, 0);
    expect_err("NUL in a string", SB_E_BAD_ARGS, "value for \"title\" contains NUL");
    build(&posts, SB_OP_CREATE, "{\"data\":{\"blob\":\"%%%\"}}", NULL, 0);
    expect_err("bytea from bad base64 (JSON)", SB_E_BAD_ARGS, "value for \"blob\" must be base64 text");
    build(&posts, SB_OP_CREATE, "{\"data\":{\"title\":{\"a\":1}}}", NULL, 0);
    expect_err("an object into a text column", SB_E_BAD_ARGS, "value for \"title\" has the wrong type");
    build(&posts, SB_OP_CREATE, "{\"data\":{\"blob\":\"\"}}", NULL, 0);
    expect_sql("bytea from empty base64",
               "INSERT INTO posts (\"blob\", \"tenant_id\") VALUES ($1::bytea, $2::text) RETURNING " POSTS_COLS, "\\x", "t1", NULL);
}

/* {"data": {"blob"|col: bin}} packed by hand */
static msgpack_object bin_args(const char *outer, const char *col, const char *bytes, size_t n)
{
    msgpack_sbuffer *sb = malloc(sizeof(*sb));
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, outer, strlen(outer));
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, col, strlen(col));
    msgpack_pack_bin_with_body(&pk, bytes, n);
    return from_packed(sb);
}

static void test_binary(void)
{
    msgpack_object o = bin_args("data", "blob", "\x00\x01\xff'", 4);
    build_obj(&posts, SB_OP_CREATE, &o, &tok_t1, NULL, 1);
    expect_sql("msgpack bin into bytea",
               "INSERT INTO posts (\"blob\", \"tenant_id\") VALUES ($1::bytea, $2::text) RETURNING " POSTS_COLS, "\\x0001ff27",
               "t1", NULL);
    o = bin_args("data", "title", "abc", 3);
    build_obj(&posts, SB_OP_CREATE, &o, &tok_t1, NULL, 1);
    expect_err("bin into a text column", SB_E_BAD_ARGS, "binary value for non-bytea column \"title\"");
    o = bin_args("data", "meta", "abc", 3);
    build_obj(&posts, SB_OP_CREATE, &o, &tok_t1, NULL, 1);
    ok(last.st == SB_E_BAD_ARGS || (last.st == SB_OK && last.q.nparams == 2 && strcmp(param(0), "\"YWJj\"") == 0),
       "bin into jsonb is refused or stored as its base64 text");
    o = bin_args("where", "blob", "\x00\x01", 2);
    build_obj(&posts, SB_OP_FIND, &o, &tok_t1, NULL, 1);
    expect_sql("where blob = bin",
               FIND_PREFIX "(\"blob\" = $1::bytea) AND \"tenant_id\" = $2::text ORDER BY \"id\" LIMIT 11 OFFSET 0", "\\x0001", "t1",
               NULL);
    o = bin_args("where", "views", "\x00\x01", 2);
    build_obj(&posts, SB_OP_FIND, &o, &tok_t1, NULL, 1);
    expect_err("where views = bin", SB_E_BAD_ARGS, "binary value for non-bytea column \"views\"");
    /* in JSON, a bytea string is base64; in msgpack, only bin is bytea, and a str is taken as text */
    o = J("{\"data\":{\"blob\":\"AAE=\"}}");
    build_obj(&posts, SB_OP_CREATE, &o, &tok_t1, NULL, 0);
    ok(last.st == SB_OK && strcmp(param(0), "\\x0001") == 0, "JSON: base64 text into bytea is decoded");
}

static void test_update_delete(void)
{
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"title\":\"a\"},\"data\":{\"views\":4,\"meta\":null}}", NULL, 0);
    expect_sql(
        "update: the rows are chosen under the clamp, and the statement is clamped again",
        "UPDATE posts SET \"views\" = $1::integer, \"meta\" = NULL WHERE \"id\" IN (SELECT \"id\" FROM posts WHERE (\"title\" = "
        "$2::text) AND \"tenant_id\" = $3::text ORDER BY \"id\" LIMIT 50 FOR UPDATE) AND \"tenant_id\" = $4::text "
        "RETURNING " POSTS_COLS,
        "4", "a", "t1", "t1", NULL);
    build(&posts, SB_OP_UPDATE, "{\"data\":{\"title\":\"b\"}}", NULL, 0);
    expect_sql(
        "update without where: every row of the tenant, max_limit at a time",
        "UPDATE posts SET \"title\" = $1::text WHERE \"id\" IN (SELECT \"id\" FROM posts WHERE TRUE AND \"tenant_id\" = $2::text "
        "ORDER BY \"id\" LIMIT 50 FOR UPDATE) AND \"tenant_id\" = $3::text RETURNING " POSTS_COLS,
        "b", "t1", "t1", NULL);
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"or\":[{\"id\":1},{\"tenant_id\":\"t2\"}]},\"data\":{\"title\":\"b\"}}", NULL, 0);
    expect_sql("update: an or in the where stays inside its parentheses",
               "UPDATE posts SET \"title\" = $1::text WHERE \"id\" IN (SELECT \"id\" FROM posts WHERE (((\"id\" = $2::bigint) OR "
               "(\"tenant_id\" = $3::text))) AND \"tenant_id\" = $4::text ORDER BY \"id\" LIMIT 50 FOR UPDATE) AND \"tenant_id\" = "
               "$5::text "
               "RETURNING " POSTS_COLS,
               "b", "1", "t2", "t1", "t1", NULL);
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"id\":1},\"data\":{\"tenant_id\":\"t2\"}}", NULL, 0);
    expect_err("update moving a row to another tenant", SB_E_FORBIDDEN,
               "field \"tenant_id\" is bound to the run's scope and cannot be changed");
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"id\":1},\"data\":{\"tenant_id\":\"t1\"}}", NULL, 0);
    expect_err("update restating the tenant", SB_E_FORBIDDEN,
               "field \"tenant_id\" is bound to the run's scope and cannot be changed");
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"id\":1},\"data\":{}}", NULL, 0);
    expect_err("update with empty data", SB_E_BAD_ARGS, "data must be a non-empty object");
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"id\":1}}", NULL, 0);
    expect_err("update without data", SB_E_BAD_ARGS, "data must be a non-empty object");
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"id\":1},\"data\":{\"nope\":1}}", NULL, 0);
    expect_err("update with an unknown field", SB_E_BAD_ARGS, "unknown field \"nope\"");
    build(&posts, SB_OP_UPDATE, "{\"where\":{\"id\":1},\"data\":{\"title\":\"x\"},\"limit\":1}", NULL, 0);
    expect_err("update takes no limit", SB_E_BAD_ARGS, "update takes no argument \"limit\"");

    build(&posts, SB_OP_DELETE, "{\"where\":{\"views\":{\"lt\":0}}}", NULL, 0);
    expect_sql("delete",
               "DELETE FROM posts WHERE \"id\" IN (SELECT \"id\" FROM posts WHERE ((\"views\" < $1::integer)) AND \"tenant_id\" = "
               "$2::text "
               "ORDER BY \"id\" LIMIT 50 FOR UPDATE) AND \"tenant_id\" = $3::text RETURNING " POSTS_COLS,
               "0", "t1", "t1", NULL);
    build(&posts, SB_OP_DELETE, "{}", NULL, 0);
    expect_sql(
        "delete without where",
        "DELETE FROM posts WHERE \"id\" IN (SELECT \"id\" FROM posts WHERE TRUE AND \"tenant_id\" = $1::text ORDER BY \"id\" "
        "LIMIT 50 FOR UPDATE) AND \"tenant_id\" = $2::text RETURNING " POSTS_COLS,
        "t1", "t1", NULL);
    build(&posts, SB_OP_DELETE, "{\"where\":{\"id\":1},\"data\":{}}", NULL, 0);
    expect_err("delete takes no data", SB_E_BAD_ARGS, "delete takes no argument \"data\"");
}

static void test_docstore(void)
{
    build(&docs, SB_OP_FIND, "{\"where\":{\"store\":\"notes\",\"key\":\"k\"}}", "notes", 0);
    expect_sql("document store find: tenant and namespace clamped",
               "SELECT " DS_COLS
               " FROM document_store WHERE (\"store\" = $1::text AND \"key\" = $2::text) AND \"tenant_id\" = $3::text "
               "AND \"store\" = $4::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
               "notes", "k", "t1", "notes", NULL);
    build(&docs, SB_OP_FIND, "{\"where\":{\"or\":[{\"store\":\"other\"},{\"key\":\"k\"}]}}", "notes", 0);
    expect_sql("document store: an or naming another namespace stays clamped",
               "SELECT " DS_COLS
               " FROM document_store WHERE (((\"store\" = $1::text) OR (\"key\" = $2::text))) AND \"tenant_id\" = "
               "$3::text AND \"store\" = $4::text ORDER BY \"id\" LIMIT 11 OFFSET 0",
               "other", "k", "t1", "notes", NULL);
    build(&docs, SB_OP_CREATE, "{\"data\":{\"key\":\"k\",\"data\":{\"x\":1}}}", "notes", 0);
    expect_sql(
        "document store create sets tenant and namespace",
        "INSERT INTO document_store (\"key\", \"data\", \"tenant_id\", \"store\") VALUES ($1::text, $2::jsonb, $3::text, $4::text) "
        "RETURNING " DS_COLS,
        "k", "{\"x\":1}", "t1", "notes", NULL);
    build(&docs, SB_OP_CREATE, "{\"data\":{\"store\":\"notes\",\"key\":\"k\"}}", "notes", 0);
    expect_sql(
        "document store create restating the namespace",
        "INSERT INTO document_store (\"key\", \"tenant_id\", \"store\") VALUES ($1::text, $2::text, $3::text) RETURNING " DS_COLS,
        "k", "t1", "notes", NULL);
    build(&docs, SB_OP_CREATE, "{\"data\":{\"store\":\"other\",\"key\":\"k\"}}", "notes", 0);
    expect_err("document store create into another namespace", SB_E_FORBIDDEN,
               "field \"store\" is bound to the run's scope and cannot be set to another value");
    build(&docs, SB_OP_UPDATE, "{\"where\":{\"key\":\"k\"},\"data\":{\"store\":\"other\"}}", "notes", 0);
    expect_err("document store update moving a namespace", SB_E_FORBIDDEN,
               "field \"store\" is bound to the run's scope and cannot be changed");
    build(&docs, SB_OP_UPDATE, "{\"where\":{\"key\":\"k\"},\"data\":{\"data\":[1,2]}}", "notes", 0);
    expect_sql("document store update",
               "UPDATE document_store SET \"data\" = $1::jsonb WHERE \"id\" IN (SELECT \"id\" FROM document_store WHERE (\"key\" = "
               "$2::text) AND \"tenant_id\" = $3::text AND \"store\" = $4::text ORDER BY \"id\" LIMIT 100 FOR UPDATE) AND "
               "\"tenant_id\" = $5::text "
               "AND \"store\" = $6::text RETURNING " DS_COLS,
               "[1,2]", "k", "t1", "notes", "t1", "notes", NULL);
    build(&docs, SB_OP_DELETE, "{}", "notes", 0);
    expect_sql(
        "document store delete",
        "DELETE FROM document_store WHERE \"id\" IN (SELECT \"id\" FROM document_store WHERE TRUE AND \"tenant_id\" = $1::text AND "
        "\"store\" = $2::text ORDER BY \"id\" LIMIT 100 FOR UPDATE) AND \"tenant_id\" = $3::text AND \"store\" = $4::text "
        "RETURNING " DS_COLS,
        "t1", "notes", "t1", "notes", NULL);
    build(&docs, SB_OP_FIND, "{}", NULL, 0);
    expect_err("document store without a namespace", SB_E_FORBIDDEN, "document_store namespace is missing or invalid");
    build(&docs, SB_OP_CREATE, "{\"data\":{}}", NULL, 0);
    expect_err("document store create without a namespace", SB_E_FORBIDDEN, "document_store namespace is missing or invalid");
    build(&docs, SB_OP_FIND, "{}", "no'tes", 0);
    ok(last.st == SB_OK && strstr(last.q.sql, "no'tes") == NULL, "the namespace is a parameter, never SQL text");

    /* upstream's shapes (PROTOCOL.md section 6b): the namespace decoded from the args is the one clamped */
    {
        msgpack_object o = J("{\"key\":\"k1\",\"data\":{\"v\":1},\"store\":\"notes\"}");
        build_method(&docs, "collections.document_store.create", SB_OP_CREATE, &o, &tok_t1, 0, NULL, 0);
        expect_sql(
            "upstream create: the document's fields at the top level, store the namespace",
            "INSERT INTO document_store (\"key\", \"data\", \"tenant_id\", \"store\") VALUES ($1::text, $2::jsonb, $3::text, "
            "$4::text) RETURNING " DS_COLS,
            "k1", "{\"v\":1}", "t1", "notes", NULL);
        o = J("{\"store\":\"notes\"}");
        build_method(&docs, "collections.document_store.create", SB_OP_CREATE, &o, &tok_t1, 0, NULL, 0);
        expect_sql("upstream create of an empty document",
                   "INSERT INTO document_store (\"tenant_id\", \"store\") VALUES ($1::text, $2::text) RETURNING " DS_COLS, "t1",
                   "notes", NULL);
        o = J("{\"key\":\"k1\",\"nope\":1,\"store\":\"notes\"}");
        build_method(&docs, "collections.document_store.create", SB_OP_CREATE, &o, &tok_t1, 0, NULL, 0);
        expect_err("upstream create with an unknown field", SB_E_BAD_ARGS, "unknown field \"nope\"");
        o = J("{\"where\":{\"store\":\"notes\",\"key\":\"k1\"},\"data\":{\"data\":{\"v\":2}}}");
        build_method(&docs, "collections.document_store.update", SB_OP_UPDATE, &o, &tok_t1, 0, NULL, 0);
        expect_sql(
            "upstream update: store inside where",
            "UPDATE document_store SET \"data\" = $1::jsonb WHERE \"id\" IN (SELECT \"id\" FROM document_store WHERE (\"store\" "
            "= $2::text AND \"key\" = $3::text) AND \"tenant_id\" = $4::text AND \"store\" = $5::text ORDER BY \"id\" LIMIT 100 "
            "FOR UPDATE) AND \"tenant_id\" = $6::text AND \"store\" = $7::text RETURNING " DS_COLS,
            "{\"v\":2}", "notes", "k1", "t1", "notes", "t1", "notes", NULL);
        o = J("{\"where\":{\"store\":{\"equals\":\"notes\"}}}");
        build_method(&docs, "collections.document_store.delete", SB_OP_DELETE, &o, &tok_t1, 0, NULL, 0);
        expect_sql(
            "upstream delete: store as {equals}",
            "DELETE FROM document_store WHERE \"id\" IN (SELECT \"id\" FROM document_store WHERE ((\"store\" = $1::text)) AND "
            "\"tenant_id\" = $2::text AND \"store\" = $3::text ORDER BY \"id\" LIMIT 100 FOR UPDATE) AND \"tenant_id\" = $4::text "
            "AND \"store\" = $5::text RETURNING " DS_COLS,
            "notes", "t1", "notes", "t1", "notes", NULL);
    }
}

/* ---- the property: guest values are parameters, never SQL text -------------------------------------------------- */

static const char *const nasty[] = {
    "x'; DROP TABLE posts; --",
    "\"title\"",
    "1=1) OR (1=1",
    "$99::text, $0",
    "Robert'); DELETE FROM posts WHERE ('a'='a",
    "\\' OR 1=1 --",
    "/* comment */",
    "%_\\%",
    "\xc3\xa9t\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80",
    "tenant_id",
    ";",
    "''",
    "QZXJ-marker",
};
#define NNASTY (sizeof(nasty) / sizeof(nasty[0]))

static uint64_t rng_state = 0x243f6a8885a308d3u;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void json_str(char *out, size_t outsz, size_t *o, const char *s)
{
    json_t *j = json_string(s);
    char *t = json_dumps(j, JSON_ENCODE_ANY);
    *o += (size_t)snprintf(out + *o, outsz - *o, "%s", t);
    free(t);
    json_decref(j);
}

static const char *const gen_fields[] = {"title", "views", "score", "price", "published", "meta", "uid", "tenant_id", "created"};
static const char *const gen_ops[] = {"equals", "not_equals", "gt", "gte", "lt", "lte", "in", "not_in", "like", "contains"};

static void gen_where(char *out, size_t outsz, size_t *o, int depth)
{
    uint32_t n = 1 + rnd(3), start = rnd(sizeof(gen_fields) / sizeof(gen_fields[0]));
    *o += (size_t)snprintf(out + *o, outsz - *o, "{");
    for (uint32_t i = 0; i < n; ++i) {
        if (i)
            *o += (size_t)snprintf(out + *o, outsz - *o, ",");
        if (depth < 3 && rnd(4) == 0 && i == 0) {
            uint32_t m = 1 + rnd(3);
            *o += (size_t)snprintf(out + *o, outsz - *o, "\"%s\":[", rnd(2) ? "and" : "or");
            for (uint32_t k = 0; k < m; ++k) {
                if (k)
                    *o += (size_t)snprintf(out + *o, outsz - *o, ",");
                gen_where(out, outsz, o, depth + 1);
            }
            *o += (size_t)snprintf(out + *o, outsz - *o, "]");
            continue;
        }
        /* a distinct field per position, so keys never repeat in one map */
        *o += (size_t)snprintf(out + *o, outsz - *o,
                               "\"%s\":", gen_fields[(start + i) % (sizeof(gen_fields) / sizeof(gen_fields[0]))]);
        {
            const char *op = gen_ops[rnd(sizeof(gen_ops) / sizeof(gen_ops[0]))];
            *o += (size_t)snprintf(out + *o, outsz - *o, "{\"%s\":", op);
            if (strcmp(op, "in") == 0 || strcmp(op, "not_in") == 0) {
                *o += (size_t)snprintf(out + *o, outsz - *o, "[");
                json_str(out, outsz, o, nasty[rnd(NNASTY)]);
                *o += (size_t)snprintf(out + *o, outsz - *o, ",");
                json_str(out, outsz, o, nasty[rnd(NNASTY)]);
                *o += (size_t)snprintf(out + *o, outsz - *o, "]");
            } else {
                json_str(out, outsz, o, nasty[rnd(NNASTY)]);
            }
            *o += (size_t)snprintf(out + *o, outsz - *o, "}");
        }
    }
    *o += (size_t)snprintf(out + *o, outsz - *o, "}");
}

/* checks the statement: no guest string, no quote/semicolon/comment, $n within the parameters, balanced parentheses */
static int sql_is_clean(const sb_sql_t *q, char *why, size_t whysz)
{
    const char *s = q->sql;
    int depth = 0, inq = 0;
    for (size_t i = 0; i < NNASTY; ++i) {
        /* column names (bare or quoted) legitimately appear; every other guest string must not */
        if (strcmp(nasty[i], "tenant_id") == 0 || strcmp(nasty[i], "\"title\"") == 0)
            continue;
        if (strstr(s, nasty[i]) != NULL) {
            snprintf(why, whysz, "guest string \"%s\" in the SQL", nasty[i]);
            return 0;
        }
    }
    if (strchr(s, '\'') || strchr(s, ';') || strchr(s, '\\') || strstr(s, "--") || strstr(s, "/*")) {
        snprintf(why, whysz, "quote, semicolon, backslash or comment in the SQL");
        return 0;
    }
    for (const char *p = s; *p; ++p) {
        if (*p == '"') {
            inq = !inq;
            continue;
        }
        if (inq)
            continue;
        if (*p == '(')
            ++depth;
        else if (*p == ')' && --depth < 0)
            break;
        else if (*p == '$') {
            long n = strtol(p + 1, NULL, 10);
            if (n < 1 || n > q->nparams) {
                snprintf(why, whysz, "$%ld outside 1..%d", n, q->nparams);
                return 0;
            }
        }
    }
    if (depth != 0 || inq) {
        snprintf(why, whysz, "unbalanced parentheses or quotes");
        return 0;
    }
    return 1;
}

static void test_property(void)
{
    static const sb_method_op_t ops[] = {SB_OP_FIND, SB_OP_FIND_ONE, SB_OP_UPDATE, SB_OP_DELETE};
    int built = 0, clean = 0, refused_ok = 1;
    char buf[16384], why[200] = "";
    for (int iter = 0; iter < 3000; ++iter) {
        size_t o = 0;
        sb_method_op_t op = ops[rnd(4)];
        o += (size_t)snprintf(buf + o, sizeof(buf) - o, "{\"where\":");
        gen_where(buf, sizeof(buf), &o, 0);
        if (op == SB_OP_UPDATE) {
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, ",\"data\":{\"title\":");
            json_str(buf, sizeof(buf), &o, nasty[rnd(NNASTY)]);
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, "}");
        }
        snprintf(buf + o, sizeof(buf) - o, "}");
        build(&posts, op, buf, NULL, 0);
        if (last.st != SB_OK) {
            if (last.st != SB_E_BAD_ARGS && last.st != SB_E_FORBIDDEN)
                refused_ok = 0;
            continue;
        }
        ++built;
        if (sql_is_clean(&last.q, why, sizeof(why)))
            ++clean;
        else if (clean + 1 == built) {
            printf("# first unclean statement (%s) for %s\n", why, buf);
            show();
        }
    }
    ok(built > 1000, "property: most generated statements build (%d of 3000)", built);
    is_int(clean, built, "property: every statement is parameterised and well-formed");
    ok(refused_ok, "property: refusals are bad_args or forbidden");
}

/* ---- rows: the type mapping of PROTOCOL.md 6b, on results built by hand ------------------------------------------ */

static PGresult *make_result(int nf, const char *const *names, const unsigned *oids)
{
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    PGresAttDesc attrs[16];
    memset(attrs, 0, sizeof(attrs));
    for (int i = 0; i < nf; ++i) {
        attrs[i].name = (char *)names[i];
        attrs[i].typid = oids[i];
        attrs[i].typlen = -1;
        attrs[i].atttypmod = -1;
    }
    if (res == NULL || !PQsetResultAttrs(res, nf, attrs))
        abort();
    return res;
}

static void set_value(PGresult *res, int row, int f, const char *v)
{
    if (!PQsetvalue(res, row, f, (char *)v, v == NULL ? -1 : (int)strlen(v)))
        abort();
}

static const msgpack_object *field_of(const msgpack_object *map, const char *name)
{
    return sb_mp_get(map, name);
}

static int obj_str_is(const msgpack_object *o, const char *s)
{
    return o != NULL && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static void test_pack(void)
{
    static const char *const names[] = {"b",   "i2",  "i4", "i8",  "f4", "f8",   "nan", "num",
                                        "txt", "uid", "js", "jsb", "by", "tstz", "ts",  "nul"};
    static const unsigned oids[] = {16, 21, 23, 20, 700, 701, 701, 1700, 25, 2950, 114, 3802, 17, 1184, 1114, 25};
    static const char *const vals[] = {"t",
                                       "-7",
                                       "2147483647",
                                       "9223372036854775807",
                                       "0.5",
                                       "1.25",
                                       "NaN",
                                       "12.340",
                                       "it's",
                                       "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                                       "[1, \"x\"]",
                                       "{\"a\": [1, {\"b\": null}], \"c\": 1.5}",
                                       "\\x0001ff",
                                       "2024-01-02 03:04:05.123+00",
                                       "2024-01-02 03:04:05",
                                       NULL};
    PGresult *res = make_result(16, names, oids);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_object o;
    const msgpack_object *v;

    for (int f = 0; f < 16; ++f)
        set_value(res, 0, f, vals[f]);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    ok(sb_pg_pack_row(res, 0, &pk) == SB_OK, "pack_row");
    {
        msgpack_sbuffer *copy = malloc(sizeof(*copy));
        msgpack_sbuffer_init(copy);
        msgpack_sbuffer_write(copy, sb.data, sb.size);
        o = from_packed(copy);
    }
    ok(o.type == MSGPACK_OBJECT_MAP && o.via.map.size == 16, "a row is a map of every field");
    v = field_of(&o, "b");
    ok(v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean, "bool t -> true");
    v = field_of(&o, "i2");
    ok(v && v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && v->via.i64 == -7, "int2 -> integer");
    v = field_of(&o, "i4");
    ok(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 2147483647u, "int4 -> integer");
    v = field_of(&o, "i8");
    ok(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 9223372036854775807u, "int8 max -> integer");
    v = field_of(&o, "f4");
    ok(v && (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32) && v->via.f64 == 0.5, "float4 -> float");
    v = field_of(&o, "f8");
    ok(v && v->type == MSGPACK_OBJECT_FLOAT64 && v->via.f64 == 1.25, "float8 -> float");
    ok(obj_str_is(field_of(&o, "nan"), "NaN"), "float8 NaN travels as text (JSON has no NaN)");
    ok(obj_str_is(field_of(&o, "num"), "12.340"), "numeric -> string, scale kept");
    ok(obj_str_is(field_of(&o, "txt"), "it's"), "text -> string");
    ok(obj_str_is(field_of(&o, "uid"), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), "uuid -> string");
    v = field_of(&o, "js");
    ok(v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 2 && obj_str_is(&v->via.array.ptr[1], "x"),
       "json -> nested value");
    v = field_of(&o, "jsb");
    {
        const msgpack_object *a = v ? sb_mp_get(v, "a") : NULL, *c = v ? sb_mp_get(v, "c") : NULL;
        ok(v && v->type == MSGPACK_OBJECT_MAP && a && a->type == MSGPACK_OBJECT_ARRAY && a->via.array.size == 2 &&
               a->via.array.ptr[1].type == MSGPACK_OBJECT_MAP && sb_mp_get(&a->via.array.ptr[1], "b") != NULL &&
               sb_mp_get(&a->via.array.ptr[1], "b")->type == MSGPACK_OBJECT_NIL && c && c->type == MSGPACK_OBJECT_FLOAT64 &&
               c->via.f64 == 1.5,
           "jsonb -> nested value");
    }
    v = field_of(&o, "by");
    ok(v && v->type == MSGPACK_OBJECT_BIN && v->via.bin.size == 3 && memcmp(v->via.bin.ptr, "\x00\x01\xff", 3) == 0,
       "bytea -> bin");
    ok(obj_str_is(field_of(&o, "tstz"), "2024-01-02T03:04:05.123Z"), "timestamptz -> ISO 8601 with Z");
    v = field_of(&o, "ts");
    ok(v && v->type == MSGPACK_OBJECT_STR && v->via.str.size >= 19 && memcmp(v->via.str.ptr, "2024-01-02T03:04:05", 19) == 0,
       "timestamp -> ISO 8601");
    v = field_of(&o, "nul");
    ok(v && v->type == MSGPACK_OBJECT_NIL, "NULL -> nil");
    msgpack_sbuffer_destroy(&sb);
    PQclear(res);

    /* the result cap: never a truncated success */
    {
        static const char *const n1[] = {"t"};
        static const unsigned o1[] = {25};
        char *big = malloc(100001);
        sb_status_t st;
        memset(big, 'x', 100000);
        big[100000] = '\0';
        res = make_result(1, n1, o1);
        for (int r = 0; r < 10; ++r)
            set_value(res, r, 0, big);
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        st = sb_pg_pack_rows(res, 7, &pk, 786432, &sb);
        ok(st == SB_OK, "7 rows of 100 kB fit under 786,432 bytes (max_rows limits the rows packed)");
        msgpack_sbuffer_clear(&sb);
        st = sb_pg_pack_rows(res, 10, &pk, 786432, &sb);
        ok(st == SB_E_EXECUTION, "10 rows of 100 kB: over the cap is execution_error");
        msgpack_sbuffer_destroy(&sb);
        PQclear(res);
        free(big);
    }
}

/* every allocation a build makes from the call's values may fail: each one in turn is SB_E_NOMEM, nothing leaks */
static void test_out_of_memory(void)
{
    static const char *const cases[] = {
        "{\"data\":{\"title\":\"a title\",\"blob\":\"AAE=\",\"meta\":{\"k\":[1,2]},\"views\":3}}",
        "{\"where\":{\"title\":{\"contains\":\"50%_off\"},\"or\":[{\"views\":{\"in\":[1,2,3]}},{\"title\":{\"like\":\"a%\"}}]}}",
    };
    static const sb_method_op_t ops[] = {SB_OP_CREATE, SB_OP_FIND};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); ++k) {
        msgpack_object o = J(cases[k]);
        char method[64];
        sb_method_t m;
        sb_call_t call;
        msgpack_zone zone;
        unsigned long before, tries;
        int all = 1;

        snprintf(method, sizeof(method), "collections.posts.%s", sb_method_op_name(ops[k]));
        if (sb_method_parse(method, strlen(method), &m) != SB_OK)
            abort();
        msgpack_zone_init(&zone, 1024);
        if (sb_call_decode(&call, &m, method, strlen(method), &o, 0, &zone) != SB_OK)
            abort();
        sb_sql_dispose(&last.q);
        before = sb_mem_try_count();
        last.st = sb_pg_build(&posts, ops[k], call.data, &tok_t1, 0, &last.q, last.err, sizeof(last.err));
        tries = sb_mem_try_count() - before;
        ok(last.st == SB_OK && tries >= 3, "case %zu builds with %lu fallible allocations", k, tries);
        for (unsigned long n = 1; n <= tries; ++n) {
            sb_sql_dispose(&last.q);
            sb_mem_fail_nth(n);
            last.st = sb_pg_build(&posts, ops[k], call.data, &tok_t1, 0, &last.q, last.err, sizeof(last.err));
            sb_mem_fail_nth(0);
            if (last.st != SB_E_NOMEM || strcmp(last.err, "out of memory") != 0) {
                printf("#   allocation %lu of %lu: status %d, \"%s\"\n", n, tries, (int)last.st, last.err);
                all = 0;
            }
        }
        ok(all, "case %zu: each allocation failing in turn is SB_E_NOMEM \"out of memory\"", k);
        sb_sql_dispose(&last.q);
        msgpack_zone_destroy(&zone);
    }
}

int main(void)
{
    init_tokens();
    sb_sql_init(&last.q);
    test_find_basics();
    test_operators();
    test_and_or();
    test_limits();
    test_where_refusals();
    test_sort_select_page();
    test_create();
    test_binary();
    test_update_delete();
    test_docstore();
    test_property();
    test_pack();
    test_out_of_memory();
    sb_sql_dispose(&last.q);
    free_kept();
    return done_testing();
}
