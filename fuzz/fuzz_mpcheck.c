/*
 * libFuzzer driver for proto/mpcheck.c (the msgpack pre-check) against
 * msgpack-c 4.0, which must never see a buffer the pre-check refused (it
 * allocates from container headers: deps.md section 6).
 *
 * Properties, for every input the pre-check accepts:
 *  - msgpack_unpack succeeds and consumes exactly obj_len bytes, and
 *    sb_mp_decode agrees (on the object alone, and refuses trailing bytes);
 *  - re-packing the object gives bytes that the pre-check accepts again, and
 *    that re-pack is a fixed point: repack(unpack(repack)) == repack (msgpack
 *    re-packs ints and lengths in their shortest form, so the input itself
 *    need not be canonical);
 *  - sb_json_from_mp converts it or refuses it with a status, never NOMEM;
 *  - sb_mp_get finds every (NUL-free) key of a top-level map at its own index.
 * For every input: obj_len is in 1..size and a refusal has a `why`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>
#include <jansson.h>
#include "sb/value.h"
#include "fuzz.h"

static void repack(const msgpack_object *o, msgpack_sbuffer *sb)
{
    msgpack_packer pk;

    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    sb_mp_pack_object(&pk, o);
}

static void check_keys(const msgpack_object *o)
{
    char key[64];

    if (o->type != MSGPACK_OBJECT_MAP)
        return;
    for (uint32_t i = 0; i < o->via.map.size; ++i) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        SB_FUZZ_ASSERT(k->type == MSGPACK_OBJECT_STR, "accepted map has a non-str key");
        if (k->via.str.size >= sizeof(key) || (k->via.str.size != 0 && memchr(k->via.str.ptr, 0, k->via.str.size) != NULL))
            continue;
        /* known bug "mp-get-empty": sb_mp_get(o, "") memcmp()s msgpack-c's NULL pointer of an empty key (UB) */
        if (k->via.str.size == 0 && sb_fuzz_known("mp-get-empty"))
            continue;
        if (k->via.str.size != 0)
            memcpy(key, k->via.str.ptr, k->via.str.size);
        key[k->via.str.size] = '\0';
        SB_FUZZ_ASSERT(sb_mp_get(o, key) == &o->via.map.ptr[i].val, "sb_mp_get(\"%s\") did not find key %u", key, i);
        SB_FUZZ_ASSERT(sb_mp_str_is(k, key), "sb_mp_str_is on key %u", i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t obj_len = 0, off = 0;
    const char *why = NULL;
    sb_status_t st = sb_mp_check(data, size, &obj_len, &why);
    msgpack_zone z;
    msgpack_object o, o2;
    msgpack_sbuffer sb1, sb2;
    json_t *j = NULL;
    uint8_t *copy;
    int rc;

    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS || st == SB_E_TOO_LARGE, "pre-check status %d", (int)st);
        SB_FUZZ_ASSERT(why != NULL && *why != '\0', "refusal without a reason");
        return 0;
    }
    SB_FUZZ_ASSERT(obj_len >= 1 && obj_len <= size, "obj_len %zu of %zu", obj_len, size);

    /* an exact-size copy: msgpack-c reading past the object is an ASan error */
    copy = malloc(obj_len);
    if (copy == NULL)
        abort();
    memcpy(copy, data, obj_len);

    msgpack_zone_init(&z, 1024);
    rc = msgpack_unpack((const char *)copy, obj_len, &off, &z, &o);
    SB_FUZZ_ASSERT(rc == MSGPACK_UNPACK_SUCCESS, "pre-check accepted, msgpack_unpack says %d", rc);
    SB_FUZZ_ASSERT(off == obj_len, "msgpack consumed %zu, pre-check said %zu", off, obj_len);

    /* on the whole input, msgpack-c stops at the same place */
    off = 0;
    {
        msgpack_zone z2;
        msgpack_object ow;
        msgpack_zone_init(&z2, 1024);
        rc = msgpack_unpack((const char *)data, size, &off, &z2, &ow);
        SB_FUZZ_ASSERT(rc == (obj_len == size ? MSGPACK_UNPACK_SUCCESS : MSGPACK_UNPACK_EXTRA_BYTES) && off == obj_len,
                       "msgpack on the whole input: rc %d, off %zu, obj_len %zu", rc, off, obj_len);
        msgpack_zone_destroy(&z2);
    }

    /* sb_mp_decode: the object alone is fine, trailing bytes are not */
    {
        msgpack_zone z3;
        msgpack_object od;
        msgpack_zone_init(&z3, 1024);
        st = sb_mp_decode(copy, obj_len, &z3, &od, &why);
        SB_FUZZ_ASSERT(st == SB_OK, "sb_mp_decode refused what sb_mp_check accepted: %d %s", (int)st, why);
        st = sb_mp_decode(data, size, &z3, &od, &why);
        SB_FUZZ_ASSERT((st == SB_OK) == (obj_len == size), "sb_mp_decode with %zu trailing bytes: %d", size - obj_len, (int)st);
        msgpack_zone_destroy(&z3);
    }

    /* re-pack, re-check, and the re-pack is a fixed point (a canonical input comes back byte for byte) */
    msgpack_sbuffer_init(&sb1);
    msgpack_sbuffer_init(&sb2);
    repack(&o, &sb1);
    {
        size_t len1 = 0;
        st = sb_mp_check((const uint8_t *)sb1.data, sb1.size, &len1, &why);
        SB_FUZZ_ASSERT(st == SB_OK, "re-packed value refused: %s", why);
        SB_FUZZ_ASSERT(len1 == sb1.size, "re-packed value: obj_len %zu of %zu", len1, sb1.size);
        SB_FUZZ_ASSERT(sb1.size <= obj_len, "re-pack grew from %zu to %zu bytes", obj_len, sb1.size);
    }
    {
        msgpack_zone z4;
        msgpack_zone_init(&z4, 1024);
        off = 0;
        rc = msgpack_unpack(sb1.data, sb1.size, &off, &z4, &o2);
        SB_FUZZ_ASSERT(rc == MSGPACK_UNPACK_SUCCESS && off == sb1.size, "re-packed value does not unpack: %d", rc);
        repack(&o2, &sb2);
        SB_FUZZ_ASSERT(sb1.size == sb2.size && memcmp(sb1.data, sb2.data, sb1.size) == 0,
                       "repack(unpack(repack)) differs from repack (%zu vs %zu bytes)", sb2.size, sb1.size);
        msgpack_zone_destroy(&z4);
    }
    /* JSON conversion: a status, never a crash, never NOMEM for a small value */
    st = sb_json_from_mp(&o, &j);
    SB_FUZZ_ASSERT(st == SB_OK || st == SB_E_BAD_ARGS || st == SB_E_TOO_LARGE, "sb_json_from_mp: status %d", (int)st);
    SB_FUZZ_ASSERT((st == SB_OK) == (j != NULL), "sb_json_from_mp: status %d with value %p", (int)st, (void *)j);
    json_decref(j);

    check_keys(&o);

    msgpack_sbuffer_destroy(&sb1);
    msgpack_sbuffer_destroy(&sb2);
    msgpack_zone_destroy(&z);
    free(copy);
    return 0;
}
