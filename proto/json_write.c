/*
 * msgpack_object -> JSON text, straight into an sb_buf_t (see sb_json_write
 * in sb/value.h). The output matches, byte for byte, what the jansson route
 * (sb_json_from_mp, then json_dumps with JSON_COMPACT | JSON_ENCODE_ANY)
 * produced, so a client sees no difference; fuzz/fuzz_json.c checks that
 * against jansson itself.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "scan.h"

#define DUP_PAIRWISE_MAX 16

typedef struct st_writer_t {
    sb_buf_t *b;
    size_t nodes;
    const char *why;
} writer_t;

static sb_status_t refuse(writer_t *w, const char *why)
{
    w->why = why;
    return SB_E_BAD_ARGS;
}

static sb_status_t put(writer_t *w, const char *s, size_t n)
{
    return sb_buf_append(w->b, s, n);
}

static sb_status_t put_u64(writer_t *w, uint64_t v, int neg)
{
    char d[24];
    size_t i = sizeof(d);

    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (neg)
        d[--i] = '-';
    return put(w, d + i, sizeof(d) - i);
}

/*
 * jansson's jsonp_dtostr: "%.17g" (17 significant digits always read back to
 * the same double), then ".0" when the text has neither '.' nor an exponent
 * (so it reads back as a real), and the exponent without '+' or leading
 * zeros. Formatted in the "C" locale, whatever LC_NUMERIC says.
 */
static sb_status_t put_real(writer_t *w, double v)
{
    char t[40];
    size_t n;
    int r;
    locale_t loc = sb__c_locale(), old = (locale_t)0;

    if (loc != (locale_t)0)
        old = uselocale(loc);
    r = snprintf(t, sizeof(t) - 3, "%.17g", v);
    if (loc != (locale_t)0)
        uselocale(old);
    if (r < 0 || (size_t)r >= sizeof(t) - 3)
        return refuse(w, "float cannot be formatted");
    n = (size_t)r;
    if (memchr(t, '.', n) == NULL && memchr(t, 'e', n) == NULL) {
        t[n++] = '.';
        t[n++] = '0';
    } else {
        char *e = memchr(t, 'e', n);
        if (e != NULL) {
            /* "e+07" -> "e7", "e-07" -> "e-7" */
            char *start = e + 1, *end = e + 2;
            if (*start == '-')
                ++start;
            while (*end == '0')
                ++end;
            if (end != start) {
                memmove(start, end, (size_t)(t + n - end));
                n -= (size_t)(end - start);
            }
        }
    }
    return put(w, t, n);
}

static sb_status_t put_bin(writer_t *w, const uint8_t *p, size_t n)
{
    size_t enc = sb_b64_encoded_len(n);
    char *room;
    sb_status_t st;

    /* the quotes and the text in one reservation; sb_b64_encode's NUL lands on the closing quote's byte */
    if ((st = sb_buf_reserve(w->b, enc + 2, &room)) != SB_OK)
        return st;
    room[0] = '"';
    sb_b64_encode(p, n, room + 1);
    room[enc + 1] = '"';
    sb_buf_commit(w->b, enc + 2);
    return SB_OK;
}

static sb_status_t put_str(writer_t *w, const msgpack_object *o)
{
    sb_status_t st = sb_buf_append_json_str(w->b, o->via.str.size != 0 ? o->via.str.ptr : "", o->via.str.size);
    return st == SB_E_BAD_ARGS ? refuse(w, "string is not valid UTF-8") : st;
}

static int key_eq(const msgpack_object *a, const msgpack_object *b)
{
    return a->via.str.size == b->via.str.size &&
           (a->via.str.size == 0 || memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0);
}

typedef struct st_keyref_t {
    const char *p;
    uint32_t len;
    uint32_t idx;
} keyref_t;

/* by key bytes, then by position: equal keys end up together, in map order */
static int keyref_cmp(const void *a, const void *b)
{
    const keyref_t *x = a, *y = b;
    int r;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    if (x->len != 0 && (r = memcmp(x->p, y->p, x->len)) != 0)
        return r;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static sb_status_t write_value(writer_t *w, const msgpack_object *o, unsigned depth);

/*
 * The checks of write_value, without writing: for the values a repeated key
 * replaces. jansson converted (and so checked and counted) those too before
 * dropping them, so they are refused and counted here as well.
 */
static sb_status_t check_value(writer_t *w, const msgpack_object *o, unsigned depth)
{
    sb_status_t st;

    if (++w->nodes > SB_MAX_NODES)
        return refuse(w, "value has too many nodes");
    if (depth >= SB_MAX_DEPTH)
        return refuse(w, "value nesting is too deep");
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
    case MSGPACK_OBJECT_BOOLEAN:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    case MSGPACK_OBJECT_BIN:
        return SB_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return o->via.u64 > (uint64_t)INT64_MAX ? refuse(w, "integer above INT64_MAX") : SB_OK;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return isfinite(o->via.f64) ? SB_OK : refuse(w, "non-finite float");
    case MSGPACK_OBJECT_STR:
        return o->via.str.size == 0 || sb_utf8_valid((const uint8_t *)o->via.str.ptr, o->via.str.size)
                   ? SB_OK
                   : refuse(w, "string is not valid UTF-8");
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; ++i)
            if ((st = check_value(w, &o->via.array.ptr[i], depth + 1)) != SB_OK)
                return st;
        return SB_OK;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; ++i) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR)
                return refuse(w, "map key is not a string");
            if (k->via.str.size != 0 && (memchr(k->via.str.ptr, 0, k->via.str.size) != NULL ||
                                         !sb_utf8_valid((const uint8_t *)k->via.str.ptr, k->via.str.size)))
                return refuse(w, "map key holds NUL or is not valid UTF-8");
            if ((st = check_value(w, &o->via.map.ptr[i].val, depth + 1)) != SB_OK)
                return st;
        }
        return SB_OK;
    default:
        return refuse(w, "msgpack ext has no JSON form");
    }
}

static sb_status_t write_pair(writer_t *w, const msgpack_object *key, const msgpack_object *val, unsigned depth, int first)
{
    sb_status_t st;
    if ((!first && (st = sb_buf_append_char(w->b, ',')) != SB_OK) || (st = put_str(w, key)) != SB_OK ||
        (st = sb_buf_append_char(w->b, ':')) != SB_OK)
        return st;
    return write_value(w, val, depth + 1);
}

/*
 * A jansson object holds each key once: setting a key again replaced its
 * value in place. So a map that repeats a key is written with the key at its
 * first position and its last value. Maps without repeats (all of them, in
 * practice) are written as they are; finding out costs n^2/2 comparisons for
 * small maps and a sort for large ones (no hash a value could flood).
 */
static sb_status_t write_map(writer_t *w, const msgpack_object *o, unsigned depth)
{
    const msgpack_object_kv *kv = o->via.map.ptr;
    uint32_t n = o->via.map.size, *src = NULL;
    keyref_t *keys = NULL;
    int dup = 0, first = 1;
    sb_status_t st;

    for (uint32_t i = 0; i < n; ++i) {
        const msgpack_object *k = &kv[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return refuse(w, "map key is not a string");
        if (k->via.str.size != 0 && memchr(k->via.str.ptr, 0, k->via.str.size) != NULL)
            return refuse(w, "map key holds NUL");
    }
    if (n > 1 && n <= DUP_PAIRWISE_MAX) {
        for (uint32_t i = 1; i < n && !dup; ++i)
            for (uint32_t j = 0; j < i && !dup; ++j)
                dup = key_eq(&kv[i].key, &kv[j].key);
    } else if (n > DUP_PAIRWISE_MAX) {
        if ((keys = sb_mem_try_alloc_array(n, sizeof(*keys))) == NULL)
            return SB_E_NOMEM;
        for (uint32_t i = 0; i < n; ++i) {
            keys[i].p = kv[i].key.via.str.ptr;
            keys[i].len = kv[i].key.via.str.size;
            keys[i].idx = i;
        }
        qsort(keys, n, sizeof(*keys), keyref_cmp);
        for (uint32_t i = 1; i < n && !dup; ++i)
            dup = keys[i - 1].len == keys[i].len && (keys[i].len == 0 || memcmp(keys[i - 1].p, keys[i].p, keys[i].len) == 0);
    }
    if ((st = sb_buf_append_char(w->b, '{')) != SB_OK)
        goto Exit;
    if (!dup) {
        for (uint32_t i = 0; i < n; ++i, first = 0)
            if ((st = write_pair(w, &kv[i].key, &kv[i].val, depth, first)) != SB_OK)
                goto Exit;
    } else if (keys == NULL) {
        for (uint32_t i = 0; i < n; ++i) {
            uint32_t last = i, j;
            for (j = 0; j < i && !key_eq(&kv[i].key, &kv[j].key); ++j)
                ;
            if (j < i)
                continue; /* written at its first position */
            for (j = i + 1; j < n; ++j)
                if (key_eq(&kv[i].key, &kv[j].key))
                    last = j;
            /* the values the last one replaces: checked, not written */
            for (j = i; j < last; ++j)
                if (key_eq(&kv[i].key, &kv[j].key) && (st = check_value(w, &kv[j].val, depth + 1)) != SB_OK)
                    goto Exit;
            if ((st = write_pair(w, &kv[i].key, &kv[last].val, depth, first)) != SB_OK)
                goto Exit;
            first = 0;
        }
    } else {
        /* src[i]: for the first occurrence of a key, the index of its last value; UINT32_MAX for the others */
        if ((src = sb_mem_try_alloc_array(n, sizeof(*src))) == NULL) {
            st = SB_E_NOMEM;
            goto Exit;
        }
        for (uint32_t g = 0; g < n;) {
            uint32_t e = g + 1;
            while (e < n && keys[e].len == keys[g].len && (keys[g].len == 0 || memcmp(keys[e].p, keys[g].p, keys[g].len) == 0))
                ++e;
            src[keys[g].idx] = keys[e - 1].idx;
            for (uint32_t k = g + 1; k < e; ++k)
                src[keys[k].idx] = UINT32_MAX;
            /* the values the last one replaces: checked, not written */
            for (uint32_t k = g; k + 1 < e; ++k)
                if ((st = check_value(w, &kv[keys[k].idx].val, depth + 1)) != SB_OK)
                    goto Exit;
            g = e;
        }
        for (uint32_t i = 0; i < n; ++i) {
            if (src[i] == UINT32_MAX)
                continue;
            if ((st = write_pair(w, &kv[i].key, &kv[src[i]].val, depth, first)) != SB_OK)
                goto Exit;
            first = 0;
        }
    }
    st = sb_buf_append_char(w->b, '}');
Exit:
    sb_mem_free(src);
    sb_mem_free(keys);
    return st;
}

static sb_status_t write_value(writer_t *w, const msgpack_object *o, unsigned depth)
{
    sb_status_t st;

    /* the bounds sb_json_from_mp applied: SB_MAX_NODES values, nothing below SB_MAX_DEPTH containers */
    if (++w->nodes > SB_MAX_NODES)
        return refuse(w, "value has too many nodes");
    if (depth >= SB_MAX_DEPTH)
        return refuse(w, "value nesting is too deep");
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return put(w, "null", 4);
    case MSGPACK_OBJECT_BOOLEAN:
        return o->via.boolean ? put(w, "true", 4) : put(w, "false", 5);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return refuse(w, "integer above INT64_MAX");
        return put_u64(w, o->via.u64, 0);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return o->via.i64 < 0 ? put_u64(w, (uint64_t)0 - (uint64_t)o->via.i64, 1) : put_u64(w, (uint64_t)o->via.i64, 0);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64))
            return refuse(w, "non-finite float");
        return put_real(w, o->via.f64);
    case MSGPACK_OBJECT_STR:
        return put_str(w, o);
    case MSGPACK_OBJECT_BIN:
        return put_bin(w, (const uint8_t *)(o->via.bin.size != 0 ? o->via.bin.ptr : ""), o->via.bin.size);
    case MSGPACK_OBJECT_ARRAY:
        if ((st = sb_buf_append_char(w->b, '[')) != SB_OK)
            return st;
        for (uint32_t i = 0; i < o->via.array.size; ++i) {
            if ((i != 0 && (st = sb_buf_append_char(w->b, ',')) != SB_OK) ||
                (st = write_value(w, &o->via.array.ptr[i], depth + 1)) != SB_OK)
                return st;
        }
        return sb_buf_append_char(w->b, ']');
    case MSGPACK_OBJECT_MAP:
        return write_map(w, o, depth);
    default:
        return refuse(w, "msgpack ext has no JSON form");
    }
}

sb_status_t sb_json_write(sb_buf_t *buf, const msgpack_object *o, const char **why)
{
    writer_t w = {buf, 0, NULL};
    size_t mark = buf->len;
    sb_status_t st = write_value(&w, o, 0);

    if (st != SB_OK) {
        sb_buf_truncate(buf, mark);
        if (why != NULL)
            *why = st == SB_E_TOO_LARGE ? "JSON text exceeds the cap" : st == SB_E_NOMEM ? "out of memory" : w.why;
    }
    return st;
}
