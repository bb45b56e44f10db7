/*
 * libFuzzer driver for proto/json_write.c (sb_json_write) on trees no
 * decoder would build: the input is a program that builds a msgpack_object
 * tree directly, so it can hold everything a handler's packer could write
 * (and worse): repeated map keys, non-str keys, keys with NUL, ext, NaN and
 * infinities, float32, integers above INT64_MAX, str and bin with any bytes,
 * nesting past SB_MAX_DEPTH.
 *
 * Input: a byte stream read by build() below; each value starts with a tag
 * byte (tag % 13 picks the type), followed by its payload bytes; a missing
 * byte reads as 0, so every input is a tree.
 *
 * Properties:
 *  - sb_json_write refuses exactly what the jansson route (sb_json_from_mp,
 *    then json_dumps with JSON_COMPACT | JSON_ENCODE_ANY) refuses, and
 *    otherwise writes byte for byte the same text (a repeated key at its
 *    first position with its last value, as a jansson object holds it);
 *  - a refusal is SB_E_BAD_ARGS with a reason, and leaves the buffer as it
 *    was;
 *  - the text is valid UTF-8 and valid JSON: jansson (with duplicate keys
 *    refused) reads it back to the same value, and sb_json_parse accepts it
 *    (unless it nests 32 containers: the writer takes one level more than
 *    the decoders, as sb_json_from_mp did);
 *  - with a cap below the text's length the writer answers SB_E_TOO_LARGE,
 *    leaves the buffer as it was and never holds more than cap + 1 bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "fuzz.h"

#define MAX_OBJECTS 8192
#define MAX_DEPTH_BUILT (SB_MAX_DEPTH + 4)

typedef struct st_prog_t {
    const uint8_t *p;
    size_t left;
    msgpack_object pool[MAX_OBJECTS];
    size_t used;
} prog_t;

static uint8_t next(prog_t *g)
{
    if (g->left == 0)
        return 0;
    --g->left;
    return *g->p++;
}

static uint64_t next_n(prog_t *g, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v = v << 8 | next(g);
    return v;
}

/* `n` bytes of the program itself as a string body (fewer when it runs out) */
static const char *take(prog_t *g, uint32_t *n)
{
    const char *s = (const char *)g->p;
    if (*n > g->left)
        *n = (uint32_t)g->left;
    g->p += *n;
    g->left -= *n;
    return *n != 0 ? s : "";
}

static msgpack_object *alloc(prog_t *g, size_t n)
{
    msgpack_object *o;
    if (n > MAX_OBJECTS - g->used)
        return NULL;
    o = &g->pool[g->used];
    g->used += n;
    return o;
}

/* keys from a small alphabet, so maps repeat them often */
static void build_key(prog_t *g, msgpack_object *k)
{
    static const char *const names[] = {"a", "b", "", "key", "\xc3\xa9", "a\0b", "\xff", "k"};
    uint8_t t = next(g);
    if (t % 16 == 15) {
        k->type = MSGPACK_OBJECT_POSITIVE_INTEGER; /* not a str */
        k->via.u64 = t;
        return;
    }
    k->type = MSGPACK_OBJECT_STR;
    k->via.str.ptr = names[t % 8];
    k->via.str.size = t % 8 == 5 ? 3 : (uint32_t)strlen(names[t % 8]);
}

static void build(prog_t *g, msgpack_object *o, unsigned depth)
{
    uint8_t tag = next(g);
    uint64_t v;
    uint32_t n;
    float f;

    switch (depth >= MAX_DEPTH_BUILT ? 0 : tag % 13) {
    case 0:
        o->type = MSGPACK_OBJECT_NIL;
        break;
    case 1:
        o->type = MSGPACK_OBJECT_BOOLEAN;
        o->via.boolean = tag & 0x80;
        break;
    case 2:
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
        o->via.u64 = next_n(g, 1 + tag / 16 % 8);
        break;
    case 3:
        o->type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
        o->via.i64 = -1 - (int64_t)(next_n(g, 8) >> 1);
        break;
    case 4:
        o->type = MSGPACK_OBJECT_FLOAT64;
        v = next_n(g, 8);
        memcpy(&o->via.f64, &v, sizeof(v));
        break;
    case 5:
        /* msgpack-c keeps a float32 as the double it widens to */
        o->type = MSGPACK_OBJECT_FLOAT32;
        v = next_n(g, 4);
        {
            uint32_t u = (uint32_t)v;
            memcpy(&f, &u, sizeof(f));
        }
        o->via.f64 = (double)f;
        break;
    case 6:
    case 7:
        o->type = MSGPACK_OBJECT_STR;
        n = next(g) % 64;
        o->via.str.ptr = take(g, &n);
        o->via.str.size = n;
        break;
    case 8:
        o->type = MSGPACK_OBJECT_BIN;
        n = next(g) % 64;
        o->via.bin.ptr = take(g, &n);
        o->via.bin.size = n;
        break;
    case 9:
    case 10: {
        msgpack_object *e;
        n = next(g) % 6;
        if (depth + 1 >= MAX_DEPTH_BUILT || (e = alloc(g, n)) == NULL)
            n = 0, e = NULL;
        o->type = MSGPACK_OBJECT_ARRAY;
        o->via.array.size = n;
        o->via.array.ptr = e;
        for (uint32_t i = 0; i < n; ++i)
            build(g, &e[i], depth + 1);
        break;
    }
    case 11: {
        msgpack_object *e;
        /* up to 20 pairs, so both the pairwise and the sorting duplicate checks run */
        n = next(g) % 21;
        if (depth + 1 >= MAX_DEPTH_BUILT || (e = alloc(g, 2 * (size_t)n)) == NULL)
            n = 0, e = NULL;
        o->type = MSGPACK_OBJECT_MAP;
        o->via.map.size = n;
        o->via.map.ptr = (msgpack_object_kv *)e;
        for (uint32_t i = 0; i < n; ++i) {
            build_key(g, &o->via.map.ptr[i].key);
            build(g, &o->via.map.ptr[i].val, depth + 1);
        }
        break;
    }
    default:
        o->type = MSGPACK_OBJECT_EXT;
        o->via.ext.type = 1;
        o->via.ext.ptr = "x";
        o->via.ext.size = 1;
        break;
    }
}

static prog_t prog;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_object root;
    sb_buf_t b;
    const char *why = NULL;
    json_t *j = NULL;
    char *want = NULL;
    sb_status_t st, so;

    prog.p = data;
    prog.left = size;
    prog.used = 0;
    build(&prog, &root, 0);

    so = sb_json_from_mp(&root, &j);
    if (so == SB_OK) {
        want = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
        SB_FUZZ_ASSERT(want != NULL, "json_dumps failed");
    }
    sb_buf_init(&b, SB_MAX_RPC_WIRE);
    SB_FUZZ_ASSERT(sb_buf_append(&b, "pre", 3) == SB_OK, "prefix");
    st = sb_json_write(&b, &root, &why);
    if (so != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS, "the jansson route refuses (%d), sb_json_write says %d", (int)so, (int)st);
        SB_FUZZ_ASSERT(why != NULL && *why != '\0', "refusal without a reason");
        SB_FUZZ_ASSERT(b.len == 3 && memcmp(b.base, "pre", 4) == 0, "a refusal left bytes in the buffer");
        goto Exit;
    }
    SB_FUZZ_ASSERT(st == SB_OK, "sb_json_write refuses (%d %s) what the jansson route writes", (int)st, why);
    SB_FUZZ_ASSERT(b.len - 3 == strlen(want) && memcmp(b.base + 3, want, b.len - 3) == 0, "texts differ:\n%s\n%s", b.base + 3,
                   want);
    SB_FUZZ_ASSERT(sb_utf8_valid((const uint8_t *)b.base, b.len), "the text is not valid UTF-8");
    {
        json_t *back = json_loadb(b.base + 3, b.len - 3, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
        msgpack_zone z;
        msgpack_object o;
        SB_FUZZ_ASSERT(back != NULL && json_equal(back, j), "jansson does not read the text back to the same value");
        json_decref(back);
        msgpack_zone_init(&z, 1024);
        st = sb_json_parse(b.base + 3, b.len - 3, &z, &o, &why);
        /* the writer, as the jansson route did, takes 32 nested containers; the decoders stop at 31 */
        SB_FUZZ_ASSERT(st == SB_OK || (st == SB_E_TOO_LARGE && strcmp(why, "value nesting is too deep") == 0),
                       "sb_json_parse refuses the written text: %s", why);
        msgpack_zone_destroy(&z);
    }
    {
        size_t n = b.len - 3;
        sb_buf_t c;
        sb_buf_init(&c, n - 1 + 3);
        SB_FUZZ_ASSERT(sb_buf_append(&c, "pre", 3) == SB_OK, "prefix");
        st = sb_json_write(&c, &root, &why);
        SB_FUZZ_ASSERT(st == SB_E_TOO_LARGE && c.len == 3 && c._alloc <= n + 3, "a cap one byte short: status %d, %zu bytes held",
                       (int)st, c.len);
        sb_buf_free(&c);
    }
Exit:
    free(want);
    json_decref(j);
    sb_buf_free(&b);
    return 0;
}
