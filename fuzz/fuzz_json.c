/*
 * libFuzzer driver for JSON text in both routes: the one-pass decoder
 * (proto/json_parse.c, sb_json_parse) and writer (proto/json_write.c,
 * sb_json_write), checked against the jansson route (the reference in
 * tests/json_ref.h: sb_ref_json_decode, with its depth/node pre-scan, and
 * proto/json.c's sb_json_from_mp) and against jansson itself.
 *
 * Properties:
 *  - the jansson route: on SB_OK, the packed bytes pass sb_mp_decode (the
 *    msgpack route's pre-check), sb_json_from_mp converts them back, and the
 *    result equals jansson's own parse of the text; SB_E_BAD_ARGS means
 *    jansson (with the same flags) refuses the text too; SB_E_TOO_LARGE is
 *    the only other refusal; every refusal has a `why`;
 *  - the one-pass decoder gives the same verdict as the jansson route: it
 *    accepts exactly what that route accepts, with the same tree (types,
 *    bytes, float bits, pair order). Two differences are allowed, both where
 *    the old route is wrong: the old pre-scan counts an empty container twice,
 *    so it may refuse as too large what has at most SB_MAX_NODES values (only
 *    for inputs longer than SB_MAX_NODES bytes); and jansson 2.14 drops a raw
 *    NUL byte that directly follows a number or a literal ("[1\0]" parses as
 *    [1]), which RFC 8259 does not allow anywhere: text holding a raw NUL is
 *    refused by the new decoder whatever jansson says;
 *  - its refusals are SB_E_BAD_ARGS (then jansson refuses the text too, or it
 *    holds a raw NUL) or SB_E_TOO_LARGE, always with a `why`; every string
 *    points somewhere valid, and inside the input only within its bounds;
 *  - writing an accepted tree gives valid UTF-8 that jansson parses to the
 *    same value as the input, byte for byte the text json_dumps prints for
 *    sb_json_from_mp's conversion, and decode -> encode -> decode is the
 *    identity on the tree;
 *  - with a cap below the text's length, the writer answers SB_E_TOO_LARGE
 *    and leaves the buffer as it was, holding at most cap + 1 bytes.
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
#include "../tests/json_cases.h"
#include "../tests/json_ref.h"

#define FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)

/* every str in the tree points into [text, text + len) or outside it, and none is NULL */
static void check_strings(const msgpack_object *o, const char *text, size_t len)
{
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        SB_FUZZ_ASSERT(o->via.str.ptr != NULL, "a str with a NULL pointer");
        if (o->via.str.ptr >= text && o->via.str.ptr < text + len)
            SB_FUZZ_ASSERT(o->via.str.ptr + o->via.str.size <= text + len, "a str runs past the input");
        break;
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; ++i)
            check_strings(&o->via.array.ptr[i], text, len);
        break;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; ++i) {
            SB_FUZZ_ASSERT(o->via.map.ptr[i].key.type == MSGPACK_OBJECT_STR, "a map key that is not a str");
            check_strings(&o->via.map.ptr[i].key, text, len);
            check_strings(&o->via.map.ptr[i].val, text, len);
        }
        break;
    default:
        break;
    }
}

/* the old route's tree, or its refusal */
static sb_status_t old_route(const char *text, size_t size, msgpack_sbuffer *sb, msgpack_zone *z, msgpack_object *o, json_t *want)
{
    const char *why = NULL;
    json_t *got = NULL;
    sb_status_t st = sb_ref_json_decode(text, size, sb, &why);

    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS || st == SB_E_TOO_LARGE, "sb_ref_json_decode status %d", (int)st);
        SB_FUZZ_ASSERT(why != NULL && *why != '\0', "refusal without a reason");
        SB_FUZZ_ASSERT(st != SB_E_BAD_ARGS || want == NULL, "sb_ref_json_decode says bad_args (%s), jansson parses it", why);
        return st;
    }
    SB_FUZZ_ASSERT(want != NULL, "sb_ref_json_decode accepted what jansson refuses");
    st = sb_mp_decode((const uint8_t *)sb->data, sb->size, z, o, &why);
    SB_FUZZ_ASSERT(st == SB_OK, "sb_ref_json_decode output refused by sb_mp_decode: %d %s", (int)st, why);
    st = sb_json_from_mp(o, &got);
    SB_FUZZ_ASSERT(st == SB_OK, "sb_json_from_mp status %d", (int)st);
    SB_FUZZ_ASSERT(json_equal(want, got), "JSON -> msgpack -> JSON round trip differs");
    json_decref(got);
    return SB_OK;
}

static void check_writer(const msgpack_object *tree, const json_t *want)
{
    sb_buf_t b;
    msgpack_zone z;
    msgpack_object again;
    const char *why = NULL;
    json_t *j = NULL, *reparsed;
    char *dumped;
    sb_status_t st;
    size_t n;

    sb_buf_init(&b, SB_MAX_RPC_WIRE);
    st = sb_json_write(&b, tree, &why);
    SB_FUZZ_ASSERT(st == SB_OK, "sb_json_write refused a decoded tree: %d %s", (int)st, why);
    SB_FUZZ_ASSERT(sb_utf8_valid((const uint8_t *)b.base, b.len), "written JSON is not valid UTF-8");
    reparsed = json_loadb(b.base, b.len, FLAGS, NULL);
    SB_FUZZ_ASSERT(reparsed != NULL && json_equal(reparsed, want), "written JSON does not parse back to the input's value");
    json_decref(reparsed);
    /* the same text the jansson route printed */
    SB_FUZZ_ASSERT(sb_json_from_mp(tree, &j) == SB_OK, "sb_json_from_mp refused a decoded tree");
    dumped = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    SB_FUZZ_ASSERT(dumped != NULL && strlen(dumped) == b.len && memcmp(dumped, b.base, b.len) == 0,
                   "sb_json_write and json_dumps differ:\n%s\n%s", b.base, dumped != NULL ? dumped : "(null)");
    free(dumped);
    json_decref(j);
    /* decode -> encode -> decode */
    msgpack_zone_init(&z, 1024);
    st = sb_json_parse(b.base, b.len, &z, &again, &why);
    SB_FUZZ_ASSERT(st == SB_OK && mp_same(tree, &again), "decode -> encode -> decode is not the identity (%d %s)", (int)st,
                   st == SB_OK ? "" : why);
    msgpack_zone_destroy(&z);
    /* a cap one byte short: refused whole, nothing left behind */
    n = b.len;
    sb_buf_free(&b);
    if (n != 0) {
        sb_buf_init(&b, n - 1);
        SB_FUZZ_ASSERT(sb_buf_append(&b, "", 0) == SB_OK, "empty append");
        st = sb_json_write(&b, tree, &why);
        SB_FUZZ_ASSERT(st == SB_E_TOO_LARGE && b.len == 0 && (b.base == NULL || b._alloc <= n),
                       "a cap of %zu for %zu bytes of text: status %d, %zu bytes left", n - 1, n, (int)st, b.len);
        sb_buf_free(&b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_sbuffer sb;
    msgpack_zone zo, zn;
    msgpack_object old_tree, tree;
    const char *why = NULL;
    json_t *want;
    json_error_t err;
    sb_status_t so, sn;
    int raw_nul;
    char *text;

    /* an exact-size, non-NUL-terminated copy: reading past `size` is an ASan error */
    if ((text = calloc(1, size != 0 ? size : 1)) == NULL)
        abort();
    if (size != 0)
        memcpy(text, data, size);

    msgpack_sbuffer_init(&sb);
    msgpack_zone_init(&zo, 1024);
    msgpack_zone_init(&zn, 1024);
    want = json_loadb(text, size, FLAGS, &err);
    so = old_route(text, size, &sb, &zo, &old_tree, want);

    sn = sb_json_parse(text, size, &zn, &tree, &why);
    raw_nul = size != 0 && memchr(text, 0, size) != NULL;
    if (sn != SB_OK) {
        SB_FUZZ_ASSERT(sn == SB_E_BAD_ARGS || sn == SB_E_TOO_LARGE, "sb_json_parse status %d", (int)sn);
        SB_FUZZ_ASSERT(why != NULL && *why != '\0', "sb_json_parse refusal without a reason");
        SB_FUZZ_ASSERT(sn != SB_E_BAD_ARGS || want == NULL || raw_nul, "sb_json_parse says bad_args (%s), jansson parses it", why);
        SB_FUZZ_ASSERT(so != SB_OK || raw_nul, "sb_json_parse refuses (%s) what the jansson route accepts", why);
        goto Exit;
    }
    SB_FUZZ_ASSERT(!raw_nul, "sb_json_parse accepted text holding a raw NUL byte");
    SB_FUZZ_ASSERT(want != NULL, "sb_json_parse accepted what jansson refuses: %s", err.text);
    SB_FUZZ_ASSERT(so == SB_OK || (so == SB_E_TOO_LARGE && size > SB_MAX_NODES),
                   "sb_json_parse accepts what the jansson route refuses (%d)", (int)so);
    if (so == SB_OK)
        SB_FUZZ_ASSERT(mp_same(&old_tree, &tree), "sb_json_parse and the jansson route build different trees");
    check_strings(&tree, text, size);
    check_writer(&tree, want);
Exit:
    json_decref(want);
    msgpack_zone_destroy(&zo);
    msgpack_zone_destroy(&zn);
    msgpack_sbuffer_destroy(&sb);
    free(text);
    return 0;
}
