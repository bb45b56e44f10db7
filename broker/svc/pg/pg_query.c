/*
 * SQL building for collections (PROTOCOL.md, "Collections").
 *
 *   where  := { <field>: <value> | { <op>: <value>, ... }, "and": [where...], "or": [where...] }
 *   op     := equals | not_equals | gt | gte | lt | lte | in | not_in | like | contains | exists
 *
 * The where tree, the data fields, sort and select come decoded and
 * shape-checked from the typed call (call/call.h, call/where.h); here every
 * field is looked up among the collection's columns (byte comparison, the
 * allowlist applied; an unknown one is refused naming it, cut on a code point
 * boundary); each value is a $n parameter cast to the column's type;
 * the scope clamp ("tenant_id" = $n for every binding) is ANDed to every
 * statement outside the guest's parentheses, so no "or" can escape it.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "svc/pg/pg_query.h"
#include "util/util.h"

#define OID_BOOL 16u
#define OID_BYTEA 17u
#define OID_INT8 20u
#define OID_INT2 21u
#define OID_INT4 23u
#define OID_JSON 114u
#define OID_FLOAT4 700u
#define OID_FLOAT8 701u
#define OID_DATE 1082u
#define OID_TIMESTAMP 1114u
#define OID_TIMESTAMPTZ 1184u
#define OID_NUMERIC 1700u
#define OID_JSONB 3802u

void sb_sql_init(sb_sql_t *q)
{
    memset(q, 0, sizeof(*q));
}

void sb_sql_dispose(sb_sql_t *q)
{
    /* only what was used: params[] is large, and a statement has a few */
    for (int i = 0; i < q->nparams; ++i) {
        sb_mem_free(q->params[i]);
        q->params[i] = NULL;
    }
    sb_mem_free(q->sql);
    q->sql = NULL;
    q->len = q->limit = q->offset = 0;
    q->nparams = 0;
}

typedef struct st_build_t {
    const sb_pg_coll_t *c;
    sb_sql_t *q;
    int binary;
    char *err;
    size_t errsz;
    sb_status_t overflow; /* the first failure of the text (SB_E_TOO_LARGE past SB_PG_MAX_SQL, SB_E_NOMEM) */
    sb_buf_t text;        /* the statement, capped at SB_PG_MAX_SQL */
} build_t;

__attribute__((format(printf, 2, 3))) static void emit(build_t *b, const char *fmt, ...)
{
    va_list ap;
    sb_status_t st;
    if (b->overflow != SB_OK)
        return;
    va_start(ap, fmt);
    st = sb_buf_vprintf(&b->text, fmt, ap);
    va_end(ap);
    if (st != SB_OK)
        b->overflow = st;
}

/* a fixed piece of text (no formatting) */
static void emit_str(build_t *b, const char *s)
{
    sb_status_t st;
    if (b->overflow == SB_OK && (st = sb_buf_append_str(&b->text, s)) != SB_OK)
        b->overflow = st;
}

__attribute__((format(printf, 2, 3))) static sb_status_t fail(build_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, b->errsz, fmt, ap);
    va_end(ap);
    return SB_E_BAD_ARGS;
}

/* adds a parameter (owned copy, NULL for SQL NULL) and returns its number, or 0 when there are too many */
static int add_param(build_t *b, char *v)
{
    if (b->q->nparams >= (int)SB_PG_MAX_PARAMS) {
        sb_mem_free(v);
        return 0;
    }
    b->q->params[b->q->nparams++] = v;
    return b->q->nparams;
}

/* a guest value's copy could not be allocated (its size derives from the call: bounded, but not fixed) */
static sb_status_t nomem(build_t *b)
{
    snprintf(b->err, b->errsz, "out of memory");
    return SB_E_NOMEM;
}

static const sb_pg_col_t *find_col(const sb_pg_coll_t *c, const char *name, size_t len)
{
    for (size_t i = 0; i < c->ncols; ++i)
        if (strlen(c->cols[i].name) == len && memcmp(c->cols[i].name, name, len) == 0)
            return &c->cols[i];
    return NULL;
}

static int is_scope_col(const sb_pg_coll_t *c, const char *name)
{
    for (size_t i = 0; i < c->nscope; ++i)
        if (strcmp(c->scope[i].column, name) == 0)
            return 1;
    return c->is_docstore && strcmp(name, "store") == 0;
}

/* the hex input form of bytea ("\\x..."), or NULL when it cannot be allocated */
static char *hex_bytea(const uint8_t *p, size_t n)
{
    size_t sz;
    char *s = sb_size_mul(n, 2, &sz) && sb_size_add(sz, 3, &sz) ? sb_mem_try_alloc(sz) : NULL;
    if (s == NULL)
        return NULL;
    s[0] = '\\';
    s[1] = 'x';
    sb_hex(p, n, s + 2);
    return s;
}

/*
 * The text form of a guest value for a column. NULLs are handled by callers
 * (they change the operator). Containers only go to json/jsonb columns.
 */
static sb_status_t value_text(build_t *b, const sb_pg_col_t *col, const msgpack_object *v, char **out)
{
    char num[64];
    int is_json = col->oid == OID_JSON || col->oid == OID_JSONB;

    if (is_json) {
        json_t *j;
        char *text;
        if (sb_json_from_mp(v, &j) != SB_OK)
            return fail(b, "value for \"%s\" cannot be stored as JSON", col->name);
        text = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(j);
        if (text == NULL)
            return nomem(b);
        *out = text; /* jansson allocates with malloc, which sb_mem_free releases */
        return SB_OK;
    }
    switch (v->type) {
    case MSGPACK_OBJECT_BOOLEAN:
        *out = sb_mem_strdup(v->via.boolean ? "true" : "false");
        return SB_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        snprintf(num, sizeof(num), "%llu", (unsigned long long)v->via.u64);
        *out = sb_mem_strdup(num);
        return SB_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        snprintf(num, sizeof(num), "%lld", (long long)v->via.i64);
        *out = sb_mem_strdup(num);
        return SB_OK;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(v->via.f64))
            return fail(b, "value for \"%s\" is not a finite number", col->name);
        snprintf(num, sizeof(num), "%.17g", v->via.f64);
        *out = sb_mem_strdup(num);
        return SB_OK;
    case MSGPACK_OBJECT_STR:
        if (col->oid == OID_BYTEA && !b->binary) {
            /* JSON carries bytea as base64 text */
            uint8_t *raw = sb_mem_try_alloc(v->via.str.size / 4 * 3 + 3);
            size_t n;
            if (raw == NULL)
                return nomem(b);
            if (sb_b64_decode(v->via.str.ptr, v->via.str.size, raw, &n) != SB_OK) {
                sb_mem_free(raw);
                return fail(b, "value for \"%s\" must be base64 text", col->name);
            }
            *out = hex_bytea(raw, n);
            sb_mem_free(raw);
            return *out != NULL ? SB_OK : nomem(b);
        }
        if (memchr(v->via.str.ptr, 0, v->via.str.size) != NULL)
            return fail(b, "value for \"%s\" contains NUL", col->name);
        *out = sb_mem_try_strndup(v->via.str.ptr, v->via.str.size);
        return *out != NULL ? SB_OK : nomem(b);
    case MSGPACK_OBJECT_BIN:
        if (col->oid != OID_BYTEA)
            return fail(b, "binary value for non-bytea column \"%s\"", col->name);
        *out = hex_bytea((const uint8_t *)v->via.bin.ptr, v->via.bin.size);
        return *out != NULL ? SB_OK : nomem(b);
    default:
        return fail(b, "value for \"%s\" has the wrong type", col->name);
    }
}

/* "$n::type" for a guest value; 0 on error (message set) */
static sb_status_t emit_param(build_t *b, const sb_pg_col_t *col, const msgpack_object *v)
{
    char *text = NULL;
    int n;
    sb_status_t st;
    if ((st = value_text(b, col, v, &text)) != SB_OK)
        return st;
    if ((n = add_param(b, text)) == 0)
        return fail(b, "too many parameters");
    emit(b, "$%d::%s", n, col->type);
    return SB_OK;
}

/* the column a guest field names, or NULL after the error naming the field (cut on a code point boundary) */
static const sb_pg_col_t *field_col(build_t *b, const char *what, const char *name, size_t len)
{
    const sb_pg_col_t *col = find_col(b->c, name, len);
    if (col == NULL)
        fail(b, "%s \"%.*s\"", what, (int)sb_utf8_cut(name, len, SB_WHERE_ECHO_FIELD), name);
    return col;
}

/* one condition; its shape was checked by the decoder (call/where.c), the value's type is checked against the column here */
static sb_status_t field_op(build_t *b, const sb_pg_col_t *col, const sb_where_t *w)
{
    const msgpack_object *v = w->value;
    sb_status_t st;

    switch (w->op) {
    case SB_WOP_EQUALS:
    case SB_WOP_NOT_EQUALS: {
        int eq = w->op == SB_WOP_EQUALS;
        if (v->type == MSGPACK_OBJECT_NIL) {
            emit(b, "\"%s\" IS %sNULL", col->name, eq ? "" : "NOT ");
            return SB_OK;
        }
        emit(b, "\"%s\" %s ", col->name, eq ? "=" : "IS DISTINCT FROM");
        return emit_param(b, col, v);
    }
    case SB_WOP_GT:
    case SB_WOP_GTE:
    case SB_WOP_LT:
    case SB_WOP_LTE:
        emit(b, "\"%s\" %s ", col->name, w->op == SB_WOP_GT ? ">" : w->op == SB_WOP_GTE ? ">=" : w->op == SB_WOP_LT ? "<" : "<=");
        return emit_param(b, col, v);
    case SB_WOP_IN:
    case SB_WOP_NOT_IN:
        if (v->via.array.size == 0) {
            /* x IN () is not SQL; its meaning is plain */
            emit(b, w->op == SB_WOP_IN ? "FALSE" : "TRUE");
            return SB_OK;
        }
        emit(b, "\"%s\" %s (", col->name, w->op == SB_WOP_IN ? "IN" : "NOT IN");
        for (uint32_t i = 0; i < v->via.array.size; ++i) {
            if (i != 0)
                emit_str(b, ", ");
            if ((st = emit_param(b, col, &v->via.array.ptr[i])) != SB_OK)
                return st;
        }
        emit_str(b, ")");
        return SB_OK;
    case SB_WOP_LIKE:
    case SB_WOP_CONTAINS: {
        char *text, *esc;
        size_t o = 0;
        int n;
        if (w->op == SB_WOP_LIKE) {
            if ((text = sb_mem_try_strndup(v->via.str.ptr, v->via.str.size)) == NULL)
                return nomem(b);
        } else {
            /* contains: the guest's text is literal, so LIKE's own wildcards are escaped */
            size_t sz;
            if (!sb_size_mul(v->via.str.size, 2, &sz) || !sb_size_add(sz, 3, &sz) || (esc = sb_mem_try_alloc(sz)) == NULL)
                return nomem(b);
            esc[o++] = '%';
            for (size_t i = 0; i < v->via.str.size; ++i) {
                char ch = v->via.str.ptr[i];
                if (ch == '%' || ch == '_' || ch == '\\')
                    esc[o++] = '\\';
                esc[o++] = ch;
            }
            esc[o++] = '%';
            esc[o] = '\0';
            text = esc;
        }
        if ((n = add_param(b, text)) == 0)
            return fail(b, "too many parameters");
        emit(b, "\"%s\"::text %s $%d::text", col->name, w->op == SB_WOP_LIKE ? "LIKE" : "ILIKE", n);
        return SB_OK;
    }
    case SB_WOP_EXISTS:
        emit(b, "\"%s\" IS %sNULL", col->name, v->via.boolean ? "NOT " : "");
        return SB_OK;
    default:
        return fail(b, "unknown operator \"%s\" on \"%s\"", sb_where_op_name(w->op), col->name);
    }
}

/* the guest's where, node for node: every map, list and operator group keeps its own parentheses */
static sb_status_t where_expr(build_t *b, const sb_where_t *w)
{
    const sb_pg_col_t *col;
    sb_status_t st;

    switch (w->kind) {
    case SB_WHERE_ALL:
    case SB_WHERE_AND:
    case SB_WHERE_OR:
    case SB_WHERE_OPS:
        if (w->n == 0) {
            emit_str(b, "TRUE");
            return SB_OK;
        }
        col = NULL;
        if (w->kind == SB_WHERE_OPS && (col = field_col(b, "unknown field", w->field, w->field_len)) == NULL)
            return SB_E_BAD_ARGS;
        emit_str(b, "(");
        for (uint32_t i = 0; i < w->n; ++i) {
            if (i != 0)
                emit_str(b, w->kind == SB_WHERE_OR ? " OR " : " AND ");
            if (w->kind == SB_WHERE_OPS)
                st = field_op(b, col, &w->v[i]);
            else
                st = where_expr(b, &w->v[i]);
            if (st != SB_OK)
                return st;
        }
        emit_str(b, ")");
        return SB_OK;
    case SB_WHERE_COND:
        if ((col = field_col(b, "unknown field", w->field, w->field_len)) == NULL)
            return SB_E_BAD_ARGS;
        return field_op(b, col, w);
    }
    return fail(b, "where is malformed");
}

/* the token's value for the i-th scope binding, added as a parameter whose number goes to *n */
static sb_status_t scope_param(build_t *b, const sb_token_t *tok, size_t i, int *n)
{
    const char *v = sb_token_scope_value(tok, b->c->scope[i].scope_key);

    if (v == NULL) {
        snprintf(b->err, b->errsz, "the token binds no \"%s\" scope value", b->c->scope[i].scope_key);
        return SB_E_FORBIDDEN;
    }
    if ((*n = add_param(b, sb_mem_strdup(v))) == 0)
        return fail(b, "too many parameters");
    return SB_OK;
}

/* AND the scope clamp (and the store namespace) onto the statement */
static sb_status_t emit_clamp(build_t *b, const sb_token_t *tok, const char *store_ns)
{
    for (size_t i = 0; i < b->c->nscope; ++i) {
        int n;
        sb_status_t st;
        if ((st = scope_param(b, tok, i, &n)) != SB_OK)
            return st;
        {
            /* cast to the scope column's own type: a uuid or integer tenant column compares as such */
            const sb_pg_col_t *col = find_col(b->c, b->c->scope[i].column, strlen(b->c->scope[i].column));
            emit(b, " AND \"%s\" = $%d::%s", b->c->scope[i].column, n, col != NULL ? col->type : "text");
        }
    }
    if (b->c->is_docstore) {
        int n;
        if (store_ns == NULL) {
            snprintf(b->err, b->errsz, "document_store namespace is missing or invalid");
            return SB_E_FORBIDDEN;
        }
        if ((n = add_param(b, sb_mem_strdup(store_ns))) == 0)
            return fail(b, "too many parameters");
        emit(b, " AND \"store\" = $%d::text", n);
    }
    return SB_OK;
}

static void emit_columns(build_t *b, const sb_call_data_t *d)
{
    int first = 1;
    for (size_t i = 0; i < b->c->ncols; ++i) {
        const sb_pg_col_t *col = &b->c->cols[i];
        if (d != NULL && d->has_select) {
            int wanted = 0;
            for (size_t k = 0; k < d->nselect && !wanted; ++k)
                wanted = d->select[k].wanted && strlen(col->name) == d->select[k].len &&
                         memcmp(col->name, d->select[k].name, d->select[k].len) == 0;
            if (!wanted && strcmp(col->name, b->c->key) != 0)
                continue;
        }
        emit(b, "%s\"%s\"", first ? "" : ", ", col->name);
        first = 0;
    }
}

static sb_status_t check_select(build_t *b, const sb_call_data_t *d)
{
    for (size_t i = 0; d->has_select && i < d->nselect; ++i)
        if (field_col(b, "select names an unknown field", d->select[i].name, d->select[i].len) == NULL)
            return SB_E_BAD_ARGS;
    return SB_OK;
}

static sb_status_t emit_sort(build_t *b, const sb_call_data_t *d)
{
    if (d->nsort == 0) {
        emit(b, " ORDER BY \"%s\"", b->c->key);
        return SB_OK;
    }
    emit_str(b, " ORDER BY ");
    for (size_t i = 0; i < d->nsort; ++i) {
        const sb_pg_col_t *col = field_col(b, "sort names an unknown field", d->sort[i].name, d->sort[i].len);
        if (col == NULL)
            return SB_E_BAD_ARGS;
        emit(b, "%s\"%s\"%s", i ? ", " : "", col->name, d->sort[i].desc ? " DESC" : "");
    }
    /* a stable page order: the key breaks ties */
    emit(b, ", \"%s\"", b->c->key);
    return SB_OK;
}

/* the rows an update or delete may touch: the guest's where, clamped, capped at max_limit keys */
static sb_status_t emit_target_rows(build_t *b, const sb_call_data_t *d, const sb_token_t *tok, const char *store_ns)
{
    sb_status_t st;
    emit(b, " WHERE \"%s\" IN (SELECT \"%s\" FROM %s WHERE ", b->c->key, b->c->key, b->c->table);
    if ((st = d->where != NULL ? where_expr(b, d->where) : (emit(b, "TRUE"), SB_OK)) != SB_OK)
        return st;
    if ((st = emit_clamp(b, tok, store_ns)) != SB_OK)
        return st;
    /*
     * FOR UPDATE: the rows are locked when chosen, so a concurrent write that
     * changed them makes this statement re-evaluate them (a compare-and-set
     * "where views = 3" then updates once, not twice)
     */
    emit(b, " ORDER BY \"%s\" LIMIT %zu FOR UPDATE)", b->c->key, b->c->max_limit);
    /* the outer statement is clamped too: the subquery's keys could collide across tenants */
    return emit_clamp(b, tok, store_ns);
}

/* resolves every data field to its column (unknown fields and scope columns refused), in order */
static sb_status_t data_cols(build_t *b, const sb_call_data_t *d, const sb_token_t *tok, const char *store_ns, int insert,
                             const sb_pg_col_t **cols)
{
    for (size_t i = 0; i < d->ndata; ++i) {
        const sb_call_field_t *f = &d->data[i];
        const sb_pg_col_t *col = field_col(b, "unknown field", f->name, f->len);
        if (col == NULL)
            return SB_E_BAD_ARGS;
        cols[i] = col;
        if (is_scope_col(b->c, col->name)) {
            /* create may restate the bound value; nothing may change it */
            const msgpack_object *v = f->value;
            const char *bound = NULL;
            for (size_t s = 0; s < b->c->nscope; ++s)
                if (strcmp(b->c->scope[s].column, col->name) == 0)
                    bound = sb_token_scope_value(tok, b->c->scope[s].scope_key);
            if (b->c->is_docstore && strcmp(col->name, "store") == 0)
                bound = store_ns;
            if (!insert || bound == NULL || v->type != MSGPACK_OBJECT_STR || strlen(bound) != v->via.str.size ||
                memcmp(bound, v->via.str.ptr, v->via.str.size) != 0) {
                snprintf(b->err, b->errsz, "field \"%s\" is bound to the run's scope and cannot be %s", col->name,
                         insert ? "set to another value" : "changed");
                return SB_E_FORBIDDEN;
            }
            cols[i] = NULL; /* the clamp sets it */
        }
    }
    return SB_OK;
}

static sb_status_t build_update_set(build_t *b, const sb_call_data_t *d, const sb_pg_col_t **cols)
{
    sb_status_t st;
    int first = 1;

    for (size_t i = 0; i < d->ndata; ++i) {
        if (cols[i] == NULL)
            continue;
        emit(b, "%s\"%s\" = ", first ? "" : ", ", cols[i]->name);
        if (d->data[i].value->type == MSGPACK_OBJECT_NIL)
            emit_str(b, "NULL");
        else if ((st = emit_param(b, cols[i], d->data[i].value)) != SB_OK)
            return st;
        first = 0;
    }
    if (first)
        return fail(b, "data sets no writable field");
    return SB_OK;
}

static sb_status_t build_insert(build_t *b, const sb_call_data_t *d, const sb_pg_col_t **cols, const sb_token_t *tok,
                                const char *store_ns)
{
    sb_status_t st;
    int first = 1;

    emit(b, "INSERT INTO %s (", b->c->table);
    /* columns: the guest's (minus scope columns), then the clamp's */
    for (size_t i = 0; i < d->ndata; ++i) {
        if (cols[i] == NULL)
            continue;
        emit(b, "%s\"%s\"", first ? "" : ", ", cols[i]->name);
        first = 0;
    }
    for (size_t s = 0; s < b->c->nscope; ++s) {
        emit(b, "%s\"%s\"", first ? "" : ", ", b->c->scope[s].column);
        first = 0;
    }
    if (b->c->is_docstore) {
        emit(b, "%s\"store\"", first ? "" : ", ");
        first = 0;
    }
    if (first) {
        /* nothing to set: every column takes its default */
        sb_buf_reset(&b->text);
        emit(b, "INSERT INTO %s DEFAULT VALUES RETURNING ", b->c->table);
        emit_columns(b, NULL);
        return SB_OK;
    }
    emit_str(b, ") VALUES (");
    first = 1;
    for (size_t i = 0; i < d->ndata; ++i) {
        const msgpack_object *v = d->data[i].value;
        if (cols[i] == NULL)
            continue;
        emit_str(b, first ? "" : ", ");
        first = 0;
        if (v->type == MSGPACK_OBJECT_NIL)
            emit_str(b, "NULL");
        else if ((st = emit_param(b, cols[i], v)) != SB_OK)
            return st;
    }
    for (size_t s = 0; s < b->c->nscope; ++s) {
        int n;
        if ((st = scope_param(b, tok, s, &n)) != SB_OK)
            return st;
        {
            const sb_pg_col_t *col = find_col(b->c, b->c->scope[s].column, strlen(b->c->scope[s].column));
            emit(b, "%s$%d::%s", first ? "" : ", ", n, col != NULL ? col->type : "text");
        }
        first = 0;
    }
    if (b->c->is_docstore) {
        int n;
        if (store_ns == NULL) {
            snprintf(b->err, b->errsz, "document_store namespace is missing or invalid");
            return SB_E_FORBIDDEN;
        }
        if ((n = add_param(b, sb_mem_strdup(store_ns))) == 0)
            return fail(b, "too many parameters");
        emit(b, "%s$%d::text", first ? "" : ", ", n);
    }
    emit_str(b, ") RETURNING ");
    emit_columns(b, NULL);
    return SB_OK;
}

static sb_status_t build(build_t *b, sb_method_op_t op, const sb_call_data_t *d, const sb_token_t *tok)
{
    const sb_pg_coll_t *c = b->c;
    sb_sql_t *q = b->q;
    const char *store_ns = c->is_docstore ? d->ns : NULL;
    const sb_pg_col_t *small[16], **cols = small;
    sb_status_t st;

    switch (op) {
    case SB_OP_FIND:
    case SB_OP_FIND_ONE:
        if ((st = check_select(b, d)) != SB_OK)
            return st;
        if (op == SB_OP_FIND) {
            /* the page size is clamped to the collection's max_limit, not refused */
            q->limit = !d->has_limit             ? (10 < c->max_limit ? 10 : c->max_limit)
                       : d->limit > c->max_limit ? c->max_limit
                                                 : (size_t)d->limit;
            q->offset = (size_t)d->offset;
        } else {
            q->limit = 1;
            q->offset = 0;
        }
        emit_str(b, "SELECT ");
        emit_columns(b, d);
        emit(b, " FROM %s WHERE ", c->table);
        if (d->where != NULL) {
            if ((st = where_expr(b, d->where)) != SB_OK)
                return st;
        } else {
            emit_str(b, "TRUE");
        }
        if ((st = emit_clamp(b, tok, store_ns)) != SB_OK)
            return st;
        if ((st = emit_sort(b, d)) != SB_OK)
            return st;
        /* one row more than the page tells whether there is a next page */
        emit(b, " LIMIT %zu OFFSET %zu", q->limit + 1, q->offset);
        break;
    case SB_OP_CREATE:
    case SB_OP_UPDATE:
        if (d->ndata > sizeof(small) / sizeof(small[0]))
            cols = sb_mem_calloc(d->ndata, sizeof(*cols));
        if ((st = data_cols(b, d, tok, store_ns, op == SB_OP_CREATE, cols)) != SB_OK)
            goto Exit;
        if (op == SB_OP_CREATE) {
            st = build_insert(b, d, cols, tok, store_ns);
            goto Exit;
        }
        emit(b, "UPDATE %s SET ", c->table);
        if ((st = build_update_set(b, d, cols)) != SB_OK || (st = emit_target_rows(b, d, tok, store_ns)) != SB_OK)
            goto Exit;
        emit_str(b, " RETURNING ");
        emit_columns(b, NULL);
    Exit:
        if (cols != small)
            sb_mem_free((void *)cols);
        if (st != SB_OK)
            return st;
        break;
    case SB_OP_DELETE:
        emit(b, "DELETE FROM %s", c->table);
        if ((st = emit_target_rows(b, d, tok, store_ns)) != SB_OK)
            return st;
        emit_str(b, " RETURNING ");
        emit_columns(b, NULL);
        break;
    default:
        return fail(b, "unsupported operation");
    }
    return SB_OK;
}

sb_status_t sb_pg_build(const sb_pg_coll_t *c, sb_method_op_t op, const sb_call_data_t *d, const sb_token_t *tok, int binary,
                        sb_sql_t *q, char *err, size_t errsz)
{
    build_t b = {c, q, binary, err, errsz, SB_OK, {0}};
    sb_status_t st;

    err[0] = '\0';
    sb_buf_init(&b.text, SB_PG_MAX_SQL);
    if ((st = build(&b, op, d, tok)) == SB_OK) {
        if (b.overflow == SB_E_TOO_LARGE)
            st = fail(&b, "the statement exceeds %u bytes", SB_PG_MAX_SQL);
        else if (b.overflow != SB_OK || sb_buf_take(&b.text, &q->sql, &q->len) != SB_OK)
            st = nomem(&b);
    }
    sb_buf_free(&b.text);
    return st;
}

/* ---- rows --------------------------------------------------------------------------------------------------------- */

static void pack_text_value(msgpack_packer *pk, unsigned oid, const char *v, int len)
{
    switch (oid) {
    case OID_BOOL:
        if (v[0] == 't')
            msgpack_pack_true(pk);
        else
            msgpack_pack_false(pk);
        return;
    case OID_INT2:
    case OID_INT4:
    case OID_INT8:
        msgpack_pack_int64(pk, strtoll(v, NULL, 10));
        return;
    case OID_FLOAT4:
    case OID_FLOAT8: {
        double d = strtod(v, NULL);
        if (isfinite(d)) {
            msgpack_pack_double(pk, d);
            return;
        }
        break; /* NaN and Infinity travel as text */
    }
    case OID_JSON:
    case OID_JSONB: {
        json_t *j = json_loadb(v, (size_t)len, JSON_DECODE_ANY, NULL);
        if (j != NULL) {
            /* PostgreSQL JSON nests at most as deep as it accepted; still, the cap applies */
            const char *why;
            msgpack_sbuffer tmp;
            msgpack_packer tpk;
            msgpack_sbuffer_init(&tmp);
            msgpack_packer_init(&tpk, &tmp, msgpack_sbuffer_write);
            if (sb_mp_pack_json(&tpk, j, &why) == SB_OK) {
                /* the packer writes into an sbuffer: append the packed value as it is */
                msgpack_sbuffer_write(pk->data, tmp.data, tmp.size);
                msgpack_sbuffer_destroy(&tmp);
                json_decref(j);
                return;
            }
            msgpack_sbuffer_destroy(&tmp);
            json_decref(j);
        }
        break;
    }
    case OID_BYTEA: {
        size_t n;
        unsigned char *raw = PQunescapeBytea((const unsigned char *)v, &n);
        if (raw != NULL) {
            msgpack_pack_bin_with_body(pk, raw, n);
            PQfreemem(raw);
            return;
        }
        break;
    }
    case OID_TIMESTAMP:
    case OID_TIMESTAMPTZ: {
        /* ISO 8601: the session runs with DateStyle=ISO and TimeZone=UTC */
        char buf[64];
        int n = len < (int)sizeof(buf) - 2 ? len : (int)sizeof(buf) - 2;
        memcpy(buf, v, (size_t)n);
        buf[n] = '\0';
        if (n > 10 && buf[10] == ' ')
            buf[10] = 'T';
        if (oid == OID_TIMESTAMPTZ && n > 3 && strcmp(buf + n - 3, "+00") == 0) {
            buf[n - 3] = 'Z';
            n -= 2;
            buf[n] = '\0';
        }
        msgpack_pack_str_with_body(pk, buf, (size_t)n);
        return;
    }
    default:
        break;
    }
    msgpack_pack_str_with_body(pk, v, (size_t)len);
}

sb_status_t sb_pg_pack_row(const PGresult *res, int row, msgpack_packer *pk)
{
    int nf = PQnfields(res);
    msgpack_pack_map(pk, (size_t)nf);
    for (int f = 0; f < nf; ++f) {
        const char *name = PQfname(res, f);
        msgpack_pack_str_with_body(pk, name, strlen(name));
        if (PQgetisnull(res, row, f))
            msgpack_pack_nil(pk);
        else
            pack_text_value(pk, (unsigned)PQftype(res, f), PQgetvalue(res, row, f), PQgetlength(res, row, f));
    }
    return SB_OK;
}

sb_status_t sb_pg_pack_rows(const PGresult *res, int max_rows, msgpack_packer *pk, size_t cap, msgpack_sbuffer *sb)
{
    int n = PQntuples(res);
    if (n > max_rows)
        n = max_rows;
    msgpack_pack_array(pk, (size_t)n);
    for (int r = 0; r < n; ++r) {
        sb_status_t st = sb_pg_pack_row(res, r, pk);
        if (st != SB_OK)
            return st;
        /* never a truncated success: over the cap is an error */
        if (sb->size > cap)
            return SB_E_EXECUTION;
    }
    return SB_OK;
}
