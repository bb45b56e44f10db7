/*
 * libFuzzer driver for broker/svc/pg/pg_query.c (sb_pg_build): the guest's
 * collection arguments -> the typed call (sb_call_decode, call/where.c) -> one
 * SQL statement and its parameters.
 *
 * Input: one msgpack object (the RPC's `args`), decoded with sb_mp_decode as
 * the RPC route does. It is built for every operation (find, findOne,
 * create, update, delete), on a fixed collection (the integration test's
 * `posts`, scoped by tenant_id) and on the document store (namespace
 * "notes"), once as a JSON request and once as a msgpack request.
 *
 * Properties:
 *  - never crashes (ASan/UBSan), never leaks; a refusal (by the decoder or
 *    the builder) is bad_args or forbidden with a non-empty message;
 *  - on success, the statement is made only of the builder's vocabulary:
 *    SQL keywords, the table, type names from the schema, quoted identifiers
 *    that are columns of the collection, $n with 1 <= n <= nparams, unsigned
 *    numbers (page size, offset) and the punctuation ( ) , = < > <= >= ::.
 *    No quote, semicolon, backslash or comment can appear;
 *  - every parameter is referenced; parentheses balance;
 *  - no guest string value of 4 bytes or more (other than a column or an
 *    operator name) appears verbatim in the statement (one made only of
 *    letters, digits and the statement's punctuation may match the
 *    builder's own text: it must then match the rewritten build too);
 *  - the statement text does not depend on the guest's string values: the
 *    same arguments with every string value rewritten (same length, same
 *    byte classes) build the very same text whenever they build at all;
 *  - find: the page size is at most the collection's max_limit;
 *  - the scope clamp (tenant_id = t1, and store = notes for the document
 *    store) is ANDed at parenthesis depth 0, outside the guest's where.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>
#include "sb/value.h"
#include "call/call.h"
#include "svc/pg/pg_query.h"
#include "fuzz.h"

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
static sb_pg_col_t ds_cols[] = {
    {"id", 20, "bigint"},
    {"tenant_id", 25, "text"},
    {"store", 25, "text"},
    {"key", 25, "text"},
    {"data", 3802, "jsonb"},
    {"created_at", 1184, "timestamp with time zone"},
    {"updated_at", 1184, "timestamp with time zone"},
};
static sb_scope_bind_t tenant_scope[] = {{"tenant_id", "tenantId"}};
static sb_pg_coll_t posts = {"posts",      "posts", "id", 50, posts_cols, sizeof(posts_cols) / sizeof(posts_cols[0]),
                             tenant_scope, 1,       0};
static sb_pg_coll_t docs = {
    "document_store", "document_store", "id", 100, ds_cols, sizeof(ds_cols) / sizeof(ds_cols[0]), tenant_scope, 1, 1};

static const char *const keywords[] = {"SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE",
                                       "DISTINCT", "LIKE", "ILIKE", "ORDER", "BY", "DESC", "LIMIT", "OFFSET", "INSERT", "INTO",
                                       "VALUES", "DEFAULT", "RETURNING", "UPDATE", "SET", "DELETE", "FOR", "posts",
                                       "document_store",
                                       /* words of the schema's type names */
                                       "text", "integer", "bigint", "double", "precision", "numeric", "boolean", "jsonb", "bytea",
                                       "timestamp", "with", "time", "zone", "uuid", NULL};
static const char *const operators[] = {"equals", "not_equals", "gt",       "gte",    "lt",  "lte", "in",
                                        "not_in", "like",       "contains", "exists", "and", "or",  NULL};

static sb_token_t tok;
static sb_scope_kv_t tok_scope[] = {{"tenantId", "t1"}};

/* ASCII classes (no locale) */
static int is_alpha(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
}

static int is_digit(unsigned char ch)
{
    return ch >= '0' && ch <= '9';
}

static int in_list(const char *const *list, const char *s, size_t n)
{
    for (size_t i = 0; list[i] != NULL; ++i)
        if (strlen(list[i]) == n && memcmp(list[i], s, n) == 0)
            return 1;
    return 0;
}

static int is_column(const sb_pg_coll_t *c, const char *s, size_t n)
{
    for (size_t i = 0; i < c->ncols; ++i)
        if (strlen(c->cols[i].name) == n && memcmp(c->cols[i].name, s, n) == 0)
            return 1;
    return 0;
}

/*
 * The clamp is outside every parenthesis of the guest's where: the statement
 * has ` AND "<col>" = $n::text` at parenthesis depth 0 with $n = value (an
 * insert lists the column and passes the value).
 */
static int clamped(const sb_sql_t *q, sb_method_op_t op, const char *col, const char *value)
{
    char pat[64];
    size_t plen;
    int depth = 0, inq = 0;
    if (op == SB_OP_CREATE) {
        int n = 0;
        snprintf(pat, sizeof(pat), "\"%s\"", col);
        if (strstr(q->sql, pat) == NULL)
            return 0;
        for (int i = 0; i < q->nparams; ++i)
            n += q->params[i] != NULL && strcmp(q->params[i], value) == 0;
        return n > 0;
    }
    plen = (size_t)snprintf(pat, sizeof(pat), " AND \"%s\" = $", col);
    for (const char *p = q->sql; *p != '\0'; ++p) {
        if (depth == 0 && !inq && strncmp(p, pat, plen) == 0) {
            long n = strtol(p + plen, NULL, 10);
            if (n >= 1 && n <= q->nparams && q->params[n - 1] != NULL && strcmp(q->params[n - 1], value) == 0)
                return 1;
        }
        if (*p == '"')
            inq = !inq;
        else if (!inq && *p == '(')
            ++depth;
        else if (!inq && *p == ')')
            --depth;
    }
    return 0;
}

/* the vocabulary and shape checks on a built statement */
static void check_sql(const sb_pg_coll_t *c, const sb_sql_t *q, sb_method_op_t op)
{
    const char *s = q->sql, *p = s;
    int depth = 0;
    uint8_t used[SB_PG_MAX_PARAMS + 1];

    SB_FUZZ_ASSERT(s != NULL && q->len == strlen(s), "statement length %zu vs strlen", q->len);
    SB_FUZZ_ASSERT(q->nparams >= 0 && q->nparams <= (int)SB_PG_MAX_PARAMS, "nparams %d", q->nparams);
    memset(used, 0, sizeof(used));
    while (*p != '\0') {
        unsigned char ch = (unsigned char)*p;
        if (ch == ' ') {
            ++p;
        } else if (is_alpha(ch) || ch == '_') {
            const char *w = p;
            while (is_alpha((unsigned char)*p) || is_digit((unsigned char)*p) || *p == '_')
                ++p;
            SB_FUZZ_ASSERT(in_list(keywords, w, (size_t)(p - w)), "word \"%.*s\" outside the vocabulary in: %s", (int)(p - w), w,
                           s);
        } else if (is_digit(ch)) {
            while (is_digit((unsigned char)*p))
                ++p;
            SB_FUZZ_ASSERT(!is_alpha((unsigned char)*p) && *p != '_', "number glued to a word in: %s", s);
        } else if (ch == '"') {
            const char *w = ++p;
            while (*p != '\0' && *p != '"')
                ++p;
            SB_FUZZ_ASSERT(*p == '"', "unterminated quoted identifier in: %s", s);
            SB_FUZZ_ASSERT(is_column(c, w, (size_t)(p - w)), "identifier \"%.*s\" is not a column in: %s", (int)(p - w), w, s);
            ++p;
        } else if (ch == '$') {
            char *end;
            long n = strtol(p + 1, &end, 10);
            SB_FUZZ_ASSERT(end != p + 1 && n >= 1 && n <= q->nparams, "$%ld with %d parameters in: %s", n, q->nparams, s);
            used[n] = 1;
            p = end;
        } else if (ch == '(') {
            ++depth;
            ++p;
        } else if (ch == ')') {
            SB_FUZZ_ASSERT(--depth >= 0, "unbalanced ) in: %s", s);
            ++p;
        } else if (ch == ':') {
            SB_FUZZ_ASSERT(p[1] == ':', "single colon in: %s", s);
            p += 2;
        } else if (ch == ',' || ch == '=' || ch == '<' || ch == '>') {
            ++p;
        } else {
            SB_FUZZ_ASSERT(0, "byte 0x%02x outside the vocabulary at offset %zu in: %s", ch, (size_t)(p - s), s);
        }
    }
    SB_FUZZ_ASSERT(depth == 0, "unbalanced ( in: %s", s);
    for (int i = 1; i <= q->nparams; ++i)
        SB_FUZZ_ASSERT(used[i], "parameter $%d is never referenced in: %s", i, s);
    if (op == SB_OP_FIND) {
        SB_FUZZ_ASSERT(q->limit <= c->max_limit, "page size %zu above max_limit %zu", q->limit, c->max_limit);
        SB_FUZZ_ASSERT(q->offset <= SB_CALL_MAX_OFFSET, "offset %zu", q->offset);
    }
    SB_FUZZ_ASSERT(clamped(q, op, "tenant_id", "t1"), "no scope clamp in: %s", s);
    if (c->is_docstore)
        SB_FUZZ_ASSERT(clamped(q, op, "store", "notes"), "no namespace clamp in: %s", s);
}

/* a byte the builder's own text can contain (outside parameters, nothing else can appear) */
static int sql_alphabet(unsigned char ch)
{
    return is_alpha(ch) || is_digit(ch) || ch == '_' || ch == ' ' || ch == '"' || ch == '$' || ch == '(' || ch == ')' ||
           ch == ':' || ch == ',' || ch == '=' || ch == '<' || ch == '>';
}

/*
 * Every str value of the guest's arguments of 4 bytes or more, other than a
 * column or operator name, must not be in the statement. A string made only
 * of the SQL alphabet may match the builder's own text by chance (say "itle"
 * or "AND ("): it then has to be in the statement built from the rewritten
 * arguments too (`skeleton`, when that built), where the guest's letters and
 * digits are different.
 */
static void check_no_guest_strings(const sb_pg_coll_t *c, const msgpack_object *o, const char *sql, size_t sqllen,
                                   const char *skeleton, int is_key)
{
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        if (!is_key && o->via.str.size >= 4 && !is_column(c, o->via.str.ptr, o->via.str.size) &&
            !in_list(operators, o->via.str.ptr, o->via.str.size) && memmem(sql, sqllen, o->via.str.ptr, o->via.str.size) != NULL) {
            int alpha = 1;
            for (uint32_t i = 0; i < o->via.str.size; ++i)
                alpha &= sql_alphabet((unsigned char)o->via.str.ptr[i]);
            SB_FUZZ_ASSERT(alpha, "guest string \"%.*s\" appears in: %s", (int)o->via.str.size, o->via.str.ptr, sql);
            SB_FUZZ_ASSERT(skeleton == NULL || memmem(skeleton, strlen(skeleton), o->via.str.ptr, o->via.str.size) != NULL,
                           "guest string \"%.*s\" appears in: %s", (int)o->via.str.size, o->via.str.ptr, sql);
        }
        break;
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; ++i)
            check_no_guest_strings(c, &o->via.array.ptr[i], sql, sqllen, skeleton, 0);
        break;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; ++i) {
            check_no_guest_strings(c, &o->via.map.ptr[i].key, sql, sqllen, skeleton, 1);
            check_no_guest_strings(c, &o->via.map.ptr[i].val, sql, sqllen, skeleton, 0);
        }
        break;
    default:
        break;
    }
}

/*
 * Rewrites every str value in place (the object points into a private copy
 * of the input): letters rotate among letters of the same case, digits among
 * digits; other bytes stay. Length, NULs and byte classes are kept, so the
 * rewritten value is usually just as valid (base64, uuid shape...).
 */
static void rewrite_strings(msgpack_object *o, int is_key)
{
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        if (!is_key) {
            char *p = (char *)o->via.str.ptr;
            for (uint32_t i = 0; i < o->via.str.size; ++i) {
                char ch = p[i];
                if (ch >= 'a' && ch <= 'z')
                    p[i] = (char)('a' + (ch - 'a' + 7) % 26);
                else if (ch >= 'A' && ch <= 'Z')
                    p[i] = (char)('A' + (ch - 'A' + 11) % 26);
                else if (ch >= '0' && ch <= '9')
                    p[i] = (char)('0' + (ch - '0' + 3) % 10);
            }
        }
        break;
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; ++i)
            rewrite_strings(&o->via.array.ptr[i], 0);
        break;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; ++i) {
            rewrite_strings(&o->via.map.ptr[i].key, 1);
            rewrite_strings(&o->via.map.ptr[i].val, 0);
        }
        break;
    default:
        break;
    }
}

/* decodes the args for the operation (collections.posts.<op> or store.notes.<op>) and builds; a decoder refusal is the build's */
static sb_status_t build(const sb_pg_coll_t *c, sb_method_op_t op, const msgpack_object *args, int binary, sb_sql_t *q, char *err,
                         size_t errsz)
{
    char method[64];
    sb_method_t m;
    sb_call_t call;
    msgpack_zone zone;
    sb_status_t st;
    int n = snprintf(method, sizeof(method), "%s.%s", c->is_docstore ? "store.notes" : "collections.posts", sb_method_op_name(op));

    SB_FUZZ_ASSERT(sb_method_parse(method, (size_t)n, &m) == SB_OK && m.op == op, "method %s", method);
    msgpack_zone_init(&zone, 1024);
    if ((st = sb_call_decode(&call, &m, method, (size_t)n, args, binary, &zone)) != SB_OK) {
        SB_FUZZ_ASSERT(call.err_stage == SB_CALL_ERR_ARGS, "a collections call refused at stage %d", (int)call.err_stage);
        snprintf(err, errsz, "%s", call.err);
    } else {
        SB_FUZZ_ASSERT(call.data != NULL && (call.data->ns != NULL) == c->is_docstore, "namespace of a decoded call");
        st = sb_pg_build(c, op, call.data, &tok, binary, q, err, errsz);
    }
    msgpack_zone_destroy(&zone);
    return st;
}

static void run_one(const sb_pg_coll_t *c, sb_method_op_t op, const msgpack_object *args, const msgpack_object *rewritten,
                    int binary)
{
    sb_sql_t q, q2;
    char err[SB_CALL_MAX_REASON], err2[SB_CALL_MAX_REASON];
    sb_status_t st, st2;

    sb_sql_init(&q);
    memset(err, 0x55, sizeof(err));
    st = build(c, op, args, binary, &q, err, sizeof(err));
    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS || st == SB_E_FORBIDDEN, "status %d", (int)st);
        SB_FUZZ_ASSERT(memchr(err, '\0', sizeof(err)) != NULL && err[0] != '\0', "refusal without a message");
        SB_FUZZ_ASSERT(sb_utf8_valid((const uint8_t *)err, strlen(err)), "refusal message is not valid UTF-8: %s", err);
        sb_sql_dispose(&q);
        return;
    }
    check_sql(c, &q, op);

    sb_sql_init(&q2);
    st2 = build(c, op, rewritten, binary, &q2, err2, sizeof(err2));
    if (st2 == SB_OK) {
        SB_FUZZ_ASSERT(strcmp(q.sql, q2.sql) == 0, "the statement depends on string values:\n%s\n%s", q.sql, q2.sql);
        SB_FUZZ_ASSERT(q.nparams == q2.nparams, "parameter count depends on string values");
    }
    check_no_guest_strings(c, args, q.sql, q.len, st2 == SB_OK ? q2.sql : NULL, 0);
    sb_sql_dispose(&q2);
    sb_sql_dispose(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const sb_method_op_t ops[] = {SB_OP_FIND, SB_OP_FIND_ONE, SB_OP_CREATE, SB_OP_UPDATE, SB_OP_DELETE};
    msgpack_zone z, z2;
    msgpack_object args, rewritten;
    const char *why = NULL;
    uint8_t *copy;

    if (tok.scope_len == 0) {
        tok.scope = tok_scope;
        tok.scope_len = 1;
    }
    msgpack_zone_init(&z, 1024);
    if (sb_mp_decode(data, size, &z, &args, &why) != SB_OK) {
        msgpack_zone_destroy(&z);
        return 0;
    }
    /* a second decode of a private copy, whose strings are rewritten */
    copy = malloc(size ? size : 1);
    if (copy == NULL)
        abort();
    memcpy(copy, data, size);
    msgpack_zone_init(&z2, 1024);
    SB_FUZZ_ASSERT(sb_mp_decode(copy, size, &z2, &rewritten, &why) == SB_OK, "second decode failed");
    rewrite_strings(&rewritten, 0);

    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); ++i) {
        for (int binary = 0; binary <= 1; ++binary) {
            run_one(&posts, ops[i], &args, &rewritten, binary);
            run_one(&docs, ops[i], &args, &rewritten, binary);
        }
    }
    msgpack_zone_destroy(&z2);
    msgpack_zone_destroy(&z);
    free(copy);
    return 0;
}
