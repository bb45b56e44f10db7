/*
 * Between jansson trees and the msgpack representation used inside
 * (PROTOCOL.md section 1, "Values"), for the JSON that jansson still holds:
 * the capability manifest and the admin bodies (sb_mp_pack_json), the SQL
 * builder's JSON parameters, a tool's arguments and the shim's guest output
 * (sb_json_from_mp). JSON text to and from the wire goes through
 * sb_json_parse (json_parse.c) and sb_json_write (json_write.c) instead.
 * Also the msgpack helpers everything shares: re-packing, lookups, base64.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"

typedef struct st_packctx_t {
    size_t nodes;
    const char *why;
} packctx_t;

static sb_status_t pack_json(msgpack_packer *pk, const json_t *v, unsigned depth, packctx_t *ctx)
{
    if (++ctx->nodes > SB_MAX_NODES) {
        ctx->why = "value has too many nodes";
        return SB_E_TOO_LARGE;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        void *it;
        if (depth + 1 >= SB_MAX_DEPTH) {
            ctx->why = "value nesting is too deep";
            return SB_E_TOO_LARGE;
        }
        msgpack_pack_map(pk, json_object_size(v));
        for (it = json_object_iter((json_t *)v); it != NULL; it = json_object_iter_next((json_t *)v, it)) {
            sb_status_t st;
            key = json_object_iter_key(it);
            val = json_object_iter_value(it);
            msgpack_pack_str_with_body(pk, key, json_object_iter_key_len(it));
            if ((st = pack_json(pk, val, depth + 1, ctx)) != SB_OK)
                return st;
        }
        return SB_OK;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        if (depth + 1 >= SB_MAX_DEPTH) {
            ctx->why = "value nesting is too deep";
            return SB_E_TOO_LARGE;
        }
        msgpack_pack_array(pk, n);
        for (size_t i = 0; i < n; ++i) {
            sb_status_t st = pack_json(pk, json_array_get(v, i), depth + 1, ctx);
            if (st != SB_OK)
                return st;
        }
        return SB_OK;
    }
    case JSON_STRING:
        msgpack_pack_str_with_body(pk, json_string_value(v), json_string_length(v));
        return SB_OK;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, (int64_t)json_integer_value(v));
        return SB_OK;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(v));
        return SB_OK;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        return SB_OK;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        return SB_OK;
    case JSON_NULL:
        msgpack_pack_nil(pk);
        return SB_OK;
    }
    ctx->why = "unknown JSON type";
    return SB_E_BAD_ARGS;
}

sb_status_t sb_mp_pack_json(msgpack_packer *pk, const json_t *v, const char **why)
{
    packctx_t ctx = {0, NULL};
    sb_status_t st = pack_json(pk, v, 0, &ctx);
    if (st != SB_OK && why != NULL)
        *why = ctx.why;
    return st;
}

static sb_status_t from_mp(const msgpack_object *o, json_t **out, unsigned depth, size_t *nodes)
{
    json_t *v = NULL;

    if (++*nodes > SB_MAX_NODES || depth >= SB_MAX_DEPTH)
        return SB_E_TOO_LARGE;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        v = json_null();
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        v = json_boolean(o->via.boolean);
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return SB_E_BAD_ARGS;
        v = json_integer((json_int_t)o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        v = json_integer((json_int_t)o->via.i64);
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64))
            return SB_E_BAD_ARGS;
        v = json_real(o->via.f64);
        break;
    case MSGPACK_OBJECT_STR:
        if (!sb_utf8_valid((const uint8_t *)o->via.str.ptr, o->via.str.size))
            return SB_E_BAD_ARGS;
        /* msgpack-c leaves ptr NULL for an empty string */
        v = json_stringn_nocheck(o->via.str.size != 0 ? o->via.str.ptr : "", o->via.str.size);
        break;
    case MSGPACK_OBJECT_BIN: {
        char *b64;
        if ((b64 = sb_mem_try_alloc(sb_b64_encoded_len(o->via.bin.size) + 1)) == NULL)
            return SB_E_NOMEM;
        sb_b64_encode((const uint8_t *)o->via.bin.ptr, o->via.bin.size, b64);
        v = json_string_nocheck(b64);
        sb_mem_free(b64);
        break;
    }
    case MSGPACK_OBJECT_ARRAY:
        if ((v = json_array()) == NULL)
            return SB_E_NOMEM;
        for (uint32_t i = 0; i < o->via.array.size; ++i) {
            json_t *e;
            sb_status_t st = from_mp(&o->via.array.ptr[i], &e, depth + 1, nodes);
            if (st != SB_OK) {
                json_decref(v);
                return st;
            }
            if (json_array_append_new(v, e) != 0) {
                json_decref(v);
                return SB_E_NOMEM;
            }
        }
        break;
    case MSGPACK_OBJECT_MAP:
        if ((v = json_object()) == NULL)
            return SB_E_NOMEM;
        for (uint32_t i = 0; i < o->via.map.size; ++i) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            json_t *e;
            sb_status_t st;
            const char *kp = kv->key.via.str.size != 0 ? kv->key.via.str.ptr : "";
            if (kv->key.type != MSGPACK_OBJECT_STR || memchr(kp, 0, kv->key.via.str.size) != NULL ||
                !sb_utf8_valid((const uint8_t *)kp, kv->key.via.str.size)) {
                json_decref(v);
                return SB_E_BAD_ARGS;
            }
            if ((st = from_mp(&kv->val, &e, depth + 1, nodes)) != SB_OK) {
                json_decref(v);
                return st;
            }
            if (json_object_setn_new_nocheck(v, kp, kv->key.via.str.size, e) != 0) {
                json_decref(v);
                return SB_E_NOMEM;
            }
        }
        break;
    default: /* ext */
        return SB_E_BAD_ARGS;
    }
    if (v == NULL)
        return SB_E_NOMEM;
    *out = v;
    return SB_OK;
}

sb_status_t sb_json_from_mp(const msgpack_object *o, json_t **out)
{
    size_t nodes = 0;
    return from_mp(o, out, 0, &nodes);
}

void sb_mp_pack_object(msgpack_packer *pk, const msgpack_object *o)
{
    (void)msgpack_pack_object(pk, *o);
}

const msgpack_object *sb_mp_get(const msgpack_object *map, const char *key)
{
    size_t klen;

    if (map == NULL || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    klen = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; ++i) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen && (klen == 0 || memcmp(k->via.str.ptr, key, klen) == 0))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

int sb_mp_str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o != NULL && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && (n == 0 || memcmp(o->via.str.ptr, s, n) == 0);
}
