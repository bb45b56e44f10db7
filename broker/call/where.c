/*
 * broker/call/where: decoding the where tree (where.h).
 *
 * The walk is bounded before it allocates: nesting at most
 * SB_WHERE_MAX_DEPTH, at most SB_WHERE_MAX_CONDITIONS conditions, and each
 * node is allocated only once the map it stands for has been seen, so a
 * where costs at most a node per guest entry. Messages that echo a guest
 * field or operator name cut it on a code point boundary (SB_WHERE_ECHO_*):
 * the message lands in the JSON reply, the msgpack str, the log and the
 * audit line, which must all stay valid UTF-8.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "call/where.h"
#include "sb/value.h"
#include "util/util.h"

static const char *const op_names[SB_WOP_COUNT_] = {
    [SB_WOP_EQUALS] = "equals", [SB_WOP_NOT_EQUALS] = "not_equals",
    [SB_WOP_GT] = "gt",         [SB_WOP_GTE] = "gte",
    [SB_WOP_LT] = "lt",         [SB_WOP_LTE] = "lte",
    [SB_WOP_IN] = "in",         [SB_WOP_NOT_IN] = "not_in",
    [SB_WOP_LIKE] = "like",     [SB_WOP_CONTAINS] = "contains",
    [SB_WOP_EXISTS] = "exists",
};

typedef struct st_walk_t {
    msgpack_zone *zone;
    char *err;
    size_t errsz;
    unsigned conditions;
} walk_t;

const char *sb_where_op_name(sb_where_op_t op)
{
    return (unsigned)op < SB_WOP_COUNT_ ? op_names[op] : "?";
}

__attribute__((format(printf, 2, 3))) static sb_status_t fail(walk_t *w, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(w->err, w->errsz, fmt, ap);
    va_end(ap);
    return SB_E_BAD_ARGS;
}

/* an echo of a guest name: at most max bytes, never a split code point */
#define ECHO(p, n, max) (int)sb_utf8_cut((p), (n), (max)), (p)

static sb_where_t *nodes(walk_t *w, uint32_t n)
{
    sb_where_t *v;

    if (n == 0)
        return NULL;
    if ((v = msgpack_zone_malloc(w->zone, (size_t)n * sizeof(*v))) != NULL)
        memset(v, 0, (size_t)n * sizeof(*v));
    return v;
}

static int is_op(const char *s, size_t n, sb_where_op_t *op)
{
    for (unsigned i = 0; i < SB_WOP_COUNT_; ++i) {
        if (strlen(op_names[i]) == n && memcmp(op_names[i], s, n) == 0) {
            *op = (sb_where_op_t)i;
            return 1;
        }
    }
    return 0;
}

/* one operator on one field: the value's shape is the operator's */
static sb_status_t cond(walk_t *w, sb_where_t *c, const char *field, size_t flen, const char *op, size_t oplen,
                        const msgpack_object *v)
{
    c->kind = SB_WHERE_COND;
    c->field = field;
    c->field_len = flen;
    c->value = v;
    if (++w->conditions > SB_WHERE_MAX_CONDITIONS)
        return fail(w, "where has more than %u conditions", SB_WHERE_MAX_CONDITIONS);
    if (!is_op(op, oplen, &c->op))
        return fail(w, "unknown operator \"%.*s\" on \"%.*s\"", ECHO(op, oplen, SB_WHERE_ECHO_OP),
                    ECHO(field, flen, SB_WHERE_ECHO_FIELD));
    switch (c->op) {
    case SB_WOP_EQUALS:
    case SB_WOP_NOT_EQUALS:
        return SB_OK;
    case SB_WOP_GT:
    case SB_WOP_GTE:
    case SB_WOP_LT:
    case SB_WOP_LTE:
        if (v->type == MSGPACK_OBJECT_NIL || v->type == MSGPACK_OBJECT_MAP || v->type == MSGPACK_OBJECT_ARRAY)
            return fail(w, "operator \"%s\" on \"%.*s\" needs a scalar", op_names[c->op], ECHO(field, flen, SB_WHERE_ECHO_FIELD));
        return SB_OK;
    case SB_WOP_IN:
    case SB_WOP_NOT_IN:
        if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > SB_WHERE_MAX_IN)
            return fail(w, "operator \"%s\" on \"%.*s\" needs an array of at most %u values", op_names[c->op],
                        ECHO(field, flen, SB_WHERE_ECHO_FIELD), SB_WHERE_MAX_IN);
        for (uint32_t i = 0; i < v->via.array.size; ++i)
            if (v->via.array.ptr[i].type == MSGPACK_OBJECT_NIL)
                return fail(w, "operator \"%s\" on \"%.*s\" cannot hold null", op_names[c->op],
                            ECHO(field, flen, SB_WHERE_ECHO_FIELD));
        return SB_OK;
    case SB_WOP_LIKE:
    case SB_WOP_CONTAINS:
        if (v->type != MSGPACK_OBJECT_STR || (v->via.str.size != 0 && memchr(v->via.str.ptr, 0, v->via.str.size) != NULL))
            return fail(w, "operator \"%s\" on \"%.*s\" needs a string", op_names[c->op], ECHO(field, flen, SB_WHERE_ECHO_FIELD));
        return SB_OK;
    case SB_WOP_EXISTS:
        if (v->type != MSGPACK_OBJECT_BOOLEAN)
            return fail(w, "operator \"exists\" on \"%.*s\" needs true or false", ECHO(field, flen, SB_WHERE_ECHO_FIELD));
        return SB_OK;
    default:
        break;
    }
    return fail(w, "unknown operator");
}

static sb_status_t where_map(walk_t *w, sb_where_t *node, const msgpack_object *m, unsigned depth);

/* "and" / "or": a non-empty list of where maps, one level deeper */
static sb_status_t where_list(walk_t *w, sb_where_t *node, const msgpack_object *list, int is_and, unsigned depth)
{
    sb_where_t *v;
    sb_status_t st;

    node->kind = is_and ? SB_WHERE_AND : SB_WHERE_OR;
    if (list->type != MSGPACK_OBJECT_ARRAY || list->via.array.size == 0 || list->via.array.size > SB_WHERE_MAX_CONDITIONS)
        return fail(w, "where.%s needs a non-empty array of conditions", is_and ? "and" : "or");
    if ((v = nodes(w, list->via.array.size)) == NULL)
        return SB_E_NOMEM;
    node->v = v;
    node->n = list->via.array.size;
    for (uint32_t i = 0; i < list->via.array.size; ++i)
        if ((st = where_map(w, &v[i], &list->via.array.ptr[i], depth + 1)) != SB_OK)
            return st;
    return SB_OK;
}

static sb_status_t where_map(walk_t *w, sb_where_t *node, const msgpack_object *m, unsigned depth)
{
    sb_where_t *v;
    sb_status_t st;

    node->kind = SB_WHERE_ALL;
    if (depth > SB_WHERE_MAX_DEPTH)
        return fail(w, "where is nested deeper than %u", SB_WHERE_MAX_DEPTH);
    if (m->type != MSGPACK_OBJECT_MAP)
        return fail(w, "where must be an object");
    if (m->via.map.size == 0)
        return SB_OK;
    if ((v = nodes(w, m->via.map.size)) == NULL)
        return SB_E_NOMEM;
    node->v = v;
    node->n = m->via.map.size;
    for (uint32_t i = 0; i < m->via.map.size; ++i) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *val = &m->via.map.ptr[i].val;
        const char *field;
        size_t flen;
        if (k->type != MSGPACK_OBJECT_STR)
            return fail(w, "where keys must be strings");
        if (sb_mp_str_is(k, "and") || sb_mp_str_is(k, "or")) {
            if ((st = where_list(w, &v[i], val, sb_mp_str_is(k, "and"), depth)) != SB_OK)
                return st;
            continue;
        }
        field = k->via.str.ptr;
        flen = k->via.str.size;
        if (val->type != MSGPACK_OBJECT_MAP) {
            /* a bare value means equals */
            if ((st = cond(w, &v[i], field, flen, "equals", 6, val)) != SB_OK)
                return st;
            continue;
        }
        /* an object holds operators (a JSON value to compare goes under "equals") */
        v[i].kind = SB_WHERE_OPS;
        v[i].field = field;
        v[i].field_len = flen;
        if (val->via.map.size == 0)
            return fail(w, "where.%.*s has no operator", ECHO(field, flen, SB_WHERE_ECHO_FIELD));
        {
            sb_where_t *ops = nodes(w, val->via.map.size);
            if (ops == NULL)
                return SB_E_NOMEM;
            v[i].v = ops;
            v[i].n = val->via.map.size;
            for (uint32_t j = 0; j < val->via.map.size; ++j) {
                const msgpack_object *ok = &val->via.map.ptr[j].key;
                if (ok->type != MSGPACK_OBJECT_STR)
                    return fail(w, "operators must be strings");
                if ((st = cond(w, &ops[j], field, flen, ok->via.str.ptr, ok->via.str.size, &val->via.map.ptr[j].val)) != SB_OK)
                    return st;
            }
        }
    }
    return SB_OK;
}

sb_status_t sb_where_decode(const msgpack_object *m, msgpack_zone *zone, const sb_where_t **out, char *err, size_t errsz)
{
    walk_t w = {zone, err, errsz, 0};
    sb_where_t *root = nodes(&w, 1);
    sb_status_t st;

    *out = NULL;
    if (root == NULL)
        return SB_E_NOMEM;
    if ((st = where_map(&w, root, m, 0)) != SB_OK)
        return st;
    *out = root;
    return SB_OK;
}
