/*
 * The msgpack pre-check (PROTOCOL.md, "Values").
 *
 * msgpack-c 4.0 allocates `n * sizeof(msgpack_object)` as soon as it reads an
 * array or map header, before the elements arrive, so a five-byte input can
 * ask for 32 GiB. This walker reads every header through a bounds-checked
 * cursor and refuses any count that the remaining bytes cannot possibly hold
 * (each element needs at least one byte), before msgpack-c sees the buffer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "scan.h"

typedef struct st_cursor_t {
    sb_reader_t r;
    size_t nodes;
    const char *why;
} cursor_t;

typedef struct st_key_t {
    const uint8_t *p;
    size_t len;
} span_t;

static int take(cursor_t *c, size_t n, const uint8_t **out)
{
    sb_view_t v;
    if (sb_reader_bytes(&c->r, n, &v) != SB_OK) {
        c->why = "truncated msgpack";
        return 0;
    }
    *out = v.base;
    return 1;
}

/* a big-endian integer of n = 1, 2, 4 or 8 bytes */
static int read_be(cursor_t *c, size_t n, uint64_t *v)
{
    sb_status_t st;
    uint8_t u8 = 0;
    uint16_t u16 = 0;
    uint32_t u32 = 0;

    switch (n) {
    case 1:
        st = sb_reader_u8(&c->r, &u8);
        *v = u8;
        break;
    case 2:
        st = sb_reader_be16(&c->r, &u16);
        *v = u16;
        break;
    case 4:
        st = sb_reader_be32(&c->r, &u32);
        *v = u32;
        break;
    default:
        st = sb_reader_be64(&c->r, v);
        break;
    }
    if (st != SB_OK) {
        c->why = "truncated msgpack";
        return 0;
    }
    return 1;
}

static int keycmp(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->p, y->p, n);
    if (r != 0)
        return r;
    return x->len < y->len ? -1 : x->len > y->len;
}

static sb_status_t walk(cursor_t *c, unsigned depth, span_t *as_key);

static sb_status_t walk_map(cursor_t *c, unsigned depth, uint64_t n)
{
    span_t small[16], *keys = small;
    sb_status_t st = SB_OK;

    /* each pair needs at least two bytes */
    if (n > sb_reader_remaining(&c->r) / 2) {
        c->why = "msgpack map count exceeds the bytes left";
        return SB_E_BAD_ARGS;
    }
    /* a map with more values than the node cap is refused before its key list is allocated */
    if (n > SB_MAX_NODES - c->nodes) {
        c->why = "value has too many nodes";
        return SB_E_TOO_LARGE;
    }
    if (n > sizeof(small) / sizeof(small[0]) && (keys = sb_mem_try_alloc_array((size_t)n, sizeof(*keys))) == NULL)
        return SB_E_NOMEM;
    for (uint64_t i = 0; i < n; ++i) {
        if ((st = walk(c, depth + 1, &keys[i])) != SB_OK)
            goto Exit;
        if ((st = walk(c, depth + 1, NULL)) != SB_OK)
            goto Exit;
    }
    if (n > 1) {
        qsort(keys, (size_t)n, sizeof(*keys), keycmp);
        for (uint64_t i = 1; i < n; ++i) {
            if (keycmp(&keys[i - 1], &keys[i]) == 0) {
                c->why = "duplicate msgpack map key";
                st = SB_E_BAD_ARGS;
                goto Exit;
            }
        }
    }
Exit:
    if (keys != small)
        sb_mem_free(keys);
    return st;
}

static sb_status_t walk(cursor_t *c, unsigned depth, span_t *as_key)
{
    const uint8_t *b, *body;
    uint64_t n = 0;
    int is_str = 0, is_container = 0, is_map = 0;

    /* map keys are not values: nodes are counted as JSON counts them */
    if (as_key == NULL && ++c->nodes > SB_MAX_NODES) {
        c->why = "value has too many nodes";
        return SB_E_TOO_LARGE;
    }
    if (!take(c, 1, &b))
        return SB_E_BAD_ARGS;
    uint8_t t = *b;

    if (as_key != NULL && !(t >= 0xa0 && t <= 0xbf) && t != 0xd9 && t != 0xda && t != 0xdb) {
        c->why = "msgpack map key is not a string";
        return SB_E_BAD_ARGS;
    }
    if (t <= 0x7f || t >= 0xe0) {
        return SB_OK; /* fixint */
    } else if (t <= 0x8f) {
        n = t & 0x0f, is_container = is_map = 1;
    } else if (t <= 0x9f) {
        n = t & 0x0f, is_container = 1;
    } else if (t <= 0xbf) {
        n = t & 0x1f, is_str = 1;
    } else {
        switch (t) {
        case 0xc0: /* nil */
        case 0xc2: /* false */
        case 0xc3: /* true */
            return SB_OK;
        case 0xc4:
        case 0xc5:
        case 0xc6: /* bin 8/16/32 */
            if (!read_be(c, (size_t)1 << (t - 0xc4), &n) || !take(c, (size_t)n, &body))
                return SB_E_BAD_ARGS;
            return SB_OK;
        case 0xca: { /* float 32 */
            uint64_t v;
            uint32_t u;
            float f;
            if (!read_be(c, 4, &v))
                return SB_E_BAD_ARGS;
            u = (uint32_t)v;
            memcpy(&f, &u, sizeof(f));
            if (!isfinite(f)) {
                c->why = "non-finite msgpack float";
                return SB_E_BAD_ARGS;
            }
            return SB_OK;
        }
        case 0xcb: { /* float 64 */
            uint64_t v;
            double d;
            if (!read_be(c, 8, &v))
                return SB_E_BAD_ARGS;
            memcpy(&d, &v, sizeof(d));
            if (!isfinite(d)) {
                c->why = "non-finite msgpack float";
                return SB_E_BAD_ARGS;
            }
            return SB_OK;
        }
        case 0xcc:
        case 0xcd:
        case 0xce:
        case 0xcf: /* uint 8..64 */
            return read_be(c, (size_t)1 << (t - 0xcc), &n) ? SB_OK : SB_E_BAD_ARGS;
        case 0xd0:
        case 0xd1:
        case 0xd2:
        case 0xd3: /* int 8..64 */
            return read_be(c, (size_t)1 << (t - 0xd0), &n) ? SB_OK : SB_E_BAD_ARGS;
        case 0xd9:
        case 0xda:
        case 0xdb: /* str 8/16/32 */
            if (!read_be(c, (size_t)1 << (t - 0xd9), &n))
                return SB_E_BAD_ARGS;
            is_str = 1;
            break;
        case 0xdc:
        case 0xdd: /* array 16/32 */
            if (!read_be(c, t == 0xdc ? 2 : 4, &n))
                return SB_E_BAD_ARGS;
            is_container = 1;
            break;
        case 0xde:
        case 0xdf: /* map 16/32 */
            if (!read_be(c, t == 0xde ? 2 : 4, &n))
                return SB_E_BAD_ARGS;
            is_container = is_map = 1;
            break;
        case 0xc1:
            c->why = "reserved msgpack byte 0xc1";
            return SB_E_BAD_ARGS;
        default: /* 0xc7-0xc9, 0xd4-0xd8: ext */
            c->why = "msgpack ext types are not accepted";
            return SB_E_BAD_ARGS;
        }
    }

    if (is_str) {
        if (!take(c, (size_t)n, &body))
            return SB_E_BAD_ARGS;
        if (!sb_utf8_valid(body, (size_t)n)) {
            c->why = "msgpack string is not valid UTF-8";
            return SB_E_BAD_ARGS;
        }
        if (as_key != NULL) {
            as_key->p = body;
            as_key->len = (size_t)n;
        }
        return SB_OK;
    }
    if (is_container) {
        /* msgpack-c keeps a fixed stack of SB_MAX_DEPTH containers */
        if (depth + 1 >= SB_MAX_DEPTH) {
            c->why = "value nesting is too deep";
            return SB_E_TOO_LARGE;
        }
        if (is_map)
            return walk_map(c, depth, n);
        if (n > sb_reader_remaining(&c->r)) {
            c->why = "msgpack array count exceeds the bytes left";
            return SB_E_BAD_ARGS;
        }
        for (uint64_t i = 0; i < n; ++i) {
            sb_status_t st = walk(c, depth + 1, NULL);
            if (st != SB_OK)
                return st;
        }
    }
    return SB_OK;
}

sb_status_t sb_mp_check(const uint8_t *p, size_t len, size_t *obj_len, const char **why)
{
    cursor_t c = {.nodes = 0, .why = "invalid msgpack"};
    sb_status_t st;

    sb_reader_init(&c.r, p, len);
    st = walk(&c, 0, NULL);

    if (st != SB_OK) {
        if (why != NULL)
            *why = st == SB_E_NOMEM ? "out of memory" : c.why;
        return st;
    }
    *obj_len = sb_reader_offset(&c.r);
    return SB_OK;
}

/*
 * msgpack-c leaves the pointer of an empty str or bin NULL when nothing with a
 * body came before it; every consumer would then hand NULL to memcmp or
 * memcpy with a length of 0, which is undefined behaviour. One pass here
 * points them at a static empty string instead, so no consumer has to care.
 * The tree is at most SB_MAX_DEPTH deep (the pre-check saw to it).
 */
static void fix_empty(msgpack_object *o)
{
    static const char empty[1] = "";
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        if (o->via.str.ptr == NULL)
            o->via.str.ptr = empty;
        break;
    case MSGPACK_OBJECT_BIN:
        if (o->via.bin.ptr == NULL)
            o->via.bin.ptr = empty;
        break;
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; ++i)
            fix_empty(&o->via.array.ptr[i]);
        break;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; ++i) {
            fix_empty(&o->via.map.ptr[i].key);
            fix_empty(&o->via.map.ptr[i].val);
        }
        break;
    default:
        break;
    }
}

sb_status_t sb_mp_decode(const uint8_t *p, size_t len, msgpack_zone *zone, msgpack_object *out, const char **why)
{
    size_t obj_len, off = 0;
    sb_status_t st;

    if ((st = sb_mp_check(p, len, &obj_len, why)) != SB_OK)
        return st;
    if (obj_len != len) {
        if (why != NULL)
            *why = "trailing bytes after the msgpack value";
        return SB_E_BAD_ARGS;
    }
    switch (msgpack_unpack((const char *)p, len, &off, zone, out)) {
    case MSGPACK_UNPACK_SUCCESS:
        fix_empty(out);
        return SB_OK;
    case MSGPACK_UNPACK_NOMEM_ERROR:
        if (why != NULL)
            *why = "out of memory";
        return SB_E_NOMEM;
    default:
        /* unreachable after the pre-check; fail closed all the same */
        if (why != NULL)
            *why = "invalid msgpack";
        return SB_E_BAD_ARGS;
    }
}

sb_status_t sb_mp_decode_packed(const uint8_t *p, size_t len, msgpack_zone *zone, msgpack_object *out)
{
    size_t off = 0;

    switch (msgpack_unpack((const char *)p, len, &off, zone, out)) {
    case MSGPACK_UNPACK_SUCCESS:
        fix_empty(out);
        return SB_OK;
    case MSGPACK_UNPACK_NOMEM_ERROR:
        return SB_E_NOMEM;
    default:
        return SB_E_BAD_ARGS;
    }
}

int sb_utf8_valid(const uint8_t *p, size_t len)
{
    size_t i = 0;

    while (i < len) {
        size_t k;
        /* ASCII, eight bytes at a time: most strings are mostly ASCII */
        if (len - i >= 8 && sb__ascii8(sb__load8(p + i))) {
            i += 8;
            continue;
        }
        if (p[i] < 0x80) {
            ++i;
            continue;
        }
        if ((k = sb__utf8_seq(p + i, len - i)) == 0)
            return 0;
        i += k;
    }
    return 1;
}
