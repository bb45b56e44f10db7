/*
 * broker/call/where: the where tree of a collections or document-store call
 * (PROTOCOL.md section 6b), decoded once from the guest's msgpack.
 *
 *   where := { <field>: <value> | { <op>: <value>, ... }, "and": [where...], "or": [where...] }
 *   op    := equals | not_equals | gt | gte | lt | lte | in | not_in | like | contains | exists
 *
 * The tree mirrors the guest's document node for node, so the SQL built from
 * it (broker/svc/pg/pg_query.c) has the guest's grouping exactly: a where
 * map is an ALL of its entries, "and"/"or" hold lists of where maps, a field
 * with an operator map is an OPS of its conditions, a field with a bare value
 * is one COND (equals). Everything the decoder can tell without the schema
 * is checked here (shapes, operators, caps); field names are resolved
 * against the introspected columns by the statement builder.
 */
#ifndef SB_CALL_WHERE_H
#define SB_CALL_WHERE_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include "sb/limits.h"
#include "sb/status.h"

/* a where nests at most this deep ("and"/"or" levels) */
#define SB_WHERE_MAX_DEPTH SB_MAX_WHERE_DEPTH
/* conditions (field and operator pairs) per where */
#define SB_WHERE_MAX_CONDITIONS 64u
/* values of an in / not_in list */
#define SB_WHERE_MAX_IN 100u
/* how much of a guest field or operator name an error message echoes (cut on a code point boundary) */
#define SB_WHERE_ECHO_FIELD 64u
#define SB_WHERE_ECHO_OP 32u

typedef enum en_sb_where_kind_t {
    SB_WHERE_ALL = 0, /* a where map: every entry holds (no entry: TRUE) */
    SB_WHERE_AND,     /* "and": every where map in v holds */
    SB_WHERE_OR,      /* "or": one where map in v holds */
    SB_WHERE_OPS,     /* a field with an operator map: every condition in v holds */
    SB_WHERE_COND     /* one operator on one field */
} sb_where_kind_t;

typedef enum en_sb_where_op_t {
    SB_WOP_EQUALS = 0,
    SB_WOP_NOT_EQUALS,
    SB_WOP_GT,
    SB_WOP_GTE,
    SB_WOP_LT,
    SB_WOP_LTE,
    SB_WOP_IN,
    SB_WOP_NOT_IN,
    SB_WOP_LIKE,
    SB_WOP_CONTAINS,
    SB_WOP_EXISTS,
    SB_WOP_COUNT_
} sb_where_op_t;

typedef struct st_sb_where_t {
    sb_where_kind_t kind;
    /* ALL, AND, OR, OPS: the children */
    const struct st_sb_where_t *v;
    uint32_t n;
    /* OPS, COND: the guest's field name (not NUL-terminated) */
    const char *field;
    size_t field_len;
    /* COND: the operator and its value (equals/not_equals: any value, nil meaning NULL; the rest as checked here) */
    sb_where_op_t op;
    const msgpack_object *value;
} sb_where_t;

/**
 * Decodes a where document.
 * @param w the guest's where (a map; NULL or nil is for the caller to treat as "no where")
 * @param zone where the nodes are allocated; they point into `w`, so both must outlive the tree
 * @param out receives the root (an SB_WHERE_ALL)
 * @param err receives the reason on failure, naming the field or operator
 * @return SB_OK, SB_E_BAD_ARGS (err filled) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_where_decode(const msgpack_object *w, msgpack_zone *zone, const sb_where_t **out, char *err,
                                           size_t errsz);

/** the operator's name as the guest spells it ("not_equals") */
const char *sb_where_op_name(sb_where_op_t op);

#endif
