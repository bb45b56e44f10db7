/*
 * broker/call: the decoders of the typed call (call.h), one per family.
 *
 * Each decoder reads its args once and in the wire's order, and stops at the
 * first error, recording it with the stage at which it is answered. The
 * reasons are the ones PROTOCOL.md documents (and tests assert byte for
 * byte); a reason that echoes a guest key or name cuts it on a code point
 * boundary, because it lands in JSON, msgpack str, the log and the audit
 * line, which must stay valid UTF-8.
 *
 * The args object comes from sb_mp_decode or the JSON decoder, which refuse
 * duplicate and non-string keys; the decoders still treat a key found twice
 * (or as both str and bin) as an error rather than pick one copy: if the
 * check read one copy and a handler the other, the check would be worth
 * nothing.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "call/call.h"
#include "call/path.h"
#include "sb/value.h"
#include "util/util.h"

#define MAX_NAME SB_MAX_NAME

static const char msg_namespace[] = "document_store namespace is missing or invalid";
static const char msg_tool_name[] = "tools.call name is missing or invalid";
static const char msg_tool_args[] = "invalid sandbox custom tool arguments";
static const char msg_tool_too_large[] = "sandbox custom tool arguments are too large";

typedef struct st_dec_t {
    sb_call_t *call;
    msgpack_zone *zone;
    const msgpack_object *args;
} dec_t;

typedef enum en_arg_t { ARG_MISSING, ARG_FOUND, ARG_AMBIGUOUS } arg_t;

/* an echo of a guest string: at most max bytes, never a split code point */
#define ECHO(p, n, max) (int)sb_utf8_cut((p), (n), (max)), (p)

__attribute__((format(printf, 4, 5))) static sb_status_t fail(dec_t *d, sb_call_err_stage_t stage, sb_status_t st, const char *fmt,
                                                              ...)
{
    va_list ap;

    if (d->call->err_stage != SB_CALL_ERR_NONE)
        return d->call->err_status;
    d->call->err_stage = stage;
    d->call->err_status = st;
    va_start(ap, fmt);
    vsnprintf(d->call->err, sizeof(d->call->err), fmt, ap);
    va_end(ap);
    return st;
}

static void *alloc(dec_t *d, size_t size)
{
    void *p = msgpack_zone_malloc(d->zone, size != 0 ? size : 1);
    if (p != NULL)
        memset(p, 0, size);
    return p;
}

static sb_status_t nomem(dec_t *d)
{
    return fail(d, SB_CALL_ERR_NOW, SB_E_NOMEM, "out of memory decoding the call's arguments");
}

/*
 * Looks `key` up in `map` (which may be NULL or not a map: then everything is
 * missing). Only a str key counts as the key; a second match, or a bin key
 * with the same bytes, is ambiguous.
 */
static arg_t get(const msgpack_object *map, const char *key, const msgpack_object **val)
{
    size_t n = strlen(key);

    *val = NULL;
    if (map == NULL || map->type != MSGPACK_OBJECT_MAP)
        return ARG_MISSING;
    for (uint32_t i = 0; i != map->via.map.size; ++i) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR) {
            if (k->via.str.size != n || memcmp(k->via.str.ptr, key, n) != 0)
                continue;
        } else if (k->type == MSGPACK_OBJECT_BIN) {
            if (k->via.bin.size == n && memcmp(k->via.bin.ptr, key, n) == 0)
                return ARG_AMBIGUOUS;
            continue;
        } else {
            continue;
        }
        if (*val != NULL)
            return ARG_AMBIGUOUS;
        *val = &map->via.map.ptr[i].val;
    }
    return *val != NULL ? ARG_FOUND : ARG_MISSING;
}

/* the subject argument the check decides on, looked up once; ambiguity is the check's bad_args */
static int subject(dec_t *d, const msgpack_object *map, const char *key, const msgpack_object **val)
{
    if (get(map, key, val) == ARG_AMBIGUOUS) {
        fail(d, SB_CALL_ERR_SUBJECT, SB_E_BAD_ARGS, "args has a duplicate or non-string key \"%s\"", key);
        return 0;
    }
    return 1;
}

static const msgpack_object *non_nil(const msgpack_object *v)
{
    return v != NULL && v->type != MSGPACK_OBJECT_NIL ? v : NULL;
}

/* the first key of a map that is not in `known` (NULL-terminated), or NULL */
static const msgpack_object *unknown_key(const msgpack_object *map, const char *const *known)
{
    for (uint32_t i = 0; i != map->via.map.size; ++i) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        size_t j = 0;
        while (known[j] != NULL && !sb_mp_str_is(k, known[j]))
            ++j;
        if (known[j] == NULL)
            return k;
    }
    return NULL;
}

static int is_name(const char *s, size_t len)
{
    if (len == 0 || len > MAX_NAME)
        return 0;
    for (size_t i = 0; i != len; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static char *copy_str(dec_t *d, const char *s, size_t n)
{
    char *p = alloc(d, n + 1);
    if (p != NULL && n != 0)
        memcpy(p, s, n);
    return p;
}

/* decodes strict base64 into the zone */
static sb_status_t b64_bytes(dec_t *d, const msgpack_object *s, const uint8_t **out, size_t *len)
{
    uint8_t *buf;

    *out = NULL;
    *len = 0;
    if (s->via.str.size == 0)
        return SB_OK;
    if ((buf = alloc(d, s->via.str.size / 4 * 3 + 3)) == NULL)
        return SB_E_NOMEM;
    if (sb_b64_decode(s->via.str.ptr, s->via.str.size, buf, len) != SB_OK)
        return SB_E_BAD_ARGS;
    *out = buf;
    return SB_OK;
}

/* ---- files --------------------------------------------------------------------------------------------------------- */

static sb_status_t decode_content(dec_t *d, sb_call_files_t *f, const msgpack_object *args)
{
    const msgpack_object *c, *b;
    sb_status_t st;

    (void)get(args, "content", &c);
    (void)get(args, "contentBase64", &b);
    c = non_nil(c);
    b = non_nil(b);
    if ((c == NULL) == (b == NULL))
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "files.write takes content or contentBase64, exactly one");
    if (c != NULL) {
        if (c->type == MSGPACK_OBJECT_STR) {
            f->content = (const uint8_t *)c->via.str.ptr;
            f->content_len = c->via.str.size;
        } else if (c->type == MSGPACK_OBJECT_BIN) {
            f->content = (const uint8_t *)c->via.bin.ptr;
            f->content_len = c->via.bin.size;
        } else {
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "files.write content must be a string or bin");
        }
        return SB_OK;
    }
    if (b->type != MSGPACK_OBJECT_STR)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "files.write contentBase64 must be a base64 string");
    if ((st = b64_bytes(d, b, &f->content, &f->content_len)) == SB_E_NOMEM)
        return nomem(d);
    if (st != SB_OK)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "files.write contentBase64 must be a base64 string");
    return SB_OK;
}

/*
 * files.read {path}, files.write {path, content | contentBase64}, files.list
 * {path?}; upstream's "scope" (and "title", "mime_type" for write) are
 * accepted and ignored: the root comes from the token, never from args.
 */
static sb_status_t decode_files(dec_t *d)
{
    static const char *const path_keys[] = {"path", "scope", NULL};
    static const char *const write_keys[] = {"path", "content", "contentBase64", "title", "mime_type", "scope", NULL};
    sb_method_op_t op = d->call->m.op;
    const char *name = op == SB_OP_READ ? "files.read" : op == SB_OP_WRITE ? "files.write" : "files.list";
    const msgpack_object *args = non_nil(d->args), *p;
    sb_call_files_t *f;
    const char *why = NULL;

    if ((f = d->call->files = alloc(d, sizeof(*f))) == NULL)
        return nomem(d);
    /* the subject: the path (files.list may name none; nil means absent) */
    if (!subject(d, args, "path", &p))
        return d->call->err_status;
    if ((p = non_nil(p)) == NULL) {
        if (op != SB_OP_LIST)
            return fail(d, SB_CALL_ERR_SUBJECT, SB_E_FORBIDDEN, "%s", SB_PATH_WHY_UNSAFE);
    } else {
        if (p->type != MSGPACK_OBJECT_STR || sb_path_normalize(p->via.str.ptr, p->via.str.size, f->path, sizeof(f->path)) != SB_OK)
            return fail(d, SB_CALL_ERR_SUBJECT, SB_E_FORBIDDEN, "%s", SB_PATH_WHY_UNSAFE);
        f->has_path = 1;
        f->path_len = strlen(f->path);
    }
    /* the rest, answered after the grant */
    if (args != NULL && args->type != MSGPACK_OBJECT_MAP)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s args must be an object", name);
    if (args != NULL && unknown_key(args, op == SB_OP_WRITE ? write_keys : path_keys) != NULL)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s args has an unknown key", name);
    /* a refusal, never a rewrite: the opened path stays the checked one */
    if (f->has_path && sb_path_storage_check(f->path, f->path_len, &why) != SB_OK)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_FORBIDDEN, "%s", why);
    if (op == SB_OP_WRITE)
        return decode_content(d, f, args);
    return SB_OK;
}

/* ---- collections, store, document store ------------------------------------------------------------------------------ */

static sb_status_t data_fields(dec_t *d, const msgpack_object *map, const char *skip, const sb_call_field_t **out, size_t *n)
{
    sb_call_field_t *v;
    size_t k = 0;

    if ((v = alloc(d, map->via.map.size * sizeof(*v))) == NULL)
        return nomem(d);
    for (uint32_t i = 0; i != map->via.map.size; ++i) {
        const msgpack_object *key = &map->via.map.ptr[i].key;
        if (key->type != MSGPACK_OBJECT_STR)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "data keys must be strings");
        if (skip != NULL && sb_mp_str_is(key, skip))
            continue;
        v[k].name = key->via.str.ptr;
        v[k].len = key->via.str.size;
        v[k].value = &map->via.map.ptr[i].val;
        ++k;
    }
    *out = v;
    *n = k;
    return SB_OK;
}

static sb_status_t decode_select(dec_t *d, sb_call_data_t *c, const msgpack_object *select)
{
    sb_call_select_t *v;
    uint32_t n;

    if ((select = non_nil(select)) == NULL)
        return SB_OK;
    if (select->type != MSGPACK_OBJECT_ARRAY && select->type != MSGPACK_OBJECT_MAP)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "select must be an array of field names or an object");
    n = select->type == MSGPACK_OBJECT_ARRAY ? select->via.array.size : select->via.map.size;
    if ((v = alloc(d, n * sizeof(*v))) == NULL)
        return nomem(d);
    for (uint32_t i = 0; i != n; ++i) {
        const msgpack_object *s = select->type == MSGPACK_OBJECT_ARRAY ? &select->via.array.ptr[i] : &select->via.map.ptr[i].key;
        if (s->type != MSGPACK_OBJECT_STR)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "select entries must be field names");
        v[i].name = s->via.str.ptr;
        v[i].len = s->via.str.size;
        if (select->type == MSGPACK_OBJECT_ARRAY) {
            v[i].wanted = 1;
        } else {
            const msgpack_object *w = &select->via.map.ptr[i].val;
            v[i].wanted = w->type == MSGPACK_OBJECT_BOOLEAN && w->via.boolean;
        }
    }
    c->has_select = 1;
    c->select = v;
    c->nselect = n;
    return SB_OK;
}

static sb_status_t decode_sort(dec_t *d, sb_call_data_t *c, const msgpack_object *sort)
{
    const msgpack_object *items = sort;
    sb_call_sort_t *v;
    uint32_t n = 1;

    if ((sort = non_nil(sort)) == NULL)
        return SB_OK;
    if (sort->type == MSGPACK_OBJECT_ARRAY) {
        items = sort->via.array.ptr;
        n = sort->via.array.size;
        if (n == 0 || n > SB_CALL_MAX_SORT)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "sort takes 1-%u fields", SB_CALL_MAX_SORT);
    }
    if ((v = alloc(d, n * sizeof(*v))) == NULL)
        return nomem(d);
    for (uint32_t i = 0; i != n; ++i) {
        const msgpack_object *s = &items[i];
        if (s->type != MSGPACK_OBJECT_STR || s->via.str.size == 0)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "sort entries are field names, \"-\" for descending");
        v[i].name = s->via.str.ptr;
        v[i].len = s->via.str.size;
        if (v[i].name[0] == '-') {
            v[i].desc = 1;
            ++v[i].name;
            --v[i].len;
        }
    }
    c->sort = v;
    c->nsort = n;
    return SB_OK;
}

static sb_status_t decode_where(dec_t *d, sb_call_data_t *c, const msgpack_object *where)
{
    sb_status_t st;

    if ((where = non_nil(where)) == NULL)
        return SB_OK;
    if ((st = sb_where_decode(where, d->zone, &c->where, d->call->err, sizeof(d->call->err))) == SB_E_NOMEM)
        return nomem(d);
    if (st != SB_OK) {
        /* the message is in call->err already */
        d->call->err_stage = SB_CALL_ERR_ARGS;
        d->call->err_status = st;
    }
    return st;
}

/*
 * The namespace of collections.document_store.<op>, as upstream's guest sends
 * it (PROTOCOL.md section 6b): create carries the document's fields and
 * `store` at the top level, {...x, store: s}; find, findOne, update and
 * delete carry `store` inside `where`, a string or {"equals": string} (any
 * other operator could widen the filter).
 */
static const msgpack_object *docstore_namespace(dec_t *d, const msgpack_object *args)
{
    const msgpack_object *where, *v, *eq;

    if (d->call->m.op == SB_OP_CREATE) {
        if (!subject(d, args, "store", &v))
            return NULL;
        return v;
    }
    if (!subject(d, args, "where", &where) || !subject(d, where, "store", &v))
        return NULL;
    if (v != NULL && v->type == MSGPACK_OBJECT_MAP) {
        if (v->via.map.size != 1)
            return NULL;
        if (!subject(d, v, "equals", &eq))
            return NULL;
        return eq;
    }
    return v;
}

static sb_status_t decode_data(dec_t *d)
{
    static const char *const find_keys[] = {"where", "limit", "offset", "sort", "select", NULL};
    static const char *const find_one_keys[] = {"where", "sort", "select", NULL};
    static const char *const create_keys[] = {"data", NULL};
    static const char *const update_keys[] = {"where", "data", NULL};
    static const char *const delete_keys[] = {"where", NULL};
    const sb_method_t *m = &d->call->m;
    const msgpack_object *args = non_nil(d->args), *v;
    const char *opname = sb_method_op_name(m->op);
    const char *const *keys;
    sb_call_data_t *c;
    int upstream_doc;
    sb_status_t st;

    if ((c = d->call->data = alloc(d, sizeof(*c))) == NULL)
        return nomem(d);
    c->docstore = m->kind == SB_MK_STORE ||
                  (m->name_len == sizeof("document_store") - 1 && memcmp(m->name, "document_store", m->name_len) == 0);
    upstream_doc = c->docstore && m->kind == SB_MK_COLLECTIONS;
    if (m->kind == SB_MK_STORE) {
        /* store.<ns>.op: the grammar checked the name */
        if ((c->ns = copy_str(d, m->name, m->name_len)) == NULL)
            return nomem(d);
        c->ns_len = m->name_len;
    } else if (upstream_doc) {
        const msgpack_object *ns = docstore_namespace(d, args);
        if (d->call->err_stage != SB_CALL_ERR_NONE)
            return d->call->err_status;
        if (ns == NULL || ns->type != MSGPACK_OBJECT_STR || !is_name(ns->via.str.ptr, ns->via.str.size))
            return fail(d, SB_CALL_ERR_SUBJECT, SB_E_FORBIDDEN, "%s", msg_namespace);
        if ((c->ns = copy_str(d, ns->via.str.ptr, ns->via.str.size)) == NULL)
            return nomem(d);
        c->ns_len = ns->via.str.size;
    }

    /* the rest, answered after the grant */
    if (args != NULL && args->type != MSGPACK_OBJECT_MAP)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s args must be an object", opname);
    switch (m->op) {
    case SB_OP_FIND:
        keys = find_keys;
        break;
    case SB_OP_FIND_ONE:
        keys = find_one_keys;
        break;
    case SB_OP_CREATE:
        keys = upstream_doc ? NULL : create_keys; /* upstream's create: the document's own fields */
        break;
    case SB_OP_UPDATE:
        keys = update_keys;
        break;
    case SB_OP_DELETE:
        keys = delete_keys;
        break;
    default:
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "unsupported operation");
    }
    if (args != NULL && keys != NULL && (v = unknown_key(args, keys)) != NULL) {
        if (v->type != MSGPACK_OBJECT_STR)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s args keys must be strings", opname);
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s takes no argument \"%.*s\"", opname,
                    ECHO(v->via.str.ptr, v->via.str.size, SB_CALL_ECHO_KEY));
    }
    switch (m->op) {
    case SB_OP_FIND:
    case SB_OP_FIND_ONE:
        if ((st = decode_select(d, c, sb_mp_get(args, "select"))) != SB_OK)
            return st;
        if (m->op == SB_OP_FIND) {
            /* a page size above the collection's max_limit is clamped, not refused (the builder knows the max) */
            if ((v = non_nil(sb_mp_get(args, "limit"))) != NULL) {
                if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                    return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "limit must be a non-negative integer");
                c->has_limit = 1;
                c->limit = v->via.u64;
            }
            if ((v = non_nil(sb_mp_get(args, "offset"))) != NULL) {
                if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > SB_CALL_MAX_OFFSET)
                    return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "offset must be an integer from 0 to %u", SB_CALL_MAX_OFFSET);
                c->offset = v->via.u64;
            }
        }
        if ((st = decode_where(d, c, sb_mp_get(args, "where"))) != SB_OK)
            return st;
        return decode_sort(d, c, sb_mp_get(args, "sort"));
    case SB_OP_CREATE:
        if (upstream_doc)
            return data_fields(d, args, "store", &c->data, &c->ndata);
        if ((v = sb_mp_get(args, "data")) == NULL || v->type != MSGPACK_OBJECT_MAP)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "data must be a non-empty object");
        return data_fields(d, v, NULL, &c->data, &c->ndata);
    case SB_OP_UPDATE:
        if ((v = sb_mp_get(args, "data")) == NULL || v->type != MSGPACK_OBJECT_MAP || v->via.map.size == 0)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "data must be a non-empty object");
        if ((st = data_fields(d, v, NULL, &c->data, &c->ndata)) != SB_OK)
            return st;
        return decode_where(d, c, sb_mp_get(args, "where"));
    default: /* delete */
        return decode_where(d, c, sb_mp_get(args, "where"));
    }
}

/* ---- tools ---------------------------------------------------------------------------------------------------------- */

/*
 * The packed size of an object (as msgpack_pack_object writes it), or 0 when
 * JSON cannot carry it (a non-string key, an ext, a non-finite float, an
 * integer above int64): tools.call sends its arguments to the MCP server as
 * JSON, and the cap is upstream's, on the packed form.
 */
static size_t json_packed_size(const msgpack_object *o, unsigned depth)
{
    size_t n, sum;

    if (depth > SB_MAX_DEPTH)
        return 0;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
    case MSGPACK_OBJECT_BOOLEAN:
        return 1;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return 0;
        return o->via.u64 < 128 ? 1 : o->via.u64 < 256 ? 2 : o->via.u64 < 65536 ? 3 : o->via.u64 <= UINT32_MAX ? 5 : 9;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return o->via.i64 >= -32 ? 1 : o->via.i64 >= -128 ? 2 : o->via.i64 >= -32768 ? 3 : o->via.i64 >= INT32_MIN ? 5 : 9;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64))
            return 0;
        return o->type == MSGPACK_OBJECT_FLOAT32 ? 5 : 9;
    case MSGPACK_OBJECT_STR:
        if (!sb_utf8_valid((const uint8_t *)o->via.str.ptr, o->via.str.size))
            return 0;
        n = o->via.str.size;
        return n + (n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5);
    case MSGPACK_OBJECT_BIN:
        n = o->via.bin.size;
        return n + (n < 256 ? 2 : n < 65536 ? 3 : 5);
    case MSGPACK_OBJECT_ARRAY:
        n = o->via.array.size;
        sum = n < 16 ? 1 : n < 65536 ? 3 : 5;
        for (uint32_t i = 0; i != o->via.array.size; ++i) {
            size_t e = json_packed_size(&o->via.array.ptr[i], depth + 1);
            if (e == 0)
                return 0;
            sum += e;
        }
        return sum;
    case MSGPACK_OBJECT_MAP:
        n = o->via.map.size;
        sum = n < 16 ? 1 : n < 65536 ? 3 : 5;
        for (uint32_t i = 0; i != o->via.map.size; ++i) {
            size_t k, v;
            if (o->via.map.ptr[i].key.type != MSGPACK_OBJECT_STR)
                return 0;
            if ((k = json_packed_size(&o->via.map.ptr[i].key, depth + 1)) == 0 ||
                (v = json_packed_size(&o->via.map.ptr[i].val, depth + 1)) == 0)
                return 0;
            sum += k + v;
        }
        return sum;
    default:
        return 0; /* ext */
    }
}

/*
 * tools.list takes no arguments (absent or exactly {}); tools.call takes
 * exactly {name, arguments?}, extra keys such as "envelope" are bad_args,
 * arguments an object of at most 63 KiB packed (PROTOCOL.md section 6b).
 */
static sb_status_t decode_tools(dec_t *d)
{
    static const char *const call_keys[] = {"name", "arguments", NULL};
    const msgpack_object *args = d->args, *name, *a;
    sb_call_tools_t *t;
    size_t size;

    if ((t = d->call->tools = alloc(d, sizeof(*t))) == NULL)
        return nomem(d);
    if (d->call->m.op == SB_OP_LIST) {
        if (args != NULL && (args->type != MSGPACK_OBJECT_MAP || args->via.map.size != 0))
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s", msg_tool_args);
        return SB_OK;
    }
    if (d->call->m.op != SB_OP_CALL)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_METHOD, "invalid sandbox custom tool method");
    /* the subject: the tool name */
    if (!subject(d, args, "name", &name))
        return d->call->err_status;
    if (name == NULL || name->type != MSGPACK_OBJECT_STR || name->via.str.size == 0 || name->via.str.size > SB_CALL_MAX_TOOL_NAME)
        return fail(d, SB_CALL_ERR_SUBJECT, SB_E_FORBIDDEN, "%s", msg_tool_name);
    t->name = name->via.str.ptr;
    t->name_len = name->via.str.size;
    /* the rest, answered after the grant */
    if (unknown_key(args, call_keys) != NULL)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s", msg_tool_args);
    if ((a = sb_mp_get(args, "arguments")) == NULL)
        return SB_OK;
    if (a->type != MSGPACK_OBJECT_MAP || (size = json_packed_size(a, 0)) == 0)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s", msg_tool_args);
    if (size > SB_CALL_MAX_TOOL_ARGUMENTS)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "%s", msg_tool_too_large);
    t->arguments = a;
    return SB_OK;
}

/* ---- http.fetch ----------------------------------------------------------------------------------------------------- */

static int is_tchar(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static int is_token(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; ++i)
        if (!is_tchar(s[i]))
            return 0;
    return 1;
}

/* field values: visible ASCII, space, tab and obs-text; never CR, LF or NUL (no header injection) */
static int is_field_value(const char *s, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 0;
    }
    return 1;
}

/* headers the broker owns, or that could smuggle a second request (upstream's list, plus te/trailer/expect) */
static int dropped_header(const char *name)
{
    static const char *const drop[] = {"host",
                                       "content-length",
                                       "connection",
                                       "transfer-encoding",
                                       "keep-alive",
                                       "upgrade",
                                       "proxy-authorization",
                                       "proxy-connection",
                                       "te",
                                       "trailer",
                                       "expect",
                                       NULL};
    for (size_t i = 0; drop[i] != NULL; ++i)
        if (strcmp(drop[i], name) == 0)
            return 1;
    return 0;
}

/*
 * The secret placeholders of one header value (PROTOCOL.md section 5,
 * "Secrets"), found once: a malformed one is refused here, never sent as
 * text. The distinct names go to f->secrets for the audit line.
 */
static sb_status_t find_placeholders(dec_t *d, sb_call_fetch_t *f, sb_call_header_t *h, sb_call_name_t **namesp, size_t *total)
{
    sb_call_name_t *names = *namesp;
    sb_placeholder_t found[SB_CALL_MAX_FETCH_PLACEHOLDERS], *ph;
    size_t n = 0, from = 0;
    int r;

    while ((r = sb_placeholder_next(h->value, h->value_len, from, &found[n])) == 1) {
        const char *nm = h->value + found[n].name;
        size_t j;
        if (*total + n + 1 > SB_CALL_MAX_FETCH_PLACEHOLDERS)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch headers hold more than %u secret placeholders",
                        SB_CALL_MAX_FETCH_PLACEHOLDERS);
        if (names == NULL) {
            if ((names = *namesp = alloc(d, SB_CALL_MAX_FETCH_PLACEHOLDERS * sizeof(*names))) == NULL)
                return nomem(d);
            /* published at once: a later refusal leaves the call with the names found so far (the audit line lists them) */
            f->secrets = names;
        }
        for (j = 0; j < f->nsecrets && !(names[j].len == found[n].name_len && memcmp(names[j].name, nm, names[j].len) == 0); ++j)
            ;
        if (j == f->nsecrets) {
            names[j].name = nm;
            names[j].len = found[n].name_len;
            ++f->nsecrets;
        }
        from = found[n].start + found[n].len;
        ++n;
    }
    if (r < 0)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch header \"%s\" has a malformed secret placeholder", h->name);
    if (n == 0)
        return SB_OK;
    if ((ph = alloc(d, n * sizeof(*ph))) == NULL)
        return nomem(d);
    memcpy(ph, found, n * sizeof(*ph));
    h->ph = ph;
    h->nph = n;
    *total += n;
    return SB_OK;
}

static sb_status_t decode_headers(dec_t *d, sb_call_fetch_t *f, const msgpack_object *headers)
{
    sb_call_header_t *v;
    sb_call_name_t *names = NULL;
    size_t bytes = 0, n = 0, nph = 0;
    sb_status_t st;

    if ((headers = non_nil(headers)) == NULL)
        return SB_OK;
    if (headers->type != MSGPACK_OBJECT_MAP)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch headers must be an object");
    if ((v = alloc(d, (headers->via.map.size < SB_CALL_MAX_FETCH_HEADERS ? headers->via.map.size : SB_CALL_MAX_FETCH_HEADERS) *
                          sizeof(*v))) == NULL)
        return nomem(d);
    for (uint32_t i = 0; i < headers->via.map.size; ++i) {
        const msgpack_object *k = &headers->via.map.ptr[i].key, *val = &headers->via.map.ptr[i].val;
        char *name;
        if (val->type != MSGPACK_OBJECT_STR)
            continue; /* upstream drops non-string values */
        if (k->type != MSGPACK_OBJECT_STR || k->via.str.size > 256 || !is_token(k->via.str.ptr, k->via.str.size))
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch header names must be HTTP tokens");
        if (!is_field_value(val->via.str.ptr, val->via.str.size))
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch header values must not contain control characters");
        bytes += k->via.str.size + val->via.str.size + 4;
        if (n == SB_CALL_MAX_FETCH_HEADERS || bytes > SB_CALL_MAX_FETCH_HEADER_BYTES)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch headers exceed %u entries or %u bytes",
                        SB_CALL_MAX_FETCH_HEADERS, SB_CALL_MAX_FETCH_HEADER_BYTES);
        if ((name = copy_str(d, k->via.str.ptr, k->via.str.size)) == NULL)
            return nomem(d);
        for (size_t j = 0; j < k->via.str.size; ++j)
            if (name[j] >= 'A' && name[j] <= 'Z')
                name[j] = (char)(name[j] - 'A' + 'a');
        if (dropped_header(name))
            continue;
        v[n].name = name;
        v[n].name_len = k->via.str.size;
        v[n].value = val->via.str.ptr;
        v[n].value_len = val->via.str.size;
        if ((st = find_placeholders(d, f, &v[n], &names, &nph)) != SB_OK)
            return st;
        ++n;
    }
    f->headers = v;
    f->nheaders = n;
    return SB_OK;
}

/* http.fetch {url, method?, headers?, bodyBase64?} (msgpack: body as bin instead) */
static sb_status_t decode_fetch(dec_t *d)
{
    static const char *const keys[] = {"url", "method", "headers", "bodyBase64", "body", NULL};
    const msgpack_object *args = d->args, *url, *method, *b64, *bin;
    const char *why = NULL;
    sb_call_fetch_t *f;
    sb_status_t st;

    if ((f = d->call->fetch = alloc(d, sizeof(*f))) == NULL)
        return nomem(d);
    /* the subject: the URL, parsed once by the one strict parser */
    if (!subject(d, args, "url", &url))
        return d->call->err_status;
    if (url == NULL || url->type != MSGPACK_OBJECT_STR)
        return fail(d, SB_CALL_ERR_SUBJECT, SB_E_BAD_ARGS, "http.fetch url is invalid: missing or not a string");
    if (sb_url_parse(url->via.str.ptr, url->via.str.size, &f->url, &why) != SB_OK)
        return fail(d, SB_CALL_ERR_SUBJECT, SB_E_BAD_ARGS, "http.fetch url is invalid: %s", why != NULL ? why : "unparseable");
    /* the rest, answered after the grant */
    if (unknown_key(args, keys) != NULL)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch args has an unknown key");
    if ((method = non_nil(sb_mp_get(args, "method"))) == NULL) {
        memcpy(f->method, "GET", 4);
    } else {
        if (method->type != MSGPACK_OBJECT_STR || method->via.str.size > SB_CALL_MAX_FETCH_METHOD ||
            !is_token(method->via.str.ptr, method->via.str.size))
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch method must be an HTTP token of at most %u characters",
                        SB_CALL_MAX_FETCH_METHOD);
        for (size_t i = 0; i < method->via.str.size; ++i) {
            char c = method->via.str.ptr[i];
            f->method[i] = c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
        }
        f->method[method->via.str.size] = '\0';
        if (strcmp(f->method, "CONNECT") == 0 || strcmp(f->method, "TRACE") == 0 || strcmp(f->method, "TRACK") == 0)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch method %s is not allowed", f->method);
    }
    if ((st = decode_headers(d, f, sb_mp_get(args, "headers"))) != SB_OK)
        return st;
    b64 = sb_mp_get(args, "bodyBase64");
    bin = sb_mp_get(args, "body");
    if (b64 != NULL && bin != NULL)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch takes body or bodyBase64, not both");
    if ((b64 = non_nil(b64)) != NULL) {
        if (b64->type != MSGPACK_OBJECT_STR)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch bodyBase64 must be a base64 string");
        /* bound before allocating */
        if (b64->via.str.size > SB_MAX_HTTP_BODY_B64)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch request body exceeds %u-byte cap", SB_MAX_HTTP_BODY);
        if ((st = b64_bytes(d, b64, &f->body, &f->body_len)) == SB_E_NOMEM)
            return nomem(d);
        if (st != SB_OK)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch bodyBase64 must be a base64 string");
    } else if ((bin = non_nil(bin)) != NULL) {
        if (bin->type != MSGPACK_OBJECT_BIN && bin->type != MSGPACK_OBJECT_STR)
            return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch body must be bin or str");
        f->body = (const uint8_t *)bin->via.bin.ptr;
        f->body_len = bin->via.bin.size;
    }
    if (f->body_len > SB_MAX_HTTP_BODY)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "http.fetch request body exceeds %u-byte cap", SB_MAX_HTTP_BODY);
    return SB_OK;
}

/*
 * import.fetch {url} (PROTOCOL.md section 6c): one module, always GET, with
 * no header, no body and no credential of the guest's. The same request
 * shape as http.fetch, so the hop machine sends it, but nothing of it is
 * the guest's to choose but the URL.
 */
static sb_status_t decode_import(dec_t *d)
{
    static const char *const keys[] = {"url", NULL};
    const msgpack_object *args = d->args, *url;
    const char *why = NULL;
    sb_call_fetch_t *f;

    if ((f = d->call->fetch = alloc(d, sizeof(*f))) == NULL)
        return nomem(d);
    memcpy(f->method, "GET", 4);
    if (!subject(d, args, "url", &url))
        return d->call->err_status;
    if (url == NULL || url->type != MSGPACK_OBJECT_STR)
        return fail(d, SB_CALL_ERR_SUBJECT, SB_E_BAD_ARGS, "import.fetch url is invalid: missing or not a string");
    if (sb_url_parse(url->via.str.ptr, url->via.str.size, &f->url, &why) != SB_OK)
        return fail(d, SB_CALL_ERR_SUBJECT, SB_E_BAD_ARGS, "import.fetch url is invalid: %s", why != NULL ? why : "unparseable");
    if (unknown_key(args, keys) != NULL)
        return fail(d, SB_CALL_ERR_ARGS, SB_E_BAD_ARGS, "import.fetch takes only a url");
    return SB_OK;
}

/* ---- entry ---------------------------------------------------------------------------------------------------------- */

sb_status_t sb_call_decode(sb_call_t *call, const sb_method_t *m, const char *method, size_t method_len, const msgpack_object *args,
                           int binary, msgpack_zone *zone)
{
    dec_t d = {call, zone, args};

    memset(call, 0, sizeof(*call));
    call->m = *m;
    call->method = method;
    call->method_len = method_len;
    call->binary = binary;
    switch (m->kind) {
    case SB_MK_FILES:
        return decode_files(&d);
    case SB_MK_COLLECTIONS:
    case SB_MK_STORE:
        return decode_data(&d);
    case SB_MK_TOOLS:
        return decode_tools(&d);
    case SB_MK_HTTP:
        return decode_fetch(&d);
    case SB_MK_IMPORT:
        return decode_import(&d);
    default:
        /* globals, services, jobs, workflows, email: the method names everything the check and dispatch need; args are ignored */
        return SB_OK;
    }
}
